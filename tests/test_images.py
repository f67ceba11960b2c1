"""Odd inputs through images.py and the api: every mode Pillow gives us either round-trips
bit-exactly (pixels, alpha, palette, transparency) or is refused with one clear line.

docs/RELIABILITY.md lists the same cases; keep them in step.
"""
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from scoreflow_codec import api, images
from scoreflow_codec.errors import BadImageError, DecodeMismatchError, SfcError, UnsupportedImageError

from coding_models import loaded_gaussian

RNG = np.random.default_rng(7)
SETTINGS = {"steps": 8}  # the exact Gaussian model codes anything at 8 ODE steps


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return loaded_gaussian()


def _rgb(h, w):
    return RNG.integers(0, 256, (h, w, 3), np.uint8)


def _palette_image(h, w, n=16, palette=None):
    p = Image.fromarray(RNG.integers(0, n, (h, w), np.uint8), "P")
    p.putpalette(palette if palette is not None else RNG.permutation(256)[:3 * n].astype(np.uint8).tobytes())
    return p


def _smooth_palette_image(h, w):
    """Smooth grey levels behind a palette in shuffled order: cheap as colours, dear as indices."""
    yy, xx = np.mgrid[0:h, 0:w]
    level = np.clip(xx + 2 * yy + np.random.default_rng(12).integers(-3, 4, (h, w)) + 20, 0, 255)
    order = np.random.default_rng(11).permutation(256)          # palette slot of each grey level
    p = Image.fromarray(order[level].astype(np.uint8), "P")
    pal = np.zeros((256, 3), np.uint8)
    pal[order] = np.arange(256, dtype=np.uint8)[:, None]
    p.putpalette(pal.tobytes())
    return p


def _quantized_image(h, w, colors=8):
    """A smooth RGB picture quantized to a few colours: cheap as indices, dear as colour planes."""
    yy, xx = np.mgrid[0:h, 0:w]
    rgb = np.stack([8 * xx, 6 * yy, 255 - 4 * (xx + yy)], -1).clip(0, 255).astype(np.uint8)
    return Image.fromarray(rgb).quantize(colors)


def _write(tmp_path, name, img, **kw):
    path = tmp_path / name
    img.save(path, **kw)
    return path


def _reopen(path):
    with Image.open(path) as im:
        im.load()
        return im.copy(), dict(im.info)


def _round_trip(model, srcs, mode="ode", settings=SETTINGS):
    data, _ = api.compress(srcs, model, mode, settings, fallback="off")
    back = api.decompress(data, model)
    api.check_identical(srcs, back)
    return back


def _assert_same_image(a: Image.Image, a_info: dict, b: Image.Image):
    assert b.mode == a.mode and b.size == a.size
    assert np.array_equal(np.asarray(a), np.asarray(b))
    if a.mode in ("P", "PA"):
        assert b.palette.getdata() == a.palette.getdata()
    assert b.info.get("transparency") == a_info.get("transparency")


# name -> (file name, Pillow image, save kwargs)
def _cases():
    la_const = np.dstack([RNG.integers(0, 256, (9, 7), np.uint8), np.full((9, 7), 200, np.uint8)])
    return {
        "1x1": ("a.png", Image.fromarray(_rgb(1, 1)), {}),
        "1xN": ("a.png", Image.fromarray(_rgb(1, 70)), {}),
        "Nx1": ("a.png", Image.fromarray(_rgb(70, 1)), {}),
        "31x33": ("a.png", Image.fromarray(_rgb(33, 31)), {}),
        "L": ("a.png", Image.fromarray(RNG.integers(0, 256, (9, 40), np.uint8), "L"), {}),
        "LA": ("a.png", Image.fromarray(RNG.integers(0, 256, (9, 7, 2), np.uint8), "LA"), {}),
        "LA-constant-alpha": ("a.png", Image.fromarray(la_const, "LA"), {}),
        "RGBA": ("a.png", Image.fromarray(RNG.integers(0, 256, (33, 35, 4), np.uint8), "RGBA"), {}),
        "1-bit": ("a.png", Image.fromarray(RNG.integers(0, 2, (9, 13), np.uint8) * 255).convert("1"), {}),
        "P-transparent-index": ("a.png", _palette_image(9, 7), {"transparency": 3}),
        # a grey or RGB PNG's transparent colour (tRNS): dropped without a word before 0.10.6
        "L-transparent-colour": ("a.png", Image.fromarray(RNG.integers(0, 256, (9, 40), np.uint8), "L"),
                                 {"transparency": 7}),
        "RGB-transparent-colour": ("a.png", Image.fromarray(_rgb(8, 9)), {"transparency": (10, 300, 255)}),
        "1-bit-transparent-colour": ("a.png", Image.fromarray(RNG.integers(0, 2, (9, 13), np.uint8) * 255).convert("1"),
                                     {"transparency": 1}),
        "P-tRNS-table": ("a.png", _palette_image(9, 7), {"transparency": bytes(range(0, 160, 10))}),
        "P-duplicate-colours": ("a.png", _palette_image(9, 7, palette=bytes(24) + bytes(range(24))), {}),
        "GIF-one-frame": ("a.gif", _palette_image(8, 8), {}),
        "P-smooth-colours": ("a.png", _smooth_palette_image(16, 20), {}),
        "P-quantized": ("a.png", _quantized_image(12, 10), {}),
        "BMP": ("a.bmp", Image.fromarray(_rgb(5, 6)), {}),
        "WebP-lossless": ("a.webp", Image.fromarray(_rgb(5, 6)), {"lossless": True}),
    }


@pytest.mark.parametrize("case", list(_cases()))
def test_file_round_trip_is_bit_exact(model, tmp_path, case):
    name, img, kw = _cases()[case]
    path = _write(tmp_path, name, img, **kw)
    orig, info = _reopen(path)
    (back,) = _round_trip(model, [images.load_image(path)])
    restored = images.to_pil(back)
    _assert_same_image(orig, info, restored)
    # and through the PNG the CLI writes
    out = tmp_path / "out.png"
    out.write_bytes(images.encode_image(restored, ".png"))
    again, _ = _reopen(out)
    _assert_same_image(orig, info, again)


@pytest.mark.parametrize("bits", [2, 4])
def test_a_low_bit_grey_pngs_transparent_colour_keeps_its_pixels(model, tmp_path, bits):
    """A 2- or 4-bit grey PNG: Pillow gives its pixels scaled to 0 - 255 but its tRNS colour as stored; the
    colour is scaled as they are (0.10.6), so the 8-bit PNG written back has the same pixels transparent."""
    step = 255 // ((1 << bits) - 1)
    raw = RNG.integers(0, 1 << bits, (9, 11)).astype(np.uint8)
    raw[0, 0] = 1
    path = _write(tmp_path, "low.png", Image.fromarray(raw * step, "L"), bits=bits, transparency=1)
    with Image.open(path) as im:
        assert im.tile[0].args == f"L;{bits}" and im.info["transparency"] == 1  # as stored
    (back,) = _round_trip(model, [images.load_image(path)])
    out = tmp_path / "out.png"
    out.write_bytes(images.encode_image(images.to_pil(back), ".png"))
    with Image.open(out) as im:
        assert im.info["transparency"] == step and np.array_equal(np.asarray(im), raw * step)
        alpha = np.asarray(im.convert("LA"))[..., 1]
    assert np.array_equal(alpha == 0, raw == 1)


def test_check_identical_compares_palette_and_transparency():
    """api.check_identical (verify, and the tests' round trips) sees an image as it looks: since 0.10.6 its
    palette and its transparency too, not only its pixel values (a palette's indices, a grey level)."""
    grey = images.from_pil(Image.fromarray(RNG.integers(0, 256, (5, 6), np.uint8), "L"))
    keyed = replace(grey, meta={**grey.meta, "transparency": 7})
    api.check_identical([keyed], [replace(keyed, meta=dict(keyed.meta))])
    for a, b in ((grey, keyed), (keyed, replace(keyed, meta={**keyed.meta, "transparency": 8}))):
        with pytest.raises(DecodeMismatchError, match="pixels differ"):
            api.check_identical([a], [b])
    pal = images.from_pil(_palette_image(9, 7, palette=RNG.permutation(256)[:51].astype(np.uint8).tobytes()))
    other = bytearray(bytes.fromhex(pal.meta["palette"]))
    other[-1] ^= 1  # the 17th colour's blue, which no pixel uses (indices 0 - 15): the pixels' colours stay
    with pytest.raises(DecodeMismatchError, match="pixels differ"):
        api.check_identical([pal], [replace(pal, meta={**pal.meta, "palette": other.hex()})])


def test_palette_with_alpha_channel_PA(model):
    # Pillow cannot save PA, so it only arrives in memory; still lossless
    la = Image.fromarray(RNG.integers(0, 16, (9, 7, 2), np.uint8), "LA")
    for pal in (RNG.permutation(256)[:48].astype(np.uint8).tobytes(), bytes(48)):  # colours / indices
        pa = Image.frombytes("PA", (7, 9), la.tobytes())
        pa.putpalette(pal)
        src = images.from_pil(pa)
        assert src.meta["palette_coded"] == ("colors" if pal[0] or pal[1] else "indices")
        (back,) = _round_trip(model, [src])
        _assert_same_image(pa, pa.info, images.to_pil(back))


@pytest.mark.parametrize("kind", ["smooth", "quantized", "random"])
def test_palette_images_are_coded_the_cheaper_way(model, kind):
    """choose_palette_coding keeps the colours where they code in fewer bits than the index plane
    (seed codec plus header), else switches to the indices; the choice is the smaller file, and it
    decodes."""
    img = {"smooth": _smooth_palette_image(32, 40), "quantized": _quantized_image(32, 40),
           "random": _palette_image(32, 40, palette=RNG.permutation(256)[:48].astype(np.uint8).tobytes())}[kind]
    src = images.from_pil(img)
    assert src.meta["palette_coded"] == "colors" and not src.coding_chosen
    alt = images.palette_as_indices(src)
    assert alt.meta["palette_coded"] == "indices" and "palette_used" not in alt.meta and alt.color is None
    _assert_same_image(img, img.info, images.to_pil(alt))  # the same image either way
    (chosen,) = api.choose_palette_coding([src], 5)
    cheaper = {"smooth": "colors", "quantized": "indices", "random": "indices"}[kind]
    assert chosen.meta["palette_coded"] == cheaper
    assert chosen.coding_chosen and not src.coding_chosen  # the caller's object is left as it was
    assert api.choose_palette_coding([chosen], 5)[0] is chosen  # chosen once: a second call does nothing
    # compress makes the choice itself; the file is smaller than the other way's
    data, _ = api.compress([src], model, "chain", {"steps": 64}, fallback="both")
    other = replace(src if cheaper == "indices" else alt, coding_chosen=True)
    data_other, _ = api.compress([other], model, "chain", {"steps": 64}, fallback="both")
    assert len(data) < len(data_other)
    assert api.read_header(data)["meta"]["0"]["palette_coded"] == cheaper
    (back,) = api.decompress(data, model)
    _assert_same_image(img, img.info, images.to_pil(back))


def test_palette_choice_on_a_sample_of_large_images(monkeypatch):
    """Above PALETTE_SAMPLE pixels a side the two ways are compared on the centre square only."""
    from scoreflow_codec.coding import seed_codec

    seen = []
    real = seed_codec.seed_bits
    monkeypatch.setattr(seed_codec, "seed_bits", lambda planes, v: seen.append(planes.shape) or real(planes, v))
    monkeypatch.setattr(api, "PALETTE_SAMPLE", 16)
    for img, way in ((_smooth_palette_image(32, 40), "colors"), (_quantized_image(40, 24), "indices")):
        seen.clear()
        (chosen,) = api.choose_palette_coding([images.from_pil(img)], 5)
        assert chosen.meta["palette_coded"] == way
        assert sorted(seen) == [(1, 16, 16), (3, 16, 16)]


def test_palette_as_indices_only_for_colour_coded_palettes():
    assert images.palette_as_indices(images.from_pil(Image.fromarray(_rgb(4, 5)))) is None
    dup = images.from_pil(_palette_image(4, 5, palette=bytes(48)))
    assert dup.meta["palette_coded"] == "indices" and images.palette_as_indices(dup) is None
    la = Image.fromarray(RNG.integers(0, 16, (9, 7, 2), np.uint8), "LA")
    pa = Image.frombytes("PA", (7, 9), la.tobytes())
    pa.putpalette(RNG.permutation(256)[:48].astype(np.uint8).tobytes())
    src = images.from_pil(pa)
    alt = images.palette_as_indices(src)
    assert src.extra.shape == (1, 9, 7) and alt.extra.shape == (2, 9, 7)  # alpha kept, after the indices
    _assert_same_image(pa, pa.info, images.to_pil(alt))


def test_every_mode_in_one_stream(model, tmp_path):
    """All the odd sizes and modes in one file, chain mode: each comes back exactly."""
    srcs, origs = [], []
    for case, (name, img, kw) in _cases().items():
        path = _write(tmp_path, f"{case}_{name}", img, **kw)
        origs.append(_reopen(path))
        srcs.append(images.load_image(path))
    back = _round_trip(model, srcs, "chain", {"steps": 64})
    for (orig, info), b in zip(origs, back):
        _assert_same_image(orig, info, images.to_pil(b))


def test_exif_orientation_is_not_applied(model, tmp_path):
    """A JPEG tagged "rotate 90": we code the stored pixels as Pillow decodes them, unrotated;
    the tag (and all other metadata) is not kept, so the output shows the stored orientation."""
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 CW to display
    path = _write(tmp_path, "rot.jpg", Image.fromarray(_rgb(16, 24)), exif=exif.tobytes(), quality=90)
    orig, _ = _reopen(path)
    assert orig.getexif().get(0x0112) == 6
    src = images.load_image(path)
    assert src.size == (24, 16) == orig.size  # not transposed
    (back,) = _round_trip(model, [src])
    restored = images.to_pil(back)
    assert np.array_equal(np.asarray(restored), np.asarray(orig))
    out = tmp_path / "out.png"
    out.write_bytes(images.encode_image(restored, ".png"))
    again, _ = _reopen(out)
    assert again.getexif().get(0x0112) is None and again.size == (24, 16)


def _refused(path, cls, *words):
    with pytest.raises(cls) as e:
        images.load_image(path)
    msg = str(e.value)
    assert msg and "\n" not in msg
    for w in words:
        assert w in msg, msg
    return e.value


def test_32_bit_and_float_are_refused(tmp_path):
    """16-bit images are coded since 0.9.28 (tests/test_deep.py); 32-bit integer and float ones are not."""
    p16 = _write(tmp_path, "a.png", Image.fromarray(RNG.integers(0, 65536, (8, 8), np.uint16)))
    assert Image.open(p16).mode.startswith("I;16") and images.load_image(p16).mode == "L;16"
    p32 = _write(tmp_path, "i.tif", Image.fromarray(RNG.integers(0, 2**31, (4, 4)).astype(np.int32), "I"))
    _refused(p32, UnsupportedImageError, "32-bit", "8 or 16 bits")
    pf = _write(tmp_path, "f.tif", Image.fromarray(RNG.random((4, 4)).astype(np.float32), "F"))
    _refused(pf, UnsupportedImageError, "float")
    with pytest.raises(UnsupportedImageError):
        images.from_array(np.zeros((4, 4), np.int32))
    with pytest.raises(UnsupportedImageError):
        images.from_array(np.zeros((4, 4, 5), np.uint8))
    with pytest.raises(UnsupportedImageError):
        images.from_array(np.zeros((4, 4, 5), np.uint16))


@pytest.mark.parametrize("suffix", [".jpg", ".tif"])
def test_cmyk_is_refused(tmp_path, suffix):
    path = _write(tmp_path, "c" + suffix, Image.fromarray(RNG.integers(0, 256, (8, 8, 4), np.uint8), "CMYK"))
    _refused(path, UnsupportedImageError, "CMYK", "RGB")


@pytest.mark.parametrize("suffix", [".gif", ".png"])
def test_animations_are_refused(tmp_path, suffix):
    frames = [Image.fromarray(_rgb(8, 8)) for _ in range(3)]
    path = tmp_path / ("anim" + suffix)
    frames[0].save(path, save_all=True, append_images=frames[1:])
    _refused(path, UnsupportedImageError, "animated", "3 frames")


def test_tiffs_of_several_pages_are_refused_as_such(tmp_path):
    """A TIFF of several pages is not an animation, and is said to be one no more (0.10.6)."""
    pages = [Image.fromarray(_rgb(8, 8)) for _ in range(3)]
    path = tmp_path / "scan.tif"
    pages[0].save(path, save_all=True, append_images=pages[1:])
    e = _refused(path, UnsupportedImageError, "TIFFs of several pages", "3 pages", "PNG")
    assert "animated" not in str(e)


def test_more_bits_than_pillow_reads_are_refused(tmp_path):
    """0.10.6: a JPEG 2000 image of more than 8 bits per sample in colour (16 in grey) and an AVIF of more
    than 8, which Pillow hands over as 8-bit: refused, where they were coded as those 8 bits and reported
    as a success. 8-bit ones, and a 16-bit grey JPEG 2000 (Pillow's I;16), are coded as before."""
    imagecodecs = pytest.importorskip("imagecodecs", reason="imagecodecs (the test extra) writes the files")
    rgb16 = RNG.integers(0, 65536, (12, 10, 3)).astype(np.uint16)
    cases = [("a.jp2", imagecodecs.jpeg2k_encode(rgb16, level=0), "JPEG 2000 image of 16 bits", "RGB"),
             ("b.jp2", imagecodecs.jpeg2k_encode(rgb16[..., :2], level=0), "JPEG 2000 image of 16 bits", "LA")]
    if imagecodecs.AVIF.available:
        ten = (rgb16 >> 6).astype(np.uint16)
        cases.append(("c.avif", imagecodecs.avif_encode(ten, level=100, bitspersample=10), "AVIF image of 10 bits",
                      "RGB"))
    for name, data, words, mode in cases:
        path = tmp_path / name
        path.write_bytes(data)
        with Image.open(path) as im:
            assert im.mode == mode and np.asarray(im).dtype == np.uint8  # what Pillow gives: 8 bits
        _refused(path, UnsupportedImageError, words, "16-bit PNG or TIFF")
    grey = _write(tmp_path, "g.jp2", Image.fromarray(rgb16[..., 0]))
    assert np.array_equal(images.to_array(images.load_image(grey))[..., 0], rgb16[..., 0])
    for name, kw in (("d.jp2", {"irreversible": False}), ("e.avif", {"quality": 90})):
        path = _write(tmp_path, name, Image.fromarray(_rgb(12, 10)), **kw)
        with Image.open(path) as im:
            assert np.array_equal(images.to_array(images.load_image(path)), np.asarray(im))


def test_multi_picture_jpegs_are_refused_as_such(tmp_path):
    """A phone's MPO (a JPEG with a second picture after the first): not an animation, and said so."""
    pics = [Image.fromarray(_rgb(8, 8)) for _ in range(2)]
    path = tmp_path / "phone.jpg"
    pics[0].save(path, format="MPO", save_all=True, append_images=pics[1:])
    with Image.open(path) as im:
        assert im.format == "MPO" and im.n_frames == 2
    _refused(path, UnsupportedImageError, "multi-picture JPEG", "MPO, 2 pictures", "PNG")


def test_truncated_png_is_refused(tmp_path):
    good = _write(tmp_path, "a.png", Image.fromarray(_rgb(33, 31)))
    data = good.read_bytes()
    for k in (8, 40, len(data) // 2, len(data) - 30):
        cut = tmp_path / f"cut{k}.png"
        cut.write_bytes(data[:k])
        e = _refused(cut, BadImageError, str(cut))
        assert not isinstance(e, UnsupportedImageError)
    # Cut after the last image data (only IEND missing): Pillow has every pixel; accepted as is.
    cut = tmp_path / "noiend.png"
    cut.write_bytes(data[:-12])
    assert np.array_equal(np.asarray(images.to_pil(images.load_image(cut))), np.asarray(Image.open(good)))


def test_non_images_are_refused(tmp_path):
    (tmp_path / "t.png").write_text("hello, not a picture")
    _refused(tmp_path / "t.png", BadImageError, "not an image")
    (tmp_path / "e.png").write_bytes(b"")
    _refused(tmp_path / "e.png", BadImageError, "not an image")
    _refused(tmp_path / "missing.png", BadImageError, "no such file")
    _refused(tmp_path, BadImageError, "directory")
    with pytest.raises(SfcError, match="nothing to compress"):
        api.compress([], loaded_gaussian())


def _tiff_with(path, tags: dict, size=(16, 10)) -> None:
    from PIL import TiffImagePlugin

    info = TiffImagePlugin.ImageFileDirectory_v2()
    for tag, (value, kind) in tags.items():
        info[tag] = value
        info.tagtype[tag] = kind
    Image.fromarray(np.full((size[1], size[0], 3), 77, np.uint8)).save(path, format="TIFF", tiffinfo=info)


def test_camera_raw_files_are_refused_not_coded_as_their_preview(tmp_path):
    """Pillow opens many camera raw files (TIFF-like) as their first picture, a small preview: coding that
    would look like success and keep a thumbnail. Refused by name (.dng, .nef, .cr2, ... any case), and a
    TIFF by its first directory: a DNG (DNGVersion), or a picture marked a reduced-resolution copy
    (NewSubfileType bit 0). A TIFF marked a full-resolution picture (NewSubfileType 0, 2: a page) is coded."""
    dng = {50706: (b"\x01\x04\x00\x00", 1), 254: (1, 4)}
    _tiff_with(tmp_path / "a.tif", dng)
    _refused(tmp_path / "a.tif", UnsupportedImageError, "camera raw file (DNG)", "16x10 preview", "16-bit TIFF")
    _tiff_with(tmp_path / "b.tif", {254: (1, 4)})
    _refused(tmp_path / "b.tif", UnsupportedImageError, "reduced-resolution preview", "camera raw file?")
    for name in ("c.DNG", "d.nef", "e.cr2", "f.ARW"):
        _tiff_with(tmp_path / name, {})  # whatever is inside: refused by the name before it is read
        _refused(tmp_path / name, UnsupportedImageError, "camera raw files", "not supported")
    for kind in (0, 2):
        _tiff_with(tmp_path / f"full{kind}.tif", {254: (kind, 4)})
        assert images.load_image(tmp_path / f"full{kind}.tif").size == (16, 10)



def _png_header_only(path, w: int, h: int):
    """A PNG of w x h grey pixels whose data stops after a few bytes: its header gives the size."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(bytes(64))) + chunk(b"IEND", b""))
    return path


def test_the_size_limit_is_ours_not_pillows(tmp_path):
    """MAX_PIXELS (100 Mpix) is checked from the header, before any pixel is decoded; Pillow's
    decompression-bomb guard says nothing: no warning for 89.5 - 100 Mpix (three lines of Python on
    stderr before 0.9.34), and above 179 Mpix "too large" with the count, not "not an image Pillow can
    read"."""
    import warnings

    cases = ((9500, 9500, BadImageError, "truncated"),  # under our limit: read, and its data is cut short
             (15000, 10000, UnsupportedImageError, "image too large: 15000x10000 pixels (limit 100,000,000)"),
             (100000, 100000, UnsupportedImageError, "image too large: 10,000,000,000 pixels (limit 100,000,000)"))
    for w, h, error, words in cases:
        p = _png_header_only(tmp_path / f"{w}x{h}.png", w, h)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # any warning fails the test
            with pytest.raises(error) as e:
                images.load_image(p)
            assert words in str(e.value) and str(e.value).startswith(str(p)), e.value
            if w * h < 2 * Image.MAX_IMAGE_PIXELS:
                assert images.peek(p) == (w, h, False)


def test_peek_gives_the_size_and_depth_without_the_pixels(tmp_path):
    """images.peek (sfcodec -d's memory estimate): the size and whether the samples are 16-bit, for every
    kind load_image reads: 8-bit, 16-bit grey, 48-bit PNG (which Pillow opens as 8-bit RGB) and TIFF; a
    file Pillow cannot read is a BadImageError."""
    from deep_files import png16_by_hand, tiff16_by_hand

    arr = np.random.default_rng(0).integers(0, 1 << 16, (5, 7, 3), dtype=np.uint16)
    (tmp_path / "c.png").write_bytes(png16_by_hand(arr, interlace=False))
    (tmp_path / "c.tif").write_bytes(tiff16_by_hand(arr))
    Image.fromarray(arr[:, :, 0]).save(tmp_path / "g.png")
    Image.fromarray((arr >> 8).astype(np.uint8)).save(tmp_path / "e.png")
    for name, deep in (("c.png", True), ("c.tif", True), ("g.png", True), ("e.png", False)):
        assert images.peek(tmp_path / name) == (7, 5, deep)
        assert images.load_image(tmp_path / name).deep == deep
    (tmp_path / "x.png").write_bytes(b"not an image")
    for bad in (tmp_path / "x.png", tmp_path / "none.png"):
        with pytest.raises(BadImageError):
            images.peek(bad)


def test_read_npz_names_what_is_wrong_with_the_file(tmp_path):
    """images.read_npz (0.9.33: sfcodec eval's, the trainer's and the bench's .npz reader, three before):
    the "images" array and the asked-for others it holds; one BadImageError naming the file for a missing
    file, a file that is not an .npz (numpy's words about pickles before), one cut short, one without
    "images" (naming what it holds)."""
    x = np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3)
    np.savez(tmp_path / "a.npz", images=x, index=np.array([7, 9]), labels=np.array([1, 2]))
    z = images.read_npz(tmp_path / "a.npz", also=("index", "absent"))
    assert sorted(z) == ["images", "index"] and np.array_equal(z["images"], x) and z["index"].tolist() == [7, 9]
    assert sorted(images.read_npz(tmp_path / "a.npz")) == ["images"]
    np.savez(tmp_path / "other.npz", pixels=x, y=x)
    (tmp_path / "text.npz").write_text("hello")
    (tmp_path / "cut.npz").write_bytes((tmp_path / "a.npz").read_bytes()[:200])
    np.savez(tmp_path / "empty.npz")
    for name, words in (("missing.npz", "missing.npz: no such file"), ("text.npz", "text.npz: not an .npz file"),
                        ("cut.npz", "cut.npz: not"), ("other.npz", "other.npz: no 'images' array in the .npz (it holds: pixels, y)"),
                        ("empty.npz", "(it holds: nothing)")):
        with pytest.raises(BadImageError) as e:
            images.read_npz(tmp_path / name)
        assert words in str(e.value) and "\n" not in str(e.value)
