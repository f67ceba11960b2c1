"""The benchmark harness: classical peers, data loaders, and bench/run.py end to end."""
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from bench import classical, datasets
from bench.run import parse_codecs, scoreflow_label
from coding_models import tiny_model_file

REPO = Path(__file__).resolve().parents[1]


def _image(channels: int, h: int = 24, w: int = 40) -> np.ndarray:
    rng = np.random.default_rng(channels)
    y, x = np.mgrid[0:h, 0:w]
    planes = [(x * 5 + y * 3 + 40 * k + rng.integers(0, 16, (h, w))) % 256 for k in range(channels)]
    return np.stack(planes, axis=2).astype(np.uint8)


@pytest.mark.parametrize("channels", [3, 1, 4, 2], ids=["rgb", "gray", "rgba", "gray+alpha"])
@pytest.mark.parametrize("codec", classical.CODECS, ids=lambda c: c.name)
def test_classical_round_trip(codec, channels):
    reason = codec.unavailable_reason()
    if reason:
        pytest.skip(f"{codec.name}: {reason}")
    img = _image(channels)
    m = classical.measure(codec, img)
    assert m.error is None and m.lossless, m.error
    assert m.bpd == pytest.approx(8 * m.nbytes / img.size)
    assert m.encode_s >= 0 and m.decode_s >= 0
    assert codec.decode(codec.encode(img), channels).shape == img.shape


def test_measure_flags_a_lossy_codec():
    lossy = classical.ClassicalCodec("halver", "drops the low bit", lambda x: (x >> 1).tobytes(),
                                     lambda b: (np.frombuffer(b, np.uint8) << 1).reshape(24, 40, 3))
    m = classical.measure(lossy, _image(3))
    assert not m.lossless and "differs" in m.error
    assert lossy.unavailable_reason().startswith("not lossless")


def test_measure_records_encoder_errors():
    def broken(_):
        raise RuntimeError("boom")
    m = classical.measure(classical.ClassicalCodec("broken", "", broken, broken), _image(3))
    assert not m.lossless and m.bpd is None and "boom" in m.error


def test_parse_codecs():
    assert parse_codecs("all") == (list(classical.BY_NAME), True)
    assert parse_codecs("classical") == (list(classical.BY_NAME), False)
    assert parse_codecs("png,webp,scoreflow") == (["png", "webp"], True)
    with pytest.raises(ValueError, match="unknown codec"):
        parse_codecs("png,gif")


def test_scoreflow_label_names_the_steps_coded_with():
    """The settings label names the model's own chain steps where it has them, else the mode's
    default; --setting steps=N wins; ODE mode keeps its default."""
    from types import SimpleNamespace

    from scoreflow_codec import api

    own, plain = SimpleNamespace(chain_steps=24), SimpleNamespace(chain_steps=None)
    args = SimpleNamespace(model="m", mode="chain", device="cpu", sf_settings={})
    assert scoreflow_label(args, own) == "model=m mode=chain steps=24 device=cpu arith=exact64"
    assert f" steps={api.default_settings('chain')['steps']} " in scoreflow_label(args, plain)
    args.sf_settings = {"steps": 8, "arith": "float32"}
    assert scoreflow_label(args, own) == "model=m mode=chain steps=8 device=cpu arith=float32"
    args.sf_settings = {"fallback": "off", "seed_tiles": "first"}  # the model's own coding: said
    assert scoreflow_label(args, own) == "model=m mode=chain steps=24 device=cpu arith=exact64 seed_tiles=first"
    args.mode, args.sf_settings = "ode", {}
    assert f" steps={api.default_settings('ode')['steps']} " in scoreflow_label(args, own)


# --- data sets --------------------------------------------------------------------------

def test_load_npz(tmp_path):
    imgs = np.stack([_image(3, 8, 8)] * 5)
    np.savez(tmp_path / "a.npz", images=imgs)
    s = datasets.load(str(tmp_path / "a.npz"), limit=3)
    assert len(s) == 3 and s.images[0].shape == (8, 8, 3) and s.names[2] == "a[2]"
    np.savez(tmp_path / "gray.npz", images=imgs[..., 0])
    assert datasets.load_npz(tmp_path / "gray.npz").images[0].shape == (8, 8, 1)
    np.savez(tmp_path / "bad.npz", pixels=imgs)
    with pytest.raises(datasets.DataError, match="no .images. array in the .npz \\(it holds: pixels\\)"):
        datasets.load_npz(tmp_path / "bad.npz")
    np.savez(tmp_path / "float.npz", images=imgs.astype(np.float32))
    with pytest.raises(datasets.DataError, match="uint8"):
        datasets.load_npz(tmp_path / "float.npz")


def test_load_folder(tmp_path):
    Image.fromarray(_image(3)).save(tmp_path / "a.png")
    Image.fromarray(_image(1)[..., 0]).save(tmp_path / "b.tiff")
    Image.fromarray(_image(4)).save(tmp_path / "c.png")
    Image.fromarray(_image(3)).convert("P").save(tmp_path / "d.png")
    Image.fromarray(np.full((4, 4), 1000, np.uint16)).save(tmp_path / "e.png")  # 16-bit
    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / "._a.png").write_bytes(b"\x00\x05\x16\x07" + bytes(60))  # a Mac's AppleDouble copy: hidden
    s = datasets.load(str(tmp_path))
    assert s.names == ["a.png", "b.tiff", "c.png", "d.png"]
    assert [im.shape[2] for im in s.images] == [3, 1, 4, 3]
    assert np.array_equal(s.images[0], _image(3))
    assert len(s.notes) == 1 and "e.png" in s.notes[0]
    assert len(datasets.load(str(tmp_path), limit=2)) == 2
    jpegs = tmp_path / "jpegs"  # lossy files only: the message says why none is read
    jpegs.mkdir()
    Image.fromarray(_image(3)).save(jpegs / "a.jpg")
    Image.fromarray(_image(3)).save(jpegs / "b.JPEG")
    with pytest.raises(datasets.DataError, match=r"no usable 8-bit images \(2 .jpeg/.jpg file\(s\) left out: the "
                                                 r"benchmark reads lossless files \(.bmp, .pgm, .png"):
        datasets.load(str(jpegs))


def test_missing_data_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SFC_SHARED_DATA", str(tmp_path / "absent"))
    with pytest.raises(datasets.DataError, match="data set 'kodak' not found"):
        datasets.load("kodak")
    with pytest.raises(datasets.DataError, match="neither a named set"):
        datasets.load(str(tmp_path / "nothing-here"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(datasets.DataError, match="no usable"):
        datasets.load(str(tmp_path / "empty"))


def test_named_sets(shared_data, monkeypatch):
    monkeypatch.setenv("SFC_SHARED_DATA", str(shared_data))
    for name, shape in [("cifar10", (32, 32, 3)), ("kodak", None), ("misc", None)]:
        if not (shared_data / datasets.NAMED[name]).exists():
            continue
        s = datasets.load(name, limit=2)
        assert s.name == name and len(s) == 2
        assert all(im.dtype == np.uint8 and im.ndim == 3 for im in s.images)
        if shape:
            assert s.images[0].shape == shape
    q = datasets.quick_set()
    assert len(q) == 3 and q.images[-1].shape == (32, 64, 3)


# --- scoreflow side and the CLI -----------------------------------------------------------

def _run(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, str(REPO / "bench" / "run.py"), *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=REPO)


def test_cli_quick_classical(shared_data, tmp_path):
    r = _run("--quick", "--codecs", "classical", "--out", str(tmp_path),
             env={"SFC_SHARED_DATA": str(shared_data)})
    assert r.returncode == 0, r.stderr
    assert "| codec | settings | mean bpd" in r.stdout and "| png |" in r.stdout
    (outdir,) = tmp_path.iterdir()
    assert outdir.name.endswith("_quick")
    res = json.loads((outdir / "results.json").read_text())
    assert res["set"]["n_images"] == 3
    assert {"cpu", "cores", "os", "python", "versions", "git"} <= set(res["machine"])
    assert res["published_reference"]["values"]["PNG"] == 5.87
    measured = {s["codec"] for s in res["summary"]}
    assert measured | set(res["skipped"]) == set(classical.BY_NAME)
    assert all(s["lossless"] for s in res["summary"])
    assert len(res["per_image"]) == 3 * len(measured)
    rows = (outdir / "results.csv").read_text().splitlines()
    assert len(rows) == 1 + 3 * len(measured)
    for plot in ("bpd_per_codec.png", "time_vs_bpd.png"):
        assert (outdir / plot).stat().st_size > 1000


def test_cli_errors_are_one_line(tmp_path):
    r = _run("kodak", "--codecs", "png", "--out", str(tmp_path),
             env={"SFC_SHARED_DATA": str(tmp_path / "absent")})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "data set 'kodak' not found" in r.stderr
    r = _run("--quick", "--codecs", "scoreflow", "--model", str(tmp_path / "missing.safetensors"),
             "--out", str(tmp_path), env={"SFC_SHARED_DATA": str(tmp_path / "absent")})
    assert r.returncode == 2 and "Traceback" not in r.stderr  # a bad model is the user's input, as bad data
    assert "missing.safetensors" in r.stderr
    if not torch.cuda.is_available():  # a device this torch cannot run on: the user's input too (0.9.39)
        r = _run("--quick", "--codecs", "scoreflow", "--device", "cuda", "--out", str(tmp_path))
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert r.stderr.startswith("error: --device cuda: "), r.stderr
    assert not list(tmp_path.iterdir())  # nothing written on failure


@pytest.mark.slow
def test_cli_quick_scoreflow(shared_data, tmp_path):
    """`--quick` end to end with the shipped default model (chain mode; ODE mode is covered by
    the CLI tests): every scoreflow number present, every file decoded to the identical pixels.
    (With --quick's loose evaluation the bound and NLL are noisy: only finiteness is checked.)"""
    r = _run("--quick", "--codecs", "png,scoreflow", "--mode", "chain", "--out", str(tmp_path),
             env={"SFC_SHARED_DATA": str(shared_data)}, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "| scoreflow |" in r.stdout and "| png |" in r.stdout
    (outdir,) = tmp_path.iterdir()
    res = json.loads((outdir / "results.json").read_text())
    assert res["scoreflow"]["stream"]["lossless"]
    assert res["settings"]["scoreflow"] == "model=auto mode=chain steps=16 device=cpu arith=exact64"  # --quick's steps
    rows = [row for row in res["per_image"] if row["codec"] == "scoreflow"]
    assert len(rows) == 3 and all(row["lossless"] for row in rows)
    for row in rows:
        assert 0 < row["ode_nll_bpd"] < 16 and 0 < row["bound_bpd"] < 16 and 0 < row["bpd"] < 16
    assert (outdir / "actual_vs_nll.png").stat().st_size > 1000


@pytest.mark.slow
def test_jobs_give_the_same_files(tmp_path):
    """--jobs 2 codes each image in a worker process: the same bytes as --jobs 1 (coding is
    deterministic), in the folder's order, every file decoded and compared."""
    folder = tmp_path / "imgs"
    folder.mkdir()
    for k, (h, w) in enumerate([(64, 96), (64, 80), (72, 96)]):  # some tiles past the seed
        Image.fromarray(np.roll(_image(3, h, w), 7 * k, axis=1)).save(folder / f"im{k}.png")
    model = str(tiny_model_file(tmp_path / "tiny.safetensors", 0))  # the tiny preset: the same code paths in seconds
    common = (str(folder), "--codecs", "scoreflow", "--model", model, "--no-nll", "--no-stream",
              "--setting", "steps=4", "--eval-n-t", "4", "--threads", "1")
    res = {}
    for jobs in (1, 2):
        out = tmp_path / f"out{jobs}"
        r = _run(*common, "--jobs", str(jobs), "--out", str(out), timeout=600)
        assert r.returncode == 0, r.stderr
        (outdir,) = out.iterdir()
        res[jobs] = json.loads((outdir / "results.json").read_text())
        assert res[jobs]["settings"]["jobs"] == jobs and " steps=4 " in res[jobs]["settings"]["scoreflow"]
    rows = {j: [row for row in res[j]["per_image"] if row["codec"] == "scoreflow"] for j in res}
    assert [row["image"] for row in rows[2]] == [row["image"] for row in rows[1]] == ["im0.png", "im1.png", "im2.png"]
    assert all(row["lossless"] and row["bound_bpd"] > 0 for row in rows[2])
    assert [row["nbytes"] for row in rows[2]] == [row["nbytes"] for row in rows[1]]


def test_jobs_must_be_positive(tmp_path):
    for args, words in ((("--jobs", "0"), "--jobs must be at least 1"), (("--eval-n-t", "0"), "--eval-n-t must be at "
                        "least 1"), (("--eval-rtol=-1e-5",), "--eval-rtol must be above 0")):
        r = _run("--quick", *args, "--out", str(tmp_path))
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not list(tmp_path.iterdir())


def test_cli_times_runs_the_users_commands(tmp_path):
    """bench/cli_times.py: each image through `sfcodec compress` and `sfcodec decompress` as
    processes of their own, timed, identical pixels; the exit code says whether all were."""
    folder = tmp_path / "imgs"
    folder.mkdir()
    Image.fromarray(_image(3)).save(folder / "a.png")
    Image.fromarray(_image(1)[..., 0]).save(folder / "b.png")
    out = tmp_path / "res"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "cli_times.py"), str(folder), "--out", str(out),
                        "--threads", "1"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((out / "results.json").read_text())
    assert res["summary"]["images"] == res["summary"]["identical"] == 2 and res["summary"]["failed"] == 0
    for row in res["images"]:
        assert row["identical"] and row["bytes"] > 0 and row["encode_s"] > 0 and row["decode_rss_mib"] > 10
        assert row["bpd"] == 8 * row["bytes"] / row["dims"]
    assert "2 decoded identical" in r.stdout
    bad = subprocess.run([sys.executable, str(REPO / "bench" / "cli_times.py"), str(tmp_path / "none")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "cli_times:" in bad.stderr
    r = subprocess.run([sys.executable, str(REPO / "bench" / "cli_times.py"), str(folder), "--out", str(out),
                        "--batch", "--batch-jobs", "2", "--", "--fallback", "seed"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((out / "results.json").read_text())
    s = res["summary"]
    assert res["batch"] and s["images"] == s["identical"] == 2 and s["coded_by"] == {"seed": 2, "model": 0}
    assert s["batch"]["compress_exit"] == s["batch"]["decompress_exit"] == 0 and s["batch"]["compress_s"] > 0
    assert s["bytes"] == sum(row["bytes"] for row in res["images"]) and "compress -d" in r.stdout


def test_graphics_bench(tmp_path):
    """bench/graphics.py: palette versions of each image through the codec (decoded and compared,
    or it fails) beside PNG, GIF and WebP of the same palette image; bad --colors is one line."""
    folder = tmp_path / "imgs"
    folder.mkdir()
    Image.fromarray(_image(3, 40, 48)).save(folder / "a.png")
    out = tmp_path / "res"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "graphics.py"), str(folder), "--colors", "16,4",
                        "--crop", "32", "--threads", "1", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [r_["kind"] for r_ in rows] == ["16 colours", "4 colours"]
    for row in rows:
        assert 1 < row["colors"] <= 16 and row["coded_as"] in ("colors", "indices")
        assert row["sfc_bpp"] > 0 and row["png_bpp"] > 0 and row["webp_bpp"] > 0
    assert "| 16 colours | 1 |" in r.stdout
    r = subprocess.run([sys.executable, str(REPO / "bench" / "graphics.py"), "screens", "--limit", "1", "--threads", "1"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "| RGB | 1 |" in r.stdout, r.stdout + r.stderr
    bad = subprocess.run([sys.executable, str(REPO / "bench" / "graphics.py"), str(folder), "--colors", "1"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "graphics.py: error:" in bad.stderr and "Traceback" not in bad.stderr


def test_seed_effort_bench(tmp_path):
    """bench/seed_effort.py: each image at each effort coded, decoded (compared, or it fails) and timed;
    the summary's bits/dim are the set's, and effort 1 costs bits on photograph-like images; a bad
    --efforts or a missing folder is one line."""
    from test_seed_codec import _photo_synthetic

    folder = tmp_path / "imgs"
    folder.mkdir()
    for k, (h, w) in enumerate(((40, 36), (32, 44))):
        Image.fromarray(np.ascontiguousarray(_photo_synthetic(h, w)[:3].transpose(1, 2, 0))).save(folder / f"{k}.png")
    script = str(REPO / "bench" / "seed_effort.py")
    r = subprocess.run([sys.executable, script, str(folder), "--efforts", "3,1", "--json", str(tmp_path / "e.json")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((tmp_path / "e.json").read_text())
    assert [(row["image"], row["effort"]) for row in res["rows"]] == [("0.png", 3), ("0.png", 1), ("1.png", 3), ("1.png", 1)]
    by = {s["effort"]: s for s in res["summary"]}
    for level in (3, 1):
        mine = [row for row in res["rows"] if row["effort"] == level]
        assert by[level]["bpd"] == pytest.approx(8 * sum(row["bytes"] for row in mine) / sum(row["dims"] for row in mine))
    assert by[1]["bpd_vs_3"] > 0 and by[3]["bpd_vs_3"] == 0
    assert "| 1 |" in r.stdout and "| 0.png |" in r.stdout
    for argv, words in (([str(folder), "--efforts", "4"], "--efforts"), ([str(tmp_path / "nope")], "nope")):
        bad = subprocess.run([sys.executable, script, *argv], capture_output=True, text=True, timeout=120)
        lines = [ln for ln in bad.stderr.splitlines() if ln.startswith("seed_effort.py: error:")]
        assert bad.returncode == 2 and len(lines) == 1 and words in lines[0] and "Traceback" not in bad.stderr, bad.stderr


def test_tile_gap(tmp_path, capsys):
    """bench/tile_gap.py: per tile the model's bound, the seed codec on the tile alone and the tile's
    share of the seed codec on the whole image, and the seed codec on the whole image; the best-per-
    tile columns are the per-tile minima."""
    from bench.tile_gap import EPS_FLAG, _share, main as tile_gap
    from scoreflow_codec import likelihood, zoo
    from scoreflow_codec.api import image_tiles
    from scoreflow_codec.coding.seed_codec import seed_bits, seed_pixel_bits

    rgb = _image(3, 40, 48)
    Image.fromarray(rgb).save(tmp_path / "a.png")
    Image.fromarray(rgb[..., 0]).save(tmp_path / "g.png")
    out = tmp_path / "gap.json"
    assert tile_gap([str(tmp_path / "a.png"), "--model", "cifar10", "--tile", "16", "--n-t", "2", "--json", str(out)]) == 0
    r = json.loads(out.read_text())["images"]["a.png"]
    assert r["tiles"] == 3 * 3  # 40x48 in 16px tiles
    m, s = np.array(r["per_tile"]["model"]), np.array(r["per_tile"]["seed_tile"])
    assert np.all(np.isfinite(m)) and np.all(s > 0)  # m: a 2-sample estimate, which may fall below 0 on a tile
    assert r["best_per_tile"] == pytest.approx(np.minimum(m, s).mean()) and r["model_wins"] == np.mean(m < s)
    assert r["seed_whole"] == pytest.approx(seed_bits(rgb.transpose(2, 0, 1).copy()) / rgb.size)
    assert r["seed_tile"] == pytest.approx(seed_bits(np.ascontiguousarray(rgb[:16, :16].transpose(2, 0, 1))) / (3 * 256)
                                           / 9 + np.sum(s[1:]) / 9)
    # in the image's context: each tile's share of the whole image's pixel bits (per padded tile's dims)
    c = np.array(r["per_tile"]["seed_ctx"])
    assert np.sum(c) * 3 * 256 == pytest.approx(seed_pixel_bits(rgb.transpose(2, 0, 1).copy()).sum())
    assert r["best_ctx"] == pytest.approx(np.minimum(m, c).mean()) and r["model_wins_ctx"] == np.mean(m < c)
    # the t = eps term per tile, in bits/dim: the bound less the bound without it, on the same draws
    e = np.array(r["per_tile"]["eps"])
    tiles = image_tiles(rgb, 16)
    model = zoo.load_model("cifar10")
    gen = torch.Generator().manual_seed(0)
    without = torch.cat([likelihood.bound_bpd(model.model, torch.from_numpy(tiles[i:i + 16]), model.dequantizer, n_t=2,
                                              generator=gen, correction=False) for i in range(0, len(tiles), 16)])
    assert m - e == pytest.approx(without.double().numpy(), abs=1e-5)  # float32 terms
    assert r["eps"] == pytest.approx(e.mean()) and r["flagged"] == int(np.sum(e > EPS_FLAG))
    gap = m - c  # the flagged tiles' share of the model's gap to seed ctx; none where there is no gap
    assert r["flag_gap"] == (pytest.approx(gap[e > EPS_FLAG].sum() / gap.sum()) if gap.sum() > 0 else None)
    assert "a.png" in capsys.readouterr().out
    assert _share(None) == "-" and _share(0.954) == "95%"
    # --mse: the denoising error of the flagged tiles (none flagged: of all) beside the model's table; this
    # noisy synthetic image has most of its tiles flagged by cifar10
    assert tile_gap([str(tmp_path / "a.png"), "--model", "cifar10", "--tile", "16", "--n-t", "2", "--mse", "3",
                     "--json", str(out)]) == 0
    r = json.loads(out.read_text())["images"]["a.png"]
    mse = r["mse"]
    assert mse["tiles"] == ("flagged" if r["flagged"] else "all") and len(mse["log_snr"]) == 3
    assert np.all(np.diff(mse["log_snr"]) > 0) and np.all(np.array(mse["mse"]) >= 0)
    assert mse["mse"][0] < 0.05 < mse["mse"][-1]  # at low log-SNR the noise is all there is to see
    assert len(mse["model_table"]) == 3 and "denoising error of its " in capsys.readouterr().out
    assert tile_gap([str(tmp_path / "g.png"), "--model", "cifar10"]) == 2
    assert "not a plain RGB image" in capsys.readouterr().err


def test_screen_first(tmp_path, capsys, monkeypatch):
    """bench/screen_first.py: the screen's 16 tiles' decision and its first stage's. Stand-in looks: the
    model 1 bit/dim ahead of the seed codec's shares on the 4 tiles where those are least, as far
    behind on the other 12: the 16 pass, the first stage (the 4 where the shares are most) rules the
    model out, and the image is named on the last line."""
    from bench.screen_first import main as screen_first
    from scoreflow_codec import api

    dims = 3 * 16 * 16

    def tmb(sources, model, tile, device="cpu", excess_bpd=0.0, seed_bits=None, only=None, look=None, chain=None):
        assert look == api.SCREEN_N_T and tile == 16 and len(seed_bits) == 16
        ahead = set(np.argsort(seed_bits)[:4].tolist())
        out = np.full(len(seed_bits), np.nan)
        out[only] = [seed_bits[i] + (-1.0 if i in ahead else 1.0) * dims for i in only]
        return out
    monkeypatch.setattr(api, "tile_model_bits", tmb)
    Image.fromarray(_image(3, 64, 64)).save(tmp_path / "a.png")
    Image.fromarray(_image(3, 48, 48)).save(tmp_path / "small.png")  # 9 tiles: no screen
    out = tmp_path / "first.json"
    assert screen_first([str(tmp_path / "a.png"), str(tmp_path / "small.png"), "--model", "cifar10", "--tile", "16",
                         "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    a = r["images"]["a.png"]
    assert a["tiles"] == 16 and a["screen_passes"] and a["first_rules_out"] and "small.png" not in r["images"]
    assert a["first_ratio"] < 1 and a["first_ratio_16s_look"] == pytest.approx(a["first_ratio"])
    assert sorted(np.round(a["model_minus_seed_bpd"], 9)) == [-1.0] * 4 + [1.0] * 12 and a["best_tile_rank"] > 12
    assert r["lost"] == ["a.png"] and r["margin"] == pytest.approx(a["first_ratio"])
    text = capsys.readouterr().out
    assert "small.png        fewer than 16 tiles: no screen" in text and "of those the 16 pass: a.png" in text


def test_screen_spread(tmp_path, capsys, monkeypatch):
    """bench/screen_spread.py: every tile's quick look (api.SCREEN_N_T time samples) against the full
    estimate, in bits/dim; the full decision and the screen's. Stand-in looks 0.1 bits/dim above the
    full estimate on every tile: the spread it reports is theirs."""
    from bench.screen_spread import main as screen_spread
    from scoreflow_codec import api

    real, full, chains = api.tile_model_bits, [], []

    def tmb(sources, model, tile, device="cpu", excess_bpd=0.0, seed_bits=None, only=None, look=None, chain=None):
        if look:  # (the script estimates in full first)
            return full[-1] + 0.1 * 3 * tile * tile
        chains.append(chain)
        full.append(real(sources, model, tile, device, excess_bpd, seed_bits, only, chain=chain))
        return full[-1]
    monkeypatch.setattr(api, "tile_model_bits", tmb)
    Image.fromarray(_image(3, 64, 64)).save(tmp_path / "a.png")
    Image.fromarray(_image(3, 64, 64)[..., 0]).save(tmp_path / "g.png")
    out = tmp_path / "spread.json"
    assert screen_spread([str(tmp_path / "a.png"), "--model", "cifar10", "--tile", "16", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    a = r["images"]["a.png"]
    assert a["tiles"] == 16 and np.allclose(a["look_minus_full"], 0.1) and a["sd"] == pytest.approx(0, abs=1e-9)
    assert a["full_codes_model"] == (a["full_saving_bits"] >= a["needed_bits"]) and a["excess_bpd"] > 0
    assert r["all"]["tiles"] == 16 and r["all"]["mean"] == pytest.approx(0.1) and r["sd_bpd"] == api.SCREEN_SD_BPD
    assert "all 16 tiles: the look minus the full estimate, mean +0.1000" in capsys.readouterr().out
    assert len(chains) == 1 and chains[0].steps > 1  # the full estimate as compress's in chain mode (0.9.61)
    assert screen_spread([str(tmp_path / "g.png"), "--model", "cifar10"]) == 2
    assert "not a plain RGB image" in capsys.readouterr().err


def test_large_image_bench_follows_the_cli_defaults(tmp_path, capsys):
    """bench/large_image.py: an image through compress and decompress as `sfcodec compress` codes it
    (--model auto: the photo model above 64x64; --fallback auto), one JSON line with which coder made
    the file, its size against both coders' and the peak memory; --fallback off writes the model's
    stream (no seed codec file). (Its default is a 4000x3000 image; here 72x64 from a synthetic one, two
    of the photo model's tiles: 80x72's four made the test a minute.)"""
    from bench.large_image import main as large_image

    Image.fromarray(_image(3, 64, 72)).save(tmp_path / "a.png")
    assert large_image(["--image", str(tmp_path / "a.png"), "--size", "72x64", "--threads", "1", "--no-progress"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (r["model"], r["fallback"], r["identical"], r["width"], r["height"]) == ("photo", "auto", True, 72, 64)
    assert r["file_bytes"] == min(b for b in (r["seed_bytes"], r["model_bytes"]) if b is not None)
    assert r["coded_by"] in ("seed", "model") and r["peak_rss_mib"] >= r["peak_rss_mib_encode"] > 0
    # why, where not coded
    assert (r["model_bytes"] is None) == (r["model_skipped"] in ("saving", "sample", "screen", "small"))
    assert large_image(["--image", str(tmp_path / "a.png"), "--size", "72x64", "--threads", "1", "--no-progress",
                        "--model", "cifar10", "--fallback", "off", "--steps", "4"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (r["model"], r["seed_bytes"], r["model_bytes"], r["identical"]) == ("cifar10", None, r["file_bytes"], True)


def test_deep16_bench(tmp_path, capsys):
    """bench/deep16.py on a folder of 16-bit PNGs: each decoded identical, its size beside 16-bit PNG
    and JPEG-XL, the Markdown table and JSON written; an 8-bit PNG in the folder is skipped with a
    line; large_image.py --bits 16 codes a 16-bit image too."""
    pytest.importorskip("imagecodecs", reason="bench/deep16.py compares with imagecodecs' PNG and JPEG-XL")
    from bench.deep16 import main as deep16
    from bench.large_image import main as large_image
    from scoreflow_codec import images

    folder = tmp_path / "in"
    folder.mkdir()
    yy, xx = np.mgrid[0:24, 0:40]
    arr = np.stack([20000 + 300 * xx + 200 * yy * k for k in (1, 2, 3)], -1) + np.random.default_rng(0).integers(0, 400, (24, 40, 3))
    (folder / "a.png").write_bytes(images.encode_source(images.from_array(arr.astype(np.uint16)), ".png"))
    Image.fromarray(_image(3, 8, 8)).save(folder / "b.png")
    assert deep16(["--folder", str(folder), "--fallback", "seed", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr()
    r = json.loads((tmp_path / "out" / "deep16.json").read_text())
    assert [row["image"] for row in r["rows"]] == ["a.png"] and "b.png is not a 16-bit image" in out.err
    row = r["rows"][0]
    assert row["identical"] and row["deep"] == {"shift": 0, "table": 0, "low": 8}
    assert 0 < row["sfc_low_bpd"] < row["sfc_bpd"] and row["png_bpd"] > 0 and row["jxl_bpd"] > 0
    assert "| a.png | 40x24 |" in (tmp_path / "out" / "deep16.md").read_text()
    (folder / "b.png").unlink()  # --fallback auto: the model sfcodec picks (cifar10 for a 40x24 image)
    assert deep16(["--folder", str(folder), "--out", str(tmp_path / "out2"), "--limit", "1"]) == 0
    capsys.readouterr()
    assert json.loads((tmp_path / "out2" / "deep16.json").read_text())["rows"][0]["identical"]
    Image.fromarray(_image(3, 72, 80)).save(tmp_path / "c.png")
    assert large_image(["--image", str(tmp_path / "c.png"), "--size", "80x72", "--threads", "1", "--no-progress",
                        "--bits", "16", "--fallback", "seed"]) == 0
    j = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert j["identical"] and j["bits"] == 16 and 0 < j["low_bytes"] < j["file_bytes"]


def test_exact_forward(tmp_path, capsys):
    """bench/exact_forward.py: every 3x3 convolution of the model's exact forward timed both ways
    (the two results checked identical inside), the forward's parts adding up to its time, and
    a clear error for a model that does not exist."""
    from bench.exact_forward import main as exact_forward

    out = tmp_path / "ef.json"
    assert exact_forward(["--model", "cifar10", "--tile", "16", "--batches", "1,2", "--conv-batch", "2",
                          "--repeat", "1", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    convs = r["convolutions"]
    assert convs and all(c["input"][0] == 2 and c["f_conv2d_ms"] > 0 and c["int_conv2d_ms"] > 0 for c in convs)
    assert sum(c["calls"] for c in convs) > 10 and any(c["weight"][2] == 3 for c in convs)
    for key in ("forward_default", "forward_keep"):
        rows = r[key]
        assert [row["batch"] for row in rows] == [1, 2]
        for row in rows:
            parts = row["parts_s"]
            assert set(parts) == {"convolutions", "silu", "groupnorm", "rest"}
            assert min(parts["convolutions"], parts["silu"], parts["groupnorm"]) > 0
            assert sum(parts.values()) == pytest.approx(row["seconds"])
    oh = r["call_overhead"]
    assert oh["tile"] == 4 and oh["seconds"] > 0 and oh["torch_calls"] > 100
    out_text = capsys.readouterr().out
    assert "| all of one forward |" in out_text and "cost of a call: one 4x4 tile" in out_text
    assert exact_forward(["--model", "no-such-model"]) == 2
    assert "exact_forward:" in capsys.readouterr().err


def test_chain_steps(tmp_path, capsys):
    """bench/chain_steps.py: the predicted excess of the model's chain falls with the steps (with
    the calibrated schedule, compress's, about as 1/steps; the optimized one lies below it at every
    count); measured on an image's tiles, the chain's bound and the continuous bound are reported
    side by side; a model or an image that does not exist is a clear error."""
    from PIL import Image

    from bench.chain_steps import main as chain_steps

    rng = np.random.default_rng(0)
    Image.fromarray((rng.integers(0, 60, (40, 40, 3)) + np.arange(40)[:, None, None] * 4).astype(np.uint8)).save(
        tmp_path / "a.png")
    out = tmp_path / "cs.json"
    assert chain_steps(["--model", "cifar10", "--images", str(tmp_path / "a.png"), "--crop", "32", "--steps", "8",
                        "--draws", "1", "--n-t", "4", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    pred = {int(k): v for k, v in r["predicted_excess_bpd"].items()}
    assert sorted(pred) == [8, 32, 64, 96, 128, 256, 512] and r["default_steps"] == 256
    assert r["schedule"] == "calibrated"
    vals = [pred[k] for k in sorted(pred)]
    assert all(a > b > 0 for a, b in zip(vals, vals[1:]))
    assert 1.6 < pred[256] / pred[512] < 2.4  # the excess is second order in each step: ~1/steps
    assert chain_steps(["--model", "cifar10", "--schedule", "optimized", "--json", str(tmp_path / "opt.json")]) == 0
    opt = {int(k): v for k, v in json.loads((tmp_path / "opt.json").read_text())["predicted_excess_bpd"].items()}
    assert all(opt[k] < pred[k] for k in (32, 64, 96, 128, 256, 512))  # by the table's own measure
    assert all(a > b for a, b in zip([opt[k] for k in sorted(opt)], [opt[k] for k in sorted(opt)][1:]))
    mes = r["measured"]
    assert mes["steps"] == 8 and mes["tiles"] == 1 and 0 < mes["bound_bpd"] < 16 and 0 < mes["chain_bpd"] < 16
    assert mes["excess_bpd"] == pytest.approx(mes["chain_bpd"] - mes["bound_bpd"])
    assert "| excess |" in capsys.readouterr().out
    assert chain_steps(["--model", "no-such-model"]) == 2
    assert "chain_steps:" in capsys.readouterr().err
    assert chain_steps(["--model", "cifar10", "--images", str(tmp_path / "missing.png")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_chain_steps_without_a_table(monkeypatch, capsys):
    """A model file without a denoising-error table gets no prediction (the m = 0 formula would
    say that the steps cost nothing), and says so."""
    from bench import chain_steps
    from scoreflow_codec import api

    monkeypatch.setattr(api, "_eps_mse", lambda model: None)
    assert chain_steps.main(["--model", "cifar10"]) == 0
    out = capsys.readouterr().out
    assert "has no denoising-error table: no prediction" in out and "| excess |" not in out


def test_mixed_grey_reports_the_file(monkeypatch, tmp_path, capsys):
    """bench/mixed_grey.py: a set of colour and grey images coded as one stream with a fallback and
    decoded: one JSON line with the file's size (the smaller of the two that "both" codes), its coder and
    the times; without the shared data, exit 2 and a line saying so. A small stand-in set here (a 40x40
    colour image of 4 tiles and a 32x32 grey one), the shipped cifar10 model."""
    from bench import mixed_grey

    rng = np.random.default_rng(1)
    colour = rng.integers(0, 256, (40, 40, 3)).astype(np.uint8)
    monkeypatch.setattr(mixed_grey, "the_set", lambda case: ([colour, colour[:32, :32, 0]], "cifar10"))
    monkeypatch.setattr(mixed_grey, "DATA", tmp_path)
    assert mixed_grey.main(["cifar", "--fallback", "both"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["identical"] and out["bytes"] == min(out["model_bytes"], out["seed_bytes"])
    assert out["case"] == "cifar" and out["fallback"] == "both" and out["skipped"] is None
    monkeypatch.setattr(mixed_grey, "DATA", tmp_path / "absent")
    assert mixed_grey.main(["kodak"]) == 2 and "shared data not found" in capsys.readouterr().err
    from scoreflow_codec.errors import DecodeMismatchError

    _decode_flips_a_pixel(monkeypatch)  # a decode that differs is never reported as a file
    monkeypatch.setattr(mixed_grey, "DATA", tmp_path)
    with pytest.raises(DecodeMismatchError):
        mixed_grey.main(["cifar", "--fallback", "both"])


def _decode_flips_a_pixel(monkeypatch) -> None:
    """api.decompress as it is, but the first image's first colour value off by one."""
    from scoreflow_codec import api

    real = api.decompress

    def flipped(data, *a, **k):
        back = real(data, *a, **k)
        back[0].color[0, 0, 0] ^= 1
        return back
    monkeypatch.setattr(api, "decompress", flipped)


def test_own_stream_codes_the_models_own_tiles(tmp_path, capsys, monkeypatch):
    """bench/own_stream.py: each image its own stream with seed tiles "first" (only as many as the chain
    needs), decoded identical: a 128x128 noisy image of sixteen 32px tiles through a model at 4 steps has
    model tiles; a decode that differs raises and prints no line. The model is the trainer's tiny preset,
    untrained (the same code paths as the shipped cifar10's, which took a minute of the suite here)."""
    from bench import own_stream

    rng = np.random.default_rng(2)
    Image.fromarray(rng.integers(0, 256, (128, 128, 3)).astype(np.uint8)).save(tmp_path / "s.png")
    model = str(tiny_model_file(tmp_path / "tiny.safetensors", 0))
    assert own_stream.main([str(tmp_path / "s.png"), "--model", model, "--steps", "4", "--threads", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["identical"] and out["model"] == "tiny-0" and out["threads"] == 1
    assert out["seed_tiles"][1] == 16 and out["seed_tiles"][0] < 16
    assert out["bpd"] == pytest.approx(8 * out["bytes"] / (128 * 128 * 3))
    # --seed-tiles fixes the first N; the model's and the seed tiles' own rates make up the file, less
    # its header and the stream's few signal bits (uniform noise: the seed codec about 8 bits/dim, an
    # untrained model's 4-step chain far more: 95)
    assert own_stream.main([str(tmp_path / "s.png"), "--model", model, "--steps", "4", "--threads", "1",
                            "--seed-tiles", "5", "--arith", "float32"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["seed_tiles"] == [5, 16] and out["arith"] == "float32" and out["identical"]
    tile_dims = 32 * 32 * 3
    parts = out["model_bpd"] * 11 * tile_dims + out["seed_bpd"] * 5 * tile_dims
    assert 0 < 8 * out["bytes"] - parts < 0.01 * 8 * out["bytes"]
    assert 7.5 < out["seed_bpd"] < 9 < out["model_bpd"]
    from scoreflow_codec.errors import DecodeMismatchError

    _decode_flips_a_pixel(monkeypatch)  # a decode that differs is never reported as a file
    with pytest.raises(DecodeMismatchError):
        own_stream.main([str(tmp_path / "s.png"), "--model", model, "--steps", "4", "--threads", "1"])
    assert capsys.readouterr().out == ""


def test_bench_scripts_say_what_is_wrong_with_their_input_in_one_line(tmp_path, capsys):
    """own_stream.py and large_image.py given a missing or unreadable image, an unknown model or a bad
    --size: one line naming it and a non-zero exit, not a traceback."""
    from bench import large_image, own_stream

    (tmp_path / "empty.png").write_bytes(b"")
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "ok.png")
    for argv, words in (([str(tmp_path / "missing.png")], "missing.png: no such file"),
                        ([str(tmp_path / "empty.png")], "empty.png: not an image"),
                        ([str(tmp_path / "ok.png"), "--model", "nope"], "unknown model 'nope'")):
        assert own_stream.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("own_stream: ") and words in err[0], err
    for argv, words in ((["--image", str(tmp_path / "missing.png")], "missing.png: not an image"),
                        (["--image", str(tmp_path / "empty.png")], "empty.png: not an image"),
                        (["--image", str(tmp_path / "ok.png"), "--size", "8x8", "--model", "nope"], "unknown model 'nope'"),
                        (["--size", "abc"], "--size 'abc': expected WxH")):
        with pytest.raises(SystemExit) as e:
            large_image.main(argv + ["--no-progress", "--threads", "1"])
        msg = str(e.value.code) if isinstance(e.value.code, str) else capsys.readouterr().err
        assert e.value.code != 0 and words in msg, msg


def test_device_figures_prepare_run_and_show(tmp_path, monkeypatch, capsys):
    """bench/device_figures.py on the CPU, as a lent GPU would run it: prep writes the data, the plan
    and run.sh (a zoo model by name, another as a file copied in, a wheel carried); run takes the
    steps in order and packs what each wrote into figures.tar; show pairs the models image by image.
    A step without time left is skipped, and what ran before it comes back."""
    from bench import device_figures as df

    npz = tmp_path / "test.npz"
    rng = np.random.default_rng(0)
    np.savez(npz, images=rng.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8))
    wheel = tmp_path / "constriction-0.0-cp312-none-any.whl"
    wheel.write_bytes(b"stand-in")
    folder = tmp_path / "dev"
    model_file = REPO / "scoreflow_codec" / "zoo" / "cifar10.safetensors"
    from scoreflow_codec import zoo  # the oldest kept cifar10 (each ship retires one: no fixed name)
    kept = min((m for m in zoo.list_models() if re.fullmatch(r"cifar10-\d+", m["name"])),
               key=lambda m: int(m["name"].split("-")[1]))
    old = kept["name"]
    prep = ["prep", "--model", old, "--model", str(model_file), "--cifar", str(npz), "--parts", "2",
            "--n-t", "2", "--no-ode", "--stream-images", "1", "--kodak", "0", "--device", "cpu", "--threads", "1",
            "--setting", "steps=4", "--wheel", str(wheel), "--folder", str(folder), "--budget", "500"]
    assert df.main(prep) == 0
    assert "5 steps in 500 s" in capsys.readouterr().out
    plan = json.loads((folder / "plan.json").read_text())
    assert [s["name"] for s in plan["steps"]] == [f"eval-{old}-0", "eval-cifar10-0", f"eval-{old}-1",
                                                  "eval-cifar10-1", "cifar"]
    ev = plan["steps"][0]["cmd"]  # a part's images in one batch (sfcodec eval --batch)
    assert ev[ev.index("--batch") + 1] == "300"
    assert (folder / "models" / "cifar10.safetensors").read_bytes() == model_file.read_bytes()
    assert (folder / "wheels" / wheel.name).exists() and "pip install" in (folder / "run.sh").read_text()
    assert [len(np.load(folder / f"test-{k}.npz")["images"]) for k in (0, 1)] == [2, 1]

    monkeypatch.chdir(REPO)
    out = tmp_path / "out"
    assert df.main(["run", str(folder / "plan.json"), "--out", str(out)]) == 0
    assert [p.name for p in out.iterdir()] == ["figures.tar"]  # one file of the device's 8
    text = df.show(str(out))
    lines = text.splitlines()
    assert lines[0].startswith(f"{old} ({kept['sha256'][:8]}), 3 images (parts [0, 1]): bound_bpd ")
    sha = hashlib.sha256(model_file.read_bytes()).hexdigest()  # the zoo's cifar10 (a file: named by its stem)
    assert lines[1].startswith(f"cifar10 ({sha[:8]}), 3 images (parts [0, 1]): bound_bpd ")
    with tarfile.open(out / "figures.tar") as tar:
        rows = {m: [r for k in (0, 1) for r in json.loads(tar.extractfile(f"figures/eval-{m}-{k}.json").read())["rows"]]
                for m in (old, "cifar10")}
    diff = [a["bound_bpd"] - b["bound_bpd"] for a, b in zip(rows["cifar10"], rows[old])]
    assert lines[2].startswith(f"  bound_bpd - {old}'s: {np.mean(diff):+.4f} +- "
                               f"{np.std(diff, ddof=1) / np.sqrt(3):.4f} (lower on {sum(d < 0 for d in diff)} of 3)")
    # the first step had the whole budget but what the later four reserve (3 x 20 s, 60 s)
    assert re.search(rf"eval-{old}-0: .* \(at most 3[78]\d s\)", text)
    assert "cifar: model=" in text and "1 images" in text and "lossless True" in text
    assert "all steps in" in text and "0 failed" in text

    # a step that runs out of time is stopped, and what the steps before it wrote comes back; a step
    # without the 5 s that a start takes is skipped; show pairs the models on the parts all of them have
    def stand_in(name, bpd):
        out = json.dumps({"sha256": name[0] * 2, "rows": [{"bound_bpd": bpd}]})
        return {"name": f"eval-{name}", "kind": "eval", "reserve": 0, "stdout": f"eval-{name}.json",
                "cmd": ["python3", "-c", f"print({out!r})"]}
    out2 = tmp_path / "out2"
    # it finds the earlier steps' results packed already (a kill of the whole run would leave them)
    slow = {"name": "cifar", "kind": "cifar", "reserve": 0,
            "cmd": ["python3", "-c", "import sys, tarfile, time; tarfile.open(sys.argv[1]).getmember("
                                     "'figures/eval-a-1.json'); time.sleep(60)", str(out2 / "figures.tar")]}
    late = {"name": "kodak", "kind": "kodak", "reserve": 3, "cmd": ["python3", "-c", "print(1)"]}
    steps = [stand_in("a-0", 3.5), stand_in("b-0", 3.25), stand_in("a-1", 9.0), slow, late]
    (tmp_path / "plan2.json").write_text(json.dumps({"budget_s": 10.0, "device": "cpu", "models": ["a", "b"],
                                                     "steps": steps}))
    assert df.main(["run", str(tmp_path / "plan2.json"), "--out", str(out2)]) == 1
    text = df.show(str(out2))
    assert text.startswith("a (aa), 1 images (parts [0]): bound_bpd 3.5000 +- nan\n"
                           "b (bb), 1 images (parts [0]): bound_bpd 3.2500 +- nan\n"
                           "  bound_bpd - a's: -0.2500 +- nan (lower on 1 of 1)\n")
    assert "eval-a-1: done in" in text and "cifar: failed (timed out)" in text
    assert "kodak: skipped" in text and "2 failed" in text

    # a step whose program the device lacks fails alone: the steps after it run, the figures come back,
    # and the temporary folder the steps wrote in is gone
    monkeypatch.setattr(df.tempfile, "mkdtemp", lambda prefix: str(tmp_path / "work3"))
    (tmp_path / "work3").mkdir()
    missing = {"name": "gone", "kind": "eval", "reserve": 0, "cmd": ["sfc-no-such-program"]}
    (tmp_path / "plan3.json").write_text(json.dumps({"budget_s": 60.0, "device": "cpu", "models": ["a"],
                                                     "steps": [missing, stand_in("a-0", 3.5)]}))
    out3 = tmp_path / "out3"
    assert df.main(["run", str(tmp_path / "plan3.json"), "--out", str(out3)]) == 1
    text = df.show(str(out3))
    assert "gone: failed (could not start: " in text and "eval-a-0: done in" in text and "1 failed" in text
    assert not (tmp_path / "work3").exists()

    assert df.main(["prep", "--model", "nope", "--folder", str(folder), "--wheel", "none", "--cifar", str(npz)]) == 2
    assert "--model nope: neither a model of the zoo nor a file" in capsys.readouterr().err
    assert (folder / "plan.json").exists()  # refused before anything was written
    assert df.main(["show", str(tmp_path / "nothing")]) == 2
    assert "no figures.tar" in capsys.readouterr().err


def test_ode_sample_runs_parts_resumes_and_estimates(tmp_path, capsys):
    """bench/ode_sample.py: the sample's images in parts, evaluated by `sfcodec eval` (the ODE NLL and
    each image's own bound), a second run does nothing new, another sample in the same folder is refused;
    `show` gives the regression estimate that estimate.weighted_mean computes from the rows and every
    image's bound, and the bound of all plus the sample's mean difference (below its own bound, and
    below the --bound value)."""
    from bench.ode_sample import main as ode_sample
    from scoreflow_codec.estimate import weighted_mean

    data = np.stack([_image(3, 16, 16)[..., ::-1] if k % 2 else np.roll(_image(3, 16, 16), k, 1) for k in range(5)])
    np.savez(tmp_path / "five.npz", images=data)
    work = tmp_path / "s"
    # the tiny preset, untrained: the same code paths (the shipped cifar10's stiff ODE: 85 s for the test)
    model = str(tiny_model_file(tmp_path / "tiny.safetensors", 0))
    common = ["--model", model, "--data", str(tmp_path / "five.npz"), "--n", "3", "--part", "2", "--seed", "3",
              "--rtol", "1e-2", "--atol", "1e-2", "--n-t", "4"]
    assert ode_sample(["run", str(work), *common, "--workers", "2"]) == 0
    man = json.loads((work / "manifest.json").read_text())
    order = np.random.default_rng(3).permutation(5)[:3]
    assert [p["indices"] for p in man["parts"]] == [order[:2].tolist(), order[2:].tolist()]
    assert [p["seed"] for p in man["parts"]] == [1000, 1001] and "--seed" not in man["eval_args"]  # draws of its own
    for p in man["parts"]:  # each part holds its images, and eval's rows for them
        np.testing.assert_array_equal(np.load(work / f"{p['name']}.npz")["images"], data[p["indices"]])
        assert len(json.loads((work / f"{p['name']}.json").read_text())["rows"]) == len(p["indices"])
    assert not list(work.glob("*.lock")) and "2 of 2 parts done" in capsys.readouterr().out
    stamp = [(work / f"{p['name']}.json").stat().st_mtime_ns for p in man["parts"]]
    assert ode_sample(["run", str(work), *common]) == 0  # resumed: nothing left to do
    assert [(work / f"{p['name']}.json").stat().st_mtime_ns for p in man["parts"]] == stamp
    assert ode_sample(["run", str(work), *common, "--n", "4"]) == 2  # another sample: refused
    assert "holds another sample" in capsys.readouterr().err
    assert ode_sample(["run", str(work), *common, "--draw-seed", "2000"]) == 2  # other draws: another sample too
    err = capsys.readouterr().err
    assert "holds another sample" in err and "--draw-seed 1000)" in err  # the message names the draws it has
    # a second sample to be pooled with the first takes draws of its own (STOP: only its manifest is written)
    second = tmp_path / "second"
    second.mkdir()
    (second / "STOP").write_text("")
    assert ode_sample(["run", str(second), *common, "--draw-seed", "2000"]) == 0
    assert [p["seed"] for p in json.loads((second / "manifest.json").read_text())["parts"]] == [2000, 2001]
    assert ode_sample(["run", str(second), *common, "--draw-seed", "-1"]) == 2
    assert "--draw-seed must be 0 or more" in capsys.readouterr().err
    # every image's bound, as eval writes it, in two files
    bound = tmp_path / "b.json"
    bound.write_text(json.dumps({"rows": [{"bound_bpd": 10.0 + k + 0.1 * k * k} for k in range(5)]}))
    assert ode_sample(["show", str(work), "--bound", str(bound), "--json", str(tmp_path / "s.json")]) == 0
    s = json.loads((tmp_path / "s.json").read_text())
    rows = [r for p in man["parts"] for r in json.loads((work / f"{p['name']}.json").read_text())["rows"]]
    ode = np.array([r["ode_nll_bpd"] for r in rows])
    b = 10.0 + order + 0.1 * order ** 2
    assert s["images"] == 3 and s["total"] == 5 and s["ode_nll"]["mean"] == pytest.approx(ode.mean())
    assert s["gap"]["mean"] == pytest.approx(np.mean([r["ode_nll_bpd"] - r["bound_bpd"] for r in rows]))
    m, se = weighted_mean(ode, np.ones(3), covariate=b, covariate_mean=12.6)
    assert (s["estimate"]["mean"], s["estimate"]["se"]) == pytest.approx((m, se))
    own = np.array([r["bound_bpd"] for r in rows])
    assert s["by_gap"]["mean"] == pytest.approx(12.6 + np.mean(ode - own))  # 12.6: the five bounds' mean
    assert s["by_gap"]["se"] == pytest.approx(np.hypot(np.std(ode - own, ddof=1) / np.sqrt(3),
                                                       np.std(b - own, ddof=1) / np.sqrt(5)))
    # and with the --bound files' own values on the sample (b): no assumption that the two bounds share a mean
    assert (s["by_gap_same"]["mean"], s["by_gap_same"]["se"]) == pytest.approx(
        (12.6 + np.mean(ode - b), np.std(ode - b, ddof=1) / np.sqrt(3)))
    assert s["by_gap_same"]["mean"] != pytest.approx(s["by_gap"]["mean"])
    assert "regression on the bound" in capsys.readouterr().out
    assert s["draw_sets"] == 3 and "sets of random numbers" not in capsys.readouterr().out
    # a sample begun before 0.9.57 (every part --seed 0): the images at the same place in their parts share
    # their draws, so the standard errors are over those sets (2 here); run refuses to add to it
    legacy = tmp_path / "legacy"
    shutil.copytree(work, legacy)
    man_old = {**man, "eval_args": ["--seed", "0", *man["eval_args"]],
               "parts": [{k: v for k, v in p.items() if k != "seed"} for p in man["parts"]]}
    (legacy / "manifest.json").write_text(json.dumps(man_old))
    assert ode_sample(["show", str(legacy), "--bound", str(bound), "--json", str(tmp_path / "l.json")]) == 0
    lg = json.loads((tmp_path / "l.json").read_text())
    assert lg["draw_sets"] == 2 and "only 2 sets of random numbers" in capsys.readouterr().out
    places = np.array([0, 1, 0])
    assert lg["gap"]["se"] == pytest.approx(weighted_mean(ode - own, np.ones(3), groups=places)[1])
    assert lg["estimate"]["se"] == pytest.approx(weighted_mean(ode, np.ones(3), b, 12.6, groups=places)[1])
    assert ode_sample(["run", str(legacy), *common]) == 2 and "begun before 0.9.57" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": [{"bound_bpd": 1.0}]}))
    assert ode_sample(["show", str(work), "--bound", str(bad)]) == 2
    assert capsys.readouterr().err.strip() == "ode_sample: --bound: 1 images in all, the data set has 5"
    bad.write_text(json.dumps({"sha256": "f" * 64, "rows": [{"bound_bpd": 1.0}] * 5}))
    assert ode_sample(["show", str(work), "--bound", str(bad)]) == 2
    assert "another model's (sha256 ffffffffffff" in capsys.readouterr().err
    # a killed run's lock is taken over; STOP stops before any part starts
    other = tmp_path / "t"
    (other / "part000.lock").mkdir(parents=True)
    (other / "part000.lock" / "pid").write_text("999999999")
    (other / "STOP").write_text("")
    assert ode_sample(["run", str(other), *common]) == 0 and not list(other.glob("part*.json"))
    (other / "STOP").unlink()
    assert ode_sample(["run", str(other), *common, "--part", "3"]) == 2  # its manifest says parts of 2
    assert ode_sample(["run", str(other), *common]) == 0 and len(list(other.glob("part*.json"))) == 2
    # a part whose eval fails: its line says why, no .json for it, the run's exit status 1
    assert ode_sample(["run", str(tmp_path / "u"), *common, "--model", "nope", "--workers", "1"]) == 1
    out = capsys.readouterr().out
    assert "part000: failed: " in out and "nope" in out and not list((tmp_path / "u").glob("part*.json"))
