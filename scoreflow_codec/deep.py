"""16-bit images: their samples as an 8-bit image plus low bits; 48/64-bit PNGs and TIFFs read and written.

The codec's model and seed codec code 8-bit planes. A 16-bit image (`images.SourceImage` of mode
"L;16", "LA;16", "RGB;16" or "RGBA;16") is coded as the 8-bit image of its samples' high bits plus
the low bits (coding/deep_codec.py, given the high bits), after the reductions that make its
samples as few bits as they really are (`split`, its description the header's meta["deep"]):

* {"x257": 1}: every sample is a multiple of 257, as when an 8-bit image is widened (v * 257, what
  Pillow, ImageMagick and Photoshop do): the 8-bit image v // 257 alone, no low bits.
* {"shift": s, "table": k, "low": b}: samples >> s (s: the zero bits at the bottom of every
  sample, as 12-bit data stored shifted up); then, where there are k distinct values with fewer bits
  than the range they span (12-bit data scaled to 16 bits, v * 65535 // 4095), their ranks in the
  sorted table of those k values (which the low-bit section holds), where the bits the ranks save
  (per sample, the range's bits minus the ranks') outweigh the table's; the result w has 8 + b bits:
  w >> b is the 8-bit image, w & (2**b - 1) the low bits (b = 0: none).

Pillow reads a 16-bit grey PNG or TIFF ("I;16") whole, but hands over a 48/64-bit colour PNG or
TIFF as 8-bit RGB / RGBA, keeping the high bytes; `read_wide` has Pillow's decoder unpack the same
rows twice, the high bytes and then the low ones (PNG's unfiltering and Adam7, TIFF's strips,
tiles, compression and predictor are the same either way).
`encode_png` writes a 16-bit PNG: the chunks Pillow writes for the metadata (metadata.save_options)
around our own 16-bit IHDR and IDAT; `encode_tiff` a 16-bit TIFF of our own strips (Pillow writes
only 16-bit grey) behind a directory laid out by Pillow's TIFF directory writer (the metadata's tags).
"""
from __future__ import annotations

import io
import struct
import sys
import zlib
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from . import metadata as md
from .errors import BadFileError, UnsupportedImageError

if TYPE_CHECKING:
    from .coding.ans import Message
# The coding layer (ANS: constriction) is imported where the low bits are coded, so that reading and
# writing images (images.py, the trainer's folder data) needs none: a GPU machine without it trains.

MODES = {"L;16": 1, "LA;16": 2, "RGB;16": 3, "RGBA;16": 4}  # 16-bit modes and their channels
BASE_MODE = {"L;16": "L", "LA;16": "LA", "RGB;16": "RGB", "RGBA;16": "RGBA"}
WRITTEN_AS = {m: ("PNG",) if m == "LA;16" else ("PNG", "TIFF") for m in MODES}  # the formats a 16-bit image is written in
_PNG_COLOR_TYPE = {1: 0, 2: 4, 3: 2, 4: 6}


def _bit_length(v: int) -> int:
    return int(v).bit_length()


def split(u: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, dict]:
    """uint16 [C, H, W] -> (high bits uint8 [C, H, W], low bits uint8 [C, H, W] or None, table uint16
    [k] or None, meta["deep"]); `join` is its inverse."""
    if u.dtype != np.uint16 or u.ndim != 3:
        raise ValueError(f"expected uint16 [C, H, W], got {u.dtype} {u.shape}")
    if not (u % 257).any():
        return (u // 257).astype(np.uint8), None, None, {"x257": 1}
    ored = int(np.bitwise_or.reduce(u, axis=None))
    shift = (ored & -ored).bit_length() - 1
    v = u >> shift
    span = _bit_length(int(v.max()))
    table = None
    present = np.bincount(v.ravel(), minlength=1 << 16) > 0  # linear time: no sort of the samples
    values = np.flatnonzero(present)
    fewer = span - _bit_length(len(values) - 1)  # bits a sample saves by its rank
    gap_bits = _bit_length(int(np.diff(values, prepend=0).max()))  # what push_table spends on each value
    if fewer > 0 and len(values) * gap_bits < fewer * u.size:
        table = values.astype(np.uint16)
        v = (np.cumsum(present) - 1).astype(np.uint16)[v]  # each value's rank
        span = _bit_length(len(values) - 1)
    low = max(span - 8, 0)
    hi = (v >> low).astype(np.uint8)
    lo = (v & ((1 << low) - 1)).astype(np.uint8) if low else None
    return hi, lo, table, {"shift": shift, "table": 0 if table is None else len(table), "low": low}


def join(hi: np.ndarray, lo: np.ndarray | None, table: np.ndarray | None, deep: dict) -> np.ndarray:
    """split's inverse: uint16 [C, H, W]. Raises BadFileError where decoded values leave 16 bits or the
    table (only a damaged file's)."""
    if deep.get("x257"):
        return hi.astype(np.uint16) * np.uint16(257)
    low = deep["low"]
    w = hi.astype(np.int32) << low
    if low:
        w |= lo
    if table is not None:
        if int(w.max()) >= len(table):
            raise BadFileError("corrupt .sfc file: a 16-bit image's value is beyond its table")
        w = table.astype(np.int32)[w]
    u = w << deep["shift"]
    if int(u.max()) > 0xFFFF:
        raise BadFileError("corrupt .sfc file: a 16-bit image's value is beyond 16 bits")
    return u.astype(np.uint16)


def check(deep) -> None:
    """BadFileError unless `deep` is a header's valid meta["deep"]."""
    ok = isinstance(deep, dict)
    if ok and "x257" in deep:
        ok = deep == {"x257": 1}
    elif ok:
        ok = set(deep) == {"shift", "table", "low"} and all(type(v) is int for v in deep.values())
        if ok:
            s, k, b = deep["shift"], deep["table"], deep["low"]
            # low bits: 8 + b bits after the shift; a table: at most 2**(8 + b) values within 16 - s bits
            ok = 0 <= s <= 15 and 0 <= b <= 8 and (b == 0 or s + b + 8 <= 16) and \
                (k == 0 or 1 <= k <= 1 << min(b + 8, 16 - s))
    if not ok:
        raise BadFileError(f"corrupt .sfc file: bad 16-bit description {deep!r}")


def describe(deep: dict) -> str:
    """One line for `sfcodec info`: how a (checked) meta["deep"] makes the 16-bit samples."""
    if deep.get("x257"):
        return "an 8-bit image widened (every sample v * 257): no low bits"
    parts = [f"samples shifted up {deep['shift']} bits"] if deep["shift"] else []
    if deep["table"]:
        parts.append(f"{deep['table']} distinct values (a table)")
    parts.append(f"{deep['low']} low bits beside the 8-bit image" if deep["low"] else "no low bits")
    return ", ".join(parts)


# ---- the low-bit section's table of values -------------------------------------------------------


def push_table(m, table: np.ndarray) -> float:
    """The sorted distinct values (uint16 [k], k given by the header) onto an ANS stack: the gaps
    between them, each in as many bits as the largest needs. Returns the bits."""
    from .coding.distributions import uniform

    gaps = np.diff(table.astype(np.int64), prepend=0)  # the first "gap" is the first value, >= 0
    nbits = max(_bit_length(int(gaps.max())), 1)
    uniform(1 << nbits, (len(gaps),)).push(m, gaps)
    uniform(17, ()).push(m, np.int64(nbits))
    return float(np.log2(17) + nbits * len(gaps))


def pop_table(m, k: int, shift: int) -> np.ndarray:
    """push_table's table; BadFileError where it is not strictly increasing within 16 - shift bits."""
    from .coding.distributions import uniform

    nbits = int(uniform(17, ()).pop(m))
    if nbits < 1:
        raise BadFileError("corrupt .sfc file: bad 16-bit value table")
    values = np.cumsum(uniform(1 << nbits, (k,)).pop(m))
    if (len(values) > 1 and (np.diff(values) <= 0).any()) or int(values[-1]) >> (16 - shift):
        raise BadFileError("corrupt .sfc file: bad 16-bit value table")
    return values.astype(np.uint16)


# ---- the low-bit section: each image's table and low bits ----------------------------------------


def push_image(m: Message, hi: np.ndarray, lo: np.ndarray | None, table: np.ndarray | None, deep: dict) -> float:
    """One image's share of the low-bit section onto an ANS stack (hi: every channel's high bits,
    uint8 [C, H, W]); pop_image's inverse. Returns the predicted bits."""
    from .coding import deep_codec

    bits = deep_codec.push(m, hi, lo, deep["low"]) if deep.get("low") else 0.0
    return bits + (push_table(m, table) if deep.get("table") else 0.0)


def pop_image(m: Message, hi: np.ndarray, deep: dict) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(low bits, table) of one image, as push_image pushed them."""
    from .coding import deep_codec

    table = pop_table(m, deep["table"], deep["shift"]) if deep.get("table") else None
    lo = deep_codec.pop(m, hi, deep["low"]) if deep.get("low") else None
    return lo, table


# ---- PNG and TIFF files ------------------------------------------------------------------------


def wide_colour(img: Image.Image) -> tuple[str, str, str] | None:
    """How to read a 48/64-bit colour PNG or TIFF (a 32-bit grey + alpha PNG) whole, which Pillow hands
    over as 8-bit (the high bytes): (its raw mode, the Pillow mode and raw mode that unpack the same
    decoded rows' low bytes instead), else None."""
    raws = {rawmode(t) for t in getattr(img, "tile", None) or []}
    if img.format not in ("PNG", "TIFF") or len(raws) != 1:  # every strip or tile alike
        return None
    raw = raws.pop()
    if img.format == "PNG" and raw == "LA;16B":  # grey + alpha: Pillow's RGBA (L, L, L, A); 8-bit RGBA reads all 4 bytes
        return raw, "RGBA", "RGBA"
    base, _, bits = str(raw).partition(";")
    if base not in ("RGB", "RGBA") or bits not in ("16B", "16L", "16N") or (img.format == "PNG" and bits != "16B"):
        return None
    order = bits[-1] if bits[-1] != "N" else ("L" if sys.byteorder == "little" else "B")  # N: libtiff's native
    return raw, base, f"{base};16{'B' if order == 'L' else 'L'}"  # the other byte of each sample


def rawmode(tile) -> str:
    """The raw mode a Pillow tile's decoder unpacks with ("" where it names none)."""
    args = tile[3] if len(tile) > 3 else None
    return str(args if isinstance(args, str) else args[0] if isinstance(args, tuple) and args else "")


def _unpack(path, mode: str, rawmode: str) -> tuple[np.ndarray, dict]:
    """The file's pixels as Pillow's decoders give them with `rawmode` for every strip or tile, and its
    metadata (metadata.read, once loaded: a PNG's chunks after its pixels too)."""
    with Image.open(path) as img:
        if img.mode != mode:  # wide_colour's modes are the ones Pillow opens these files in
            raise ValueError(f"a {img.mode} image, not {mode}")
        img.tile = [t._replace(args=(rawmode,) + tuple(t.args[1:]) if isinstance(t.args, tuple) else rawmode)
                    for t in img.tile]
        img.load()
        return np.asarray(img), md.read(img)


def read_wide(path, how: tuple[str, str, str]) -> tuple[np.ndarray, str, dict]:
    """(uint16 [H, W, C], mode, metadata) of a 16-bit colour (or grey + alpha) PNG or TIFF, wide_colour's
    `how`: Pillow's decoder unpacks the rows twice, their high bytes and then their low ones."""
    raw, low_mode, low_raw = how
    lo, kept = _unpack(path, low_mode, low_raw)
    if raw == "LA;16B":  # the bytes L_hi, L_lo, A_hi, A_lo
        return (lo[..., 0::2].astype(np.uint16) << 8) | lo[..., 1::2], "LA;16", kept
    hi, _ = _unpack(path, low_mode, raw)
    return (hi.astype(np.uint16) << 8) | lo, f"{low_mode};16", kept


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _chunks(png: bytes) -> list[tuple[bytes, bytes]]:
    out, pos = [], 8
    while pos < len(png):
        (n,) = struct.unpack_from(">I", png, pos)
        out.append((png[pos + 4:pos + 8], png[pos + 8:pos + 8 + n]))
        pos += 12 + n
    return out


def _filtered(rows: np.ndarray, bpp: int, only: int | None = None) -> bytes:
    """PNG scanlines: each row with the filter (None, Sub, Up, Average, Paeth) of the smallest sum of
    absolute values (libpng's heuristic), or filter `only` on every row; rows [H, stride] uint8."""
    x = rows.astype(np.int16)
    a = np.zeros_like(x)
    a[:, bpp:] = x[:, :-bpp]
    b = np.zeros_like(x)
    b[1:] = x[:-1]
    c = np.zeros_like(x)
    c[1:, bpp:] = x[:-1, :-bpp]
    p = a + b - c
    pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - c)
    paeth = np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))
    cands = np.stack([x, x - a, x - b, x - ((a + b) >> 1), x - paeth]) & 0xFF
    score = np.where(cands < 128, cands, 256 - cands).sum(axis=2)  # [5, H]
    best = score.argmin(axis=0) if only is None else np.full(len(x), only)
    lines = cands[best, np.arange(len(x))].astype(np.uint8)
    return np.concatenate([best.astype(np.uint8)[:, None], lines], axis=1).tobytes()


def encode_png(arr: np.ndarray, mode: str, metadata: dict | None = None, key=None) -> bytes:
    """A 16-bit PNG of uint16 [H, W, C] (mode in MODES) with as much of `metadata` as a PNG holds
    (all of it): the chunks Pillow writes for it, our IHDR and IDAT, and its other PNG chunks
    (metadata.png_with_chunks); key: a grey or RGB image's transparent colour (an int, or three), its
    tRNS chunk before the IDAT (0.10.6)."""
    h, w = arr.shape[:2]
    c = MODES[mode]
    if arr.dtype != np.uint16 or arr.shape != (h, w, c):
        raise ValueError(f"expected uint16 [H, W, {c}], got {arr.dtype} {arr.shape}")
    buf = io.BytesIO()
    Image.new(BASE_MODE[mode], (1, 1)).save(buf, format="PNG", **md.save_options(metadata or {}, "PNG")[0])
    rows = np.ascontiguousarray(arr, dtype=">u2").view(np.uint8).reshape(h, w * c * 2)
    idat = zlib.compress(_filtered(rows, 2 * c), 9)
    ihdr = struct.pack(">IIBBBBB", w, h, 16, _PNG_COLOR_TYPE[c], 0, 0, 0)
    out = [b"\x89PNG\r\n\x1a\n"]
    for kind, data in _chunks(buf.getvalue()):
        if kind == b"IHDR":
            out.append(_chunk(b"IHDR", ihdr))
        elif kind == b"IDAT":
            if idat is not None:
                if key is not None:
                    out.append(_chunk(b"tRNS", struct.pack(">3H", *key) if c == 3 else struct.pack(">H", key)))
                out.append(_chunk(b"IDAT", idat))
                idat = None
        else:
            out.append(_chunk(kind, data))
    return md.png_with_chunks(b"".join(out), (metadata or {}).get("png", b""))


TIFF_STRIP_BYTES = 1 << 16  # about this many bytes of samples per strip
_SHORT, _LONG, _RATIONAL, _UNDEFINED = 3, 4, 5, 7  # TIFF field types


def encode_tiff(arr: np.ndarray, mode: str, metadata: dict | None = None) -> bytes:
    """A 16-bit TIFF of uint16 [H, W, C] (grey, RGB or RGBA): little-endian, strips of about
    TIFF_STRIP_BYTES compressed with Deflate after horizontal differencing (predictor 2), with the ICC
    profile, the resolution, the EXIF's tags and directories and the XMP (tag 700) where `metadata` has
    them (as an 8-bit TIFF through Pillow: metadata.save_options, which names what it leaves out). The
    directory is laid out by Pillow's TIFF directory writer (since 0.9.29: the EXIF's directories), at
    the start, the strips after it. Grey + alpha is refused: Pillow, and so this package, cannot read
    such a TIFF back."""
    from PIL import TiffImagePlugin

    h, w = arr.shape[:2]
    c = MODES[mode]
    if "TIFF" not in WRITTEN_AS[mode]:
        raise UnsupportedImageError(f"a 16-bit {mode} image can only be written as .png")
    if arr.dtype != np.uint16 or arr.shape != (h, w, c):
        raise ValueError(f"expected uint16 [H, W, {c}], got {arr.dtype} {arr.shape}")
    rows = max(1, TIFF_STRIP_BYTES // (2 * w * c))
    diff = arr.astype(np.int32)
    diff[:, 1:] -= arr[:, :-1]  # each sample minus the same channel's to its left, modulo 2**16
    raw = (diff & 0xFFFF).astype("<u2")
    strips = [zlib.compress(raw[y:y + rows].tobytes(), 6) for y in range(0, h, rows)]
    ifd = TiffImagePlugin.ImageFileDirectory_v2(prefix=b"II")
    kept, _ = md.save_options(metadata or {}, "TIFF")  # Pillow's save() arguments: what a TIFF holds
    tags = kept.get("exif")  # the EXIF's tags and the XMP (metadata._tiff_tags), where there are any
    for tag in tags or ():
        if tag in md.EXIF_DIRECTORIES:
            ifd.tagtype[tag] = _LONG
            ifd[tag] = dict(tags.get_ifd(tag))  # written as a directory of its own
        else:
            ifd[tag] = tags[tag]
    # the image's own tags, over any of the same number in the EXIF; StripOffsets from the end of the
    # directory's data (Pillow's writer adds it)
    for tag, typ, value in [(256, _LONG, w), (257, _LONG, h), (258, _SHORT, (16,) * c), (259, _SHORT, 8),
                            (262, _SHORT, 1 if c == 1 else 2),
                            (273, _LONG, tuple(np.cumsum([0] + [len(b) for b in strips[:-1]]).tolist())),
                            (277, _SHORT, c), (278, _LONG, rows), (279, _LONG, tuple(len(b) for b in strips)),
                            (284, _SHORT, 1), (317, _SHORT, 2)] + ([(338, _SHORT, 2)] if c == 4 else []):
        ifd.tagtype[tag] = typ  # 338: the fourth sample is unassociated alpha
        ifd[tag] = value if not isinstance(value, tuple) or len(value) > 1 else value[0]
    if "dpi" in kept:
        for tag, v in ((282, kept["dpi"][0]), (283, kept["dpi"][1])):
            ifd.tagtype[tag] = _RATIONAL
            ifd[tag] = TiffImagePlugin.IFDRational(max(1, round(float(v) * 10000)), 10000)
        ifd.tagtype[296] = _SHORT
        ifd[296] = 2
    if "icc_profile" in kept:
        ifd.tagtype[34675] = _UNDEFINED
        ifd[34675] = kept["icc_profile"]
    return b"II*\0" + struct.pack("<I", 8) + ifd.tobytes(8) + b"".join(strips)
