"""End-to-end tests of the `sfcodec` CLI (cli/main.py) with tiny models.

Round trips (compress -> decompress -> identical pixels, mode included) for every image mode
the README promises, in both coding modes; multi-image files; info / verify / models; and bad
inputs, each of which must give one line on stderr, the documented exit code, no traceback,
and no output file (a pre-existing output left untouched).

Speed: the models are the "tiny" preset as built (what the trainer would export before any
training: the U-Net's output layer is zero, so it predicts eps = 0 -- files are large, round trips
exact all the same), with few steps. An image set of up to 4 (ODE) / 5 (chain) 32x32 tiles is
coded entirely by the seed codec, so most round trips below exercise the CLI, the image modes and
the container; test_round_trip_through_the_model puts tiles after a filler image so that the
score model codes them in both modes, and test_shipped_model does so with the shipped model.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import struct
import subprocess
import sys
import warnings
import zlib
from dataclasses import replace
from pathlib import Path

import click
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from cli.main import cli
from coding_models import tiny_model_file
from deep_files import png16_by_hand, tiff16_by_hand, with_chunk
from scoreflow_codec import api, images

REPO = Path(__file__).resolve().parents[1]
# Few steps for speed: files are large, but lossless at any step count.
STEPS = {"ode": "4", "chain": "8"}
EXIT = {"usage": 2, "image": 3, "sfc": 4, "model": 5, "exists": 6, "mismatch": 7}


# --- helpers ----------------------------------------------------------------------------------
@contextlib.contextmanager
def first_seed_tiles():
    """compress with the first tiles as the stream's seed tiles, as before 0.9.14: with seed tiles
    "chosen" (the default) the untrained tiny models leave every tile to the seed codec, which
    makes a file that names no model; the tests that need tiles the model coded use this."""
    orig = api.default_stream_settings
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(api, "default_stream_settings", lambda *a, **k: replace(orig(*a, **k), seed_tiles="first", seed_context="tile"))
        yield


def sfcodec(*args):
    """Run the CLI in-process; returns click's Result (exit_code, stdout, stderr)."""
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="sfcodec", catch_exceptions=False)


def assert_ok(result):
    assert result.exit_code == 0, f"exit {result.exit_code}: {result.stderr}"
    assert "Traceback" not in result.output


def assert_error(result, code: int, *words: str):
    """The documented exit code, exactly one non-empty line on stderr naming the problem.

    Lines as a terminal shows them: a progress bar redrawn with \r and cleared before the error
    (tqdm, leave=False) leaves nothing visible."""
    err = result.stderr
    assert result.exit_code == code, f"exit {result.exit_code}, expected {code}: {err!r}"
    assert "Traceback" not in result.output
    lines = [ln.split("\r")[-1] for ln in err.split("\n")]
    lines = [ln for ln in lines if ln.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {err!r}"
    assert lines[0].startswith("sfcodec: error: "), lines[0]
    for w in words:
        assert w.lower() in lines[0].lower(), f"{w!r} not in {lines[0]!r}"
    assert result.stdout == ""


def listing(d: Path) -> dict[str, bytes]:
    """Every file in a directory (temporary files included) with its content."""
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def pixels(path: Path) -> tuple:
    """What lossless means here: Pillow's mode, size, pixels (and palette, transparency)."""
    with Image.open(path) as im:
        im.load()
        pal = im.getpalette() if im.mode in ("P", "PA") else None
        return im.mode, im.size, np.asarray(im).copy(), pal, im.info.get("transparency")


def assert_same_pixels(a: Path, b: Path):
    (ma, sa, xa, pa, ta), (mb, sb, xb, pb, tb) = pixels(a), pixels(b)
    assert (ma, sa) == (mb, sb)
    assert xa.dtype == xb.dtype and np.array_equal(xa, xb)
    if ma in ("P", "PA"):
        assert pa == pb and ta == tb


def _tiff48(path: Path) -> Path:
    """An uncompressed 48-bit RGB TIFF (little-endian, one strip), written by the TIFF 6.0 layout."""
    path.write_bytes(tiff16_by_hand(_rng(3).integers(0, 65536, (4, 5, 3), dtype=np.uint16)))
    return path


# --- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("models")
    # untrained, as built: randomising its zero-initialised output layers (tests/test_modelfile.py)
    # gives a model the codec cannot code with at all ("encoding failed (gaussian: values must
    # satisfy |x| < 2**62)" at any step count)
    return {"A": tiny_model_file(d / "tiny_a.safetensors", 0), "B": tiny_model_file(d / "tiny_b.safetensors", 1)}


@pytest.fixture(scope="module")
def model_a(models) -> Path:
    return models["A"]


def _rng(seed=0):
    return np.random.default_rng(seed)


def _smooth_rgb(h, w, seed=0) -> np.ndarray:
    """Image-like (smooth + noise) uint8 RGB, so the tiny model's files stay small-ish."""
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([80 + 3 * xx, 120 + 2 * yy, 200 - 2 * (xx + yy)], -1)
    return np.clip(base + _rng(seed).integers(-12, 13, (h, w, 3)), 0, 255).astype(np.uint8)


def _palette_image(trns_bytes: bool, duplicate: bool = False) -> Image.Image:
    idx = (_rng(3).integers(0, 12, (19, 23))).astype(np.uint8)
    im = Image.frombytes("P", idx.shape[::-1], idx.tobytes())
    pal = _rng(4).integers(0, 256, (16, 3)).astype(np.uint8)
    if duplicate:
        pal[5] = pal[2]          # two indices, one colour: coded as indices
    im.putpalette(pal.tobytes(), "RGB")
    if trns_bytes:
        im.info["transparency"] = bytes(_rng(5).integers(0, 256, 16).astype(np.uint8))
    else:
        im.info["transparency"] = 3
    return im


def _smooth_palette_image() -> Image.Image:
    """Smooth grey levels behind a shuffled palette: coded as colours (through the model where it
    pays), where the random-index palettes above are coded as their index plane."""
    yy, xx = np.mgrid[0:16, 0:21]
    order = _rng(6).permutation(256)
    level = np.clip(xx + 2 * yy + _rng(7).integers(-3, 4, (16, 21)) + 20, 0, 255)
    im = Image.frombytes("P", (21, 16), order[level].astype(np.uint8).tobytes())
    pal = np.zeros((256, 3), np.uint8)
    pal[order] = np.arange(256, dtype=np.uint8)[:, None]
    im.putpalette(pal.tobytes(), "RGB")
    return im


def _make(kind: str, shared: Path | None) -> Image.Image:
    if kind == "cifar":
        with np.load(shared / "cifar10" / "test.npz") as z:
            return Image.fromarray(z["images"][7], "RGB")
    if kind == "kodak_crop":
        kodak = shared / "kodak" / "kodim23.png"
        if not kodak.is_file():
            pytest.skip(f"{kodak} not found")
        with Image.open(kodak) as im:
            return im.convert("RGB").crop((200, 150, 248, 190))       # 48x40
    if kind.startswith("rgb_"):
        w, h = map(int, kind[4:].split("x"))
        return Image.fromarray(_smooth_rgb(h, w, seed=w * h), "RGB")
    if kind == "L":
        return Image.fromarray(_smooth_rgb(21, 26)[..., 1], "L")
    if kind == "1":
        return Image.fromarray(_smooth_rgb(13, 30)[..., 0] > 120).convert("1")
    if kind == "RGBA":
        rgb = _smooth_rgb(17, 20)
        a = _rng(1).integers(0, 256, (17, 20, 1)).astype(np.uint8)
        a[:4] = 255
        a[-3:] = 0
        return Image.fromarray(np.concatenate([rgb, a], -1), "RGBA")
    if kind == "RGBA_const":
        rgb = _smooth_rgb(9, 12)
        return Image.fromarray(np.concatenate([rgb, np.full((9, 12, 1), 200, np.uint8)], -1), "RGBA")
    if kind == "LA":
        g = _smooth_rgb(15, 11)[..., 2:3]
        a = _rng(2).integers(0, 256, (15, 11, 1)).astype(np.uint8)
        return Image.fromarray(np.concatenate([g, a], -1), "LA")
    if kind == "P_trns_index":
        return _palette_image(trns_bytes=False)
    if kind == "P_trns_alpha":
        return _palette_image(trns_bytes=True)
    if kind == "P_duplicates":
        return _palette_image(trns_bytes=True, duplicate=True)
    if kind == "P_smooth":
        return _smooth_palette_image()
    raise ValueError(kind)


def save_png(im: Image.Image, path: Path) -> Path:
    kw = {"transparency": im.info["transparency"]} if "transparency" in im.info else {}
    im.save(path, **kw)
    return path


@pytest.fixture
def image(request, tmp_path):
    """Factory: image(kind) -> path of a PNG of that kind in tmp_path."""
    def make(kind: str, name: str | None = None) -> Path:
        shared = request.getfixturevalue("shared_data") if kind in ("cifar", "kodak_crop") else None
        return save_png(_make(kind, shared), tmp_path / (name or f"{kind}.png"))
    return make


@pytest.fixture(scope="module")
def good_sfc(tmp_path_factory, model_a) -> Path:
    """A valid one-image .sfc (tiny model A, chain mode) to corrupt."""
    d = tmp_path_factory.mktemp("good")
    src = save_png(Image.fromarray(_smooth_rgb(8, 8), "RGB"), d / "src.png")
    out = d / "good.sfc"
    assert_ok(sfcodec("compress", src, "-o", out, "--model", model_a, "--mode", "chain", "--steps", STEPS["chain"], "-q"))
    return out


@pytest.fixture(scope="module")
def model_sfc(tmp_path_factory, model_a) -> Path:
    """A .sfc whose tiles the model coded (model A, 8px tiles; a one-tile file is the seed codec's)."""
    d = tmp_path_factory.mktemp("coded")
    src = save_png(Image.fromarray(_smooth_rgb(32, 32), "RGB"), d / "src.png")
    out = d / "coded.sfc"
    with first_seed_tiles():
        assert_ok(sfcodec("compress", src, "-o", out, "--model", model_a, "--tile", "8", "--steps", STEPS["chain"],
                          "--no-fallback", "-q"))
    return out


# --- round trips ------------------------------------------------------------------------------
KINDS = ["cifar", "rgb_31x33", "rgb_1x1", "rgb_1x17", "L", "1", "RGBA", "RGBA_const", "LA",
         "P_trns_index", "P_trns_alpha", "P_duplicates", "P_smooth", "kodak_crop"]


@pytest.mark.parametrize("mode", ["ode", "chain"])
@pytest.mark.parametrize("kind", KINDS)
def test_round_trip(image, model_a, tmp_path, kind, mode):
    src = image(kind)
    sfc, out = tmp_path / "f.sfc", tmp_path / "out.png"
    r = sfcodec("compress", src, "-o", sfc, "--model", model_a, "--mode", mode, "--steps", STEPS[mode], "--no-verify", "-q")
    assert_ok(r)
    assert r.stderr == "" and r.stdout == ""
    assert sfc.read_bytes()[:4] == b"\x89SFC"
    if kind.startswith("P_"):  # the colours where they code smaller, else the index plane (either way back)
        h = json.loads(sfcodec("info", sfc, "--json").stdout)
        assert h["meta"]["0"]["palette_coded"] == ("colors" if kind == "P_smooth" else "indices")
    assert_ok(sfcodec("decompress", sfc, "-o", out, "--model", model_a, "-q"))
    assert_same_pixels(src, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([src.name, "f.sfc", "out.png"])


def test_compress_summary_and_verify_flag(image, model_a, tmp_path):
    """Without -q: one summary line on stderr; --verify decodes before writing."""
    src, sfc = image("rgb_31x33"), tmp_path / "f.sfc"
    r = sfcodec("compress", src, "-o", sfc, "--model", model_a, "--mode", "ode", "--steps", STEPS["ode"], "--verify")
    assert_ok(r)
    last = [ln for ln in r.stderr.replace("\r", "\n").splitlines() if ln.strip()][-1]
    assert last.startswith(f"{sfc}: {sfc.stat().st_size} bytes") and "verified in" in last
    assert "model tiny-0" in last and "[ode," in last


def test_effort(tmp_path):
    """--effort 1 - 3 (the seed codec's modes tried; default 3): a lower effort's file is larger here (a
    photograph-like image), decodes to the same pixels with a plain decompress, and says its effort in
    the summary line; verify records it; anything else is a usage error."""
    from test_seed_codec import _photo_synthetic

    png = save_png(Image.fromarray(np.ascontiguousarray(_photo_synthetic(40, 36)[:3].transpose(1, 2, 0))),
                   tmp_path / "p.png")
    sizes = {}
    for level in ("1", "3"):
        out = tmp_path / f"e{level}.sfc"
        r = sfcodec("compress", png, "-o", out, "--fallback", "seed", "--effort", level)
        assert_ok(r)
        assert ("seed codec effort 1" in r.stderr) == (level == "1")
        sizes[level] = out.stat().st_size
        assert_ok(sfcodec("decompress", out, "-o", tmp_path / f"e{level}.png"))
        assert_same_pixels(png, tmp_path / f"e{level}.png")
    assert sizes["1"] > sizes["3"]
    assert_ok(sfcodec("compress", png, "-o", tmp_path / "default.sfc", "--fallback", "seed"))
    assert (tmp_path / "default.sfc").read_bytes() == (tmp_path / "e3.sfc").read_bytes()
    r = sfcodec("verify", png, "--fallback", "seed", "--effort", "2", "--json")
    assert_ok(r)
    assert json.loads(r.stdout)["effort"] == 2
    for bad in ("0", "4", "x"):
        r = sfcodec("compress", png, "-o", tmp_path / "bad.sfc", "--effort", bad)
        assert r.exit_code == 2 and "--effort" in r.stderr and not (tmp_path / "bad.sfc").exists()
    from scoreflow_codec.errors import UsageError

    with pytest.raises(UsageError, match="effort"):
        api.compress([images.load_image(png)], None, fallback="seed", effort=0)


def test_a_transparent_colour_is_kept(tmp_path):
    """0.10.6: a grey or RGB PNG's transparent colour (tRNS) comes back in the PNG that decompress
    writes, with -o and -d, through --no-metadata too (it is part of the image, as a palette's
    transparency is); a format that cannot hold it (TIFF, BMP, PPM, WebP) gets the pixels and one
    warning naming it. Before, it was dropped without a word."""
    rgb, grey = tmp_path / "rgb.png", tmp_path / "grey.png"
    Image.fromarray(_smooth_rgb(16, 24, seed=5), "RGB").save(rgb, transparency=(12, 34, 56))
    Image.fromarray(_smooth_rgb(16, 24, seed=6)[..., 0], "L").save(grey, transparency=9)
    for src, want in ((rgb, (12, 34, 56)), (grey, 9)):
        sfc, out = tmp_path / f"{src.stem}.sfc", tmp_path / f"{src.stem}-out.png"
        for extra in ((), ("--no-metadata",)):
            assert_ok(sfcodec("compress", src, "-o", sfc, "--fallback", "seed", "--force", "-q", *extra))
            r = sfcodec("decompress", sfc, "-o", out, "--force")
            assert_ok(r)
            assert "warning" not in r.stderr
            assert_same_pixels(src, out)
            with Image.open(out) as im:
                assert im.info["transparency"] == want
        for suffix in (".tif", ".bmp", ".ppm", ".webp"):
            r = sfcodec("decompress", sfc, "-o", tmp_path / f"{src.stem}{suffix}")
            if suffix == ".webp" and src is grey:  # WebP holds no grey image at all: refused, as before
                assert r.exit_code == 3 and "WebP cannot hold mode L" in r.stderr
                continue
            assert_ok(r)
            assert [ln for ln in r.stderr.splitlines() if "warning" in ln] == [
                f"sfcodec: warning: {src.stem}{suffix}: {images.LOSSLESS_SAVE[suffix]} cannot hold the image's "
                "transparency: not written (a .png keeps them)"]
            assert_same_pixels(src, tmp_path / f"{src.stem}{suffix}")
    r = sfcodec("decompress", tmp_path / "rgb.sfc", tmp_path / "grey.sfc", "-d", tmp_path / "d")
    assert_ok(r)
    for src in (rgb, grey):
        assert_same_pixels(src, tmp_path / "d" / src.name)
        with Image.open(tmp_path / "d" / src.name) as a, Image.open(src) as b:
            assert a.info["transparency"] == b.info["transparency"]


def test_a_jpeg_whose_sfc_is_larger_is_warned_about(tmp_path):
    """A JPEG input is lossy already: its decoded pixels, kept exactly, take more bytes than the JPEG file.
    Where the .sfc is larger than the JPEG, one warning line says so (with -o and with -d); the file is
    written and decodes to the JPEG's pixels. A PNG input is not warned about."""
    rng = np.random.default_rng(5)
    yy, xx = np.mgrid[0:48, 0:64]
    arr = np.clip(np.stack([2 * xx, 3 * yy, xx + yy], -1) + rng.normal(0, 12, (48, 64, 3)), 0, 255).astype(np.uint8)
    jpg, png = tmp_path / "p.jpg", tmp_path / "q.png"
    Image.fromarray(arr).save(jpg, quality=60)
    Image.fromarray(arr).save(png)
    r = sfcodec("compress", jpg, "-o", tmp_path / "j.sfc", "--fallback", "seed")
    assert_ok(r)
    size = (tmp_path / "j.sfc").stat().st_size
    assert size > jpg.stat().st_size  # the case this is about
    warn = [ln for ln in r.stderr.splitlines() if "warning" in ln]
    assert warn == [f"sfcodec: warning: j.sfc ({size} bytes) is larger than its input file ({jpg.stat().st_size} "
                    "bytes): a JPEG is lossy already, and its decoded pixels, kept exactly, take more bytes than the "
                    "JPEG file (keep the JPEG itself)"]
    assert_ok(sfcodec("decompress", tmp_path / "j.sfc", "-o", tmp_path / "back.png", "-q"))
    with Image.open(jpg) as a, Image.open(tmp_path / "back.png") as b:
        assert np.array_equal(np.asarray(a), np.asarray(b))
    r = sfcodec("compress", jpg, png, "-d", tmp_path / "d", "--fallback", "seed", "--jobs", "1")
    assert_ok(r)
    assert [ln.split(" (")[0] for ln in r.stderr.splitlines() if "warning" in ln] == ["sfcodec: warning: p.sfc"]
    tiny = tmp_path / "tiny.png"  # a checkerboard: PNG's deflate codes it in fewer bytes than the .sfc
    Image.fromarray((np.indices((64, 64)).sum(0) % 2 * 255).astype(np.uint8)).save(tiny, optimize=True)
    r = sfcodec("compress", tiny, "-o", tmp_path / "n.sfc", "--fallback", "seed")
    assert_ok(r)
    assert "warning" not in r.stderr and (tmp_path / "n.sfc").stat().st_size > tiny.stat().st_size


def test_what_a_file_holds_and_the_sfc_does_not_keep_is_warned_about(tmp_path):
    """0.9.31: what an input holds beside its pixels that the .sfc does not keep (a TIFF's Photoshop layers
    and private tags, a JPEG's comment) is one warning line naming it, with -o and -d, and by verify (where
    -q is quiet and --no-metadata asked for the pixels alone: no warning); a PNG's tIME chunk, kept since
    0.9.31, comes back with its PNG and is not warned about."""
    from PIL import TiffImagePlugin

    img = Image.fromarray(_smooth_rgb(16, 24, seed=3), "RGB")
    ifd = TiffImagePlugin.ImageFileDirectory_v2()
    ifd[37724], ifd.tagtype[37724] = b"Adobe Photoshop Document Data Block\0", 7
    ifd[65000], ifd.tagtype[65000] = b"private", 7
    tif, jpg, png = tmp_path / "layers.tif", tmp_path / "c.jpg", tmp_path / "t.png"
    img.save(tif, tiffinfo=ifd)
    img.save(jpg, comment=b"a comment", quality=95)
    img.save(png)
    data = png.read_bytes()
    at = data.index(b"IDAT") - 4
    when = b"tIME" + bytes([7, 234, 11, 30, 12, 34, 5])
    png.write_bytes(data[:at] + struct.pack(">I", 7) + when + struct.pack(">I", zlib.crc32(when)) + data[at:])
    r = sfcodec("compress", tif, "-o", tmp_path / "a.sfc", "--fallback", "seed")
    assert_ok(r)
    assert [ln for ln in r.stderr.splitlines() if "warning" in ln] == [
        f"sfcodec: warning: {tif}: not kept in the .sfc file: ImageSourceData (tag 37724: Photoshop's layers), "
        "tag 65000"]
    for quiet in (("-q",), ("--no-metadata",)):
        r = sfcodec("compress", tif, "-o", tmp_path / "a.sfc", "--fallback", "seed", "--force", *quiet)
        assert_ok(r)
        assert "warning" not in r.stderr
    r = sfcodec("compress", tif, jpg, png, "-d", tmp_path / "d", "--fallback", "seed", "--jobs", "1")
    assert_ok(r)
    warned = sorted(ln.split(": not kept")[0] for ln in r.stderr.splitlines() if "not kept" in ln)
    assert warned == [f"sfcodec: warning: {jpg}", f"sfcodec: warning: {tif}"]
    assert "comment (COM)" in r.stderr
    assert_ok(sfcodec("decompress", tmp_path / "d" / "t.sfc", "-o", tmp_path / "t2.png", "-q"))
    assert when in (tmp_path / "t2.png").read_bytes()
    r = sfcodec("info", tmp_path / "d" / "t.sfc")  # info names the kept chunks' types
    assert_ok(r)
    assert "metadata:  kept: other PNG chunks 20 bytes (tIME)" in r.output
    cut = tmp_path / "cut.sfc"  # the section cut off: the header still shown, without the types
    cut.write_bytes((tmp_path / "d" / "t.sfc").read_bytes()[:-30])
    r = sfcodec("info", cut)
    assert_ok(r)
    assert "metadata:  kept: other PNG chunks 20 bytes\n" in r.output
    # verify says it too: the pixels and what is kept are identical, and this is not kept
    r = sfcodec("verify", tif, png, "--fallback", "seed")
    assert_ok(r)
    assert [ln for ln in r.stderr.splitlines() if "warning" in ln] == [
        f"sfcodec: warning: {tif}: not kept in the .sfc file: ImageSourceData (tag 37724: Photoshop's layers), "
        "tag 65000"] and "OK: 2 image(s)" in r.output
    r = sfcodec("verify", tif, png, "--fallback", "seed", "--json")
    assert_ok(r)
    assert json.loads(r.stdout)["not_kept"] == {str(tif): ["ImageSourceData (tag 37724: Photoshop's layers)",
                                                           "tag 65000"]}
    assert json.loads(sfcodec("verify", tif, "--fallback", "seed", "--json", "--no-metadata").stdout)["not_kept"] == {}


def test_files_keep_their_dates_through_compress_and_decompress(tmp_path):
    """As gzip, xz and zstd do: a .sfc of one image gets the image's modification time, an image decoded
    from a .sfc the .sfc's (with -o and -d), so a photograph keeps its file date through the round trip;
    a .sfc of several images is dated now."""
    t = 981_173_106_000_000_000  # 2001-02-03
    pngs = [save_png(Image.fromarray(_smooth_rgb(8, 8, seed=k), "RGB"), tmp_path / f"{k}.png") for k in range(2)]
    for p in pngs:
        os.utime(p, ns=(t, t))
    assert_ok(sfcodec("compress", pngs[0], "-o", tmp_path / "a.sfc", "--fallback", "seed", "-q"))
    assert_ok(sfcodec("decompress", tmp_path / "a.sfc", "-o", tmp_path / "a.png", "-q"))
    assert_ok(sfcodec("compress", *pngs, "-d", tmp_path / "d", "--fallback", "seed", "--jobs", "2", "-q"))
    assert_ok(sfcodec("decompress", tmp_path / "d", "-d", tmp_path / "back", "-q"))
    for f in (tmp_path / "a.sfc", tmp_path / "a.png", tmp_path / "d" / "0.sfc", tmp_path / "back" / "1.png"):
        assert f.stat().st_mtime_ns == t, f
    assert_ok(sfcodec("compress", *pngs, "-o", tmp_path / "both.sfc", "--fallback", "seed", "-q"))
    assert (tmp_path / "both.sfc").stat().st_mtime_ns > t


def _piped(*args, data: bytes):
    """The CLI in-process with `data` on standard input."""
    return CliRunner().invoke(cli, [str(a) for a in args], input=data, prog_name="sfcodec", catch_exceptions=False)


def test_standard_input_and_output(tmp_path):
    """`compress - -o -` and `decompress - -o -`: the image (or .sfc) from standard input, the output on
    standard output, nothing else there (the summary on stderr). The .sfc is the file's, less the input's
    name (none to keep); it decodes to the same pixels, through a pipe or a file, as PNG or --format."""
    png = save_png(Image.fromarray(_smooth_rgb(20, 24, seed=3), "RGB"), tmp_path / "p.png")
    r = _piped("compress", "-", "-o", "-", "--fallback", "seed", data=png.read_bytes())
    assert_ok(r)
    sfc = r.stdout_bytes
    assert r.stderr.strip().startswith(f"<stdout>: {len(sfc)} bytes") and "verified" in r.stderr
    assert api.read_header(sfc).get("meta", {}).get("0", {}).get("name") is None
    assert_ok(sfcodec("compress", png, "-o", tmp_path / "f.sfc", "--fallback", "seed", "-q"))
    with_name = api.read_header((tmp_path / "f.sfc").read_bytes())
    assert with_name["meta"]["0"]["name"] == "p.png" and with_name["crc32"] == api.read_header(sfc)["crc32"]
    r = _piped("decompress", "-", "-o", "-", data=sfc)
    assert_ok(r)
    assert r.stderr.strip().startswith("<stdin>: 1 image(s) decoded")
    back = tmp_path / "back.png"
    back.write_bytes(r.stdout_bytes)
    with Image.open(png) as a, Image.open(back) as b:
        assert b.format == "PNG" and np.array_equal(np.asarray(a), np.asarray(b))
    r = _piped("decompress", "-", "-o", "-", "--format", "tif", "-q", data=(tmp_path / "f.sfc").read_bytes())
    assert_ok(r)
    (tmp_path / "back.tif").write_bytes(r.stdout_bytes)
    with Image.open(png) as a, Image.open(tmp_path / "back.tif") as b:
        assert b.format == "TIFF" and np.array_equal(np.asarray(a), np.asarray(b))
    r = _piped("info", "-", data=sfc)
    assert_ok(r)
    assert r.stdout.startswith(f"file:      <stdin> ({len(sfc)} bytes") and "1 x 24x20 RGB" in r.stdout
    r = _piped("verify", "-", "--fallback", "seed", data=png.read_bytes())
    assert_ok(r)
    r = _piped("compress", "-", "-o", tmp_path / "g.sfc", "--fallback", "seed", "-q", data=png.read_bytes())
    assert_ok(r)
    assert r.stdout_bytes == b"" and (tmp_path / "g.sfc").read_bytes() == sfc
    r = _piped("decompress", tmp_path / "g.sfc", "-o", "-", "-q", data=b"")
    assert_ok(r)
    assert r.stdout_bytes == back.read_bytes()



def _drain(fifo: Path):
    """A reader of the FIFO on a thread -> (thread, the bytes list it fills); _release unblocks it."""
    import threading

    got: list[bytes] = []
    t = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    t.start()
    return t, got


def _release(fifo: Path, t) -> None:
    """Open the FIFO for writing and close it, so that a reader still waiting on it (a failed test) ends."""
    if t.is_alive():
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    t.join(5)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes (POSIX)")
def test_a_device_or_pipe_output_is_written_into_never_replaced(tmp_path):
    """-o a FIFO (a device such as /dev/null alike: fileio.is_special): compress writes the file into it,
    without --force, and it stays a FIFO (before 0.9.34 the output was renamed over it: as root,
    `-o /dev/null --force` replaced the device with a file); decompress writes the image into it in
    --format's format (png by default); a file of several images goes to no such output."""
    import stat

    pngs = [save_png(Image.fromarray(_smooth_rgb(8, 12, seed=k), "RGB"), tmp_path / f"{k}.png") for k in range(2)]
    assert_ok(sfcodec("compress", pngs[0], "-o", tmp_path / "a.sfc", "--fallback", "seed", "-q"))
    assert_ok(sfcodec("compress", *pngs, "-o", tmp_path / "two.sfc", "--fallback", "seed", "-q"))
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for args, check in (
            (("compress", pngs[0], "-o", fifo, "--fallback", "seed", "-q"),
             lambda b: b == (tmp_path / "a.sfc").read_bytes()),
            (("decompress", tmp_path / "a.sfc", "-o", fifo, "-q"),
             lambda b: b[:8] == b"\x89PNG\r\n\x1a\n" and np.array_equal(np.asarray(Image.open(io.BytesIO(b))),
                                                                       np.asarray(Image.open(pngs[0])))),
            (("decompress", tmp_path / "a.sfc", "-o", fifo, "--format", "tif", "-q"),
             lambda b: Image.open(io.BytesIO(b)).format == "TIFF")):
        t, got = _drain(fifo)
        try:
            assert_ok(sfcodec(*args))
        finally:
            _release(fifo, t)
        assert got and check(got[0]), args
        assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert_error(sfcodec("decompress", tmp_path / "two.sfc", "-o", fifo), EXIT["usage"], "2 images", "-o DIR")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    # a block device (a disk) is refused before any work, --force or not (a plain file stands in for one)
    from cli import main as cli_main
    disk = tmp_path / "disk"
    disk.write_bytes(b"partition table")
    with pytest.MonkeyPatch.context() as mp:
        from scoreflow_codec import fileio

        mp.setattr(cli_main, "is_block_device", lambda p: Path(p) == disk)
        mp.setattr(cli_main, "is_special", lambda p: Path(p) == disk or fileio.is_special(p))  # as a disk is
        for args in (("compress", pngs[0], "-o", disk, "--fallback", "seed", "--force"),
                     ("decompress", tmp_path / "a.sfc", "-o", disk, "--force")):
            assert_error(sfcodec(*args), EXIT["exists"], "disk: a block device (a disk or partition)")
    assert disk.read_bytes() == b"partition table"
    # a folder for several images that cannot be made (under a file): one line, as -d says it
    assert_error(sfcodec("decompress", tmp_path / "two.sfc", "-o", pngs[0] / "sub"), EXIT["usage"],
                 "cannot make the directory")



def _feed(fifo: Path, data: bytes):
    """A writer of data into the FIFO on a thread (it waits for a reader) -> the thread; _release ends it."""
    import threading

    def write():
        with contextlib.suppress(OSError), open(fifo, "wb") as f:
            f.write(data)
    t = threading.Thread(target=write, daemon=True)
    t.start()
    return t


def _unfeed(fifo: Path, t) -> None:
    """Open the FIFO for reading and close it, so that a writer still waiting on it (a failed test) ends."""
    if t.is_alive():
        with contextlib.suppress(OSError):
            fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
            t.join(5)  # the reader open while the writer writes its bytes and closes
            os.close(fd)
    t.join(5)


class _Endless(io.RawIOBase):
    """A stream that never ends (/dev/zero, `yes |`): `byte` for ever, counting what was read."""

    def __init__(self, byte: bytes = b"\0"):
        self.byte, self.given = byte, 0

    def readable(self):
        return True

    def readinto(self, b):
        b[:] = self.byte * len(b)
        self.given += len(b)
        return len(b)


def _in_time(fn, seconds=120):
    import threading

    out = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "read for ever"
    return out[0]


def test_an_endless_input_is_refused_at_its_first_bytes(tmp_path):
    """A device or a stream that never ends and is no image or .sfc (/dev/zero, `yes | sfcodec ...`): one
    line and the input's exit code after its first bytes (before 0.9.36 each command read it for ever);
    nothing written. An image that Pillow tells by opening it, not by its first bytes, still comes
    through standard input (IM: by opening it)."""
    from scoreflow_codec import container

    out = tmp_path / "o.sfc"
    commands = ((("compress", "IN", "-o", out), EXIT["image"], "{}: not an image"),
                (("verify", "IN"), EXIT["image"], "{}: not an image"),
                (("decompress", "IN", "-o", tmp_path / "o.png"), EXIT["sfc"], "{}: not a .sfc file (wrong magic number)"),
                (("info", "IN"), EXIT["sfc"], "{}: not a .sfc file (wrong magic number)"))
    inputs = [("-", b"\0"), ("-", b"y")] + ([("/dev/zero", None)] if Path("/dev/zero").exists() else [])
    for path, byte in inputs:  # standard input that never ends (its bytes counted), then the device
        for args, code, words in commands:
            argv = [path if a == "IN" else str(a) for a in args]
            stream = _Endless(byte) if byte is not None else None
            r = _in_time(lambda: sfcodec(*argv) if stream is None else CliRunner().invoke(
                cli, argv, input=io.BufferedReader(stream), prog_name="sfcodec", catch_exceptions=False))
            assert_error(r, code, words.format("<stdin>" if path == "-" else path))
            assert stream is None or stream.given <= images.SNIFF_BYTES + io.DEFAULT_BUFFER_SIZE, (argv, stream.given)
    assert sorted(tmp_path.iterdir()) == []
    # the magic number's own messages, as for a file (container._parse_header)
    with pytest.raises(container.BadFileError, match="cut inside the magic number"):
        container.read_stream(io.BytesIO(container.MAGIC[:5]))
    with pytest.raises(container.BadFileError, match="too short to hold the magic number"):
        container.read_stream(io.BytesIO(b""))
    for short in (b"", b"\0", b"II*"):  # shorter than some formats' checks read (0.9.36's first try: struct.error)
        with pytest.raises(images.BadImageError, match="^x: not an image Pillow can read"):
            images.read_image_stream(io.BytesIO(short), "x")
    sfc = container.MAGIC + b"whatever follows"
    assert container.read_stream(io.BufferedReader(io.BytesIO(sfc))) == sfc
    rgb = _smooth_rgb(8, 12)
    Image.init()
    # IM: no check of its first bytes (TGA's are CUR's); deprecated in Pillow 13, gone in 15
    for fmt in [f for f in ("IM", "TGA", "TIFF", "PNG") if f in Image.SAVE]:
        buf = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            Image.fromarray(rgb, "RGB").save(buf, fmt)
        assert images.read_image_stream(io.BytesIO(buf.getvalue()), "x") == buf.getvalue()
        assert_ok(_piped("compress", "-", "-o", out, "--fallback", "seed", "-q", data=buf.getvalue()))
        assert_ok(sfcodec("decompress", out, "-o", tmp_path / "back.png", "-q"))
        assert np.array_equal(np.asarray(Image.open(tmp_path / "back.png")), rgb)
        out.unlink()
        (tmp_path / "back.png").unlink()


def test_a_failing_read_is_one_line(tmp_path, monkeypatch):
    """An input whose read fails (a device's I/O error, a pipe whose writer vanished, a .sfc without read
    permission): one line naming it and the input's exit code, nothing written (before 0.9.37 a .sfc's,
    and standard input's, was an internal error)."""
    import errno

    from scoreflow_codec import container

    def broken(*args):
        raise OSError(errno.EIO, "Input/output error")

    good = save_png(Image.fromarray(_smooth_rgb(8, 12), "RGB"), tmp_path / "a.png")
    sfc = tmp_path / "a.sfc"
    assert_ok(sfcodec("compress", good, "-o", sfc, "--fallback", "seed", "-q"))
    before = sorted(tmp_path.iterdir())
    out = tmp_path / "o.sfc"
    monkeypatch.setattr(images, "read_image_stream", broken)
    assert_error(_piped("compress", "-", "-o", out, data=b"\x89PNG"), EXIT["image"], "<stdin>: cannot read: Input/output error")
    if Path("/dev/zero").exists():  # a device: read once
        assert_error(sfcodec("compress", "/dev/zero", "-o", out), EXIT["image"], "/dev/zero: cannot read: Input/output error")
    monkeypatch.setattr(container, "read_stream", broken)
    for args in (("decompress", sfc, "-o", tmp_path / "o.png"), ("info", sfc)):
        assert_error(sfcodec(*args), EXIT["sfc"], f"{sfc}: cannot read: Input/output error")
    assert_error(_piped("decompress", "-", "-o", tmp_path / "o.png", data=b"SFC"), EXIT["sfc"],
                 "<stdin>: cannot read: Input/output error")
    assert sorted(tmp_path.iterdir()) == before


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes (POSIX)")
def test_an_input_from_a_pipe_is_read_once(tmp_path):
    """An input that is a named pipe (`sfcodec compress <(curl ...)`: /dev/fd/N) can be read only once: compress,
    verify and decompress read it whole, as standard input (before 0.9.34 compress opened it again for the
    metadata and waited for ever); the same file as from the image itself, bar the name it records."""
    png = save_png(Image.fromarray(_smooth_rgb(8, 12), "RGB"), tmp_path / "a.png")
    assert_ok(sfcodec("compress", png, "-o", tmp_path / "a.sfc", "--fallback", "seed", "-q"))
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    runs = ((png.read_bytes(), ("compress", fifo, "-o", tmp_path / "p.sfc", "--fallback", "seed")),
            (png.read_bytes(), ("verify", fifo, "--fallback", "seed")),
            ((tmp_path / "a.sfc").read_bytes(), ("decompress", fifo, "-o", tmp_path / "p.png")),
            (png.read_bytes(), ("compress", fifo, "-d", tmp_path / "d", "--fallback", "seed", "--jobs", "1")),
            ((tmp_path / "a.sfc").read_bytes(), ("decompress", fifo, "-d", tmp_path / "dd", "--jobs", "1")),
            (b"not an image", ("compress", fifo, "-o", tmp_path / "bad.sfc", "--fallback", "seed")))
    import threading

    results = []
    for data, args in runs:
        t = _feed(fifo, data)
        run = threading.Thread(target=lambda: results.append(sfcodec(*args)), daemon=True)
        run.start()
        run.join(120)
        hung = run.is_alive()
        if hung:  # a second open of the pipe waits for a writer: give it an empty one, and fail
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            run.join(30)
        _unfeed(fifo, t)
        assert not hung, f"{args[0]} waited for ever on the pipe"
    for r in results[:-1]:
        assert_ok(r)
    assert_error(results[-1], EXIT["image"], "pipe: not an image")
    a, p = (api.read_header((tmp_path / n).read_bytes()) for n in ("a.sfc", "p.sfc"))
    assert p["crc32"] == a["crc32"] and p["meta"]["0"]["name"] == "pipe"
    assert api.read_header((tmp_path / "d" / "pipe.sfc").read_bytes())["crc32"] == a["crc32"]
    assert_same_pixels(png, tmp_path / "p.png")
    assert_same_pixels(png, tmp_path / "dd" / "pipe.png")
    assert not (tmp_path / "bad.sfc").exists()
    from scoreflow_codec import fileio  # what is read once: a pipe, not a disk (Pillow reads one as a file)

    assert fileio.is_read_once(fifo) and not fileio.is_read_once(png) and not fileio.is_read_once(tmp_path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fileio, "is_block_device", lambda p: Path(p) == fifo)
        assert not fileio.is_read_once(fifo)
    from cli import batch  # -d's memory estimate of a file among several does not read a pipe (it would take its data)

    t = _feed(fifo, png.read_bytes())
    try:
        assert batch.file_need([fifo], {"fallback": "seed"}, "compressed") == batch.PROCESS_BYTES + batch.MODEL_BYTES
    finally:
        _unfeed(fifo, t)



def test_an_output_ending_in_a_slash_is_a_directory(tmp_path):
    """-o out/ names a directory, whatever the file holds (before 0.9.34 Path's normalization dropped the
    slash: compress wrote a file named out): compress refuses it (exit 2, -d says where each input goes),
    decompress puts the image into it; --format goes with -o DIR (its help said so, and it was refused)
    and not with -o FILE."""
    pngs = [save_png(Image.fromarray(_smooth_rgb(8, 12, seed=k), "RGB"), tmp_path / f"p{k}.png") for k in range(2)]
    assert_ok(sfcodec("compress", pngs[0], "-o", tmp_path / "one.sfc", "--fallback", "seed", "-q"))
    assert_ok(sfcodec("compress", *pngs, "-o", tmp_path / "two.sfc", "--fallback", "seed", "-q"))
    before = listing(tmp_path)
    assert_error(sfcodec("compress", pngs[0], "-o", f"{tmp_path / 'out'}/"), EXIT["usage"], "names a directory", "-d")
    assert_error(sfcodec("decompress", tmp_path / "one.sfc", "-o", tmp_path / "x.png", "--format", "tif"),
                 EXIT["usage"], "--format goes with", "x.png")
    assert_error(sfcodec("decompress", tmp_path / "one.sfc", "-o", f"{pngs[0]}/"), EXIT["exists"],
                 "p0.png: not a directory (-o ending in / names a directory)")
    assert_error(sfcodec("decompress", tmp_path / "two.sfc", "-o", pngs[0]), EXIT["exists"],
                 "p0.png: not a directory (the file holds 2 images)")
    assert listing(tmp_path) == before and not (tmp_path / "out").exists()
    assert_ok(sfcodec("decompress", tmp_path / "one.sfc", "-o", f"{tmp_path / 'back'}/", "-q"))
    assert_same_pixels(pngs[0], tmp_path / "back" / "p0.png")
    assert_ok(sfcodec("decompress", tmp_path / "two.sfc", "-o", tmp_path / "tifs", "--format", "tif", "-q"))
    assert sorted(p.name for p in (tmp_path / "tifs").iterdir()) == ["p0.tif", "p1.tif"]
    for k in range(2):
        assert_same_pixels(pngs[k], tmp_path / "tifs" / f"p{k}.tif")


def test_a_write_that_fails_is_one_line_and_loses_nothing(tmp_path, monkeypatch):
    """A full disk (or no permission) while writing the output: one error line with the system's reason,
    exit 1, not an "internal error"; the old output (--force) is kept whole and no temporary file is left."""
    from scoreflow_codec import fileio

    png = save_png(Image.fromarray(_smooth_rgb(8, 12), "RGB"), tmp_path / "a.png")
    out = tmp_path / "a.sfc"
    out.write_bytes(b"precious")
    assert_ok(sfcodec("compress", png, "-o", tmp_path / "b.sfc", "--fallback", "seed", "-q"))
    before = listing(tmp_path)

    def full(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(fileio.os, "fsync", full)
    r = sfcodec("compress", png, "-o", out, "--fallback", "seed", "--force")
    assert_error(r, 1, "a.sfc: cannot write: No space left on device")
    assert "internal error" not in r.stderr
    r = sfcodec("decompress", tmp_path / "b.sfc", "-o", tmp_path / "c.png")
    assert_error(r, 1, "c.png: cannot write: No space left on device")
    assert listing(tmp_path) == before


def test_standard_input_and_output_refuse_what_they_cannot_do(tmp_path, monkeypatch):
    """'-' goes alone and with -o; a .sfc of several images does not fit standard output; what is on
    standard input is checked as a file is (one line naming <stdin>, its exit code); nothing is written to a
    terminal; --format goes with -d or -o -, not with -o FILE."""
    pngs = [save_png(Image.fromarray(_smooth_rgb(8, 8, seed=k), "RGB"), tmp_path / f"{k}.png") for k in range(2)]
    assert_ok(sfcodec("compress", *pngs, "-o", tmp_path / "two.sfc", "--fallback", "seed", "-q"))
    assert_ok(sfcodec("compress", pngs[0], "-o", tmp_path / "one.sfc", "--fallback", "seed", "-q"))
    two = (tmp_path / "two.sfc").read_bytes()
    before = listing(tmp_path)
    for args in (("compress", "-", pngs[0], "-o", "-"), ("compress", "-", "-d", tmp_path / "d"),
                 ("decompress", "-", tmp_path / "two.sfc", "-d", tmp_path / "d"),
                 ("decompress", "-", "-d", tmp_path / "d"),
                 ("decompress", tmp_path / "one.sfc", "-o", tmp_path / "x.png", "--format", "tif")):
        assert_error(_piped(*args, data=pngs[0].read_bytes()), EXIT["usage"])
    r = _piped("decompress", "-", "-o", "-", data=two)
    assert_error(r, EXIT["usage"], "<stdin>", "2 images", "-o DIR")
    assert r.stdout_bytes == b""
    assert_error(_piped("compress", "-", "-o", "-", data=b"not an image"), EXIT["image"], "<stdin>", "not an image")
    assert_error(_piped("compress", "-", "-o", "-", data=b""), EXIT["image"], "<stdin>")
    assert_error(_piped("decompress", "-", "-o", "-", data=two[:-9]), EXIT["sfc"], "truncated")
    assert_error(_piped("decompress", "-", "-o", "-", data=pngs[0].read_bytes()), EXIT["sfc"], "not a .sfc file")
    deep = tmp_path / "deep.png"
    deep.write_bytes(png16_by_hand(np.full((4, 5, 3), 4097, np.uint16), False))
    assert_ok(sfcodec("compress", deep, "-o", tmp_path / "deep.sfc", "--fallback", "seed", "-q"))
    r = _piped("decompress", "-", "-o", "-", "--format", "webp", data=(tmp_path / "deep.sfc").read_bytes())
    assert_error(r, EXIT["usage"], "<stdout> as .webp: the image is 16-bit", ".png or .tif")
    assert r.stdout_bytes == b""
    (tmp_path / "deep.png").unlink()
    (tmp_path / "deep.sfc").unlink()
    assert listing(tmp_path) == before

    class Terminal(io.BytesIO):
        def isatty(self):
            return True

    monkeypatch.setattr(click, "get_binary_stream", lambda name: Terminal())
    assert_error(sfcodec("compress", pngs[0], "-o", "-"), EXIT["usage"], "terminal")
    assert_error(sfcodec("decompress", tmp_path / "two.sfc", "-o", "-"), EXIT["usage"], "terminal")
    assert_error(sfcodec("compress", "-", "-o", tmp_path / "y.sfc"), EXIT["usage"], "terminal")
    assert listing(tmp_path) == before


def test_api_compress_defaults_are_the_cli_s(image, model_a, tmp_path, one_thread):
    """api.compress(sources, model) with no options writes the very bytes that `sfcodec compress`
    writes with its defaults (--mode chain, --fallback auto, exact64, the model's tile and steps):
    the same image, the same model file, and src.meta["name"] as the CLI sets it."""
    from scoreflow_codec import images, zoo

    png, sfc = image("rgb_16x16"), tmp_path / "cli.sfc"  # one tile: a few seconds
    assert_ok(sfcodec("compress", png, "-o", sfc, "--model", model_a, "-q"))
    src = images.load_image(png)
    src.meta["name"] = png.name  # the CLI records each input's file name
    data, _ = api.compress([src], zoo.load_model(model_a))
    assert data == sfc.read_bytes()
    assert api.read_header(data)["mode"] == "chain"


def test_shipped_model(shared_data, tmp_path):
    """No --model anywhere: compress picks the shipped CIFAR-10 model, decompress finds it by its
    sha256. Six CIFAR-10 test images: the sixth tile is coded by the model (chain mode)."""
    with np.load(shared_data / "cifar10" / "test.npz") as z:
        arrays = z["images"][:6]
    srcs = [save_png(Image.fromarray(a, "RGB"), tmp_path / f"cifar_{i}.png") for i, a in enumerate(arrays)]
    sfc, outdir = tmp_path / "set.sfc", tmp_path / "out"
    with first_seed_tiles():  # the model's stream, even where the seed codec alone is smaller
        assert_ok(sfcodec("compress", *srcs, "-o", sfc, "--mode", "chain", "--steps", STEPS["chain"], "--no-verify",
                          "--no-fallback", "-q"))
    h = json.loads(sfcodec("info", sfc, "--json").stdout)
    assert h["model"]["name"] == "cifar10" and h["fields"]["n_tiles"] > h["fields"]["n_seed"]
    assert_ok(sfcodec("decompress", sfc, "-o", outdir, "-q"))
    for s in srcs:
        assert_same_pixels(s, outdir / s.name)


@pytest.mark.parametrize("mode", ["ode", "chain"])
def test_round_trip_through_the_model(image, model_a, tmp_path, mode):
    """A filler image takes the seed tiles; the score model codes the rest, in both modes: an odd-sized
    RGB image (edge pixels latent) and a gray one (colour channels latent), with alpha in chain mode."""
    seed_tiles = {"ode": 10, "chain": 5}[mode]  # ODE: its deficit, 22.1 bits/dim (0.6.0), against 14.05
    filler = save_png(Image.fromarray(_smooth_rgb(32, 32 * seed_tiles), "RGB"), tmp_path / "filler.png")
    kinds = ["L"] if mode == "ode" else ["rgb_31x33", "L", "LA", "RGBA"]  # ODE: ~3 s a tile on one core
    srcs = [filler] + [image(k) for k in kinds]
    sfc, outdir = tmp_path / "set.sfc", tmp_path / "out"
    with first_seed_tiles():
        assert_ok(sfcodec("compress", *srcs, "-o", sfc, "--model", model_a, "--mode", mode, "--steps", STEPS[mode],
                          "--no-verify", "--no-fallback", "-q"))
    f = json.loads(sfcodec("info", sfc, "--json").stdout)["fields"]
    assert f["n_seed"] <= seed_tiles and f["n_tiles"] > seed_tiles  # the filler's bits suffice
    assert_ok(sfcodec("decompress", sfc, "-o", outdir, "--model", model_a, "-q"))
    for s in srcs:
        assert_same_pixels(s, outdir / s.name)


def _png_with_metadata(path: Path, seed: int = 0) -> Path:
    """An RGB PNG with an ICC profile, EXIF (orientation 6), XMP, a text chunk, gamma and 300 dpi."""
    from PIL import ImageCms, PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("Title", "a photograph")
    info.add_itxt("XML:com.adobe.xmp", "<x:xmpmeta/>")
    info.add(b"gAMA", struct.pack(">I", 45455))
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(_smooth_rgb(21, 26, seed), "RGB").save(
        path, pnginfo=info, exif=exif.tobytes(), dpi=(300, 300),
        icc_profile=ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes())
    return path


def test_metadata_is_kept(model_a, tmp_path):
    """ICC profile, EXIF, XMP, text, gamma and resolution come back in the PNG that decompress writes;
    info names them; a format that cannot hold some says so in one warning; --no-metadata drops them."""
    from scoreflow_codec import container, images

    src = _png_with_metadata(tmp_path / "photo.png")
    want = images.load_image(src).metadata
    assert set(want) == {"icc", "exif", "xmp", "text", "gamma", "dpi"}
    sfc, out = tmp_path / "photo.sfc", tmp_path / "out.png"
    r = sfcodec("compress", src, "-o", sfc, "--model", model_a)
    assert_ok(r)
    assert " of them metadata)" in r.stderr and container.format_version(sfc.read_bytes()) == 5
    info = sfcodec("info", sfc)
    assert_ok(info)
    assert f"metadata:  kept: ICC profile {len(want['icc']):,} bytes, EXIF {len(want['exif'])} bytes, XMP 12 bytes" \
        in info.stdout
    assert_ok(sfcodec("decompress", sfc, "-o", out, "-q"))
    assert_same_pixels(src, out)
    assert images.load_image(out).metadata == want
    with Image.open(out) as im:
        assert im.getexif()[0x0112] == 6
    # a BMP holds the resolution only: one warning line, the file written all the same
    r = sfcodec("decompress", sfc, "-o", tmp_path / "out.bmp")
    assert_ok(r)
    warn = [ln for ln in r.stderr.splitlines() if "warning" in ln]
    assert warn == ["sfcodec: warning: out.bmp: BMP cannot hold the image's ICC profile, EXIF, XMP, gamma, PNG text: "
                    "not written (a .png keeps them)"]
    assert_same_pixels(src, tmp_path / "out.bmp")
    r = sfcodec("decompress", sfc, "-o", tmp_path / "q.bmp", "-q")
    assert_ok(r)
    assert r.stderr == ""
    v = sfcodec("verify", src, "--model", model_a)
    assert_ok(v)
    assert v.stdout.rstrip().endswith("pixels identical, metadata identical")
    # --no-metadata: the pixels only, a version 4 file as before 0.9.27, smaller
    bare = tmp_path / "bare.sfc"
    assert_ok(sfcodec("compress", src, "-o", bare, "--model", model_a, "--no-metadata", "-q"))
    assert container.format_version(bare.read_bytes()) == 4 and len(bare.read_bytes()) < len(sfc.read_bytes())
    assert "metadata:  none (pixels only)" in sfcodec("info", bare).stdout
    assert_ok(sfcodec("decompress", bare, "-o", tmp_path / "bare.png", "-q"))
    assert images.load_image(tmp_path / "bare.png").metadata == {}
    assert json.loads(sfcodec("verify", src, "--model", model_a, "--json", "--no-metadata").stdout)["metadata_bytes"] == 0


def test_metadata_in_a_model_stream(model_a, tmp_path):
    """The metadata section beside a stream the model coded (not only the seed codec's files)."""
    from scoreflow_codec import images

    filler = save_png(Image.fromarray(_smooth_rgb(32, 32 * 5), "RGB"), tmp_path / "filler.png")
    photo = _png_with_metadata(tmp_path / "photo.png", seed=3)
    sfc, outdir = tmp_path / "set.sfc", tmp_path / "out"
    with first_seed_tiles():
        assert_ok(sfcodec("compress", filler, photo, "-o", sfc, "--model", model_a, "--steps", STEPS["chain"],
                          "--no-fallback", "-q"))
    h = json.loads(sfcodec("info", sfc, "--json").stdout)
    assert h["fields"]["n_seed"] < h["fields"]["n_tiles"] and "kept" in h["meta"]["1"] and "kept" not in h["meta"]["0"]
    assert_ok(sfcodec("decompress", sfc, "-o", outdir, "--model", model_a, "-q"))
    assert images.load_image(outdir / "photo.png").metadata == images.load_image(photo).metadata
    assert images.load_image(outdir / "filler.png").metadata == {}


@pytest.mark.parametrize("c", [1, 2, 3, 4], ids=["grey", "grey_alpha", "rgb", "rgba"])
def test_16_bit_round_trip(model_a, tmp_path, c):
    """A 16-bit PNG of each colour type: compressed (version 6), decoded to the same 16-bit samples,
    only as a PNG; info names the mode, verify compares all 16 bits."""
    from scoreflow_codec import images

    yy, xx = np.mgrid[0:20, 0:24]
    arr = np.stack([30000 + 500 * xx + 300 * yy * (k + 1) for k in range(c)], -1) + _rng(c).integers(0, 300, (20, 24, c))
    src = tmp_path / "deep.png"
    src.write_bytes(png16_by_hand(arr.astype(np.uint16), False))  # the colour type of c channels
    sfc, out = tmp_path / "deep.sfc", tmp_path / "back.png"
    r = sfcodec("compress", src, "-o", sfc, "--model", model_a, "--steps", STEPS["chain"])
    assert_ok(r)
    assert "low bits" in r.stderr
    info = sfcodec("info", sfc).stdout
    assert "v6" in info and {1: "L;16", 2: "LA;16", 3: "RGB;16", 4: "RGBA;16"}[c] in info and "16-bit" in info
    before = listing(tmp_path)
    refused = [".webp", ".bmp"] + ([".tif"] if c == 2 else [])  # grey + alpha: a TIFF Pillow cannot read back
    for suffix in refused:
        assert_error(sfcodec("decompress", sfc, "-o", tmp_path / f"back{suffix}"), EXIT["usage"], "16-bit", ".png")
    assert listing(tmp_path) == before
    assert_ok(sfcodec("decompress", sfc, "-o", out, "--model", model_a, "-q"))
    assert np.array_equal(images.to_array(images.load_image(out)), images.to_array(images.load_image(src)))
    assert np.array_equal(images.to_array(images.load_image(out)).reshape(arr.shape), arr)
    if c != 2:  # and as a 16-bit TIFF
        assert_ok(sfcodec("decompress", sfc, "-o", tmp_path / "back.tif", "--model", model_a, "-q"))
        assert np.array_equal(images.to_array(images.load_image(tmp_path / "back.tif")).reshape(arr.shape), arr)
    v = sfcodec("verify", src, "--model", model_a, "--steps", STEPS["chain"])
    assert_ok(v)
    assert "identical" in v.stdout + v.stderr


def test_48_bit_tiff_round_trip(model_a, tmp_path):
    """A 48-bit TIFF (uncompressed, the TIFF 6.0 layout) compresses; it comes back as a 16-bit PNG of
    the same samples."""
    from scoreflow_codec import images

    src = _tiff48(tmp_path / "rgb48.tif")
    sfc, out = tmp_path / "t.sfc", tmp_path / "t.png"
    assert_ok(sfcodec("compress", src, "-o", sfc, "--model", model_a, "--steps", STEPS["chain"], "-q"))
    assert_ok(sfcodec("decompress", sfc, "-o", out, "-q"))
    want = _rng(3).integers(0, 65536, (4, 5, 3), dtype=np.uint16)
    assert np.array_equal(images.to_array(images.load_image(out)), want)
    assert np.array_equal(images.to_array(images.load_image(src)), want)


@pytest.mark.parametrize("mode", ["ode", "chain"])
def test_multi_image(image, model_a, tmp_path, mode):
    srcs = [image("rgb_31x33", "a.png"), image("L", "b.png"), image("RGBA", "c.png")]
    sfc, outdir = tmp_path / "set.sfc", tmp_path / "outdir"
    assert_ok(sfcodec("compress", *srcs, "-o", sfc, "--model", model_a, "--mode", mode, "--steps", STEPS[mode],
                      "--no-verify", "-q"))
    assert_ok(sfcodec("decompress", sfc, "-o", f"{outdir}/", "--model", model_a, "-q"))
    assert sorted(p.name for p in outdir.iterdir()) == ["a.png", "b.png", "c.png"]
    for s in srcs:
        assert_same_pixels(s, outdir / s.name)
    # again into the same directory: refused file by file, nothing changed; --force overwrites
    before = listing(outdir)
    assert_error(sfcodec("decompress", sfc, "-o", outdir, "--model", model_a, "-q"), EXIT["exists"], "exists")
    assert listing(outdir) == before
    assert_ok(sfcodec("decompress", sfc, "-o", outdir, "--model", model_a, "-q", "--force"))
    assert listing(outdir) == before


def test_multi_image_into_a_file_is_refused(image, model_a, tmp_path):
    srcs = [image("rgb_1x1", "a.png"), image("rgb_1x17", "b.png")]
    sfc, out = tmp_path / "set.sfc", tmp_path / "out.png"
    assert_ok(sfcodec("compress", *srcs, "-o", sfc, "--model", model_a, "--mode", "chain", "--steps", STEPS["chain"], "-q"))
    out.write_bytes(b"precious")
    assert_error(sfcodec("decompress", sfc, "-o", out, "--model", model_a, "-q"), EXIT["exists"],
                 "2 images", "directory")
    assert out.read_bytes() == b"precious"


def test_single_image_into_a_directory(image, model_a, tmp_path):
    """decompress -o DIR for a one-image file writes DIR/<original name>.png."""
    src, sfc, outdir = image("L", "gray.png"), tmp_path / "f.sfc", tmp_path / "dir"
    outdir.mkdir()
    assert_ok(sfcodec("compress", src, "-o", sfc, "--model", model_a, "--mode", "chain", "--steps", STEPS["chain"], "-q"))
    assert_ok(sfcodec("decompress", sfc, "-o", outdir, "--model", model_a, "-q"))
    assert_same_pixels(src, outdir / "gray.png")


# --- info, verify, models, help ---------------------------------------------------------------
def test_info(good_sfc):
    r = sfcodec("info", good_sfc)
    assert_ok(r)
    out = r.stdout
    # one 8x8 image is one tile, coded by the seed codec: the chain's settings, the model and the
    # setup are left out (it decodes without them)
    for words in ("file:", f"({good_sfc.stat().st_size} bytes", "format:    .sfc v4, written by", "model:     none", "decodes without a model", "mode:      chain",
                  "unused: every tile is in the seed codec", "setup:     none needed", "images:    1", "1 x 8x8 RGB", "stream:"):
        assert words in out, (words, out)
    h = json.loads(sfcodec("info", good_sfc, "--json").stdout)
    assert h["mode"] == "chain" and h["settings"] == {} and h["images"] == [[8, 8, "RGB", 1]]
    assert h["meta"]["0"]["name"] == "src.png" and "model" not in h and "setup" not in h


def test_info_of_a_file_the_model_coded(model_sfc):
    out = model_sfc
    r = sfcodec("info", out)
    assert_ok(r)
    assert "model:     tiny-0" in r.stdout and "not shipped with this installation" in r.stdout, r.stdout
    assert "setup:     exact64 arithmetic" in r.stdout, r.stdout
    assert f"steps={STEPS['chain']}" in r.stdout and "schedule=calibrated" in r.stdout, r.stdout
    assert "batching=bits" in r.stdout and "seed tiles, the first (" in r.stdout, r.stdout
    h = json.loads(sfcodec("info", out, "--json").stdout)
    assert h["fields"]["n_tiles"] == 16 and h["fields"]["n_seed"] < 16, h["fields"]
    assert h["settings"] == {"steps": int(STEPS["chain"]), "schedule": "calibrated", "kappa_top": 2}


@pytest.mark.parametrize("mode", ["ode", "chain"])
def test_verify_json(image, model_a, mode):
    srcs = [image("rgb_1x17"), image("LA")]
    r = sfcodec("verify", *srcs, "--model", model_a, "--mode", mode, "--steps", STEPS[mode], "--json", "-q")
    assert_ok(r)
    out = json.loads(r.stdout)
    assert out["identical"] is True and out["images"] == 2 and out["mode"] == mode and out["model"] == "tiny-0"
    assert out["bytes"] > 0 and out["bpd"] > 0


def test_verify_plain(image, model_a):
    r = sfcodec("verify", image("1"), "--model", model_a, "--mode", "chain", "--steps", STEPS["chain"], "-q")
    assert_ok(r)
    assert r.stdout.startswith("OK: 1 image(s)") and "pixels identical" in r.stdout


def test_models_lists_each_shipped_model_with_its_coding_defaults():
    """`sfcodec models`: one line per zoo entry with its tile size and chain steps (the entry's own,
    else the chain codec's default), the default model starred; then one line on the retired ones."""
    from scoreflow_codec import zoo
    from scoreflow_codec.coding.chain_codec import ChainSettings

    r = sfcodec("models")
    assert_ok(r)
    lines = r.output.splitlines()
    assert lines[0].split() == ["name", "tile", "steps", "description"]
    index = zoo.read_index()
    assert len(lines) == len(index["models"]) + 3 and lines[-1].startswith("* the default model")
    retired = zoo.retired_models()
    releases = ", ".join(sorted({e["release"] for e in retired.values()}))
    assert lines[-2].startswith(f"retired: {', '.join(retired)} (last shipped in {releases};") and \
        "cifar10-1, cifar10-2, cifar10-3, photo-1, photo-2" in lines[-2], lines[-2]  # retired by 0.9.43
    for line, (name, entry) in zip(lines[1:], index["models"].items()):
        star = ["*"] if name == index["default"] else []
        tile, steps = entry.get("tile", 32), entry.get("chain_steps") or ChainSettings().steps
        assert line.split()[:3 + len(star)] == [name, *star, str(tile), str(steps)], line


def test_help_subprocess():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "cli.main", "--help"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "compress" in r.stdout and "decompress" in r.stdout and "Exit codes" in r.stdout


def test_closed_stdout_is_quiet(good_sfc):
    """`sfcodec info f.sfc | head -1`: the reader is gone before the output; no "internal error",
    no traceback, exit 141 (as a SIGPIPE'd C tool)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r_fd, w_fd = os.pipe()
    os.close(r_fd)  # every write to w_fd now fails with EPIPE
    try:
        p = subprocess.run([sys.executable, "-m", "cli.main", "info", str(good_sfc)], cwd=REPO, env=env,
                           stdout=w_fd, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(w_fd)
    assert p.returncode == 141, p.stderr
    assert p.stderr == "", p.stderr


def test_tile_option(image, model_a, tmp_path):
    """--tile picks the tile size; the file records it and decodes without being told."""
    seeds = 5  # chain mode's seed tiles at 8 steps (test_round_trip_through_the_model)
    filler = save_png(Image.fromarray(_smooth_rgb(16, 16 * seeds), "RGB"), tmp_path / "filler.png")
    srcs = [filler, image("rgb_31x33")]
    sfc, outdir = tmp_path / "set.sfc", tmp_path / "out"
    with first_seed_tiles():
        assert_ok(sfcodec("compress", *srcs, "-o", sfc, "--model", model_a, "--mode", "chain", "--steps", STEPS["chain"],
                          "--tile", "16", "--no-fallback", "-q"))
    h = json.loads(sfcodec("info", sfc, "--json").stdout)
    assert h["stream"]["tile"] == 16 and h["fields"]["n_tiles"] == seeds + 2 * 3  # 31x33 in 16px tiles
    assert h["fields"]["n_seed"] < h["fields"]["n_tiles"]  # the model codes some
    assert h["setup"]["micro_batch"] == 32  # as many pixels per network call as 8 tiles of 32
    assert "tiles of 16px" in sfcodec("info", sfc).stdout
    assert_ok(sfcodec("decompress", sfc, "-o", outdir, "--model", model_a, "-q"))
    for s in srcs:
        assert_same_pixels(s, outdir / s.name)
    for bad in ("4", "512", "x"):
        r = sfcodec("compress", srcs[1], "-o", tmp_path / "t.sfc", "--model", model_a, "--tile", bad)
        assert r.exit_code == EXIT["usage"] and "--tile" in r.stderr
    assert not (tmp_path / "t.sfc").exists()


def test_a_model_file_brings_its_own_tile_and_steps(image, model_a, tmp_path):
    """A model file that records coding defaults (trainer export --tile/--chain-steps) codes with
    them when given by path (--tile and --steps override them as they override the codec's own:
    test_tile_option, api.coding_settings)."""
    from scoreflow_codec.modelfile import load_model_file, save_model

    lm = load_model_file(model_a)
    mine = tmp_path / "mine.safetensors"
    save_model(mine, lm.model, lm.dequantizer, {**lm.config, "codec": {"tile": 16, "chain_steps": 6}})
    src, sfc = image("rgb_31x33"), tmp_path / "a.sfc"
    with first_seed_tiles():
        assert_ok(sfcodec("compress", src, "-o", sfc, "--model", mine, "--mode", "chain", "--no-fallback", "-q"))
    h = json.loads(sfcodec("info", sfc, "--json").stdout)
    assert h["stream"]["tile"] == 16 and h["settings"]["steps"] == 6
    assert_ok(sfcodec("decompress", sfc, "-o", tmp_path / "out.png", "--model", mine, "-q"))
    assert_same_pixels(src, tmp_path / "out.png")


def test_eval(model_a, tmp_path):
    """eval: a row per image and their mean, bound and ODE NLL (several probes), reproducible by seed."""
    npz = tmp_path / "two.npz"
    np.savez(npz, images=np.stack([_smooth_rgb(16, 16, 1), _smooth_rgb(16, 16, 2)]))
    args = ["eval", npz, "--model", model_a, "--n-t", "4", "--rtol", "1e-2", "--atol", "1e-2", "--probes", "2"]
    r = sfcodec(*args, "--json")
    assert_ok(r)
    out = json.loads(r.stdout)
    assert [row["image"] for row in out["rows"]] == ["two.npz[0]", "two.npz[1]"]
    for row in out["rows"]:
        assert 0 < row["bound_bpd"] < 64 and 0 < row["ode_nll_bpd"] < 64  # an untrained model: about 17
    assert out["mean"]["ode_nll_bpd"] == pytest.approx(np.mean([row["ode_nll_bpd"] for row in out["rows"]]))
    for k in ("bound_bpd", "ode_nll_bpd"):  # two images: |a - b| / 2 is their std / sqrt(2)
        a, b = (row[k] for row in out["rows"])
        assert out["se"][k] == pytest.approx(abs(a - b) / 2, abs=1e-12)
    assert out["se"]["bound_bpd"] > 0.1  # (the untrained model's ODE NLL does not depend on the image)
    assert json.loads(sfcodec(*args, "--json").stdout) == out  # same seed, same numbers
    # --batch: both images in one batch (api.evaluate_images' pool), the draws spread otherwise
    from scoreflow_codec import zoo
    pooled = json.loads(sfcodec(*args, "--batch", "2", "--no-ode", "--json").stdout)["rows"]
    want = api.evaluate_images([_smooth_rgb(16, 16, 1), _smooth_rgb(16, 16, 2)], zoo.load_model(str(model_a)),
                               ode=False, n_t=4, pool=2)
    assert [r["bound_bpd"] for r in pooled] == [r["bound_bpd"] for r in want]
    assert pooled[0]["bound_bpd"] != json.loads(sfcodec(*args, "--no-ode", "--json").stdout)["rows"][0]["bound_bpd"]
    table = sfcodec(*args, "--no-ode").stdout.splitlines()
    assert table[0].split() == ["image", "bound_bpd", "bound_bpd_nocorr"] and table[-2].startswith("mean")
    se = table[-1].split()
    no_ode = json.loads(sfcodec(*args, "--no-ode", "--json").stdout)  # (its bound draws other noise)
    assert se[:2] == ["standard", "error"] and float(se[2]) == pytest.approx(no_ode["se"]["bound_bpd"], abs=1e-4)
    one = [*args, "--limit", "1", "--no-ode"]
    r = sfcodec(*one, "--json")
    assert_ok(r)
    assert json.loads(r.stdout)["se"] == {"bound_bpd": None, "bound_bpd_nocorr": None}
    assert sfcodec(*one).stdout.splitlines()[-1].startswith("mean")
    bad = sfcodec(*args[:-1], "0")
    assert bad.exit_code == EXIT["usage"] and "--probes" in bad.stderr
    # before 0.9.32 --n-t 0 was an internal error, and a negative --rtol ran and gave nonsense
    for opt, value in (("--n-t", "0"), ("--n-t", "-3"), ("--rtol", "-1"), ("--atol", "0"), ("--limit", "0")):
        bad = sfcodec("eval", npz, "--model", model_a, opt, value)
        assert bad.exit_code == EXIT["usage"] and f"Invalid value for '{opt}'" in bad.stderr, (opt, bad.output)
    # an .npz that is not one, or holds no "images" (0.9.33: images.read_npz, the trainer's words; numpy's
    # about pickles before)
    (tmp_path / "text.npz").write_text("hello")
    np.savez(tmp_path / "other.npz", pixels=np.zeros((1, 4, 4, 3), np.uint8))
    for name, words in (("text.npz", "text.npz: not an .npz file"), ("other.npz", "no 'images' array in the .npz (it holds: pixels)")):
        bad = sfcodec("eval", tmp_path / name, "--model", model_a)
        assert bad.exit_code == EXIT["image"] and words in bad.stderr and len(bad.stderr.splitlines()) == 1, bad.output


def test_eval_sees_the_picture_of_palette_and_1_bit_images(tmp_path):
    """load_eval_inputs: a palette image (and one with an alpha plane) and a 1-bit one as their RGB
    pictures, what the trainer trains on; grey and RGB(A) as they are."""
    from scoreflow_codec import api

    rgb = _smooth_rgb(12, 10, 5)
    im = Image.fromarray(rgb)
    pa = im.quantize(16).convert("PA")  # a palette with an alpha plane: a TIFF holds it
    pa.putalpha(Image.fromarray(np.arange(120, dtype=np.uint8).reshape(12, 10)))
    cases = {"p.png": im.quantize(16), "pa.tif": pa, "bw.png": im.convert("1"),
             "g.png": im.convert("L"), "rgba.png": im.convert("RGBA")}
    for name, pic in cases.items():
        pic.save(tmp_path / name)
    assert [Image.open(tmp_path / n).mode for n in cases] == ["P", "PA", "1", "L", "RGBA"]
    arrays, names = api.load_eval_inputs([tmp_path / n for n in cases])
    assert names == list(cases)
    for name, a in zip(names, arrays):
        with Image.open(tmp_path / name) as back:
            want = back.convert("RGB") if back.mode in ("P", "PA", "1") else back
            assert a.dtype == np.uint8 and np.array_equal(a, np.asarray(want)), name
    assert arrays[0].shape == (12, 10, 3) and arrays[2].shape == (12, 10, 3) and len(np.unique(arrays[2])) == 2
    assert api.image_tiles(arrays[2], 8).shape == (4, 3, 8, 8)  # a 1-bit image reaches the model


def test_eval_of_folders(model_a, tmp_path):
    """eval takes folders (0.9.32; before, "is a directory, not an image"): each one's images, sorted, hidden
    files and other files left out, -r their subfolders' too; the same numbers as the files named one by one;
    a folder without images: exit 2, one line."""
    d = tmp_path / "photos"
    (d / "sub").mkdir(parents=True)
    for name, seed in (("b.png", 1), ("a.png", 2), (".hidden.png", 3), ("sub/c.png", 4)):
        Image.fromarray(_smooth_rgb(16, 16, seed).astype(np.uint8)).save(d / name)
    (d / "notes.txt").write_text("not an image")
    common = ["--model", model_a, "--n-t", "4", "--no-ode", "--json"]
    r = sfcodec("eval", d, *common)
    assert_ok(r)
    rows = json.loads(r.stdout)["rows"]
    assert [row["image"] for row in rows] == ["a.png", "b.png"]
    named = json.loads(sfcodec("eval", d / "a.png", d / "b.png", *common).stdout)["rows"]
    assert [row["bound_bpd"] for row in rows] == [row["bound_bpd"] for row in named]
    rec = json.loads(sfcodec("eval", d, "-r", *common).stdout)["rows"]
    assert [row["image"] for row in rec] == ["a.png", "b.png", "c.png"]
    assert [row["image"] for row in json.loads(sfcodec("eval", d, "-r", "--limit", "1", *common).stdout)["rows"]] == ["a.png"]
    r = sfcodec("eval", d / "sub", d, *common[:-1])  # a folder, then another
    assert_ok(r)
    assert [line.split()[0] for line in r.stdout.splitlines()[1:4]] == ["c.png", "a.png", "b.png"]
    empty = tmp_path / "empty"
    (empty / "deeper").mkdir(parents=True)
    r = sfcodec("eval", empty, *common)
    assert r.exit_code == EXIT["usage"] and "empty: no image files in the folder (-r: its subfolders too)" in r.stderr
    assert "Traceback" not in r.output


# --- bad input: one line, the documented exit code, nothing written ---------------------------
def test_usage_errors(tmp_path, image):
    src = image("rgb_1x1")
    for args in (["compress", src], ["compress", src, "-o", tmp_path / "x.sfc", "--mode", "fast"],
                 ["compress", src, "-o", tmp_path / "x.sfc", "--steps", "1"], ["nonsense"]):
        r = sfcodec(*args)
        assert r.exit_code == EXIT["usage"], (args, r.stderr)
        assert ("Error:" in r.stderr or "sfcodec: error: give either -o" in r.stderr) and "Traceback" not in r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == [src.name]


def _bad_image(kind: str, d: Path) -> tuple[Path, list[str]]:
    """A bad input for compress -> (path, words the message must hold)."""
    p = d / f"bad_{kind}.png"
    if kind == "text":
        p.write_text("this is not an image\n")
        return p, [p.name, "not an image"]
    if kind == "empty":
        p.write_bytes(b"")
        return p, [p.name, "not an image"]
    if kind == "truncated_png":
        buf = d / "full.png"
        Image.fromarray(_smooth_rgb(20, 20), "RGB").save(buf)
        p.write_bytes(buf.read_bytes()[:60])
        buf.unlink()
        return p, [p.name]
    if kind == "missing":
        return d / "nope.png", ["nope.png", "no such file"]
    if kind == "directory":
        p = d / "adir.png"
        p.mkdir()
        return p, ["adir.png", "directory"]
    if kind == "int32":
        Image.fromarray(_rng(0).integers(0, 2**31, (4, 4)).astype(np.int32), "I").save(p.with_suffix(".tif"))
        return p.with_suffix(".tif"), ["32-bit"]
    if kind == "16bit_ppm_cut":  # a 16-bit PPM cut short (until 0.10.6 Pillow's 8 bits of it were coded)
        samples = _rng(9).integers(0, 65536, (6, 5, 3)).astype(">u2").tobytes()
        p = p.with_suffix(".ppm")
        p.write_bytes(b"P6\n5 6\n65535\n" + samples[:-7])
        return p, ["truncated"]
    if kind == "cmyk":
        Image.new("CMYK", (4, 4), (1, 2, 3, 4)).save(p.with_suffix(".tif"))
        return p.with_suffix(".tif"), ["CMYK"]
    if kind == "float":
        Image.fromarray(_rng(0).random((4, 4)).astype(np.float32), "F").save(p.with_suffix(".tif"))
        return p.with_suffix(".tif"), ["float"]
    if kind in ("dng", "nef"):  # a camera raw file: Pillow would read its preview (a TIFF marked as a DNG here)
        from PIL import TiffImagePlugin

        info = TiffImagePlugin.ImageFileDirectory_v2()
        info[50706], info.tagtype[50706] = b"\x01\x04\x00\x00", 1
        p = p.with_suffix(".tif" if kind == "dng" else ".nef")
        Image.fromarray(_smooth_rgb(8, 6), "RGB").save(p, format="TIFF", tiffinfo=info)
        return p, ["camera raw"]
    if kind in ("ico", "icns"):  # an icon of several sizes: Pillow reads the largest alone
        p = p.with_suffix(f".{kind}")
        Image.fromarray(_smooth_rgb(64, 64), "RGB").save(p, sizes=[(16, 16), (32, 32), (64, 64)])
        return p, ["several sizes", kind.upper()]
    if kind == "sfc":  # a .sfc file given to compress
        p = p.with_suffix(".sfc")
        p.write_bytes(api.compress([images.from_array(_smooth_rgb(4, 4))], None, fallback="seed")[0])
        return p, [p.name, "a .sfc file already", "decompress"]
    raise ValueError(kind)


BAD_IMAGES = ["text", "empty", "truncated_png", "missing", "directory", "cmyk", "float", "int32", "16bit_ppm_cut", "dng",
              "nef", "ico", "icns", "sfc"]


@pytest.mark.parametrize("kind", BAD_IMAGES)
def test_bad_image(tmp_path, model_a, kind):
    path, words = _bad_image(kind, tmp_path)
    out = tmp_path / "out.sfc"
    before = listing(tmp_path)
    r = sfcodec("compress", path, "-o", out, "--model", model_a, "--mode", "chain", "--steps", STEPS["chain"])
    assert_error(r, EXIT["image"], *words)
    assert listing(tmp_path) == before
    # verify reads images the same way; a folder it takes for its images (0.9.33), here none
    v = sfcodec("verify", path, "--model", model_a, "--steps", STEPS["ode"])
    if kind == "directory":
        assert_error(v, EXIT["usage"], path.name, "no image files in the folder")
    else:
        assert_error(v, EXIT["image"], *words)


def test_bad_image_leaves_existing_output_alone(tmp_path, model_a):
    """A good image then a bad one: nothing is written, with --force or without."""
    good = save_png(Image.fromarray(_smooth_rgb(4, 4), "RGB"), tmp_path / "good.png")
    bad, _ = _bad_image("text", tmp_path)
    out = tmp_path / "out.sfc"
    out.write_bytes(b"precious")
    before = listing(tmp_path)
    r = sfcodec("compress", good, bad, "-o", out, "--model", model_a, "--mode", "chain", "--steps", STEPS["chain"], "--force")
    assert_error(r, EXIT["image"], bad.name)
    assert listing(tmp_path) == before


def _corrupt(kind: str, good: bytes) -> tuple[bytes, list[str]]:
    hlen = struct.unpack_from("<I", good, 12)[0]
    payload_start = 16 + hlen + 8
    if kind == "truncated":
        return good[: len(good) - 7], ["truncated"]
    if kind == "truncated_header":
        return good[:20], ["truncated"]
    if kind == "flip_magic":
        return bytes([good[0] ^ 0x01]) + good[1:], ["not a .sfc file"]
    if kind == "flip_header":
        i = 16 + hlen // 2
        return good[:i] + bytes([good[i] ^ 0x10]) + good[i + 1:], ["header CRC"]
    if kind == "flip_payload":
        i = payload_start + 2
        return good[:i] + bytes([good[i] ^ 0x04]) + good[i + 1:], ["payload CRC"]
    if kind == "trailing":
        return good + b"\x00" * 4, ["trailing"]
    if kind == "empty":
        return b"", ["not a .sfc file"]
    if kind == "png":
        return _png_bytes(), ["not a .sfc file"]
    if kind == "version":
        return good[:8] + struct.pack("<H", 9) + good[10:], ["version 9"]
    raise ValueError(kind)


def _png_bytes() -> bytes:
    import io
    buf = io.BytesIO()
    Image.fromarray(_smooth_rgb(8, 8), "RGB").save(buf, format="PNG")
    return buf.getvalue()


BAD_SFC = ["truncated", "truncated_header", "flip_magic", "flip_header", "flip_payload", "trailing", "empty",
           "png", "version"]
PAYLOAD_ONLY = {"truncated", "flip_payload", "trailing"}


@pytest.mark.parametrize("kind", BAD_SFC)
def test_bad_sfc(tmp_path, good_sfc, model_a, kind):
    data, words = _corrupt(kind, good_sfc.read_bytes())
    bad = tmp_path / "bad.sfc"
    bad.write_bytes(data)
    out = tmp_path / "out.png"
    before = listing(tmp_path)
    words = ["bad.sfc", *words]  # the line names the file (0.9.34; before, only among several)
    assert_error(sfcodec("decompress", bad, "-o", out, "--model", model_a), EXIT["sfc"], *words)
    assert listing(tmp_path) == before
    assert_error(sfcodec("decompress", bad, "-o", out), EXIT["sfc"], *words)  # before any model is looked for
    assert listing(tmp_path) == before
    # a pre-existing output survives, even with --force
    out.write_bytes(b"precious")
    assert_error(sfcodec("decompress", bad, "-o", out, "--model", model_a, "--force"), EXIT["sfc"], *words)
    assert out.read_bytes() == b"precious"
    if kind in PAYLOAD_ONLY:  # info reads the header alone, by design
        assert_ok(sfcodec("info", bad))
    else:
        assert_error(sfcodec("info", bad), EXIT["sfc"], *words)


def test_missing_and_directory_sfc(tmp_path, model_a):
    assert_error(sfcodec("decompress", tmp_path / "nope.sfc", "-o", tmp_path / "o.png"), EXIT["sfc"],
                 "nope.sfc", "no such file")
    assert_error(sfcodec("info", tmp_path / "nope.sfc"), EXIT["sfc"], "no such file")
    (tmp_path / "d.sfc").mkdir()
    assert_error(sfcodec("decompress", tmp_path / "d.sfc", "-o", tmp_path / "o.png"), EXIT["sfc"], "directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.sfc"]


def test_wrong_model(tmp_path, model_sfc, models):
    """A file the model A coded, decoded with model B (same preset, other weights) or with none."""
    out = tmp_path / "out.png"
    assert_error(sfcodec("decompress", model_sfc, "-o", out, "--model", models["B"]), EXIT["model"],
                 model_sfc.name, "tiny-0", "tiny-1", "--model")
    assert_error(sfcodec("decompress", model_sfc, "-o", out, "-q"), EXIT["model"], model_sfc.name, "tiny-0", "--model")
    assert list(tmp_path.iterdir()) == []


def test_a_seed_codec_file_decodes_without_its_model(tmp_path, good_sfc, models):
    """Every tile of good_sfc is in the seed codec: it names no model and decodes with none (model
    A, which made it, is not shipped), and any --model given is not used."""
    src = good_sfc.parent / "src.png"
    assert_ok(sfcodec("decompress", good_sfc, "-o", tmp_path / "a.png", "-q"))
    assert_same_pixels(src, tmp_path / "a.png")
    assert_ok(sfcodec("decompress", good_sfc, "-o", tmp_path / "b.png", "--model", models["B"], "-q"))
    assert_same_pixels(src, tmp_path / "b.png")


def test_missing_model(tmp_path, image, model_sfc):
    src = image("rgb_1x1")
    missing = tmp_path / "gone.safetensors"
    before = listing(tmp_path)
    assert_error(sfcodec("compress", src, "-o", tmp_path / "f.sfc", "--model", missing, "--mode", "chain"),
                 EXIT["model"], "gone.safetensors")
    assert_error(sfcodec("decompress", model_sfc, "-o", tmp_path / "o.png", "--model", missing), EXIT["model"],
                 "gone.safetensors")
    assert_error(sfcodec("verify", src, "--model", "no-such-zoo-model"), EXIT["model"], "no-such-zoo-model")
    assert listing(tmp_path) == before


def test_broken_model_file(tmp_path, image):
    src = image("rgb_1x1")
    bad = tmp_path / "broken.safetensors"
    bad.write_bytes(b"\x00" * 100)
    before = listing(tmp_path)
    assert_error(sfcodec("compress", src, "-o", tmp_path / "f.sfc", "--model", bad, "--mode", "chain"),
                 EXIT["model"], "safetensors")
    assert listing(tmp_path) == before


def test_output_exists(image, model_a, tmp_path, good_sfc):
    src = image("rgb_1x17")
    out = tmp_path / "f.sfc"
    out.write_bytes(b"precious")
    args = ["compress", src, "-o", out, "--model", model_a, "--mode", "chain", "--steps", STEPS["chain"], "-q"]
    assert_error(sfcodec(*args), EXIT["exists"], str(out), "--force")
    assert out.read_bytes() == b"precious"
    assert_ok(sfcodec(*args, "--force"))
    assert out.read_bytes()[:4] == b"\x89SFC"
    # decompress: the same rule
    png = tmp_path / "o.png"
    png.write_bytes(b"precious")
    assert_error(sfcodec("decompress", out, "-o", png, "--model", model_a, "-q"), EXIT["exists"], "--force")
    assert png.read_bytes() == b"precious"
    assert_ok(sfcodec("decompress", out, "-o", png, "--model", model_a, "-q", "--force"))
    assert_same_pixels(src, png)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([src.name, "f.sfc", "o.png"])


def test_output_would_overwrite_input(image, model_a, tmp_path):
    src = image("rgb_1x1")
    before = listing(tmp_path)
    assert_error(sfcodec("compress", src, "-o", src, "--model", model_a, "--force"), EXIT["exists"], "input")
    assert listing(tmp_path) == before


@pytest.mark.parametrize("force", [False, True])
def test_directory_as_output_of_compress(image, model_a, tmp_path, force):
    src = image("rgb_1x1")
    d = tmp_path / "outdir"
    d.mkdir()
    args = ["compress", src, "-o", d, "--model", model_a, "--mode", "chain", "--steps", STEPS["chain"]]
    assert_error(sfcodec(*args, *(["--force"] if force else [])), EXIT["exists"], "outdir", "directory")
    assert list(d.iterdir()) == []


def test_output_in_missing_directory(image, model_a, tmp_path):
    src = image("rgb_1x1")
    assert_error(sfcodec("compress", src, "-o", tmp_path / "no" / "f.sfc", "--model", model_a), EXIT["exists"],
                 "no such directory")
    assert not (tmp_path / "no").exists()


def test_lossy_output_format_refused(tmp_path, good_sfc, model_a):
    out = tmp_path / "out.jpg"
    assert_error(sfcodec("decompress", good_sfc, "-o", out, "--model", model_a, "-q"), EXIT["usage"],
                 "out.jpg", "lossless")
    assert list(tmp_path.iterdir()) == []


def test_a_format_that_cannot_hold_the_mode_is_refused(tmp_path):
    """An output format that cannot hold the image's mode is refused (exit 3, nothing written): an LA image
    in a BMP, and since 0.10.6 an RGBA one, whose alpha Pillow writes where readers (Pillow's own) ignore
    it: before, the BMP came back RGB, its alpha lost without a word. A TIFF or WebP holds RGBA."""
    src = tmp_path / "rgba.png"
    rgba = np.dstack([_smooth_rgb(12, 10, seed=2), _rng(2).integers(0, 256, (12, 10, 1)).astype(np.uint8)])
    Image.fromarray(rgba, "RGBA").save(src)
    sfc = tmp_path / "rgba.sfc"
    assert_ok(sfcodec("compress", src, "-o", sfc, "--fallback", "seed", "-q"))
    assert_error(sfcodec("decompress", sfc, "-o", tmp_path / "out.bmp"), 3, "BMP cannot hold mode RGBA", ".png")
    assert not (tmp_path / "out.bmp").exists()
    for suffix in (".tif", ".webp", ".png"):
        assert_ok(sfcodec("decompress", sfc, "-o", tmp_path / f"out{suffix}", "-q"))
        assert_same_pixels(src, tmp_path / f"out{suffix}")


def test_few_steps_still_round_trip(image, model_a, tmp_path):
    """Chain mode with far too few steps for the model: a large file, but a lossless one (this
    used to fail with an escape cascade: "gaussian: means must be finite")."""
    filler = save_png(Image.fromarray(_smooth_rgb(32, 160), "RGB"), tmp_path / "filler.png")
    srcs = [filler, image("rgb_31x33")]
    out, dec = tmp_path / "f.sfc", tmp_path / "dec"
    assert_ok(sfcodec("compress", *srcs, "-o", out, "--model", model_a, "--mode", "chain", "--steps", "4", "-q"))
    assert_ok(sfcodec("decompress", out, "-o", dec, "--model", model_a, "-q"))
    for src in srcs:
        assert_same_pixels(src, dec / src.name)


def test_info_and_seed_only_decoding_do_not_load_torch(good_sfc, tmp_path):
    """Reading a header and decoding a seed-only file run no model: the CLI does both without
    importing torch (seconds of every run), in a fresh interpreter. The decoded image is the one
    the in-process CLI decodes."""
    import subprocess
    import sys
    out = tmp_path / "fresh.png"
    code = f"""
import sys
from cli.main import cli
for args in (["info", {str(good_sfc)!r}], ["decompress", {str(good_sfc)!r}, "-o", {str(out)!r}, "-q"]):
    try:
        cli(args, standalone_mode=False)
    except SystemExit as e:
        assert not e.code, e.code
print("torch" in sys.modules)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "False", r.stdout
    assert_ok(sfcodec("decompress", good_sfc, "-o", tmp_path / "here.png", "-q"))
    assert (tmp_path / "here.png").read_bytes() == out.read_bytes()


def test_progress_bar_names_the_stage(monkeypatch):
    """On a terminal the encode bar says which stage is running (compress's phase: the seed codec and
    the model's estimate tick nothing, a minute on a photograph), and ticks as before."""
    import io

    from cli import main as cli_main

    class Tty(io.StringIO):
        def isatty(self):
            return True

    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)
    with cli_main._progress(10, "encode", False) as tick:
        tick.describe("model estimate")
        tick(4)
        assert tick.bar.n == 4
    assert "encode: model estimate" in err.getvalue()
    with cli_main._progress(10, "encode", True) as tick:  # --quiet: no bar
        assert tick is None


def test_a_file_in_parts_decodes_with_any_number_of_jobs(tmp_path, monkeypatch):
    """A seed codec file in independent parts (stream.in_parts; PART_PIXELS made small so that two
    small images make two parts): --jobs changes the time, never the bytes; info names the parts;
    --jobs 0 is a usage error."""
    from scoreflow_codec.coding import stream

    monkeypatch.setattr(stream, "PART_PIXELS", 1024)
    srcs = []
    for k, (h, w) in enumerate([(40, 40), (20, 30)]):
        srcs.append(tmp_path / f"p{k}.png")
        Image.fromarray(_smooth_rgb(h, w, k)).save(srcs[-1])
    one, two = tmp_path / "one.sfc", tmp_path / "two.sfc"
    assert_ok(sfcodec("compress", *srcs, "-o", one, "--fallback", "seed", "--jobs", "1", "-q"))
    assert_ok(sfcodec("compress", *srcs, "-o", two, "--fallback", "seed", "--jobs", "2", "-q"))
    assert one.read_bytes() == two.read_bytes()
    assert "in 2 independent parts" in sfcodec("info", one).stdout
    for jobs in ("1", "2"):
        out = tmp_path / f"out{jobs}"
        assert_ok(sfcodec("decompress", one, "-o", out, "--jobs", jobs, "-q"))
        for k, src in enumerate(srcs):
            assert_same_pixels(src, out / f"p{k}.png")
    r = sfcodec("verify", *srcs, "--fallback", "seed", "--jobs", "2", "--json")
    assert_ok(r)
    assert json.loads(r.stdout)["identical"]
    assert sfcodec("decompress", one, "-o", tmp_path / "x", "--jobs", "0").exit_code == EXIT["usage"]


def test_a_device_this_machine_cannot_run_on_is_one_line(tmp_path, model_a, monkeypatch):
    """--device that this torch cannot run on: click's usage error naming why (exit 2), for every
    command that takes one, before any work; a float32 file that names a device this machine lacks:
    one line (exit 5). Before 0.9.39 both were internal errors (an AssertionError from deep in torch,
    "please report it"). models.device_problem's cases, with CUDA faked where there is none."""
    from scoreflow_codec import container
    from scoreflow_codec.models import device_problem

    img = tmp_path / "a.png"
    Image.fromarray(_smooth_rgb(64, 64)).save(img)
    cuda_words = None if torch.cuda.is_available() else "was built without cuda" if torch.version.cuda is None \
        else "no cuda device is available"
    cases = [("cpux", "unknown device 'cpux' (cpu or cuda)"), ("mps", "device 'mps' is not supported (cpu or cuda)")]
    if cuda_words:
        cases.append(("cuda", cuda_words))
    good = tmp_path / "good.sfc"
    assert_ok(sfcodec("compress", img, "--model", model_a, "--arith", "float32", "--steps", "4", "--no-fallback",
                      "--seed-tiles", "first", "-o", good))
    for device, words in cases:
        for args in (("compress", img, "--model", model_a, "-o", tmp_path / "x.sfc"),
                     ("decompress", good, "--model", model_a, "-o", tmp_path / "x.png"),
                     ("verify", img, "--model", model_a), ("eval", img, "--model", model_a, "--no-ode")):
            r = sfcodec(*args, "--device", device)
            assert r.exit_code == EXIT["usage"] and "Traceback" not in r.output, (args, r.output)
            assert "Invalid value for '--device'" in r.stderr and words in r.stderr.lower(), r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "good.sfc"]

    # the file's own device (no --device): one line, nothing written
    header, payload = container.unpack(good.read_bytes())
    assert header["setup"]["device"] == "cpu" and header["setup"]["dtype"] == "float32"
    header["setup"]["device"] = "cuda"
    (tmp_path / "cuda.sfc").write_bytes(container.pack(header, payload))
    if cuda_words:
        assert_error(sfcodec("decompress", tmp_path / "cuda.sfc", "--model", model_a, "-o", tmp_path / "y.png"),
                     EXIT["model"], "cuda.sfc: the file was encoded on cuda in float32 arithmetic", cuda_words)
        assert not (tmp_path / "y.png").exists()

    assert device_problem("cpu") is None and device_problem("cpu:0") is None
    monkeypatch.setattr(torch.version, "cuda", None)
    assert device_problem("cuda") == f"this torch ({torch.__version__}) was built without CUDA"
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert device_problem("cuda") == "no CUDA device is available on this machine"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert device_problem("cuda") is None and device_problem("cuda:1") is None
    assert device_problem("cuda:2") == "no cuda:2 on this machine (it has 2 CUDA devices)"
