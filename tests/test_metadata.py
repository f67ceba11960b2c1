"""An image's metadata (metadata.py): read from each input format, written back where the output
format holds it, stored in a .sfc file's section (format version 5), refused cleanly when corrupt.

The PNG checks read the written file's chunks by hand (the PNG specification's layout), not
through Pillow, which wrote them."""
from __future__ import annotations

import io
import json
import struct
import tracemalloc
import warnings
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from PIL import Image, ImageCms, PngImagePlugin

from scoreflow_codec import api, container, deep, images, metadata as md
from scoreflow_codec.errors import BadFileError, DecodeMismatchError, UnsupportedImageError, UnsupportedVersionError

ICC = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
XMP = '<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF>Größe</rdf:RDF></x:xmpmeta>'


def _exif(orientation: int = 6) -> bytes:
    e = Image.Exif()
    e[0x0112], e[0x010F] = orientation, "Camera"
    return e.tobytes()  # Pillow's "Exif\0\0" + TIFF structure


def _pixels(h=20, w=30, seed=0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def _png(img: Image.Image | None = None, *, icc=True, exif=True, xmp=True, text=True, colour=True, dpi=True,
         srgb=False) -> bytes:
    info = PngImagePlugin.PngInfo()
    if text:
        info.add_text("Title", "a title")
        info.add_itxt("Description", "ünï 色", "de", "Beschreibung")
    if xmp:
        info.add_itxt("XML:com.adobe.xmp", XMP)
    if colour:
        info.add(b"gAMA", struct.pack(">I", 45455))
        info.add(b"cHRM", struct.pack(">8I", 31270, 32900, 64000, 33000, 30000, 60000, 15000, 6000))
    if srgb:
        info.add(b"sRGB", b"\x01")
    kw = {"pnginfo": info}
    if icc:
        kw["icc_profile"] = ICC
    if exif:
        kw["exif"] = _exif()
    if dpi:
        kw["dpi"] = (300, 300)
    buf = io.BytesIO()
    (img or _pixels()).save(buf, "PNG", **kw)
    return buf.getvalue()


def _load(data: bytes, tmp_path, name="in.png") -> images.SourceImage:
    p = tmp_path / name
    p.write_bytes(data)
    return images.load_image(p)


def _reload(data: bytes) -> images.SourceImage:
    with Image.open(io.BytesIO(data)) as im:
        im.load()
        return images.from_pil(im)


def _chunks(png: bytes) -> list[tuple[bytes, bytes]]:
    """(type, data) of every chunk, CRCs checked: the PNG specification's layout."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    out, pos = [], 8
    while pos < len(png):
        (n,) = struct.unpack_from(">I", png, pos)
        kind, data = png[pos + 4:pos + 8], png[pos + 8:pos + 8 + n]
        assert struct.unpack_from(">I", png, pos + 8 + n)[0] == zlib.crc32(kind + data)
        out.append((kind, data))
        pos += 12 + n
    return out


# --- reading ------------------------------------------------------------------------------------
def test_read_a_png(tmp_path):
    m = _load(_png(), tmp_path).metadata
    assert m["icc"] == ICC
    assert m["exif"] == _exif()[6:] and m["exif"][:2] == b"MM"  # the "Exif\0\0" prefix taken off
    assert m["xmp"] == XMP.encode("utf-8")
    assert m["text"] == [["Title", "a title"], ["Description", "ünï 色", "de", "Beschreibung"]]  # not the XMP
    assert m["gamma"] == 0.45455 and m["chromaticity"] == [0.3127, 0.329, 0.64, 0.33, 0.3, 0.6, 0.15, 0.06]
    assert m["dpi"] == [pytest.approx(300, abs=0.01)] * 2
    assert set(m) == {"icc", "exif", "xmp", "text", "gamma", "chromaticity", "dpi"}
    assert _load(_png(icc=False, exif=False, xmp=False, text=False, colour=False, dpi=False), tmp_path).metadata == {}
    assert images.from_array(np.zeros((3, 4, 3), np.uint8)).metadata == {}


def test_png_xmp_from_its_text_chunk_where_pillow_gives_no_xmp(tmp_path):
    """Pillow gives a PNG's XMP both as info["xmp"] and as the text chunk "XML:com.adobe.xmp"; one
    that gave only the chunk: the same metadata."""
    p = tmp_path / "x.png"
    p.write_bytes(_png())
    with Image.open(p) as im:
        im.load()
        full = md.read(im)
        del im.info["xmp"]
        assert md.read(im) == full and full["xmp"] == XMP.encode("utf-8")


def test_read_a_jpeg_and_a_webp(tmp_path):
    """JPEG (lossy, but its pixels are what Pillow gives) and WebP carry ICC, EXIF and XMP."""
    for fmt, kw in (("JPEG", {"quality": 95}), ("WEBP", {"lossless": True})):
        buf = io.BytesIO()
        _pixels().save(buf, fmt, icc_profile=ICC, exif=_exif(), xmp=XMP.encode(), **kw)
        m = _load(buf.getvalue(), tmp_path, f"in.{fmt.lower()}").metadata
        assert m["icc"] == ICC and m["exif"] == _exif()[6:] and m["xmp"] == XMP.encode(), fmt


# --- writing ------------------------------------------------------------------------------------
def test_png_keeps_everything(tmp_path):
    src = _load(_png(), tmp_path)
    out = images.encode_image(images.to_pil(src), ".png", src.metadata)
    chunks = _chunks(out)
    kinds = [k for k, _ in chunks]
    # the colour chunks before the image data, as the PNG specification requires
    assert all(kinds.index(k) < kinds.index(b"IDAT") for k in (b"iCCP", b"gAMA", b"cHRM", b"pHYs"))
    data = dict(chunks)
    name, rest = data[b"iCCP"].split(b"\0", 1)
    assert rest[0] == 0 and zlib.decompress(rest[1:]) == ICC
    assert data[b"eXIf"] == src.metadata["exif"]
    assert struct.unpack(">I", data[b"gAMA"]) == (45455,)
    assert struct.unpack(">8I", data[b"cHRM"]) == (31270, 32900, 64000, 33000, 30000, 60000, 15000, 6000)
    assert struct.unpack(">IIB", data[b"pHYs"]) == (11811, 11811, 1)  # 300 dpi in pixels per metre
    itxt = [d for k, d in chunks if k == b"iTXt"]
    assert any(d.startswith(b"XML:com.adobe.xmp\0\0\0\0\0") and d.endswith(XMP.encode()) for d in itxt)
    assert b"tEXt" in kinds and _reload(out).metadata == src.metadata
    assert images.metadata_dropped(src.metadata, ".png") == []


def test_other_formats_keep_what_they_hold(tmp_path):
    src = _load(_png(), tmp_path)
    held = {".webp": {"icc", "exif", "xmp"}, ".tif": {"icc", "dpi", "exif", "xmp"}, ".bmp": {"dpi"}, ".ppm": set()}
    for suffix, keeps in held.items():
        dropped = images.metadata_dropped(src.metadata, suffix)
        assert sorted(dropped) == sorted(md.NAMES[k] for k in src.metadata if k not in keeps), suffix
        back = _reload(images.encode_image(images.to_pil(src), suffix, src.metadata)).metadata
        for k in keeps - {"dpi", "exif" if suffix == ".tif" else ""}:
            assert back[k] == src.metadata[k], (suffix, k)
        if suffix == ".tif":  # the EXIF as the TIFF's own tags; Pillow turns the pixels by its orientation on loading
            assert _tags(back["exif"]) == {k: v for k, v in _tags(src.metadata["exif"]).items() if k != 0x0112}
        if "dpi" in keeps:  # TIFF keeps a rational, BMP whole pixels per metre
            assert back["dpi"] == [pytest.approx(300, abs=0.02)] * 2, suffix
        assert not {"text", "gamma", "chromaticity"} & set(back), suffix


def _tags(exif: bytes) -> dict:
    e = Image.Exif()
    e.load(b"Exif\0\0" + exif)
    top = {k: v for k, v in e.items() if k not in md.EXIF_DIRECTORIES}  # not the directories' offsets
    return {**top, **{(d, k): v for d in md.EXIF_DIRECTORIES for k, v in e.get_ifd(d).items()}}


def _tiff_with_exif(path, xmp: bool = True):
    """A TIFF as a raw developer exports one: EXIF in its own tags (make, model, software, date; the Exif
    directory's capture date, exposure, MakerNote; GPS), XMP in tag 700."""
    e = Image.Exif()
    e[0x010F], e[0x0110], e[0x0131], e[0x0132] = "Camera", "Model X", "darktable 4.6", "2024:05:06 07:08:09"
    e[0x8298] = "(c) someone"
    sub = e.get_ifd(0x8769)
    sub[0x9003], sub[0x829A], sub[0x927C] = "2024:05:06 07:08:09", 0.004, b"maker's own bytes"
    e.get_ifd(0x8825)[1] = "N"
    if xmp:
        e[700] = XMP.encode()
    _pixels().save(path, "TIFF", exif=e.tobytes())  # (Pillow writes the directories only uncompressed)
    return path


def test_a_tiffs_exif_and_xmp_are_kept(tmp_path):
    """A TIFF's EXIF lives in its own tags (not an EXIF block): its metadata tags, Exif and GPS directories
    and XMP (tag 700) are kept (0.9.29), its structure (size, strips, compression) not; they come back in
    a PNG (eXIf, iTXt), a WebP and a TIFF; a TIFF without such tags has no EXIF."""
    src = images.load_image(_tiff_with_exif(tmp_path / "dev.tif"))
    tags = _tags(src.metadata["exif"])
    assert tags[0x010F] == "Camera" and tags[0x0131] == "darktable 4.6" and tags[0x8298] == "(c) someone"
    assert tags[(0x8769, 0x9003)] == "2024:05:06 07:08:09" and tags[(0x8769, 0x927C)] == b"maker's own bytes"
    assert tags[(0x8825, 1)] == "N" and src.metadata["xmp"] == XMP.encode()
    assert not {256, 257, 258, 259, 262, 273, 277, 278, 279, 700} & set(tags)  # structure and XMP: not EXIF tags
    data, _ = api.compress([src], None, fallback="seed")
    back = api.decompress(data)[0]
    assert back.metadata == src.metadata
    for suffix in (".png", ".webp", ".tif"):
        p = tmp_path / f"out{suffix}"
        p.write_bytes(images.encode_source(back, suffix))
        again = images.load_image(p).metadata
        assert _tags(again["exif"]) == tags and again["xmp"] == XMP.encode(), suffix
        assert "EXIF" not in images.metadata_dropped(back.metadata, suffix)
    _pixels().save(tmp_path / "plain.tif")
    assert "exif" not in images.load_image(tmp_path / "plain.tif").metadata
    # an EXIF whose values its tags' types cannot hold (a damaged one, kept from a JPEG or PNG as it was):
    # the TIFF is still written, without it, and the warning says why
    bad = Image.Exif()
    bad[0x0112], bad[0x010F] = 3, "Camera"
    raw = bytearray(bad.tobytes()[6:])
    at = raw.index(b"\x01\x12\x00\x03") if raw[:2] == b"MM" else raw.index(b"\x12\x01\x03\x00")
    raw[at + 2:at + 4] = b"\x00\x08" if raw[:2] == b"MM" else b"\x08\x00"  # orientation as SSHORT ...
    raw[at + 8:at + 10] = b"\xff\xfb" if raw[:2] == b"MM" else b"\xfb\xff"  # ... -5
    meta = {"exif": bytes(raw), "xmp": b"<x/>"}
    dropped = images.metadata_dropped(meta, ".tif")
    assert dropped == ["EXIF (tags Pillow cannot write into a TIFF)"]
    out = _reload(images.encode_image(_pixels(), ".tif", meta))
    assert "exif" not in out.metadata and out.metadata["xmp"] == b"<x/>"


def _camera_exif() -> bytes:
    """A camera's EXIF, big-endian, written by hand: make and orientation in its first directory, a
    pointer to its Exif directory (capture date), which points to an Interoperability directory."""
    def directory(entries, extra_at):
        out, extra = struct.pack(">H", len(entries)), b""
        for tag, typ, count, val in entries:
            if len(val) <= 4:
                out += struct.pack(">HHI", tag, typ, count) + val.ljust(4, b"\0")
            else:
                out += struct.pack(">HHII", tag, typ, count, extra_at + len(extra))
                extra += val
        return out + struct.pack(">I", 0), extra

    date = b"2024:01:01 00:00:00\0"
    exif_at = 8 + 2 + 3 * 12 + 4
    inter_at = exif_at + 2 + 2 * 12 + 4 + len(date)
    first, x0 = directory([(0x010F, 2, 4, b"Cam\0"), (0x0112, 3, 1, struct.pack(">H", 1)),
                           (0x8769, 4, 1, struct.pack(">I", exif_at))], exif_at)
    exif, x1 = directory([(0x9003, 2, len(date), date), (0xA005, 4, 1, struct.pack(">I", inter_at))],
                         exif_at + 2 + 2 * 12 + 4)
    inter, x2 = directory([(0x0001, 2, 4, b"R98\0")], inter_at + 18)
    return b"MM\0*" + struct.pack(">I", 8) + first + x0 + exif + x1 + inter + x2


def test_a_tiff_gets_no_pointer_that_points_nowhere():
    """Pillow writes a directory's pointer to another (the Exif directory's to its Interoperability one)
    again as a plain number: into a TIFF, an offset to whatever lies there. A TIFF output gets the EXIF's
    metadata tags and its Exif directory without that pointer, and reading a TIFF keeps none."""
    raw = _camera_exif()
    e = Image.Exif()
    e.load(raw)
    assert e.get_ifd(0x8769)[0xA005] and e.get_ifd(0xA005) == {1: "R98"}  # what a camera writes
    data = images.encode_image(_pixels(), ".tif", {"exif": raw})
    assert struct.pack("<HH", 0xA005, 4) not in data and struct.pack(">HH", 0xA005, 4) not in data
    tiff = Image.open(io.BytesIO(data))
    tiff.load()
    assert tiff.getexif()[0x010F] == "Cam" and tiff.getexif().get_ifd(0x8769) == {0x9003: "2024:01:01 00:00:00"}
    pillows = io.BytesIO()
    _pixels().save(pillows, "TIFF", exif=raw)  # Pillow's own TIFF: its Exif directory keeps the stale pointer
    kept = md.read(Image.open(io.BytesIO(pillows.getvalue())))
    got = {k: v for k, v in _tags(kept["exif"]).items() if k != 0x0112}  # orientation: Pillow's to apply or not
    assert got == {0x010F: "Cam", (0x8769, 0x9003): "2024:01:01 00:00:00"}


def test_png_drops_what_it_cannot_hold():
    both = {"icc": ICC, "srgb": 0}  # PNG holds a profile or an sRGB intent, not both
    assert md.save_options(both, "PNG")[1] == ["sRGB intent (beside an ICC profile)"]
    assert md.save_options({"srgb": 2}, "PNG")[1] == []
    assert md.save_options({"xmp": b"\xff\xfe<x/>"}, "PNG")[1] == ["XMP (not UTF-8)"]
    chunks = dict(_chunks(images.encode_image(_pixels(), ".png", {"srgb": 2})))
    assert chunks[b"sRGB"] == b"\x02"


def test_exif_orientation_survives_a_jpeg_to_png(tmp_path):
    """A phone's JPEG, stored rotated with orientation 6: the PNG that decompress writes has the same
    stored pixels and the tag, so a viewer turns it as it turned the JPEG."""
    buf = io.BytesIO()
    _pixels().save(buf, "JPEG", exif=_exif(6))
    src = _load(buf.getvalue(), tmp_path, "phone.jpg")
    data, _ = api.compress([src], None, fallback="seed")
    back = api.decompress(data)[0]
    png = Image.open(io.BytesIO(images.encode_image(images.to_pil(back), ".png", back.metadata)))
    assert png.getexif()[0x0112] == 6 and png.size == (30, 20)


# --- the .sfc section -----------------------------------------------------------------------------
def test_pack_and_unpack(tmp_path):
    full = _load(_png(), tmp_path).metadata
    mds = [full, {}, {"dpi": [72.0, 72.0]}, {"icc": b"x" * 5000}]
    entries, section = md.pack(mds)
    assert entries[0] == {"icc": len(ICC), "exif": len(full["exif"]), "xmp": len(full["xmp"]),
                          "info": len(md._info_blob(full))}
    assert entries[1] == {} and entries[2] == {"info": len(b'{"dpi":[72.0,72.0]}')} and entries[3] == {"icc": 5000}
    raw = zlib.decompress(section, -15)
    assert raw == ICC + full["exif"] + full["xmp"] + md._info_blob(full) + b'{"dpi":[72.0,72.0]}' + b"x" * 5000
    assert md.unpack(entries, section) == mds
    assert md.pack([{}, {}]) == ([{}, {}], b"") and md.unpack([{}, {}], b"") == [{}, {}]
    assert json.loads(md._info_blob({"gamma": 1.0}))["gamma"] == 1.0 and md.unpack(*md.pack([{"gamma": 1.0}]))[0]["gamma"] == 1.0


def test_metadata_over_the_limit_is_refused(monkeypatch):
    monkeypatch.setattr(md, "MAX_BYTES", 100)
    md.pack([{"icc": b"x" * 100}])
    with pytest.raises(UnsupportedImageError, match="--no-metadata"):
        md.pack([{"icc": b"x" * 60}, {"exif": b"y" * 41}])


def _refused(entries, section, words=""):
    with pytest.raises(BadFileError) as e:
        md.unpack(entries, section)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_corrupt_sections_are_refused():
    entries, section = md.pack([{"icc": b"abc" * 100, "gamma": 0.5}])
    _refused(entries, section[:-1], "does not hold")
    _refused(entries, section + b"\0", "does not hold")
    _refused(entries, b"\xff" * 10, "does not inflate")
    _refused([{}], section, "no image lists")
    _refused([{"icc": 299, "info": entries[0]["info"]}], section, "does not hold")  # one byte short
    _refused([{"icc": 301, "info": entries[0]["info"]}], section, "does not hold")
    bomb = zlib.compressobj(9, zlib.DEFLATED, -15)
    bomb = bomb.compress(b"\0" * (1 << 24)) + bomb.flush()
    tracemalloc.start()
    _refused([{"icc": 10}], bomb, "does not hold")  # inflates 11 bytes, not 16 MiB, then stops
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20, peak
    for bad in ([{"icc": 0}], [{"icc": -1}], [{"icc": True}], [{"icc": 1.0}], [{"nope": 3}], [{}], ["x"],
                [{"icc": md.MAX_BYTES + 1}], [{"icc": md.MAX_BYTES}, {"exif": 1}]):
        with pytest.raises(BadFileError, match="corrupt header"):
            md.check_entries(bad)


@pytest.mark.parametrize("info", [
    b"not json", b"[]", b"{}", b'{"nope":1}', b'{"gamma":0}', b'{"gamma":-1}', b'{"gamma":"1"}', b'{"gamma":1e999}',
    b'{"srgb":4}', b'{"srgb":true}', b'{"srgb":1.0}', b'{"dpi":[0,1]}', b'{"dpi":[1]}', b'{"dpi":[1,2,3]}',
    b'{"chromaticity":[1,2]}', b'{"chromaticity":[-1,0,0,0,0,0,0,0]}', b'{"text":[]}', b'{"text":[["k"]]}',
    b'{"text":[["k","v","l"]]}', b'{"text":[["","v"]]}', '{"text":[["色","v"]]}'.encode(), b'{"text":[["k\\u0000","v"]]}',
    b'{"text":[["k","v","l\\u0000","t"]]}', b'{"text":[["k","\\ud800"]]}', b'{"text":[["' + b"k" * 80 + b'","v"]]}',
    b'{"text":[["k",1]]}', b"\xff"])
def test_bad_info_is_refused(info):
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    _refused([{"info": len(info)}], comp.compress(info) + comp.flush(), "bad metadata")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.sampled_from(md.INFO_KEYS + ("x",)), c, max_size=4),
                    max_leaves=12))
def test_any_info_json_decodes_or_is_refused(value):
    """Whatever JSON the info blob holds: refused, or metadata that a PNG can be written with."""
    info = json.dumps(value).encode()
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    try:
        (m,) = md.unpack([{"info": len(info)}], comp.compress(info) + comp.flush())
    except BadFileError:
        return
    images.encode_image(_pixels(4, 4), ".png", m)


# --- through the codec -----------------------------------------------------------------------------
def test_a_file_keeps_its_images_metadata(tmp_path):
    a, b = _load(_png(), tmp_path, "a.png"), _load(_png(_pixels(seed=1), icc=False, exif=False, colour=False), tmp_path, "b.png")
    data, rep = api.compress([a, b], None, fallback="seed")
    assert container.format_version(data) == 5
    h = api.read_header(data)
    assert set(h["meta"]["0"]["kept"]) == {"icc", "exif", "xmp", "info"} and set(h["meta"]["1"]["kept"]) == {"xmp", "info"}
    back = api.decompress(data)
    assert [s.metadata for s in back] == [a.metadata, b.metadata] and all("kept" not in s.meta for s in back)
    api.check_identical([a, b], back)
    # the same pixels without metadata: a version 4 file (as 0.9.26 wrote), the same payload
    bare = [images.SourceImage(s.mode, s.color, s.extra, dict(s.meta)) for s in (a, b)]
    data0, rep0 = api.compress(bare, None, fallback="seed")
    assert container.format_version(data0) == 4 and "meta" not in api.read_header(data0)
    assert np.array_equal(container.unpack(data)[1], container.unpack(data0)[1])
    assert rep.metadata_bytes == len(container.unpack_all(data)[2]) + 8 and rep0.metadata_bytes == 0
    assert rep.file_bytes == rep.header_bytes + rep.payload_bits // 8 + rep.metadata_bytes
    assert [s.metadata for s in api.decompress(data0)] == [{}, {}]
    with pytest.raises(DecodeMismatchError, match="metadata"):
        api.check_identical([a, b], api.decompress(data0))


def test_a_callers_kept_entry_is_not_written():
    """meta["kept"] describes the file's section; one in a caller's meta (hand-made) is not copied."""
    src = images.from_array(np.zeros((6, 7, 3), np.uint8))
    src.meta["kept"] = {"icc": 5}
    data, _ = api.compress([src], None, fallback="seed")
    assert container.format_version(data) == 4 and "meta" not in api.read_header(data)
    assert api.decompress(data)[0].metadata == {}


def test_palette_coded_as_indices_keeps_its_metadata(tmp_path):
    """choose_palette_coding may swap a palette image for its index plane: the metadata goes along."""
    idx = np.random.default_rng(2).integers(0, 200, (40, 40)).astype(np.uint8)
    im = Image.frombytes("P", (40, 40), idx.tobytes())
    im.putpalette(bytes(range(256)) * 3)
    buf = io.BytesIO()
    im.save(buf, "PNG", icc_profile=ICC)
    src = _load(buf.getvalue(), tmp_path)
    assert images.palette_as_indices(src).metadata == src.metadata == {"icc": ICC}
    back = api.decompress(api.compress([src], None, fallback="seed")[0])[0]
    assert back.metadata == {"icc": ICC}


def test_a_damaged_section_or_header_entry_is_refused(tmp_path):
    src = _load(_png(), tmp_path)
    data, _ = api.compress([src], None, fallback="seed")
    header, words, section, _ = container.unpack_all(data)
    for h, sec, version, words_ in (
            (header, section, 4, "does not hold"),  # the section left out (a version 4 file)
            (header, section[:-2], 5, "does not hold"),
            ({**header, "meta": {"0": {**header["meta"]["0"], "kept": {"icc": 10}}}}, section, 5, "does not hold"),
            ({**header, "meta": {"0": {**header["meta"]["0"], "kept": {"icc": "10"}}}}, section, 5, "corrupt header"),
            ({**header, "meta": {"5": {"kept": {"icc": 10}}}}, section, 5, "no image lists")):
        bad = container.pack(h, words, version=version, section=sec if version == 5 else b"")
        with pytest.raises(BadFileError, match=words_):
            api.decompress(bad)
        if words_ == "corrupt header":  # refused from the header alone (sfcodec info)
            with pytest.raises(BadFileError, match=words_):
                api.read_header(bad)


# --- what else a file holds (0.9.31): a TIFF's IPTC and Photoshop blocks, a PNG's other chunks, the rest named
def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _with_chunks(png: bytes, before: list = (), after_plte: list = (), after_idat: list = ()) -> bytes:
    """A PNG with chunks (type, data) put in by hand: before its PLTE (or first IDAT), between its PLTE and
    first IDAT, and before its IEND."""
    out, before, after_plte = [png[:8]], list(before), list(after_plte)
    for kind, data in _chunks(png):
        if kind in (b"PLTE", b"IDAT") and before:
            out += [_chunk(*c) for c in before]
            before = []
        if kind == b"IDAT" and after_plte:
            out += [_chunk(*c) for c in after_plte]
            after_plte = []
        if kind == b"IEND":
            out += [_chunk(*c) for c in after_idat]
        out.append(_chunk(kind, data))
    return b"".join(out)


TIME = (b"tIME", b"\x07\xea\x0b\x1e\x0c\x22\x05")
IPTC = b"\x1c\x02\x00\x00\x02\x00\x04\x1c\x02\x19\x00\x07sunsets\x1c\x02\x74\x00\x0b(c) Someone\x00"  # padded to 4n
PHOTOSHOP = b"8BIM\x04\x04\x00\x00" + struct.pack(">I", len(IPTC)) + IPTC


def _ifd(endian: str, entries, big: bool = False, tail: bytes = b"") -> bytes:
    """A TIFF file of one directory written by hand (the TIFF 6.0 / BigTIFF layout), `entries` (tag, type,
    count, value bytes): a value that fits the entry's field lies in it, a longer one after the directory."""
    e = "<" if endian == "II" else ">"
    start = 16 if big else 8
    fmt, inline = (e + "HHQ", 8) if big else (e + "HHI", 4)
    size = (8 if big else 2) + len(entries) * (20 if big else 12) + (8 if big else 4)
    table, extra = struct.pack(e + ("Q" if big else "H"), len(entries)), b""
    for tag, typ, count, val in entries:
        if len(val) <= inline:
            table += struct.pack(fmt, tag, typ, count) + val.ljust(inline, b"\0")
        else:
            table += struct.pack(fmt, tag, typ, count) + struct.pack(e + ("Q" if big else "I"),
                                                                      start + size + len(extra))
            extra += val
    table += b"\0" * (8 if big else 4)
    head = (endian.encode() + struct.pack(e + "HHHQ", 43, 8, 0, start)) if big else \
        (endian.encode() + struct.pack(e + "HI", 42, start))
    return head + table + extra + tail


@pytest.mark.parametrize("endian,big", [("II", False), ("MM", False), ("II", True), ("MM", True)])
def test_tiff_values_reads_the_first_directory_as_stored(tmp_path, endian, big):
    """tiff_values gives a tag's value as the bytes the file holds (in the field or where it points), for
    classic TIFF and BigTIFF in either byte order; a value past the file's end or of an unknown type is
    left out, and a file that is not a TIFF gives nothing."""
    e = "<" if endian == "II" else ">"
    longs = struct.pack(e + f"{len(IPTC) // 4}I", *struct.unpack("<" + f"{len(IPTC) // 4}I", IPTC))
    entries = [(256, 3, 1, struct.pack(e + "H", 7)), (316, 2, 3, b"ab\0"), (33723, 4, len(IPTC) // 4, longs),
               (34377, 1, len(PHOTOSHOP), PHOTOSHOP), (270, 99, 40, b"x" * 40), (305, 2, 12, b"abcdefghijk\0")]
    data = bytearray(_ifd(endian, entries, big))
    p = tmp_path / "t.tif"
    p.write_bytes(bytes(data[:-1]))  # the last value (Software, 12 bytes at the end) cut short
    got = md.tiff_values(p, (256, 316, 33723, 34377, 270, 305, 999))
    assert got == {256: struct.pack(e + "H", 7), 316: b"ab\0", 33723: longs, 34377: PHOTOSHOP}
    assert longs == IPTC or e == ">"  # little-endian LONGs hold IPTC's bytes in order
    p.write_bytes(bytes(data))
    assert md.tiff_values(p, (305,)) == {305: b"abcdefghijk\0"}
    for junk in (b"", b"II*", b"GIF89a" + bytes(20), bytes(data[:9])):
        p.write_bytes(junk)
        assert md.tiff_values(p, (256,)) == {}
    assert md.tiff_values(None, (256,)) == {} and md.tiff_values(tmp_path / "none.tif", (256,)) == {}


def _tiff_with_blocks(path, as_longs: bool = True) -> bytes:
    """A TIFF as Photoshop saves one: IPTC (tag 33723) written as LONGs, Photoshop's image resources (34377),
    DocumentName and HostComputer, and its layers (37724) and a private tag, which are not kept."""
    from PIL import TiffImagePlugin

    ifd = TiffImagePlugin.ImageFileDirectory_v2()
    ifd[33723], ifd.tagtype[33723] = IPTC, 7
    ifd[34377], ifd.tagtype[34377] = PHOTOSHOP, 1
    ifd[37724], ifd.tagtype[37724] = b"Adobe Photoshop Document Data Block\0" + bytes(64), 7
    ifd[65000], ifd.tagtype[65000] = b"private", 7
    ifd[269], ifd[316] = "doc", "host"
    _pixels().save(path, "TIFF", tiffinfo=ifd)
    data = bytearray(path.read_bytes())
    if as_longs:  # Pillow writes UNDEFINED; Photoshop writes LONGs, which Pillow reads as their first alone
        at = data.index(struct.pack("<HHI", 33723, 7, len(IPTC)))
        data[at:at + 8] = struct.pack("<HHI", 33723, 4, len(IPTC) // 4)
        path.write_bytes(bytes(data))
    return bytes(data)


def test_a_tiffs_iptc_and_photoshop_blocks_are_kept(tmp_path):
    """A TIFF's IPTC and Photoshop blocks (0.9.31) are kept as their bytes, even where written as LONGs
    (Pillow reads one number of them), with DocumentName and HostComputer: back into a TIFF (8- and 16-bit:
    read again by Pillow, which reads them whole as written, UNDEFINED and BYTE) and in a PNG's eXIf."""
    _tiff_with_blocks(tmp_path / "ps.tif")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Pillow's warning about the LONGs is not the user's
        src = images.load_image(tmp_path / "ps.tif")
    with Image.open(tmp_path / "ps.tif") as im, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert im.tag_v2[33723] != IPTC  # what Pillow makes of the LONGs
    tags = _tags(src.metadata["exif"])
    assert tags[33723] == IPTC and tags[34377] == PHOTOSHOP and tags[269] == "doc" and tags[316] == "host"
    assert not {37724, 65000} & set(tags)
    back = api.decompress(api.compress([src], None, fallback="seed")[0])[0]
    assert back.metadata == src.metadata
    for suffix in (".tif", ".png"):
        p = tmp_path / f"out{suffix}"
        p.write_bytes(images.encode_source(back, suffix))
        assert images.load_image(p).metadata["exif"] == src.metadata["exif"]
    with Image.open(tmp_path / "out.tif") as im:
        assert im.tag_v2[33723] == IPTC and im.tag_v2[34377] == PHOTOSHOP and im.tag_v2[316] == "host"
    deep16 = deep.encode_tiff(np.full((3, 4, 3), 40000, np.uint16), "RGB;16", src.metadata)
    with Image.open(io.BytesIO(deep16)) as im:
        assert im.tag_v2[33723] == IPTC and im.tag_v2[34377] == PHOTOSHOP and im.tag_v2[269] == "doc"
    (tmp_path / "d.tif").write_bytes(deep16)
    assert images.load_image(tmp_path / "d.tif").metadata["exif"] == src.metadata["exif"]
    # not opened from a file: the LONGs cannot be read as they are, and Pillow's one number is not kept
    with Image.open(io.BytesIO((tmp_path / "ps.tif").read_bytes())) as im:
        im.load()
        tags = _tags(md.read(im)["exif"])
    assert 33723 not in tags and tags[34377] == PHOTOSHOP


def test_a_pngs_other_chunks_are_kept_where_they_were(tmp_path):
    """A PNG's ancillary chunks that are neither pixels nor read otherwise (0.9.31: tIME, sBIT, bKGD, hIST,
    a pHYs of an aspect ratio alone, private ones ...) come back into a PNG as they were, at their places
    (before PLTE, between PLTE and IDAT, after IDAT): the decoded file's chunks are the input's, in order,
    for an RGB, a palette and a 16-bit image; a PNG output is the input's very bytes where Pillow wrote it."""
    rgb = _with_chunks(_png(icc=False, exif=False, xmp=False, colour=False, dpi=False),
                       before=[(b"sBIT", b"\5\6\5"), TIME], after_plte=[(b"bKGD", b"\0\1\0\2\0\3")],
                       after_idat=[(b"prVt", b"private bytes")])
    pal_img = _pixels().quantize(16)
    buf = io.BytesIO()
    pal_img.save(buf, "PNG")
    pal = _with_chunks(buf.getvalue(), before=[TIME, (b"pHYs", struct.pack(">IIB", 2, 3, 0))],
                       after_plte=[(b"bKGD", b"\3"), (b"hIST", b"\0\1" * 16)])
    deep_png = _with_chunks(deep.encode_png(np.arange(60, dtype=np.uint16).reshape(4, 5, 3) * 1000, "RGB;16"),
                            before=[(b"sBIT", b"\14\14\14"), TIME])
    for name, data in (("rgb.png", rgb), ("pal.png", pal), ("deep.png", deep_png)):
        src = _load(data, tmp_path, name)
        kinds = [k for k, _ in _chunks(data)]
        kept = [(place, kind) for place, kind, _ in md._png_blob_chunks(src.metadata["png"])]
        assert [k for _, k in kept] == [k for k in kinds if k in (b"sBIT", b"tIME", b"bKGD", b"hIST", b"pHYs", b"prVt")]
        assert all(place == (0 if kinds.index(k) < kinds.index(b"PLTE" if b"PLTE" in kinds else b"IDAT") else
                             1 if kinds.index(k) < kinds.index(b"IDAT") else 2) for place, k in kept), name
        back = api.decompress(api.compress([src], None, fallback="seed")[0])[0]
        assert back.metadata == src.metadata
        out = images.encode_source(back, ".png")
        assert [k for k, _ in _chunks(out)] == kinds and dict(_chunks(out)) == dict(_chunks(data)), name
        assert images.metadata_dropped(back.metadata, ".png") == []
        assert md.unkept(Image.open(tmp_path / name)) == []
    assert images.encode_source(_load(rgb, tmp_path, "rgb.png"), ".png") == rgb  # Pillow's own bytes, chunks put back
    dropped = images.metadata_dropped(_load(rgb, tmp_path, "rgb.png").metadata, ".tif")
    assert "PNG chunks (sBIT, tIME, bKGD, prVt)" in dropped
    two = b"".join(bytes([0]) + _chunk(b"sPLT", b"p\0" + bytes([8]) + bytes(6 * k)) for k in (1, 2))
    assert md.png_chunk_types(two + bytes([2]) + _chunk(*TIME)) == ["sPLT", "tIME"]  # each type once
    # a resolution in pHYs is read as such (dpi), not kept as a chunk
    src = _load(_png(icc=False, exif=False, xmp=False, text=False, colour=False), tmp_path)
    assert "png" not in src.metadata and src.metadata["dpi"]


def test_unsafe_to_copy_chunks_are_kept_only_where_known(tmp_path):
    """An ancillary chunk marked unsafe to copy (fourth letter upper case) depends on the image data as it was
    written: the PNG specification says not to copy one that the program does not know once it rewrites the
    image data, as sfcodec does. So tIME, bKGD, sBIT (known: their meaning is the pixels') are kept, and
    Apple's iDOT (offsets into the old image data), dSIG (a signature of the old file's bytes) and
    Fireworks' mkBF are not: compress names them. A private chunk marked safe to copy is kept."""
    png = _with_chunks(_png(icc=False, exif=False, xmp=False, text=False, colour=False, dpi=False),
                       before=[TIME, (b"iDOT", bytes(28)), (b"mkBF", b"layers"), (b"prVt", b"ok")],
                       after_plte=[(b"bKGD", b"\0\1\0\2\0\3")], after_idat=[(b"dSIG", b"sig")])
    src = _load(png, tmp_path)
    assert [k for _, k, _ in md._png_blob_chunks(src.metadata["png"])] == [b"tIME", b"prVt", b"bKGD"]
    assert src.not_kept == ["iDOT chunk", "mkBF chunk", "dSIG chunk"]
    out = images.encode_image(images.to_pil(src), ".png", src.metadata)
    assert not {b"iDOT", b"mkBF", b"dSIG"} & {k for k, _ in _chunks(out)}


def test_png_with_chunks_puts_in_no_second_of_a_type():
    """A kept chunk of a type that the written PNG has already (its own pHYs, say) is not put in again: a
    PNG of two tIME or two pHYs chunks is invalid."""
    png = _with_chunks(_png(icc=False, exif=False, xmp=False, text=False, colour=False), before=[TIME])
    blob = b"".join(b"\0" + _chunk(*c) for c in (TIME, (b"pHYs", struct.pack(">IIB", 2, 3, 0)), (b"oFFs", bytes(9))))
    kinds = [k for k, _ in _chunks(md.png_with_chunks(png, blob))]
    assert kinds.count(b"tIME") == kinds.count(b"pHYs") == kinds.count(b"oFFs") == 1
    assert kinds.index(b"oFFs") < kinds.index(b"IDAT") and md.png_with_chunks(png, b"") == png


def test_png_chunks_leave_out_what_a_reader_would_not_take(tmp_path):
    """A chunk whose CRC does not match, or cut short by the file's end, is not kept; nor a critical chunk
    Pillow does not know (named by unkept), nor the chunks read otherwise."""
    base = _png(icc=False, exif=False, xmp=False, colour=False, dpi=False)
    p = tmp_path / "x.png"
    bad_crc = _chunk(*TIME)[:-1] + b"\0"
    at = base.index(b"IDAT") - 4
    p.write_bytes(base[:at] + bad_crc + _chunk(b"prVt", b"ok") + base[at:])
    assert [c[4:8] for c in _split_blob(md.png_chunks(p))] == [b"prVt"]
    p.write_bytes(base[:at] + _chunk(b"prVt", b"ok") + _chunk(b"zzZz", b"cut")[:-3])
    assert [c[4:8] for c in _split_blob(md.png_chunks(p))] == [b"prVt"]
    p.write_bytes(base[:at] + _chunk(b"ABCD", b"critical") + base[at:])
    with Image.open(p) as im:
        im.load()
        assert "png" not in md.read(im) and md.unkept(im) == ["ABCD chunk"]
    assert md.png_chunks(None) == b"" and md.png_chunks(tmp_path / "missing.png") == b""


def _split_blob(blob: bytes) -> list[bytes]:
    return [raw for _, _, raw in md._png_blob_chunks(blob)]


@pytest.mark.parametrize("blob", [
    b"\3" + _chunk(*TIME),                                    # no such place
    b"\0" + _chunk(*TIME)[:-1] + b"\0",                       # CRC
    b"\0" + _chunk(*TIME)[:-2],                               # cut short
    b"\0" + _chunk(*TIME) + b"\0",                            # a byte after the last chunk
    b"\0" + _chunk(b"ABCD", b"x"),                            # critical
    b"\0" + _chunk(b"tEXt", b"k\0v"),                         # read otherwise: never in the blob
    b"\0" + _chunk(b"t1ME", b"x"),                            # not a chunk type
])
def test_a_damaged_png_chunks_blob_is_refused(blob):
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    _refused([{"png": len(blob)}], comp.compress(blob) + comp.flush(), "PNG chunks")


def test_a_release_without_png_chunks_asks_for_an_upgrade(tmp_path, monkeypatch):
    """A file with a kind of metadata that an older release does not know (as 0.9.30 does not know "png")
    is refused there with the advice to upgrade, not as a corrupt file: the header names the newer release."""
    src = _load(_with_chunks(_png(icc=False), before=[TIME]), tmp_path)
    data, _ = api.compress([src], None, fallback="seed")
    assert set(api.read_header(data)["meta"]["0"]["kept"]) == {"exif", "xmp", "info", "png"}
    monkeypatch.setattr(md, "KINDS", ("icc", "exif", "xmp", "info"))  # 0.9.30's
    monkeypatch.setattr(api, "__version__", "0.0.1")  # a release older than the one that wrote the file
    with pytest.raises(UnsupportedVersionError, match="upgrade"):
        api.decompress(data)


def test_unkept_names_what_is_not_kept(tmp_path):
    """unkept names what a file holds beside its pixels that is not kept: a TIFF's other tags (Photoshop's
    layers, a private tag), a JPEG's comment and IPTC segment, a GIF's comment; nothing for plain files."""
    _tiff_with_blocks(tmp_path / "ps.tif")
    assert images.load_image(tmp_path / "ps.tif").not_kept == [
        "ImageSourceData (tag 37724: Photoshop's layers)", "tag 65000"]
    p = tmp_path / "c.jpg"
    _pixels().save(p, "JPEG", comment=b"a comment")
    data = p.read_bytes()
    app13 = b"\xff\xed" + struct.pack(">H", 2 + 14 + len(PHOTOSHOP)) + b"Photoshop 3.0\0" + PHOTOSHOP
    p.write_bytes(data[:2] + app13 + data[2:])
    assert images.load_image(p).not_kept == ["IPTC / Photoshop data (APP13)", "comment (COM)"]
    _pixels().save(tmp_path / "c.gif", comment=b"hi")
    assert images.load_image(tmp_path / "c.gif").not_kept == ["comment"]
    kept = {"icc_profile": ICC, "exif": _exif(), "xmp": XMP.encode()}  # the segments that are kept: not named
    for name, kw in (("p.tif", {}), ("p.png", {}), ("p.jpg", kept), ("p.webp", {"lossless": True, **kept}),
                     ("p.gif", {})):
        _pixels().save(tmp_path / name, **kw)
        assert images.load_image(tmp_path / name).not_kept == [], name
    assert images.load_image(_tiff_with_exif(tmp_path / "dev.tif")).not_kept == []


# ancillary (first letter lower case), reserved bit clear (third upper case), safe to copy (fourth lower case)
_ANCILLARY = st.builds(lambda a, b, c, d: bytes([a, b, c, d]), st.integers(97, 122), st.integers(65, 122).filter(
    lambda v: chr(v).isalpha()), st.integers(65, 90), st.integers(97, 122))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 2), _ANCILLARY, st.binary(max_size=40)), max_size=6), st.booleans())
def test_any_ancillary_chunks_come_back_in_place(tmp_path, chunks, palette):
    """Any ancillary chunks that read() does not take otherwise, at any of the three places, in an RGB or a
    palette PNG: kept, through the section, and put back into a PNG in the input's order."""
    chunks = [(p, k, d) for p, k, d in chunks if k not in md._PNG_HELD and k != b"pHYs"]
    img = _pixels(6, 5).quantize(8) if palette else _pixels(6, 5)
    buf = io.BytesIO()
    img.save(buf, "PNG")
    at = [[(k, d) for p, k, d in chunks if p == place] for place in range(3)]
    if not palette:  # no PLTE: the first two places are one
        at = [at[0] + at[1], [], at[2]]
    data = _with_chunks(buf.getvalue(), at[0], at[1], at[2])
    p = tmp_path / "c.png"
    p.write_bytes(data)
    src = images.load_image(p)
    (back,) = md.unpack(*md.pack([src.metadata]))
    out = images.encode_image(images.to_pil(src), ".png", back)
    ours = [(k, d) for k, d in _chunks(out) if k not in (b"IHDR", b"PLTE", b"IDAT", b"IEND", b"tRNS")]
    assert ours == [(k, d) for k, d in _chunks(data) if k not in (b"IHDR", b"PLTE", b"IDAT", b"IEND", b"tRNS")]
