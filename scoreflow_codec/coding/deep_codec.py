"""The low bits of a 16-bit image's samples, coded given its high bytes (deep.split).

A sample u of `bits + 8` bits is (hi << bits) | lo: the high byte hi goes through the 8-bit codec
(model or seed codec, whatever codes the image's planes) and is known to the decoder first; this
codec codes lo, the low `bits` (1 to 8), given every hi.

* Order: anti-diagonal wavefronts t = x + 2y, as the seed codec: a pixel's neighbours N, W, NW,
  NE, WW, NN are in earlier wavefronts, so a wavefront is decoded in one vectorized step per
  channel, channels in order (a channel sees the earlier ones at the pixel). The decoder's picture
  of the image, V, starts as every sample's bin centre
  (hi << bits) + 2**(bits - 1), known from hi alone, and takes each sample's true value as it is
  decoded; a neighbour outside the image is read at the nearest pixel inside (coordinates clipped).
  A neighbour that the decoder has not reached yet (S, E, SW, SE, or a clipped one in this or a later
  wavefront) is read as its bin centre: the high bytes below and to the right say where a smooth
  surface is going.
* Prediction: one of PREDICTORS per channel (the encoder tries each and keeps the cheapest), on V,
  clipped to the sample's bin: p_lo in 0 .. 2**bits - 1. "med" is LOCO-I's; "linear" a least-squares
  fit (weights stored, 16 bits each) of the neighbours about the sample's own bin centre and, for a
  later channel, the two channels before at the pixel (their value minus their bin centre, N and W).
* Context: CONTEXTS levels of bit_length(|N - NW| + |W - NW| + |NE - N|) on V.
* Coding: lo as a categorical over 0 .. 2**bits - 1 with counts G[lo - p_lo] of a two-sided
  geometric theta**|r| per (channel, context), a floor of FLOOR counts, theta a 16-bit integer
  that the encoder fits (mean |residual|) and stores, so the decoder's tables are integer arithmetic
  alone: the same bits on every machine. A constant low plane costs one flag and its value.

Everything is on the caller's ANS stack: pixels first, then each channel's parameters on top (the
decoder pops them first). `push` returns the codelength it predicts (categorical_bits of the same
tables), which the real size matches to one word (tests/test_deep.py).

Measured (0.9.28, bench/deep16.py, 2-core Intel Xeon): on Kodak images made 16-bit by resampling in
floating point the low 8 bits are the photograph's noise below one 8-bit step and cost 8.005 bits a
sample (what any codec pays); on smooth or flat areas less (kodim20: 5.9). A 384x256 RGB image's low
bits encode in about 2.5 s and decode in 0.5 s.
"""
from __future__ import annotations

import functools

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .ans import Message
from .distributions import _bit_length, categorical, categorical_bits, uniform

PREDICTORS = ("med", "linear")  # linear: least-squares weights of features(), fitted per channel and stored
OWN = ("N", "W", "NW", "NE", "WW", "NN", "S", "E", "SW", "SE")  # a channel's neighbours (less C, its bin centre)
CROSS = 2  # channels before this one whose value at the pixel enters its features
WEIGHT_BITS, WEIGHT_FRAC = 16, 13  # a weight is a signed 16-bit integer / 2**13: -4 .. 4
FIT_PIXELS = 1 << 18
OUTLIER = 6.0  # the fit is made again without the pixels whose error is beyond this many times the median
CONTEXTS = 20          # bit_length of the activity, 0 .. 19 (an activity below 3 * 2**16 has at most 18)
THETA_BITS = 16
G0, FLOOR = 1 << 30, 1 << 12   # geometric counts G0 * theta**|r| (integer steps), plus FLOOR each
MAX_BITS = 8
CHUNK = 1 << 15        # pixels at a time in the encoder's features (memory: a few arrays of CHUNK)
# neighbour -> (dy, dx), clipped into the image; read as decoded where its wavefront comes first, or
# is this one and the channel an earlier one (_Picture.seen), else as its bin centre
OFFSETS = {"N": (-1, 0), "W": (0, -1), "NW": (-1, -1), "NE": (-1, 1), "WW": (0, -2), "NN": (-2, 0),
           "S": (1, 0), "E": (0, 1), "SW": (1, -1), "SE": (1, 1), "C": (0, 0)}
_FLAG, _PRED, _THETA = uniform(2, ()), uniform(len(PREDICTORS), ()), uniform(1 << THETA_BITS, ())


def _weights(n: int):
    return uniform(1 << WEIGHT_BITS, (n,))


def _check(hi: np.ndarray, bits: int) -> tuple[int, int, int]:
    if not (isinstance(bits, int) and 1 <= bits <= MAX_BITS):
        raise ValueError(f"deep codec: bits must be 1 .. {MAX_BITS}, got {bits!r}")
    if hi.dtype != np.uint8 or hi.ndim != 3 or 0 in hi.shape:
        raise ValueError(f"deep codec: expected uint8 high bytes [C, H, W], got {hi.dtype} {hi.shape}")
    return hi.shape


def _centres(hi: np.ndarray, bits: int) -> np.ndarray:
    """[C, H, W] int32: each sample's bin centre (samples have at most 16 bits)."""
    return (hi.astype(np.int32) << bits) + (1 << (bits - 1))


def _at(ys: np.ndarray, xs: np.ndarray, h: int, w: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each neighbour's coordinates (clipped into the image) of pixels (ys, xs)."""
    return {k: (np.clip(ys + dy, 0, h - 1), np.clip(xs + dx, 0, w - 1)) for k, (dy, dx) in OFFSETS.items()}


def _gather(c: int, where: dict, read, cen: np.ndarray) -> dict[str, np.ndarray]:
    """Channel c's `nb` at pixels whose neighbours are `where` (_at): its own neighbours, and for the
    CROSS channels before it their value at the pixel, bin centre, N and W; read(j, q): channel j's
    values at q as the decoder has them (the encoder's _Picture.seen, the decoder's picture)."""
    nb = {k: read(c, q) for k, q in where.items()}
    for d in range(1, min(c, CROSS) + 1):
        nb.update({f"X{d}": read(c - d, where["C"]), f"C{d}": cen[c - d][where["C"]],
                   f"N{d}": read(c - d, where["N"]), f"W{d}": read(c - d, where["W"])})
    return nb


def med(nb: dict[str, np.ndarray]) -> np.ndarray:
    """LOCO-I's median edge detector on N, W, NW."""
    n, w, nw = nb["N"], nb["W"], nb["NW"]
    return np.where(nw >= np.maximum(n, w), np.minimum(n, w),
                    np.where(nw <= np.minimum(n, w), np.maximum(n, w), n + w - nw))


def n_features(c: int) -> int:
    """How many features (and weights) channel c's linear predictor has."""
    return len(OWN) + 3 * min(c, CROSS)


def features(nb: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The linear predictor's inputs, all small differences (so that the weights' rounding moves the
    prediction by little): each neighbour minus C, the sample's own bin centre; for each of the
    channels d = 1, 2 before (where nb has them: "X1", "C1", "N1", "W1" ...), its value at the pixel,
    already decoded, minus its own bin centre, its N and its W (the other channel's local step, which
    the colours of a photograph share)."""
    out = [nb[k] - nb["C"] for k in OWN]
    d = 1
    while f"X{d}" in nb:
        x = nb[f"X{d}"]
        out += [x - nb[f"C{d}"], x - nb[f"N{d}"], x - nb[f"W{d}"]]
        d += 1
    return out


def linear(nb: dict[str, np.ndarray], weights) -> np.ndarray:
    """C + the sum of weights[k] * features[k], weights in units of 2**-WEIGHT_FRAC, rounded down:
    integers only."""
    acc = np.full(nb["C"].shape, 1 << (WEIGHT_FRAC - 1), dtype=np.int64)
    for f, wt in zip(features(nb), weights):
        if wt:
            acc += np.int64(wt) * f
    return nb["C"] + (acc >> WEIGHT_FRAC)


def fit_weights(nb: dict[str, np.ndarray], target: np.ndarray) -> list[int]:
    """Least-squares weights of features() for target (about C, as `linear`), in WEIGHT_BITS-bit fixed
    point (encoder only: stored)."""
    a = np.stack(features(nb), axis=1).astype(np.float64)
    y = (target - nb["C"]).astype(np.float64)
    w = np.linalg.lstsq(a, y, rcond=None)[0]
    err = np.abs(y - a @ w)
    inliers = err <= OUTLIER * max(float(np.median(err)), 1.0)  # edges, wrapped values: fitted again without
    if 2 * a.shape[1] <= inliers.sum() < len(y):
        w = np.linalg.lstsq(a[inliers], y[inliers], rcond=None)[0]
    lim = 1 << (WEIGHT_BITS - 1)
    return [int(min(max(round(x * (1 << WEIGHT_FRAC)), -lim), lim - 1)) for x in w]


def activity(nb: dict[str, np.ndarray]) -> np.ndarray:
    """Context 0 .. CONTEXTS - 1 of each pixel."""
    a = np.abs(nb["N"] - nb["NW"]) + np.abs(nb["W"] - nb["NW"]) + np.abs(nb["NE"] - nb["N"])
    return np.minimum(_bit_length(a), CONTEXTS - 1)


@functools.lru_cache(maxsize=1024)
def counts(theta: int, bits: int) -> np.ndarray:
    """[2**(bits + 1) - 1] float64 counts of the residual lo - p_lo = -(2**bits - 1) .. 2**bits - 1:
    G0 * (theta / 2**16)**|r| by integer steps, plus FLOOR (integers, exact in float64)."""
    k = 1 << bits
    g = np.empty(k, dtype=np.int64)
    g[0] = G0
    for r in range(1, k):
        g[r] = (int(g[r - 1]) * int(theta)) >> THETA_BITS
    g += FLOOR
    out = np.concatenate([g[:0:-1], g]).astype(np.float64)
    out.flags.writeable = False  # cached: shared by every caller
    return out


def fit_theta(mean_abs: float) -> int:
    """The 16-bit theta whose two-sided geometric has this mean |r| (encoder only: stored)."""
    if mean_abs <= 0:
        return 0
    t = (np.sqrt(1.0 + mean_abs * mean_abs) - 1.0) / mean_abs
    return int(min(max(round(t * (1 << THETA_BITS)), 0), (1 << THETA_BITS) - 1))


THETA_GRID = sorted({0, (1 << THETA_BITS) - 1} | {fit_theta(2.0 ** (j / 4)) for j in range(-24, 48)})


def best_theta(pairs: np.ndarray, bits: int) -> int:
    """The theta of THETA_GRID that codes a context's pixels in the fewest bits, windows and all:
    pairs [2**bits, 2**bits] counts of (p_lo, lo) (encoder only: the choice is stored)."""
    k = 1 << bits
    idx = np.arange(k)[None, :] - np.arange(k)[:, None] + k - 1  # [p, lo] -> residual column
    used = pairs > 0
    best, best_bits = 0, np.inf
    for t in THETA_GRID:
        g = counts(t, bits)[idx]
        cost = -(pairs[used] * np.log2((g / g.sum(axis=1, keepdims=True))[used])).sum()
        if cost < best_bits:
            best, best_bits = t, cost
    return best


def _approx_bits(tot: np.ndarray, num: np.ndarray) -> float:
    """Encoder's estimate of a predictor's cost from each context's sum of |residual| and count: the
    fitted geometric's -log2 p, untruncated."""
    bits = 0.0
    for k in np.nonzero(num)[0]:
        t = fit_theta(tot[k] / num[k]) / (1 << THETA_BITS)
        t = min(max(t, 1e-9), 1 - 1e-9)
        bits += num[k] * -np.log2((1 - t) / (1 + t)) - tot[k] * np.log2(t)
    return bits


class _Channel:
    """One channel's parameters: a constant value, or its predictor (with its weights, for "linear")
    and each context's theta (None where no pixel has that context)."""

    def __init__(self, const: int | None = None, pred: int = 0, weights: list | None = None,
                 thetas: list | None = None):
        self.const, self.pred, self.weights = const, pred, weights or []
        self.thetas = thetas or [None] * CONTEXTS

    def predict(self, nb: dict[str, np.ndarray]) -> np.ndarray:
        return med(nb) if PREDICTORS[self.pred] == "med" else linear(nb, self.weights)

    def push(self, m: Message, bits: int) -> float:
        """Onto the stack in the reverse of pop's order; returns the bits."""
        b = 1.0
        if self.const is not None:
            uniform(1 << bits, ()).push(m, np.int64(self.const))
            b += bits
        else:
            for t in reversed(self.thetas):
                if t is not None:
                    _THETA.push(m, np.int64(t))
                    b += THETA_BITS
                _FLAG.push(m, np.int64(t is not None))
                b += 1
            if PREDICTORS[self.pred] == "linear":
                _weights(len(self.weights)).push(m, np.asarray(self.weights, dtype=np.int64) + (1 << (WEIGHT_BITS - 1)))
                b += WEIGHT_BITS * len(self.weights)
            _PRED.push(m, np.int64(self.pred))
            b += np.log2(len(PREDICTORS))
        _FLAG.push(m, np.int64(self.const is not None))
        return b

    @classmethod
    def pop(cls, m: Message, bits: int, c: int) -> "_Channel":
        """Channel c's parameters."""
        if int(_FLAG.pop(m)):
            return cls(const=int(uniform(1 << bits, ()).pop(m)))
        pred = int(_PRED.pop(m))
        weights = None
        if PREDICTORS[pred] == "linear":
            weights = (_weights(n_features(c)).pop(m) - (1 << (WEIGHT_BITS - 1))).tolist()
        thetas = [int(_THETA.pop(m)) if int(_FLAG.pop(m)) else None for _ in range(CONTEXTS)]
        return cls(pred=pred, weights=weights, thetas=thetas)


def _tables(chans: list[_Channel], bits: int) -> np.ndarray:
    """[C * CONTEXTS, 2**bits, 2**bits] windows: row (c, k, s) holds the counts of lo = 0 .. 2**bits - 1
    when p_lo = 2**bits - 1 - s (a live view of [C * CONTEXTS, 2**(bits + 1) - 1] counts)."""
    flat = np.ones((1 << (bits + 1)) - 1)
    rows = [counts(t, bits) if t is not None else flat for ch in chans for t in ch.thetas]
    return sliding_window_view(np.stack(rows), 1 << bits, axis=1)


def _wavefronts(h: int, w: int):
    """(ys, xs) of each wavefront t = x + 2y in turn, rows in increasing order: the decoding order."""
    for t in range(w + 2 * h - 1):
        ys = np.arange(max(0, -(-(t - w + 1) // 2)), min(h - 1, t // 2) + 1)
        yield ys, t - 2 * ys


class _Picture:
    """Encoder: the samples as the decoder has them when it decodes each one (bin centres where it has
    not decoded them yet), for any set of pixels."""

    def __init__(self, hi: np.ndarray, lo: np.ndarray, bits: int):
        self.cen = _centres(hi, bits)
        self.full = (hi.astype(np.int32) << bits) | lo
        self.const = [bool((lo[c] == lo[c].flat[0]).all()) for c in range(len(lo))]
        self.h, self.w = hi.shape[1:]

    def seen(self, j: int, q: tuple[np.ndarray, np.ndarray], c: int, tp: np.ndarray) -> np.ndarray:
        """Channel j at q when channel c is decoded at pixels of wavefronts tp: true values in earlier
        wavefronts, in this one for earlier channels, and constant planes; bin centres elsewhere."""
        tq = q[1] + 2 * q[0]
        known = (tq < tp) | ((tq == tp) & (j < c)) | self.const[j]
        return np.where(known, self.full[j][q], self.cen[j][q])

    def neighbours(self, c: int, idx: np.ndarray) -> dict[str, np.ndarray]:
        """What the decoder's `nb` holds for channel c at the pixels idx (flat indices)."""
        ys, xs = np.divmod(idx, self.w)
        tp = xs + 2 * ys
        return _gather(c, _at(ys, xs, self.h, self.w), lambda j, q: self.seen(j, q, c, tp), self.cen)


def _fit(pic: _Picture, c: int, bits: int) -> tuple[_Channel, np.ndarray, np.ndarray]:
    """Encoder: channel c's parameters (the cheaper predictor, each context's best theta) and each
    pixel's p_lo and context, computed CHUNK pixels at a time."""
    n, top = pic.h * pic.w, (1 << bits) - 1
    sample = np.arange(0, n, max(1, n // FIT_PIXELS))
    options = [_Channel(pred=k, weights=fit_weights(pic.neighbours(c, sample), pic.full[c].flat[sample])
                        if name == "linear" else None) for k, name in enumerate(PREDICTORS)]
    p_lo = np.empty((len(options), n), np.int16)
    ctx = np.empty(n, np.uint8)
    tot = np.zeros((len(options), CONTEXTS))
    lo = pic.full[c].reshape(-1) & top
    base = pic.full[c].reshape(-1) - lo
    for a in range(0, n, CHUNK):
        idx = np.arange(a, min(a + CHUNK, n))
        nb = pic.neighbours(c, idx)
        ctx[idx] = activity(nb)
        for k, ch in enumerate(options):
            p_lo[k, idx] = np.clip(ch.predict(nb) - base[idx], 0, top)
            tot[k] += np.bincount(ctx[idx], weights=np.abs(lo[idx] - p_lo[k, idx]), minlength=CONTEXTS)
    num = np.bincount(ctx, minlength=CONTEXTS)
    best = min(range(len(options)), key=lambda k: (_approx_bits(tot[k], num) + WEIGHT_BITS * len(options[k].weights), k))
    ch, p = options[best], p_lo[best]
    pairs = np.zeros(CONTEXTS * (top + 1) ** 2, np.int64)
    for a in range(0, n, CHUNK):
        pairs += np.bincount((ctx[a:a + CHUNK].astype(np.int64) * (top + 1) + p[a:a + CHUNK]) * (top + 1)
                             + lo[a:a + CHUNK], minlength=len(pairs))
    pairs = pairs.reshape(CONTEXTS, top + 1, top + 1)
    ch.thetas = [best_theta(pairs[k], bits) if pairs[k].any() else None for k in range(CONTEXTS)]
    return ch, p.reshape(pic.h, pic.w), ctx.reshape(pic.h, pic.w)


def push(m: Message, hi: np.ndarray, lo: np.ndarray, bits: int) -> float:
    """Push lo (uint8 [C, H, W], values < 2**bits) given hi; returns the predicted bits."""
    c_, h, w = _check(hi, bits)
    if lo.shape != hi.shape or lo.dtype != np.uint8 or int(lo.max()) >> bits:
        raise ValueError(f"deep codec: expected uint8 low bits < 2**{bits} of shape {hi.shape}")
    pic = _Picture(hi, lo, bits)
    chans, fits = [], {}
    for c in range(c_):
        if pic.const[c]:
            chans.append(_Channel(const=int(lo[c].flat[0])))
        else:
            ch, p_lo, ctx = _fit(pic, c, bits)
            chans.append(ch)
            fits[c] = (p_lo, ctx)
    del pic
    total = 0.0
    if fits:
        tab = _tables(chans, bits)
        top = (1 << bits) - 1
        # the decoder pops wavefront after wavefront, channels in order: push in the reverse order
        for ys, xs in reversed(list(_wavefronts(h, w))):
            for c in reversed(list(fits)):
                p_lo, ctx = fits[c]
                x = lo[c, ys, xs].astype(np.int64)
                probs = tab[c * CONTEXTS + ctx[ys, xs], top - p_lo[ys, xs]]
                total += float(categorical_bits(x, probs).sum())
                categorical(probs).push(m, x)
    for ch in reversed(chans):
        total += ch.push(m, bits)
    return total


def pop(m: Message, hi: np.ndarray, bits: int) -> np.ndarray:
    """The low bits (uint8 [C, H, W]) that push put on the stack, given the same hi and bits. Garbage
    words give some values, never an exception (the caller's pixel CRC catches it)."""
    c_, h, w = _check(hi, bits)
    chans = [_Channel.pop(m, bits, c) for c in range(c_)]
    lo = np.empty((c_, h, w), dtype=np.uint8)
    cen = _centres(hi, bits)
    v = cen.copy()  # the decoder's picture: bin centres, true values as they are decoded
    for c, ch in enumerate(chans):
        if ch.const is not None:
            lo[c] = ch.const
            v[c] = (hi[c].astype(np.int32) << bits) + ch.const
    coded = [c for c, ch in enumerate(chans) if ch.const is None]
    if not coded:
        return lo
    tab = _tables(chans, bits)
    top = (1 << bits) - 1
    for ys, xs in _wavefronts(h, w):
        where = _at(ys, xs, h, w)
        for c in coded:  # in order: a channel sees the ones before it at this pixel
            nb = _gather(c, where, lambda j, q: v[j][q], cen)
            base = hi[c, ys, xs].astype(np.int64) << bits
            p_lo = np.clip(chans[c].predict(nb) - base, 0, top)
            x = categorical(tab[c * CONTEXTS + activity(nb), top - p_lo]).pop(m)
            lo[c, ys, xs] = x
            v[c, ys, xs] = base + x
    return lo
