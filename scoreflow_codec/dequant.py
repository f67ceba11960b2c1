"""Dequantization distributions q(u | x) on (0, 1)^D (Flow++ style variational dequantization).

`VariationalDequantizer` partitions the D = C*H*W dims of u into G groups (masks from
`group_masks`) and transforms each group exactly once, in a fixed order, from a uniform base:
    u_g = CDF_g^{-1}(eps_g),  eps_g ~ U(0, 1)^{n_g},
    CDF_g(u) = sum_k pi_k sigmoid((logit(u) - mu_k) / exp(log_s_k))      (elementwise),
with (pi, mu, log_s) computed by a CNN from x and the groups before g. So
    log q(u | x) = sum_g sum_i log CDF_g'(u_i),
and every dim has an exact 1-D CDF given x and the earlier groups, which is what the bits-back
coder (coding/dequant_codec.py) needs: it decodes group after group from CDF tables built
from `group_mixture`.

Ordering (the codec depends on it): `group_mixture(...)` returns tensors [N, K, n_g] whose
last axis runs over the True entries of `groups(shape)[g]` in row-major (C, H, W) order,
i.e. exactly the order of `u[:, mask]` for u [N, C, H, W] and mask [C, H, W].

All 1-D math (CDF, density, bisection) runs in float64; the networks run in their own dtype.
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .pixels import to_model

Tensor = torch.Tensor


@dataclass(frozen=True)
class DequantConfig:
    kind: str = "variational"  # "variational" | "uniform"
    in_channels: int = 3
    spatial: str = "checkerboard"  # "none" (1) | "checkerboard" (2) | "quad" (4: 2x2 phases)
    channel_groups: int = 2  # contiguous channel chunks (np.array_split); 1 <= . <= in_channels
    components: int = 8  # K, logistic mixture components
    hidden: int = 32
    blocks: int = 2  # residual blocks in the conditioning CNN and in each group's net
    dropout: float = 0.0
    # Bounds keep u away from where float32 cannot resolve it (logit(u) beyond ~16).
    mu_max: float = 8.0  # |mu| <= mu_max (smoothly, tanh)
    log_s_min: float = -7.0
    log_s_max: float = 0.0  # s <= 1: no component piles mass at 0 or 1

    def __post_init__(self) -> None:
        if self.kind not in ("variational", "uniform"):
            raise ValueError(f"dequantizer kind must be 'variational' or 'uniform', not {self.kind!r}")
        if self.spatial not in _SPATIAL:
            raise ValueError(f"spatial must be one of {sorted(_SPATIAL)}, not {self.spatial!r}")
        if not 1 <= self.channel_groups <= self.in_channels:
            raise ValueError(f"channel_groups must be in [1, {self.in_channels}], got {self.channel_groups}")

    @property
    def num_groups(self) -> int:
        return 1 if self.kind == "uniform" else _SPATIAL[self.spatial] * self.channel_groups

    @classmethod
    def default_for(cls, channels: int, **kw) -> "DequantConfig":
        """4 groups: checkerboard x 2 channel chunks (C >= 2) or the 4 phases of 2x2 (C = 1)."""
        if channels == 1:
            return cls(in_channels=1, spatial="quad", channel_groups=1, **kw)
        return cls(in_channels=channels, spatial="checkerboard", channel_groups=2, **kw)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DequantConfig":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


_SPATIAL = {"none": 1, "checkerboard": 2, "quad": 4}


def group_masks(shape: tuple[int, int, int], spatial: str, channel_groups: int) -> list[Tensor]:
    """Partition of [C, H, W] into bool masks: spatial part (outer) x channel chunk (inner).

    checkerboard: part p holds (i + j) % 2 == p; quad: part 2*(i % 2) + (j % 2).
    """
    c, h, w = shape
    i = torch.arange(h)[:, None]
    j = torch.arange(w)[None, :]
    phase = {"none": torch.zeros(h, w, dtype=torch.long), "checkerboard": (i + j) % 2,
             "quad": 2 * (i % 2) + (j % 2)}[spatial]
    masks = []
    for p in range(_SPATIAL[spatial]):
        for chunk in np.array_split(np.arange(c), channel_groups):
            m = torch.zeros(c, h, w, dtype=torch.bool)
            m[torch.as_tensor(chunk)] = (phase == p)
            masks.append(m)
    return masks


@dataclass(frozen=True)
class GroupLayout:
    """group_masks on one device, with what the networks and the flow take from them each call."""

    masks: tuple[Tensor, ...]  # bool [C, H, W], group g's dims
    known: tuple[Tensor, ...]  # bool [C, H, W], the dims of the groups before g
    index: tuple[Tensor, ...]  # long [n_g], group g's flat positions in C*H*W, row-major: u[:, mask]'s order


@functools.lru_cache(maxsize=32)
def group_layout(shape: tuple[int, int, int], spatial: str, channel_groups: int,
                 device: torch.device = torch.device("cpu")) -> GroupLayout:
    """group_masks(shape, ...) made once per shape and device (cached) with the known dims and the
    integer positions of each group. Integer positions instead of boolean masks: indexing a GPU tensor
    by a boolean mask counts its True entries first (aten::nonzero), which makes the CPU wait for the
    GPU; the masks were also rebuilt and copied to the device at every call, 16 such waits and about
    14 small host-to-device copies per training step. Gathering by the same positions in the same
    order gives the same values bit for bit."""
    masks = [m.to(device) for m in group_masks(shape, spatial, channel_groups)]
    known = [torch.zeros(shape, dtype=torch.bool, device=device)]
    for m in masks[:-1]:
        known.append(known[-1] | m)
    index = [m.flatten().nonzero().flatten() for m in masks]
    return GroupLayout(tuple(masks), tuple(known), tuple(index))


def gather_group(v: Tensor, index: Tensor) -> Tensor:
    """v [..., C, H, W] -> [..., n_g]: v[..., mask] by the group's positions (no device sync)."""
    return v.flatten(-3).index_select(-1, index)


def put_group(z: Tensor, index: Tensor, values: Tensor) -> Tensor:
    """z [N, C, H, W] with the group's dims replaced by values [N, n_g] (out of place; gradients reach
    both, as torch.where(mask, ...) would give them)."""
    return z.flatten(1).index_copy(1, index, values).view_as(z)


# --- 1-D logistic mixtures in logit space (float64) -------------------------------------------
def _mix_cdf_z(z: Tensor, logit_pi: Tensor, mu: Tensor, log_s: Tensor) -> Tensor:
    """z [N, n], params [N, K, n] -> CDF [N, n]."""
    w = torch.softmax(logit_pi, dim=1)
    return (w * torch.sigmoid((z[:, None] - mu) * torch.exp(-log_s))).sum(1)


def _mix_logpdf_z(z: Tensor, logit_pi: Tensor, mu: Tensor, log_s: Tensor) -> Tensor:
    a = (z[:, None] - mu) * torch.exp(-log_s)
    lp = -F.softplus(a) - F.softplus(-a) - log_s
    return torch.logsumexp(torch.log_softmax(logit_pi, dim=1) + lp, dim=1)


def _mix_icdf_z(p: Tensor, logit_pi: Tensor, mu: Tensor, log_s: Tensor, iters: int = 60) -> Tensor:
    """Bisection. The root lies between min_k and max_k of the components' own quantiles, a
    bracket at most 2 mu_max + |logit p| e^{log_s_max} wide: 60 halvings reach float64 rounding."""
    q = mu + torch.exp(log_s) * torch.logit(p)[:, None]
    lo, hi = q.min(1).values, q.max(1).values
    w, inv_s = torch.softmax(logit_pi, dim=1), torch.exp(-log_s)
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        below = (w * torch.sigmoid((mid[:, None] - mu) * inv_s)).sum(1) < p
        lo, hi = torch.where(below, mid, lo), torch.where(below, hi, mid)
    return 0.5 * (lo + hi)


def _log_dsigmoid(z: Tensor) -> Tensor:
    return F.logsigmoid(z) + F.logsigmoid(-z)


def mixture_cdf(u: Tensor, logit_pi: Tensor, mu: Tensor, log_s: Tensor) -> Tensor:
    """CDF(u) = sum_k pi_k sigmoid((logit(u) - mu_k) / e^{log_s_k}); u [N, n] in [0, 1], params [N, K, n]."""
    d = torch.float64
    return _mix_cdf_z(torch.logit(u.to(d)), logit_pi.to(d), mu.to(d), log_s.to(d))


def mixture_icdf(p: Tensor, logit_pi: Tensor, mu: Tensor, log_s: Tensor) -> Tensor:
    """Inverse of `mixture_cdf` (float64) for p in (0, 1)."""
    d = torch.float64
    return torch.sigmoid(_mix_icdf_z(p.to(d), logit_pi.to(d), mu.to(d), log_s.to(d)))


def mixture_log_pdf(u: Tensor, logit_pi: Tensor, mu: Tensor, log_s: Tensor) -> Tensor:
    """log dCDF/du (float64)."""
    d = torch.float64
    z = torch.logit(u.to(d))
    return _mix_logpdf_z(z, logit_pi.to(d), mu.to(d), log_s.to(d)) - _log_dsigmoid(z)


# --- dequantizers ---------------------------------------------------------------------------
class Dequantizer(nn.Module):
    config: DequantConfig

    @property
    def num_groups(self) -> int:
        return self.config.num_groups

    def groups(self, shape: tuple[int, int, int]) -> list[Tensor]:
        """Bool masks [C, H, W] partitioning the dims, in coding order."""
        raise NotImplementedError

    def sample(self, x_uint8: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def draw(self, x_uint8: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """The same distribution as `sample`, drawn however is cheapest (training's draws)."""
        return self.sample(x_uint8, generator)

    def log_prob(self, u: Tensor, x_uint8: Tensor) -> Tensor:
        raise NotImplementedError

    def group_mixture(self, x_uint8: Tensor, u_known: Tensor, g: int) -> tuple[Tensor, Tensor, Tensor]:
        raise NotImplementedError


class UniformDequantizer(Dequantizer):
    """u ~ U[0, 1), log q = 0; one group with CDF(u) = u (K = 1, mu = 0, log_s = 0)."""

    def __init__(self, config: DequantConfig | None = None):
        super().__init__()
        self.config = config or DequantConfig(kind="uniform", channel_groups=1)

    def groups(self, shape):
        return [torch.ones(tuple(shape), dtype=torch.bool)]

    def sample(self, x_uint8, generator=None):
        u = torch.rand(x_uint8.shape, generator=generator, device=x_uint8.device)
        return u, torch.zeros(x_uint8.shape[0], device=x_uint8.device)

    def log_prob(self, u, x_uint8):
        return torch.zeros(u.shape[0], dtype=u.dtype, device=u.device)

    def group_mixture(self, x_uint8, u_known, g):
        if g != 0:
            raise IndexError(f"group {g} out of range (1 group)")
        z = torch.zeros(x_uint8.shape[0], 1, x_uint8[0].numel(), device=x_uint8.device)
        return z, z.clone(), z.clone()


class _Res(nn.Module):
    def __init__(self, ch: int, dropout: float):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(ch, ch, 3, padding=1), nn.Conv2d(ch, ch, 3, padding=1)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.c2(self.drop(F.silu(self.c1(F.silu(x)))))


def _trunk(cin: int, cfg: DequantConfig) -> list[nn.Module]:
    return [nn.Conv2d(cin, cfg.hidden, 3, padding=1)] + [_Res(cfg.hidden, cfg.dropout) for _ in range(cfg.blocks)]


class VariationalDequantizer(Dequantizer):
    """Conditioning CNN on x + one logistic-mixture transform per group (see the module doc).

    The output convs start at zero, so a fresh dequantizer is exactly uniform (CDF(u) = u).
    """

    def __init__(self, config: DequantConfig | None = None):
        super().__init__()
        cfg = self.config = config or DequantConfig()
        if cfg.kind != "variational":
            raise ValueError("VariationalDequantizer needs config.kind == 'variational'")
        c, k = cfg.in_channels, cfg.components
        self.cond = nn.Sequential(*_trunk(c, cfg))
        # group net input: features, known u (centred, 0 elsewhere), known mask, target mask
        self.nets = nn.ModuleList()
        for _ in range(cfg.num_groups):
            out = nn.Conv2d(cfg.hidden, 3 * k * c, 3, padding=1)
            nn.init.zeros_(out.weight)
            nn.init.zeros_(out.bias)
            self.nets.append(nn.Sequential(*_trunk(cfg.hidden + 3 * c, cfg), nn.SiLU(), out))

    def groups(self, shape):
        return group_masks(tuple(shape), self.config.spatial, self.config.channel_groups)

    def layout(self, shape, device) -> GroupLayout:
        return group_layout(tuple(shape), self.config.spatial, self.config.channel_groups, torch.device(device))

    def _dtype(self) -> torch.dtype:
        return self.cond[0].weight.dtype

    def _u(self, z: Tensor) -> Tensor:
        """sigmoid(z) in the nets' dtype, kept inside (0, 1) where that dtype rounds to 0 or 1."""
        dt = self._dtype()
        f = torch.finfo(dt)
        return torch.sigmoid(z).to(dt).clamp(f.tiny, 1.0 - f.eps / 2)

    def _features(self, x_uint8: Tensor) -> Tensor:
        if x_uint8.dim() != 4 or x_uint8.shape[1] != self.config.in_channels:
            raise ValueError(f"expected x of shape [N, {self.config.in_channels}, H, W], got {tuple(x_uint8.shape)}")
        return self.cond(to_model(x_uint8).to(self._dtype()))

    def _params(self, feats: Tensor, u: Tensor, lay: GroupLayout, g: int) -> tuple[Tensor, Tensor, Tensor]:
        out = self.nets[g](group_input(feats, u, lay, g))
        return mixture_params(out, lay.index[g], self.config, torch.tanh)

    def group_mixture(self, x_uint8, u_known, g):
        """(logit_pi, mu, log_s), each [N, K, n_g] (order: see the module doc); depends on x and u in groups < g."""
        return self._params(self._features(x_uint8), u_known, self.layout(x_uint8.shape[1:], x_uint8.device), g)

    def transform(self, eps: Tensor, x_uint8: Tensor) -> tuple[Tensor, Tensor]:
        """The flow eps -> u (eps in (0, 1), float64) with log q(u | x) = -log|det du/deps|.

        Bisection without grad, then u* - (F(u*) - eps) / pdf(u*).detach() (in logit space) so
        that gradients reach the parameters and eps (implicit reparameterisation).
        """
        eps = eps.to(torch.float64)

        def invert(g, index, lp, mu, ls):  # the flow: eps_g through the inverse CDF (e keeps eps's gradient)
            e = gather_group(eps, index)
            with torch.no_grad():
                return _mix_icdf_z(e, lp, mu, ls), e

        return self._flow(x_uint8, invert)

    def _flow(self, x_uint8: Tensor, pick) -> tuple[Tensor, Tensor]:
        """Group after group: pick(g, index, logit_pi, mu, log_s) -> (z0, e), a point z0 = logit(u) of
        the group (no gradient) and e its CDF level; then z = z0 - (F(z0) - e) / pdf(z0).detach(), whose
        value is z0 (to the bisection's rounding) and whose gradient is the implicit
        reparameterisation's, -dF/dparams / pdf (Figurnov et al. 2018), whichever way z0 was drawn."""
        feats = self._features(x_uint8)
        d, dev = torch.float64, x_uint8.device
        lay = self.layout(x_uint8.shape[1:], dev)
        z = torch.zeros(x_uint8.shape, dtype=d, device=dev)
        log_q = torch.zeros(x_uint8.shape[0], dtype=d, device=dev)
        for g, index in enumerate(lay.index):
            lp, mu, ls = (v.to(d) for v in self._params(feats, self._u(z), lay, g))
            z0, e = pick(g, index, lp, mu, ls)
            pdf0 = torch.exp(_mix_logpdf_z(z0, lp, mu, ls)).detach()
            zg = z0 - (_mix_cdf_z(z0, lp, mu, ls) - e) / pdf0
            log_q = log_q + (_mix_logpdf_z(zg, lp, mu, ls) - _log_dsigmoid(zg)).sum(1)
            z = put_group(z, index, zg)
        return self._u(z), log_q.to(self._dtype())

    def sample(self, x_uint8, generator=None):
        eps = torch.rand(x_uint8.shape, generator=generator, dtype=torch.float64, device=x_uint8.device)
        return self.transform(eps.clamp(2.0**-53, 1.0 - 2.0**-53), x_uint8)

    def draw(self, x_uint8, generator=None):
        """(u, log q(u | x)) as `sample`'s, the same distribution, drawn without inverting the CDF: each
        dim's mixture component by the Gumbel-max trick, then a logistic draw from that component;
        gradients by implicit reparameterisation as `transform`'s. For training, whose GPU step is
        launch-bound: the dequantizer's tensor operations in forward and backward fall from 6,336 to
        2,466 (a training step's from about 10,200 to 6,600 for preset `cpu`; torch.profiler, batch
        2), its time on one CPU core at batch 64 from 2.0 s to 1.3 s. The estimators keep `sample`
        (the flow of seeded uniform draws, whose numbers the docs record)."""
        lo, hi = 2.0**-53, 1.0 - 2.0**-53

        @torch.no_grad()
        def component(g, index, lp, mu, ls):
            shape = lp.shape  # [N, K, n]
            gumbel = -torch.log(-torch.log(torch.rand(shape, generator=generator, dtype=lp.dtype,
                                                      device=lp.device).clamp(lo, hi)))
            k = torch.argmax(lp + gumbel, dim=1, keepdim=True)
            v = torch.rand(shape[:1] + shape[2:], generator=generator, dtype=lp.dtype, device=lp.device).clamp(lo, hi)
            z0 = mu.gather(1, k).squeeze(1) + torch.exp(ls.gather(1, k).squeeze(1)) * torch.logit(v)
            return z0, _mix_cdf_z(z0, lp, mu, ls)

        return self._flow(x_uint8, component)

    def log_prob(self, u, x_uint8):
        feats = self._features(x_uint8)
        lay = self.layout(x_uint8.shape[1:], u.device)
        z = torch.logit(u.to(torch.float64))
        out = torch.zeros(u.shape[0], dtype=torch.float64, device=u.device)
        for g, index in enumerate(lay.index):
            lp, mu, ls = (v.to(torch.float64) for v in self._params(feats, u, lay, g))
            zg = gather_group(z, index)
            out = out + (_mix_logpdf_z(zg, lp, mu, ls) - _log_dsigmoid(zg)).sum(1)
        return out.to(self._dtype())


def group_input(feats: Tensor, u: Tensor, lay: GroupLayout, g: int) -> Tensor:
    """Group g's network input: the features, the known u (centred; 0 elsewhere), the known mask and
    the target mask, in the features' dtype."""
    n, dt = u.shape[0], feats.dtype
    known, target = lay.known[g], lay.masks[g]
    uk = torch.where(known, 2.0 * u.to(dt) - 1.0, torch.zeros((), dtype=dt, device=feats.device))
    return torch.cat([feats, uk, known.to(dt).expand(n, -1, -1, -1), target.to(dt).expand(n, -1, -1, -1)], 1)


def mixture_params(out: Tensor, index: Tensor, cfg: DequantConfig, tanh) -> tuple[Tensor, Tensor, Tensor]:
    """A group network's output [N, 3 K C, H, W] -> (logit_pi, mu, log_s), each [N, K, n_g], at the
    group's positions; mu bounded by cfg.mu_max with `tanh` (torch's, or exactmath's), log_s clamped."""
    n, k = out.shape[0], cfg.components
    out = gather_group(out.reshape(n, 3, k, -1, *out.shape[-2:]), index)
    mu = cfg.mu_max * tanh(out[:, 1] / cfg.mu_max)
    return out[:, 0], mu, out[:, 2].clamp(cfg.log_s_min, cfg.log_s_max)


def make_dequantizer(config: DequantConfig | dict) -> Dequantizer:
    if isinstance(config, dict):
        config = DequantConfig.from_dict(config)
    return UniformDequantizer(config) if config.kind == "uniform" else VariationalDequantizer(config)

