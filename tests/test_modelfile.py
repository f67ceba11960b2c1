import hashlib
import json
import lzma
from pathlib import Path

import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from safetensors.torch import save_file

from coding_models import tiny_preset
from scoreflow_codec import modelfile, zoo
from scoreflow_codec.dequant import DequantConfig, UniformDequantizer
from scoreflow_codec.errors import ModelError
from scoreflow_codec.modelfile import load_model_file, save_model

torch.set_num_threads(1)


def _outputs(model, deq):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, 32, 32, generator=g)
    t = torch.tensor([1e-5, 0.1, 0.5, 1.0])
    xi = torch.randint(0, 256, (4, 3, 32, 32), generator=g, dtype=torch.uint8)
    with torch.no_grad():
        return model(x, t), deq.sample(xi, generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("sde", ["vp", "ve"])
def test_round_trip_is_bit_exact(tmp_path, sde):
    model, deq = tiny_preset(randomise_zeros=True, sde=sde)
    path = tmp_path / "m.safetensors"
    sha = save_model(path, model, deq, {"preset": "tiny", "info": {"name": "toy"}}, metadata={"steps": 3})
    assert sha == hashlib.sha256(path.read_bytes()).hexdigest()
    assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]  # no temp file left
    lm = load_model_file(path)
    assert lm.sha256 == sha and lm.name == "toy"
    assert lm.config["preset"] == "tiny" and lm.config["info"] == {"name": "toy", "steps": 3}
    assert lm.sde.config.kind == sde and lm.model.sde is lm.sde
    assert not lm.model.training and not lm.dequantizer.training
    for a, b in [(model, lm.model), (deq, lm.dequantizer)]:
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    (e1, (u1, q1)), (e2, (u2, q2)) = _outputs(model, deq), _outputs(lm.model, lm.dequantizer)
    assert torch.equal(e1, e2) and torch.equal(u1, u2) and torch.equal(q1, q2)
    # same content -> same bytes -> same sha256
    assert save_model(tmp_path / "again.safetensors", lm.model, lm.dequantizer, lm.config) == sha


def test_uniform_dequantizer_and_key_prefixes(tmp_path):
    model, _ = tiny_preset(randomise_zeros=True)
    path = tmp_path / "u.safetensors"
    save_model(path, model, UniformDequantizer(DequantConfig(kind="uniform", channel_groups=1)), {})
    tensors = st_load(path.read_bytes())
    assert all(k.startswith("model.") for k in tensors)
    lm = load_model_file(path)
    assert isinstance(lm.dequantizer, UniformDequantizer) and lm.name == "u"


def test_float16_export(tmp_path):
    model, deq = tiny_preset(randomise_zeros=True)
    p32, p16 = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_model(p32, model, deq, {}, dtype="float32")
    save_model(p16, model, deq, {}, dtype="float16")
    ratio = p16.stat().st_size / p32.stat().st_size
    lm = load_model_file(p16)
    assert all(v.dtype == torch.float32 for v in lm.model.state_dict().values())
    assert lm.config and json.loads(json.dumps(lm.config))
    (e1, (u1, q1)), (e2, (u2, q2)) = _outputs(model, deq), _outputs(lm.model, lm.dequantizer)
    de, du, dq = (e1 - e2).abs().max().item(), (u1 - u2).abs().max().item(), (q1 - q2).abs().max().item()
    print(f"fp16 export: size x{ratio:.3f}; max |d eps_hat| {de:.2e} (|eps_hat| max {e1.abs().max():.2f}), "
          f"max |d u| {du:.2e}, max |d log_q| {dq:.2e} nats (log_q ~ {q1.abs().mean():.1f})")
    assert ratio < 0.55
    assert 0 < de < 2e-2 and du < 1e-2
    with pytest.raises(ValueError):
        save_model(p16, model, deq, {}, dtype="bfloat16")


def test_config_must_match_modules(tmp_path):
    model, deq = tiny_preset(randomise_zeros=True)
    with pytest.raises(ValueError, match="unet"):
        save_model(tmp_path / "x.safetensors", model, deq, {"unet": {"channels": 999}})


# --- bad files ------------------------------------------------------------------------------
def _good(tmp_path) -> Path:
    model, deq = tiny_preset(randomise_zeros=True)
    path = tmp_path / "good.safetensors"
    save_model(path, model, deq, {})
    return path


def _rewrite(src: Path, dst: Path, tensors=None, meta=None) -> Path:
    from safetensors import safe_open
    with safe_open(str(src), "pt") as f:
        m = dict(f.metadata())
        t = {k: f.get_tensor(k) for k in f.keys()}
    save_file(t if tensors is None else tensors(t), str(dst), metadata=m if meta is None else meta(m))
    return dst


def _bad_files(tmp_path):
    good = _good(tmp_path)
    data = good.read_bytes()
    (tmp_path / "random.bin").write_bytes(bytes(range(256)) * 10)
    (tmp_path / "empty.bin").write_bytes(b"")
    (tmp_path / "trunc.safetensors").write_bytes(data[: len(data) // 2])
    (tmp_path / "plain.safetensors").write_bytes(st_save({"w": torch.zeros(2)}))
    (tmp_path / "pickle.pt").write_bytes(b"\x80\x04\x95" + b"\x00" * 64)
    (tmp_path / "weights-001.safetensors").write_bytes(st_save({"opt.3.exp_avg": torch.zeros(2)}))  # a later shard
    (tmp_path / "trunc.safetensors.xz").write_bytes(lzma.compress(data)[:-100])
    (tmp_path / "junk.safetensors.xz").write_bytes(lzma.compress(b"junk"))
    return {
        "xz_truncated": (tmp_path / "trunc.safetensors.xz", "corrupt xz-compressed model file"),
        "xz_not_a_model": (tmp_path / "junk.safetensors.xz", "not a safetensors"),
        "missing": (tmp_path / "nope.safetensors", "not found"),
        "random": (tmp_path / "random.bin", "not a safetensors"),
        "empty": (tmp_path / "empty.bin", "not a safetensors"),
        "truncated": (tmp_path / "trunc.safetensors", "safetensors"),
        "pickle": (tmp_path / "pickle.pt", "not a safetensors"),
        "foreign": (tmp_path / "plain.safetensors", "not a scoreflow-codec model"),
        "checkpoint": (tmp_path / "weights-001.safetensors", "a training checkpoint's weights, not a model file: "
                                                             "export the run's model first (python -m trainer export"),
        "version": (_rewrite(good, tmp_path / "v.st", meta=lambda m: {**m, "format_version": "2"}), "version"),
        "config": (_rewrite(good, tmp_path / "c.st", meta=lambda m: {**m, "config": "{not json"}), "bad model config"),
        "no_unet": (_rewrite(good, tmp_path / "n.st",
                             meta=lambda m: {**m, "config": json.dumps({"sde": {}, "dequant": {}})}), "unet"),
        "missing_key": (_rewrite(good, tmp_path / "k.st",
                                 tensors=lambda t: {k: v for k, v in t.items() if "conv_out.weight" not in k}),
                        "missing model.net.conv_out.weight"),
        "extra_key": (_rewrite(good, tmp_path / "e.st", tensors=lambda t: {**t, "dequant.foo": torch.zeros(1)}),
                      "unexpected dequant.foo"),
        "codec": (_rewrite(good, tmp_path / "d.st", meta=lambda m: {**m, "config": json.dumps(
            {**json.loads(m["config"]), "codec": {"tile": 4}})}), "codec tile must be an integer in [8, 256]"),
        "codec_type": (_rewrite(good, tmp_path / "t.st", meta=lambda m: {**m, "config": json.dumps(
            {**json.loads(m["config"]), "codec": [64]})}), "codec must be an object"),
        "name_type": (_rewrite(good, tmp_path / "nt.st", meta=lambda m: {**m, "config": json.dumps(
            {**json.loads(m["config"]), "info": {"name": 7}})}), "name must be a string"),
        "info_type": (_rewrite(good, tmp_path / "it.st", meta=lambda m: {**m, "config": json.dumps(
            {**json.loads(m["config"]), "info": [1]})}), "bad model config"),
        "shape": (_rewrite(good, tmp_path / "s.st",
                           tensors=lambda t: {**t, "model.net.conv_in.bias": torch.zeros(5)}), "shape"),
    }


def test_a_file_may_carry_its_coding_defaults(tmp_path, monkeypatch):
    """config["codec"]: the tile and chain steps the codec uses with the model unless told
    otherwise; a zoo entry's own defaults take precedence; bad values are refused on saving."""
    from scoreflow_codec import api

    model, deq = tiny_preset(randomise_zeros=True)
    path = tmp_path / "mine.safetensors"
    save_model(path, model, deq, {"codec": {"tile": 64, "chain_steps": 96}})
    lm = load_model_file(path)
    assert (lm.tile, lm.chain_steps) == (64, 96) and lm.config["codec"] == {"tile": 64, "chain_steps": 96}
    assert api.default_stream_settings(lm).tile == 64 and api.default_stream_settings(lm, 16).tile == 16
    assert api.default_settings("chain", lm)["steps"] == 96
    assert load_model_file(_good(tmp_path)).tile == 32  # none recorded: the codec's

    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    (tmp_path / "index.json").write_text(json.dumps({"models": {"p": {
        "file": "mine.safetensors", "sha256": sha, "description": "d", "image_size": 32, "tile": 48}}}))
    monkeypatch.setattr(zoo, "ZOO_DIR", tmp_path)
    lm = zoo.load_model("p")
    assert (lm.tile, lm.chain_steps) == (48, 96)  # the entry's tile, the file's steps (the entry has none)

    for bad in ({"tile": 4}, {"tile": 64.0}, {"chain_steps": 1}, {"tile": True}, [64], 64):
        with pytest.raises(ValueError, match="codec"):
            save_model(tmp_path / "bad.safetensors", model, deq, {"codec": bad})
    assert not (tmp_path / "bad.safetensors").exists()


def test_the_name_a_file_records(tmp_path):
    """info's name is the loaded name; a file exported before it moved there (a top-level "name")
    still loads by its recorded name, not the file's stem; with none, the stem."""
    good = _good(tmp_path)
    assert load_model_file(good).name == "good"
    for where, path in (("info", "a.st"), ("top", "b.st")):
        def meta(m, where=where):
            c = json.loads(m["config"])
            c.setdefault("info", {}).pop("name", None)
            (c["info"] if where == "info" else c)["name"] = "mine"
            return {**m, "config": json.dumps(c)}
        assert load_model_file(_rewrite(good, tmp_path / path, meta=meta)).name == "mine"


def test_xz_compressed_file_is_the_same_model(tmp_path):
    """An .xz copy loads as the model it holds: the same sha256 (the .sfc header's), name, weights."""
    good = _good(tmp_path)
    xz = tmp_path / "good.safetensors.xz"
    xz.write_bytes(lzma.compress(good.read_bytes()))
    a, b = load_model_file(good), load_model_file(xz)
    assert a.sha256 == b.sha256 == hashlib.sha256(modelfile.read_model_bytes(xz)).hexdigest() == hashlib.sha256(good.read_bytes()).hexdigest()
    assert a.name == b.name == "good" and len(xz.read_bytes()) < len(good.read_bytes())
    assert all(torch.equal(x, y) for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values()))


def test_bad_files_raise_model_error(tmp_path):
    for case, (path, words) in _bad_files(tmp_path).items():
        with pytest.raises(ModelError) as e:
            load_model_file(path)
        msg = str(e.value)
        assert words in msg and "\n" not in msg, (case, msg)


def test_a_folder_given_as_model_is_named(tmp_path):
    """A run directory (a checkpoint in it) or another folder as --model: one line saying what it is and,
    for a run, the export command; not "unknown model ... not a shipped model"."""
    run = tmp_path / "runs" / "mine"
    (run / "checkpoint").mkdir(parents=True)
    (run / "checkpoint" / "state.json").write_text("{}")
    with pytest.raises(ModelError, match=r"mine: a training run, not a model file: export its model first "
                                         r"\(python -m trainer export .*mine -o model.safetensors\)"):
        zoo.load_model(str(run))
    with pytest.raises(ModelError, match=r"runs: a folder, not a model file$"):
        zoo.load_model(str(tmp_path / "runs"))
    with pytest.raises(ModelError, match="not a shipped model"):
        zoo.load_model(str(tmp_path / "nowhere"))


def test_no_pickle_in_the_loaders():
    for mod in (modelfile, zoo):
        src = Path(mod.__file__).read_text()
        assert "pickle" not in src.replace("No pickle", "") and "torch.load" not in src


# --- zoo ------------------------------------------------------------------------------------
def test_shipped_zoo_is_consistent():
    """Every model the package ships exists, matches its sha256, loads, and the default is one
    of them: what `sfcodec compress` relies on right after install."""
    index = json.loads((zoo.ZOO_DIR / "index.json").read_text())
    assert index["default"] in index["models"]
    for name, entry in index["models"].items():
        path = zoo.ZOO_DIR / entry["file"]
        data = path.read_bytes()
        if path.suffix == ".xz":  # a kept model, stored compressed: its sha256 is the .safetensors'
            data = lzma.decompress(data)
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], name
        assert path.stat().st_size < 15 * 2**20, name
        lm = zoo.load_model(name)
        assert lm.name == name and lm.sha256 == entry["sha256"]
        assert isinstance(entry.get("tile", 32), int) and 8 <= lm.tile <= 256, name
        assert (zoo.ZOO_DIR / f"{name}.md").is_file(), f"{name} has no model card"


def test_zoo(tmp_path, monkeypatch):
    good = _good(tmp_path)
    zdir = tmp_path / "zoo"
    zdir.mkdir()
    (zdir / "toy.safetensors").write_bytes(good.read_bytes())
    (zdir / "bad.safetensors").write_bytes(good.read_bytes())
    (zdir / "kept.safetensors.xz").write_bytes(lzma.compress(good.read_bytes()))
    (zdir / "badxz.safetensors.xz").write_bytes(lzma.compress(good.read_bytes())[:-40])
    sha = hashlib.sha256(good.read_bytes()).hexdigest()
    entry = dict(sha256=sha, description="a toy", image_size=32)
    (zdir / "index.json").write_text(json.dumps({"models": {
        "toy": {"file": "toy.safetensors", **entry},
        "toy64": {"file": "toy.safetensors", **entry, "tile": 64, "chain_steps": 256},
        "bad": {"file": "bad.safetensors", **{**entry, "sha256": "0" * 64}},
        "gone": {"file": "gone.safetensors", **entry},
        "kept": {"file": "kept.safetensors.xz", **entry},
        "badxz": {"file": "badxz.safetensors.xz", **entry}}, "default": "toy"}))
    monkeypatch.setattr(zoo, "ZOO_DIR", zdir)

    assert [m["name"] for m in zoo.list_models()] == ["toy", "toy64", "bad", "gone", "kept", "badxz"]
    assert zoo.list_models()[0]["default"] and zoo.default_model() == "toy"
    lm = zoo.load_model("toy")
    assert lm.name == "toy" and lm.sha256 == sha
    assert lm.tile == 32 and zoo.load_model("toy64").tile == 64 and zoo.load_model(str(good)).tile == 32
    assert lm.chain_steps is None and zoo.load_model("toy64").chain_steps == 256
    assert zoo.load_model(None).name == "toy"
    assert zoo.load_model(str(good)).sha256 == sha  # a path wins
    kept = zoo.load_model("kept")  # xz-compressed in the zoo: the same model, the same sha256
    assert kept.name == "kept" and kept.sha256 == sha and zoo.shipped_name(sha) == "toy"
    assert all(torch.equal(a, b) for a, b in zip(kept.model.state_dict().values(), lm.model.state_dict().values()))
    for name, words in [("bad", "corrupt"), ("gone", "missing"), ("badxz", "corrupt xz-compressed"),
                        ("nothing", "shipped: toy, toy64, bad, gone, kept, badxz")]:
        with pytest.raises(ModelError, match=words):
            zoo.load_model(name)

    monkeypatch.setattr(zoo, "ZOO_DIR", tmp_path / "nowhere")
    assert zoo.list_models() == []
    with pytest.raises(ModelError, match="shipped: none"):
        zoo.load_model("toy")
    with pytest.raises(ModelError, match="no default"):
        zoo.load_model(None)


def test_a_shipped_model_given_by_path_keeps_its_defaults(tmp_path, monkeypatch):
    """The coding defaults (tile, chain steps) follow the model's bytes, not how it was named: the
    packaged file given by path codes like its name; another file keeps the built-in defaults."""
    good = _good(tmp_path)
    model, deq = tiny_preset(randomise_zeros=True)
    torch.nn.init.zeros_(next(model.parameters()))  # other weights, another sha256
    other = tmp_path / "other.safetensors"
    save_model(other, model, deq, {})
    zdir = tmp_path / "zoo"
    zdir.mkdir()
    (zdir / "photo.safetensors").write_bytes(good.read_bytes())
    sha = hashlib.sha256(good.read_bytes()).hexdigest()
    (zdir / "index.json").write_text(json.dumps({"models": {"photo": {
        "file": "photo.safetensors", "sha256": sha, "description": "d", "image_size": 32, "tile": 64,
        "chain_steps": 200}}, "default": "photo"}))
    monkeypatch.setattr(zoo, "ZOO_DIR", zdir)

    for ref in ("photo", str(zdir / "photo.safetensors"), str(good)):
        lm = zoo.load_model(ref)
        assert (lm.sha256, lm.tile, lm.chain_steps) == (sha, 64, 200), ref
    assert zoo.load_model(str(good)).name == "good"  # the file's own name: it was not loaded as "photo"
    lm = zoo.load_model(str(other))
    assert lm.sha256 != sha and (lm.tile, lm.chain_steps) == (32, None)
