"""DDPM++-family U-Net (Song et al. 2021, `ncsnpp.py` with progressive = "none").

The net is a plain function of (x, noise_cond): it knows nothing about the SDE. The
preconditioner (`precond.py`) decides what it sees. Fully convolutional: any H, W divisible
by 2^(levels-1).

Attention placement is given in resolutions of the training image size (`image_size`),
turned into level indices, so a 64x64 tile gets attention at the same depth as the 32x32
training images: the net is the same function on any tile size.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

Tensor = torch.Tensor


@dataclass(frozen=True)
class UNetConfig:
    in_channels: int = 3
    out_channels: int | None = None  # None: same as in_channels
    channels: int = 128
    channel_mult: tuple[int, ...] = (1, 2, 2, 2)
    num_res_blocks: int = 4
    attn_resolutions: tuple[int, ...] = (16,)  # in pixels of `image_size` images
    image_size: int = 32
    mid_attn: bool = True
    dropout: float = 0.0
    embedding: str = "fourier"  # "fourier" | "positional"
    # fourier: std of the fixed random frequencies; positional: multiplier of noise_cond.
    embedding_scale: float = 16.0
    scale_shift: bool = False  # FiLM (scale, shift) after the 2nd GroupNorm, else additive bias
    resblock_updown: bool = True  # BigGAN-style resblock up/down, else (nearest|stride-2) conv
    skip_rescale: bool = True
    norm_groups: int = 32  # GroupNorm groups = min(channels // 4, norm_groups)
    zero_init_out: bool = True

    def __post_init__(self) -> None:
        if self.embedding not in ("fourier", "positional"):
            raise ValueError(f"embedding must be 'fourier' or 'positional', not {self.embedding!r}")
        if self.channels % 4 or any(self.channels * m % 4 for m in self.channel_mult):
            raise ValueError("channel counts must be multiples of 4 (GroupNorm)")

    @property
    def levels(self) -> int:
        return len(self.channel_mult)

    @property
    def attn_levels(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.levels) if self.image_size // 2**i in self.attn_resolutions)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "UNetConfig":
        kw = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        for k in ("channel_mult", "attn_resolutions"):
            if k in kw:
                kw[k] = tuple(kw[k])
        return cls(**kw)


def _norm(ch: int, groups: int) -> nn.GroupNorm:
    g = min(ch // 4, groups)
    while ch % g:  # the largest count <= min(ch / 4, groups) that divides ch
        g -= 1
    return nn.GroupNorm(g, ch, eps=1e-6)


def _zero(m: nn.Module) -> nn.Module:
    for p in m.parameters():
        nn.init.zeros_(p)
    return m


class NoiseEmbedding(nn.Module):
    """noise_cond [N] -> [N, ch] (sin/cos features)."""

    def __init__(self, ch: int, kind: str, scale: float):
        super().__init__()
        self.kind, self.scale = kind, float(scale)
        half = ch // 2
        if kind == "fourier":
            g = torch.Generator().manual_seed(0)  # the frequencies are saved with the weights anyway
            self.register_buffer("W", torch.randn(half, generator=g) * self.scale)
        else:
            f = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / max(half - 1, 1))
            self.register_buffer("W", f, persistent=False)

    def forward(self, c: Tensor) -> Tensor:
        if self.kind == "fourier":
            a = c[:, None] * self.W[None] * (2 * math.pi)
        else:
            a = (c * self.scale)[:, None] * self.W[None]
        return torch.cat([torch.sin(a), torch.cos(a)], dim=1)


def _resample(x: Tensor, mode: str | None) -> Tensor:
    if mode == "up":
        return F.interpolate(x, scale_factor=2.0, mode="nearest")
    if mode == "down":
        return F.avg_pool2d(x, 2)
    return x


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, emb: int, cfg: UNetConfig, resample: str | None = None):
        super().__init__()
        self.resample, self.scale_shift, self.skip_rescale = resample, cfg.scale_shift, cfg.skip_rescale
        self.norm1 = _norm(cin, cfg.norm_groups)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.emb = nn.Linear(emb, cout * (2 if cfg.scale_shift else 1))
        self.norm2 = _norm(cout, cfg.norm_groups)
        self.drop = nn.Dropout(cfg.dropout)
        self.conv2 = _zero(nn.Conv2d(cout, cout, 3, padding=1))
        # DDPM++ (BigGAN blocks) also gives resampling blocks a 1x1 skip conv.
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout or resample else None

    def forward(self, x: Tensor, temb: Tensor) -> Tensor:
        h = F.silu(self.norm1(x))
        h, x = _resample(h, self.resample), _resample(x, self.resample)
        h = self.conv1(h)
        e = self.emb(F.silu(temb))[:, :, None, None]
        if self.scale_shift:
            scale, shift = e.chunk(2, dim=1)
            h = self.norm2(h) * (1 + scale) + shift
        else:
            h = self.norm2(h + e)
        h = self.conv2(self.drop(F.silu(h)))
        if self.skip is not None:
            x = self.skip(x)
        return (x + h) / math.sqrt(2.0) if self.skip_rescale else x + h


class AttnBlock(nn.Module):
    """Single-head self-attention over positions (DDPM)."""

    def __init__(self, ch: int, cfg: UNetConfig):
        super().__init__()
        self.skip_rescale = cfg.skip_rescale
        self.norm = _norm(ch, cfg.norm_groups)
        self.qkv = nn.Conv2d(ch, 3 * ch, 1)
        self.out = _zero(nn.Conv2d(ch, ch, 1))

    def forward(self, x: Tensor, temb: Tensor | None = None) -> Tensor:
        n, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(n, 3, c, h * w).unbind(1)
        a = torch.softmax(torch.einsum("ncq,nck->nqk", q, k) * c**-0.5, dim=-1)
        y = self.out(torch.einsum("nqk,nck->ncq", a, v).reshape(n, c, h, w))
        return (x + y) / math.sqrt(2.0) if self.skip_rescale else x + y


class Down(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, stride=2, padding=1)

    def forward(self, x: Tensor, temb: Tensor | None = None) -> Tensor:
        return self.conv(x)


class Up(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x: Tensor, temb: Tensor | None = None) -> Tensor:
        return self.conv(_resample(x, "up"))


class UNet(nn.Module):
    """forward(x [N, C, H, W], noise_cond [N]) -> [N, C_out, H, W]."""

    def __init__(self, cfg: UNetConfig):
        super().__init__()
        self.config = cfg
        ch, emb = cfg.channels, 4 * cfg.channels
        self.embed = NoiseEmbedding(ch, cfg.embedding, cfg.embedding_scale)
        self.temb = nn.Sequential(nn.Linear(ch, emb), nn.SiLU(), nn.Linear(emb, emb))
        self.conv_in = nn.Conv2d(cfg.in_channels, ch, 3, padding=1)
        attn = set(cfg.attn_levels)

        self.down = nn.ModuleList()
        hs, cur = [ch], ch
        for i, m in enumerate(cfg.channel_mult):
            for _ in range(cfg.num_res_blocks):
                blocks = [ResBlock(cur, ch * m, emb, cfg)]
                cur = ch * m
                if i in attn:
                    blocks.append(AttnBlock(cur, cfg))
                self.down.append(nn.ModuleList(blocks))
                hs.append(cur)
            if i != cfg.levels - 1:
                d = ResBlock(cur, cur, emb, cfg, "down") if cfg.resblock_updown else Down(cur)
                self.down.append(nn.ModuleList([d]))
                hs.append(cur)

        mid = [ResBlock(cur, cur, emb, cfg)]
        if cfg.mid_attn:
            mid.append(AttnBlock(cur, cfg))
        mid.append(ResBlock(cur, cur, emb, cfg))
        self.mid = nn.ModuleList(mid)

        self.up = nn.ModuleList()
        for i in reversed(range(cfg.levels)):
            blocks = []
            for _ in range(cfg.num_res_blocks + 1):
                blocks.append(ResBlock(cur + hs.pop(), ch * cfg.channel_mult[i], emb, cfg))
                cur = ch * cfg.channel_mult[i]
            self.up.append(nn.ModuleList(blocks))
            tail = []
            if i in attn:
                tail.append(AttnBlock(cur, cfg))
            if i != 0:
                tail.append(ResBlock(cur, cur, emb, cfg, "up") if cfg.resblock_updown else Up(cur))
            self.up.append(nn.ModuleList(tail))
        assert not hs

        self.norm_out = _norm(cur, cfg.norm_groups)
        self.conv_out = nn.Conv2d(cur, cfg.out_channels or cfg.in_channels, 3, padding=1)
        if cfg.zero_init_out:
            _zero(self.conv_out)

    def forward(self, x: Tensor, noise_cond: Tensor, features: Tensor | None = None) -> Tensor:
        """`features` [N, channels, H, W], where given, are added to conv_in's output (models/context.py)."""
        cfg = self.config
        k = 2 ** (cfg.levels - 1)
        if x.shape[-1] % k or x.shape[-2] % k:
            raise ValueError(f"H and W must be multiples of {k}; got {tuple(x.shape[-2:])}")
        temb = self.temb(self.embed(noise_cond.to(x.dtype)))
        h = self.conv_in(x)
        h = traverse(h if features is None else h + features, temb, self.down, self.mid, self.up)
        return self.conv_out(F.silu(self.norm_out(h)))


def traverse(h, temb, down, mid, up):
    """The U-Net's path from conv_in's output to norm_out's input, with the skip connections:
    blocks are callables b(h, temb) (this module's, or models/exact.py's)."""
    hs = [h]
    for blocks in down:
        for b in blocks:
            h = b(h, temb)
        hs.append(h)
    for b in mid:
        h = b(h, temb)
    for j, blocks in enumerate(up):
        for b in blocks:
            # even entries are the resblock stacks that take skips; odd ones the attn/upsample tail
            h = b(torch.cat([h, hs.pop()], dim=1), temb) if j % 2 == 0 else b(h, temb)
    assert not hs
    return h


def count_parameters(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())
