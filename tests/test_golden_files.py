"""Files written by released models and codec versions keep decoding to the same pixels.

tests/golden/NAME.sfc was written once by `sfcodec compress` (tests/golden/make_sfc_golden.py) from
the PNGs beside it, with the shipped model of that time. When a newer model replaces it under the
same zoo name, the old model stays in the zoo under another name, and the file's sha256 finds it.

Files of the exact arithmetic (the default since 0.2) must decode on every machine: a failure
means users' files no longer decode; fix the code, never the golden file. Files of the float32
arithmetic (photo-1, photo-2, cifar10-1: every file before 0.2) decode only where the kernels are
the same as the encoder's; elsewhere (this project's CI machines among them) the decoder must
refuse them cleanly, never return other pixels.

Since 0.9.43 the package no longer carries the five models with float32 weights (cifar10-1 to -3,
photo-1 and -2: `trainer retire`, to leave a GPU chunk room for its training images), since 0.9.44
not cifar10-4 (0.7.0's cifar10) either, since 0.9.45 not cifar10-5 to -8 (the cifar10 of 0.8.0 to
0.9.2), since 0.9.46 not cifar10-9 to -12 (the cifar10 of 0.9.3 to 0.9.35), since 0.9.47 not
cifar10-13 (0.9.36 - 0.9.39's, the GPU run), since 0.9.48 not cifar10-14 (0.9.40's, the GPU run
continued on a CPU core), since 0.9.49 not cifar10-15 (0.9.41's), since 0.9.50 not cifar10-16
(0.9.42's), since 0.9.51 not cifar10-17 (0.9.43's), since 0.9.52 not cifar10-18 (0.9.44's), since
0.9.53 not cifar10-19 (0.9.45's), since 0.9.54 not cifar10-20 (0.9.46's), since 0.9.56 not
cifar10-21 (0.9.47's), since 0.9.58 not cifar10-22 (0.9.48's), since 0.9.59 not cifar10-23 and -24
(0.9.49's and 0.9.50's), since 0.9.62 not cifar10-25 (0.9.51's), since 0.9.64 not photo-6 (0.9.59 -
0.9.61's photo), and since 0.10.1 not photo-7 (0.9.62 - 0.9.63's photo). Their files (the three
float32 ones, cifar10-x1 to -x26, photo-x1, photo-x6, photo-x7) must get one error naming the release
and the commit that have the model, and must decode with the model file taken from that commit.

Since December 2026 the models' exact-arithmetic files are decoded once per decode key (the model's
config, the header's completed settings, the format version, the mode, images, setup and stream
settings: `_decode_key`), the newest file of each, whether its model ships or is retired; files alike
in all of that take the same code paths with other weights. Decoding all of them took 7 of the
suite's 28 minutes on CI's 2 cores; every file's model is still found (by sha256), and five files
of retired models never decoded before (cifar10-x1, -x2, -x6, -x7 and photo-x1) are decoded now.
"""
import functools
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from scoreflow_codec import __version__, api, container, images, zoo
from scoreflow_codec.errors import BadFileError, DecodeMismatchError, ModelError

GOLDEN = Path(__file__).parent / "golden"
FILES = sorted(GOLDEN.glob("*.sfc"))


def _arith(path: Path) -> str:
    """The file's arithmetic; a seed-only file of 0.6.0 on names none (it runs no floats)."""
    return api.read_header(path.read_bytes()).get("setup", {}).get("dtype", "exact64")


def _cases() -> dict:
    """make_sfc_golden's CASES: name -> (zoo model, sizes, sfcodec arguments, [image kind])."""
    spec = importlib.util.spec_from_file_location("make_sfc_golden", GOLDEN / "make_sfc_golden.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.CASES


def _release(path: Path) -> tuple[int, ...]:
    return tuple(int(x) for x in api.read_header(path.read_bytes())["codec"].split("."))


def test_golden_files_exist():
    """Every case of make_sfc_golden.py has its file and every file its case, made as the case says
    (the arithmetic); every cifar10 model of the zoo has a golden file and every cifar10 golden
    file's model ships; format versions follow the releases that wrote the files."""
    cases = _cases()
    assert {p.stem for p in FILES} == set(cases) and len(FILES) >= 20
    float32 = {n for n, (_, _, args, *_) in cases.items() if "float32" in args}
    assert float32 == {"photo-1", "photo-2", "cifar10-1"}  # every file before 0.2
    assert {p.stem for p in FILES if _arith(p) == "float32"} == float32
    # seed-only files before 0.6.0 name the model and setup they were made with; from 0.6.0 on, neither
    h6 = api.read_header((GOLDEN / "seed-h6.sfc").read_bytes())
    assert h6["codec"] == "0.6.0" and "model" not in h6 and "setup" not in h6
    # the cifar10 models of the zoo, each with a file: cifar10-1 (files up to 0.4.0), cifar10-2 (0.5.0),
    # cifar10-3 (0.6.0), ..., and today's cifar10; `trainer ship` renames, never drops, a model
    # (or retired: `trainer retire` moves the index entry, never drops it)
    names = [m["name"] for m in zoo.list_models() if re.fullmatch(r"cifar10(-\d+)?", m["name"])]
    assert len(names) >= 5 and "cifar10" in names
    retired = {e["sha256"] for n, e in zoo.retired_models().items() if n.startswith("cifar10")}
    shas = {api.read_header(p.read_bytes())["model"]["sha256"] for p in FILES if p.stem.startswith("cifar10")}
    assert shas == {zoo.load_model(n).sha256 for n in names} | retired and len(retired) >= 3
    # format versions: 1 up to 0.7.0, 2 in 0.8.0 (the header's longer dictionary), 3 in 0.9.0, 4 from
    # 0.9.1 (the release in the fixed header), 5 from 0.9.27 where the images' metadata is kept, 6 from
    # 0.9.28 where there are 16-bit images; the same image as seed-h6 (0.6.0), seed-f2's file is 26
    # bytes smaller, all of it header
    versions = {p.stem: container.format_version(p.read_bytes()) for p in FILES}
    for p in FILES:
        metas = api.read_header(p.read_bytes()).get("meta", {}).values()
        r, kept, wide = _release(p), any("kept" in m for m in metas), any("deep" in m for m in metas)
        assert versions[p.stem] == (6 if wide else 5 if kept else 4 if r >= (0, 9, 1) else 3 if r >= (0, 9)
                                    else 2 if r >= (0, 8) else 1), p.stem
        assert not kept or r >= (0, 9, 27)
        assert not wide or r >= (0, 9, 28)
    assert versions["seed-f2"] == versions["cifar10-x6"] == 2 and versions["seed-h6"] == 1
    assert versions["cifar10-x7"] == versions["seed-x5"] == 3 and versions["seed-f4"] == 4
    deep = [m["deep"] for m in api.read_header((GOLDEN / "seed-deep.sfc").read_bytes())["meta"].values()]
    assert deep[0] == {"shift": 0, "table": 0, "low": 8} and deep[1] == {"shift": 4, "table": 0, "low": 4}
    assert deep[2]["table"] > 0  # every path of deep.split: all 16 bits, shifted, a table
    assert versions["seed-meta"] == 5 and versions["seed-deep"] == 6 and set(versions.values()) == {1, 2, 3, 4, 5, 6}
    # format version 4 holds the release in the fixed header: seed-f2's image written by 0.9.1 is
    # the same 1,219 bytes as 0.8.0's file (a 27-byte header; in version 3 the new release would
    # have cost 3 bytes)
    f4 = (GOLDEN / "seed-f4.sfc").read_bytes()
    assert api.read_header(f4)["codec"] == "0.9.1" and int.from_bytes(f4[10:12], "little") == 1 + (9 << 6 | 1)
    assert np.array_equal(_pngs(GOLDEN / "seed-f4.sfc")[0], _pngs(GOLDEN / "seed-f2.sfc")[0])
    assert len(f4) == len((GOLDEN / "seed-f2.sfc").read_bytes()) == 1219
    h6, f2 = ((GOLDEN / f"{n}.sfc").read_bytes() for n in ("seed-h6", "seed-f2"))
    assert np.array_equal(_pngs(GOLDEN / "seed-h6.sfc")[0], _pngs(GOLDEN / "seed-f2.sfc")[0])
    assert len(h6) - len(f2) == 26 and container.unpack(h6)[1].tobytes() == container.unpack(f2)[1].tobytes()
    # seed codec versions: 1 (no `seed` in the header), 2, 3, 4, 5 (seed-x5: both images in its LZMA
    # mode), 7 (seed-x7: version 7's mixed mode in blue, red in the difference mode; version 6 has
    # its pinned bitstream in test_seed_codec) and 8 (seed-x8: the same images with the error feedback)
    seeds = {p.stem: api.full_settings(api.read_header(p.read_bytes()))[1]["seed"] for p in FILES}
    assert set(seeds.values()) == {1, 2, 3, 4, 5, 7, 8} and seeds["seed-x8"] == 8
    from scoreflow_codec.coding.seed_codec import _choose, _layout

    for png in _pngs(GOLDEN / "seed-x7.sfc"):
        planes = np.ascontiguousarray(np.moveaxis(png, -1, 0))
        assert [p.mode for p in _choose(planes, _layout(*planes.shape[1:]), 7)[2][1:]] == [1, 2]
    assert all(np.array_equal(a, b) for a, b in zip(_pngs(GOLDEN / "seed-x7.sfc"), _pngs(GOLDEN / "seed-x8.sfc")))
    assert len((GOLDEN / "seed-x8.sfc").read_bytes()) < len((GOLDEN / "seed-x7.sfc").read_bytes())
    # 0.10.3: the same images at the encoder's effort 1 (seed-e1): version 8, the file larger, neither image
    # with least squares nor the second's blue mixed (at effort 3 both take them); no new decoder path,
    # but its bytes are pinned
    from scoreflow_codec.coding import seed_codec as sc

    assert seeds["seed-e1"] == 8 and api.read_header((GOLDEN / "seed-e1.sfc").read_bytes())["codec"] == "0.10.3"
    assert all(np.array_equal(a, b) for a, b in zip(_pngs(GOLDEN / "seed-e1.sfc"), _pngs(GOLDEN / "seed-x8.sfc")))
    assert len((GOLDEN / "seed-e1.sfc").read_bytes()) > len((GOLDEN / "seed-x8.sfc").read_bytes())
    for png, chosen in zip(_pngs(GOLDEN / "seed-e1.sfc"), ({3: (1, [1, 0]), 1: (0, [1, 0])},
                                                          {3: (1, [1, 2]), 1: (0, [1, 0])})):
        planes = np.ascontiguousarray(np.moveaxis(png, -1, 0))
        for level, (ls, modes) in chosen.items():
            with sc.effort(level):
                got = _choose(planes, _layout(*planes.shape[1:]), 8)
            assert (got[0], [p.mode for p in got[2][1:]]) == (ls, modes), level
    # 0.9.26: a seed codec file in independent parts, one per image here (stream.in_parts)
    hp = api.read_header((GOLDEN / "seed-parts.sfc").read_bytes())
    assert hp["codec"] == "0.9.26" and len(hp["fields"]["parts"]) == 2
    # the chain's factors on its top network calls: none before 0.9.13, two since
    chains = [api.read_header(p.read_bytes()) for p in FILES if not p.stem.startswith("seed-")]
    assert {api.full_settings(h)[0]["kappa_top"] for h in chains if h["mode"] == "chain"} == {0, 2}  # 2 since 0.9.13


def _pngs(path: Path) -> list[np.ndarray]:
    pngs = sorted(GOLDEN.glob(f"{path.stem}-*.png"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
    return [np.asarray(Image.open(p).convert("RGB")) for p in pngs]


def _decode(path: Path):
    data = path.read_bytes()
    header = api.read_header(data)
    if path.stem.startswith("seed-"):  # the seed codec alone (what --fallback writes for photographs)
        assert header["fields"]["n_seed"] == header["fields"]["n_tiles"]
        return api.decompress(data, None)  # decodes without a model, whatever model its header names
    assert header["fields"]["n_seed"] < header["fields"]["n_tiles"], "the golden file must exercise the model"
    model = zoo.model_for_header(header)
    assert model.sha256 == header["model"]["sha256"]
    return api.decompress(data, model)


def _same(decoded, path: Path) -> None:
    """The pixels of the PNGs beside the file, and their metadata (none in the files before 0.9.27)."""
    want = _pngs(path)
    assert len(decoded) == len(want) > 0
    for k, (src, w) in enumerate(zip(decoded, want)):
        if src.deep:  # 16-bit: every bit of the PNG's samples (Pillow would give the high bytes)
            w = images.to_array(images.load_image(GOLDEN / f"{path.stem}-{k}.png"))
            assert np.array_equal(images.to_array(src), w) and w.dtype == np.uint16, f"{path.stem}-{k}.png"
            continue
        assert np.array_equal(np.asarray(images.to_pil(src)), w), f"{path.stem}-{k}.png"
        assert src.metadata == images.load_image(GOLDEN / f"{path.stem}-{k}.png").metadata, f"{path.stem}-{k}.png"


def _retired(path: Path) -> bool:
    header = api.read_header(path.read_bytes())
    return not path.stem.startswith("seed-") and zoo.retired_name(header["model"]["sha256"]) is not None


@pytest.mark.parametrize("path", [p for p in FILES if _retired(p)], ids=lambda p: p.stem)
def test_a_retired_models_file_is_refused_with_the_way_to_decode_it(path, tmp_path):
    """One error (exit 5, no output written) naming the last release that shipped the model and the
    commit with its file; `sfcodec info` says the same."""
    from click.testing import CliRunner

    from cli.main import cli

    header = api.read_header(path.read_bytes())
    name = zoo.retired_name(header["model"]["sha256"])
    entry = zoo.retired_models()[name]
    release = tuple(int(x) for x in entry["release"].split("."))
    assert (0, 9, 42) <= release < tuple(int(x) for x in __version__.split(".")), entry  # 0.9.43 retired the first
    assert re.fullmatch(r"[0-9a-f]{12}", entry["commit"]), entry
    with pytest.raises(ModelError) as e:
        zoo.model_for_header(header)
    msg = str(e.value)
    assert "\n" not in msg and f"zoo name {name}" in msg and f"scoreflow-codec {entry['release']}" in msg, msg
    assert f"git show {entry['commit']}:scoreflow_codec/zoo/{name}.safetensors.xz" in msg, msg
    out = tmp_path / "never-written.png"
    r = CliRunner().invoke(cli, ["decompress", str(path), "-o", str(out)])
    assert r.exit_code == ModelError.exit_code and "Traceback" not in r.output and not out.exists(), r.output
    info = CliRunner().invoke(cli, ["info", str(path)]).output
    assert f"retired as {name}" in info and entry["commit"] in info, info
    with pytest.raises(ModelError, match=f"no longer ships with the package.*{re.escape(entry['release'])}"):
        zoo.load_model(name)


def _model_from_its_commit(path: Path, into: Path):
    """The retired model of a golden file, from the commit its index entry names (what the error
    tells users to do); skips where this is no git checkout with that commit (an installed copy)."""
    from scoreflow_codec.modelfile import load_model_file

    entry = _retired_entry(path)
    blob = _git_blob(entry)
    if blob is None:
        pytest.skip(f"not a git checkout with commit {entry['commit']} (an installed copy)")
    (into / entry["file"]).write_bytes(blob)
    model = load_model_file(into / entry["file"])
    assert model.sha256 == entry["sha256"] == _model_sha(path)
    return model


def _retired_entry(path: Path) -> dict:
    return zoo.retired_models()[zoo.retired_name(_model_sha(path))]


def _git_blob(entry: dict) -> bytes | None:
    """A retired model's file as its commit holds it, or None outside a git checkout with it."""
    import subprocess

    blob = subprocess.run(["git", "-C", str(GOLDEN), "show", f"{entry['commit']}:{entry['path']}"], capture_output=True)
    return blob.stdout if blob.returncode == 0 else None


def _newest_per(key, files) -> list[Path]:
    """For each value of key(file) (None: the file is left out), the newest file (by release, then
    name) that has it."""
    newest: dict = {}
    for p in files:
        k = key(p)
        if k is not None and (k not in newest or (_release(p), p.stem) > (_release(newest[k]), newest[k].stem)):
            newest[k] = p
    return list(newest.values())


def _one_per_retire_commit() -> list[Path]:
    """For each commit the index's retired entries name, the newest exact-arithmetic golden file whose
    model that commit holds (derived from the index, so `trainer retire` adds its case without an edit
    here)."""
    def commit(p: Path) -> str | None:
        return _retired_entry(p)["commit"] if _arith(p) == "exact64" and _retired(p) else None

    return sorted(_newest_per(commit, FILES), key=_release)


def _model_sha(path: Path) -> str:
    return api.read_header(path.read_bytes())["model"]["sha256"]


def _model_file(sha: str) -> bytes | None:
    """The file of the model of this sha256 as it is stored (perhaps xz-compressed): the zoo's, or a
    retired model's in its commit (None outside a git checkout with it: an installed copy)."""
    name = zoo.shipped_name(sha)
    if name is None:
        return _git_blob(zoo.retired_models()[zoo.retired_name(sha)])
    return (zoo.ZOO_DIR / zoo.read_index()["models"][name]["file"]).read_bytes()


@functools.lru_cache(maxsize=None)
def _model_config(sha: str) -> str:
    """The config the model of this sha256 was built from (its safetensors metadata, read from the
    first bytes of its file), as canonical JSON; the sha256 itself where that file cannot be read."""
    import json
    import lzma

    from scoreflow_codec.modelfile import XZ_MAGIC, _header

    data = _model_file(sha)
    if data is None:
        return sha
    if data.startswith(XZ_MAGIC):  # the first bytes of an xz-compressed file: its header
        d = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
        first = d.decompress(data, max_length=8)
        data = first + d.decompress(b"", max_length=int.from_bytes(first, "little"))
    config = json.loads(_header(data, sha)["__metadata__"]["config"])
    config.pop("info", None), config.pop("name", None)  # names and training notes: nothing the decoder reads
    return json.dumps(config, sort_keys=True)


def _decode_key(path: Path) -> str:
    """What decides how a model's golden file decodes: its model's config (not the weights), the
    header's settings as the decoder completes them, the format version, the mode, the images, the
    setup and the stream's settings. Files alike in all of it take the same code paths."""
    import json

    data = path.read_bytes()
    h = api.read_header(data)
    return json.dumps([_model_config(h["model"]["sha256"]), api.full_settings(h), container.format_version(data),
                       h["mode"], h["images"], h.get("setup"), h.get("stream")], sort_keys=True, default=str)


def _one_per_decode_key() -> list[Path]:
    """Every seed-only file, and for each decode key of the models' exact-arithmetic files the newest
    file that has it (decoding files alike in all of it again took CI's 2 cores 7 minutes; their models
    are each checked: test_every_exact_model_file_has_its_model)."""
    def key(p: Path) -> str | None:
        return None if _arith(p) != "exact64" else p.stem if p.stem.startswith("seed-") else _decode_key(p)

    return sorted(_newest_per(key, FILES), key=lambda p: p.stem)


RETIRE_CASES = _one_per_retire_commit()  # once, at collection: every golden file's header read
DECODE_CASES = _one_per_decode_key()


@pytest.mark.parametrize("path", DECODE_CASES, ids=lambda p: p.stem)
def test_exact_golden_file_decodes_to_its_pngs(path, tmp_path):
    """Shipped models' files with the zoo's model, retired ones' with the model file from the commit
    the error names (what it tells users to do)."""
    if _retired(path):
        _same(api.decompress(path.read_bytes(), _model_from_its_commit(path, tmp_path)), path)
    else:
        _same(_decode(path), path)


def test_golden_files_decode_alike_as_their_keys_say():
    """The decode cases cover every kind of file: the seed codec's, shipped and retired models', both
    families, files of a release before and after 0.9.13's chain factors (kappa_top); at least two
    model configs per family, and fewer cases than files."""
    stems = {p.stem for p in DECODE_CASES}
    exact = [p for p in FILES if _arith(p) == "exact64"]
    assert {p.stem for p in exact if p.stem.startswith("seed-")} <= stems
    models = [p for p in DECODE_CASES if not p.stem.startswith("seed-")]
    assert any(_retired(p) for p in models) and any(not _retired(p) for p in models)
    for family in ("cifar10", "photo"):
        assert len({_model_config(_model_sha(p)) for p in models if p.stem.startswith(family + "-")}) >= 2, family
    assert {api.full_settings(api.read_header(p.read_bytes()))[0]["kappa_top"] for p in models} == {0, 2}
    assert len(DECODE_CASES) < len(exact)


def test_every_exact_model_file_has_its_model():
    """Every model's file, decoded or not (a file is decoded where it is its decode key's newest): the
    model file it needs, the zoo's or the one in the commit that its retired model's error names, has
    the sha256 in its header (each model's file read once)."""
    import hashlib
    import lzma

    from scoreflow_codec.modelfile import XZ_MAGIC

    missing = []
    for sha in sorted({_model_sha(p) for p in FILES if _arith(p) == "exact64" and not p.stem.startswith("seed-")}):
        data = _model_file(sha)
        if data is None:
            missing.append(sha[:12])
            continue
        data = lzma.decompress(data, format=lzma.FORMAT_XZ) if data.startswith(XZ_MAGIC) else data
        assert hashlib.sha256(data).hexdigest() == sha
    if missing:
        pytest.skip(f"not a git checkout with the retired models' commits (an installed copy): {missing}")


@pytest.mark.parametrize("path", RETIRE_CASES, ids=lambda p: p.stem)
def test_a_retired_models_commit_holds_its_model(path, tmp_path):
    """The way the error gives: the model file from the commit it names loads as a model of the
    file's sha256, for one file per retire commit (since 0.9.43 each ship retired one or more models;
    at least six commits). Files of each decode key are decoded by test_exact_golden_file_decodes_to_its_pngs."""
    assert len(RETIRE_CASES) >= 6
    _model_from_its_commit(path, tmp_path)


@pytest.mark.parametrize("path", [p for p in FILES if _arith(p) == "float32"], ids=lambda p: p.stem)
def test_float32_golden_file_decodes_or_is_refused(path, tmp_path):
    """(Their models are all retired: each comes from the commit that has it.)"""
    try:
        decoded = api.decompress(path.read_bytes(), _model_from_its_commit(path, tmp_path))
    except (BadFileError, DecodeMismatchError) as e:
        msg = str(e)
        assert "\n" not in msg and "reproduce the encoder's arithmetic" in msg, msg
        pytest.xfail(f"another machine type than the encoder's, refused cleanly: {msg[:120]}")
    _same(decoded, path)


def test_info_names_the_zoo_entry_a_renamed_model_has_now():
    """photo-x2.sfc says "photo" in its header; the zoo has since given that name to a newer model.
    `sfcodec info` must say which shipped model the file needs, not send the user to the new one."""
    from click.testing import CliRunner

    from cli.main import cli

    header = api.read_header((GOLDEN / "photo-x2.sfc").read_bytes())
    assert header["model"]["name"] == "photo" and zoo.shipped_name(header["model"]["sha256"]) == "photo-3"
    assert zoo.shipped_name("0" * 64) is None and zoo.retired_name("0" * 64) is None
    out = CliRunner().invoke(cli, ["info", str(GOLDEN / "photo-x2.sfc")]).output
    assert "shipped, now named photo-3" in out, out
