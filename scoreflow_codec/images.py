"""Reading and writing users' images, and what "lossless" means for each mode.

Lossless here means: the decoded file holds exactly the pixels Pillow gives for the input, in the
input's mode. EXIF orientation is not applied: a rotated JPEG comes back with the same stored
pixels, and its EXIF (metadata.py, kept unless dropped) holds the orientation tag.

Modes coded:
  RGB, L, 1 (as L 0/255)         -> colour planes through the model; a PNG's transparent colour
                                    (tRNS) kept in the header since 0.10.6
  RGBA, LA                       -> colour planes through the model + alpha with the seed codec
                                    (a constant alpha is stored in the header, free)
  P (palette), PA                -> palette colours through the model when the palette has no
                                    duplicate colours (indices are restored exactly), else the
                                    index plane with the seed codec; transparency kept.
                                    `palette_as_indices` gives a colour-coded palette image's
                                    index plane, which the codec keeps where it codes smaller
                                    (api.choose_palette_coding)
  L;16, LA;16, RGB;16, RGBA;16  -> 16-bit images (grey PNG / TIFF, 48/64-bit PNG / TIFF): the 8-bit image of
                                    their high bits as above, the low bits in their own section
                                    (deep.py); `to_array` gives them, `encode_source` writes a PNG or TIFF
Refused with a clear message: 32-bit / float (I, F), 16-bit colour other than PNG and TIFF (or a
TIFF of several pictures or planes), CMYK, YCbCr, LAB, HSV,
premultiplied (RGBa, La), animations, icons of several sizes (ICO, ICNS), and anything Pillow can't open
(a .sfc file said to be one).
"""
from __future__ import annotations

import contextlib
import io
import os
import warnings
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from . import deep as dp
from . import metadata as md
from .errors import BadImageError, UnsupportedImageError

LOSSLESS_SAVE = {".png": "PNG", ".tif": "TIFF", ".tiff": "TIFF", ".bmp": "BMP", ".ppm": "PPM",
                 ".pgm": "PPM", ".pnm": "PPM", ".webp": "WEBP"}
# the suffixes of the image files a folder stands for (sfcodec -d FOLDER, the trainer's --data FOLDER):
# what photographs and scans come as, in any case of letters
IMAGE_SUFFIXES = frozenset({".png", ".tif", ".tiff", ".jpg", ".jpeg", ".webp", ".bmp", ".ppm", ".pgm", ".pnm",
                            ".gif", ".tga"})
MAX_PIXELS = 100_000_000  # per image; bigger needs more memory than a laptop has to spare
# camera raw files (0.9.30): many are TIFF-like, and Pillow reads their first picture, a small preview,
# so they are refused by name, and a TIFF by what its first directory says (_preview_only)
RAW_SUFFIXES = frozenset({".dng", ".cr2", ".cr3", ".crw", ".nef", ".nrw", ".arw", ".srf", ".sr2", ".orf", ".rw2",
                          ".raf", ".pef", ".srw", ".rwl", ".3fr", ".erf", ".kdc", ".dcr", ".mrw", ".x3f", ".iiq"})
_RAW_ADVICE = "develop it into a 16-bit TIFF or PNG first (sfcodec keeps every bit of those)"


def folder_files(top: Path, recursive: bool, kinds: frozenset[str] = IMAGE_SUFFIXES) -> list[Path]:
    """The files in the folder top (and below it where recursive) whose suffix is in kinds, sorted; names
    starting with a dot skipped, files and folders (hidden files, a Mac's "._" copies of each image, which
    are not images, .git, sfcodec's own temporary files), and symbolic links to folders not followed."""
    found = []
    for here, dirs, names in os.walk(top):  # does not follow links to folders
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if recursive else []
        found += [Path(here) / n for n in names if not n.startswith(".") and Path(n).suffix.lower() in kinds
                  and (Path(here) / n).is_file()]
    return sorted(found)


@dataclass
class SourceImage:
    """An image as the codec sees it."""

    mode: str                       # mode to restore: RGB, RGBA, L, LA, 1, P, PA; RGB;16 ... (deep.MODES)
    color: np.ndarray | None        # uint8 [C, H, W], C in {1, 3}: coded by the model (a 16-bit image's high bits)
    extra: np.ndarray | None        # uint8 [E, H, W]: alpha or palette indices (seed codec)
    meta: dict = field(default_factory=dict)  # palette, transparency, constant alpha, 16-bit "deep" ...
    # ICC profile, EXIF, XMP, PNG chunks, resolution: not pixels, kept for the user (metadata.py)
    metadata: dict = field(default_factory=dict)
    # a 16-bit image's low bits (uint8 [C, H, W], every channel) and table of values (deep.split)
    low: np.ndarray | None = field(default=None, compare=False)
    table: np.ndarray | None = field(default=None, compare=False)
    # set once api.choose_palette_coding has chosen between colours and indices (not stored)
    coding_chosen: bool = field(default=False, compare=False)
    # what the file held beside its pixels that `metadata` does not keep (metadata.unkept; not stored)
    not_kept: list = field(default_factory=list, compare=False)

    @property
    def size(self) -> tuple[int, int]:
        ref = self.color if self.color is not None else self.extra
        return int(ref.shape[2]), int(ref.shape[1])

    @property
    def num_dims(self) -> int:
        """The dims bits/dim counts: all channels of the restored image (index plane for P)."""
        w, h = self.size
        return w * h * channels_of(self.mode)

    @property
    def deep(self) -> bool:
        """A 16-bit image (deep.MODES)."""
        return self.mode in dp.MODES

    def high_planes(self) -> np.ndarray:
        """A 16-bit image's high bits, every channel (uint8 [C, H, W]: colour, then alpha)."""
        planes = [self.color]
        if self.mode.startswith(("RGBA", "LA")):
            w, h = self.size
            planes.append(self.extra if self.extra is not None else np.full((1, h, w), self.meta["alpha_const"], np.uint8))
        return np.concatenate(planes)


def channels_of(mode: str) -> int:
    return {"RGB": 3, "RGBA": 4, "L": 1, "LA": 2, "1": 1, "P": 1, "PA": 2, **dp.MODES}[mode]


def pixel_crc(img: Image.Image) -> int:
    """CRC32 of the pixels as Pillow gives them (mode and size included)."""
    arr = np.asarray(img)
    head = f"{img.mode}:{img.size[0]}x{img.size[1]}:".encode()
    return zlib.crc32(arr.tobytes(), zlib.crc32(head)) & 0xFFFFFFFF


def _planes(arr: np.ndarray) -> np.ndarray:
    if arr.ndim == 2:
        arr = arr[:, :, None]
    return np.ascontiguousarray(arr.transpose(2, 0, 1).astype(np.uint8))


def _split_alpha(arr: np.ndarray, meta: dict) -> np.ndarray | None:
    """Alpha plane [1, H, W] for the seed codec, or None when constant (kept in meta)."""
    a = arr[..., -1]
    if (a == a.flat[0]).all():
        meta["alpha_const"] = int(a.flat[0])
        return None
    return _planes(a)


def from_deep(arr: np.ndarray, mode: str) -> SourceImage:
    """A 16-bit image, uint16 [H, W, C] of mode deep.MODES: its high bits as an 8-bit image (alpha
    apart, as for RGBA), its low bits and table (deep.split)."""
    hi, lo, table, info = dp.split(np.ascontiguousarray(arr.transpose(2, 0, 1)))
    meta: dict = {"deep": info}
    cc = 3 if mode.startswith("RGB") else 1
    extra = None
    if hi.shape[0] > cc:
        extra = _split_alpha(hi[cc][:, :, None], meta)
    return SourceImage(mode, np.ascontiguousarray(hi[:cc]), extra, meta, low=lo, table=table)


def _check_size(w: int, h: int) -> None:
    if w * h > MAX_PIXELS:
        raise UnsupportedImageError(f"image too large: {w}x{h} pixels (limit {MAX_PIXELS:,})")




def _pixels_from_pil(img: Image.Image) -> SourceImage:
    """The pixels of a Pillow image, refusing what can't be coded losslessly."""
    if getattr(img, "is_animated", False) and getattr(img, "n_frames", 1) > 1:
        if img.format == "MPO":  # a phone's JPEG with a second picture (depth map, preview) after the first
            raise UnsupportedImageError(f"multi-picture JPEGs (MPO, {img.n_frames} pictures) are not supported; "
                                        "save the picture you want as a PNG first")
        if img.format == "TIFF":  # pages, not frames (0.10.6: it said "animated" of them)
            raise UnsupportedImageError(f"TIFFs of several pages are not supported ({img.n_frames} pages); "
                                        "save the page you want as a PNG first")
        raise UnsupportedImageError(f"animated images are not supported ({img.n_frames} frames); extract one frame first")
    sizes = img.info.get("sizes") if img.format in ("ICO", "ICNS") else None
    if sizes and len(sizes) > 1:  # Pillow reads the largest alone (0.9.31: refused, as a TIFF of several pages)
        raise UnsupportedImageError(f"icons of several sizes ({img.format}, {len(sizes)} pictures) are not supported; "
                                    "save the size you want as a PNG first")
    mode = img.mode
    w, h = img.size
    if w < 1 or h < 1:
        raise BadImageError("image has no pixels")
    _check_size(w, h)
    meta: dict = {}
    if mode in ("I;16", "I;16B", "I;16L", "I;16N"):
        src = from_deep(np.asarray(img).astype(np.uint16)[:, :, None], "L;16")
        _colour_key(img, src.meta)  # a 16-bit grey PNG's transparent colour (0.10.6; refused before)
        return src
    if mode in ("I", "F", "I;32"):
        raise UnsupportedImageError(f"{mode} images (32-bit or float) are not supported: 8 or 16 bits per channel")
    if mode in ("CMYK", "YCbCr", "LAB", "HSV"):
        raise UnsupportedImageError(f"{mode} images are not supported: convert to RGB first")
    if mode in ("RGBa", "La"):
        raise UnsupportedImageError(f"premultiplied-alpha mode {mode} is not supported")
    if mode in ("RGB", "L", "1"):
        _colour_key(img, meta)
        return SourceImage(mode, _planes(np.asarray(img if mode != "1" else img.convert("L"))), None, meta)
    if mode == "RGBA":
        arr = np.asarray(img)
        return SourceImage("RGBA", _planes(arr[..., :3]), _split_alpha(arr, meta), meta)
    if mode == "LA":
        arr = np.asarray(img)
        return SourceImage("LA", _planes(arr[..., :1]), _split_alpha(arr, meta), meta)
    if mode in ("P", "PA"):
        return _from_palette(img, meta)
    raise UnsupportedImageError(f"image mode {mode} is not supported")


def _colour_key(img: Image.Image, meta: dict) -> None:
    """A grey or RGB PNG's transparent colour (tRNS: the pixels of that value are transparent), in meta
    as Pillow gives it (0.10.6; before, it was dropped without a word, and a 16-bit image's refused): an
    int for grey, [r, g, b] (16-bit values in a 16-bit image's)."""
    tr = img.info.get("transparency")
    if tr is not None:
        meta["transparency"] = [int(v) for v in tr] if isinstance(tr, tuple) else int(tr)


# the modes that may have a transparent colour (_colour_key), and its number of samples
COLOUR_KEY_MODES = {"L": 1, "1": 1, "RGB": 3, "L;16": 1, "RGB;16": 3}


def checked_colour_key(mode: str, tr):
    """meta["transparency"] of an image of COLOUR_KEY_MODES read from a file's header: Pillow's value, or
    BadImageError where a damaged header holds something else, or one on an image of another mode (the
    decoder then refuses it; a palette's transparency is another thing, to_pil's)."""
    n = COLOUR_KEY_MODES.get(mode)
    if n is None:
        raise BadImageError(f"a transparent colour on an image of mode {mode}")
    vals = tr if n == 3 and isinstance(tr, list) else [tr] if n == 1 else None
    if vals is None or len(vals) != n or not all(type(v) is int and 0 <= v < 1 << 16 for v in vals):
        raise BadImageError(f"bad transparent colour {tr!r} for a {mode} image")
    return tuple(vals) if n == 3 else vals[0]


def from_pil(img: Image.Image) -> SourceImage:
    """Pillow image -> SourceImage with its metadata (ICC profile, EXIF, ...: metadata.read),
    refusing what can't be coded losslessly."""
    src = _pixels_from_pil(img)
    src.metadata = md.read(img)
    return src


def _from_palette(img: Image.Image, meta: dict, indices: bool = False) -> SourceImage:
    """The palette's colours where they restore the indices exactly (and not `indices`), else the
    index plane."""
    pal_mode, pal_bytes = img.palette.getdata() if img.palette is not None else ("RGB", b"")
    if pal_mode not in ("RGB", "RGBA") or not pal_bytes:
        raise UnsupportedImageError(f"palette of kind {pal_mode!r} is not supported")
    stride = len(pal_mode)
    pal = np.frombuffer(pal_bytes, dtype=np.uint8).reshape(-1, stride)
    arr = np.asarray(img)
    idx = arr if img.mode == "P" else arr[..., 0]
    meta["palette_mode"] = pal_mode
    meta["palette"] = pal_bytes.hex()
    if "transparency" in img.info:
        tr = img.info["transparency"]
        meta["transparency"] = tr.hex() if isinstance(tr, bytes) else int(tr)
    extra_planes = []
    used = np.unique(idx)
    colors = pal[:, :3]
    if not indices and used.max() < len(pal) and len({tuple(c) for c in colors[used]}) == len(used):
        meta["palette_coded"] = "colors"
        meta["palette_used"] = used.astype(int).tolist()
        color = _planes(colors[idx])
    else:
        meta["palette_coded"] = "indices"
        color = None
        extra_planes.append(idx)
    if img.mode == "PA":
        extra_planes.append(arr[..., 1])
    extra = np.stack([p.astype(np.uint8) for p in extra_planes]) if extra_planes else None
    return SourceImage(img.mode, color, extra, meta)


def palette_as_indices(src: SourceImage) -> SourceImage | None:
    """A palette image coded by its colours (meta "palette_coded": "colors"), as its index plane
    instead: the same restored image (to_pil gives identical pixels and palette). None for any other."""
    if src.mode not in ("P", "PA") or src.meta.get("palette_coded") != "colors":
        return None
    meta = {k: v for k, v in src.meta.items() if k not in ("palette_coded", "palette_used")}
    alt = _from_palette(to_pil(src), meta, indices=True)
    alt.coding_chosen, alt.metadata = src.coding_chosen, src.metadata
    return alt


def _low_grey_bits(img: Image.Image) -> int | None:
    """2 or 4 for a grey PNG of 2 or 4 bits a pixel, else None. Pillow gives its pixels scaled to 0 - 255
    (x 85, x 17) but its transparent colour (tRNS) as stored: _load_image scales that too (0.10.6), so the
    8-bit PNG written back keeps the same pixels transparent (Pillow's own save would not)."""
    if img.format != "PNG" or img.mode != "L":
        return None
    raw = {dp.rawmode(t) for t in getattr(img, "tile", None) or []}
    return {"L;2": 2, "L;4": 4}.get(raw.pop()) if len(raw) == 1 else None


def _pnm_wide(p: Path, img: Image.Image) -> np.ndarray | None:
    """uint16 [H, W, 1 or 3]: the samples of a PGM or PPM (binary or plain) whose maxval is above 255, as
    Pillow gives a grey one (mode I: maxval 65535 as stored, another scaled to 0 - 65535 by Pillow's
    rounding), else None. Pillow hands over such a PPM as 8-bit RGB (each sample scaled to 0 - 255): until
    0.10.6 its low bits were lost without a word (dcraw's 16-bit output), and a 16-bit PGM was refused as
    a 32-bit image. A PPM's samples go through Pillow's grey decoder too, as a PGM three times as wide
    (its samples in the same order), so both scale alike."""
    tile = (getattr(img, "tile", None) or [None])[0]
    args = tile.args if tile is not None else None
    if img.mode == "I":  # a grey one (Pillow's mode for maxval > 255)
        img.load()
        arr = np.asarray(img)
        if arr.min(initial=0) < 0 or arr.max(initial=0) > 65535:
            raise BadImageError("PGM samples outside 0 - 65535")
        return arr.astype(np.uint16)[:, :, None]
    if img.mode != "RGB" or not (isinstance(args, tuple) and len(args) == 2 and isinstance(args[1], int)) \
            or args[1] <= 255 or tile.codec_name not in ("ppm", "ppm_plain"):
        return None
    w, h = img.size
    maxval, n = args[1], 3 * w * h
    with open(p, "rb") as f:
        f.seek(tile.offset)
        data = f.read()
    if tile.codec_name == "ppm":  # binary: big-endian 16-bit samples
        if len(data) < 2 * n:
            raise BadImageError("image file is truncated")
        samples = np.frombuffer(data, ">u2", n)
    else:  # plain: decimal numbers, "#" comments to the end of a line
        words = b" ".join(line.split(b"#", 1)[0] for line in data.splitlines()).split()
        if len(words) < n:
            raise BadImageError("image file is truncated")
        try:
            samples = np.array(words[:n], dtype=np.int64)
        except ValueError:
            raise BadImageError("a PPM sample that is not a number") from None
    if samples.max(initial=0) > maxval or samples.min(initial=0) < 0:
        raise BadImageError(f"PPM samples above its maxval {maxval}")
    grey = f"P5\n{3 * w} {h}\n{maxval}\n".encode() + samples.astype(">u2").tobytes()
    with Image.open(io.BytesIO(grey)) as g:
        g.load()
        return np.asarray(g).astype(np.uint16).reshape(h, w, 3)


def _wide_rawmode(img: Image.Image) -> str | None:
    """The raw mode of a file with 16-bit samples that Pillow would hand over as 8-bit RGB / RGBA /
    LA (a 48-bit PNG opens as "RGB", keeping the high bytes only), else None."""
    for tile in getattr(img, "tile", None) or []:
        raw = dp.rawmode(tile)
        base, _, bits = raw.partition(";")
        if base in ("RGB", "RGBA", "RGBX", "LA", "L") and bits.rstrip("BLN") in ("16", "32"):
            return raw
    return None


@contextlib.contextmanager
def _no_bomb_warning():
    """Pillow's decompression-bomb warning kept quiet (load_image's size limit, MAX_PIXELS, is ours)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        yield


@contextlib.contextmanager
def opened(path: str | os.PathLike):
    """Image.open(path) without Pillow's decompression-bomb warning."""
    with _no_bomb_warning(), Image.open(path) as img:
        yield img


def peek(path: str | os.PathLike) -> tuple[int, int, bool]:
    """(width, height, whether its samples are 16-bit) of an image file, from its header alone (no pixels
    decoded): what load_image would read, for an estimate of the memory it takes to code (sfcodec -d).
    Raises BadImageError where Pillow cannot read the file (load_image says why)."""
    try:
        with opened(path) as img:
            deep = img.mode.startswith("I;16") or _wide_rawmode(img) is not None
            return img.size[0], img.size[1], deep
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise BadImageError(f"{path}: cannot read image ({e.__class__.__name__})") from None


def _preview_only(img: Image.Image) -> str | None:
    """Why a TIFF's first picture is not the image (a camera raw file's preview), else None: a DNG
    (DNGVersion, tag 50706), or a first directory marked as a reduced-resolution copy of another
    (NewSubfileType bit 0: a raw file's thumbnail, whose full picture Pillow does not read)."""
    if img.format != "TIFF":
        return None
    tags = getattr(img, "tag_v2", {})
    size = f"{img.size[0]}x{img.size[1]}"
    if 50706 in tags:
        return f"a camera raw file (DNG): Pillow reads only its {size} preview, not the raw data; {_RAW_ADVICE}"
    if isinstance(tags.get(254), int) and tags[254] & 1:
        return (f"its first picture ({size}) is a reduced-resolution preview of another one, which is not read "
                f"(a camera raw file?); {_RAW_ADVICE}")
    return None


_CUT_ADVICE = "save it as a 16-bit PNG or TIFF first"


def _cut_depth(p: Path, img: Image.Image) -> str | None:
    """Why Pillow would hand over fewer bits than the file holds (0.10.6), else None: a JPEG 2000 image of
    more than 8 bits per sample in colour (or grey + alpha), or more than 16 in grey (Pillow: 8-bit RGB /
    LA, 16-bit grey), and an AVIF of more than 8 (Pillow decodes every one to 8 bits). Before, those 8 bits
    were coded and reported as a success: the rest of each sample lost without a word."""
    if img.format == "JPEG2000":
        bits = _j2k_bits(p)
        most = 16 if img.mode == "I;16" else 8
    elif img.format == "AVIF":
        bits, most = _avif_bits(p), 8
    else:
        return None
    if bits is None or bits <= most:
        return None
    what = "an AVIF" if img.format == "AVIF" else "a JPEG 2000"
    return f"{what} image of {bits} bits per sample, which Pillow reads as {most}: {_CUT_ADVICE}"


def _find(p: Path, marker: bytes, limit: int | None = None) -> bytes:
    """The bytes of the file from the first `marker` on (64 of them), b"" where none (within `limit`)."""
    import mmap

    with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        at = m.find(marker, 0, len(m) if limit is None else min(limit, len(m)))
        return b"" if at < 0 else m[at:at + 64]


def _j2k_bits(p: Path) -> int | None:
    """The most bits of a component in a JPEG 2000 file's codestream (its SIZ marker segment, right after
    the codestream's SOC: Ssiz per component, bits - 1 in its low 7 bits), None where it is not found."""
    siz = _find(p, b"\xff\x4f\xff\x51")[2:]  # from Lsiz on
    if len(siz) < 41:
        return None
    n = int.from_bytes(siz[38:40], "big")
    ssiz = siz[40:40 + 3 * n:3]
    return max((b & 0x7F) + 1 for b in ssiz) if ssiz else None


def _avif_bits(p: Path) -> int | None:
    """An AVIF's bits per channel: its 'pixi' box (bits of each channel), else its AV1 configuration
    ('av1C': 12 where twelve_bit, 10 where high_bitdepth, else 8); None where neither is in its first 1 MiB
    (the boxes that describe the image come before its data)."""
    pixi = _find(p, b"pixi", 1 << 20)
    if len(pixi) >= 9 and pixi[8] and len(pixi) >= 9 + pixi[8]:
        return max(pixi[9:9 + pixi[8]])
    av1c = _find(p, b"av1C", 1 << 20)
    if len(av1c) >= 7:
        flags = av1c[6]
        return 12 if flags & 0x20 else 10 if flags & 0x40 else 8
    return None


def _is_sfc(path: Path) -> bool:
    from .container import MAGIC

    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def read_npz(path: str | os.PathLike, also: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """An .npz file's "images" array and those of `also` that it holds (sfcodec eval's, the trainer's and
    the bench's inputs; each checks the array's shape itself). BadImageError naming the file where it is
    missing, is not an .npz (np.load would read another file as a pickle, and say so), cannot be read
    (cut short) or holds no "images" array (naming what it holds)."""
    p = Path(path)
    if not p.is_file():
        raise BadImageError(f"{p}: no such file")
    if not zipfile.is_zipfile(p):
        raise BadImageError(f"{p}: not an .npz file")
    try:
        with np.load(p) as z:
            held = z.files
            if "images" in held:
                return {k: z[k] for k in ("images", *also) if k in held}
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as e:
        raise BadImageError(f"{p}: not a readable .npz file ({e})") from None
    raise BadImageError(f"{p}: no 'images' array in the .npz (it holds: {', '.join(held) or 'nothing'})")


def load_image(path: str | os.PathLike) -> SourceImage:
    """An image file -> SourceImage (its pixels, metadata and what it holds that is not kept), or
    BadImageError / UnsupportedImageError naming the file. The size limit is ours (MAX_PIXELS, checked from
    the header before any pixel is decoded), not Pillow's decompression-bomb guard, whose warning (three
    lines of Python on stderr for an image of 89.5 - 100 Mpix) and error ("not an image Pillow can read"
    for one above 179 Mpix) are kept out of the way (0.9.34)."""
    with _no_bomb_warning():  # deep.read_wide opens the file again
        return _load_image(Path(path))


SNIFF_BYTES = 1 << 20  # what read_image_stream reads before it knows whether the stream is an image


def read_image_stream(f, name: str) -> bytes:
    """An image's bytes from a stream that can be read only once (standard input, a pipe, a device),
    read to the end only when its first bytes are an image's as Pillow tells them: by the 16-byte
    prefix its formats' checks accept, or, for the formats that have none (TGA, IM, ...), by opening
    the first SNIFF_BYTES. Anything else is refused at once with load_image's words (0.9.36:
    `sfcodec compress /dev/zero` read for ever)."""
    import io

    Image.init()
    first = f.read(SNIFF_BYTES)
    if not any(_accepts(Image.OPEN[i][1], first[:16]) for i in Image.ID):
        try:
            with _no_bomb_warning(), Image.open(io.BytesIO(first), formats=[i for i in Image.ID if Image.OPEN[i][1] is None]):
                pass
        except Image.DecompressionBombError:
            pass  # an image (load_image says how large)
        except Exception as e:
            raise BadImageError(f"{name}: not an image Pillow can read ({e.__class__.__name__})") from None
    return first + f.read()


def _accepts(check, prefix: bytes) -> bool:
    """A Pillow format's check of a file's first bytes; a check that fails on them (some unpack more
    bytes than an empty or short input has: struct.error) says no, as Image.open takes it."""
    if check is None:
        return False
    try:
        return bool(check(prefix))
    except Exception:
        return False


def _bomb_size(e: Exception) -> str:
    """The pixel count of Pillow's DecompressionBombError's message, for our own "too large" message."""
    import re

    m = re.search(r"\((\d+) pixels\)", str(e))
    return f"{int(m.group(1)):,} pixels" if m else "more pixels than Pillow opens"


def _load_image(p: Path) -> SourceImage:
    if not p.exists():
        raise BadImageError(f"{p}: no such file")
    if p.is_dir():
        raise BadImageError(f"{p}: is a directory, not an image")
    if p.suffix.lower() in RAW_SUFFIXES:
        raise UnsupportedImageError(f"{p}: camera raw files ({p.suffix}) are not supported: {_RAW_ADVICE}")
    try:
        with Image.open(p) as img:
            _check_size(*img.size)  # before any pixel is decoded
            why = _preview_only(img) or _cut_depth(p, img)
            if why:
                raise UnsupportedImageError(why)
            wide, how = _wide_rawmode(img), dp.wide_colour(img)
            pnm = _pnm_wide(p, img) if img.format == "PPM" else None
            if pnm is not None:
                src = from_deep(pnm, "L;16" if pnm.shape[2] == 1 else "RGB;16")
                src.metadata = md.read(img)
            elif how and not getattr(img, "n_frames", 1) > 1:
                _check_size(*img.size)
                arr, mode, kept = dp.read_wide(p, how)
                src = from_deep(arr, mode)
                src.metadata = kept
                _colour_key(img, src.meta)  # a 48-bit PNG's transparent colour (0.10.6; refused before)
            elif wide:
                raise UnsupportedImageError(f"{wide} samples are not supported: 16-bit colour is read from PNG and "
                                            "TIFF files of one picture, interleaved (save it as a 16-bit PNG)")
            else:
                low = _low_grey_bits(img)
                img.load()
                src = from_pil(img)
                if low and "transparency" in src.meta:
                    src.meta["transparency"] *= 255 // ((1 << low) - 1)
            src.not_kept = md.unkept(img)
            return src
    except BadImageError as e:
        raise type(e)(f"{p}: {e}") from None
    except Image.DecompressionBombError as e:
        raise UnsupportedImageError(f"{p}: image too large: {_bomb_size(e)} (limit {MAX_PIXELS:,})") from None
    except UnidentifiedImageError as e:
        if _is_sfc(p):
            raise BadImageError(f"{p}: is a .sfc file already (sfcodec decompress turns it back into an image)") from None
        raise BadImageError(f"{p}: not an image Pillow can read ({e.__class__.__name__})") from None
    except (OSError, SyntaxError, ValueError) as e:
        raise BadImageError(f"{p}: cannot read image ({e})") from None


def from_array(arr: np.ndarray) -> SourceImage:
    """uint8 or uint16 [H, W] or [H, W, C] (C = 1, 2, 3, 4) -> SourceImage."""
    arr = np.asarray(arr)
    if arr.dtype == np.uint16:
        a3 = arr[:, :, None] if arr.ndim == 2 else arr
        mode = {c: m for m, c in dp.MODES.items()}.get(a3.shape[2]) if a3.ndim == 3 else None
        if mode is None or 0 in a3.shape:
            raise UnsupportedImageError(f"array of shape {arr.shape} is not an image")
        return from_deep(a3, mode)
    if arr.dtype != np.uint8:
        raise UnsupportedImageError(f"arrays must be uint8 or uint16, got {arr.dtype}")
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    modes = {2: "L", 3: {2: "LA", 3: "RGB", 4: "RGBA"}}
    mode = "L" if arr.ndim == 2 else modes[3].get(arr.shape[2]) if arr.ndim == 3 else None
    if mode is None:
        raise UnsupportedImageError(f"array of shape {arr.shape} is not an image")
    return from_pil(Image.fromarray(arr, mode))


def to_array(src: SourceImage) -> np.ndarray:
    """The restored pixels: uint8 as Pillow gives them (to_pil), uint16 [H, W, C] for a 16-bit image."""
    if not src.deep:
        return np.asarray(to_pil(src))
    u = dp.join(src.high_planes(), src.low, src.table, src.meta["deep"])
    return np.ascontiguousarray(u.transpose(1, 2, 0))


def image_crc(src: SourceImage) -> int:
    """CRC32 of the restored pixels: pixel_crc of to_pil, or for a 16-bit image of its mode, size and
    samples (big-endian 16-bit, as in a PNG)."""
    if not src.deep:
        return pixel_crc(to_pil(src))
    w, h = src.size
    head = f"{src.mode}:{w}x{h}:".encode()
    return zlib.crc32(to_array(src).astype(">u2").tobytes(), zlib.crc32(head)) & 0xFFFFFFFF


def to_pil(src: SourceImage) -> Image.Image:
    """SourceImage -> Pillow image in the original mode (not for a 16-bit image: to_array)."""
    if src.deep:
        raise UnsupportedImageError(f"a {src.mode} image has no Pillow mode: use to_array or encode_source")
    m = src.meta
    w, h = src.size
    if src.mode in ("P", "PA"):
        pal = np.frombuffer(bytes.fromhex(m["palette"]), dtype=np.uint8).reshape(-1, len(m["palette_mode"]))
        if m["palette_coded"] == "colors":
            lut = {tuple(pal[i, :3]): i for i in m["palette_used"]}
            rgb = src.color.transpose(1, 2, 0).reshape(-1, 3)
            keys = (rgb[:, 0].astype(np.int64) << 16) | (rgb[:, 1].astype(np.int64) << 8) | rgb[:, 2]
            table = {(int(r) << 16) | (int(g) << 8) | int(b): i for (r, g, b), i in lut.items()}
            uniq, inv = np.unique(keys, return_inverse=True)
            try:
                mapped = np.array([table[int(k)] for k in uniq], dtype=np.uint8)
            except KeyError:
                raise BadImageError("decoded colours are not in the palette") from None
            idx = mapped[inv].reshape(h, w)
            alpha_plane = src.extra[0] if src.extra is not None else None
        else:
            idx = src.extra[0]
            alpha_plane = src.extra[1] if src.extra is not None and len(src.extra) > 1 else None
        if src.mode == "PA":
            img = Image.fromarray(np.stack([idx, alpha_plane], -1), "LA")
            img = Image.frombytes("PA", (w, h), img.tobytes())
        else:
            img = Image.fromarray(idx, "L")
            img = Image.frombytes("P", (w, h), img.tobytes())
        img.putpalette(bytes.fromhex(m["palette"]), m["palette_mode"])
        if "transparency" in m:
            tr = m["transparency"]
            img.info["transparency"] = bytes.fromhex(tr) if isinstance(tr, str) else tr
        return img
    color = src.color.transpose(1, 2, 0)
    if src.mode in ("RGBA", "LA"):
        alpha = src.extra[0] if src.extra is not None else np.full((h, w), m["alpha_const"], dtype=np.uint8)
        arr = np.concatenate([color, alpha[:, :, None]], axis=2)
        return Image.fromarray(arr, src.mode)
    if src.mode == "RGB":
        img = Image.fromarray(np.ascontiguousarray(color), "RGB")
    else:
        img = Image.fromarray(np.ascontiguousarray(color[:, :, 0]), "L")
        img = img.convert("1") if src.mode == "1" else img
    if "transparency" in m:  # a PNG's transparent colour (0.10.6)
        img.info["transparency"] = checked_colour_key(src.mode, m["transparency"])
    return img


def _cannot_hold(fmt: str | None, mode: str) -> str | None:
    """Why a file of format `fmt` (LOSSLESS_SAVE's) cannot hold an image of this mode (a Pillow mode, or a
    16-bit one: deep.WRITTEN_AS), or None."""
    if mode in dp.MODES:
        return None if fmt in dp.WRITTEN_AS[mode] else \
            f"a 16-bit {mode} image can only be written as {' or '.join(dp.WRITTEN_AS[mode])}"
    if fmt == "WEBP" and mode not in ("RGB", "RGBA"):
        return f"WebP cannot hold mode {mode} losslessly; use .png"
    if fmt == "PPM" and mode not in ("RGB", "L", "1"):
        return f"PPM cannot hold mode {mode}; use .png"
    if fmt == "BMP" and mode in ("LA", "PA", "RGBA"):  # RGBA: Pillow writes its alpha where readers ignore it
        return f"BMP cannot hold mode {mode}; use .png"
    return None


def same_format(name: str | None, mode: str) -> str:
    """The suffix of the output an image decoded from a .sfc gets by default (0.9.31): its input's, as the
    file name the .sfc keeps says it (.tif, .tiff, .webp, .bmp, .png, .ppm ...), where that format is
    lossless and holds the image's mode (deep.WRITTEN_AS for a 16-bit one), else .png (a JPEG's, a GIF's,
    an image from standard input)."""
    suffix = Path(name).suffix.lower() if isinstance(name, str) else ""
    fmt = LOSSLESS_SAVE.get(suffix)
    return ".png" if fmt is None or _cannot_hold(fmt, mode) else suffix


def encode_image(img: Image.Image, suffix: str, metadata: dict | None = None) -> bytes:
    """A lossless file of the format the suffix names (refuses lossy formats and modes a format can't
    hold), with as much of `metadata` as the format holds (metadata.save_options says what not)."""
    fmt = LOSSLESS_SAVE.get(suffix.lower())
    if fmt is None:
        raise UnsupportedImageError(f"output must be a lossless format ({', '.join(sorted(LOSSLESS_SAVE))}), not {suffix!r}")
    why = _cannot_hold(fmt, img.mode)
    if why:
        raise UnsupportedImageError(why)
    kw: dict = {"lossless": True, "exact": True} if fmt == "WEBP" else {}
    kw.update(md.save_options(metadata or {}, fmt)[0])
    if fmt == "PNG" and "transparency" in img.info:
        kw["transparency"] = img.info["transparency"]
    buf = io.BytesIO()
    with warnings.catch_warnings():  # Pillow's warnings about a kept EXIF's odd tags (a TIFF's): not the user's
        warnings.simplefilter("ignore")
        img.save(buf, format=fmt, **kw)
    if fmt == "PNG":
        return md.png_with_chunks(buf.getvalue(), (metadata or {}).get("png", b""))
    return buf.getvalue()


def encode_source(src: SourceImage, suffix: str) -> bytes:
    """encode_image of the restored image with its metadata; a 16-bit image only as a PNG or a TIFF
    (grey + alpha: PNG only)."""
    if src.deep:
        fmt = LOSSLESS_SAVE.get(suffix.lower())
        why = _cannot_hold(fmt, src.mode)
        if why:
            raise UnsupportedImageError(f"{why}, not {suffix!r}")
        if fmt == "TIFF":
            return dp.encode_tiff(to_array(src), src.mode, src.metadata)
        key = src.meta.get("transparency")
        return dp.encode_png(to_array(src), src.mode, src.metadata,
                             None if key is None else checked_colour_key(src.mode, key))
    return encode_image(to_pil(src), suffix, src.metadata)


def metadata_dropped(metadata: dict, suffix: str, meta: dict | None = None) -> list[str]:
    """What of `metadata` a file of this suffix's format cannot hold (names, metadata.NAMES): the same for
    an 8-bit image and a 16-bit one (whose PNG and TIFF writers, deep.py, write what save_options keeps);
    and with the image's `meta`, its transparent colour or palette transparency, which a PNG alone holds
    (Pillow's TIFF, BMP, PPM and WebP writers leave it out)."""
    fmt = LOSSLESS_SAVE.get(suffix.lower())
    if not fmt:
        return []
    dropped = md.save_options(metadata, fmt)[1]
    if meta and "transparency" in meta and fmt != "PNG":
        dropped = dropped + ["transparency"]
    return dropped
