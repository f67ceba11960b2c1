"""Tile models that also see the pixels above and to the left of the tile (research; not in the codec).

The codec's models code every tile alone: its tiles "know nothing of each other", and on Kodak
that is where the photo model loses to the seed codec (docs/RESULTS.md, `bench/tile_gap.py`: the
seed codec gains 0.228 bits/dim from coding whole images instead of 64px tiles). Tiles coded in
raster order could give the model what the decoder already has: the `margin` rows above the tile
and the `margin` columns to its left, in a (T + m) x (T + m) window whose bottom-right T x T is
the tile. Two ways, each measured by `bench/context_gain.py` (docs/RESULTS.md has the numbers):

`WindowContext` (no new weights): the tile model itself runs on the window, its known part the
neighbours as the model saw images in training: dequantized (one seeded draw of the model's own
dequantizer, y = x + u: bin centres read worse than no context at all) and noised to x_t's level,
alpha_t y + sigma_t z', with z' drawn once per tile so that the model stays a function of (x, t)
(the bound holds for any such function; the coders need one). Every tile needs both neighbours
(an image's first row and column of tiles would be coded alone).

`ContextScoreModel` (trained): the U-Net runs on the tile as before; a small encoder reads the
window in C + 1 channels:

    channels 0 .. C-1:  the known pixels in model space (bin centres, k + 1/2), 0 elsewhere
                        (the tile itself is never known: it is what is being coded)
    channel C:          1 where a known pixel is, else 0

and its output's tile part, weighted per channel by 1 + gate(the net's embedding of the noise
level), is added to the U-Net's first features (`UNet.forward(features=)`). The known part is an
L: the top band (rows < m, columns >= m) when the tile has a row of tiles above it, the left band
(rows >= m, columns < m) when it has one to its left, and their m x m corner when it has both. The
encoder is four 3x3 convolutions dilated 1, 2, 4, 8 (the tile's edge sees 15 px up and left; its
inside learns of them through the U-Net) and a last 1x1 convolution; that and the gate start at
zero, so that before training the model is exactly the tile model it was made from
(`from_tile_model`). The encoder does not depend on t: `bind` runs it once per batch of tiles.

Both `bind` to a batch of windows and give an object called as a ScoreModel is, model(x, t) on
[N, C, T, T], so the SDE, the preconditioning, dsm_loss, the bound and the ODE are the tile
model's code.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import pixels
from .precond import ScoreModel

Tensor = torch.Tensor

DILATIONS = (1, 2, 4, 8)


def known_mask(n: int, tile: int, margin: int, top: Tensor, left: Tensor) -> Tensor:
    """[N, 1, T + m, T + m] float: 1 where the window's pixel is known (see the module docstring).
    top, left: [N] bool, whether the tile has tiles above it / to its left."""
    w = tile + margin
    rows = torch.arange(w)[:, None] < margin
    cols = torch.arange(w)[None, :] < margin
    top = top.bool().view(n, 1, 1).cpu()
    left = left.bool().view(n, 1, 1).cpu()
    known = (rows & ~cols) & top | (~rows & cols) & left | (rows & cols) & top & left
    return known.unsqueeze(1).float()


def window_tile(shape, margin: int) -> int:
    """The tile size T of a [N, C, T + m, T + m] window; ValueError for any other shape."""
    h, w = shape[-2:]
    if h != w or h <= margin:
        raise ValueError(f"a context window is square and larger than the margin {margin}, not {h}x{w}")
    return h - margin


class ContextEncoder(nn.Module):
    """[N, C + 1, T + m, T + m] context channels -> [N, features, T, T] (the module docstring)."""

    def __init__(self, channels: int, features: int, margin: int, hidden: int | None = None):
        super().__init__()
        hidden = hidden or features
        self.margin = int(margin)
        convs, cin = [], channels + 1
        for d in DILATIONS:
            convs.append(nn.Conv2d(cin, hidden, 3, padding=d, dilation=d))
            cin = hidden
        self.convs = nn.ModuleList(convs)
        self.out = nn.Conv2d(hidden, features, 1)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, context: Tensor) -> Tensor:
        h = context
        for c in self.convs:
            h = F.silu(c(h))
        return self.out(h[:, :, self.margin:, self.margin:])


class ContextScoreModel(ScoreModel):
    """eps_hat of a tile given its known neighbourhood: forward(x, t, context) with x [N, C, T, T] and
    context [N, C + 1, T + m, T + m] from `context`; `bind(context)` fixes the context (running the
    encoder once) for the likelihood code, which calls model(x, t)."""

    def __init__(self, net: nn.Module, sde, config=None, margin: int = 16, hidden: int | None = None):
        super().__init__(net, sde, config)
        cfg = net.config
        self.margin = int(margin)
        self.channels = cfg.out_channels or cfg.in_channels
        self.encoder = ContextEncoder(self.channels, cfg.channels, margin, hidden)
        # the features' weight per channel as a function of the noise level (the context matters most
        # where x_t says least): 1 + gate(embedding of c_noise), the gate starting at zero
        self.gate = nn.Linear(cfg.channels, cfg.channels)
        nn.init.zeros_(self.gate.weight)
        nn.init.zeros_(self.gate.bias)

    @classmethod
    def from_tile_model(cls, model: ScoreModel, margin: int = 16, hidden: int | None = None) -> "ContextScoreModel":
        """The tile model's net (its own weights: a copy) with a fresh encoder whose output starts at
        zero: before training, exactly the tile model."""
        import copy

        m = cls(copy.deepcopy(model.net), model.sde, model.precond, margin, hidden)
        return m.to(next(model.net.parameters()).device)

    def context(self, window_uint8: Tensor, top: Tensor, left: Tensor) -> Tensor:
        """The encoder's input [N, C + 1, T + m, T + m] from the uint8 window [N, C, T + m, T + m] (its
        tile part is ignored) and which neighbours are known ([N] bool each)."""
        tile = window_tile(window_uint8.shape, self.margin)
        known = known_mask(len(window_uint8), tile, self.margin, top, left).to(window_uint8.device)
        values = pixels.to_model(window_uint8, torch.full(window_uint8.shape, 0.5, device=window_uint8.device))
        return torch.cat([values * known, known], dim=1)

    def forward(self, x: Tensor, t: Tensor, context: Tensor | None = None, features: Tensor | None = None) -> Tensor:
        if features is None:
            if context is None:
                raise ValueError("a context model needs the tile's context: model.bind(context)(x, t)")
            n, c, h, w = x.shape
            m = self.margin
            if context.shape != (n, c + 1, h + m, w + m):
                raise ValueError(f"context {tuple(context.shape)} does not fit tiles {tuple(x.shape)} "
                                 f"with margin {m}")
            features = self.encoder(context.to(x.dtype))
        if t.dim() == 0:
            t = t.expand(x.shape[0])
        c_noise = self.coefficients(t)["c_noise"].to(x.dtype)
        weight = 1 + self.gate(self.net.embed(c_noise))
        return super().forward(x, t, features * weight[:, :, None, None])

    def bind(self, context: Tensor) -> "BoundContext":
        return BoundContext(self, context)


class BoundContext:
    """A ContextScoreModel with its context fixed (the encoder run once): called as a ScoreModel is
    (model(x, t), .sde, .score), on the batch the context was made for."""

    def __init__(self, model: ContextScoreModel, context: Tensor):
        self.model, self.sde, self.precond = model, model.sde, model.precond
        self.features = model.encoder(context)

    def __call__(self, x: Tensor, t: Tensor) -> Tensor:
        if x.shape[0] != self.features.shape[0]:
            raise ValueError(f"bound to {self.features.shape[0]} tiles, called on {x.shape[0]}")
        return self.model(x, t, features=self.features.to(x.dtype))

    score = ScoreModel.score  # -self(x, t) / sigma_t


class WindowContext:
    """The tile model on the window, its known part dequantized and noised to x_t's level (the module
    docstring); called as a ScoreModel is, on the window batch's tiles. `window_uint8` [N, C, T + m,
    T + m] (its tile part is not read); `generator` draws the context's u and z' once, here."""

    def __init__(self, model: ScoreModel, dequantizer, window_uint8: Tensor, margin: int,
                 generator: torch.Generator | None = None):
        window_tile(window_uint8.shape, margin)
        self.model, self.sde, self.precond, self.margin = model, model.sde, model.precond, int(margin)
        with torch.no_grad():
            u, _ = dequantizer.sample(window_uint8, generator=generator)
        self.y = pixels.to_model(window_uint8, u).float()
        self.z = torch.randn(self.y.shape, generator=generator, dtype=self.y.dtype, device=self.y.device)

    def __call__(self, x: Tensor, t: Tensor) -> Tensor:
        m = self.margin
        if x.shape[0] != self.y.shape[0] or x.shape[-1] + m != self.y.shape[-1]:
            raise ValueError(f"windows {tuple(self.y.shape)} with margin {m}, called on tiles {tuple(x.shape)}")
        if t.dim() == 0:
            t = t.expand(x.shape[0])
        mean, std = self.sde.marginal_prob(self.y.to(x.dtype), t)
        win = mean + std.view(-1, 1, 1, 1) * self.z.to(x.dtype)
        win[:, :, m:, m:] = x
        return self.model(win, t)[:, :, m:, m:]

    score = ScoreModel.score  # -self(x, t) / sigma_t
