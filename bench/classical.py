"""Classical lossless codecs that every benchmark compares against (DESIGN.md section 4).

Each peer is a ``ClassicalCodec``: a name, a settings string, ``encode(img) -> bytes`` and
``decode(data, channels) -> img`` on uint8 [H, W, C] arrays with C in 1..4, and
``unavailable_reason()`` (None when the installed library can code losslessly with it).
``measure`` codes one image with one codec, times both directions and checks the round trip.

All encoders run single-threaded so that times compare across codecs and are not skewed by
other jobs on a shared machine.
"""
from __future__ import annotations

import functools
import io
import struct
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from PIL import Image

try:
    import imagecodecs
except ImportError:  # Pillow's PNG still works without it
    imagecodecs = None

# The channels an encoder does not take natively are expanded before coding (gray -> RGB,
# gray+alpha -> RGBA) and folded back after decoding; bits/dim always counts the input's C.
_EXPAND = {1: 3, 2: 4}


@dataclass(frozen=True)
class ClassicalCodec:
    name: str
    settings: str
    _encode: Callable[[np.ndarray], bytes] = field(repr=False)
    _decode: Callable[[bytes], np.ndarray] = field(repr=False)
    channels: frozenset = frozenset({1, 2, 3, 4})  # channel counts the encoder takes natively
    requires: str = ""                              # imagecodecs attribute, e.g. "JPEGXL"

    def coded_channels(self, c: int) -> int:
        return c if c in self.channels else _EXPAND.get(c, c)

    def encode(self, img: np.ndarray) -> bytes:
        img = _check_image(img)
        c = img.shape[2]
        k = self.coded_channels(c)
        if k not in self.channels:
            raise ValueError(f"{self.name} cannot code {c}-channel images")
        if k != c:  # 1 -> 3 or 2 -> 4: repeat the gray plane, keep alpha last
            img = np.concatenate([img[..., :1]] * 3 + [img[..., 1:]], axis=2)
        data = self._encode(np.ascontiguousarray(img[..., 0] if k == 1 else img))
        return bytes(data)

    def decode(self, data: bytes, channels: int | None = None) -> np.ndarray:
        img = np.asarray(self._decode(data))
        if img.ndim == 2:
            img = img[..., None]
        c = img.shape[2]
        if channels is not None and channels != c and _EXPAND.get(channels) == c:
            gray = img[..., :1]
            # Fold back only if the expanded planes agree; otherwise the caller sees a
            # shape mismatch, i.e. not lossless.
            if all(np.array_equal(img[..., i : i + 1], gray) for i in (1, 2)):
                img = np.concatenate([gray, img[..., 3:]], axis=2)
        return img

    def unavailable_reason(self) -> str | None:
        if self.name not in _REASONS:
            _REASONS[self.name] = self._probe()
        return _REASONS[self.name]

    def _probe(self) -> str | None:
        if self.requires:
            if imagecodecs is None:
                return "imagecodecs is not installed"
            if not getattr(getattr(imagecodecs, self.requires, None), "available", False):
                return f"the installed imagecodecs {imagecodecs.__version__} has no {self.requires}"
        probe = _probe_image()
        try:
            out = self.decode(self.encode(probe), channels=3)
        except Exception as e:  # noqa: BLE001 - any failure means "not usable here"
            return f"round trip failed: {type(e).__name__}: {e}"
        if not np.array_equal(out, probe):
            return f"not lossless with these settings ({self.settings})"
        return None


_REASONS: dict[str, str | None] = {}


def _probe_image() -> np.ndarray:
    """Noise on a gradient: a lossy coder can't pass it by luck."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:24, 0:40]
    base = np.stack([x * 6, y * 10, (x + y) * 4], axis=2)
    return ((base + rng.integers(0, 64, base.shape)) % 256).astype(np.uint8)


def _check_image(img: np.ndarray) -> np.ndarray:
    img = np.asarray(img)
    if img.ndim == 2:
        img = img[..., None]
    if img.dtype != np.uint8 or img.ndim != 3 or not 1 <= img.shape[2] <= 4:
        raise ValueError(f"expected uint8 [H, W, C] with C in 1..4, got {img.dtype} {img.shape}")
    return img


@dataclass
class Measurement:
    codec: str
    nbytes: int | None
    bpd: float | None         # 8 * bytes / (H * W * C), C = the input's channels
    encode_s: float | None
    decode_s: float | None
    lossless: bool
    error: str | None = None
    coded_channels: int | None = None  # differs from the input's C when gray was expanded


def measure(codec: ClassicalCodec, img: np.ndarray) -> Measurement:
    """Encode, decode, compare. An exception is recorded, never raised."""
    img = _check_image(img)
    try:
        t0 = time.perf_counter()
        data = codec.encode(img)
        t1 = time.perf_counter()
        out = codec.decode(data, channels=img.shape[2])
        t2 = time.perf_counter()
    except Exception as e:  # noqa: BLE001 - one bad codec must not stop the benchmark
        return Measurement(codec.name, None, None, None, None, False, f"{type(e).__name__}: {e}")
    lossless = out.shape == img.shape and np.array_equal(out, img)
    return Measurement(codec.name, len(data), 8 * len(data) / img.size, t1 - t0, t2 - t1,
                       lossless, None if lossless else "decoded image differs from the input",
                       codec.coded_channels(img.shape[2]))


# --- the peers --------------------------------------------------------------------------

def _png_encode(img: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG", optimize=True)  # mode L, LA, RGB or RGBA
    return buf.getvalue()


def _png_decode(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)))


def _ic(fn: str, **kw) -> Callable:
    """Late lookup, so that a missing imagecodecs only shows up in unavailable_reason()."""
    return lambda x: getattr(imagecodecs, fn)(x, **kw)


# CharLS's "mrfx" APP8 segment selecting its HP1 colour transform: the stock decoder reads it
# and undoes the transform, so the file below is what CharLS writes with color_transformation=hp1
# (the imagecodecs binding exposes no such option).
_HP1_MARKER = b"\xff\xe8\x00\x07mrfx\x01"


def _jpegls_hp1_encode(img: np.ndarray) -> bytes:
    if img.ndim != 3 or img.shape[2] != 3:
        return imagecodecs.jpegls_encode(img, level=0)
    r, g, b = (img[..., i].astype(np.int16) for i in range(3))
    hp1 = np.stack([(r - g + 128) % 256, g, (b - g + 128) % 256], axis=2).astype(np.uint8)
    data = bytes(imagecodecs.jpegls_encode(hp1, level=0))
    return data[:2] + _HP1_MARKER + data[2:]  # right after SOI


def _avif_encode(img: np.ndarray) -> bytes:
    A = imagecodecs.AVIF
    kw = {}
    if img.ndim == 3 and img.shape[2] >= 3:
        # RGB through a YUV matrix is not lossless; identity at 4:4:4 is.
        kw = dict(pixelformat=A.PIXEL_FORMAT.YUV444, matrix=A.MATRIX_COEFFICIENTS.IDENTITY)
    return imagecodecs.avif_encode(img, level=A.QUALITY.LOSSLESS, numthreads=1, **kw)


_SEED_HEADER = struct.Struct(">IIB")  # height, width, channels


def _seed_encode(img: np.ndarray, version: int | None = None, effort: int | None = None) -> bytes:
    """scoreflow-codec's own classical codec, the one that codes a stream's first tiles (no model), at
    its encoder's effort (None: the default; the decoder needs none)."""
    from scoreflow_codec.coding.ans import Message
    from scoreflow_codec.coding.seed_codec import LATEST, effort as seed_effort, seed_codec

    planes = np.ascontiguousarray((img[..., None] if img.ndim == 2 else img).transpose(2, 0, 1))
    m = Message()
    with seed_effort(effort):
        seed_codec(planes.shape, version or LATEST).push(m, planes)
    return _SEED_HEADER.pack(planes.shape[1], planes.shape[2], planes.shape[0]) + m.words().astype("<u4").tobytes()


def _seed_decode(data: bytes, version: int | None = None) -> np.ndarray:
    from scoreflow_codec.coding.ans import Message
    from scoreflow_codec.coding.seed_codec import LATEST, seed_codec

    h, w, c = _SEED_HEADER.unpack_from(data)
    m = Message(np.frombuffer(data, dtype="<u4", offset=_SEED_HEADER.size).astype(np.uint32))
    return seed_codec((c, h, w), version or LATEST).pop(m).transpose(1, 2, 0)


CODECS: list[ClassicalCodec] = [
    ClassicalCodec("png", "Pillow optimize=True (zlib level 9)", _png_encode, _png_decode),
    ClassicalCodec("webp", "lossless=True quality=100 method=6 threads=1",
                   _ic("webp_encode", level=100, lossless=True, method=6, numthreads=1),
                   _ic("webp_decode"), frozenset({3, 4}), "WEBP"),
    ClassicalCodec("jpegxl", "lossless=True distance=0 effort=9 threads=1",
                   _ic("jpegxl_encode", effort=9, distance=0, lossless=True, numthreads=1),
                   _ic("jpegxl_decode", numthreads=1), frozenset({1, 2, 3, 4}), "JPEGXL"),
    ClassicalCodec("jpegls", "CharLS near=0, no colour transform", _ic("jpegls_encode", level=0),
                   _ic("jpegls_decode"), frozenset({1, 3, 4}), "JPEGLS"),
    ClassicalCodec("jpegls-hp1", "CharLS near=0, HP1 colour transform for RGB",
                   _jpegls_hp1_encode, _ic("jpegls_decode"), frozenset({1, 3, 4}), "JPEGLS"),
    ClassicalCodec("jpeg2000", "OpenJPEG reversible 5/3 wavelet + RCT threads=1",
                   _ic("jpeg2k_encode", reversible=True, numthreads=1),
                   _ic("jpeg2k_decode", numthreads=1), frozenset({1, 2, 3, 4}), "JPEG2K"),
    ClassicalCodec("qoi", "reference QOI", _ic("qoi_encode"), _ic("qoi_decode"),
                   frozenset({3, 4}), "QOI"),
    ClassicalCodec("avif", "libavif quality=lossless, RGB as identity matrix 4:4:4, threads=1",
                   _avif_encode, _ic("avif_decode", numthreads=1), frozenset({1, 3, 4}), "AVIF"),
    ClassicalCodec("sfc-seed", "scoreflow-codec's classical seed codec (no model), the latest version: "
                   "wavefront predictor blend + adaptive ANS, 9-byte header", _seed_encode, _seed_decode),
    ClassicalCodec("sfc-seed-e2", "the seed codec at effort 2 (--effort 2: no least-squares predictor)",
                   functools.partial(_seed_encode, effort=2), _seed_decode),
    ClassicalCodec("sfc-seed-e1", "the seed codec at effort 1 (--effort 1: nor the mixed mode)",
                   functools.partial(_seed_encode, effort=1), _seed_decode),
    ClassicalCodec("sfc-seed-1", "the seed codec's version 1 (files before 0.3.0)",
                   functools.partial(_seed_encode, version=1), functools.partial(_seed_decode, version=1)),
    ClassicalCodec("sfc-seed-2", "the seed codec's version 2 (files of 0.3.0)",
                   functools.partial(_seed_encode, version=2), functools.partial(_seed_decode, version=2)),
    ClassicalCodec("sfc-seed-3", "the seed codec's version 3 (files of 0.4.0)",
                   functools.partial(_seed_encode, version=3), functools.partial(_seed_decode, version=3)),
    ClassicalCodec("sfc-seed-4", "the seed codec's version 4 (files of 0.5.0 - 0.8.0)",
                   functools.partial(_seed_encode, version=4), functools.partial(_seed_decode, version=4)),
    ClassicalCodec("sfc-seed-6", "the seed codec's version 6 (files of 0.9.17 - 0.9.22)",
                   functools.partial(_seed_encode, version=6), functools.partial(_seed_decode, version=6)),
]
BY_NAME = {c.name: c for c in CODECS}


def select(names: list[str] | None = None) -> tuple[list[ClassicalCodec], dict[str, str]]:
    """The requested codecs (all by default) split into (available, {name: why not})."""
    unknown = [n for n in names or [] if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown codec(s) {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    chosen = [BY_NAME[n] for n in names] if names else CODECS
    ok, skipped = [], {}
    for c in chosen:
        reason = c.unavailable_reason()
        if reason:
            skipped[c.name] = reason
        else:
            ok.append(c)
    return ok, skipped
