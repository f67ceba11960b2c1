"""What a file holds besides its pixels, kept for the user: colour profile, EXIF, XMP, PNG chunks.

A photograph's pixels mean what its ICC profile says (a Display P3 or Adobe RGB photograph shows
washed-out without it), its EXIF holds the orientation, camera and date, its XMP the edits and
rights. `sfcodec compress` keeps them (`--no-metadata`: the pixels only), `decompress` writes them
back where the output format can hold them and says what it cannot.

An image's metadata is a dict (`SourceImage.metadata`), each entry optional:

    "icc"   bytes   the ICC profile (PNG iCCP, JPEG APP2, WebP ICCP, TIFF tag 34675)
    "exif"  bytes   EXIF as a TIFF structure ("MM" / "II" ...; JPEG's and Pillow's "Exif\\0\\0"
                    prefix taken off: PNG's eXIf and WebP's EXIF chunk hold it without)
    "xmp"   bytes   XMP packet (PNG iTXt "XML:com.adobe.xmp", JPEG APP1, WebP XMP chunk)
    "text"  list    PNG text chunks other than XMP: [key, value] (tEXt / zTXt) or [key, value,
                    language, translated key] (iTXt), in file order
    "gamma" float   PNG gAMA (as Pillow gives it: the stored integer / 100000)
    "srgb"  int     PNG sRGB rendering intent, 0 - 3
    "chromaticity"  PNG cHRM, 8 floats (white point and primaries, each the integer / 100000)
    "dpi"   [x, y]  resolution in dots per inch (PNG pHYs, TIFF, JPEG JFIF, BMP)
    "png"   bytes   a PNG's other ancillary chunks (0.9.31; png_chunks): tIME, bKGD, sBIT, sPLT, hIST, cICP,
                    oFFs, pHYs of an aspect ratio alone, and the others that are marked safe to copy (not
                    Apple's iDOT, not dSIG), each as the file holds it with its place (before PLTE, before
                    IDAT, after IDAT), written back into a PNG as they were

A TIFF holds its EXIF in its own tags (0.9.29): the metadata ones of its first directory (description,
make, model, orientation, software, date, artist, copyright, rating: TIFF_EXIF_TAGS) and its Exif and
GPS directories are kept as "exif" (a TIFF structure of those alone, made by Pillow), its XMP (tag
700) as "xmp"; a TIFF output gets both back as tags (written by Pillow: an 8-bit one's whole file, a
16-bit one's directory, deep.encode_tiff), without a directory's pointer to another (NESTED_POINTERS).
Since 0.9.31 also its DocumentName, PageName, HostComputer, IPTC-NAA (33723) and Photoshop image resources
(34377), the last two as the bytes the file holds (tiff_values: Photoshop writes IPTC as LONGs, of which
Pillow gives the first alone).

Not kept, and named by `unkept` (compress warns, 0.9.31): a TIFF's other tags (Photoshop's layers in
ImageSourceData, GeoTIFF's, private ones), a PNG's unknown critical chunks and unknown ancillary ones marked
unsafe to copy (Apple's iDOT, dSIG, Fireworks' mkBF ...), a JPEG's comments and segments
other than JFIF, EXIF, XMP and ICC (IPTC in APP13, extended XMP), a GIF's comment. Nor the order of a PNG's
chunks beyond their places, nor the EXIF's Interoperability directory in a TIFF output.

In a .sfc file (format version 5, container.py) the metadata of every image is one section after
the payload: the images' blobs ("icc", "exif", "xmp" as they are, "info" the canonical JSON of the
rest), in KINDS order, concatenated and compressed with raw DEFLATE; the header lists per image the
blobs and their lengths (meta[i]["kept"] = {"icc": 3144, "info": 61}), so that `info` names them
without reading the section and the decoder knows how much it inflates before it starts. A kind of
blob that a release does not know (0.9.30 and before: "png") makes it refuse the file, saying that a
newer release wrote it (api._validate), so a new kind needs no new format version.
"""
from __future__ import annotations

import json
import math
import numbers
import os
import struct
import zlib
from typing import Any

from .errors import BadFileError, UnsupportedImageError

KINDS = ("icc", "exif", "xmp", "info", "png")  # the section's blobs, in this order per image ("png": 0.9.31)
INFO_KEYS = ("chromaticity", "dpi", "gamma", "srgb", "text")  # the "info" blob's JSON
MAX_BYTES = 1 << 26  # all blobs of a file together, before compression (64 MiB)
_EXIF_PREFIX = b"Exif\x00\x00"
_XMP_KEY = "XML:com.adobe.xmp"  # PNG's iTXt keyword for XMP (Pillow also gives it as info["xmp"])
# the numbers kept, within what their PNG chunks (a u32 / 100000) and Pillow's writers take
GAMMA_RANGE, CHROMA_RANGE, DPI_RANGE = (1e-5, 21474.83647), (0.0, 21474.83647), (1e-3, 1e7)
NAMES = {"icc": "ICC profile", "exif": "EXIF", "xmp": "XMP", "text": "PNG text", "gamma": "gamma",
         "srgb": "sRGB intent", "chromaticity": "chromaticities", "dpi": "resolution (dpi)", "png": "PNG chunks"}


# the metadata tags of a TIFF's first directory that EXIF has there too: ImageDescription, Make, Model,
# Orientation, Software, DateTime, Artist, Copyright, Rating, RatingPercent (not the image's structure:
# size, strips, compression ...); and the pointers to its Exif and GPS directories
TIFF_EXIF_TAGS = (270, 271, 272, 274, 305, 306, 315, 33432, 18246, 18249,
                  # and since 0.9.31 DocumentName, PageName, HostComputer, and the blocks that Photoshop, Lightroom
                  # and news agencies' tools write: IPTC-NAA (caption, keywords, credit) and Photoshop's image
                  # resources (IPTC again, print settings ...): TIFF_BLOCK_TAGS
                  269, 285, 316, 33723, 34377)
# kept as the bytes that the file holds, whatever the type they were written with (Photoshop writes IPTC as
# LONGs, which Pillow reads as one number), and only so (tiff_values)
TIFF_BLOCK_TAGS = (33723, 34377)
EXIF_DIRECTORIES = (0x8769, 0x8825)
# a directory's pointer to another (the Exif directory's to its Interoperability one): Pillow copies
# it as a plain number when it writes the directory again, an offset into whatever lies there then
NESTED_POINTERS = (0xA005,)


# --- reading from Pillow ------------------------------------------------------------------------
def read(img) -> dict:
    """The metadata of an opened Pillow image (its `info`, a PNG's text chunks, a TIFF's EXIF tags)."""
    info = img.info
    md: dict[str, Any] = {}
    if img.format == "TIFF" and "exif" not in info:
        exif = _tiff_exif(img)
        if exif:
            md["exif"] = exif
    for key, name in (("icc_profile", "icc"), ("exif", "exif"), ("xmp", "xmp")):
        v = info.get(key)
        if isinstance(v, str):
            v = v.encode("utf-8")
        if isinstance(v, (bytes, bytearray)) and v:
            md[name] = bytes(v)
    if md.get("exif", b"").startswith(_EXIF_PREFIX):
        md["exif"] = md["exif"][len(_EXIF_PREFIX):]
        if not md["exif"]:
            del md["exif"]
    text = []
    for key, value in (getattr(img, "text", None) or {}).items() if img.format == "PNG" else ():
        if key == _XMP_KEY and isinstance(value, str) and "xmp" not in md:  # a Pillow that gives no info["xmp"]
            md["xmp"] = value.encode("utf-8")
        if key == _XMP_KEY or not isinstance(key, str) or not isinstance(value, str):
            continue
        lang, tkey = getattr(value, "lang", None), getattr(value, "tkey", None)
        entry = [key, str(value)] if lang is None and tkey is None else [key, str(value), lang or "", tkey or ""]
        if _text_entry(entry):
            text.append(entry)
    if text:
        md["text"] = text
    if img.format == "PNG":
        g = info.get("gamma")
        if _number(g, *GAMMA_RANGE):
            md["gamma"] = float(g)
        s = info.get("srgb")
        if isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= 3:
            md["srgb"] = s
        c = info.get("chromaticity")
        if isinstance(c, tuple) and len(c) == 8 and all(_number(v, *CHROMA_RANGE) for v in c):
            md["chromaticity"] = [float(v) for v in c]
    d = _dpi(info)
    if d:
        md["dpi"] = d
    if img.format == "PNG":
        chunks = png_chunks(source(img), bool(d))
        if chunks:
            md["png"] = chunks
    return md


def _dpi(info: dict) -> list[float] | None:
    """The resolution that read() keeps from a Pillow image's info, or None."""
    d = info.get("dpi")
    if isinstance(d, tuple) and len(d) == 2 and all(_number(v, *DPI_RANGE) for v in d):
        return [float(v) for v in d]
    return None


def _tiff_exif(img) -> bytes | None:
    """A TIFF's EXIF (TIFF_EXIF_TAGS of its first directory, its Exif and GPS directories) as the TIFF
    structure PNG's eXIf holds (Pillow's Exif.tobytes, its "Exif\\0\\0" taken off); None where it has none
    or Pillow cannot read them."""
    import warnings

    try:
        with warnings.catch_warnings():  # Pillow's about a tag of more values than it expects (IPTC as LONGs)
            warnings.simplefilter("ignore")
            out = _exif_subset(img.getexif())
        blocks = tiff_values(source(img), TIFF_BLOCK_TAGS)
        for tag in TIFF_BLOCK_TAGS:
            if tag in blocks:
                out[tag] = blocks[tag]
            elif tag in out and not (isinstance(out[tag], bytes) and img.tag_v2.tagtype.get(tag) in (1, 7)):
                del out[tag]  # not read from the file, and not bytes as written: maybe a part (one LONG of many)
        if not len(out) and not any(out.get_ifd(t) for t in EXIF_DIRECTORIES):
            return None
        data = out.tobytes()
    except Exception:  # a damaged directory: the pixels still count, its EXIF is not kept
        return None
    return data[len(_EXIF_PREFIX):] if data.startswith(_EXIF_PREFIX) else data


# bytes per value of each TIFF field type (BYTE, ASCII, SHORT, LONG, RATIONAL, SBYTE, UNDEFINED, SSHORT,
# SLONG, SRATIONAL, FLOAT, DOUBLE, IFD; BigTIFF's LONG8, SLONG8, IFD8)
_TIFF_TYPE_BYTES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 13: 4,
                    16: 8, 17: 8, 18: 8}
_TIFF_MAX_ENTRIES = 4096


def source(img) -> str | None:
    """The path of an opened Pillow image's file, which the TIFF tags and PNG chunks that Pillow does not
    give as they are (tiff_values, png_chunks) are read from again; None for an image not opened from a
    path (the pixels and what Pillow gives are still read)."""
    return getattr(img, "filename", None) or None


def tiff_values(path, tags) -> dict[int, bytes]:
    """The bytes of `tags`' values in the first directory of the TIFF (or BigTIFF) file at `path`, as they
    lie in the file, for those it has; {} where it is not one, cannot be read, or path is None. A value
    that is damaged (past the file's end, of an unknown type) or over MAX_BYTES is left out."""
    if path is None:
        return {}
    out: dict[int, bytes] = {}
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(16)
            big = head[:4] in (b"II+\0", b"MM\0+")
            if not (big or head[:4] in (b"II*\0", b"MM\0*")) or len(head) < 8:
                return {}
            e = "<" if head[:2] == b"II" else ">"
            if big:
                if len(head) < 16:
                    return {}
                first, count_fmt, entry_fmt, inline = struct.unpack(e + "Q", head[8:16])[0], "Q", "HHQ8s", 8
            else:
                first, count_fmt, entry_fmt, inline = struct.unpack(e + "I", head[4:8])[0], "H", "HHI4s", 4
            f.seek(first)
            raw = f.read(struct.calcsize(e + count_fmt))
            if len(raw) < struct.calcsize(e + count_fmt):
                return {}
            n = min(struct.unpack(e + count_fmt, raw)[0], _TIFF_MAX_ENTRIES)
            width = struct.calcsize(e + entry_fmt)
            table = f.read(n * width)
            for i in range(len(table) // width):
                tag, typ, count, value = struct.unpack_from(e + entry_fmt, table, i * width)
                if tag not in tags or typ not in _TIFF_TYPE_BYTES:
                    continue
                nbytes = count * _TIFF_TYPE_BYTES[typ]
                if not 0 < nbytes <= MAX_BYTES:
                    continue
                if nbytes <= inline:
                    out[tag] = value[:nbytes]
                    continue
                at = struct.unpack(e + ("Q" if big else "I"), value)[0]
                if at + nbytes > size:
                    continue
                f.seek(at)
                out[tag] = f.read(nbytes)
    except OSError:
        return {}
    return out


def _exif_subset(tags):
    """A new Pillow Exif of `tags`' (an Exif) TIFF_EXIF_TAGS and EXIF_DIRECTORIES, the directories without
    NESTED_POINTERS: what a TIFF's tags hold of an EXIF, and what a TIFF output gets of one."""
    from PIL import Image

    out = Image.Exif()
    for tag in TIFF_EXIF_TAGS:
        if tag in tags:
            out[tag] = tags[tag]
    for tag in EXIF_DIRECTORIES:
        sub = {k: v for k, v in tags.get_ifd(tag).items() if k not in NESTED_POINTERS}
        if sub:
            out.get_ifd(tag).update(sub)
    return out


# --- what is not kept -------------------------------------------------------------------------------
# A TIFF's first-directory tags that describe its pixels (any writer makes them anew) or that read() keeps
_TIFF_HELD = frozenset({254, 255, 256, 257, 258, 259, 262, 263, 264, 265, 266, 273, 277, 278, 279, 280, 281, 282,
                        283, 284, 296, 297, 317, 320, 322, 323, 324, 325, 338, 339, 340, 341, 347, 512, 513, 514, 515,
                        517, 518, 519, 520, 521, 529, 530, 531, 532, 700, 34675, *TIFF_EXIF_TAGS, *EXIF_DIRECTORIES})
_TIFF_ABOUT = {37724: "Photoshop's layers", 330: "further pictures"}
# a PNG's chunks that hold pixels, that read() keeps (pHYs: where it gives a resolution) or that only an
# animation has (animations are refused)
_PNG_HELD = frozenset({b"IHDR", b"PLTE", b"IDAT", b"IEND", b"tRNS", b"iCCP", b"eXIf", b"iTXt", b"tEXt", b"zTXt",
                       b"gAMA", b"sRGB", b"cHRM", b"acTL", b"fcTL", b"fdAT"})
# The ancillary chunks marked unsafe to copy whose meaning is the pixels' or the palette's alone, which the
# codec gives back exactly (the PNG specification: an editor that changes the image drops the unsafe chunks
# it does not know; we change only how the image data is compressed). Other unsafe ones are not kept, as
# that rule says: Apple's iDOT holds offsets into the image data as it was compressed, dSIG signs the file's
# bytes (compress names them).
_PNG_COPY = frozenset({b"bKGD", b"hIST", b"sBIT", b"sPLT", b"tIME", b"cICP", b"mDCv", b"cLLi", b"oFFs", b"pCAL",
                       b"sCAL", b"sTER", b"gIFg", b"gIFx", b"gIFt"})
_PNG_MAX_CHUNKS = 100_000
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# a JPEG's segments that read() keeps or that describe its pixels, by marker and the start of their data
_JPEG_HELD = (("APP0", b"JFIF\0"), ("APP1", b"Exif\0"), ("APP1", b"http://ns.adobe.com/xap/1.0/\0"),
              ("APP2", b"ICC_PROFILE\0"), ("APP2", b"MPF\0"), ("APP14", b"Adobe"))
_JPEG_ABOUT = (("APP13", b"Photoshop 3.0\0", "IPTC / Photoshop data"),
               ("APP1", b"http://ns.adobe.com/xmp/extension/\0", "extended XMP"),
               ("APP0", b"JFXX\0", "JFIF thumbnail"), ("COM", b"", "comment"))


def unkept(img) -> list[str]:
    """What the file of an opened Pillow image holds beside its pixels that read() does not keep (0.9.31:
    compress names it in a warning): a TIFF's other first-directory tags (Photoshop's layers, GeoTIFF's,
    private ones), a PNG's critical chunks that Pillow does not know and its unknown ancillary ones marked
    unsafe to copy (the others are kept: png_chunks), a JPEG's other segments (IPTC in APP13, comments ...),
    a GIF's comment; each once, in file order. [] where there is nothing, or for a PNG that cannot be read
    again."""
    path = source(img)
    names: list[str] = []
    if img.format == "TIFF":
        from PIL import TiffTags

        for tag in getattr(img, "tag_v2", {}):
            if tag not in _TIFF_HELD:
                name = TiffTags.lookup(tag).name
                label = f"tag {tag}" if name == "unknown" else f"{name} (tag {tag})"
                names.append(f"{label[:-1]}: {_TIFF_ABOUT[tag]})" if tag in _TIFF_ABOUT else label)
    elif img.format == "PNG" and path is not None:
        for kind in _png_chunk_types(path):
            if not (kind in _PNG_HELD or _png_kept(kind, bool(_dpi(img.info)))):
                names.append(f"{kind.decode('latin-1')} chunk")
    elif img.format in ("JPEG", "MPO"):
        for marker, data in getattr(img, "applist", ()):
            if any(marker == m and data.startswith(start) for m, start in _JPEG_HELD):
                continue
            about = [a for m, start, a in _JPEG_ABOUT if marker == m and data.startswith(start)]
            names.append(f"{about[0]} ({marker})" if about else f"{marker} segment")
    elif img.format == "GIF" and img.info.get("comment"):
        names.append("comment")
    return list(dict.fromkeys(names))


def _png_chunk_types(path) -> list[bytes]:
    """The types of a PNG file's chunks, in order (up to its IEND); [] where it cannot be read."""
    return [kind for kind, _, _ in _png_walk(path, lambda kind: False)]


def _png_walk(path, wanted) -> list[tuple[bytes, int, bytes | None]]:
    """A PNG file's chunks in order, up to its IEND: (type, place: 0 before its PLTE and IDAT, 1 after its
    PLTE and before its IDAT, 2 after its IDAT; the whole chunk as it lies in the file, length to CRC, for
    the types that `wanted` takes, else None) of the file at `path`; [] where it is not a PNG or cannot be
    read. A chunk cut short by the file's end is left out, and every one after it."""
    out: list[tuple[bytes, int, bytes | None]] = []
    place = 0
    try:
        with open(path, "rb") as f:
            if f.read(8) != PNG_SIGNATURE:
                return []
            while len(out) < _PNG_MAX_CHUNKS:
                head = f.read(8)
                if len(head) < 8:
                    break
                n, kind = struct.unpack(">I", head[:4])[0], head[4:]
                if kind == b"IDAT":
                    place = 2
                elif kind == b"PLTE":
                    place = max(place, 1)
                if wanted(kind) and n <= MAX_BYTES:
                    rest = f.read(n + 4)
                    if len(rest) < n + 4:
                        break
                    out.append((kind, place, head + rest))
                else:
                    out.append((kind, place, None))
                    f.seek(n + 4, os.SEEK_CUR)
                if kind == b"IEND":
                    break
    except OSError:
        return []
    return out


def _png_kept(kind: bytes, has_dpi: bool) -> bool:
    """Whether png_chunks keeps a chunk of this type: an ancillary one (first letter in lower case) that
    read() does not keep otherwise, and that is either marked safe to copy (fourth letter in lower case) or
    one of _PNG_COPY; pHYs where it gives no resolution (a pixel aspect ratio alone)."""
    if kind == b"pHYs":
        return not has_dpi
    if not (len(kind) == 4 and kind.isalpha() and kind[:1].islower()) or kind in _PNG_HELD:
        return False
    return kind in _PNG_COPY or kind[3:4].islower()


def png_chunks(path, has_dpi: bool = False) -> bytes:
    """The "png" blob of the PNG file at `path` (0.9.31): its ancillary chunks that read() does not keep
    otherwise (tIME, bKGD, sBIT, sPLT, cICP, oFFs, those marked safe to copy: _png_kept), each as one byte
    of its place (_png_walk) and the chunk as the file holds it, in file order; b"" for none, or where path
    is None.
    png_with_chunks writes them back into a PNG, at the same places. A chunk whose CRC does not match
    is left out (a PNG reader would not take it either)."""
    if path is None:
        return b""
    out = []
    for kind, place, raw in _png_walk(path, lambda kind: _png_kept(kind, has_dpi)):
        if raw is not None and struct.unpack(">I", raw[-4:])[0] == zlib.crc32(raw[4:-4]):
            out.append(bytes([place]) + raw)
    return b"".join(out)


def _png_blob_chunks(blob: bytes) -> list[tuple[int, bytes, bytes]]:
    """(place, type, the whole chunk) of each chunk of a "png" blob; BadFileError where it is not one that
    png_chunks makes."""
    bad = BadFileError("corrupt .sfc file: bad metadata (PNG chunks)")
    out, pos = [], 0
    while pos < len(blob):
        if pos + 9 > len(blob) or blob[pos] > 2:
            raise bad
        n = struct.unpack_from(">I", blob, pos + 1)[0]
        raw = blob[pos + 1:pos + 13 + n]
        if len(raw) != n + 12 or struct.unpack(">I", raw[-4:])[0] != zlib.crc32(raw[4:-4]):
            raise bad
        kind = raw[4:8]
        if not _png_kept(kind, False):
            raise bad
        out.append((blob[pos], kind, raw))
        pos += 13 + n
    return out


def png_chunk_types(blob: bytes) -> list[str]:
    """The types of a "png" blob's chunks, each once, in order (BadFileError where it is damaged)."""
    return list(dict.fromkeys(kind.decode("latin-1") for _, kind, _ in _png_blob_chunks(blob)))


def png_with_chunks(png: bytes, blob: bytes) -> bytes:
    """A PNG file's bytes with a "png" blob's chunks put in, each at its place (0: before the PLTE, or the
    first IDAT where there is none; 1: before the first IDAT; 2: before the IEND), in their order; a chunk
    of a type that the file has already is not put in again."""
    if not blob:
        return png
    spans, pos = [], len(PNG_SIGNATURE)
    while pos + 8 <= len(png):
        n = struct.unpack_from(">I", png, pos)[0]
        spans.append((png[pos + 4:pos + 8], pos))
        pos += 12 + n
    has = {kind for kind, _ in spans}
    first = {}
    for kind, at in spans:
        first.setdefault(kind, at)
    idat = first[b"IDAT"]
    at_place = (min(first.get(b"PLTE", idat), idat), idat, first[b"IEND"])
    inserts: dict[int, list[bytes]] = {}
    for place, kind, raw in _png_blob_chunks(blob):
        if kind not in has:
            inserts.setdefault(at_place[place], []).append(raw)
    out, last = [], 0
    for at in sorted(inserts):
        out += [png[last:at], *inserts[at]]
        last = at
    return b"".join(out) + png[last:]


# --- writing through Pillow ---------------------------------------------------------------------
def save_options(md: dict, fmt: str) -> tuple[dict, list[str]]:
    """Pillow save() keyword arguments that write `md` into a file of format `fmt` (PNG, TIFF,
    WEBP, BMP, PPM), and the names (NAMES) of the entries that format cannot hold."""
    kw: dict[str, Any] = {}
    dropped: list[str] = []
    if fmt == "PNG":
        from PIL.PngImagePlugin import PngInfo

        info = PngInfo()
        if "icc" in md:
            kw["icc_profile"] = md["icc"]
        if "exif" in md:
            kw["exif"] = md["exif"]
        if "dpi" in md:
            kw["dpi"] = tuple(md["dpi"])
        if "gamma" in md:
            info.add(b"gAMA", struct.pack(">I", round(md["gamma"] * 100000)))
        if "chromaticity" in md:
            info.add(b"cHRM", struct.pack(">8I", *(round(v * 100000) for v in md["chromaticity"])))
        if "srgb" in md:
            if "icc" in md:  # PNG allows one of the two; Pillow writes the profile and drops sRGB
                dropped.append(NAMES["srgb"] + " (beside an ICC profile)")
            else:
                info.add(b"sRGB", bytes([md["srgb"]]))
        for entry in md.get("text", ()):
            if len(entry) == 4:
                info.add_itxt(entry[0], entry[1], entry[2], entry[3])
            else:
                info.add_text(entry[0], entry[1])
        if "xmp" in md:
            try:
                info.add_itxt(_XMP_KEY, md["xmp"].decode("utf-8"))
            except UnicodeDecodeError:  # iTXt holds UTF-8 only, as XMP should be
                dropped.append(NAMES["xmp"] + " (not UTF-8)")
        if info.chunks:
            kw["pnginfo"] = info
        return kw, dropped
    held = {"WEBP": ("icc", "exif", "xmp"), "TIFF": ("icc", "dpi", "exif", "xmp"), "BMP": ("dpi",)}.get(fmt, ())
    for name in md:
        if name not in held:
            dropped.append(f"{NAMES[name]} ({', '.join(png_chunk_types(md['png']))})" if name == "png" else NAMES[name])
    for name, arg in (("icc", "icc_profile"), ("exif", "exif"), ("xmp", "xmp")):
        if name in md and name in held:
            kw[arg] = md[name]
    if fmt == "TIFF" and ("exif" in kw or "xmp" in kw):  # both as tags, through Pillow's exif argument
        exif, xmp = kw.pop("exif", None), kw.pop("xmp", None)
        tags = _tiff_tags(exif, xmp)
        if tags is None and exif and xmp:  # the EXIF's tags are what Pillow cannot write: the XMP alone
            tags = _tiff_tags(None, xmp)
            dropped.append(NAMES["exif"] + " (tags Pillow cannot write into a TIFF)")
        if tags is not None:
            kw["exif"] = tags
        else:
            dropped += [NAMES[k] + " (tags Pillow cannot write into a TIFF)" for k in ("exif", "xmp") if k in md]
    if "dpi" in md and "dpi" in held:
        kw["dpi"] = tuple(md["dpi"])
    return kw, dropped


def _tiff_tags(exif: bytes | None, xmp: bytes | None):
    """Pillow's Exif for a TIFF's save(exif=): the EXIF's _exif_subset (its first directory's metadata
    tags become the TIFF's own, its Exif and GPS directories written as such) and the XMP as tag 700;
    None where Pillow cannot write them (a value its tag's type cannot hold, as a damaged EXIF has:
    tried on a 1x1 TIFF), so that the image is still written, without them, and the warning says so."""
    import io
    import warnings

    from PIL import Image

    try:
        out = Image.Exif()
        if exif:
            full = Image.Exif()
            full.load(_EXIF_PREFIX + exif)
            # through bytes: Pillow's TIFF writer writes the directories it finds as tags
            out.load(_exif_subset(full).tobytes())
        if xmp:
            out[700] = xmp
        with warnings.catch_warnings():  # Pillow warns of tags with more values than their kind has
            warnings.simplefilter("ignore")
            Image.new("L", (1, 1)).save(io.BytesIO(), "TIFF", exif=out)
    except Exception:
        return None
    return out


def describe(kept: dict) -> str:
    """One line for `sfcodec info` from a header's "kept" entry (blob -> bytes)."""
    label = {"icc": "ICC profile", "exif": "EXIF", "xmp": "XMP", "info": "PNG chunks / resolution",
             "png": "other PNG chunks"}
    return ", ".join(f"{label[k]} {kept[k]:,} bytes" for k in KINDS if k in kept)


# --- the .sfc section ---------------------------------------------------------------------------
def _info_blob(md: dict) -> bytes:
    small = {k: md[k] for k in INFO_KEYS if k in md}
    if not small:
        return b""
    return json.dumps(small, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def pack(mds: list[dict]) -> tuple[list[dict], bytes]:
    """(per image the header's "kept" entry, {} for none; the section's bytes, b"" for none)."""
    entries, blobs = [], []
    for md in mds:
        entry = {}
        for kind in KINDS:
            blob = _info_blob(md) if kind == "info" else md.get(kind, b"")
            if blob:
                entry[kind] = len(blob)
                blobs.append(blob)
        entries.append(entry)
    raw = b"".join(blobs)
    if len(raw) > MAX_BYTES:
        raise UnsupportedImageError(f"the images' metadata (ICC, EXIF, XMP, text) is {len(raw):,} bytes, over the "
                                    f"{MAX_BYTES:,}-byte limit: compress with --no-metadata")
    if not raw:
        return entries, b""
    comp = zlib.compressobj(9, zlib.DEFLATED, -15, 9)
    return entries, comp.compress(raw) + comp.flush()


def check_entries(entries: list) -> int:
    """Raise BadFileError unless every entry is a header "kept" object of known blobs with
    positive integer lengths, in all at most MAX_BYTES; return the total length."""
    total = 0
    for e in entries:
        if not isinstance(e, dict) or not e or not set(e) <= set(KINDS):
            raise BadFileError("corrupt header: bad metadata entry (kept)")
        for v in e.values():
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_BYTES:
                raise BadFileError("corrupt header: bad metadata length")
            total += v
    if total > MAX_BYTES:
        raise BadFileError(f"corrupt header: metadata of more than {MAX_BYTES} bytes")
    return total


def unpack(entries: list[dict], section: bytes) -> list[dict]:
    """Each image's metadata from its header entry ({} for none) and the file's section."""
    total = check_entries([e for e in entries if e])
    if not total:
        if section:
            raise BadFileError("corrupt .sfc file: a metadata section that no image lists")
        return [{} for _ in entries]
    inflater = zlib.decompressobj(-15)
    try:
        raw = inflater.decompress(bytes(section), total + 1)  # bounded: a bomb stops past the total
    except zlib.error:
        raise BadFileError("corrupt .sfc file: the metadata section does not inflate") from None
    if len(raw) != total or not inflater.eof or inflater.unconsumed_tail or inflater.unused_data:
        raise BadFileError("corrupt .sfc file: the metadata section does not hold what the header lists")
    out, pos = [], 0
    for e in entries:
        md: dict[str, Any] = {}
        for kind in KINDS:
            if kind in (e or {}):
                blob, pos = raw[pos:pos + e[kind]], pos + e[kind]
                if kind == "info":
                    md.update(_parse_info(blob))
                else:
                    if kind == "png":
                        _png_blob_chunks(blob)  # checked here: a decoded file's chunks go into its PNG as they are
                    md[kind] = blob
        out.append(md)
    return out


def _number(v, lo: float, hi: float) -> bool:
    """A finite real number in [lo, hi] (Pillow gives a TIFF's resolution as an IFDRational)."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and lo <= v <= hi


def _text_entry(t) -> bool:
    """A text chunk as PNG can hold it: a Latin-1 keyword of 1 - 79 characters, UTF-8 strings, no NUL
    but in the value."""
    if not (isinstance(t, list) and len(t) in (2, 4) and all(isinstance(s, str) for s in t)):
        return False
    try:
        t[0].encode("latin-1")
        for s in t[1:]:
            s.encode("utf-8")
    except UnicodeError:
        return False
    return 1 <= len(t[0]) <= 79 and not any("\0" in s for i, s in enumerate(t) if i != 1)


def _parse_info(blob: bytes) -> dict:
    """The "info" blob's JSON, every value checked as `read` makes it."""
    bad = BadFileError("corrupt .sfc file: bad metadata (PNG chunks / resolution)")
    try:
        d = json.loads(blob.decode("utf-8"))
    except (ValueError, RecursionError):
        raise bad from None
    if not isinstance(d, dict) or not d or not set(d) <= set(INFO_KEYS):
        raise bad

    ok = ("gamma" not in d or _number(d["gamma"], *GAMMA_RANGE)) \
        and ("srgb" not in d or (type(d["srgb"]) is int and 0 <= d["srgb"] <= 3)) \
        and ("chromaticity" not in d or (isinstance(d["chromaticity"], list) and len(d["chromaticity"]) == 8
                                         and all(_number(v, *CHROMA_RANGE) for v in d["chromaticity"]))) \
        and ("dpi" not in d or (isinstance(d["dpi"], list) and len(d["dpi"]) == 2
                                and all(_number(v, *DPI_RANGE) for v in d["dpi"]))) \
        and ("text" not in d or (isinstance(d["text"], list) and d["text"] and all(map(_text_entry, d["text"]))))
    if not ok:
        raise bad
    for k in ("gamma", "chromaticity", "dpi"):  # JSON gives 1 for 1.0: read() makes floats
        if k in d:
            d[k] = float(d[k]) if k == "gamma" else [float(v) for v in d[k]]
    return d

