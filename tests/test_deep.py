"""16-bit images (deep.py, coding/deep_codec.py): the split into high and low bits, the low-bit codec,
48/64-bit PNGs read and written, the codec's round trip and file format version 6, damage refused.

The PNG and TIFF readers are checked on files written by hand by the specifications (deep_files.py:
every PNG filter type, Adam7 interlacing; TIFF byte orders, strips, Deflate, the predictor), and
against imagecodecs' libpng and libtiff where it is installed; the low-bit codec's
contexts against a pixel-by-pixel reference written from its docstring."""
from __future__ import annotations

import struct
import zlib
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from PIL import Image

from scoreflow_codec import api, container, deep, images
from scoreflow_codec.coding import deep_codec as dc
from scoreflow_codec.coding.ans import Message
from scoreflow_codec.coding.distributions import categorical
from scoreflow_codec.errors import BadFileError, DecodeMismatchError, SfcError, UnsupportedImageError
from deep_files import png16_by_hand, tiff16_by_hand, with_chunk

RNG = np.random.default_rng(16)


def smooth16(h: int, w: int, c: int, noise: float = 30.0, seed: int = 0) -> np.ndarray:
    """A smooth 16-bit field (gradients, a ripple) plus Gaussian noise of `noise` 16-bit units."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    planes = [20000 + 300 * xx + 170 * yy * (k + 1) + 4000 * np.sin(xx / 7 + k) * np.cos(yy / 5) for k in range(c)]
    u = np.stack(planes, -1) + rng.normal(0, noise, (h, w, c))
    return np.clip(np.round(u), 0, 65535).astype(np.uint16)


# --- split / join ---------------------------------------------------------------------------------


def _roundtrip(u: np.ndarray) -> dict:
    hi, lo, table, info = deep.split(u)
    deep.check(info)
    assert hi.dtype == np.uint8 and (lo is None or (lo.dtype == np.uint8 and int(lo.max()) >> info["low"] == 0))
    assert np.array_equal(deep.join(hi, lo, table, info), u)
    return info


def test_split_finds_how_many_bits_the_samples_have():
    v8 = RNG.integers(0, 256, (3, 9, 11))
    assert _roundtrip((v8 * 257).astype(np.uint16)) == {"x257": 1}  # an 8-bit image widened
    assert _roundtrip((v8 << 8).astype(np.uint16)) == {"shift": 8, "table": 0, "low": 0}  # shifted up: 8 bits
    v12 = RNG.integers(0, 4096, (3, 64, 64))
    assert _roundtrip((v12 << 4).astype(np.uint16)) == {"shift": 4, "table": 0, "low": 4}  # 12-bit, left aligned
    assert _roundtrip(v12.astype(np.uint16)) == {"shift": 0, "table": 0, "low": 4}  # 12-bit, right aligned
    scaled = (v12 * 65535 // 4095).astype(np.uint16)  # 12-bit scaled to 16: at most 4096 values, 16 bits apart
    info = _roundtrip(scaled)
    assert info["table"] == len(np.unique(scaled)) and info["low"] == 4
    assert _roundtrip(RNG.integers(0, 65536, (1, 30, 30), dtype=np.uint16)) == {"shift": 0, "table": 0, "low": 8}
    assert _roundtrip(np.full((2, 7, 7), 5, np.uint16)) == {"shift": 0, "table": 1, "low": 0}  # one value: no bits
    assert _roundtrip(np.full((1, 1, 1), 1000, np.uint16)) == {"shift": 3, "table": 0, "low": 0}  # 125: 7 bits


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 4), st.integers(1, 12), st.integers(1, 12), st.integers(0, 15), st.integers(1, 16),
       st.booleans(), st.integers(0, 2**32 - 1))
def test_split_join_any_image(c, h, w, shift, span, few, seed):
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 1 << max(span - shift, 0) if span > shift else 1, (c, h, w))
    if few:  # a few distinct values far apart
        values = rng.choice(np.unique(values)[:5], (c, h, w))
    _roundtrip((values << shift).astype(np.uint16))


@pytest.mark.parametrize("bad", [None, [], {"x257": 2}, {"x257": 1, "low": 0}, {"shift": 0, "table": 0},
                                 {"shift": 16, "table": 0, "low": 0}, {"shift": 0, "table": 0, "low": 9},
                                 {"shift": 4, "table": 0, "low": 8}, {"shift": 0, "table": 0, "low": True},
                                 {"shift": 0, "table": 257, "low": 0}, {"shift": 8, "table": 300, "low": 1},
                                 {"shift": 0, "table": -1, "low": 0}, {"shift": 0.0, "table": 0, "low": 0}])
def test_a_bad_description_is_refused(bad):
    with pytest.raises(BadFileError, match="16-bit description"):
        deep.check(bad)


def test_join_refuses_values_beyond_16_bits_or_the_table():
    hi = np.full((1, 2, 2), 255, np.uint8)
    with pytest.raises(BadFileError, match="beyond its table"):
        deep.join(hi, None, np.arange(10, dtype=np.uint16), {"shift": 0, "table": 10, "low": 0})
    with pytest.raises(BadFileError, match="beyond 16 bits"):
        deep.join(hi, None, np.full(256, 65535, np.uint16), {"shift": 1, "table": 256, "low": 0})


def test_value_table_round_trip_and_damage():
    table = np.unique(RNG.integers(0, 4096, 500)).astype(np.uint16)  # values of 12 bits (16 - shift 4)
    m = Message()
    bits = deep.push_table(m, table)
    assert np.array_equal(deep.pop_table(Message(m.words()), len(table), 4), table)
    assert abs(32 * len(m.words()) - bits) < 64
    with pytest.raises(BadFileError, match="value table"):  # values beyond 16 - 12 bits
        deep.pop_table(Message(m.words()), len(table), 12)


# --- the low-bit codec ------------------------------------------------------------------------------


def _lowbits(u: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """([C, H, W] high byte, low bits) of the top 8 + bits bits of u [H, W, C]."""
    v = u.transpose(2, 0, 1).astype(np.int64) >> (8 - bits)
    return (v >> bits).astype(np.uint8), (v & ((1 << bits) - 1)).astype(np.uint8)


@pytest.mark.parametrize("bits", [1, 3, 8])
@pytest.mark.parametrize("shape", [(1, 1, 1), (1, 7, 1), (5, 1, 3), (9, 13, 2), (24, 31, 4)])
def test_low_bits_round_trip_and_size(bits, shape):
    h, w, c = shape
    hi, lo = _lowbits(smooth16(h, w, c, noise=40.0, seed=h * w), bits)
    m = Message()
    predicted = dc.push(m, hi, lo, bits)
    back = Message(m.words())
    assert np.array_equal(dc.pop(back, hi, bits), lo) and back.is_empty()
    assert abs(m.num_bits() - predicted) <= 32  # the ANS state: one word at most


def test_constant_low_planes_cost_one_flag_and_value():
    hi = RNG.integers(0, 256, (3, 20, 20)).astype(np.uint8)
    lo = np.zeros((3, 20, 20), np.uint8)
    lo[1] = 200
    m = Message()
    assert dc.push(m, hi, lo, 8) == 3 * 1 + 3 * 8
    assert np.array_equal(dc.pop(Message(m.words()), hi, 8), lo)


def test_low_bits_of_smooth_data_cost_less_than_noise():
    """Smooth 16-bit data: the low byte costs far less than 8 bits; noise: about 8, never much more."""
    yy, xx = np.mgrid[0:48, 0:64]
    u = np.round(30000 + 200 * xx[..., None] + 3000 * np.sin(xx / 25 + yy / 40)[..., None] * np.arange(1, 4)
                 + RNG.normal(0, 2.0, (48, 64, 3))).astype(np.uint16)
    hi, lo = _lowbits(u, 8)
    assert dc.push(Message(), hi, lo, 8) / lo.size < 5.5  # 4.95 (0.9.28): residuals of about 10 units
    hi, lo = _lowbits(RNG.integers(0, 65536, (48, 64, 3), dtype=np.uint16), 8)
    assert 7.9 < dc.push(Message(), hi, lo, 8) / lo.size < 8.15  # 8.11: each context's theta, 17 bits


def _reference_rows(hi: np.ndarray, lo: np.ndarray, bits: int, chans) -> list:
    """(channel, y, x, p_lo, context) of every coded sample in decoding order, one pixel at a time as the
    docstring says: wavefronts t = x + 2y, then channels, then rows. The decoder's picture holds true
    values where decoded (earlier wavefronts; earlier channels of this one; constant planes) and bin
    centres elsewhere; a neighbour outside the image is read at the nearest pixel inside."""
    c_, h, w = hi.shape
    done = np.zeros((c_, h, w), bool)
    for c in range(c_):
        done[c] = chans[c].const is not None
    full = (hi.astype(np.int64) << bits) | lo

    def val(j, y, x, dy, dx):
        yy, xx = min(max(y + dy, 0), h - 1), min(max(x + dx, 0), w - 1)
        return int(full[j, yy, xx]) if done[j, yy, xx] else (int(hi[j, yy, xx]) << bits) + (1 << (bits - 1))

    out = []
    for t in range(w + 2 * h - 1):
        cells = [(y, t - 2 * y) for y in range(h) if 0 <= t - 2 * y < w]
        for c in range(c_):
            if chans[c].const is not None:
                continue
            for y, x in cells:
                nb = {k: np.array([val(c, y, x, dy, dx)]) for k, (dy, dx) in dc.OFFSETS.items()}
                for d in range(1, min(c, 2) + 1):
                    nb.update({f"X{d}": np.array([val(c - d, y, x, 0, 0)]),
                               f"C{d}": np.array([(int(hi[c - d, y, x]) << bits) + (1 << (bits - 1))]),
                               f"N{d}": np.array([val(c - d, y, x, -1, 0)]), f"W{d}": np.array([val(c - d, y, x, 0, -1)])})
                p = int(chans[c].predict(nb)[0]) - (int(hi[c, y, x]) << bits)
                out.append((c, y, x, min(max(p, 0), (1 << bits) - 1), int(dc.activity(nb)[0])))
            for y, x in cells:
                done[c, y, x] = True
    return out


def _reference_push(hi, lo, bits, chans) -> Message:
    """push's stack, built from _reference_rows: the pixels' symbols, then the channels' parameters."""
    rows = _reference_rows(hi, lo, bits, chans)
    tab = dc._tables(chans, bits)
    m = Message()
    if rows:
        x = np.array([lo[c, y, xx] for c, y, xx, _, _ in rows])
        categorical(np.stack([tab[c * dc.CONTEXTS + k, (1 << bits) - 1 - p] for c, _, _, p, k in rows])).push(m, x)
    for ch in reversed(chans):
        ch.push(m, bits)
    return m


def test_encoder_follows_the_reference():
    """The vectorized encoder's predictions and contexts are a plain loop's over the pixels: the same
    words from the same parameters."""
    h, w, c, bits = 7, 9, 3, 6
    hi, lo = _lowbits(smooth16(h, w, c, noise=300.0, seed=3), bits)
    lo[2] = 17  # a constant plane
    m = Message()
    dc.push(m, hi, lo, bits)
    back = Message(m.words())
    chans = [dc._Channel.pop(back, bits, k) for k in range(c)]
    assert chans[2].const == 17
    assert np.array_equal(_reference_push(hi, lo, bits, chans).words(), m.words())


@pytest.mark.parametrize("pred", dc.PREDICTORS)
def test_decoder_follows_the_reference(pred):
    """Each predictor (forced on every channel, its parameters set by hand): the decoder reads what the
    pixel-by-pixel reference pushed."""
    h, w, c, bits = 6, 10, 3, 8
    hi, lo = _lowbits(smooth16(h, w, c, noise=100.0, seed=4), bits)
    rng = np.random.default_rng(5)
    chans = [dc._Channel(pred=dc.PREDICTORS.index(pred),
                         weights=rng.integers(-3000, 3000, dc.n_features(k)).tolist() if pred == "linear" else None,
                         thetas=[40000 + 1000 * j for j in range(dc.CONTEXTS)]) for k in range(c)]
    m = _reference_push(hi, lo, bits, chans)
    assert np.array_equal(dc.pop(m, hi, bits), lo) and m.is_empty()


def test_counts_are_the_geometric_by_integer_steps():
    for theta in (0, 1, 30000, 65535):
        g = dc.counts(theta, 8)
        assert len(g) == 511 and np.array_equal(g, g[::-1])  # symmetric about residual 0
        r = np.arange(256)
        ref = dc.G0 * (theta / 65536.0) ** r + dc.FLOOR
        assert np.all(np.abs(g[255:] - ref) <= r + 1)  # one floor per step at most
        assert np.all(np.diff(g[255:]) <= 0)


@pytest.mark.parametrize("mean", [0.3, 1.0, 7.5, 120.0])
def test_fit_theta_gives_the_mean(mean):
    t = dc.fit_theta(mean) / 65536.0
    assert 2 * t / (1 - t * t) == pytest.approx(mean, rel=2e-3)  # E|r| of the two-sided geometric


def test_garbage_words_decode_to_something():
    hi = RNG.integers(0, 256, (3, 11, 13)).astype(np.uint8)
    for seed in range(5):
        words = np.random.default_rng(seed).integers(1, 2**32, 40, dtype=np.uint32)
        lo = dc.pop(Message(words), hi, 5)
        assert lo.shape == hi.shape and int(lo.max()) < 32


# --- PNG files ----------------------------------------------------------------------------------------


MODES = {1: "L;16", 2: "LA;16", 3: "RGB;16", 4: "RGBA;16"}


@pytest.mark.parametrize("compression,predictor", [(1, 1), (8, 1), (8, 2)], ids=["raw", "deflate", "deflate_pred"])
@pytest.mark.parametrize("endian", ["<", ">"], ids=["II", "MM"])
@pytest.mark.parametrize("c", [1, 3, 4])
def test_a_16_bit_tiff_is_read_whole(tmp_path, c, endian, compression, predictor):
    """48/64-bit TIFFs (and 16-bit grey) of either byte order, uncompressed or Deflate, with or without
    horizontal differencing, in strips of 4 rows: every bit (Pillow alone gives the high bytes)."""
    arr = RNG.integers(0, 65536, (9, 7, c), dtype=np.uint16)
    p = tmp_path / "a.tif"
    p.write_bytes(tiff16_by_hand(arr, compression, predictor, endian, rows_per_strip=4))
    src = images.load_image(p)
    assert src.mode == MODES[c] and np.array_equal(images.to_array(src), arr)
    imagecodecs = pytest.importorskip("imagecodecs", reason="imagecodecs (the test extra) reads TIFFs with libtiff")
    assert np.array_equal(imagecodecs.tiff_decode(p.read_bytes()).reshape(arr.shape), arr)  # the file is right


@pytest.mark.parametrize("interlace", [False, True])
@pytest.mark.parametrize("c", [1, 2, 3, 4])
def test_a_16_bit_png_is_read_whole(tmp_path, c, interlace):
    arr = RNG.integers(0, 65536, (13, 11, c), dtype=np.uint16)
    p = tmp_path / "a.png"
    p.write_bytes(png16_by_hand(arr, interlace, seed=c))
    src = images.load_image(p)
    assert src.mode == MODES[c] and src.deep and src.size == (11, 13)
    assert np.array_equal(images.to_array(src), arr)


@pytest.mark.parametrize("c", [1, 2, 3, 4])
def test_written_png_is_a_16_bit_png(tmp_path, c):
    arr = smooth16(17, 23, c)
    src = images.from_array(arr)
    png = images.encode_source(src, ".png")
    width, height, depth, ctype = struct.unpack(">IIBB", png[16:26])
    assert (width, height, depth, ctype) == (23, 17, 16, {1: 0, 2: 4, 3: 2, 4: 6}[c])
    p = tmp_path / "w.png"
    p.write_bytes(png)
    assert np.array_equal(images.to_array(images.load_image(p)), arr)
    seen = np.asarray(Image.open(p))  # Pillow: grey whole (I;16), colour as its high bytes (grey + alpha as RGBA)
    high = (arr >> 8).astype(np.uint8)
    want = arr[..., 0] if c == 1 else high[..., [0, 0, 0, 1]] if c == 2 else high
    assert np.array_equal(seen, want)
    imagecodecs = pytest.importorskip("imagecodecs", reason="imagecodecs (the test extra) reads PNGs with libpng")
    assert np.array_equal(imagecodecs.png_decode(png).reshape(arr.shape), arr)


@pytest.mark.parametrize("kind", [0, 1, 2, 3, 4], ids=["none", "sub", "up", "average", "paeth"])
def test_each_png_filter_the_writer_has(tmp_path, kind):
    """Every row with one filter type (the writer picks per row; each must be right on its own): Pillow's
    decoder (and libpng's) gives the samples back."""
    arr = RNG.integers(0, 65536, (7, 9, 3), dtype=np.uint16)
    arr[3:] = arr[3:] // 7 + 1000  # rows where a smaller filter output differs from the raw one
    rows = np.ascontiguousarray(arr, dtype=">u2").view(np.uint8).reshape(7, -1)
    idat = zlib.compress(deep._filtered(rows, 6, only=kind))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 9, 7, 16, 2, 0, 0, 0))
           + chunk(b"IDAT", idat) + chunk(b"IEND", b""))
    assert zlib.decompress(idat)[0] == kind  # the first row's filter byte
    p = tmp_path / "f.png"
    p.write_bytes(png)
    assert np.array_equal(images.to_array(images.load_image(p)), arr)


def test_decoder_knows_a_constant_earlier_channel():
    """A constant low plane is known whole before any pixel: a later channel's prediction from it at the
    pixel (its value, N and W) is the encoder's."""
    h, w, c, bits = 6, 10, 3, 8
    hi, lo = _lowbits(smooth16(h, w, c, noise=100.0, seed=7), bits)
    lo[0] = 77
    rng = np.random.default_rng(8)
    chans = [dc._Channel(const=77)] + [dc._Channel(pred=1, weights=rng.integers(-3000, 3000, dc.n_features(k)).tolist(),
                                                   thetas=[40000] * dc.CONTEXTS) for k in (1, 2)]
    m = _reference_push(hi, lo, bits, chans)
    assert np.array_equal(dc.pop(m, hi, bits), lo) and m.is_empty()


def test_metadata_after_the_pixels_is_read(tmp_path):
    """A 48-bit PNG's text chunk after its IDAT is kept, as for an 8-bit PNG (Pillow reads it on load)."""
    arr = RNG.integers(0, 65536, (5, 6, 3), dtype=np.uint16)
    p = tmp_path / "t.png"
    p.write_bytes(with_chunk(png16_by_hand(arr, False), b"tEXt", b"Comment\0after the pixels", before=b"IEND"))
    src = images.load_image(p)
    assert src.metadata.get("text") == [["Comment", "after the pixels"]] and np.array_equal(images.to_array(src), arr)


def test_written_png_keeps_metadata(tmp_path):
    arr = smooth16(8, 9, 3)
    src = images.from_array(arr)
    src.metadata = {"icc": bytes(range(200)), "dpi": [300.0, 300.0], "gamma": 0.45455,
                    "text": [["Title", "deep"]]}
    p = tmp_path / "m.png"
    p.write_bytes(images.encode_source(src, ".png"))
    kinds, pos, data = [], 8, p.read_bytes()
    while pos < len(data):
        n = struct.unpack_from(">I", data, pos)[0]
        kinds.append(data[pos + 4:pos + 8])
        assert struct.unpack_from(">I", data, pos + 8 + n)[0] == zlib.crc32(data[pos + 4:pos + 8 + n])
        pos += 12 + n
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and kinds.count(b"IDAT") == 1
    assert {b"iCCP", b"pHYs", b"gAMA", b"tEXt"} <= set(kinds[:kinds.index(b"IDAT")])
    back = images.load_image(p)
    assert back.metadata["dpi"] == pytest.approx([300.0, 300.0], abs=1e-3)  # pHYs: pixels a metre
    assert back.metadata["text"] == [["Title", "deep"]] and back.metadata["icc"] == bytes(range(200))
    assert np.array_equal(images.to_array(back), arr)


@pytest.mark.parametrize("c", [1, 3, 4])
def test_written_tiff_is_a_16_bit_tiff(tmp_path, c):
    """decompress's 16-bit TIFF (Deflate, the predictor, strips): read back whole by us and by libtiff,
    with its ICC profile, resolution, EXIF and XMP; Pillow alone gives the high bytes."""
    arr = RNG.integers(0, 65536, (37, 301, c), dtype=np.uint16)  # several strips
    src = images.from_array(arr)
    exif = Image.Exif()
    exif[0x010F] = "Camera"
    src.metadata = {"icc": bytes(range(77)), "dpi": [300.0, 150.0], "text": [["Title", "not in a TIFF"]],
                    "xmp": b"<x:xmpmeta>16</x:xmpmeta>", "exif": exif.tobytes()[6:]}
    data = images.encode_source(src, ".tif")
    p = tmp_path / "w.tif"
    p.write_bytes(data)
    back = images.load_image(p)
    assert back.mode == MODES[c] and np.array_equal(images.to_array(back), arr)
    assert back.metadata == {k: v for k, v in src.metadata.items() if k != "text"}  # what a TIFF holds
    assert images.metadata_dropped(src.metadata, ".tif") == ["PNG text"]  # the rest: decompress's warning
    seen = np.asarray(Image.open(p))
    assert np.array_equal(seen, arr[..., 0] if c == 1 else (arr >> 8).astype(np.uint8))
    imagecodecs = pytest.importorskip("imagecodecs", reason="imagecodecs (the test extra) reads TIFFs with libtiff")
    assert np.array_equal(imagecodecs.tiff_decode(data).reshape(arr.shape), arr)


def test_16_bit_images_only_as_png_or_tiff():
    src = images.from_array(smooth16(4, 4, 3))
    for suffix in (".webp", ".bmp", ".ppm"):
        with pytest.raises(UnsupportedImageError, match="16-bit"):
            images.encode_source(src, suffix)
    la = images.from_array(smooth16(4, 4, 2))
    with pytest.raises(UnsupportedImageError, match="only be written as PNG"):
        images.encode_source(la, ".tif")
    with pytest.raises(UnsupportedImageError, match="to_array"):
        images.to_pil(src)


@pytest.mark.parametrize("c", [1, 3])
def test_a_16_bit_pngs_transparent_colour_is_kept(tmp_path, c):
    """A 16-bit grey or 48-bit RGB PNG with a transparent colour (tRNS: 16-bit values), refused until
    0.10.6: coded, and written back into the 16-bit PNG (the same chunk); a TIFF output goes without it,
    which decompress names (images.metadata_dropped); verify compares it (api.check_identical)."""
    arr = RNG.integers(0, 65536, (6, 5, c), dtype=np.uint16)
    key = (258, 772, 1286)[:c]
    p = tmp_path / "t.png"
    p.write_bytes(with_chunk(png16_by_hand(arr, False), b"tRNS", struct.pack(f">{c}H", *key), before=b"IDAT"))
    src = images.load_image(p)
    assert src.mode == MODES[c] and src.meta["transparency"] == (list(key) if c == 3 else key[0])
    data, _ = api.compress([src], None, fallback="seed")
    (back,) = api.decompress(data)
    api.check_identical([src], [back])
    with pytest.raises(DecodeMismatchError):
        api.check_identical([src], [replace(back, meta={k: v for k, v in back.meta.items() if k != "transparency"})])
    out = tmp_path / "out.png"
    out.write_bytes(images.encode_source(back, ".png"))
    with Image.open(out) as im:
        assert im.info["transparency"] == (key if c == 3 else key[0])
    again = images.load_image(out)
    assert np.array_equal(images.to_array(again), arr) and again.meta["transparency"] == src.meta["transparency"]
    assert images.metadata_dropped({}, ".tif", back.meta) == ["transparency"]
    assert images.metadata_dropped({}, ".png", back.meta) == []


def test_what_16_bit_input_is_refused(tmp_path):
    arr = RNG.integers(0, 65536, (4, 4, 3), dtype=np.uint16)
    two = tmp_path / "two.tif"  # a 16-bit TIFF of two pictures
    one = tiff16_by_hand(arr, 1, 1, "<")
    (tmp_path / "x.tif").write_bytes(one)
    Image.open(tmp_path / "x.tif")  # readable alone
    ifd_at = struct.unpack_from("<I", one, 4)[0]
    n = struct.unpack_from("<H", one, ifd_at)[0]
    second = len(one)
    two.write_bytes(one[:ifd_at + 2 + 12 * n] + struct.pack("<I", second) + one[ifd_at + 6 + 12 * n:] + one[ifd_at:ifd_at + 2 + 12 * n] + b"\0\0\0\0")
    with pytest.raises(UnsupportedImageError, match="one picture"):
        images.load_image(two)
    q = tmp_path / "i.tif"
    Image.fromarray(RNG.integers(0, 2**31, (4, 4)).astype(np.int32), "I").save(q)
    with pytest.raises(UnsupportedImageError, match="32-bit"):
        images.load_image(q)
    with pytest.raises(UnsupportedImageError, match="uint8 or uint16"):
        images.from_array(np.zeros((4, 4), np.uint32))


def _pnm(kind: str, arr: np.ndarray, maxval: int, comment: bool = False) -> bytes:
    """A PGM / PPM written by the Netpbm specification: P5 / P6 with big-endian 16-bit samples (maxval above
    255), or plain P2 / P3 with decimal samples; a comment line after the magic number."""
    h, w = arr.shape[:2]
    head = f"{kind}\n{'# written by hand' + chr(10) if comment else ''}{w} {h}\n{maxval}\n".encode()
    if kind in ("P5", "P6"):
        return head + arr.astype(">u2").tobytes()
    rows = (" ".join(str(int(v)) for v in row.ravel()) + (" # a comment\n" if comment else "\n") for row in arr)
    return head + "".join(rows).encode()


@pytest.mark.parametrize("kind,c", [("P5", 1), ("P6", 3), ("P2", 1), ("P3", 3)])
@pytest.mark.parametrize("maxval", [65535, 4095, 300])
def test_a_16_bit_pgm_or_ppm_is_read_whole(tmp_path, kind, c, maxval):
    """0.10.6: a PGM or PPM with samples above 8 bits (dcraw's 16-bit output). Pillow gives a PPM's as 8-bit
    RGB (scaled to 0 - 255: its low bits were lost without a word) and a PGM's as mode I, which was refused
    as 32-bit. Now both are 16-bit images: maxval 65535 as stored, another scaled to 0 - 65535 as Pillow
    scales a grey one; the round trip gives those samples back, in a 16-bit PNG."""
    arr = RNG.integers(0, maxval + 1, (5, 7, c))
    p = tmp_path / ("a.pgm" if c == 1 else "a.ppm")
    p.write_bytes(_pnm(kind, arr[..., 0] if c == 1 else arr, maxval, comment=kind in ("P2", "P3")))
    with Image.open(p) as im:
        assert im.mode == ("I" if c == 1 else "RGB")  # what Pillow gives
    src = images.load_image(p)
    want = arr if maxval == 65535 else np.rint(arr * (65535 / maxval))  # Pillow's scaling of grey samples
    assert src.mode == MODES[c] and np.array_equal(images.to_array(src), want)
    if c == 1:
        with Image.open(p) as im:
            assert np.array_equal(images.to_array(src)[..., 0], np.asarray(im))
    data, _ = api.compress([src], None, fallback="seed")
    (back,) = api.decompress(data)
    assert np.array_equal(images.to_array(back), want)
    out = tmp_path / "out.png"
    out.write_bytes(images.encode_source(back, ".png"))
    assert np.array_equal(images.to_array(images.load_image(out)), want)


def test_8_bit_pgm_and_ppm_are_read_as_before(tmp_path):
    """maxval 255 and below: Pillow's 8-bit modes (a maxval below 255 scaled up by Pillow), as before."""
    for kind, c, maxval in (("P5", 1, 255), ("P6", 3, 255), ("P6", 3, 15), ("P3", 3, 100)):
        arr = RNG.integers(0, maxval + 1, (4, 6, c))
        p = tmp_path / "a.pnm"
        head = f"{kind}\n6 4\n{maxval}\n".encode()
        p.write_bytes(head + (arr.astype(np.uint8).tobytes() if kind in ("P5", "P6")
                              else " ".join(str(v) for v in arr.ravel()).encode()))
        src = images.load_image(p)
        with Image.open(p) as im:
            assert src.mode == im.mode and np.array_equal(images.to_array(src), np.asarray(im))


def test_a_damaged_16_bit_ppm_is_refused(tmp_path):
    arr = RNG.integers(0, 65536, (5, 7, 3))
    good = _pnm("P6", arr, 65535)
    for bad, words in ((good[:-3], "truncated"), (_pnm("P3", arr // 2, 1000), "maxval"),
                       (_pnm("P3", arr, 65535).replace(b" 1", b" x", 1), "not a number")):
        p = tmp_path / "bad.ppm"
        p.write_bytes(bad)
        with pytest.raises(SfcError, match=words):
            images.load_image(p)


def test_a_16_bit_grey_tiff_is_read():
    g = smooth16(9, 10, 1)[..., 0]
    import io
    buf = io.BytesIO()
    Image.fromarray(g).save(buf, format="TIFF")
    src = images.from_pil(Image.open(buf))
    assert src.mode == "L;16" and np.array_equal(images.to_array(src)[..., 0], g)


# --- through the codec ---------------------------------------------------------------------------------


@pytest.mark.parametrize("c", [1, 2, 3, 4])
def test_compress_round_trip_version_6(c):
    arr = smooth16(20, 24, c, seed=c)
    if c in (2, 4):
        arr[..., -1] = 65535  # an opaque alpha: a constant high byte and low byte
    src = images.from_array(arr)
    data, rep = api.compress([src], None, fallback="seed")
    assert container.format_version(data) == 6
    back = api.decompress(data)
    assert back[0].mode == MODES[c] and np.array_equal(images.to_array(back[0]), arr)
    api.check_identical([src], back)
    low = container.unpack_all(data)[3]
    assert rep.low_bytes == 4 * len(low) + 16 and rep.metadata_bytes == 0
    assert rep.file_bytes == rep.header_bytes + rep.payload_bits // 8 + rep.low_bytes


def test_8_bit_files_are_unchanged_and_mixed_files_work():
    a8 = RNG.integers(0, 256, (16, 16, 3), dtype=np.uint8)
    d8, _ = api.compress([images.from_array(a8)], None, fallback="seed")
    assert container.format_version(d8) == 4
    a16 = smooth16(16, 16, 3)
    data, _ = api.compress([images.from_array(a8), images.from_array(a16), images.from_array(a8)], None, fallback="seed")
    out = api.decompress_arrays(data, None)
    assert np.array_equal(out[0], a8) and np.array_equal(out[1], a16) and np.array_equal(out[2], a8)
    assert out[1].dtype == np.uint16


def test_a_widened_8_bit_image_costs_what_the_8_bit_image_does():
    a8 = smooth16(24, 24, 3).astype(np.int64) >> 8
    d8, _ = api.compress([images.from_array(a8.astype(np.uint8))], None, fallback="seed")
    d16, rep = api.compress([images.from_array((a8 * 257).astype(np.uint16))], None, fallback="seed")
    assert rep.low_bytes <= 24 and len(d16) <= len(d8) + 40  # the section's framing, "x257" in the header


def test_compress_with_a_model_codes_the_high_bits_through_it(tmp_path):
    from scoreflow_codec import zoo
    model = zoo.load_model("cifar10")
    arr = smooth16(32, 64, 3, seed=5)  # two tiles: the first seeds the stack, the second the model codes
    ss = replace(api.default_stream_settings(model), seed_tiles="first", seed_context="tile", n_seed=1)  # the second tile: the model's
    data, rep = api.compress([images.from_array(arr)], model, fallback="off", settings={"steps": 8}, stream_settings=ss)
    assert rep.coded_by == "model"
    assert np.array_equal(api.decompress_arrays(data, model)[0], arr)


def _deep_file() -> bytes:
    return api.compress([images.from_array(smooth16(12, 14, 3, seed=9))], None, fallback="seed")[0]


def test_damaged_low_section_is_refused():
    data = _deep_file()
    header, words, section, low = container.unpack_all(data)
    n = 4 * len(low) + 8
    for cut in (1, 4, n - 1):
        with pytest.raises(BadFileError):
            api.decompress(data[:-cut])
    flip = bytearray(data)
    flip[-10] ^= 0x20
    with pytest.raises(BadFileError, match="low-bit section CRC"):
        api.decompress(bytes(flip))
    # well-formed sections with other words: refused by the decoder or the pixel CRC, nothing else
    for k, other in enumerate([np.zeros(0, np.uint32), low[:-1], np.append(low, np.uint32(7)),
                               np.random.default_rng(1).integers(1, 2**32, len(low), dtype=np.uint32)]):
        bad = container.pack(header, words, section=section, low_words=other)
        with pytest.raises((BadFileError, DecodeMismatchError)):
            api.decompress(bad)
    # a word under the stack's bottom: every sample decodes right, the word is left over
    under = container.pack(header, words, section=section, low_words=np.concatenate([[np.uint32(7)], low]))
    with pytest.raises(BadFileError, match="left over"):
        api.decompress(under)


def test_header_and_version_must_agree():
    data = _deep_file()
    header, words, section, low = container.unpack_all(data)
    with pytest.raises(BadFileError, match="go together"):  # 16-bit images in a version 5 file
        api.decompress(container.pack(header, words, version=5, section=section))
    h8 = {**header, "images": [[14, 12, "RGB", 1]], "meta": {}}
    with pytest.raises(BadFileError, match="16-bit description on an 8-bit"):
        api.read_header(container.pack({**h8, "meta": header["meta"]}, words, low_words=low))
    no_deep = {**header, "meta": {"0": {k: v for k, v in header["meta"]["0"].items() if k != "deep"}}}
    with pytest.raises(BadFileError, match="16-bit description"):
        api.read_header(container.pack(no_deep, words, low_words=low))
    bad = {**header, "meta": {"0": {**header["meta"]["0"], "deep": {"shift": 0, "table": 0, "low": 9}}}}
    with pytest.raises(BadFileError, match="16-bit description"):
        api.read_header(container.pack(bad, words, low_words=low))


def test_an_earlier_release_refuses_version_6():
    data = _deep_file()
    assert struct.unpack_from("<H", data, 8)[0] == container.DEEP_VERSION == max(container.ZDICTS) == 6


def test_eval_takes_a_16_bit_images_high_bits(tmp_path):
    """0.9.33: sfcodec eval of a 16-bit image evaluates its high bits, the planes compress gives the model
    and the trainer trains on (refused before): full-range samples' top bytes (v >> 8), 8-bit data in
    16-bit words (v x 257) its 8 bits, a smooth field of few values deep.split's ranks; grey as grey, an
    alpha plane left out; named as such; beside an 8-bit image, in order; --limit before reading more."""
    from trainer.data import codec_pixels

    rng = np.random.default_rng(4)
    full = rng.integers(0, 65536, (8, 8, 3)).astype(np.uint16)
    v = rng.integers(0, 256, (8, 8)).astype(np.uint16)
    smooth = smooth16(8, 8, 3)
    cases = {"full.png": full, "grey.tif": v * 257, "rgba.png": np.dstack([full, np.full((8, 8), 65535, np.uint16)]),
             "smooth.png": smooth}
    for name, a in cases.items():
        (tmp_path / name).write_bytes(images.encode_source(images.from_array(a), "." + name.split(".")[1]))
    Image.fromarray((full >> 8).astype(np.uint8)).save(tmp_path / "eight.png")
    order = ["full.png", "eight.png", "grey.tif", "rgba.png", "smooth.png"]
    arrays, names = api.load_eval_inputs([tmp_path / n for n in order])
    assert names == ["full.png (high bits)", "eight.png", "grey.tif (high bits)", "rgba.png (high bits)",
                     "smooth.png (high bits)"]
    assert np.array_equal(arrays[0], full >> 8) and arrays[0].dtype == np.uint8
    assert np.array_equal(arrays[1], arrays[0]) and np.array_equal(arrays[2], v) and arrays[2].ndim == 2
    assert np.array_equal(arrays[3], full >> 8)
    assert np.array_equal(arrays[4], deep.split(smooth.transpose(2, 0, 1))[0].transpose(1, 2, 0))
    assert not np.array_equal(arrays[4], smooth >> 8)  # a reduction, not the top bytes, here
    for k in (0, 4):  # what the trainer trains on
        assert np.array_equal(codec_pixels(tmp_path / order[k]), arrays[k])
    (tmp_path / "bad.png").write_text("not read: beyond --limit")
    assert api.load_eval_inputs([tmp_path / "full.png", tmp_path / "bad.png"], limit=1)[1] == ["full.png (high bits)"]


def test_every_truncation_and_flip_of_a_16_bit_file_is_refused():
    """Each cut of a version 6 file, and a bit flipped in each of 200 places: a one-line refusal (the
    framing, a CRC, the decoder, the pixel CRC), never another exception or a wrong image."""
    data = _deep_file()
    want = images.to_array(api.decompress(data)[0])
    for n in range(0, len(data), 7):
        with pytest.raises(SfcError):
            api.decompress(data[:n])
    for i in np.random.default_rng(6).choice(len(data) * 8, 200, replace=False):
        bad = bytearray(data)
        bad[i // 8] ^= 1 << (i % 8)
        try:
            out = api.decompress(bytes(bad))
        except SfcError as e:
            assert str(e) and "\n" not in str(e)
        else:  # a flip the checks cannot see (none expected: every byte is under a CRC)
            assert np.array_equal(images.to_array(out[0]), want)
