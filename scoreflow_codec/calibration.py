"""The model's denoising error as a function of log-SNR: m(lam) = E||eps - eps_hat(z_t, t)||^2 / D.

The diffusion chain's reverse step p(z_i | z_{i+1}) = N(mu_p, v I) has its best isotropic
variance (in KL, averaged over the data) at
    v = s_i^2 + c_x^2 (sigma_{i+1}/alpha_{i+1})^2 m(lam_{i+1}),
s_i the posterior std and c_x the posterior coefficient of y (Analytic-DPM's argument); using the
posterior variance alone (m = 0) is much looser when steps are coarse. m is measured once, on
training images, and stored in the model file, so encoder and decoder read the same numbers.

The same table says where the chain's steps should go (`step_grid`). With that variance, a step
from log-SNR lam to lam + d (the model evaluated at lam) costs in expectation, per dimension,
    0.5 log(1 + (e^d - 1) m(lam))  nats                                   (`chain_step_nats`)
against 0.5 * integral of m over [lam, lam + d] for the continuous bound. The excess is
c(lam) d^2 + O(d^3) with c = (m (1 - m) - m') / 4, and sum_i c_i d_i^2 at a fixed sum of d_i is
least when the density of steps goes as sqrt(c). That expansion fails where steps are coarse and
where m reaches 1 (at the clean end, where the network cannot see the dequantization noise: c < 0,
and one long step there costs less than the integral it replaces), so `optimized_grid` moves the
steps to the least total of the exact step costs.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from . import exactmath as em
from . import pixels


@torch.no_grad()
def eps_mse_table(model, x_uint8: torch.Tensor, points: int = 65, repeats: int = 2, batch: int = 64,
                  generator: torch.Generator | None = None, dequantizer=None) -> dict:
    """{"log_snr": [...] increasing, "mse": [...]} on `points` log-SNR values spanning [T, eps].

    y = x + u with u from `dequantizer` (its q(u | x), what the codec pops: give the model's own)
    or, without one, uniform, as the tables of model files before 0.9.14 were measured. The two
    differ at the clean end, where the network cannot see u: `cifar10`'s uniform table ends at
    1.004, with its dequantizer's u the same model's error there is 0.962.
    """
    sde = model.sde
    ends = sde.log_snr(torch.tensor([sde.T, sde.eps], dtype=torch.float64))
    lams = np.linspace(float(ends[0]), float(ends[1]), points)
    dev = next(iter(model.parameters()), torch.empty(0)).device if hasattr(model, "parameters") else "cpu"
    starts = range(0, x_uint8.shape[0], batch)
    # the dequantizer's u are drawn once per repeat and batch (its network is not cheap), uniform
    # ones afresh at each log-SNR as before
    dq_u = None if dequantizer is None else [
        [dequantizer.sample(x_uint8[s:s + batch], generator=generator)[0].float() for s in starts]
        for _ in range(repeats)]
    mse = []
    for lam in lams:
        t = float(sde.t_from_log_snr(torch.tensor(lam, dtype=torch.float64)))
        alpha, sigma = (float(v) for v in sde.marginal_coeffs(torch.tensor([t], dtype=torch.float64)))
        tot, n = 0.0, 0
        for r in range(repeats):
            for b, s in enumerate(starts):
                x = x_uint8[s:s + batch]
                u = torch.rand(x.shape, generator=generator) if dq_u is None else dq_u[r][b]
                y = pixels.to_model(x, u)
                e = torch.randn(y.shape, generator=generator)
                z = alpha * y + sigma * e
                eh = model(z.to(dev), torch.full((len(x),), t, device=dev)).float().cpu()
                tot += float(((e - eh) ** 2).sum())
                n += e.numel()
        mse.append(tot / n)
    table = {"log_snr": [float(v) for v in lams], "mse": [float(v) for v in mse]}
    if dequantizer is not None:
        table["u"] = "dequantizer"
    return table


def interpolate(table: dict | None, lam: np.ndarray) -> np.ndarray:
    """m(lam) by linear interpolation (0 without a table: the posterior variance)."""
    lam = np.asarray(lam, dtype=np.float64)
    if not table:
        return np.zeros_like(lam)
    return em.interp(lam, np.asarray(table["log_snr"], dtype=np.float64), np.asarray(table["mse"], dtype=np.float64))


# Density floor of `step_grid`, relative to c's scale (at most 1/16): keeps steps finite where
# c <= 0 (the excess's next order takes over) and the grid sane for data unlike the table's.
STEP_FLOOR = 1e-3


def step_nats(table: dict | None, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Expected nats per dimension of chain steps from log-SNR a to b > a (elementwise), in
    exactmath's arithmetic (the same bits on every machine: optimized_grid decides by them).

    Exact for a reverse step with the calibrated variance when m is the model's true mean
    denoising error at the step's noisier end (tested against Monte Carlo on Gaussian data).
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    m = torch.from_numpy(np.ascontiguousarray(interpolate(table, a)))
    return (0.5 * em.log1p(em.expm1(torch.from_numpy(np.ascontiguousarray(b - a))) * m)).numpy()


def chain_step_nats(table: dict | None, lam: np.ndarray) -> np.ndarray:
    """`step_nats` of each chain step between consecutive entries of `lam` (increasing)."""
    lam = np.asarray(lam, dtype=np.float64)
    return step_nats(table, lam[:-1], lam[1:])


def grid_excess_nats(table: dict | None, lam: np.ndarray) -> float:
    """Expected nats per dimension that a chain with latents at `lam` (increasing) costs above the
    continuous bound over the same range: its steps' `chain_step_nats` less 0.5 x the integral of
    m (exact: the integral of the table's piecewise-linear interpolant). What the number of steps
    and their placement cost, before any coding overhead; the reverse steps' first and last terms
    (the decoder p(y | z_1), the prior) are left out on both sides."""
    lam = np.asarray(lam, dtype=np.float64)
    knots = np.asarray(table["log_snr"], dtype=np.float64) if table else np.empty(0)
    pts = np.union1d(lam, knots[(knots > lam[0]) & (knots < lam[-1])])
    return float(chain_step_nats(table, lam).sum() - 0.5 * np.trapezoid(interpolate(table, pts), pts))


def chain_excess_bpd(table: dict | None, sde, ts: np.ndarray) -> float:
    """`grid_excess_nats` in bits/dim of a chain whose latents sit at times ts (any order)."""
    lam = np.sort(sde.log_snr(torch.from_numpy(np.asarray(ts, dtype=np.float64))).numpy())
    return grid_excess_nats(table, lam) / float(np.log(2.0))


def step_grid(table: dict | None, lam_lo: float, lam_hi: float, n: int, floor: float = STEP_FLOOR) -> np.ndarray:
    """n increasing log-SNRs from lam_lo to lam_hi (both exact), dense where the chain's excess is.

    Without a table (m = 0) c is 0 everywhere and the grid is uniform in log-SNR. Encoder and
    decoder must build the same grid: it takes only +, *, / and sqrt on float64, unfused
    (exactmath.interp and linspace, numpy's cumsum, diff and gradient, which are separate ufuncs
    or sequential loops), and is rounded to multiples of 2^-20, which makes a last-bit difference
    from another numpy version unlikely to move it (about 1e-7 per point), not impossible.
    """
    if n < 2:
        raise ValueError("a step grid needs at least 2 points")
    lam = em.linspace(lam_lo, lam_hi, 4097)
    m = interpolate(table, lam)
    c = np.maximum(m * (1.0 - m) - np.gradient(m, lam), 0.0) / 4.0
    dens = np.sqrt(c + floor)
    cdf = np.concatenate([[0.0], np.cumsum(0.5 * (dens[1:] + dens[:-1]) * np.diff(lam))])
    grid = np.round(em.interp(em.linspace(0.0, 1.0, n), cdf / cdf[-1], lam) * 2.0 ** 20) / 2.0 ** 20
    grid[0], grid[-1] = lam_lo, lam_hi
    return grid


# optimized_grid's search: red-black sweeps of a golden-section search per point. From
# step_grid's start 10 sweeps come within 0.0005 bits/dim of the converged optimum on the shipped
# models' tables (64 - 256 steps); each point is found to 0.618^24 of its interval.
OPT_SWEEPS = 10
OPT_ITERS = 24
_GOLDEN = 0.6180339887498949  # (sqrt(5) - 1) / 2, as a literal


def optimized_grid(table: dict | None, lam_lo: float, lam_hi: float, n: int) -> np.ndarray:
    """n increasing log-SNRs from lam_lo to lam_hi (both exact) that make the chain's expected cost,
    the sum of its steps' `chain_step_nats`, least: step_grid's grid moved point by point, each to
    the minimum of its two steps' cost between its neighbours (OPT_SWEEPS red-black sweeps).

    Unlike step_grid it sees the exact cost of coarse steps, and where m is near 1 it takes long
    steps (the shipped `photo`'s table: 0.050 instead of 0.056 bits/dim above the continuous bound
    at 64 steps, 0.016 instead of 0.025 at 128). Encoder and decoder must build the same grid, so
    every number comes from exactmath (interp, expm1, log1p: +, -, *, / only) and every decision
    from comparing such numbers: the grid is the same bits on every machine. Without a table
    (m = 0, all placements cost the same) it is step_grid's uniform grid. Rounded to multiples of
    2^-20 as step_grid's.
    """
    if not table or n < 3:
        return step_grid(table, lam_lo, lam_hi, n)
    key = (tuple(float(v) for v in table["log_snr"]), tuple(float(v) for v in table["mse"]))
    return _optimized_grid(key, float(lam_lo), float(lam_hi), int(n)).copy()


@lru_cache(maxsize=32)
def _optimized_grid(key: tuple, lam_lo: float, lam_hi: float, n: int) -> np.ndarray:
    table = {"log_snr": key[0], "mse": key[1]}
    lam = step_grid(table, lam_lo, lam_hi, n)
    for _ in range(OPT_SWEEPS):
        for first in (1, 2):
            i = np.arange(first, n - 1, 2)
            a, b = lam[i - 1], lam[i + 1]

            def cost(x: np.ndarray) -> np.ndarray:
                return step_nats(table, a, x) + step_nats(table, x, b)

            lo, hi = a.copy(), b.copy()
            x1, x2 = hi - _GOLDEN * (hi - lo), lo + _GOLDEN * (hi - lo)
            f1, f2 = cost(x1), cost(x2)
            for _ in range(OPT_ITERS):
                left = f1 < f2  # the minimum lies in [lo, x2]: x1 becomes the new x2
                hi, lo = np.where(left, x2, hi), np.where(left, lo, x1)
                x_new = np.where(left, hi - _GOLDEN * (hi - lo), lo + _GOLDEN * (hi - lo))
                f_new = cost(x_new)
                x1, x2 = np.where(left, x_new, x2), np.where(left, x1, x_new)
                f1, f2 = np.where(left, f_new, f2), np.where(left, f1, f_new)
            lam[i] = 0.5 * (lo + hi)
    out = np.round(lam * 2.0 ** 20) / 2.0 ** 20
    out[0], out[-1] = lam_lo, lam_hi
    if not np.all(np.diff(out) > 0):
        raise ValueError("the optimized step grid is not strictly increasing; use fewer steps")
    out.setflags(write=False)
    return out
