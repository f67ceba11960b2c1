"""16-bit PNG and TIFF files written by hand, as the PNG and TIFF 6.0 specifications lay them out (not
by this package, whose reader and writer they test): tests/test_deep.py and tests/test_cli.py."""
from __future__ import annotations

import struct
import zlib

import numpy as np


def _filter_row(kind: int, row: np.ndarray, prev: np.ndarray, bpp: int) -> np.ndarray:
    x, out = row.astype(np.int64), np.zeros(len(row), np.int64)
    for i in range(len(row)):
        a = x[i - bpp] if i >= bpp else 0
        b = int(prev[i])
        c = int(prev[i - bpp]) if i >= bpp else 0
        if kind == 0:
            pred = 0
        elif kind == 1:
            pred = a
        elif kind == 2:
            pred = b
        elif kind == 3:
            pred = (a + b) // 2
        else:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
        out[i] = (x[i] - pred) % 256
    return out.astype(np.uint8)


ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]  # x0, y0, dx, dy


def png16_by_hand(arr: np.ndarray, interlace: bool, seed: int = 0) -> bytes:
    """A 16-bit PNG as the specification lays it out, each row with a random filter type."""
    h, w, c = arr.shape
    rng = np.random.default_rng(seed)
    bpp = 2 * c
    raw = bytearray()
    passes = ADAM7 if interlace else [(0, 0, 1, 1)]
    for x0, y0, dx, dy in passes:
        sub = arr[y0::dy, x0::dx]
        if sub.size == 0:
            continue
        rows = np.ascontiguousarray(sub, dtype=">u2").view(np.uint8).reshape(sub.shape[0], -1)
        prev = np.zeros(rows.shape[1], np.uint8)
        for r in rows:
            kind = int(rng.integers(0, 5))
            raw += bytes([kind]) + _filter_row(kind, r, prev, bpp).tobytes()
            prev = r

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    ihdr = struct.pack(">IIBBBBB", w, h, 16, {1: 0, 2: 4, 3: 2, 4: 6}[c], 0, 0, int(interlace))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(bytes(raw))) + chunk(b"IEND", b"")


def tiff16_by_hand(arr: np.ndarray, compression: int = 1, predictor: int = 1, endian: str = "<",
                   rows_per_strip: int | None = None) -> bytes:
    """A 16-bit grey / 48-bit RGB / 64-bit RGBA TIFF as TIFF 6.0 lays it out: strips of rows_per_strip
    rows, uncompressed (1) or Deflate (8), with horizontal differencing (predictor 2) or not."""
    h, w, c = arr.shape
    rps = rows_per_strip or h
    strips = []
    for y0 in range(0, h, rps):
        block = arr[y0:y0 + rps].astype(np.int64)
        if predictor == 2:  # each sample minus its left neighbour, modulo 2**16
            block[:, 1:] = (block[:, 1:] - arr[y0:y0 + rps, :-1]) % 65536
        raw = block.astype(endian + "u2").tobytes()
        strips.append(zlib.compress(raw) if compression == 8 else raw)
    offsets = list(np.cumsum([8] + [len(b) for b in strips[:-1]]))
    blob_at = 8 + sum(len(b) for b in strips)  # after the strips: BitsPerSample, StripOffsets, StripByteCounts
    arrays = {258: [16] * c, 273: offsets, 279: [len(b) for b in strips]}
    blobs, where = b"", {}
    for tag, values in arrays.items():
        typ = 3 if tag == 258 else 4
        where[tag] = blob_at + len(blobs)
        blobs += struct.pack(endian + f"{len(values)}{'H' if typ == 3 else 'I'}", *values)
    tags = {256: (3, [w]), 257: (3, [h]), 258: (3, arrays[258]), 259: (3, [compression]), 262: (3, [2 if c >= 3 else 1]),
            273: (4, offsets), 277: (3, [c]), 278: (3, [rps]), 279: (4, arrays[279])}
    if c == 4:
        tags[338] = (3, [2])  # ExtraSamples: unassociated alpha
    if predictor == 2:
        tags[317] = (3, [2])
    entries = b""
    for tag in sorted(tags):
        typ, values = tags[tag]
        size = 2 if typ == 3 else 4
        if len(values) * size <= 4:  # the values in the entry, left-justified
            inline = struct.pack(endian + f"{len(values)}{'H' if typ == 3 else 'I'}", *values).ljust(4, b"\0")
            entries += struct.pack(endian + "HHI", tag, typ, len(values)) + inline
        else:
            entries += struct.pack(endian + "HHII", tag, typ, len(values), where[tag])
    ifd = struct.pack(endian + "H", len(tags)) + entries + struct.pack(endian + "I", 0)
    head = (b"II*\0" if endian == "<" else b"MM\0*") + struct.pack(endian + "I", blob_at + len(blobs))
    return head + b"".join(strips) + blobs + ifd


def with_chunk(png: bytes, kind: bytes, data: bytes, before: bytes) -> bytes:
    """A PNG with one more chunk (its length and CRC), placed before the chunk `before` (b"IDAT", b"IEND")."""
    i = 8
    while png[i + 4:i + 8] != before:  # walk the chunks: their data may hold the same four bytes
        i += 12 + struct.unpack_from(">I", png, i)[0]
    return png[:i] + struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data)) + png[i:]
