"""The scoreflow side of the harness, wired to a stand-in API.

The stand-in only checks the plumbing (which calls, which columns, which files); its
"codec" is np.savez, and its model numbers are constants. Real numbers come only from
scoreflow_codec.api.
"""
import io
import json
import sys
import types

import numpy as np
import pytest

from bench import run, scoreflow_runner


def _stub_api(lossy: bool = False):
    def compress_arrays(images, model, mode, device, fallback=False, **settings):
        assert model == "stub-model" and mode == "chain" and settings == {"steps": 8} and fallback
        buf = io.BytesIO()
        np.savez_compressed(buf, *images)
        n = len(buf.getvalue())
        stream = types.SimpleNamespace(n_seed=1, n_tiles=len(images), batches=[(1, len(images))])
        return buf.getvalue(), types.SimpleNamespace(model_bytes=n + 10, seed_bytes=n, coded_by="seed", stream=stream)

    def decompress(data, model, device):
        with np.load(io.BytesIO(data)) as z:
            out = [z[f"arr_{i}"] for i in range(len(z.files))]
        if lossy:
            out[0] = out[0] ^ 1
        return out

    def evaluate_images(images, model, device, ode, bound, **options):
        assert ode and bound
        return [{"bound_bpd": 3.0, "bound_bpd_nocorr": 3.1, "ode_nll_bpd": 2.9} for _ in images]

    def coding_settings(mode, model, settings):
        assert model == "stub-model"
        return {"steps": 8, **settings}

    api = types.SimpleNamespace(compress_arrays=compress_arrays, decompress_arrays=decompress,
                                evaluate_images=evaluate_images, coding_settings=coding_settings)
    zoo = types.SimpleNamespace(load_model=lambda name, device: "stub-model")
    return api, zoo


@pytest.fixture
def npz_set(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "tiny.npz"
    np.savez(path, images=rng.integers(0, 256, (3, 8, 8, 3), dtype=np.uint8))
    return path


@pytest.mark.parametrize("lossy", [False, True])
def test_scoreflow_columns(monkeypatch, tmp_path, npz_set, capsys, lossy):
    api, zoo = _stub_api(lossy)
    monkeypatch.setitem(sys.modules, "scoreflow_codec.api", api)
    monkeypatch.setitem(sys.modules, "scoreflow_codec.zoo", zoo)
    rc = run.main([str(npz_set), "--codecs", "png,scoreflow", "--model", "stub", "--mode",
                   "chain", "--setting", "steps=8", "--out", str(tmp_path / "out")])
    assert rc == 0
    table = capsys.readouterr().out
    assert "| scoreflow | bound bpd |" in table and "| png |" in table
    (outdir,) = (tmp_path / "out").iterdir()
    res = json.loads((outdir / "results.json").read_text())
    sf = next(s for s in res["summary"] if s["codec"] == "scoreflow")
    assert sf["ode_nll_bpd"] == 2.9 and sf["bound_bpd_nocorr"] == 3.1
    assert sf["lossless"] is not lossy
    # the file, the model's stream and the seed codec alone, side by side
    assert sf["model_bpd"] == pytest.approx(sf["mean_bpd"] + 8 * 10 / (8 * 8 * 3))
    assert sf["seed_bpd"] == pytest.approx(sf["mean_bpd"]) and sf["n_seed_coded"] == 3
    assert "| 3 of 3 |" in table
    assert res["scoreflow"]["stream"]["lossless"] is not lossy
    assert "mode=chain steps=8 " in res["settings"]["scoreflow"]  # the stand-in's steps: its API, not the real one
    # what the stream's times depend on: its seed tiles, and the model's batches
    assert res["scoreflow"]["stream"]["seed_tiles"] == [1, 3] and res["scoreflow"]["stream"]["batch_sizes"] == [2]
    assert res["scoreflow"]["stream"]["bpd"] == pytest.approx(
        8 * res["scoreflow"]["stream"]["nbytes"] / (3 * 8 * 8 * 3))
    assert (outdir / "actual_vs_nll.png").exists()
    if lossy:
        assert "| NO" in table


def test_no_stream_codes_each_image_once(monkeypatch, tmp_path, npz_set, capsys):
    api, zoo = _stub_api()
    calls = []
    compress = api.compress_arrays
    api.compress_arrays = lambda images, *a, **k: calls.append(len(images)) or compress(images, *a, **k)
    monkeypatch.setitem(sys.modules, "scoreflow_codec.api", api)
    monkeypatch.setitem(sys.modules, "scoreflow_codec.zoo", zoo)
    rc = run.main([str(npz_set), "--codecs", "scoreflow", "--model", "stub", "--setting", "steps=8",
                   "--no-stream", "--out", str(tmp_path / "out")])
    assert rc == 0
    assert calls == [1, 1, 1]  # one file per image, no whole-set stream
    (outdir,) = (tmp_path / "out").iterdir()
    res = json.loads((outdir / "results.json").read_text())
    assert res["scoreflow"]["stream"] is None
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| model=stub"))
    assert row.split("|")[6].strip() == "n/a" and row.rstrip().endswith("| yes |")


def test_model_error_is_a_clear_error(monkeypatch):
    from scoreflow_codec.errors import ModelError
    api, zoo = _stub_api()

    def load_model(name, device):
        raise ModelError(f"no model named {name}")
    zoo.load_model = load_model
    monkeypatch.setitem(sys.modules, "scoreflow_codec.api", api)
    monkeypatch.setitem(sys.modules, "scoreflow_codec.zoo", zoo)
    with pytest.raises(scoreflow_runner.ScoreflowError, match="no model named nope"):
        scoreflow_runner.load_model("nope", "cpu")


def test_auto_model_follows_image_sizes(monkeypatch):
    """--model auto picks what `sfcodec compress` would for the set's sizes (not always the default)."""
    api, zoo = _stub_api()
    zoo.auto_model_name = lambda sizes: "photo" if max(max(s) for s in sizes) > 64 else "cifar10"
    zoo.default_model = lambda: "cifar10"
    zoo.load_model = lambda name, device: name
    monkeypatch.setitem(sys.modules, "scoreflow_codec.api", api)
    monkeypatch.setitem(sys.modules, "scoreflow_codec.zoo", zoo)
    assert scoreflow_runner.load_model("auto", "cpu", [(768, 512)]) == "photo"
    assert scoreflow_runner.load_model("auto", "cpu", [(32, 32)]) == "cifar10"
    assert scoreflow_runner.load_model("auto", "cpu") == "cifar10"
    assert scoreflow_runner.load_model("cifar10", "cpu", [(768, 512)]) == "cifar10"
