"""The networks' forward passes in exactmath's arithmetic: the same bits on every machine.

`ExactScoreModel(model)` computes what `ScoreModel.forward` computes (preconditioning + U-Net),
`ExactDequantizer(dq)` what `VariationalDequantizer.group_mixture` computes, both in float64,
from the same weights, with every operation reproducible bit for bit (see exactmath): integer
convolutions and matrix products, GroupNorm and softmax with fixed-order sums, and SiLU read from
an exactly computed table. They differ from the float32 forwards by about 1e-6 relative (the
float32 forwards differ that much among themselves from one machine to the next), which costs
nothing measurable in bits.

Only what coding needs: no gradients, eval mode (dropout off).
"""
from __future__ import annotations

import math

import torch

from .. import exactmath as em
from ..dequant import VariationalDequantizer, _Res, group_input, mixture_params
from ..pixels import to_model
from .precond import ScoreModel
from .unet import AttnBlock, Down, ResBlock, UNet, Up, traverse

Tensor = torch.Tensor
F64 = torch.float64

# SiLU(x) = x sigmoid(x) with sigmoid read from a table on [-SIG_RANGE, SIG_RANGE] in steps of
# 2^-SIG_STEP_BITS, linearly interpolated (error < 2e-8; exactmath.sigmoid costs 40 operations
# per element, the table 12, and SiLU runs on every activation of the U-Net).
SIG_RANGE = 32.0
SIG_STEP_BITS = 10
SILU_CHUNK = 1 << 16  # elements per chunk: 3 x 512 KB of float64 scratch


class _SiluTable:
    """x sigmoid(x): sigmoid at the grid points (exactmath) and the slope to the next."""

    def __init__(self):
        n = int(2 * SIG_RANGE) << SIG_STEP_BITS
        x = torch.arange(n + 2, dtype=F64) * 2.0 ** -SIG_STEP_BITS - SIG_RANGE
        v = em.sigmoid(x)
        # entry n (x = +SIG_RANGE exactly) gets a zero slope: no clamp of the index is needed
        self.value = v[:-1].contiguous()
        self.slope = torch.cat([v[1:-1] - v[:-2], torch.zeros(1, dtype=F64)])
        self.offset = torch.tensor(SIG_RANGE * 2 ** SIG_STEP_BITS, dtype=F64)  # the table's index of x = 0
        self.top = float(n)

    def __call__(self, x: Tensor) -> Tensor:
        # in chunks that stay in the cache through the ten passes below (each pass over a whole
        # activation tensor went to memory); elementwise, so the chunking cannot change a bit
        x = x.to(F64).contiguous()
        out = torch.empty_like(x)
        xf, of = x.view(-1), out.view(-1)
        n = xf.numel()
        m = max(min(n, SILU_CHUNK), 1)
        u, v = torch.empty(m, dtype=F64), torch.empty(m, dtype=F64)
        k = torch.empty(m, dtype=torch.int32)  # < 2^17; x86 converts float64 to int32 in vectors, to int64 one by one
        for j in range(0, n, m):
            e = min(j + m, n)
            xs, ys, uj, vj, kj = xf[j:e], of[j:e], u[:e - j], v[:e - j], k[:e - j]
            # u = clamp(x, -R, R) 2^B + R 2^B, as x 2^B + R 2^B clamped to [0, 2R 2^B]: x 2^B is exact,
            # so the add rounds once, fused or not, the same within the range; beyond it both clamp
            torch.add(self.offset, xs, alpha=float(2 ** SIG_STEP_BITS), out=uj).clamp_(0.0, self.top)
            uj.nan_to_num_(0.0)  # a NaN index is undefined (x86 and ARM differ); y stays NaN below
            kj.copy_(uj)  # u >= 0: truncation is floor
            f = uj.frac_()  # u - floor(u), exact
            torch.index_select(self.slope, 0, kj, out=ys).mul_(f)
            ys.add_(torch.index_select(self.value, 0, kj, out=vj)).mul_(xs)
        return out


_SILU: _SiluTable | None = None


def silu(x: Tensor) -> Tensor:
    global _SILU
    if _SILU is None:
        _SILU = _SiluTable()
    return _SILU(x)


class _GroupNorm:
    def __init__(self, m: torch.nn.GroupNorm):
        self.groups, self.eps = m.num_groups, float(m.eps)
        self.weight = m.weight.detach().to("cpu", F64)
        self.bias = m.bias.detach().to("cpu", F64).view(1, -1, 1)

    def __call__(self, x: Tensor) -> Tensor:
        n, c, h, w = x.shape
        g = x.reshape(n, self.groups, -1)
        m = g.shape[-1]
        mean = em.tree_sum(g) / m
        d = (g - mean[..., None]).reshape(n, c, h * w)
        var = em.tree_sum_((d * d).reshape(n, self.groups, -1)) / m
        inv = 1.0 / torch.sqrt(var + self.eps)                                  # [n, groups]
        scale = inv.repeat_interleave(c // self.groups, dim=1) * self.weight    # [n, c]
        return d.mul_(scale[..., None]).add_(self.bias).reshape(n, c, h, w)


def _avg_pool2(x: Tensor) -> Tensor:
    return ((x[:, :, 0::2, 0::2] + x[:, :, 0::2, 1::2]) + (x[:, :, 1::2, 0::2] + x[:, :, 1::2, 1::2])) * 0.25


def _resample(x: Tensor, mode: str | None) -> Tensor:
    if mode == "up":  # nearest: each value copied to a 2x2 block (F.interpolate is 2.5 - 6x slower in float64)
        n, c, h, w = x.shape
        return x[:, :, :, None, :, None].expand(n, c, h, 2, w, 2).reshape(n, c, 2 * h, 2 * w)
    if mode == "down":
        return _avg_pool2(x)
    return x


_INV_SQRT2 = 1.0 / math.sqrt(2.0)


def _residual(h: Tensor, x: Tensor, rescale: bool) -> Tensor:
    """x + h, times 1/sqrt(2) where the block rescales, in h's (a fresh tensor's) memory: IEEE
    addition commutes, so h + x is x + h bit for bit."""
    h.add_(x)
    return h.mul_(_INV_SQRT2) if rescale else h


class _ResBlock:
    def __init__(self, b: ResBlock):
        self.resample, self.scale_shift, self.skip_rescale = b.resample, b.scale_shift, b.skip_rescale
        self.norm1, self.norm2 = _GroupNorm(b.norm1), _GroupNorm(b.norm2)
        self.conv1, self.conv2, self.emb = em.ExactConv.of(b.conv1), em.ExactConv.of(b.conv2), em.ExactConv.of(b.emb)
        self.skip = em.ExactConv.of(b.skip) if b.skip is not None else None

    def __call__(self, x: Tensor, temb_act: Tensor) -> Tensor:
        h = silu(self.norm1(x))
        h, x = _resample(h, self.resample), _resample(x, self.resample)
        h = self.conv1(h)
        e = self.emb(temb_act)[:, :, None, None]
        if self.scale_shift:
            scale, shift = e.chunk(2, dim=1)
            h = self.norm2(h).mul_(1.0 + scale).add_(shift)
        else:
            h = self.norm2(h.add_(e))
        h = self.conv2(silu(h))
        if self.skip is not None:
            x = self.skip(x)
        return _residual(h, x, self.skip_rescale)


class _AttnBlock:
    def __init__(self, b: AttnBlock):
        self.skip_rescale = b.skip_rescale
        self.norm, self.qkv, self.out = _GroupNorm(b.norm), em.ExactConv.of(b.qkv), em.ExactConv.of(b.out)

    def __call__(self, x: Tensor, temb_act: Tensor | None = None) -> Tensor:
        n, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(n, 3, c, h * w).unbind(1)
        y = em.attention(q, k, v, 1.0 / math.sqrt(c))  # [n, q, c]
        return _residual(self.out(y.transpose(1, 2).reshape(n, c, h, w)), x, self.skip_rescale)


class _Down:
    def __init__(self, b: Down):
        self.conv = em.ExactConv.of(b.conv)

    def __call__(self, x: Tensor, temb_act: Tensor | None = None) -> Tensor:
        return self.conv(x)


class _Up:
    def __init__(self, b: Up):
        self.conv = em.ExactConv.of(b.conv)

    def __call__(self, x: Tensor, temb_act: Tensor | None = None) -> Tensor:
        return self.conv(_resample(x, "up"))


def _block(b: torch.nn.Module):
    for cls, wrap in ((ResBlock, _ResBlock), (AttnBlock, _AttnBlock), (Down, _Down), (Up, _Up)):
        if isinstance(b, cls):
            return wrap(b)
    raise TypeError(f"no exact forward for {type(b).__name__}")


class ExactUNet:
    def __init__(self, net: UNet):
        cfg = self.config = net.config
        self.kind = net.embed.kind
        self.embed_scale = float(net.embed.scale)
        self.W = net.embed.W.detach().to("cpu", F64)
        if self.kind == "positional":  # not saved with the weights: rebuilt exactly, in float32 as the net has it
            k = torch.arange(self.W.shape[0], dtype=F64)
            log_1e4 = em.log(torch.tensor(10000.0, dtype=F64))
            self.W = em.exp(-log_1e4 * k / max(self.W.shape[0] - 1, 1)).to(torch.float32).to(F64)
        self.temb0, self.temb1 = em.ExactConv.of(net.temb[0]), em.ExactConv.of(net.temb[2])
        self.conv_in, self.conv_out = em.ExactConv.of(net.conv_in), em.ExactConv.of(net.conv_out)
        self.down = [[_block(b) for b in blocks] for blocks in net.down]
        self.mid = [_block(b) for b in net.mid]
        self.up = [[_block(b) for b in blocks] for blocks in net.up]
        self.norm_out = _GroupNorm(net.norm_out)
        self.levels = cfg.levels

    def _embedding(self, c: Tensor) -> Tensor:
        if self.kind == "fourier":
            a = (c[:, None] * self.W[None]) * (2 * math.pi)
        else:
            a = (c * self.embed_scale)[:, None] * self.W[None]
        return torch.cat([em.sin(a), em.cos(a)], dim=1)

    def __call__(self, x: Tensor, noise_cond: Tensor) -> Tensor:
        k = 2 ** (self.levels - 1)
        if x.shape[-1] % k or x.shape[-2] % k:
            raise ValueError(f"H and W must be multiples of {k}; got {tuple(x.shape[-2:])}")
        temb = self.temb1(silu(self.temb0(self._embedding(noise_cond.to(F64)))))
        temb_act = silu(temb)  # every ResBlock's embedding projection takes silu(temb)
        h = traverse(self.conv_in(x), temb_act, self.down, self.mid, self.up)
        return self.conv_out(silu(self.norm_out(h)))


class ExactScoreModel:
    """forward(x [N, C, H, W] float64, t [N] float64) -> eps_hat float64, as ScoreModel.forward."""

    def __init__(self, model: ScoreModel):
        if not isinstance(model, ScoreModel) or not isinstance(model.net, UNet):
            raise TypeError("exact arithmetic needs a ScoreModel around a UNet")
        self.sde = model.sde.exact()
        self.precond = model.precond
        self.net = ExactUNet(model.net)

    def coefficients(self, t: Tensor) -> dict[str, Tensor]:
        """ScoreModel.coefficients with the exact SDE (c_in = 1 / sqrt(var), no rsqrt)."""
        t = t.to(F64)
        alpha, sigma = self.sde.marginal_coeffs(t)
        var = (alpha * self.precond.sigma_data) ** 2 + sigma ** 2
        c_in = 1.0 / torch.sqrt(var)
        c_noise = -0.5 * self.sde.log_snr(t)
        if self.precond.gaussian_skip:
            c_skip, c_out = sigma / var, alpha * self.precond.sigma_data * c_in
        else:
            c_skip, c_out = torch.zeros_like(t), torch.ones_like(t)
        return dict(c_in=c_in, c_noise=c_noise, c_skip=c_skip, c_out=c_out)

    @torch.no_grad()
    def __call__(self, x: Tensor, t: Tensor) -> Tensor:
        x = x.to(F64)
        if t.dim() == 0:
            t = t.expand(x.shape[0])
        c = self.coefficients(t)
        view = (-1,) + (1,) * (x.dim() - 1)
        out = self.net(c["c_in"].view(view) * x, c["c_noise"])
        if self.precond.gaussian_skip:
            out = c["c_skip"].view(view) * x + c["c_out"].view(view) * out
        return out


def _res(r: _Res):
    c1, c2 = em.ExactConv.of(r.c1), em.ExactConv.of(r.c2)
    return lambda x: x + c2(silu(c1(silu(x))))


def _trunk(seq: torch.nn.Sequential):
    """An exact forward of a dequantizer trunk: Conv2d, _Res blocks, SiLU, in any order."""
    layers = []
    for m in seq:
        if isinstance(m, torch.nn.Conv2d):
            layers.append(em.ExactConv.of(m))
        elif isinstance(m, _Res):
            layers.append(_res(m))
        elif isinstance(m, torch.nn.SiLU):
            layers.append(silu)
        elif not isinstance(m, torch.nn.Dropout):
            raise TypeError(f"no exact forward for {type(m).__name__}")

    def run(x: Tensor) -> Tensor:
        for f in layers:
            x = f(x)
        return x
    return run


class ExactDequantizer:
    """group_mixture of a VariationalDequantizer, exactly (float64 outputs)."""

    def __init__(self, dq: VariationalDequantizer):
        self.dq, self.config = dq, dq.config
        self.cond = _trunk(dq.cond)
        self.nets = [_trunk(n) for n in dq.nets]

    def groups(self, shape):
        return self.dq.groups(shape)

    @torch.no_grad()
    def group_mixture(self, x_uint8: Tensor, u_known: Tensor, g: int) -> tuple[Tensor, Tensor, Tensor]:
        cfg = self.config
        feats = self.cond(to_model(x_uint8, torch.zeros(x_uint8.shape, dtype=F64)))
        lay = self.dq.layout(u_known.shape[1:], "cpu")
        out = self.nets[g](group_input(feats, u_known, lay, g))
        return mixture_params(out, lay.index[g], cfg, em.tanh)


def exact_model(model):
    """The exact forward of an eps model: ExactScoreModel for a ScoreModel around a UNet, or the
    model's own `exact()` (the analytic test models)."""
    if isinstance(model, ScoreModel) and isinstance(model.net, UNet):
        return ExactScoreModel(model)
    if hasattr(model, "exact"):
        return model.exact()
    raise TypeError(f"no exact arithmetic for {type(model).__name__}")


def exact_dequantizer(dq):
    """ExactDequantizer for a variational dequantizer; a uniform one has no network."""
    if isinstance(dq, VariationalDequantizer):
        return ExactDequantizer(dq)
    if dq.config.kind == "uniform":
        return dq
    raise TypeError(f"no exact arithmetic for {type(dq).__name__}")
