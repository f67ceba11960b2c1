"""The .sfc file: a checked envelope around a JSON header and the ANS payload (DESIGN 3).

Layout (all integers little-endian)::

    magic        8 bytes   b"\\x89SFC\\r\\n\\x1a\\n"  (PNG-style: catches text-mode mangling)
    version      u16       FORMAT_VERSION (4; 5 with a metadata section, 6 with 16-bit images;
                           versions 1 to 3 differ only in the header's dictionary)
    release      u16       versions 1 - 3: 0 (reserved). Versions 4 - 6: the writer's release x.y.z as
                           1 + (x << 12 | y << 6 | z), its "codec" string taken out of the JSON
                           (x < 15, y, z < 64); 0 where the header has no such release (the JSON
                           then carries "codec", if any)
    header_len   u32       <= MAX_HEADER_BYTES
    header       header_len bytes: raw DEFLATE (preset dictionary ZDICTS[version]) of canonical
                 JSON (UTF-8, sorted keys, no spaces), an object of at most MAX_HEADER_BYTES
                 once inflated
    header_crc   u32       CRC32 of version .. header
    payload_len  u32       bytes, a multiple of 4
    payload      payload_len bytes: uint32 ANS words, little-endian
    payload_crc  u32       CRC32 of payload
    (versions 5 and 6: a file that keeps its images' metadata, metadata.py; empty in version 6 without)
    section_len  u32       bytes of the metadata section
    section      section_len bytes (raw DEFLATE of the images' ICC profiles, EXIF, XMP, PNG chunks;
                 what they are and how long, the header's per-image "kept" entries)
    section_crc  u32       CRC32 of section
    (version 6 only: a file with 16-bit images, deep.py)
    low_len      u32       bytes of the low-bit section, a multiple of 4
    low          low_len bytes: uint32 ANS words, little-endian (the 16-bit images' low bits and tables)
    low_crc      u32       CRC32 of low

A writer uses version 5 only for a file with metadata and version 6 only for one with 16-bit images,
so a file of 8-bit images without metadata is version 4, byte for byte what 0.9.26 wrote, and a
release before 0.9.27 refuses a file whose metadata it would drop ("format version 5 not
supported"), one before 0.9.28 a file whose low bits it would drop (version 6).

28 bytes of framing plus the deflated header: a 32x32 image's file has to carry it, so the
header is kept small (api.py omits settings that equal the format's defaults).

What the header holds (model id and sha256, settings, images and pixel CRCs) is the caller's
business; this module checks structure only. Every malformed input raises `BadFileError` (or
`UnsupportedVersionError`) with one line saying what is wrong, after work bounded by the real
input length: declared sizes are compared with the bytes present before anything is sliced.
"""
from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import numpy as np

from .errors import BadFileError, UnsupportedVersionError

MAGIC = b"\x89SFC\r\n\x1a\n"
FORMAT_VERSION = 4          # what pack writes (SECTION_VERSION with metadata); unpack reads every version in ZDICTS
MAX_HEADER_BYTES = 1 << 20

# Preset DEFLATE dictionaries, one per format version (never change one that files were written
# with). Version 1's holds the keys and values every header repeats, so that a one-image file's
# header costs tens of bytes, not hundreds. Version 2 (0.8.0) is the same framing with version 1's
# dictionary followed by whole headers as 0.7.0 writes them: a one-image seed codec file's header
# deflates to 27 - 28 bytes instead of 47 (0.05 bits/dim at 32x32; golden seed-f2, test_container),
# a six-image model stream's to 129 instead of 203. Deflate's nearest matches cost the fewest bits,
# so the commonest header comes last.
ZDICT_V1 = (b'"codec":"0.1.0","crc32":,"fields":{"n_seed":1,"n_tiles":1,"pad_stripped":,"pad_words":},'
            b'"images":[[32,32,"RGB",1]],"meta":{"0":{"alpha_const":255,"name":".png"}},"mode":"chain",'
            b'"mode":"ode","model":{"name":"cifar10","photo","sha256":"'
            b'"},"settings":{"steps":},"setup":{"device":"cpu","cuda","dtype":"float32",'
            b'"micro_batch":8,"threads":2,"torch":"2.13.0+cpu"},"stream":{}}')
ZDICT_V2 = ZDICT_V1 + (
    b'{"codec":"0.8.0","crc32":,"fields":{"n_seed":1,"n_tiles":,"pad_stripped":,"pad_words":},'
    b'"images":[[768,512,"RGB",1]],"meta":{"0":{"name":".png"}},"mode":"chain","model":{"name":"photo",'
    b'"sha256":""},"settings":{},"setup":{"constriction":"0.5.0","device":"cpu","dtype":"exact64",'
    b'"micro_batch":2,"threads":1,"torch":"2.13.0+cpu"},"stream":{"batching":"bits","max_batch":1,"seed":4,'
    b'"tile":64}}'
    b'{"codec":"0.8.0","crc32":,"fields":{"n_seed":1,"n_tiles":32,"pad_stripped":,"pad_words":},'
    b'"images":[[32,32,"RGB",32]],"meta":{"0":{"name":".png"},"1":{"name":".png"},"2":{"name":".png"}},'
    b'"mode":"chain","model":{"name":"cifar10","sha256":""},"settings":{"schedule":"calibrated","steps":128},'
    b'"setup":{"constriction":"0.5.0","device":"cpu","dtype":"exact64","micro_batch":8,"threads":2,'
    b'"torch":"2.13.0+cpu"},"stream":{"batching":"bits","seed":4}}'
    b'{"codec":"0.8.0","crc32":,"fields":{"n_seed":1,"n_tiles":1,"pad_stripped":0,"pad_words":2},'
    b'"images":[[32,32,"RGB",1]],"meta":{"0":{"name":".png"}},"mode":"chain","settings":{},"stream":{"seed":4}}')
# Version 3 (0.9.0): version 2's dictionary followed by the same headers as 0.9.0 writes them. A
# header's release string ("codec") and seed codec version ("seed") sit inside the dictionary's
# long matches; when they change, each break costs a few bytes (0.9.0's one-image seed codec
# header deflated to 29 bytes with version 2's dictionary, 23 with 0.8.0's strings). So a release
# that changes either adds a format version whose dictionary ends with its own headers.
ZDICT_V3 = ZDICT_V2 + (
    b'{"codec":"0.9.0","crc32":,"fields":{"n_seed":1,"n_tiles":,"pad_stripped":,"pad_words":},'
    b'"images":[[768,512,"RGB",1]],"meta":{"0":{"name":".png"}},"mode":"chain","model":{"name":"photo",'
    b'"sha256":""},"settings":{},"setup":{"constriction":"0.5.0","device":"cpu","dtype":"exact64",'
    b'"micro_batch":2,"threads":1,"torch":"2.13.0+cpu"},"stream":{"batching":"bits","max_batch":1,"seed":5,'
    b'"tile":64}}'
    b'{"codec":"0.9.0","crc32":,"fields":{"n_seed":1,"n_tiles":32,"pad_stripped":,"pad_words":},'
    b'"images":[[32,32,"RGB",32]],"meta":{"0":{"name":".png"},"1":{"name":".png"},"2":{"name":".png"}},'
    b'"mode":"chain","model":{"name":"cifar10","sha256":""},"settings":{"schedule":"calibrated","steps":128},'
    b'"setup":{"constriction":"0.5.0","device":"cpu","dtype":"exact64","micro_batch":8,"threads":2,'
    b'"torch":"2.13.0+cpu"},"stream":{"batching":"bits","seed":5}}'
    b'{"codec":"0.9.0","crc32":,"fields":{"n_seed":1,"n_tiles":1,"pad_stripped":1,"pad_words":2},'
    b'"images":[[32,32,"RGB",1]],"meta":{"0":{"name":".png"}},"mode":"chain","settings":{},"stream":{"seed":5}}')
# Version 4 (0.9.1): the release string leaves the JSON for the fixed header's release field, so
# that a new release no longer breaks the dictionary's long matches: in version 3 a one-image seed
# codec header deflates to 22 bytes written by 0.9.0, 25 by 0.9.1, 26 by 0.10.0; in version 4 to 21
# whatever the release (test_container). Its dictionary is version 3's followed by the same headers
# without "codec"; only a new seed codec version ("seed") still calls for a new dictionary.
ZDICT_V4 = ZDICT_V3 + (
    b'{"crc32":,"fields":{"n_seed":1,"n_tiles":,"pad_stripped":,"pad_words":},'
    b'"images":[[768,512,"RGB",1]],"meta":{"0":{"name":".png"}},"mode":"chain","model":{"name":"photo",'
    b'"sha256":""},"settings":{},"setup":{"constriction":"0.5.0","device":"cpu","dtype":"exact64",'
    b'"micro_batch":2,"threads":1,"torch":"2.13.0+cpu"},"stream":{"batching":"bits","max_batch":1,"seed":5,'
    b'"tile":64}}'
    b'{"crc32":,"fields":{"n_seed":1,"n_tiles":32,"pad_stripped":,"pad_words":},'
    b'"images":[[32,32,"RGB",32]],"meta":{"0":{"name":".png"},"1":{"name":".png"},"2":{"name":".png"}},'
    b'"mode":"chain","model":{"name":"cifar10","sha256":""},"settings":{"schedule":"calibrated","steps":128},'
    b'"setup":{"constriction":"0.5.0","device":"cpu","dtype":"exact64","micro_batch":8,"threads":2,'
    b'"torch":"2.13.0+cpu"},"stream":{"batching":"bits","seed":5}}'
    b'{"crc32":,"fields":{"n_seed":1,"n_tiles":1,"pad_stripped":1,"pad_words":2},'
    b'"images":[[32,32,"RGB",1]],"meta":{"0":{"name":".png"}},"mode":"chain","settings":{},"stream":{"seed":5}}')
# Version 5 (0.9.27): version 4 and a metadata section after the payload (same header dictionary).
# Version 6 (0.9.28): version 5 and a low-bit section after the metadata section.
ZDICTS = {1: ZDICT_V1, 2: ZDICT_V2, 3: ZDICT_V3, 4: ZDICT_V4, 5: ZDICT_V4, 6: ZDICT_V4}
RELEASE_FIELD = 4  # the first format version whose fixed header carries the release
SECTION_VERSION = 5  # the first format version with a metadata section
DEEP_VERSION = 6  # the first (and only) format version with a low-bit section


def release_field(codec: Any) -> int:
    """The version-4 release field of a header's "codec" value: 1 + (x << 12 | y << 6 | z) for a
    release "x.y.z" (plain decimal numbers, x < 15, y and z < 64); 0 for anything else (absent, or
    not of that form: the JSON keeps it)."""
    if not isinstance(codec, str):
        return 0
    parts = codec.split(".")
    if len(parts) != 3 or not all(p.isdigit() and p.isascii() and str(int(p)) == p for p in parts):
        return 0
    x, y, z = (int(p) for p in parts)
    return 1 + (x << 12 | y << 6 | z) if x < 15 and y < 64 and z < 64 else 0


RELEASE_FIELD_MAX = release_field("14.63.63")  # the largest release the field holds


def release_string(field: int) -> str:
    """The release "x.y.z" of a nonzero release field (release_field's inverse)."""
    v = field - 1
    return f"{v >> 12}.{(v >> 6) & 63}.{v & 63}"

_FIXED = struct.Struct("<HHI")  # version, reserved, header_len
_U32 = struct.Struct("<I")  # CRCs and the payload's and section's lengths (4 GiB is far beyond any image set)


def _canonical_json(header: dict) -> bytes:
    return json.dumps(
        header, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def pack(header: dict, payload_words: np.ndarray, version: int | None = None, section: bytes = b"",
         low_words: np.ndarray | None = None) -> bytes:
    """Build the bytes of a .sfc file: format `version` (by default FORMAT_VERSION, SECTION_VERSION
    where there is a metadata `section`, DEEP_VERSION where there are `low_words`, the 16-bit images'
    uint32 ANS words, even none; a test may ask for an older one). Raises ValueError for a header we
    could not read back."""
    if version is None:
        version = DEEP_VERSION if low_words is not None else SECTION_VERSION if section else FORMAT_VERSION
    if version not in ZDICTS:
        raise ValueError(f"no format version {version}")
    if section and version < SECTION_VERSION:
        raise ValueError(f"format version {version} has no metadata section")
    if low_words is not None and version < DEEP_VERSION:
        raise ValueError(f"format version {version} has no low-bit section")
    if not isinstance(header, dict):
        raise ValueError("header must be a dict")
    release = release_field(header.get("codec")) if version >= RELEASE_FIELD else 0
    if release:
        header = {k: v for k, v in header.items() if k != "codec"}
    js = _canonical_json(header)
    if len(js) > MAX_HEADER_BYTES:
        raise ValueError(f"header is {len(js)} bytes, over the {MAX_HEADER_BYTES}-byte limit")
    comp = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, ZDICTS[version])
    hb = comp.compress(js) + comp.flush()
    pb = _words_bytes(payload_words, "payload_words")
    head = _FIXED.pack(version, release, len(hb)) + hb
    parts = [MAGIC, head, _U32.pack(zlib.crc32(head)), _U32.pack(len(pb)), pb, _U32.pack(zlib.crc32(pb))]
    if version >= SECTION_VERSION:
        section = bytes(section)
        if len(section) >= 1 << 32:
            raise ValueError("metadata section over 4 GiB")
        parts += [_U32.pack(len(section)), section, _U32.pack(zlib.crc32(section))]
    if version >= DEEP_VERSION:
        lb = _words_bytes(np.zeros(0, np.uint32) if low_words is None else low_words, "low_words")
        parts += [_U32.pack(len(lb)), lb, _U32.pack(zlib.crc32(lb))]
    return b"".join(parts)


def _words_bytes(words, what: str) -> bytes:
    words = np.asarray(words)
    if words.ndim != 1 or words.dtype != np.uint32:
        raise ValueError(f"{what} must be a 1-D uint32 array")
    return words.astype("<u4").tobytes()


def _parse_header(data: bytes) -> tuple[dict, int, int]:
    """Check everything up to the header CRC; return (header, offset just after it, format version)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("expected bytes")
    data = memoryview(data)
    n = len(data)
    if n < len(MAGIC):
        if n and bytes(data) == MAGIC[:n]:
            raise BadFileError(f"truncated .sfc file: {n} bytes, cut inside the magic number")
        raise BadFileError("not a .sfc file (too short to hold the magic number)")
    if bytes(data[: len(MAGIC)]) != MAGIC:
        raise BadFileError("not a .sfc file (wrong magic number)")
    pos = len(MAGIC)
    if n < pos + _FIXED.size:
        raise BadFileError("truncated .sfc file: cut inside the fixed header")
    version, reserved, hlen = _FIXED.unpack_from(data, pos)
    if version not in ZDICTS:
        raise UnsupportedVersionError(
            f"format version {version} not supported by this release (reads versions "
            f"{min(ZDICTS)} to {max(ZDICTS)})"
        )
    if hlen > MAX_HEADER_BYTES:
        raise BadFileError(
            f"corrupt .sfc file: declared header length {hlen} exceeds the "
            f"{MAX_HEADER_BYTES}-byte limit"
        )
    end = pos + _FIXED.size + hlen
    if n < end + _U32.size:
        raise BadFileError(
            f"truncated .sfc file: cut inside the header (declares {hlen} header bytes, "
            f"{max(0, n - pos - _FIXED.size)} present before the CRC)"
        )
    (crc,) = _U32.unpack_from(data, end)
    if zlib.crc32(data[pos:end]) != crc:
        raise BadFileError("corrupt .sfc file: header CRC mismatch")
    if reserved != 0 and version < RELEASE_FIELD:
        raise BadFileError("corrupt .sfc file: reserved field is not zero")
    inflater = zlib.decompressobj(-15, ZDICTS[version])
    try:
        # bounded: a deflate bomb stops at MAX_HEADER_BYTES + 1
        raw = inflater.decompress(bytes(data[pos + _FIXED.size : end]), MAX_HEADER_BYTES + 1)
    except zlib.error:
        raise BadFileError("corrupt .sfc file: header does not inflate") from None
    if len(raw) > MAX_HEADER_BYTES:
        raise BadFileError(f"corrupt .sfc file: header inflates beyond {MAX_HEADER_BYTES} bytes")
    if not inflater.eof or inflater.unconsumed_tail or inflater.unused_data:
        raise BadFileError("corrupt .sfc file: header deflate stream is incomplete or has trailing bytes")
    try:
        header = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
        canonical = _canonical_json(header)  # fails on lone surrogates, which UTF-8 can't hold
    except (ValueError, RecursionError) as e:  # UnicodeError is a ValueError
        why = type(e).__name__
        raise BadFileError(f"corrupt .sfc file: header not valid JSON ({why})") from None
    if not isinstance(header, dict):
        raise BadFileError("corrupt .sfc file: header is not a JSON object")
    if canonical != raw:
        raise BadFileError("corrupt .sfc file: header JSON is not in canonical form")
    if reserved:  # version 4's release field
        if reserved > RELEASE_FIELD_MAX:
            raise BadFileError(f"corrupt .sfc file: release field {reserved} is out of range")
        if "codec" in header:
            raise BadFileError("corrupt .sfc file: the release is both in the fixed header and in the JSON")
        # "codec" sorts before every other key the codec writes; keep the canonical order
        header = dict(sorted({**header, "codec": release_string(reserved)}.items()))
    return header, end + _U32.size, version


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def peek_header(data: bytes) -> dict:
    """The header alone (for `info`): magic, version, header CRC and JSON; not the payload."""
    return _parse_header(data)[0]


def head(path) -> bytes:
    """The first bytes of a .sfc file, up to its header's CRC: all that peek_header reads, without
    reading the payload (a folder's files, for sfcodec -d's memory estimate). Fewer where the file is
    shorter or not a .sfc file (peek_header then says so); OSError where it cannot be read."""
    with open(path, "rb") as f:
        data = f.read(len(MAGIC) + _FIXED.size)
        if len(data) == len(MAGIC) + _FIXED.size and data.startswith(MAGIC):
            hlen = _FIXED.unpack_from(data, len(MAGIC))[2]
            data += f.read(min(hlen, MAX_HEADER_BYTES) + _U32.size)
    return data


def read_stream(f) -> bytes:
    """A .sfc file's bytes from an open binary stream (a file, standard input, a device), read to its
    end only when its first bytes are the magic number: anything else is refused as _parse_header
    refuses it, at once (0.9.36: `sfcodec decompress /dev/zero` read for ever)."""
    first = f.read(len(MAGIC))
    if first != MAGIC:
        _parse_header(first)  # not a .sfc file, or one cut inside the magic number: raises
    return first + f.read()


def format_version(data: bytes) -> int:
    """The format version of .sfc bytes whose header checks out (peek_header's checks)."""
    return _parse_header(data)[2]


def unpack(data: bytes) -> tuple[dict, np.ndarray]:
    """(header, payload words as native uint32) from the bytes of a .sfc file, fully checked (its
    metadata and low-bit sections too)."""
    return unpack_all(data)[:2]


def unpack_all(data: bytes) -> tuple[dict, np.ndarray, bytes, np.ndarray | None]:
    """(header, payload words, metadata section: b"" before version 5, low-bit section's words: None
    before version 6) of a .sfc file, fully checked."""
    header, pos, version = _parse_header(data)
    data = memoryview(data)
    has_section, has_low = version >= SECTION_VERSION, version >= DEEP_VERSION
    words, pos = _words(data, pos, "payload", last=not has_section)
    section = b""
    if has_section:
        block, pos = _framed(data, pos, "metadata section", last=not has_low)
        section = bytes(block)
    low = _words(data, pos, "low-bit section", last=True)[0] if has_low else None
    return header, words, section, low


def _words(data: memoryview, pos: int, what: str, last: bool) -> tuple[np.ndarray, int]:
    """A framed block of ANS words (a whole number of them, the last nonzero): (uint32 words, position after)."""
    block, pos = _framed(data, pos, what, last)
    if len(block) % 4:
        raise BadFileError(f"corrupt .sfc file: {what} size {len(block)} is not a whole number of words")
    words = np.frombuffer(block, dtype="<u4").astype(np.uint32)
    if len(words) and words[-1] == 0:
        raise BadFileError(f"corrupt .sfc file: {what} does not end in a nonzero ANS word")
    return words, pos


def _framed(data: memoryview, pos: int, what: str, last: bool) -> tuple[memoryview, int]:
    """The block at pos (u32 length, the bytes, u32 CRC32 of them): (its bytes, the position after its
    CRC). The length is compared with the bytes present before anything is sliced; `last`: nothing
    may follow it."""
    n = len(data)
    if n < pos + _U32.size:
        raise BadFileError(f"truncated .sfc file: cut inside the {what} length")
    (size,) = _U32.unpack_from(data, pos)
    pos += _U32.size
    rest = n - pos
    if size + _U32.size > rest:
        raise BadFileError(f"truncated .sfc file: declared {what} size ({size} bytes) is larger than the file "
                           f"(holds {max(0, rest - _U32.size)})")
    if last and size + _U32.size < rest:
        raise BadFileError(f"corrupt .sfc file: {rest - size - _U32.size} trailing bytes after the {what}")
    block = data[pos : pos + size]
    (crc,) = _U32.unpack_from(data, pos + size)
    if zlib.crc32(block) != crc:
        raise BadFileError(f"corrupt .sfc file: {what} CRC mismatch")
    return block, pos + size + _U32.size


_TYPE_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer",
               float: "a number", bool: "true/false"}


def require(header: dict, key: str, typ: type | tuple[type, ...]) -> Any:
    """header[key], or BadFileError when it is missing or not of type `typ` (bool is not int)."""
    if key not in header:
        raise BadFileError(f"corrupt .sfc file: header field '{key}' is missing")
    value = header[key]
    types = typ if isinstance(typ, tuple) else (typ,)
    if float in types and not isinstance(value, bool) and isinstance(value, int):
        return value  # JSON has one number type; 1 is a fine float
    if isinstance(value, bool) and bool not in types:
        ok = False
    else:
        ok = isinstance(value, types)
    if not ok:
        want = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)
        raise BadFileError(
            f"corrupt .sfc file: header field '{key}' should be {want}, got {type(value).__name__}"
        )
    return value
