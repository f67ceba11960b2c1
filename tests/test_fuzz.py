"""Damaged .sfc files through the api (decompress, read_header): every one is refused with an
SfcError subclass and a one-line message, quickly and without allocating much memory.

tests/test_container.py fuzzes the envelope on its golden bytes (unpack/peek_header). This file
starts from a real file made by api.compress, and also damages what the envelope's CRCs cannot
catch: headers that are re-packed with valid CRCs but hold wrong, absurd or hostile values.
"""
import copy
import json
import resource
import struct
import time
import tracemalloc
import zlib
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from PIL import Image

from scoreflow_codec import api, container, images
from scoreflow_codec.container import MAGIC
from scoreflow_codec.coding.seed_codec import VERSIONS as SEED_VERSIONS
from scoreflow_codec.errors import (BadFileError, DecodeMismatchError, ModelMismatchError, SfcError,
                                    UnsupportedVersionError)

from coding_models import gaussian_images, loaded_gaussian

MAX_SECONDS = 10.0        # per damaged file
MAX_ALLOC = 256 << 20     # bytes numpy/python may allocate while refusing one file


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return loaded_gaussian()


def _sources(model):
    g = torch.Generator().manual_seed(3)
    t = gaussian_images(model.model, 4, g)  # [4, 3, 32, 32]: in-distribution, so few steps code it
    rgb = np.ascontiguousarray(np.concatenate([np.concatenate(list(t[:2]), 2), np.concatenate(list(t[2:]), 2)],
                                              1).transpose(1, 2, 0)[:60, :50])
    rng = np.random.default_rng(0)
    rgba = np.dstack([rgb[:9, :7], rng.integers(0, 256, (9, 7), np.uint8)])
    pal = Image.fromarray(rng.integers(0, 8, (5, 6), np.uint8), "P")
    pal.putpalette(bytes(range(24)))
    # the palette coded as its colours (choice made): its tile makes the model code one of the stream's
    return [images.from_array(rgb), images.from_array(rgba), replace(images.from_pil(pal), coding_chosen=True)]


@pytest.fixture(scope="module")
def files(model):
    """Two real files (different images and settings) and their sources."""
    srcs = _sources(model)
    # seed codec version 4 for a: version 5's LZMA mode codes these synthetic tiles so well that the
    # stream's bits-back would never start (every tile a seed tile); a needs tiles through the model,
    # so its seed tiles are the first ("chosen" would leave the edge tiles, which this exact model
    # estimates from their padded pixels, and then all four to the seed codec)
    a, _ = api.compress(srcs, model, "ode", {"steps": 8},
                        stream_settings=replace(api.default_stream_settings(model), seed=4, seed_tiles="first",
                                                seed_context="tile"), fallback="off")
    assert not api.seed_only(api.read_header(a)["fields"])
    b, _ = api.compress(srcs[:1], model, "chain", {"steps": 64}, fallback="off")
    assert len(api.decompress(a, model)) == 3
    return _Files((a, b, srcs))


class _Files(tuple):
    def __repr__(self):  # hypothesis prints fixtures of a failing example
        return f"<files: {len(self[0])} and {len(self[1])} bytes>"


def _sections(data: bytes) -> dict:
    """Offsets where each section of the file starts (container.py's layout)."""
    hlen = struct.unpack_from("<I", data, 12)[0]
    hdr_end = 16 + hlen
    return {"version": 8, "reserved": 10, "header_len": 12, "header": 16, "header_crc": hdr_end,
            "payload_len": hdr_end + 4, "payload": hdr_end + 8, "payload_crc": len(data) - 4, "end": len(data)}


def _repack(data: bytes, edit) -> bytes:
    header, words = container.unpack(data)
    h = copy.deepcopy(header)
    edit(h)
    return container.pack(h, words)


def _refuse(data, model, cls=SfcError, *words, header_ok: bool | None = None, max_alloc=MAX_ALLOC) -> SfcError:
    """decompress(data) raises `cls` with a one-line message naming `words`, in bounded time and
    memory; read_header either raises an SfcError too or (payload damage) returns the header."""
    tracemalloc.start()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    try:
        with pytest.raises(SfcError) as e:
            api.decompress(data, model)
        dt = time.perf_counter() - t0
        try:
            api.read_header(data)
            header_read = True
        except SfcError as e2:
            assert str(e2) and "\n" not in str(e2)
            header_read = False
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    rss_growth_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0
    assert isinstance(e.value, cls), f"{type(e.value).__name__}: {e.value}"
    msg = str(e.value)
    assert msg and "\n" not in msg and len(msg) < 400
    for w in words:
        assert w in msg, msg
    assert dt < MAX_SECONDS, f"{dt:.1f}s to refuse: {msg}"
    assert peak < max_alloc, f"allocated {peak >> 20} MiB to refuse: {msg}"
    assert rss_growth_kb < (max_alloc >> 10), f"RSS grew {rss_growth_kb >> 10} MiB to refuse: {msg}"
    if header_ok is not None:
        assert header_read == header_ok, msg
    return e.value


def test_the_files_decode(files, model):
    a, b, srcs = files
    api.check_identical(srcs, api.decompress(a, model))
    api.check_identical(srcs[:1], api.decompress(b, model))


def test_truncation_at_every_section_boundary(files, model):
    a, _, _ = files
    sec = _sections(a)
    cuts = set(range(0, 9)) | {v + d for v in sec.values() for d in (-1, 0, 1)}
    cuts |= {int(k) for k in np.random.default_rng(0).integers(0, len(a), 60)}
    for k in sorted(c for c in cuts if 0 <= c < len(a)):
        # cut before the header CRC ends: read_header fails too; after it: read_header still works
        _refuse(a[:k], model, BadFileError, header_ok=k >= sec["payload_len"])
    assert "magic" in str(_refuse(a[:5], model, BadFileError))
    assert "truncated" in str(_refuse(a[:sec["header"] + 3], model, BadFileError))
    assert "payload length" in str(_refuse(a[:sec["payload_len"] + 2], model, BadFileError))
    assert "larger than the file" in str(_refuse(a[:-1], model, BadFileError))


def test_empty_and_foreign_bytes(files, model):
    a, _, _ = files
    _refuse(b"", model, BadFileError, "not a .sfc file")
    _refuse(b"\x89PNG\r\n\x1a\n" + a[8:], model, BadFileError, "magic")
    _refuse(b"GIF89a" + bytes(100), model, BadFileError)
    _refuse(a + b"\0", model, BadFileError, "trailing")
    _refuse(a + a, model, BadFileError)


def test_random_bit_flips(files, model):
    a, _, _ = files
    rng = np.random.default_rng(1234)
    for trial in range(150):
        bad = bytearray(a)
        for _ in range(1 + trial % 4):
            i = int(rng.integers(0, len(bad)))
            bad[i] ^= 1 << int(rng.integers(0, 8))
        if bytes(bad) != a:
            _refuse(bytes(bad), model, BadFileError)


def test_other_format_versions(files, model):
    a, _, _ = files
    assert container.format_version(a) == container.FORMAT_VERSION == 4
    for v in (0, 7, 0xFFFF):
        bad = bytearray(a)
        struct.pack_into("<H", bad, 8, v)
        # the version is checked before the CRC, so the message is about the version
        _refuse(bytes(bad), model, UnsupportedVersionError, f"format version {v}")
    for v in (1, 5, 6):  # a version this release reads: the header CRC catches it
        bad = bytearray(a)
        struct.pack_into("<H", bad, 8, v)
        _refuse(bytes(bad), model, BadFileError, "header CRC")


def _crc_fixed(data: bytearray) -> bytes:
    """Recompute both CRCs after editing the framing."""
    hlen = struct.unpack_from("<I", data, 12)[0]
    end = 16 + hlen
    struct.pack_into("<I", data, end, zlib.crc32(bytes(data[8:end])))
    return bytes(data)


def test_huge_declared_lengths(files, model):
    a, _, _ = files
    sec = _sections(a)
    for hlen in (container.MAX_HEADER_BYTES + 1, 2 ** 32 - 1):
        bad = bytearray(a)
        struct.pack_into("<I", bad, 12, hlen)
        _refuse(bytes(bad), model, BadFileError, "header length")
    bad = bytearray(a)
    struct.pack_into("<I", bad, 12, container.MAX_HEADER_BYTES)  # within the limit, beyond the file
    _refuse(bytes(bad), model, BadFileError, "truncated")
    for plen in (2 ** 32 - 4, 2 ** 31, len(a)):
        bad = bytearray(a)
        struct.pack_into("<I", bad, sec["payload_len"], plen)
        _refuse(bytes(bad), model, BadFileError, "larger than the file")


def _set(path: str, value):
    def edit(h):
        d = h
        keys = path.split(".")
        for k in keys[:-1]:
            d = d.setdefault(k, {})
        d[keys[-1]] = value
    return edit


HOSTILE = [  # header values re-packed with valid CRCs: each must be refused before any big allocation
    ("images", [[10 ** 6, 10 ** 6, "RGB", 1]], "size out of range"),
    ("images", [[10 ** 4, 10 ** 4, "RGB", 10 ** 5]], "pixels"),
    ("images", [[10 ** 4, 10 ** 4, "RGB", 11]], "pixels"),
    ("images", [[60, 50, "RGB", 10 ** 9]], "out of range"),
    ("images", [[0, 50, "RGB", 1]], "out of range"),
    ("images", [[60, 50, "CMYK", 1]], "image list"),
    ("images", [[60.5, 50, "RGB", 1]], "image list"),
    ("images", [], "count"),
    ("images", "RGB", "images"),
    ("setup.micro_batch", 10 ** 9, "micro_batch"),
    ("setup.micro_batch", 0, "micro_batch"),
    ("setup.micro_batch", "8", "micro_batch"),
    ("setup.micro_batch", True, "micro_batch"),
    ("setup.threads", 10 ** 9, "threads"),
    ("setup.threads", -1, "threads"),
    ("settings.steps", 10 ** 6, "steps"),
    ("settings.steps", 0, "steps"),
    ("settings.steps", 8.5, "steps"),
    ("settings.lattice_bits", 60, "lattice_bits"),
    ("settings.fp_max", 10 ** 9, "fp_max"),
    ("settings.sigma_ratio", 0, "sigma_ratio"),
    ("settings.schedule", "cosine", "schedule"),
    ("settings.new_knob", 1, "new_knob"),
    ("stream.tile", 1, "tile"),
    ("stream.tile", 10 ** 6, "tile"),
    ("stream.tile", 512, "pixels"),
    ("stream.max_batch", 0, "max_batch"),
    ("stream.max_batch", 10 ** 9, "max_batch"),
    ("stream.growth", -1, "growth"),
    ("stream.batching", "fixed", "batching"),
    ("stream.pad_words", 10 ** 12, "pad_words"),
    ("stream.seed", max(SEED_VERSIONS) + 1, "seed"),
    ("stream.seed", 0, "seed"),
    ("stream.seed", True, "seed"),
    ("stream.seed", 2.0, "seed"),
    ("stream.seed_tiles", "last", "seed_tiles"),
    ("stream.seed_tiles", 1, "seed_tiles"),
    ("stream.seed_context", "scene", "seed_context"),
    ("stream.seed_context", None, "seed_context"),
    ("fields.pad_words", 10 ** 9, "pad_words"),
    ("fields.pad_stripped", 10 ** 9, "pad_stripped"),
    ("fields.n_tiles", 10 ** 12, "tile counts"),
    ("fields.n_tiles", 0, "tile counts"),
    ("fields.n_seed", 10 ** 6, "tile counts"),
    ("fields.n_seed", -1, "n_seed"),
    ("fields", [], "fields"),
    ("mode", "flow", "mode"),
    ("model", "cifar10", "model"),
    ("crc32", "x", "crc32"),
    ("meta", [1], "metadata"),
    # image 0 is RGB: its transparent colour (0.10.6) is three integers below 2^16, as Pillow gives them
    ("meta.0.transparency", "x", "transparent colour"),
    ("meta.0.transparency", 7, "transparent colour"),
    ("meta.0.transparency", [1, 2], "transparent colour"),
    ("meta.0.transparency", [1, 2, 1 << 16], "transparent colour"),
    ("meta.0.transparency", [1, True, 3], "transparent colour"),
    ("meta.0.transparency", [1.0, 2, 3], "transparent colour"),
    ("meta.1.transparency", 7, "transparent colour on an image of mode RGBA"),  # image 1: RGBA, none
]


@pytest.mark.parametrize("path,value,word", HOSTILE, ids=[f"{p}={str(v)[:20]}" for p, v, _ in HOSTILE])
def test_hostile_header_values(files, model, path, value, word):
    a, _, _ = files
    _refuse(_repack(a, _set(path, value)), model, BadFileError, word, header_ok=False)


def test_header_consistent_but_wrong(files, model):
    """Values within bounds that do not describe this payload: refused by the stream checks or
    the pixel CRC, never returned as images."""
    a, _, srcs = files
    h = api.read_header(a)
    _refuse(_repack(a, _set("crc32", (h["crc32"] + 1) % 2 ** 32)), model, DecodeMismatchError, "CRC")
    _refuse(_repack(a, _set("fields.pad_stripped", h["fields"]["pad_stripped"] - 1)), model, SfcError)
    _refuse(_repack(a, _set("settings.steps", 9)), model, SfcError)
    _refuse(_repack(a, _set("stream.seed_tiles", "chosen")), model, SfcError)  # a's seed tiles are the first
    # a's seed tiles each alone, decoded as in the image's context (needs "chosen": set both)
    _refuse(_repack(a, lambda h: h["stream"].update(seed_tiles="chosen", seed_context="image")), model, SfcError)
    _refuse(_repack(a, _set("stream.seed_context", "image")), model, BadFileError, "seed_context")  # "first"
    _refuse(_repack(a, _set("images", [[60, 50, "RGB", 1], *h["images"][1:]])), model, SfcError)
    # A declared 10^8-pixel image (the per-image limit) with a consistent tile count: the decoder
    # allocates the image (300 MB) and starts decoding; the payload runs out of sense at once.
    big = _repack(a, lambda h: (h.update(images=[[10_000, 10_000, "RGB", 1]]),
                                h["fields"].update(n_tiles=313 * 313)))
    _refuse(big, model, BadFileError, max_alloc=400 << 20)
    _refuse(_repack(a, _set("model.sha256", "0" * 64)), model, ModelMismatchError, "sha256")


def test_header_swapped_from_another_file(files, model):
    a, b, _ = files
    sa, sb = _sections(a), _sections(b)
    swapped = b[:sb["payload_len"]] + a[sa["payload_len"]:]  # b's header (CRC ok), a's payload (CRC ok)
    _refuse(swapped, model, SfcError, header_ok=True)
    swapped = a[:sa["payload_len"]] + b[sb["payload_len"]:]
    _refuse(swapped, model, SfcError, header_ok=True)


# --- property tests --------------------------------------------------------------------------
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300), st.booleans())
def test_random_bytes(model, data, with_magic):
    data = (MAGIC + data) if with_magic else data
    with pytest.raises(BadFileError):
        api.read_header(data)
    with pytest.raises(BadFileError):
        api.decompress(data, model)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(st.data())
def test_random_mutations_of_a_real_file(files, model, data):
    a, _, _ = files
    bad = bytearray(a)
    kind = data.draw(st.sampled_from(["edit", "insert", "delete", "splice"]))
    i = data.draw(st.integers(0, len(a) - 1))
    if kind == "edit":
        bad[i] = data.draw(st.integers(0, 255).filter(lambda v: v != a[i]))
    elif kind == "insert":
        bad[i:i] = data.draw(st.binary(min_size=1, max_size=8))
    elif kind == "delete":
        del bad[i:i + data.draw(st.integers(1, 8))]
    else:
        j = data.draw(st.integers(0, len(a) - 1))
        bad[i:i + 4] = a[j:j + 4]
    if bytes(bad) == a:
        return
    _refuse(bytes(bad), model, BadFileError)


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70)
                    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                    max_leaves=6)


def _paths(h, prefix=()):
    for k, v in h.items():
        yield prefix + (k,)
        if isinstance(v, dict):
            yield from _paths(v, prefix + (k,))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(st.data())
def test_random_header_values(files, model, data):
    """A header field replaced by any JSON value (or deleted), re-packed with valid CRCs: the api
    decodes the original images or raises an SfcError: never another exception, wrong pixels,
    a hang or a big allocation."""
    a, _, srcs = files
    header, words = container.unpack(a)
    h = copy.deepcopy(header)
    paths = sorted(_paths(h))
    path = data.draw(st.sampled_from(paths))
    d = h
    for k in path[:-1]:
        d = d[k]
    if data.draw(st.booleans()):
        del d[path[-1]]
    else:
        d[path[-1]] = data.draw(JSON)
    if h == header:
        return
    bad = container.pack(h, words)
    t0 = time.perf_counter()
    try:
        back = api.decompress(bad, model)
    except SfcError as e:
        assert str(e) and "\n" not in str(e)
    else:  # only settings that do not change the decode (names, the torch version ...) may pass
        api.check_identical(srcs, back)
    assert time.perf_counter() - t0 < MAX_SECONDS
    try:
        json.dumps(api.read_header(bad))
    except SfcError:
        pass


def test_header_text_with_control_characters_stays_one_line(files, model):
    """Every header field in turn set to a text with a newline and an escape sequence (hypothesis found
    setup.dtype "\\n": "file was encoded in <newline> arithmetic ..."): a decode error is one line, the
    characters shown escaped (errors.one_line, 0.9.32)."""
    a, _, srcs = files
    header, words = container.unpack(a)
    nasty = "x\ny\x1b[2J\r"
    refused = 0
    for path in sorted(_paths(header)):
        h = copy.deepcopy(header)
        d = h
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = nasty
        try:
            api.check_identical(srcs, api.decompress(container.pack(h, words), model))
        except SfcError as e:
            refused += 1
            assert str(e) and "\n" not in str(e) and "\r" not in str(e) and "\x1b" not in str(e), (path, str(e))
    assert refused > 10
    e = BadFileError(f"file was encoded in {nasty} arithmetic")
    assert str(e) == "file was encoded in x\\ny\\x1b[2J\\r arithmetic" and e.exit_code == 4
    assert str(SfcError("caf\u00e9 \u65e5\u672c\ttab")) == "caf\u00e9 \u65e5\u672c\\ttab"  # letters kept


# --- a seed codec file in independent parts (0.9.26) ---------------------------------------------
PARTS_AT = 1024  # stream.PART_PIXELS while these tests run: their small images make two parts


@pytest.fixture(scope="module")
def parts_file():
    from scoreflow_codec.coding import stream

    rng = np.random.default_rng(4)
    srcs = [images.from_array(rng.integers(0, 256, (40, 30, 3), np.uint8)),
            images.from_array(rng.integers(0, 256, (20, 24, 4), np.uint8))]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stream, "PART_PIXELS", PARTS_AT)
        data, _ = api.compress(srcs, None, fallback="seed")
    assert len(api.read_header(data)["fields"]["parts"]) == 2
    return data, srcs


PARTS_HOSTILE = [[], [[1, 0]], [[1, 0]] * 3, [[1, 0], [2]], [[1, 0], [2, 0, 0]], [[1, 0], [-2, 0]],
                 [[1, 0], [2, 10 ** 9]], [[1, 0], ["2", 0]], [[1, 0], [2.0, 0]], [[1, 0], [None, 0]],
                 [[False, 0], [1, 0]], [[10 ** 12, 0], [1, 0]], "parts", {"0": [1, 0]}, 7]


@pytest.mark.parametrize("value", PARTS_HOSTILE, ids=[str(v)[:24] for v in PARTS_HOSTILE])
def test_hostile_parts(parts_file, monkeypatch, value):
    from scoreflow_codec.coding import stream

    monkeypatch.setattr(stream, "PART_PIXELS", PARTS_AT)
    data, srcs = parts_file
    assert all(np.array_equal(a.color, b.color) for a, b in zip(api.decompress(data, None), srcs))
    _refuse(_repack(data, _set("fields.parts", value)), None, BadFileError, "parts")


def test_parts_that_do_not_describe_the_payload(parts_file, files, model, monkeypatch):
    """Within bounds but wrong: words moved between the parts, the stripped padding changed, the
    parts taken away, or parts named in a stream that is not coded in parts: refused."""
    from scoreflow_codec.coding import stream

    monkeypatch.setattr(stream, "PART_PIXELS", PARTS_AT)
    data, _ = parts_file
    (n0, s0), (n1, s1) = api.read_header(data)["fields"]["parts"]
    for parts in ([[n0 - 1, s0], [n1 + 1, s1]], [[n0 + 1, s0], [n1 - 1, s1]], [[n0, 1 - s0], [n1, s1]],
                  [[n0, s0], [n1, 1 - s1]]):
        _refuse(_repack(data, _set("fields.parts", parts)), None, BadFileError, "part")
    _refuse(_repack(data, lambda h: h["fields"].pop("parts")), None, BadFileError)
    a, _, _ = files
    _refuse(_repack(a, _set("fields.parts", [[1, 0], [1, 0]])), model, BadFileError, "parts")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.data())
def test_random_parts(parts_file, monkeypatch, data):
    """The parts' numbers replaced by any integers (or a pair by any JSON value): the original
    images or an SfcError, never another exception, a hang or wrong pixels."""
    from scoreflow_codec.coding import stream

    monkeypatch.setattr(stream, "PART_PIXELS", PARTS_AT)
    good, srcs = parts_file
    header, words = container.unpack(good)
    h = copy.deepcopy(header)
    k, j = data.draw(st.integers(0, 1)), data.draw(st.integers(0, 1))
    if data.draw(st.booleans()):
        h["fields"]["parts"][k][j] = data.draw(st.integers(-5, 2 * len(words)))
    else:
        h["fields"]["parts"][k] = data.draw(JSON)
    t0 = time.perf_counter()
    try:
        back = api.decompress(container.pack(h, words), None)
    except SfcError as e:
        assert str(e) and "\n" not in str(e)
    else:
        api.check_identical(srcs, back)
    assert time.perf_counter() - t0 < MAX_SECONDS


# --- the metadata section (format version 5, 0.9.27) -------------------------------------------
@pytest.fixture(scope="module")
def meta_file():
    """A seed codec file (fast to decode) of two images, the first with metadata in the section."""
    rng = np.random.default_rng(5)
    a, b = images.from_array(rng.integers(0, 256, (12, 9, 3), np.uint8)), images.from_array(rng.integers(0, 256, (5, 4), np.uint8))
    when = b"tIME" + bytes([7, 234, 11, 30, 12, 34, 5])  # a PNG's other chunk (0.9.31), with its place
    a.metadata = {"icc": bytes(range(256)) * 3, "exif": b"MM\0*" + bytes(20), "text": [["k", "v"]], "dpi": [72.0, 72.0],
                  "png": b"\0" + struct.pack(">I", 7) + when + struct.pack(">I", zlib.crc32(when))}
    data, _ = api.compress([a, b], None, fallback="seed")
    assert container.format_version(data) == 5 and api.decompress(data)[0].metadata == a.metadata
    return data


def _with_section(data: bytes, section: bytes, edit=None) -> bytes:
    header, words, _, _ = container.unpack_all(data)
    h = copy.deepcopy(header)
    if edit:
        edit(h)
    return container.pack(h, words, version=5, section=section)


def test_damaged_metadata_sections(meta_file):
    data = meta_file
    section = container.unpack_all(data)[2]
    start = len(data) - 8 - len(section)  # the section's length field
    for k in sorted({start - 1, start, start + 2, start + 4, start + 5, len(data) - 5, len(data) - 1}):
        _refuse(data[:k], None, BadFileError, header_ok=True)
    rng = np.random.default_rng(7)
    for _ in range(60):  # bit flips in the section or its framing: its CRC (or length) catches each
        bad = bytearray(data)
        bad[int(rng.integers(start, len(data)))] ^= 1 << int(rng.integers(0, 8))
        _refuse(bytes(bad), None, BadFileError, header_ok=True)
    _refuse(data + b"\0", None, BadFileError, "trailing bytes after the metadata")
    # valid CRCs around wrong content: garbage, a cut stream, a bomb, a section no image lists
    bomb = zlib.compressobj(9, zlib.DEFLATED, -15)
    bomb = bomb.compress(b"\0" * (200 << 20)) + bomb.flush()
    for sec, word in ((b"\xff" * 40, "inflate"), (section[:-3], "does not hold"), (section + b"\0", "does not hold"),
                      (bomb, "does not hold"), (b"", "does not hold")):
        _refuse(_with_section(data, sec), None, BadFileError, word, header_ok=True, max_alloc=32 << 20)

    def unlisted(h):
        del h["meta"]["0"]["kept"]
    _refuse(_with_section(data, section, unlisted), None, BadFileError, "no image lists", header_ok=True)

    def wrong_length(h):
        h["meta"]["0"]["kept"]["icc"] += 1
    _refuse(_with_section(data, section, wrong_length), None, BadFileError, "does not hold", header_ok=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(st.data())
def test_random_metadata_sections(meta_file, data):
    """Any section bytes and any kept entry, with valid CRCs: decoded or refused with a one-line message."""
    section = container.unpack_all(meta_file)[2]
    raw = zlib.decompress(section, -15)
    choice = data.draw(st.sampled_from(["bytes", "deflated", "entry"]))
    if choice == "bytes":
        sec, edit = data.draw(st.binary(max_size=200)), None
    elif choice == "deflated":  # well-formed DEFLATE of other contents: lengths, JSON, UTF-8 all wrong
        body = data.draw(st.binary(max_size=64)) + raw[data.draw(st.integers(0, len(raw))):]
        comp = zlib.compressobj(9, zlib.DEFLATED, -15)
        sec, edit = comp.compress(body) + comp.flush(), None
    else:
        entry = data.draw(st.dictionaries(st.sampled_from(["icc", "exif", "xmp", "info", "png", "x"]),
                                          st.integers(-2, 2000) | st.booleans() | st.text(max_size=3), max_size=4))
        sec = section

        def edit(h):
            h["meta"]["0"]["kept"] = entry
    bad = _with_section(meta_file, sec, edit)
    try:
        back = api.decompress(bad)
    except SfcError as e:
        assert str(e) and "\n" not in str(e)
        return
    for s in back:  # decoded: metadata a PNG can be written with
        images.encode_image(images.to_pil(s), ".png", s.metadata)
