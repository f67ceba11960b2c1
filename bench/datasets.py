"""Benchmark inputs: an .npz of uint8 images, a folder of images, or a named shared set.

Named sets live in ``../shared/data`` relative to the repo root (``$SFC_SHARED_DATA``
overrides): see ``NAMED``. Every loader returns an ``ImageSet`` of uint8 [H, W, C] arrays,
C in 1..4, and raises ``DataError`` (one clear line for the user) when the data is missing
or unusable.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from scoreflow_codec import images as sfc_images
from scoreflow_codec.errors import SfcError

REPO = Path(__file__).resolve().parents[1]
NAMED = {
    "cifar10": "cifar10/test.npz",
    "cifar10-train": "cifar10/train.npz",
    "kodak": "kodak",
    "misc": "misc",
}
IMAGE_SUFFIXES = frozenset({".png", ".tif", ".tiff", ".bmp", ".ppm", ".pgm", ".pnm", ".webp"})  # lossless files
_MODE_CHANNELS = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4}


class DataError(Exception):
    """Input data that is missing or can't be used; the message is meant for the user."""


@dataclass
class ImageSet:
    name: str
    source: str
    images: list[np.ndarray]
    names: list[str]
    notes: list[str] = field(default_factory=list)  # e.g. files that were skipped and why

    def __len__(self) -> int:
        return len(self.images)


def shared_data_dir() -> Path:
    return Path(os.environ.get("SFC_SHARED_DATA", REPO.parent / "shared" / "data"))


def load(spec: str, limit: int | None = None) -> ImageSet:
    """A named set (``NAMED``), an .npz file or a folder of images; the first ``limit``."""
    if spec in NAMED:
        path = shared_data_dir() / NAMED[spec]
        if not path.exists():
            raise DataError(f"data set '{spec}' not found at {path} "
                            "(set SFC_SHARED_DATA to the shared data folder)")
        s = load(str(path), limit)
        s.name = spec
        return s
    path = Path(spec)
    if path.is_dir():
        return load_folder(path, limit)
    if path.suffix == ".npz" and path.is_file():
        return load_npz(path, limit)
    if path.is_file():
        raise DataError(f"{path}: expected an .npz file or a folder of images")
    raise DataError(f"'{spec}' is neither a named set ({', '.join(NAMED)}) nor an existing "
                    "path")


def load_npz(path: str | Path, limit: int | None = None) -> ImageSet:
    path = Path(path)
    try:
        z = sfc_images.read_npz(path, also=("index",))
    except SfcError as e:
        raise DataError(str(e)) from None
    images = z["images"][:limit]
    index = z["index"][:limit] if "index" in z else np.arange(len(images))
    if images.ndim == 3:
        images = images[..., None]
    if images.dtype != np.uint8 or images.ndim != 4 or not 1 <= images.shape[3] <= 4:
        raise DataError(f"{path}: 'images' must be uint8 [N, H, W, C] with C in 1..4, "
                        f"got {images.dtype} {images.shape}")
    names = [f"{path.stem}[{int(i)}]" for i in index]
    return ImageSet(path.stem, str(path), list(images), names)


def load_folder(path: str | Path, limit: int | None = None) -> ImageSet:
    path = Path(path)
    files = sfc_images.folder_files(path, False, IMAGE_SUFFIXES)  # hidden ones (a Mac's ._ copies) left out
    images, names, notes = [], [], []
    for f in files:
        if limit is not None and len(images) >= limit:
            break
        try:
            images.append(read_image(f))
            names.append(f.name)
        except DataError as e:
            notes.append(str(e))
    if not images:
        others = sfc_images.folder_files(path, False, sfc_images.IMAGE_SUFFIXES - IMAGE_SUFFIXES)  # JPEG, GIF, TGA
        if others:
            kinds = sorted({f.suffix.lower() for f in others})
            notes.append(f"{len(others)} {'/'.join(kinds)} file(s) left out: the benchmark reads lossless files "
                         f"({', '.join(sorted(IMAGE_SUFFIXES))})")
        why = f" ({'; '.join(notes)})" if notes else ""
        raise DataError(f"{path}: no usable 8-bit images{why}")
    return ImageSet(path.name, str(path), images, names, notes)


def read_image(path: str | Path) -> np.ndarray:
    """One 8-bit image as uint8 [H, W, C]; palette images become RGB(A)."""
    try:
        with Image.open(path) as im:
            if getattr(im, "n_frames", 1) > 1:
                raise DataError(f"{path}: has {im.n_frames} frames; only still images")
            if im.mode == "P":
                im = im.convert("RGBA" if "transparency" in im.info else "RGB")
            elif im.mode == "1":
                im = im.convert("L")
            if im.mode not in _MODE_CHANNELS:
                raise DataError(f"{path}: mode {im.mode} is not 8-bit gray/RGB(A)")
            arr = np.asarray(im)
    except OSError as e:
        raise DataError(f"{path}: not a readable image ({e})") from None
    return arr[..., None] if arr.ndim == 2 else arr


def quick_set() -> ImageSet:
    """A handful of small images for --quick: 2 CIFAR-10 test images and a 64x32 Kodak crop (two
    32px tiles). Until December 2026 4 and a 64x48 crop: the CI smoke test of the scoreflow column took
    3 of the suite's 28 minutes, two thirds of it their ODE NLL (8 s a 32px tile on one core)."""
    cifar = load("cifar10", limit=2)
    kodak = shared_data_dir() / NAMED["kodak"] / "kodim23.png"
    if not kodak.is_file():
        raise DataError(f"--quick needs {kodak} (set SFC_SHARED_DATA to the shared data folder)")
    crop = np.ascontiguousarray(read_image(kodak)[200:232, 300:364])  # 32 rows x 64 columns
    return ImageSet("quick", f"{cifar.source} + {kodak}", cifar.images + [crop],
                    cifar.names + ["kodim23.png[200:232,300:364]"])
