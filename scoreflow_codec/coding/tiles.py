"""Tiles: any image size and channel count through a model that sees P x P x 3 tiles (DESIGN 2d).

An image's colour planes are cut into P x P tiles in row-major order. A tile's pixels that the
image does not have (padding past the right/bottom edge, the two extra channels of a gray image)
are latent: the encoder pops them from a narrow proposal around a fill value (edge replication,
or the gray value) and codes the full tile; the decoder gets the full tile back and pushes the
latent pixels back. The net cost is -log p(x_known, x_fill) + log q(x_fill | x_known): a bits-back
bound on the marginal of the known pixels, so padding costs only what the model can't predict.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


from . import distributions as dist
from .ans import Message

FILL_WINDOW = 8  # latent pixels are popped from {c - 8 .. c + 8} (clipped into 0..255)
MODEL_CHANNELS = 3
GRAY_KNOWN_CHANNEL = 1  # a gray image's values sit in G; R and B are latent copies


@dataclass(frozen=True)
class TileRef:
    image: int
    y0: int
    x0: int
    h: int
    w: int


def tile_grid(height: int, width: int, size: int) -> list[tuple[int, int, int, int]]:
    """(y0, x0, h, w) of each tile, row-major; edge tiles are smaller."""
    return [(y, x, min(size, height - y), min(size, width - x))
            for y in range(0, height, size) for x in range(0, width, size)]


def plan_tiles(shapes: list[tuple[int, int, int]], size: int) -> list[TileRef]:
    """All tiles of all images (shapes: (C, H, W) of each image's colour planes; C may be 0)."""
    out = []
    for i, (c, h, w) in enumerate(shapes):
        if c == 0:
            continue
        out += [TileRef(i, *g) for g in tile_grid(h, w, size)]
    return out


def known_block(planes: np.ndarray, t: TileRef) -> np.ndarray:
    """The tile's known pixels [C, h, w] from an image's planes [C, H, W]."""
    return planes[:, t.y0:t.y0 + t.h, t.x0:t.x0 + t.w]


def layout(known: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tile with known pixels in place [3, P, P] int64, known mask, fill centres) for one tile."""
    c, h, w = known.shape
    padded = np.pad(known, ((0, 0), (0, size - h), (0, size - w)), mode="edge").astype(np.int64)
    mask = np.zeros((MODEL_CHANNELS, size, size), dtype=bool)
    if c == MODEL_CHANNELS:
        tile = padded
        mask[:, :h, :w] = True
    elif c == 1:
        tile = np.repeat(padded, MODEL_CHANNELS, axis=0)
        mask[GRAY_KNOWN_CHANNEL, :h, :w] = True
    else:
        raise ValueError(f"tiles take 1 or 3 colour channels, got {c}")
    return tile, mask, tile.copy()


class FillCodec:
    """Pops / pushes the latent pixels of a batch of tiles (a window categorical per pixel)."""

    def __init__(self, std: float):
        self.std = float(std)

    def _table(self, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        start = np.clip(centres - FILL_WINDOW, 0, 255 - 2 * FILL_WINDOW)
        # probabilities of start + j, j = 0..2W, for a Gaussian centred on the centre
        offs = start[:, None] + np.arange(2 * FILL_WINDOW + 1)[None, :] - centres[:, None]
        from .. import exactmath as em  # torch: only model tiles have latent pixels

        table = em.np_fn(em.exp)(-0.5 * (offs / self.std) ** 2)  # the same bits on every machine
        return start, table

    def pop(self, m: Message, tiles: np.ndarray, masks: np.ndarray, centres: np.ndarray) -> np.ndarray:
        full = tiles.copy()
        lat = ~masks
        if lat.any():
            start, table = self._table(centres[lat])
            full[lat] = start + dist.categorical(table).pop(m)
        return full

    def push(self, m: Message, full: np.ndarray, masks: np.ndarray, centres: np.ndarray) -> None:
        lat = ~masks
        if lat.any():
            start, table = self._table(centres[lat])
            dist.categorical(table).push(m, full[lat] - start)

    def bits(self, full: np.ndarray, masks: np.ndarray, centres: np.ndarray) -> float:
        lat = ~masks
        if not lat.any():
            return 0.0
        start, table = self._table(centres[lat])
        return float(dist.categorical_bits(full[lat] - start, table).sum())


def batch_schedule(n_tiles: int, n_seed: int, growth: float, max_batch: int) -> list[tuple[int, int]]:
    """[start, end) of the bits-back batches after the seed tiles.

    A batch pops about D * deficit bits before it pushes any back; those must already be on the
    stack, so batch sizes grow with the number of tiles coded so far (growth ~ rate / deficit).
    """
    out = []
    s = n_seed
    while s < n_tiles:
        b = int(min(max_batch, max(1, np.floor(growth * s))))
        e = min(n_tiles, s + b)
        out.append((s, e))
        s = e
    return out
