"""Discrete distributions on the integer lattice as codecs, with their exact codelengths.

Values are integer lattice indices (np.int64 arrays of any shape). Every codec is vectorized:
one constriction call per component, never a Python loop over elements.

constriction represents every probability as an integer count out of 2**24 and gives every symbol
of a model's declared range at least one count. `*_bits` reproduce that fixed-point arithmetic
(``quantized=True``, the default), so they predict the size the coder really produces; with
``quantized=False`` they give the float64 model's -log2 p instead. See `gaussian` for the lattice
Gaussian's exact construction.

Measured (tests/test_distributions.py, 50k values): real size minus the quantized prediction is
-3 .. +1 bits in total, whatever the count (the ANS state); quantized minus float64 is
1e-6 / 3e-6 / 3e-5 / 4e-4 bits per value at std 0.3 / 1 / 10 / >= 300 (mostly the one-count
floor of the 2R+1 symbols in range: (2R+1) / 2**24 / ln 2 with R <= 3073).
"""
from __future__ import annotations

import math

import constriction
import numpy as np

from .ans import Codec, Message

_model = constriction.stream.model
PRECISION = 24
_ONE = 1 << PRECISION

#: Values and means must stay within this bound so that no intermediate overflows int64.
MAX_ABS = 1 << 62
#: The main Gaussian range is [-R, R] with R = ceil(TAIL * max std) + 1 (in coarse units).
TAIL = 12.0
#: Above this std (lattice units), x is split into a coarse part with std in [128, 256) and
#: uniform fine bits, so that the 2**-24 probability floor and the range size stay small.
MAX_COARSE_STD = 256.0
#: Largest std accepted: keeps the fine bits (<= 32) and +-12 std far inside int64.
MAX_STD = 2.0**40
#: Escape classes: payload e >= 0 has class bit_length(e) in 0..63 with p(c) ~ 2**-c.
_N_CLASSES = 64
_CLASS_PROBS = np.ldexp(1.0, -np.arange(_N_CLASSES, dtype=np.int64)).astype(np.float64)
#: Escape-class symbol order of a variable that bits-back *samples* (the encoder pops it): the
#: likeliest classes at both ends of the quantile range, the unlikely ones in the middle. A pop
#: reads the quantile that the last push left on the stack; after an escape push (a value far in
#: a model's tail) that quantile is at an extreme, and with the plain ascending order the popped
#: class would be huge and the sample absurd, feeding the next step an outlier that escapes again
#: (an escape cascade). With this order an extreme quantile pops class 0 or 1.
_SAMPLED_CLASS_ORDER = np.concatenate([np.arange(0, _N_CLASSES, 2), np.arange(_N_CLASSES - 1, 0, -2)])
_SAMPLED_CLASS_RANK = np.argsort(_SAMPLED_CLASS_ORDER)  # class -> symbol
_DIGIT_BITS = 16


# ---- constriction glue --------------------------------------------------------------------------


def _i32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.int32).reshape(-1)


def _push(m: Message, symbols: np.ndarray, model, *params: np.ndarray) -> None:
    if symbols.size:
        m.coder.encode_reverse(_i32(symbols), model, *params)


def _pop(m: Message, n: int, model, *params: np.ndarray) -> np.ndarray:
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if params:
        out = m.coder.decode(model, *params)
    else:
        out = m.coder.decode(model, n)
    return np.asarray(out, dtype=np.int64)


# ---- uniform bits and uniform integers ----------------------------------------------------------


def _push_bits(m: Message, values: np.ndarray, nbits: np.ndarray) -> None:
    """values[i] uniform on [0, 2**nbits[i]) (nbits in 0..63), as 16-bit digits, low digit first."""
    values = values.reshape(-1).astype(np.uint64)
    nbits = nbits.reshape(-1).astype(np.int64)
    n_digits = -(-int(nbits.max(initial=0)) // _DIGIT_BITS)
    for j in reversed(range(n_digits)):
        b = np.clip(nbits - _DIGIT_BITS * j, 0, _DIGIT_BITS)
        sel = b > 0
        mask = (np.uint64(1) << b[sel].astype(np.uint64)) - np.uint64(1)
        digit = (values[sel] >> np.uint64(_DIGIT_BITS * j)) & mask
        _push(m, digit.astype(np.int64), _model.Uniform(), _i32(np.left_shift(1, b[sel])))


def _pop_bits(m: Message, nbits: np.ndarray) -> np.ndarray:
    nbits = nbits.reshape(-1).astype(np.int64)
    values = np.zeros(nbits.shape, dtype=np.uint64)
    n_digits = -(-int(nbits.max(initial=0)) // _DIGIT_BITS)
    for j in range(n_digits):
        b = np.clip(nbits - _DIGIT_BITS * j, 0, _DIGIT_BITS)
        sel = b > 0
        d = _pop(m, int(sel.sum()), _model.Uniform(), _i32(np.left_shift(1, b[sel])))
        values[sel] |= d.astype(np.uint64) << np.uint64(_DIGIT_BITS * j)
    return values.astype(np.int64)


def uniform(n: int, shape: tuple[int, ...] | int) -> Codec:
    """x uniform on {0, ..., n-1} (int64 array of `shape`), for any 1 <= n <= 2**62.

    n <= 2**24 is one constriction symbol. Larger n: x = hi * 2**16 + lo. If 2**16 divides n,
    hi and lo are independent uniforms. Otherwise the last hi bucket is short (r = n - (H-1) 2**16
    values), so a flag "hi is the last bucket" (probability r/n) comes first; then either hi
    uniform on [0, H-1) (recursively) and lo on [0, 2**16), or lo on [0, r). Pops always return
    values < n, even from random bits.
    """
    n = int(n)
    if not 1 <= n <= MAX_ABS:
        raise ValueError(f"uniform: n must be in [1, 2**62], got {n}")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)

    def push(m: Message, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.int64)
        if x.shape != shape:
            raise ValueError(f"uniform: expected shape {shape}, got {x.shape}")
        if x.size and (x.min() < 0 or x.max() >= n):
            raise ValueError(f"uniform: values must be in [0, {n})")
        _push_uniform(m, x.reshape(-1), n)

    def pop(m: Message) -> np.ndarray:
        return _pop_uniform(m, math.prod(shape), n).reshape(shape)

    return Codec(push, pop)


def _push_uniform(m: Message, x: np.ndarray, n: int) -> None:
    if n == 1 or x.size == 0:
        return
    if n <= _ONE:
        _push(m, x, _model.Uniform(n))
        return
    d = 1 << _DIGIT_BITS
    hi, lo = x >> _DIGIT_BITS, x & (d - 1)
    if n % d == 0:
        _push(m, lo, _model.Uniform(d))  # pop order: hi, lo
        _push_uniform(m, hi, n // d)
        return
    n_hi, r = n // d, n % d  # hi in [0, n_hi]; the last bucket hi == n_hi holds r values
    last = hi == n_hi
    if r > 1:
        _push(m, lo[last], _model.Uniform(r))
    _push(m, lo[~last], _model.Uniform(d))
    _push_uniform(m, hi[~last], n_hi)
    _push(m, last.astype(np.int64), _last_bucket_model(n, r))


def _pop_uniform(m: Message, size: int, n: int) -> np.ndarray:
    if n == 1 or size == 0:
        return np.zeros(size, dtype=np.int64)
    if n <= _ONE:
        return _pop(m, size, _model.Uniform(n))
    d = 1 << _DIGIT_BITS
    if n % d == 0:
        hi = _pop_uniform(m, size, n // d)
        return (hi << _DIGIT_BITS) | _pop(m, size, _model.Uniform(d))
    n_hi, r = n // d, n % d
    last = _pop(m, size, _last_bucket_model(n, r)).astype(bool)
    x = np.empty(size, dtype=np.int64)
    k = int((~last).sum())
    x[~last] = (_pop_uniform(m, k, n_hi) << _DIGIT_BITS) | _pop(m, k, _model.Uniform(d))
    x[last] = (n_hi << _DIGIT_BITS) + (
        _pop(m, size - k, _model.Uniform(r)) if r > 1 else np.zeros(size - k, dtype=np.int64)
    )
    return x


def _last_bucket_model(n: int, r: int):
    return _model.Categorical(np.array([float(n - r), float(r)]), perfect=False)


# ---- categorical --------------------------------------------------------------------------------


def _check_probs(probs: np.ndarray) -> np.ndarray:
    p = np.ascontiguousarray(probs, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] < 2:
        raise ValueError("categorical: probs must be [N, K] with K >= 2")
    if p.shape[1] >= _ONE - 1:
        raise ValueError("categorical: too many categories for 24-bit probabilities")
    if not (np.isfinite(p).all() and (p >= 0).all() and (p.sum(axis=1) > 0).all()):
        raise ValueError("categorical: probabilities must be finite, >= 0, with positive sums")
    return p


def categorical(probs: np.ndarray) -> Codec:
    """x[i] in {0..K-1} with probability probs[i, x[i]] / sum(probs[i]) (probs [N, K] float64)."""
    p = _check_probs(probs)
    family = _model.Categorical(perfect=False)

    def push(m: Message, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.int64).reshape(-1)
        if x.shape != (p.shape[0],):
            raise ValueError(f"categorical: expected {p.shape[0]} values, got {x.shape}")
        if x.size and (x.min() < 0 or x.max() >= p.shape[1]):
            raise ValueError(f"categorical: values must be in [0, {p.shape[1]})")
        _push(m, x, family, p)

    def pop(m: Message) -> np.ndarray:
        return _pop(m, p.shape[0], family, p)

    return Codec(push, pop)


def categorical_bits(x: np.ndarray, probs: np.ndarray, quantized: bool = True) -> np.ndarray:
    """-log2 of the probability of each x[i] (float64 [N]).

    quantized=True mirrors constriction's lazy fixed-point categorical exactly: sequential float64
    cumulative sums (np.cumsum is sequential, like Rust's iterator sum), scale (2**24 - K) / total,
    truncation to integers, one extra count per symbol, the last symbol takes the remainder.
    """
    p = _check_probs(probs)
    x = np.asarray(x, dtype=np.int64).reshape(-1)
    rows = np.arange(p.shape[0])
    if not quantized:
        return -np.log2(p[rows, x] / p.sum(axis=1))
    k = p.shape[1]
    cum = np.cumsum(p, axis=1)
    scale = float(_ONE - k) / cum[:, -1]
    left_f = np.where(x > 0, cum[rows, np.maximum(x - 1, 0)], 0.0)
    left = np.floor(left_f * scale).astype(np.int64) + x
    right = np.where(
        x == k - 1, _ONE, np.floor(cum[rows, x] * scale).astype(np.int64) + x + 1
    )
    return PRECISION - np.log2((right - left).astype(np.float64))


def _fixed_categorical_bits(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    return categorical_bits(x, np.broadcast_to(table, (x.size, table.size)))


# ---- lattice Gaussian ---------------------------------------------------------------------------


def _broadcast(mean, std) -> tuple[np.ndarray, np.ndarray]:
    """float64 mean and std of one shape (a scalar std is fine)."""
    try:
        return tuple(np.broadcast_arrays(np.asarray(mean, np.float64), np.asarray(std, np.float64)))
    except ValueError:
        shapes = f"{np.shape(mean)} and {np.shape(std)}"
        raise ValueError(f"gaussian: mean and std shapes {shapes} don't broadcast") from None


def _gaussian_params(mean: np.ndarray, std: np.ndarray):
    """Coarse/fine split: (k fine bits, coarse mean, coarse std, range R), all per element.

    x = q * 2**k + f with f uniform on [0, 2**k). With X ~ N(mean, std) and x = the bin
    [x - 0.5, x + 0.5) holding X, q = floor(x / 2**k) means X in [q 2**k - 0.5, (q+1) 2**k - 0.5),
    i.e. (X + 0.5) / 2**k - 0.5 in [q - 0.5, q + 0.5): q is *exactly* the lattice Gaussian with
    mean (mean + 0.5) / 2**k - 0.5 and std std / 2**k. Only f | q is approximated (uniform); with
    std / 2**k >= 128 the density varies by < 1% across a coarse bin, costing < 1e-5 bits.
    """
    mean, std = _broadcast(mean, std)
    if mean.size and not (np.isfinite(mean).all() and (np.abs(mean) < MAX_ABS).all()):
        raise ValueError("gaussian: means must be finite with |mean| < 2**62")
    if std.size and not ((std > 0).all() and (std <= MAX_STD).all()):
        raise ValueError("gaussian: stds must be in (0, 2**40]")
    _, e = np.frexp(std / MAX_COARSE_STD)  # exact: std / 256 = f * 2**e, f in [0.5, 1)
    k = np.maximum(e, 0).astype(np.int64)
    cstd = np.ldexp(std, -k)
    cmean = np.where(k == 0, mean, np.ldexp(mean + 0.5, -k) - 0.5)
    center = np.rint(cmean)
    mu = cmean - center  # exact, in [-0.5, 0.5]
    r = int(math.ceil(TAIL * float(cstd.max(initial=0.0)))) + 1
    return k, center.astype(np.int64), mu, cstd, r


def gaussian(mean: np.ndarray, std: np.ndarray, sampled: bool = False) -> Codec:
    """Lattice Gaussian: P(x) = P(X in [x - 0.5, x + 0.5]), X ~ N(mean, std), for any int64 x.

    mean and std are float64 arrays of one shape (or broadcastable), in lattice units. The
    coarse index q (see `_gaussian_params`) is centred on round(coarse mean) and the residual is
    coded with constriction's QuantizedGaussian on [-R, R]; the end symbols +-R are escapes
    meaning "|residual| >= R", followed by e = |residual| - R as a class c = bit_length(e) under
    p(c) ~ 2**-c and then c - 1 uniform low bits. Pop order: main symbols, escape classes,
    escape low bits, fine bits. |x| and |mean| must stay below 2**62.

    sampled=True for a variable the encoder pops (bits-back samples it): same probabilities,
    escape classes in `_SAMPLED_CLASS_ORDER`. Push and pop of one variable must agree on it.
    """
    mean, std = _broadcast(mean, std)
    shape = mean.shape
    k, center, mu, cstd, r = _gaussian_params(mean, std)
    k, center, mu, cstd = (a.reshape(-1) for a in (k, center, mu, cstd))
    main = _model.QuantizedGaussian(-r, r)
    order = _SAMPLED_CLASS_ORDER if sampled else np.arange(_N_CLASSES)
    rank = _SAMPLED_CLASS_RANK if sampled else order
    classes = _model.Categorical(_CLASS_PROBS[order], perfect=False)
    has_fine = bool(k.any())

    def push(m: Message, x: np.ndarray) -> None:
        x = np.asarray(x)
        if x.shape != shape:
            raise ValueError(f"gaussian: expected shape {shape}, got {x.shape}")
        if not np.issubdtype(x.dtype, np.integer):
            raise ValueError("gaussian: values must be integers")
        x = x.astype(np.int64).reshape(-1)
        if x.size and (np.abs(x) >= MAX_ABS).any():
            raise ValueError("gaussian: values must satisfy |x| < 2**62")
        q = x >> k  # arithmetic shift: floor(x / 2**k)
        res = q - center
        sym = np.clip(res, -r, r)
        esc = np.abs(sym) == r
        e = np.abs(res[esc]) - r
        cls = _bit_length(e)
        if has_fine:
            _push_bits(m, x & ((np.int64(1) << k) - 1), k)
        _push_bits(m, e - np.where(cls > 0, np.left_shift(1, np.maximum(cls - 1, 0)), 0),
                   np.maximum(cls - 1, 0))
        _push(m, rank[cls], classes)
        _push(m, sym, main, mu, cstd)

    def pop(m: Message) -> np.ndarray:
        sym = _pop(m, mu.size, main, mu, cstd)
        esc = np.abs(sym) == r
        cls = order[_pop(m, int(esc.sum()), classes)]
        low = _pop_bits(m, np.maximum(cls - 1, 0))
        e = np.where(cls > 0, np.left_shift(1, np.maximum(cls - 1, 0)), 0) + low
        res = sym.copy()
        res[esc] = np.sign(sym[esc]) * (r + e)
        q = center + res
        x = q << k
        if has_fine:
            x = x | _pop_bits(m, k)
        return x.reshape(shape)

    return Codec(push, pop)


def _bit_length(e: np.ndarray) -> np.ndarray:
    """bit_length of non-negative int64s (0 for 0), exact for all values < 2**63."""
    e = e.astype(np.int64)
    out = np.zeros(e.shape, dtype=np.int64)
    v = e.copy()
    for s in (32, 16, 8, 4, 2, 1):
        big = v >= (np.int64(1) << s)
        out += np.where(big, s, 0)
        v = np.where(big, v >> s, v)
    return out + (v > 0)


def _erf(z: np.ndarray) -> np.ndarray:
    import torch  # here, not at the top: the seed codec's path (sfcodec info, seed-only files) needs no torch

    return torch.special.erf(torch.from_numpy(np.ascontiguousarray(z, dtype=np.float64))).numpy()


def _cdf(x: np.ndarray, mu: np.ndarray, std: np.ndarray) -> np.ndarray:
    # Same expression as the `probability` crate that constriction uses; a tiny std gives +-inf.
    with np.errstate(over="ignore", divide="ignore"):
        return (1.0 + _erf((x - mu) / (std * math.sqrt(2.0)))) / 2.0


def _float_bits(x: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """-log2 P(X in [x - 0.5, x + 0.5]) in float64, accurate far into the tails (inf for p = 0)."""
    import torch

    with np.errstate(all="ignore"):  # a tiny std gives +-inf z's, which the formulas handle
        z_hi = (x + 0.5 - mean) / std
        z_lo = (x - 0.5 - mean) / std
        # P = Phi(-a) - Phi(-b) in the upper tail (a < b), in logs so that tails don't underflow.
        flip = (z_lo + z_hi) < 0
        a, b = np.where(flip, -z_hi, z_lo), np.where(flip, -z_lo, z_hi)
        la = torch.special.log_ndtr(torch.from_numpy(-a)).numpy()
        lb = torch.special.log_ndtr(torch.from_numpy(-b)).numpy()
        logp = la + np.log1p(-np.exp(lb - la))
        return np.where(np.isneginf(la), np.inf, -logp / math.log(2.0))  # p = 0: infinite cost


def gaussian_bits(
    x: np.ndarray, mean: np.ndarray, std: np.ndarray, quantized: bool = True
) -> np.ndarray:
    """Codelength in bits of each x under `gaussian(mean, std)` (float64, x's shape).

    quantized=True: the coder's own fixed-point probabilities (LeakyQuantizer: count
    floor(w cdf(s + 0.5)) - floor(w cdf(s - 0.5)) + 1, w = 2**24 - 2R - 1, the end symbols taking
    the tails), escapes and fine bits included; it differs from the real size only where erf
    differs by an ulp at a rounding boundary. quantized=False: the float64 lattice Gaussian
    -log2 P(X in [x - 0.5, x + 0.5]) that the codec approximates.
    """
    x = np.asarray(x, dtype=np.int64)
    mean, std = _broadcast(mean, std)
    if not quantized:
        return _float_bits(x, mean, std)
    shape = x.shape
    k, center, mu, cstd, r = _gaussian_params(mean, std)
    k, center, mu, cstd = (a.reshape(-1) for a in (k, center, mu, cstd))
    x = x.reshape(-1)
    res = (x >> k) - center
    s = np.clip(res, -r, r)
    w = float(_ONE - 1 - 2 * r)
    left = np.where(s == -r, 0, np.floor(w * _cdf(s - 0.5, mu, cstd)).astype(np.int64) + s + r)
    right = np.where(
        s == r, _ONE, np.floor(w * _cdf(s + 0.5, mu, cstd)).astype(np.int64) + s + r + 1
    )
    bits = PRECISION - np.log2((right - left).astype(np.float64)) + k
    esc = np.abs(s) == r
    if esc.any():
        cls = _bit_length(np.abs(res[esc]) - r)
        bits[esc] += _fixed_categorical_bits(cls, _CLASS_PROBS) + np.maximum(cls - 1, 0)
    return bits.reshape(shape)
