"""Float64 arithmetic that every IEEE-754 machine reproduces bit for bit (DESIGN 2e).

A decoder must recompute the encoder's coder parameters to the last bit, on whatever CPU it runs.
Rounding a float32 network's outputs to a grid does not achieve that: two machines whose kernels
differ (oneDNN and MKL pick code paths by instruction set and cache size; numpy and SLEEF have
their own exp and tanh per SIMD width) differ in about 90% of the raw outputs by up to 2e-6 on the
shipped photo model, and the grid only moves which values flip (tests/test_exact.py measures it).

What is reproducible everywhere: the IEEE operations +, -, *, / and sqrt are correctly rounded,
so the same inputs give the same bits whatever the vector width, as long as no multiply-add is
fused (torch evaluates each operator of an expression as its own kernel). Everything here is
built from those:

- elementwise functions (exp, log, expm1, log1p, sigmoid, tanh, sin, cos) by range reduction and
  polynomials in Horner form, a few ulp from the true values;
- sums in a fixed order (`tree_sum`), never a library reduction whose order depends on the kernel;
- sums that must run in a library kernel to be fast (convolutions, matrix products) get integer
  operands: activations rounded to a per-sample power-of-two grid and weights to integers, small
  enough that every partial sum is an integer below 2^52. Such a sum is exact in any order, with
  or without FMA, so the kernel's choices cannot show.

Subnormal numbers never arise (exp saturates at +-EXP_LIMIT), so flush-to-zero settings that
some libraries switch on cannot show either.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

Tensor = torch.Tensor
F64 = torch.float64

EXP_LIMIT = 700.0  # exp(+-700) ~ 1e+-304: far from overflow and from subnormal results
_LN2_HI = 6.93147180369123816490e-01  # fdlibm's split of ln 2: LN2_HI has 32 trailing zero bits,
_LN2_LO = 1.90821492927058770002e-10  # so k * LN2_HI is exact for |k| < 2^21
_INV_LN2 = 1.44269504088896338700e+00
# pi/2 in three 33-bit pieces (fdlibm): k * piece is exact for |k| < 2^20
_PIO2 = (1.57079632673412561417e+00, 6.07710050630396597660e-11, 2.02226624871116645580e-21)
_PIO2_REST = 8.47842766036889956997e-32
_TWO_OVER_PI = 6.36619772367581382433e-01
TRIG_LIMIT = float(2 ** 20)  # |x| above this: sin/cos of the clamped argument (a deterministic garbage value)


def _horner(x: Tensor, coeffs: list[float]) -> Tensor:
    """c0 + x (c1 + x (c2 + ...)), coeffs from c0; one multiply and one add per term, unfused."""
    if len(coeffs) == 1:
        return torch.full_like(x, coeffs[0])
    p = (x * coeffs[-1]).add_(coeffs[-2])  # c x rounds as x c: the same bits as a filled c times x
    for c in reversed(coeffs[:-2]):
        p.mul_(x).add_(c)  # in place: each of the dozen passes reads one tensor less, allocates none
    return p


_EXP_TAYLOR = [1.0 / math.factorial(n) for n in range(14)]       # |r| <= ln2/2: error < 5e-18
_EXPM1_TAYLOR = [1.0 / math.factorial(n + 1) for n in range(17)]  # expm1(x)/x, |x| <= 1/2
_ATANH_SERIES = [1.0 / (2 * n + 1) for n in range(12)]           # atanh(s)/s in s^2, |s| <= 0.1716
_SIN_TAYLOR = [(-1) ** n / math.factorial(2 * n + 1) for n in range(10)]  # in r^2, |r| <= pi/4
_COS_TAYLOR = [(-1) ** n / math.factorial(2 * n) for n in range(10)]


def pow2(k: Tensor) -> Tensor:
    """2.0 ** k for integer-valued k in [-1022, 1023], built from its bits (exact)."""
    k = k if k.dtype == torch.int64 else k.to(torch.int64)
    return (k + 1023).bitwise_left_shift_(52).view(F64)


def exp(x: Tensor) -> Tensor:
    """e^x (x clamped to [-EXP_LIMIT, EXP_LIMIT]); NaN stays NaN."""
    x = x.to(F64).clamp(-EXP_LIMIT, EXP_LIMIT)
    k = torch.round(x * _INV_LN2)
    r = x.sub_(k * _LN2_HI).sub_(k * _LN2_LO)  # x is clamp's copy
    return _horner(r, _EXP_TAYLOR).mul_(pow2(k))


def expm1(x: Tensor) -> Tensor:
    """e^x - 1, accurate near 0."""
    x = x.to(F64)
    small = x.abs() <= 0.5
    xs = torch.where(small, x, torch.zeros_like(x))
    return torch.where(small, xs * _horner(xs, _EXPM1_TAYLOR), exp(x) - 1.0)


def _atanh_small(s: Tensor) -> Tensor:
    """2 atanh(s) for |s| <= 0.1716 (log((1 + s) / (1 - s)))."""
    return 2.0 * s * _horner(s * s, _ATANH_SERIES)


_MANT = (1 << 52) - 1
_SQRT2 = math.sqrt(2.0)
_TINY = 2.0 ** -1022
_LOG_TINY = -1022 * 0.6931471805599453  # log(2^-1022), a literal: no libm call


def log(x: Tensor) -> Tensor:
    """Natural log; log(0) = -inf, log(x < 0) = NaN, log(inf) = inf."""
    x = x.to(F64)
    xc = torch.where((x >= _TINY) & (x < math.inf), x, torch.ones_like(x))
    bits = xc.view(torch.int64)
    e = (bits >> 52) - 1023
    m = ((bits & _MANT) | (1023 << 52)).view(F64)  # in [1, 2)
    big = m > _SQRT2
    m = torch.where(big, m * 0.5, m)               # in (0.707, 1.414]: |s| <= 0.1716
    e = (e + big.to(torch.int64)).to(F64)
    s = (m - 1.0) / (m + 1.0)
    out = e * _LN2_HI + (_atanh_small(s) + e * _LN2_LO)
    out = torch.where(x == 0, torch.full_like(x, -math.inf), out)
    out = torch.where((x > 0) & (x < _TINY), torch.full_like(x, _LOG_TINY), out)  # no subnormals
    out = torch.where(x == math.inf, x, out)
    return torch.where((x < 0) | torch.isnan(x), torch.full_like(x, math.nan), out)


def log1p(x: Tensor) -> Tensor:
    """log(1 + x), accurate near 0."""
    x = x.to(F64)
    small = (x > -0.29) & (x < 0.41)  # there |x / (2 + x)| <= 0.1716
    xs = torch.where(small, x, torch.zeros_like(x))
    return torch.where(small, _atanh_small(xs / (2.0 + xs)), log(1.0 + x))


def sigmoid(x: Tensor) -> Tensor:
    return 1.0 / (1.0 + exp(-x.to(F64)))


def softplus(x: Tensor) -> Tensor:
    """log(1 + e^x) without overflow: max(x, 0) + log1p(e^-|x|)."""
    x = x.to(F64)
    return x.clamp(min=0.0) + log1p(exp(-x.abs()))


def tanh(x: Tensor) -> Tensor:
    x = x.to(F64)
    em = expm1(-2.0 * x.abs())  # in (-1, 0]
    y = -em / (2.0 + em)
    return torch.where(x < 0, -y, y)


def _reduce_pio2(x: Tensor) -> tuple[Tensor, Tensor]:
    """r, q with x = q pi/2 + r, |r| <= ~pi/4, q mod 4 as int64."""
    x = x.to(F64).clamp(-TRIG_LIMIT, TRIG_LIMIT)
    k = torch.round(x * _TWO_OVER_PI)
    r = ((x - k * _PIO2[0]) - k * _PIO2[1]) - k * _PIO2[2]
    r = r - k * _PIO2_REST
    return r, k.to(torch.int64) & 3


def _sin_cos_reduced(r: Tensor) -> tuple[Tensor, Tensor]:
    r2 = r * r
    return r * _horner(r2, _SIN_TAYLOR), _horner(r2, _COS_TAYLOR)


def sin(x: Tensor) -> Tensor:
    r, q = _reduce_pio2(x)
    s, c = _sin_cos_reduced(r)
    return torch.where(q == 0, s, torch.where(q == 1, c, torch.where(q == 2, -s, -c)))


def cos(x: Tensor) -> Tensor:
    r, q = _reduce_pio2(x)
    s, c = _sin_cos_reduced(r)
    return torch.where(q == 0, c, torch.where(q == 1, -s, torch.where(q == 2, -c, s)))


def asinh(x: Tensor) -> Tensor:
    """asinh(x) = sign(x) log1p(|x| + x^2 / (1 + sqrt(1 + x^2)))."""
    x = x.to(F64)
    a = x.abs()
    y = log1p(a + a * a / (1.0 + torch.sqrt(1.0 + a * a)))
    return torch.where(x < 0, -y, y)


# --- fixed-order sums -------------------------------------------------------------------------
def tree_sum(x: Tensor, dim: int = -1) -> Tensor:
    """Sum over `dim` by pairwise halving: the order depends only on the length. An odd length
    is padded with one zero (x_i + 0 turns -0 into +0: the sum keeps that add)."""
    x = x.movedim(dim, -1)
    n, h = x.shape[-1], x.shape[-1] // 2
    # x is the caller's: an even length's first halving goes into a new half-size tensor, the
    # rest (and an odd length, in a copy) in place
    return tree_sum_(x[..., :h] + x[..., h:] if n % 2 == 0 else x.clone())


def tree_sum_(x: Tensor) -> Tensor:
    """tree_sum over the last dim, computed in x's own memory (x is overwritten): the same adds,
    in place, none of the halves allocated."""
    n = x.shape[-1]
    if n == 0:
        return torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    while n > 1:
        h = (n + 1) // 2
        x[..., :n - h].add_(x[..., h:n])
        if n % 2:
            x[..., h - 1].add_(0.0)
        n = h
    return x[..., 0]


def seq_sum(x: Tensor, dim: int) -> Tensor:
    """Left-to-right sum over a short `dim` (a few mixture components)."""
    x = x.movedim(dim, 0)
    out = x[0]
    for i in range(1, x.shape[0]):
        out = out + x[i]
    return out


# --- exact integer sums in library kernels ----------------------------------------------------
SUM_BITS = 52  # every partial sum of an exact product stays below 2^SUM_BITS (integer units)
WEIGHT_BITS = 23  # weights as integers below 2^23 (a step of 2^-23 of the largest): 3e-6 off the float64 net


def exponent(v: Tensor) -> Tensor:
    """The smallest integer e with |v| < 2^e (0 for v = 0), exactly (frexp)."""
    return torch.frexp(v.to(F64))[1].to(torch.int64)


def _per_sample(v: Tensor, ndim: int) -> Tensor:
    return v.reshape((-1,) + (1,) * (ndim - 1))


def integer_weights(w: Tensor) -> tuple[Tensor, int, int]:
    """(w_int float64, shift, e_l1): w ~= w_int * 2^-shift with |w_int| < 2^WEIGHT_BITS, and every
    output's sum of |w_int| below 2^e_l1."""
    w = w.detach().to("cpu", F64)
    shift = WEIGHT_BITS - int(exponent(w.abs().max()))
    w_int = torch.round(w * 2.0 ** shift)
    l1 = w_int.abs().reshape(w_int.shape[0], -1).sum(1).max()  # exact: integers far below 2^53
    return w_int, shift, int(exponent(l1))


def to_grid(a: Tensor, budget_bits: Tensor | int) -> tuple[Tensor, Tensor]:
    """Round every sample of `a` to the grid 2^-g, g chosen per sample so that its largest value
    has at most `budget_bits` bits: returns (integers, g). Per sample, so that neither the batch
    nor its padding can change a sample's result."""
    g = grid_exponent(a, budget_bits)
    return on_grid(a, g), g


def on_grid(a: Tensor, g: Tensor) -> Tensor:
    """round(a 2^g), g per sample: to_grid's integers for a given exponent."""
    return (a * _per_sample(pow2(g), a.dim())).round_()


def grid_exponent(a: Tensor, budget_bits: Tensor | int) -> Tensor:
    """to_grid's per-sample exponent g (int64): budget_bits - exponent(max |a|), within +-1000."""
    return exponent(abs_max(a)).neg_().add_(budget_bits).clamp_(-1000, 1000)


def abs_max(a: Tensor) -> Tensor:
    """max |a| per sample (exact), without an |a| copy."""
    if not a.numel():
        return torch.zeros(a.shape[0], dtype=a.dtype)
    flat = a.reshape(a.shape[0], -1)
    return torch.maximum(-flat.amin(1), flat.amax(1))  # two plain reductions: faster than aminmax


class ExactConv:
    """conv2d (or linear, for 2-D inputs) with integer operands: bit-exact on any machine."""

    def __init__(self, weight: Tensor, bias: Tensor | None, stride: int = 1, padding: int = 0):
        self.w_int, self.shift, self.e_l1 = integer_weights(weight)
        self.bias = None if bias is None else bias.detach().to("cpu", F64)
        self.stride, self.padding = stride, padding
        # what every call would otherwise rebuild: the bias as it broadcasts, int_conv2d's per-tap
        # matrices
        self.bias_b = None if self.bias is None else self.bias.view((1, -1) + (1,) * (weight.dim() - 2))
        self.taps = _tap_matrices(self.w_int) if weight.dim() == 4 else None

    @classmethod
    def of(cls, m: torch.nn.Module) -> "ExactConv":
        if isinstance(m, torch.nn.Conv2d):
            return cls(m.weight, m.bias, m.stride[0], m.padding[0])
        return cls(m.weight, m.bias)

    def __call__(self, a: Tensor) -> Tensor:
        # the activations' grid leaves SUM_BITS - e_l1 bits: every partial sum < 2^SUM_BITS
        g = grid_exponent(a, SUM_BITS - self.e_l1)
        if a.dim() == 4 and _taps_apply(a.shape, self.w_int.shape, self.stride, self.padding):
            # round straight into int_conv2d's padded buffer, and scale (+ bias) straight out of
            # its result: the same operations as to_grid / F.conv2d / mul / add, fewer copies
            x = _padded(a.shape, self.padding, a)
            inner = _interior(x, a.shape, self.padding)
            torch.mul(a.transpose(0, 1), pow2(g).view(1, -1, 1, 1), out=inner).round_()
            y = _conv_taps(x, self.w_int, self.stride, self.taps).transpose(0, 1)  # [N, O, Ho, Wo], a view
            out = torch.empty(y.shape, dtype=F64)
        else:
            a_int = on_grid(a, g)
            y = F.conv2d(a_int, self.w_int, None, self.stride, self.padding) if a.dim() == 4 else F.linear(a_int, self.w_int)
            out = y
        # y 2^-(g + shift) is exact (a power of two), so adding the bias in the same kernel rounds
        # once, as y * s + bias in two kernels does, fused multiply-add or not
        s = _per_sample(pow2(g.neg_().sub_(self.shift)), y.dim())  # g is ours: negated in place
        if self.bias is None:
            return torch.mul(y, s, out=out)
        return torch.addcmul(self.bias_b, y, s, out=out)


_CONV_BLOCK = 4096  # output columns per block of int_conv2d (measured best of 1k - 8k, AVX2 EPYC)


def int_conv2d(a: Tensor, w: Tensor, stride: int = 1, padding: int = 0) -> Tensor:
    """F.conv2d(a, w, None, stride, padding) for float64 tensors of integers whose every partial
    sum stays below 2^53: the same numbers, since such sums are exact in any order.

    torch has no fast float64 convolution on the CPU (its fallback unfolds every sample into a
    [C k k, H W] matrix first). Here each kernel tap is one matrix product over the whole batch:
    the zero-padded input, channels first, is one [C, N Hp Wp] matrix, and tap (dy, dx) reads it
    shifted by dy Wp + dx columns, so out[:, q] += w[:, :, dy, dx] @ x[:, q + shift] computes every
    output position q (and some border positions, dropped after), in blocks of columns that stay
    in the cache through the taps. A stride s reads the input's s x s phases (x[.., ry::s, rx::s])
    instead, each a stride-1 grid. 2.7 - 4.8x faster than F.conv2d on a batch of 8 64x64 tiles
    with 24 - 72 channels, 1.3 - 3.7x on 16x16 - 32x32 (AVX2 EPYC, one thread; docs/RESULTS.md)."""
    if not _taps_apply(a.shape, w.shape, stride, padding):
        return F.conv2d(a, w, None, stride, padding)
    x = _padded(a.shape, padding, a)
    _interior(x, a.shape, padding).copy_(a.transpose(0, 1))
    return _conv_taps(x, w, stride).transpose(0, 1).contiguous()


def _taps_apply(a_shape, w_shape, s: int, p: int) -> bool:
    """Whether int_conv2d's taps run (else F.conv2d: a 1x1 convolution is a single matrix
    product there, and odd strided or too-small inputs are rare)."""
    kh, kw = w_shape[2:]
    hp, wp = a_shape[2] + 2 * p, a_shape[3] + 2 * p
    return not (kh * kw == 1 and s == 1 or hp % s or wp % s or hp < kh or wp < kw)


def _padded(a_shape, p: int, like: Tensor) -> Tensor:
    """An uninitialised [C, N, H + 2p, W + 2p] buffer with a zero border."""
    n, c, h, wd = a_shape
    hp, wp = h + 2 * p, wd + 2 * p
    x = like.new_empty(c, n, hp, wp)
    if p == 1:  # zero only the border: the first and last rows, then columns, in one view each
        x[:, :, ::hp - 1].zero_(), x[:, :, :, ::wp - 1].zero_()
    elif p:
        x[:, :, :p].zero_(), x[:, :, hp - p:].zero_(), x[:, :, :, :p].zero_(), x[:, :, :, wp - p:].zero_()
    return x


def _interior(x: Tensor, a_shape, p: int) -> Tensor:
    return x[:, :, p:p + a_shape[2], p:p + a_shape[3]]


def _tap_matrices(w: Tensor) -> list[Tensor]:
    """w [O, C, kh, kw] as one contiguous [O, C] matrix per tap, row-major over (dy, dx)."""
    wt = w.permute(2, 3, 0, 1).contiguous()
    return [wt[dy, dx] for dy in range(w.shape[2]) for dx in range(w.shape[3])]


def _conv_taps(x: Tensor, w: Tensor, s: int, taps_w: list[Tensor] | None = None) -> Tensor:
    """The convolution of the padded [C, N, Hp, Wp] input x: [O, N, Ho, Wo] (a view); taps_w:
    `_tap_matrices(w)`, when the caller keeps them."""
    c, n, hp, wp = x.shape
    o, _, kh, kw = w.shape
    ho, wo = (hp - kh) // s + 1, (wp - kw) // s + 1
    hq, wq = hp // s, wp // s
    if s == 1:
        phases = {(0, 0): x.view(c, n * hq * wq)}
    else:
        phases = {(ry, rx): x[:, :, ry::s, rx::s].reshape(c, n * hq * wq)
                  for ry in range(min(s, kh)) for rx in range(min(s, kw))}
    m = n * hq * wq
    last = m - ((kh - 1) // s * wq + (kw - 1) // s)  # positions past it are never valid outputs
    out = x.new_empty(o, m)  # columns from `last` on are never written nor read
    taps_w = _tap_matrices(w) if taps_w is None else taps_w
    taps = [(taps_w[dy * kw + dx], phases[dy % s, dx % s], dy // s * wq + dx // s) for dy in range(kh) for dx in range(kw)]
    for j in range(0, last, _CONV_BLOCK):  # column blocks that stay in the cache through all taps
        e = min(j + _CONV_BLOCK, last)
        acc = out[:, j:e]
        for i, (wk, xs, shift) in enumerate(taps):
            acc.addmm_(wk, xs[:, j + shift:e + shift], beta=1 if i else 0)  # beta 0: acc's content ignored
    return out.view(o, n, hq, wq)[:, :, :ho, :wo]


def _ceil_log2(k: int) -> int:
    return max(int(k) - 1, 0).bit_length()


def bmm_grids(a: Tensor, b: Tensor, a_sum_bound: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Per-sample grid exponents (ga, gb) of `exact_bmm`'s operands: every partial sum of
    round(a 2^ga) @ round(b 2^gb) is an integer below 2^SUM_BITS.

    a_sum_bound: an upper bound (per sample) on sum_k |a[n, p, k]| for every row, when one is
    known (rows of attention weights sum to 1); otherwise K max|a| is used."""
    k = a.shape[2]
    if a_sum_bound is not None:
        # sum_k |a_int| <= 2^ga a_sum_bound + K/2 < 2^(e_s + ga + 1) once 2^ga > K
        return _bounded_grids(k, b, a_sum_bound)
    ea, eb = exponent(abs_max(a)), exponent(abs_max(b))
    # sum_k |a_int||b_int| < K 2^(ea + ga) 2^(eb + gb): split the budget between the two grids
    budget = SUM_BITS - _ceil_log2(k)
    ga = (budget - ea - eb + 1) // 2
    return ga, budget - ea - eb - ga


# attention scores per block and thread (512 KB): a block and its temporaries stay in the cache of
# each core that torch's element-wise kernels split it over
ATTN_BLOCK = 1 << 16


def attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """softmax(q^T k scale) v^T for q, k, v [N, C, P] (channels first): [N, P, C], the same bits as

        s = exact_bmm(q^T, k) * scale
        e = exp(s - s.amax(-1))
        a = e / tree_sum(e, -1)
        exact_bmm(a, v^T, a_sum_bound=1)

    computed in blocks of query rows (ATTN_BLOCK scores each) that stay in the cache from the
    first product to the second: every step is the same per row (a row's scores, its max, its
    exp, its sum in tree_sum's order) and the products are integer sums that are exact in any
    order, so the blocks cannot change a bit (tests/test_exact.py). The composition took the whole
    [N, P, P] matrix (64 MiB for a call of 8 tiles of 64px, P = 1024 at `photo`'s attention
    resolution) through memory some forty times: the exact forward of such a call took 2.53 s with
    it and 1.53 s with the blocks (two threads, the 2-core Intel Xeon, 0.9.63)."""
    n, _, p = q.shape
    qt, vt = q.transpose(1, 2), v.transpose(1, 2)
    ga, gb = bmm_grids(qt, k)
    q_int, k_int = on_grid(qt, ga), on_grid(k, gb)
    s_scale = _per_sample(pow2(-(ga + gb)), 3)
    a_grid, v_grid = _bounded_grids(p, vt, torch.full((n,), 1.0, dtype=F64))
    v_int = on_grid(vt, v_grid)
    a_scale, y_scale = _per_sample(pow2(a_grid), 3), _per_sample(pow2(-(a_grid + v_grid)), 3)
    out = torch.empty(n, p, vt.shape[2], dtype=F64)
    rows = max(1, ATTN_BLOCK * torch.get_num_threads() // max(n * k.shape[2], 1))
    for r in range(0, p, rows):
        s = torch.bmm(q_int[:, r:r + rows], k_int).mul_(s_scale).mul_(scale)
        e = exp(s - s.amax(-1, keepdim=True))
        a = e / tree_sum(e, -1)[..., None]
        torch.mul(torch.bmm(a.mul_(a_scale).round_(), v_int), y_scale, out=out[:, r:r + rows])
    return out


def _bounded_grids(k: int, b: Tensor, a_sum_bound: Tensor) -> tuple[Tensor, Tensor]:
    """bmm_grids' exponents for an `a` of inner length k whose rows sum (in |.|) to at most
    a_sum_bound: a's grid only has to resolve the values, b gets the rest of the budget."""
    ga = torch.full((b.shape[0],), max(26, _ceil_log2(k) + 1), dtype=torch.int64)
    return ga, SUM_BITS - (exponent(a_sum_bound) + ga + 1) - exponent(abs_max(b))


def exact_bmm(a: Tensor, b: Tensor, a_sum_bound: Tensor | None = None) -> Tensor:
    """Batched a @ b ([N, P, K] x [N, K, Q]) with both operands on per-sample integer grids
    (`bmm_grids`): the same bits from any matrix-product kernel."""
    ga, gb = bmm_grids(a, b, a_sum_bound)
    return torch.bmm(on_grid(a, ga), on_grid(b, gb)) * _per_sample(pow2(-(ga + gb)), 3)


# --- numpy front ends -------------------------------------------------------------------------
def np_fn(fn):
    """The numpy version of one of the functions above (float64 in, float64 out)."""
    def wrapped(a):
        arr = np.asarray(a, dtype=np.float64)
        return fn(torch.from_numpy(np.ascontiguousarray(arr))).numpy().reshape(arr.shape)
    wrapped.__name__ = f"np_{fn.__name__}"
    return wrapped


def floor_pow2(v: np.ndarray) -> np.ndarray:
    """The largest power of two <= v (v > 0), from the exponent bits: exact."""
    _, e = np.frexp(np.asarray(v, dtype=np.float64))  # v = f 2^e, f in [0.5, 1)
    return np.ldexp(1.0, e - 1)


def interp(x: np.ndarray, xp: np.ndarray, fp: np.ndarray) -> np.ndarray:
    """np.interp (xp increasing; constant beyond the ends), as separate ufuncs: numpy computes
    slope * (x - xp[j]) + fp[j] in one C expression that compilers may fuse into a multiply-add
    (aarch64 builds do; x86 ones do not). The same formula unfused: np.interp's bits on x86."""
    x = np.asarray(x, dtype=np.float64)
    xp, fp = np.asarray(xp, dtype=np.float64), np.asarray(fp, dtype=np.float64)
    j = np.clip(np.searchsorted(xp, x, side="right") - 1, 0, len(xp) - 2)
    slope = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j])
    out = slope * (x - xp[j])
    out = out + fp[j]
    out = np.where(x == xp[j], fp[j], out)
    return np.where(x <= xp[0], fp[0], np.where(x >= xp[-1], fp[-1], out))


def linspace(a: float, b: float, n: int) -> np.ndarray:
    """n points from a to b (both exact): a + i * ((b - a) / (n - 1)), one rounding per operation."""
    if n == 1:
        return np.array([float(a)])
    step = (float(b) - float(a)) / (n - 1)
    out = float(a) + np.arange(n, dtype=np.float64) * step
    out[-1] = b
    return out


# --- the arithmetic of the schedules ----------------------------------------------------------
class Ops:
    """The elementwise functions that SDE coefficients and step schedules use, on torch tensors
    and numpy arrays alike. NATIVE: torch's and numpy's own (training, evaluation, and files of
    the machine-bound "float32" arithmetic, whose numbers must not move); EXACT: this module's."""

    def __init__(self, name: str, exact: bool):
        self.name, self.exact = name, exact

    def _apply(self, x, native_np, native_torch, exact_fn):
        if isinstance(x, np.ndarray) or np.isscalar(x):
            return np_fn(exact_fn)(x) if self.exact else native_np(x)
        return exact_fn(x) if self.exact else native_torch(x)

    def exp(self, x):
        return self._apply(x, np.exp, torch.exp, exp)

    def expm1(self, x):
        return self._apply(x, np.expm1, torch.expm1, expm1)

    def log(self, x):
        return self._apply(x, np.log, torch.log, log)

    def log1p(self, x):
        return self._apply(x, np.log1p, torch.log1p, log1p)

    def asinh(self, x):
        return self._apply(x, np.arcsinh, torch.asinh, asinh)

    def softplus(self, x):
        return self._apply(x, lambda a: np.logaddexp(0.0, a), F.softplus, softplus)

    def rsqrt(self, x):
        """1/sqrt(x): torch.rsqrt natively (a fast approximation on some builds), 1.0 / sqrt exactly."""
        if self.exact:
            return 1.0 / (np.sqrt(x) if isinstance(x, np.ndarray) else torch.sqrt(x))
        return 1.0 / np.sqrt(x) if isinstance(x, np.ndarray) else torch.rsqrt(x)

    def linspace(self, a: float, b: float, n: int) -> Tensor:
        if self.exact:
            return torch.from_numpy(linspace(a, b, n))
        return torch.linspace(a, b, n, dtype=F64)

    def floor_pow2(self, v: np.ndarray) -> np.ndarray:
        return floor_pow2(v) if self.exact else 2.0 ** np.floor(np.log2(v))

    def __repr__(self) -> str:
        return f"Ops({self.name!r})"


NATIVE = Ops("native", exact=False)
EXACT = Ops("exact", exact=True)
