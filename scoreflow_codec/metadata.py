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

A TIFF holds its EXIF in its own tags (0.9.29): the metadata ones of its first directory (description,
make, model, orientation, software, date, artist, copyright, rating: TIFF_EXIF_TAGS) and its Exif and
GPS directories are kept as "exif" (a TIFF structure of those alone, made by Pillow), its XMP (tag
700) as "xmp"; a TIFF output gets both back as tags (written by Pillow: an 8-bit one's whole file, a
16-bit one's directory, deep.encode_tiff), without a directory's pointer to another (NESTED_POINTERS).

Not kept: JPEG comments, other TIFF tags (IPTC, Photoshop's), PNG chunks Pillow does not parse (tIME,
sBIT, bKGD, ...), a PNG's pixel aspect ratio without a unit, the order of chunks.

In a .sfc file (format version 5, container.py) the metadata of every image is one section after
the payload: the images' blobs ("icc", "exif", "xmp" as they are, "info" the canonical JSON of the
rest), in KINDS order, concatenated and compressed with raw DEFLATE; the header lists per image the
blobs and their lengths (meta[i]["kept"] = {"icc": 3144, "info": 61}), so that `info` names them
without reading the section and the decoder knows how much it inflates before it starts.
"""
from __future__ import annotations

import json
import math
import numbers
import struct
import zlib
from typing import Any

from .errors import BadFileError, UnsupportedImageError

KINDS = ("icc", "exif", "xmp", "info")  # the section's blobs, in this order per image
INFO_KEYS = ("chromaticity", "dpi", "gamma", "srgb", "text")  # the "info" blob's JSON
MAX_BYTES = 1 << 26  # all blobs of a file together, before compression (64 MiB)
_EXIF_PREFIX = b"Exif\x00\x00"
_XMP_KEY = "XML:com.adobe.xmp"  # PNG's iTXt keyword for XMP (Pillow also gives it as info["xmp"])
# the numbers kept, within what their PNG chunks (a u32 / 100000) and Pillow's writers take
GAMMA_RANGE, CHROMA_RANGE, DPI_RANGE = (1e-5, 21474.83647), (0.0, 21474.83647), (1e-3, 1e7)
NAMES = {"icc": "ICC profile", "exif": "EXIF", "xmp": "XMP", "text": "PNG text", "gamma": "gamma",
         "srgb": "sRGB intent", "chromaticity": "chromaticities", "dpi": "resolution (dpi)"}


# the metadata tags of a TIFF's first directory that EXIF has there too: ImageDescription, Make, Model,
# Orientation, Software, DateTime, Artist, Copyright, Rating, RatingPercent (not the image's structure:
# size, strips, compression ...); and the pointers to its Exif and GPS directories
TIFF_EXIF_TAGS = (270, 271, 272, 274, 305, 306, 315, 33432, 18246, 18249)
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
    d = info.get("dpi")
    if isinstance(d, tuple) and len(d) == 2 and all(_number(v, *DPI_RANGE) for v in d):
        md["dpi"] = [float(v) for v in d]
    return md


def _tiff_exif(img) -> bytes | None:
    """A TIFF's EXIF (TIFF_EXIF_TAGS of its first directory, its Exif and GPS directories) as the TIFF
    structure PNG's eXIf holds (Pillow's Exif.tobytes, its "Exif\\0\\0" taken off); None where it has none
    or Pillow cannot read them."""
    try:
        out = _exif_subset(img.getexif())
        if not len(out) and not any(out.get_ifd(t) for t in EXIF_DIRECTORIES):
            return None
        data = out.tobytes()
    except Exception:  # a damaged directory: the pixels still count, its EXIF is not kept
        return None
    return data[len(_EXIF_PREFIX):] if data.startswith(_EXIF_PREFIX) else data


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
            dropped.append(NAMES[name])
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
    label = {"icc": "ICC profile", "exif": "EXIF", "xmp": "XMP", "info": "PNG chunks / resolution"}
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

