"""Training images: an .npz of uint8 images or a folder of images, as random crops with flips.

Each rank of a distributed run draws from its own shard (every world_size-th image), with its
own random stream, so ranks never see the same crop.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from scoreflow_codec.errors import SfcError
from scoreflow_codec.images import folder_files, read_npz


def load_images(path: str | Path) -> list[np.ndarray]:
    """uint8 [H, W, 3] arrays from an .npz (key "images") or every image in a folder (recursive; the
    suffixes of images.IMAGE_SUFFIXES, hidden ones not: images.folder_files), each as the codec's model
    codes it (codec_pixels)."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"training data not found: {p}")
    if p.suffix == ".npz":
        try:
            a = read_npz(p)["images"]
        except SfcError as e:
            raise ValueError(str(e)) from None
        if a.dtype != np.uint8 or a.ndim != 4:
            raise ValueError(f"{p}: 'images' must be uint8 [N, H, W, C]")
        return list(a[..., :3]) if a.shape[-1] >= 3 else [np.repeat(x, 3, -1) for x in a]
    if not p.is_dir():
        raise ValueError(f"{p}: not an .npz file or a folder of images (give the folder that holds it)")
    files = folder_files(p, recursive=True)  # hidden files and folders left out, as sfcodec -d -r does
    if not files:
        raise ValueError(f"{p}: no images found")
    return [codec_pixels(f) for f in files]


def codec_pixels(path: Path) -> np.ndarray:
    """uint8 [H, W, 3]: what the codec gives its model of this file (images.load_image's colour planes): a
    16-bit image's high bits as deep.split reduces them (10-bit data in 16-bit words: its top 8 bits, where
    Pillow's conversion gives 16-bit grey clipped to 255 and 48-bit colour's high bytes, near black);
    grey as three equal channels; a palette image coded as indices by its colours. ValueError naming the
    file where it is not an image the codec reads."""
    from scoreflow_codec import images

    try:
        src = images.load_image(path)
    except SfcError as e:
        raise ValueError(str(e)) from None
    if src.color is None:  # a palette image kept as its indices: train on what it shows
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))
    c = src.color.transpose(1, 2, 0)
    return np.ascontiguousarray(np.repeat(c, 3, axis=2) if c.shape[2] == 1 else c)


def hold_out(images: list[np.ndarray], holdout: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(held out, training): the first min(holdout, N // 10) images, at least one, for a run given
    no evaluation data (a folder of a few photographs still gets one). ValueError with fewer than two."""
    if len(images) < 2:
        raise ValueError(f"{len(images)} training image and no --eval-data: too few to hold one out "
                         f"(give --eval-data, or more images)")
    n = max(1, min(holdout, len(images) // 10))
    return images[:n], images[n:]


class CropSampler:
    """Random crops (with optional random down-scaling and horizontal flips) as uint8 [B, 3, c, c].

    grain > 0: each crop, with probability 1/2, gets Gaussian noise of a standard deviation drawn
    uniformly from [0, grain] 8-bit levels (one per crop, independent per pixel and channel), rounded
    and clipped to 0..255. Down-scaling removes film grain and sensor noise, and a model that has not
    seen them takes them for the diffusion's noise at the clean end (bench/tile_gap.py's flagged
    tiles: a noise estimate worse than none)."""

    def __init__(self, images: list[np.ndarray], crop: int, flip: bool = True, min_scale: float = 1.0,
                 rank: int = 0, world: int = 1, seed: int = 0, grain: float = 0.0):
        shard = images[rank::world] or images
        self.crop, self.flip, self.min_scale, self.grain = crop, flip, min_scale, grain
        self.rng = np.random.default_rng([seed, rank])
        small = [im for im in shard if min(im.shape[:2]) < crop]
        if small:
            raise ValueError(f"{len(small)} images are smaller than the crop size {crop}")
        self.same_size = all(im.shape == shard[0].shape for im in shard) and min_scale >= 1.0
        if self.same_size:
            self.stack = np.stack(shard)            # fast path (CIFAR-like)
        self.images = shard
        self.weights = np.array([im.shape[0] * im.shape[1] for im in shard], dtype=np.float64)
        self.weights /= self.weights.sum()

    def _one(self, im: np.ndarray) -> np.ndarray:
        if self.min_scale < 1.0:
            lo = max(self.min_scale, self.crop / min(im.shape[:2]))
            s = float(self.rng.uniform(lo, 1.0))
            if s < 0.999:
                h, w = im.shape[:2]
                im = np.asarray(Image.fromarray(im).resize((max(self.crop, round(w * s)), max(self.crop, round(h * s))),
                                                           Image.Resampling.BOX if s <= 0.5 else Image.Resampling.LANCZOS))
        h, w = im.shape[:2]
        y = int(self.rng.integers(0, h - self.crop + 1))
        x = int(self.rng.integers(0, w - self.crop + 1))
        return im[y:y + self.crop, x:x + self.crop]

    def sample(self, n: int) -> torch.Tensor:
        if self.same_size:
            idx = self.rng.integers(0, len(self.stack), n)
            h, w = self.stack.shape[1:3]
            if (h, w) == (self.crop, self.crop):
                batch = self.stack[idx]
            else:
                ys = self.rng.integers(0, h - self.crop + 1, n)
                xs = self.rng.integers(0, w - self.crop + 1, n)
                batch = np.stack([self.stack[i, y:y + self.crop, x:x + self.crop] for i, y, x in zip(idx, ys, xs)])
        else:
            idx = self.rng.choice(len(self.images), n, p=self.weights)
            batch = np.stack([self._one(self.images[i]) for i in idx])
        if self.flip:
            f = self.rng.random(n) < 0.5
            batch = batch.copy()
            batch[f] = batch[f, :, ::-1]
        if self.grain > 0:
            batch = self._add_grain(batch)
        return torch.from_numpy(np.ascontiguousarray(batch.transpose(0, 3, 1, 2)))

    def _add_grain(self, batch: np.ndarray) -> np.ndarray:
        """The class docstring's noise on about half of batch [B, c, c, 3] (a new array)."""
        on = self.rng.random(len(batch)) < 0.5
        sigma = self.rng.uniform(0.0, self.grain, len(batch)) * on
        noisy = batch + self.rng.standard_normal(batch.shape, dtype=np.float32) * sigma[:, None, None, None].astype(np.float32)
        return np.clip(np.rint(noisy), 0, 255).astype(np.uint8)


def center_crops(images: list[np.ndarray], crop: int, n: int) -> torch.Tensor:
    """Deterministic evaluation batch of n crops (fewer if the images hold fewer).

    With at least n images: the centre crop of each of the first n (a CIFAR-style set). With fewer
    (a folder of photographs): k = ceil(n / len) crops from each image on a regular grid
    (k = 1: the centre), the first n of them, so a dozen held-out photos still give n crops."""
    if not images:
        raise ValueError("no images to take evaluation crops from")
    small = sum(min(im.shape[:2]) < crop for im in images[:n])
    if small:
        raise ValueError(f"{small} evaluation image(s) smaller than the crop size {crop}")
    out = []
    k = max(1, -(-n // max(1, len(images))))
    g = math.ceil(math.sqrt(k))
    for im in images[:n]:
        h, w = im.shape[:2]
        if k == 1:
            pos = [((h - crop) // 2, (w - crop) // 2)]
        else:
            ys = np.linspace(0, h - crop, g).astype(int) if h > crop else np.zeros(g, int)
            xs = np.linspace(0, w - crop, g).astype(int) if w > crop else np.zeros(g, int)
            pos = [(int(y), int(x)) for y in ys for x in xs][:k]
        out.extend(im[y:y + crop, x:x + crop] for y, x in pos)
    return torch.from_numpy(np.ascontiguousarray(np.stack(out[:n]).transpose(0, 3, 1, 2)))
