"""Decoding reproduces the encoder's floats (DESIGN 2e), or refuses with a message naming what
differs: never wrong pixels. And compress's --verify policy (docs/RELIABILITY.md).

A tiny random U-Net (real convolutions, whose float results can depend on the thread count and
batch size) codes a 64x32 image: one seed tile and one model tile, 16 chain steps. `encoded` is a
file of the machine-bound float32 arithmetic, whose decoder must follow the recorded setup;
`exact_file` one of the default exact64 arithmetic, which decodes whatever the setup (and, by
tests/test_exact.py, whatever the kernels).
"""
import copy
import logging

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from coding_models import tiny_model_file
from scoreflow_codec import api, container, images
from scoreflow_codec.coding import stream
from scoreflow_codec.coding.seed_codec import LATEST as LATEST_SEED, VERSIONS as SEED_VERSIONS
from scoreflow_codec.coding.stream import StreamSettings
from scoreflow_codec.errors import BadFileError, DecodeMismatchError, ModelMismatchError
from scoreflow_codec.modelfile import load_model_file

SETTINGS = {"steps": 16}
STREAM = StreamSettings(n_seed=1)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return tiny_model_file(tmp_path_factory.mktemp("m") / "tiny.safetensors", 0, randomise_zeros=True, metadata={})


@pytest.fixture(scope="module")
def model(model_path):
    return load_model_file(model_path)


@pytest.fixture(scope="module")
def source():
    y, x = np.mgrid[0:32, 0:64]
    arr = np.stack([(x * 4) % 256, (y * 8) % 256, (x + y) % 256], -1).astype(np.uint8)
    return images.from_array(arr)


def _compress_at_one_thread(model, source, micro_batch: int = 8, arith: str = "float32") -> bytes:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        data, _ = api.compress([source], model, "chain", SETTINGS, stream_settings=STREAM, micro_batch=micro_batch,
                               arith=arith, fallback="off")
    finally:
        torch.set_num_threads(n)
    return data


@pytest.fixture(scope="module")
def encoded(model, source):
    """The file in float32 arithmetic, encoded at one torch thread."""
    return _compress_at_one_thread(model, source)


@pytest.fixture(scope="module")
def exact_file(model, source):
    data, _ = api.compress([source], model, "chain", SETTINGS, stream_settings=STREAM, fallback="off")
    return data


def _repack(data, **setup):
    header, words = container.unpack(data)
    h = copy.deepcopy(header)
    h["setup"].update(setup)
    return container.pack(h, words)


def _exact_or_refused(data, model, source) -> str:
    """Decode: the identical pixels, or a clean refusal naming the recorded setup. Returns which."""
    try:
        back = api.decompress(data, model)
    except (DecodeMismatchError, BadFileError) as e:
        msg = str(e)
        assert msg and "\n" not in msg
        assert "reproduce the encoder's arithmetic" in msg
        if isinstance(e, BadFileError):  # the payload did not decode: the message names the setup
            assert "thread(s)" in msg and "micro-batch" in msg
        return f"refused: {msg}"
    api.check_identical([source], back)
    return "identical"


def test_header_records_the_setup(encoded, exact_file, model):
    h = api.read_header(encoded)
    assert h["model"] == {"name": model.name, "sha256": model.sha256}
    assert h["setup"] == {"device": "cpu", "dtype": "float32", "micro_batch": 8, "threads": 1,
                          "torch": torch.__version__, "constriction": api._constriction_version()}
    assert api.read_header(exact_file)["setup"]["dtype"] == "exact64"  # the default
    assert h["mode"] == "chain" and h["settings"] == {**SETTINGS, "schedule": "calibrated", "kappa_top": 2}
    assert h["fields"]["n_tiles"] == 2 and h["fields"]["n_seed"] == 1  # one tile goes through the net


def test_header_settings_are_relative_to_the_frozen_format_defaults(model, source):
    """A header leaves out what equals api.FORMAT_DEFAULTS, not the encoder's current defaults,
    so the encoder's defaults (chain steps 128, the calibrated schedule, two scaled network calls)
    can change without changing an old file's meaning."""
    assert api.default_settings("chain")["steps"] == 128 and api.FORMAT_DEFAULTS["chain"]["steps"] == 64
    assert api.default_settings("chain")["schedule"] == "calibrated" and api.FORMAT_DEFAULTS["chain"]["schedule"] == "logsnr"
    assert api.default_settings("chain")["kappa_top"] == 2 and api.FORMAT_DEFAULTS["chain"]["kappa_top"] == 0
    # (the float32 arithmetic: the header's rules are the same for both, and it is 4x faster)
    at_64, _ = api.compress([source], model, "chain", {"steps": 64, "schedule": "logsnr", "kappa_top": 0},
                            stream_settings=STREAM, arith="float32", fallback="off")
    h = api.read_header(at_64)
    assert h["settings"] == {} and api.full_settings(h)[0]["steps"] == 64
    api.check_identical([source], api.decompress(at_64, model))
    default, _ = api.compress([source], model, "chain", stream_settings=STREAM, arith="float32", fallback="off")
    assert api.read_header(default)["settings"] == {"steps": 128, "schedule": "calibrated", "kappa_top": 2}
    api.check_identical([source], api.decompress(default, model))


def test_a_model_may_bring_its_own_default_chain_steps(model, source):
    """A zoo entry's "chain_steps" (LoadedModel.chain_steps; the shipped cifar10's is 256) is the
    chain mode's default with that model: the header records it, so the file decodes with a model
    that has no such default; --steps still wins, and ODE mode keeps its own default."""
    own = copy.copy(model)
    own.chain_steps = 24
    assert api.default_settings("chain", own)["steps"] == 24 and api.default_settings("chain", model)["steps"] == 128
    assert api.default_settings("ode", own)["steps"] == api.default_settings("ode")["steps"] == 128
    data, _ = api.compress([source], own, "chain", stream_settings=STREAM, arith="float32", fallback="off")
    assert api.read_header(data)["settings"]["steps"] == 24
    assert api.compress_work_units([source], own, "chain") == 23 * 2
    api.check_identical([source], api.decompress(data, model))
    told, _ = api.compress([source], own, "chain", SETTINGS, stream_settings=STREAM, arith="float32", fallback="off")
    assert api.read_header(told)["settings"]["steps"] == SETTINGS["steps"]


def test_growth_batching_files_still_decode(encoded, model, source):
    """Files from before "bits" batching name no batching in their header: the format default is
    the fixed growth schedule, and they decode as such. New files name "bits"."""
    assert api.FORMAT_DEFAULTS["stream"]["batching"] == "growth" and StreamSettings().batching == "bits"
    assert api.read_header(encoded)["stream"] == {"n_seed": 1, "batching": "bits", "seed": LATEST_SEED}
    old, _ = api.compress([source], model, "chain", SETTINGS, stream_settings=StreamSettings(n_seed=1, batching="growth"),
                          fallback="off")
    assert api.read_header(old)["stream"] == {"n_seed": 1, "seed": LATEST_SEED}
    api.check_identical([source], api.decompress(old, model))


@pytest.mark.parametrize("version", [v for v in SEED_VERSIONS if v != LATEST_SEED])
def test_older_seed_codec_versions_still_decode(model, source, version):
    """Files name the seed codec version of their seed tiles (and seed-only files) in the stream
    header, those from before version 2 none (the format default: 1). Each decodes with its own."""
    assert api.FORMAT_DEFAULTS["stream"]["seed"] == 1 and StreamSettings().seed == LATEST_SEED
    noise = images.from_array(np.random.default_rng(3).integers(0, 256, (32, 64, 3)).astype(np.uint8))
    for srcs, ss in (([source, noise], StreamSettings(n_seed=2)), ([noise], stream.seed_only_settings([(3, 32, 64)]))):
        old = StreamSettings(**{**ss.to_dict(), "seed": version})
        data, _ = api.compress(srcs, model, "chain", SETTINGS, stream_settings=old, fallback="off")
        assert api.read_header(data)["stream"].get("seed", 1) == version
        assert ("seed" in api.read_header(data)["stream"]) == (version != 1)
        api.check_identical(srcs, api.decompress(data, model))
        new, _ = api.compress(srcs, model, "chain", SETTINGS, stream_settings=ss, fallback="off")
        assert api.read_header(new)["stream"]["seed"] == LATEST_SEED
        api.check_identical(srcs, api.decompress(new, model))


def test_progress_ticks_add_up_to_the_work_units(model):
    """Encode and decode tick solver steps x tiles (seed tiles included), the totals the progress
    bars are given before the batch sizes are known. Noise: two seed tiles, two through the net
    (the first tiles: with seed tiles "chosen" this untrained model would leave all four to the
    seed codec)."""
    noise = images.from_array(np.random.default_rng(0).integers(0, 256, (32, 128, 3)).astype(np.uint8))
    ticks, back = [], []
    data, rep = api.compress([noise], model, "chain", SETTINGS, progress=ticks.append, stream_settings=StreamSettings(),
                            fallback="off")
    assert 0 < rep.stream.n_seed < rep.stream.n_tiles == 4
    assert sum(ticks) == api.compress_work_units([noise], model, "chain", SETTINGS) == 15 * 4
    api.check_identical([noise], api.decompress(data, model, progress=back.append))
    assert sum(back) == api.work_units(api.read_header(data)) == 15 * 4


@pytest.mark.parametrize("mode", ["chain", "ode"])
def test_real_codecs_pop_no_padding(model, mode):
    """The pipelines' deficit_bits_per_dim bounds what a batch pops before it pushes: with "bits"
    batching a flat image (its seed tiles cost almost nothing) followed by noise reaches no
    padding (<= 64 bits: the ANS head's words), where the fixed schedule pops a lot of it. Seed
    tiles "first": with "chosen" this untrained model would leave every tile to the seed codec."""
    arr = np.random.default_rng(1).integers(0, 256, (32, 320, 3)).astype(np.uint8)
    arr[:, :160] = 90
    src = images.from_array(arr)
    st = {"steps": 4} if mode == "ode" else SETTINGS
    # the float32 arithmetic (4x faster): the deficits do not depend on the arithmetic
    _, bits = api.compress([src], model, mode, st, stream_settings=StreamSettings(), arith="float32", fallback="off")
    _, growth = api.compress([src], model, mode, st, stream_settings=StreamSettings(batching="growth"), arith="float32",
                              fallback="off")
    assert bits.stream.pad_consumed_bits <= 64 < 4096 < growth.stream.pad_consumed_bits
    assert bits.stream.n_seed < bits.stream.n_tiles == 10


def test_encoding_is_deterministic(encoded, exact_file, model, source):
    assert _compress_at_one_thread(model, source) == encoded
    assert _compress_at_one_thread(model, source, arith="exact64") == _repack(exact_file, threads=1)


@pytest.mark.parametrize("threads, micro_batch", [(2, 8), (1, 1), (3, 3)])
def test_exact_files_decode_at_any_thread_count_and_micro_batch(exact_file, model, source, threads, micro_batch):
    """The header edited to another setup: the exact arithmetic gives the same bits anyway."""
    n = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        api.check_identical([source], api.decompress(_repack(exact_file, micro_batch=micro_batch), model))
    finally:
        torch.set_num_threads(n)


def test_exact_files_name_no_setup_when_corrupt(exact_file, model):
    h, words = container.unpack(exact_file)
    words = words.copy()
    words[len(words) // 2] ^= 0x5A5A5A5A
    with pytest.raises((BadFileError, DecodeMismatchError)) as e:
        api.decompress(container.pack(h, words), model)
    assert "thread(s)" not in str(e.value)


def test_decode_runs_at_the_recorded_thread_count(encoded, model, source, monkeypatch):
    """Whatever this process's thread count, decoding switches to the file's and back."""
    seen = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda k: (seen.append(k), real(k)))
    n = torch.get_num_threads()
    real(3)
    try:
        api.check_identical([source], api.decompress(encoded, model))
        assert torch.get_num_threads() == 3  # restored
    finally:
        real(n)
    assert seen == [1, 3]


def test_decode_at_another_thread_count_is_exact_or_refused(encoded, model, source):
    # the header edited to claim 2 threads: the decoder computes with 2, the encoder used 1
    result = _exact_or_refused(_repack(encoded, threads=2), model, source)
    print("decode at 2 threads of a 1-thread file:", result)


@pytest.mark.parametrize("micro_batch", [1, 3])
def test_decode_at_another_micro_batch_is_exact_or_refused(encoded, model, source, micro_batch):
    result = _exact_or_refused(_repack(encoded, micro_batch=micro_batch), model, source)
    print(f"decode with micro_batch {micro_batch} of a micro_batch 8 file:", result)


def test_any_micro_batch_round_trips(model, source):
    data = _compress_at_one_thread(model, source, micro_batch=1)
    assert api.read_header(data)["setup"]["micro_batch"] == 1
    api.check_identical([source], api.decompress(data, model))


def test_mismatched_setup_is_refused(encoded, model, tmp_path):
    with pytest.raises(ModelMismatchError, match="cuda"):
        api.decompress(_repack(encoded, device="cuda"), model)
    with pytest.raises(ModelMismatchError, match="encoded on cpu.*--device cpu"):
        api.decompress(encoded, model, device="cuda")  # refused before any cuda call
    with pytest.raises(ModelMismatchError, match="float64"):
        api.decompress(_repack(encoded, dtype="float64"), model)
    with pytest.raises(ModelMismatchError, match="exact arithmetic.*CPU"):
        api.decompress(_repack(encoded, dtype="exact64"), model, device="cuda")
    other = load_model_file(tiny_model_file(tmp_path / "other.safetensors", 1, randomise_zeros=True, metadata={}))
    with pytest.raises(ModelMismatchError, match="sha256") as e:
        api.decompress(encoded, other)
    assert "tiny-0" in str(e.value) and "tiny-1" in str(e.value)


def test_other_constriction_version_warns(exact_file, model, source, caplog):
    with caplog.at_level(logging.WARNING, logger="scoreflow_codec.api"):
        back = api.decompress(_repack(exact_file, constriction="0.4.1"), model)
    assert any("constriction 0.4.1" in r.getMessage() for r in caplog.records)
    api.check_identical([source], back)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="scoreflow_codec.api"):  # the header's text on one line
        back = api.decompress(_repack(exact_file, constriction="0.4\n1"), model)
    assert any("constriction 0.4\\n1, this is" in r.getMessage() for r in caplog.records)
    api.check_identical([source], back)


def test_other_torch_version_warns_then_checks_pixels(encoded, model, source, caplog):
    with caplog.at_level(logging.WARNING, logger="scoreflow_codec.api"):
        back = api.decompress(_repack(encoded, torch="1.13.1"), model)
    assert any("torch 1.13.1" in r.getMessage() for r in caplog.records)
    api.check_identical([source], back)  # same arithmetic here, so it still decodes exactly


def test_verify_is_cheap_policy():
    """On by default in chain mode, and in ODE mode up to 64*64*3*4 dims (16 CIFAR images)."""
    cifar = [images.from_array(np.zeros((32, 32, 3), np.uint8))] * 16
    big = [images.from_array(np.zeros((640, 480, 3), np.uint8))]
    assert api.verify_is_cheap(cifar, "ode") and api.verify_is_cheap(big, "chain")
    assert not api.verify_is_cheap(cifar + cifar[:1], "ode") and not api.verify_is_cheap(big, "ode")


# --- `sfcodec compress --verify` -----------------------------------------------------------------
@pytest.fixture
def cli(monkeypatch, tmp_path, model_path):
    from cli.main import cli as group

    img = tmp_path / "in.png"
    y, x = np.mgrid[0:32, 0:64]
    images.to_pil(images.from_array(np.stack([x * 4, y * 8, x + y], -1).astype(np.uint8))).save(img)
    calls = []
    real = api.decompress
    monkeypatch.setattr(api, "decompress", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    monkeypatch.setattr(torch, "set_num_threads", lambda k: None)  # keep the test's one thread

    def run(*args, force=False):
        out = tmp_path / "out.sfc"
        argv = ["compress", str(img), "-o", str(out), "--model", str(model_path), "--mode", "chain",
                "--steps", "16", "-q", *args] + (["--force"] if force else [])
        return CliRunner().invoke(group, argv), out, calls

    return run


def test_compress_verifies_by_default_when_cheap(cli, monkeypatch):
    res, out, calls = cli()
    assert res.exit_code == 0, res.output
    assert out.exists() and calls == [1]
    res, out, calls = cli("--no-verify", force=True)
    assert res.exit_code == 0 and calls == [1]  # not decoded again
    monkeypatch.setattr(api, "verify_is_cheap", lambda *a: False)
    res, out, calls = cli(force=True)
    assert res.exit_code == 0 and calls == [1]
    res, out, calls = cli("--verify", force=True)
    assert res.exit_code == 0 and calls == [1, 1]


def test_a_failed_verify_writes_nothing(cli, monkeypatch):
    def wrong(sources, decoded):
        raise DecodeMismatchError("image 0: decoded pixels differ from the input; nothing was written")

    monkeypatch.setattr(api, "check_identical", wrong)
    res, out, _ = cli()
    assert res.exit_code == DecodeMismatchError.exit_code == 7
    assert not out.exists() and [p.name for p in out.parent.iterdir()] == ["in.png"]
    out.write_bytes(b"precious")
    res, out, _ = cli(force=True)
    assert res.exit_code == 7 and out.read_bytes() == b"precious"
    assert sorted(p.name for p in out.parent.iterdir()) == ["in.png", "out.sfc"]


def test_default_micro_batch_keeps_pixels_per_call():
    """8 tiles of 32x32 per network call at any tile size (at least one tile)."""
    assert [api.default_micro_batch(t) for t in (8, 16, 32, 64, 128, 256)] == [128, 32, 8, 2, 1, 1]


@pytest.mark.parametrize("exact", [False, True])
def test_evaluator_calls(exact):
    """float32 forwards run in zero-padded micro-batches (their kernels may depend on the batch);
    exact ones, which no batch changes, on the rows alone, about EXACT_CHUNK_PIXELS per call."""
    from scoreflow_codec.coding.evaluator import EXACT_CHUNK_PIXELS, Evaluator

    calls = []

    def fn(x, t):
        calls.append((x.shape[0], t.shape[0], x.dtype))
        return x * t.view(-1, 1, 1, 1)
    ev = Evaluator(fn, micro_batch=2, exact=exact)
    tile = 64
    per_call = max(2, EXACT_CHUNK_PIXELS // tile ** 2) if exact else 2
    rows = per_call + 1
    x = np.random.default_rng(0).normal(size=(rows, 3, tile, tile))
    np.testing.assert_allclose(ev(x, 0.5), 0.5 * x, atol=2.0 ** -20)
    if exact:  # two calls of balanced sizes
        assert calls == [(rows // 2, rows // 2, torch.float64), (rows - rows // 2, rows - rows // 2, torch.float64)]
        calls.clear()
        ev(x[:per_call], 0.5)
        assert calls == [(per_call, per_call, torch.float64)]
        calls.clear()
        n = 2 * per_call + 2
        ev(np.concatenate([x] * 3)[:n], 0.5)
        sizes = [c[0] for c in calls]
        assert len(sizes) == 3 and sum(sizes) == n and max(sizes) <= per_call and max(sizes) - min(sizes) <= 1
    else:
        assert calls == [(2, 2, torch.float32)] * (rows // 2 + 1)


def test_deterministic_torch_sets_and_restores_without_loading_inductor():
    """Coding runs under torch's deterministic algorithms (warn only); the caller's setting comes
    back after, and the switch does not import torch._inductor (seconds of every CLI run: it is
    what torch.use_deterministic_algorithms imports first). In a fresh interpreter, where nothing
    has loaded inductor yet."""
    import subprocess
    import sys
    code = """
import sys, torch
from scoreflow_codec.coding.evaluator import deterministic_torch
state = lambda: (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
assert state() == (False, False)
with deterministic_torch():
    assert state() == (True, True)
assert state() == (False, False)
torch.use_deterministic_algorithms(True)  # the caller's own setting (this call loads inductor)
with deterministic_torch():
    assert state() == (True, True)
assert state() == (True, False)
print("ok")
"""
    code_no_inductor = """
import sys, torch
from scoreflow_codec.coding.evaluator import deterministic_torch
with deterministic_torch():
    pass
print("torch._inductor" in sys.modules)
"""
    run = lambda c: subprocess.run([sys.executable, "-c", c], capture_output=True, text=True, timeout=300)
    r = run(code)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    r = run(code_no_inductor)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr
