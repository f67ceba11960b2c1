"""exactmath and the exact network forwards: accurate, and the same bits whatever kernels run them.

The cross-machine property is tested by changing, in a subprocess, everything that differs
between machines and that this machine can change: the ATen kernels' instruction set
(ATEN_CPU_CAPABILITY), oneDNN's (ONEDNN_MAX_CPU_ISA), MKL's code path (MKL_CBWR), numpy's SIMD
loops (NPY_DISABLE_CPU_FEATURES) and the thread count. The float32 network's outputs change under
those settings (the negative control); the exact ones must not.
"""
import hashlib
import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from scoreflow_codec import exactmath as em
from scoreflow_codec import zoo
from scoreflow_codec.dequant import DequantConfig, VariationalDequantizer
from scoreflow_codec.models import presets
from scoreflow_codec.models.exact import ExactDequantizer, ExactScoreModel, silu

F64 = torch.float64
ULP = torch.finfo(F64).eps


def _ulps(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs() / (b.abs() * ULP).clamp(min=1e-300)).max())


@pytest.mark.parametrize("name, fn, ref, lo, hi", [
    ("exp", em.exp, torch.exp, -700, 700),
    ("expm1", em.expm1, torch.expm1, -40, 40),
    ("log", em.log, torch.log, 1e-300, 1e300),
    ("log1p", em.log1p, torch.log1p, -0.999, 50),
    ("sigmoid", em.sigmoid, torch.sigmoid, -40, 40),
    ("tanh", em.tanh, torch.tanh, -20, 20),
    ("sin", em.sin, torch.sin, -5000, 5000),
    ("cos", em.cos, torch.cos, -5000, 5000),
    ("asinh", em.asinh, torch.asinh, -1e6, 1e6),
])
def test_functions_are_within_a_few_ulp(name, fn, ref, lo, hi):
    g = torch.Generator().manual_seed(1)
    if name == "log":
        x = torch.exp(torch.empty(100_000, dtype=F64).uniform_(math.log(lo), math.log(hi), generator=g))
    else:
        x = torch.empty(100_000, dtype=F64).uniform_(lo, hi, generator=g)
        x = torch.cat([x, torch.linspace(-1e-3, 1e-3, 2001, dtype=F64).clamp(lo, hi)])  # near zero
    tol = 4.0 if name not in ("sin", "cos") else 16.0  # sin/cos: a few ulp of the reduced argument
    if name in ("sin", "cos"):
        # near their zeros the relative error is the argument's ulp over the value: compare absolutely
        assert float((fn(x) - ref(x)).abs().max()) < 1e-12
    else:
        assert _ulps(fn(x), ref(x)) <= tol


def test_softplus_and_special_values():
    x = torch.tensor([-800.0, -50.0, -1.0, 0.0, 1.0, 30.0, 800.0], dtype=F64)
    ref = torch.tensor([math.log1p(math.exp(v)) if v < 30 else v + math.log1p(math.exp(-v)) for v in x.tolist()],
                       dtype=F64)
    assert _ulps(em.softplus(x)[1:], ref[1:]) <= 4
    assert 0 < float(em.softplus(x)[0]) <= math.exp(-em.EXP_LIMIT) * 1.000001  # saturated, never subnormal
    assert em.log(torch.tensor([0.0], dtype=F64)).item() == -math.inf
    assert math.isnan(em.log(torch.tensor([-1.0], dtype=F64)).item())
    assert em.log(torch.tensor([math.inf], dtype=F64)).item() == math.inf
    assert em.exp(torch.tensor([-1e4, 1e4], dtype=F64)).tolist() == [math.exp(-em.EXP_LIMIT), math.exp(em.EXP_LIMIT)] \
        or _ulps(em.exp(torch.tensor([-1e4, 1e4], dtype=F64)),
                 torch.tensor([math.exp(-em.EXP_LIMIT), math.exp(em.EXP_LIMIT)], dtype=F64)) <= 2
    assert em.sigmoid(torch.tensor([-1e4], dtype=F64)).item() > 0  # no subnormals, no exact 0 from exp


@pytest.mark.parametrize("fn", [em.exp, em.log1p, em.sigmoid, em.tanh, em.sin, em.expm1])
def test_elementwise_results_do_not_depend_on_layout(fn):
    """Vectorized bodies and scalar tails, strided views and single elements: the same bits (no
    operation is fused or reordered by how torch splits the work)."""
    g = torch.Generator().manual_seed(2)
    x = torch.empty(1003, dtype=F64).uniform_(-0.9, 20, generator=g)
    whole = fn(x)
    one_by_one = torch.stack([fn(x[i:i + 1])[0] for i in range(0, 1003, 7)])
    assert torch.equal(whole[::7], one_by_one)
    assert torch.equal(fn(x[1::2]), whole[1::2])
    assert torch.equal(fn(x.reshape(17, 59).t()).t().reshape(-1), whole)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 37, 64, 1001])
def test_tree_sum_is_the_pairwise_order(n):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, n, dtype=F64, generator=g) * torch.logspace(-8, 8, n, dtype=F64)
    x[1] = -0.0  # -0 + -0 = -0, -0 + 0 = +0: the zero an odd length is padded with shows in the sign
    x[2, ::2] = -0.0

    def pairwise(v: list[float]) -> float:  # Python floats: one IEEE rounding per +
        while len(v) > 1:
            if len(v) % 2:
                v = v + [0.0]
            h = len(v) // 2
            v = [a + b for a, b in zip(v[:h], v[h:])]
        return v[0]

    def bits(t: torch.Tensor) -> list:
        return [(v, math.copysign(1.0, v)) for v in t.tolist()]

    want = [(v, math.copysign(1.0, v)) for v in (pairwise(r) for r in x.tolist())]
    assert bits(em.tree_sum(x)) == want
    assert bits(em.tree_sum(x.t(), dim=0)) == want
    y = x.clone()
    assert bits(em.tree_sum_(y)) == want  # in place: the same adds


def _int_conv_reference(a_int: np.ndarray, w_int: np.ndarray, stride: int, padding: int) -> np.ndarray:
    """conv2d in int64 (exact by construction)."""
    n, c, h, w = a_int.shape
    o, _, k, _ = w_int.shape
    ap = np.pad(a_int, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    ho, wo = (h + 2 * padding - k) // stride + 1, (w + 2 * padding - k) // stride + 1
    out = np.zeros((n, o, ho, wo), dtype=np.int64)
    for i in range(k):
        for j in range(k):
            patch = ap[:, :, i:i + stride * ho:stride, j:j + stride * wo:stride]  # [n, c, ho, wo]
            out += np.einsum("nchw,oc->nohw", patch, w_int[:, :, i, j])
    return out


@pytest.mark.parametrize("stride,k,bias", [(1, 3, True), (2, 3, True), (1, 3, False), (1, 1, True)])
def test_exact_conv_is_the_integer_convolution(stride, k, bias):
    g = torch.Generator().manual_seed(4)
    conv = torch.nn.Conv2d(6, 5, k, stride=stride, padding=k // 2, bias=bias)
    with torch.no_grad():  # weights from g, not from the global generator (the test's order)
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=g) * 40.0 / (6 * k * k) ** 0.5)
        if bias:
            conv.bias.copy_(torch.randn(conv.bias.shape, generator=g))
    # large weights: the activation grid shrinks to keep sums exact
    ex = em.ExactConv.of(conv)
    a = torch.randn(3, 6, 9, 10, dtype=F64, generator=g) * torch.tensor([1.0, 1e-3, 300.0])[:, None, None, None]
    a_int, gexp = em.to_grid(a, em.SUM_BITS - ex.e_l1)
    ref = _int_conv_reference(a_int.numpy().astype(np.int64), ex.w_int.numpy().astype(np.int64), stride, k // 2)
    assert np.abs(ref).max() < 2 ** em.SUM_BITS
    got = em.int_conv2d(a_int, ex.w_int, stride, k // 2)
    assert np.array_equal(got.numpy().astype(np.int64), ref)
    # ExactConv (which rounds into int_conv2d's buffer and scales out of it) is exactly that
    # integer result times 2^-(g + shift), plus the bias: one rounding, in the addition
    y = ex(a)
    want = ref.astype(np.float64) * em.pow2(-(gexp + ex.shift)).numpy()[:, None, None, None]
    if bias:
        want = want + conv.bias.detach().double().numpy()[None, :, None, None]
    assert y.is_contiguous() and np.array_equal(y.numpy(), want)
    # and close to the float64 convolution: y - ref = conv(a_q - a, w_q) + conv(a, w_q - w), so the
    # difference is within conv(|a_q - a|, |w_q|) + conv(|a|, |w_q - w|) (plus float64 rounding),
    # and that bound is what the design promises: weights within half a step of 2^-WEIGHT_BITS of
    # the largest one, activations on a grid of SUM_BITS - e_l1 bits
    w = conv.weight.detach().double()
    step = 2.0 ** (int(em.exponent(w.abs().max())) - em.WEIGHT_BITS)  # the weights' integer step
    a_step = em.pow2(-gexp)[:, None, None, None]  # the activations' grid, per sample
    w_q, a_q = ex.w_int * step, a_int * a_step
    conv_ = lambda x, v: F.conv2d(x, v, None, stride, k // 2)  # noqa: E731
    bound = conv_((a_q - a).abs(), w_q.abs()) + conv_(a.abs(), (w_q - w).abs()) + 64 * ULP * conv_(a.abs(), w.abs())
    ref64 = F.conv2d(a, w, conv.bias.detach().double() if bias else None, stride, k // 2)
    assert ((y - ref64).abs() <= bound + 2 * ULP * ref64.abs()).all()
    assert (bound <= (0.5 * step * conv_(a.abs(), torch.ones_like(w)) + 0.5 * a_step * conv_(torch.ones_like(a), w_q.abs()))
            * (1 + 1e-9) + conv_(a.abs(), w.abs()) * 2.0 ** -40).all()


@pytest.mark.parametrize("p", [1, 2])
def test_padded_buffer_zeroes_exactly_its_border(p):
    """int_conv2d's buffer: new memory (here NaN, as reused memory may hold anything) with a zero
    border p wide, the interior left for the caller to write."""
    class Like:
        def new_empty(self, *shape):
            return torch.full(shape, float("nan"), dtype=F64)

    x = em._padded((2, 3, 5, 4), p, Like())
    assert x.shape == (3, 2, 5 + 2 * p, 4 + 2 * p)
    inner = torch.zeros(x.shape, dtype=torch.bool)
    inner[:, :, p:p + 5, p:p + 4] = True
    assert torch.isnan(x[inner]).all() and (x[~inner] == 0).all()
    assert torch.equal(em._interior(x, (2, 3, 5, 4), p).isnan(), torch.ones(3, 2, 5, 4, dtype=torch.bool))


def test_exact_upsampling_is_nearest_interpolation():
    from scoreflow_codec.models.exact import _resample

    x = torch.randn(2, 3, 4, 5, dtype=F64)
    assert torch.equal(_resample(x, "up"), F.interpolate(x, scale_factor=2.0, mode="nearest"))


@pytest.mark.parametrize("shape", [
    (2, 3, 50, 50, 5, 3, 1, 1),   # 2 x 52 x 52 padded positions: more than one column block
    (3, 6, 8, 10, 4, 3, 2, 1),    # stride 2 from the input's phases
    (2, 4, 9, 9, 3, 2, 2, 0),     # an even kernel, stride 2
    (2, 5, 7, 6, 4, 3, 1, 0),     # no padding, odd sizes
    (1, 2, 6, 6, 3, 5, 1, 2),     # a 5x5 kernel
    (2, 4, 9, 10, 3, 3, 2, 1),    # odd padded height with stride 2: torch's convolution
    (2, 7, 5, 5, 6, 1, 1, 0),     # 1x1: torch's convolution
])
def test_int_conv2d_is_the_integer_convolution(shape):
    """int_conv2d (one matrix product per kernel tap over the batch) against the int64 reference."""
    n, c, h, w, o, k, stride, padding = shape
    g = torch.Generator().manual_seed(sum(shape))
    a = torch.randint(-2 ** 21, 2 ** 21, (n, c, h, w), generator=g)
    wt = torch.randint(-2 ** 21, 2 ** 21, (o, c, k, k), generator=g)
    ref = _int_conv_reference(a.numpy(), wt.numpy(), stride, padding)
    assert np.abs(ref).max() > 2 ** 40  # sums far beyond float32's 2^24, still exact in float64
    got = em.int_conv2d(a.double(), wt.double(), stride, padding)
    assert got.is_contiguous() and np.array_equal(got.numpy().astype(np.int64), ref)


@pytest.mark.parametrize("bounded", [False, True])
def test_exact_bmm_is_the_integer_product(bounded):
    g = torch.Generator().manual_seed(5)
    b = torch.randn(2, 300, 4, dtype=F64, generator=g) * torch.tensor([1.0, 1e3], dtype=F64)[:, None, None]
    if bounded:  # rows of attention weights: sums of 1
        a, bound = torch.softmax(3 * torch.randn(2, 7, 300, dtype=F64, generator=g), -1), torch.ones(2, dtype=F64)
    else:
        a, bound = torch.randn(2, 7, 300, dtype=F64, generator=g) * 50, None
    ga, gb = em.bmm_grids(a, b, bound)
    a_int = torch.round(a * em.pow2(ga)[:, None, None]).numpy().astype(np.int64)
    b_int = torch.round(b * em.pow2(gb)[:, None, None]).numpy().astype(np.int64)
    ref = np.matmul(a_int, b_int)  # int64: exact
    # every partial sum stays below the limit: the float64 product is this integer product
    assert (np.abs(a_int).astype(float) @ np.abs(b_int).astype(float) < 2.0 ** em.SUM_BITS).all()
    y = em.exact_bmm(a, b, bound)
    scale = em.pow2(-(ga + gb))[:, None, None].numpy()
    assert np.array_equal(y.numpy(), ref.astype(np.float64) * scale)
    # and close to the float64 product, relative to the operands' scale: each operand keeps about
    # (52 - log2 K) / 2 = 21 bits here (2^-21 = 5e-7); a bounded a leaves b about 25
    err = (y - a @ b).abs().amax((1, 2)) / ((a.abs() @ b.abs()).amax((1, 2)))
    assert float(err.max()) < (4e-6 if not bounded else 2e-7)


def _attention_composition(q, k, v, scale):
    """What the exact attention computed before 0.9.63 (one [N, P, P] matrix at a time)."""
    s = em.exact_bmm(q.transpose(1, 2), k) * scale
    e = em.exp(s - s.amax(-1, keepdim=True))
    a = e / em.tree_sum(e, -1)[..., None]
    return em.exact_bmm(a, v.transpose(1, 2), a_sum_bound=torch.full((q.shape[0],), 1.0, dtype=F64))


@pytest.mark.parametrize("n, c, p", [(2, 80, 1024), (3, 24, 100), (1, 8, 7)])
def test_attention_is_the_composition_in_any_blocking(n, c, p, monkeypatch):
    """em.attention's blocks of query rows give the composition's bits whatever their size (rows
    that do not divide P, one row, all rows), and the softmax attention to float64 accuracy."""
    g = torch.Generator().manual_seed(n * c + p)
    q, k, v = (torch.randn(n, c, p, dtype=F64, generator=g) * 2 for _ in range(3))
    v[-1] *= 1e3  # per-sample grids: one sample's scale must not touch another's bits
    scale = 1.0 / math.sqrt(c)
    ref = _attention_composition(q, k, v, scale)
    for block in (1 << 15, 1000, 1, n * p * p):
        monkeypatch.setattr(em, "ATTN_BLOCK", block)
        assert torch.equal(em.attention(q, k, v, scale), ref), block
    # the weights' grid is 2^-26 (bmm_grids): at most P 2^-27 max|v| off (7.6e-6 at P = 1024), and
    # the scores' grids about 2^-22 of theirs; measured 2.2e-6 at P = 1024
    soft = torch.softmax(q.transpose(1, 2) @ k * scale, -1) @ v.transpose(1, 2)
    assert float(((ref - soft).abs().amax((1, 2)) / v.abs().amax((1, 2))).max()) < 1e-5


def test_silu_table():
    x = torch.linspace(-60, 60, 200_001, dtype=F64)
    assert float((silu(x) - x * torch.sigmoid(x)).abs().max()) < 3e-8 * 60


def test_silu_is_the_table_formula_in_any_chunking(monkeypatch):
    """SiLU runs in chunks of SILU_CHUNK elements: each element is still clamp, scale, floor, then
    value[i] + slope[i] f, times x (numpy, one rounding per operation), whatever the chunks."""
    import scoreflow_codec.models.exact as mx

    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 7, 101, dtype=F64, generator=g) * 12
    x[0, 0, :14] = torch.tensor([math.nan, math.inf, -math.inf, 40.0, -40.0, -0.0, 1e306, -1e306, 32.0, -32.0,
                                 32.0 - 2 ** -40, -32.0 + 2 ** -40, 5e-324, -5e-324], dtype=F64)  # the edges of the table
    silu(x[:1, :1, :1])  # builds the table
    t, xs = mx._SILU, x.numpy()
    u = np.nan_to_num(np.clip(xs, -mx.SIG_RANGE, mx.SIG_RANGE) * 2.0 ** mx.SIG_STEP_BITS
                      + mx.SIG_RANGE * 2 ** mx.SIG_STEP_BITS, nan=0.0)
    i = np.floor(u)
    f = u - i
    want = (t.slope.numpy()[i.astype(np.int64)] * f + t.value.numpy()[i.astype(np.int64)]) * xs
    for chunk in (1 << 16, 1000, 7):
        monkeypatch.setattr(mx, "SILU_CHUNK", chunk)
        got = silu(x).numpy()
        num = ~np.isnan(want)  # (a NaN's sign bit is the hardware's choice)
        assert np.array_equal(got, want, equal_nan=True) and np.array_equal(np.signbit(got[num]), np.signbit(want[num]))
        assert np.array_equal(silu(x.transpose(0, 2)).numpy(), want.transpose(2, 1, 0), equal_nan=True)  # a strided input
    assert silu(x[:0]).shape == (0, 7, 101)


def _tiny_unet(seed=0):
    torch.manual_seed(seed)
    model, dq = presets.build("tiny")
    with torch.no_grad():  # the zero-initialised output convs would make the test trivial
        for p in list(model.parameters()) + list(dq.parameters()):
            p.add_(0.05 * torch.randn_like(p))
    return model.eval(), dq.eval()


@pytest.mark.parametrize("size", [16, 32])
def test_exact_score_model_matches_the_float64_network(size):
    model, _ = _tiny_unet()
    ex = ExactScoreModel(model)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(3, 3, size, size, dtype=F64, generator=g)
    for t in (1e-5, 0.1, 0.9):
        tt = torch.full((3,), t, dtype=F64)
        with torch.no_grad():
            ref = model.double()(x, tt)
            model.float()
        out = ex(x, tt)
        assert float((out - ref).abs().max()) < 1e-5 * max(1.0, float(ref.abs().max()))
        # per sample: the batch and its padding cannot change a sample's bits
        assert torch.equal(ex(x[1:2], tt[1:2]), out[1:2])


def test_exact_dequantizer_matches_the_network():
    _, dq = _tiny_unet()
    ex = ExactDequantizer(dq)
    g = torch.Generator().manual_seed(7)
    x = torch.randint(0, 256, (2, 3, 8, 8), generator=g).to(torch.uint8)
    u = torch.rand(2, 3, 8, 8, dtype=F64, generator=g)
    for grp in range(dq.num_groups):
        with torch.no_grad():
            ref = dq.double().group_mixture(x, u, grp)
            dq.float()
        got = ex.group_mixture(x, u, grp)
        for a, b in zip(got, ref):
            assert float((a - b).abs().max()) < 1e-5


# --- the cross-machine property -------------------------------------------------------------
KERNEL_ENVS = {
    "aten-default": {"ATEN_CPU_CAPABILITY": "default"},
    "onednn-sse41+mkl-compatible+2-threads": {"ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_CBWR": "COMPATIBLE",
                                              "SFC_TEST_THREADS": "2"},
    "numpy-no-simd": {"NPY_DISABLE_CPU_FEATURES": "AVX512F AVX512_SKX AVX2 FMA3 AVX",
                      "OPENBLAS_CORETYPE": "Prescott", "OPENBLAS_NUM_THREADS": "2"},
}

_PROBE = textwrap.dedent("""
    import hashlib, json, os, sys
    import numpy as np, torch
    torch.set_num_threads(int(os.environ.get("SFC_TEST_THREADS", "1")))
    from scoreflow_codec import exactmath as em, zoo
    from scoreflow_codec.models.exact import ExactScoreModel, ExactDequantizer
    m = zoo.load_model("cifar10")
    # inputs from integers scaled by powers of two: torch.randn and torch.linspace themselves
    # differ between kernels (linspace fuses a multiply-add in its AVX2 kernel)
    rng = np.random.default_rng(8)
    ints = lambda *shape: torch.from_numpy(rng.integers(-2**20, 2**20, shape).astype(np.float64))
    x = ints(2, 3, 32, 32) * 2.0 ** -19
    t = torch.tensor([0.02, 0.6], dtype=torch.float64)
    h = lambda v: hashlib.sha256(np.ascontiguousarray(v.detach().numpy()).tobytes()).hexdigest()
    out = {}
    with torch.no_grad():
        out["float32"] = h(m.model(x.float(), t.float()))
    out["exact"] = h(ExactScoreModel(m.model)(x, t))
    xu = torch.from_numpy(rng.integers(0, 256, (2, 3, 32, 32)).astype(np.uint8))
    u = (ints(2, 3, 32, 32) + 2**20) * 2.0 ** -21
    out["exact_dequant"] = h(torch.cat(ExactDequantizer(m.dequantizer).group_mixture(xu, u, 1)))
    z = ints(20001) * 2.0 ** -15
    out["functions"] = h(torch.stack([f(z) for f in (em.exp, em.expm1, em.log1p, em.sigmoid, em.tanh, em.sin, em.cos, em.softplus)]))
    out["numpy_functions"] = h(torch.from_numpy(np.stack([em.np_fn(em.exp)(z.numpy()), em.np_fn(em.log)(z.numpy() + 31)])))
    # the seed codec (version 2: least squares through numpy's matmul and element-wise solves;
    # version 3 adds the difference mode, integers only; version 4 changes it, integers only)
    from scoreflow_codec.coding.ans import Message
    from scoreflow_codec.coding.seed_codec import seed_codec
    yy, xx = np.mgrid[0:40, 0:48]
    planes = np.stack([(3 * xx + 5 * yy) % 256, (xx * xx + 3 * yy) % 251, rng.integers(0, 256, (40, 48))]).astype(np.uint8)
    msg = Message()
    seed_codec(planes.shape, 2).push(msg, planes)
    out["seed_v2"] = hashlib.sha256(msg.words().tobytes()).hexdigest()
    planes[0] = np.clip(planes[1].astype(np.int64) + xx // 6 - yy // 5, 0, 255)  # version 3's difference mode
    msg = Message()
    seed_codec(planes.shape, 3).push(msg, planes)
    out["seed_v3"] = hashlib.sha256(msg.words().tobytes()).hexdigest()
    # version 4: blue against (G + R) // 2 in the difference mode, whose counts mix in coarse rows
    # by integer floor division
    planes[2] = np.clip((planes[0].astype(np.int64) + planes[1]) // 2 + xx // 5 - yy // 7 + (3 * xx + 5 * yy) % 3 - 1, 0, 255)
    msg = Message()
    seed_codec(planes.shape, 4).push(msg, planes)
    out["seed_v4"] = hashlib.sha256(msg.words().tobytes()).hexdigest()
    print(json.dumps(out))
""")


def _probe(env_extra: dict) -> dict:
    env = {**os.environ, **env_extra}
    r = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def probes():
    return {"here": _probe({}), **{w: _probe(env) for w, env in KERNEL_ENVS.items()}}


@pytest.mark.parametrize("which", list(KERNEL_ENVS))
def test_exact_outputs_do_not_depend_on_the_kernels(which, probes):
    for k in ("exact", "exact_dequant", "functions", "numpy_functions", "seed_v2", "seed_v3", "seed_v4"):
        assert probes[which][k] == probes["here"][k], f"{k} changed under {which}"


def test_the_float32_network_does_depend_on_them(probes):
    """The negative control: without exact arithmetic some kernel switch moves the outputs."""
    changed = [w for w in KERNEL_ENVS if probes[w]["float32"] != probes["here"]["float32"]]
    assert changed, "no kernel switch changed the float32 outputs: the cross-kernel tests above prove nothing here"
