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
least when the density of steps goes as sqrt(c).
"""
from __future__ import annotations

import numpy as np
import torch

from . import exactmath as em
from . import pixels


@torch.no_grad()
def eps_mse_table(model, x_uint8: torch.Tensor, points: int = 65, repeats: int = 2, batch: int = 64,
                  generator: torch.Generator | None = None) -> dict:
    """{"log_snr": [...] increasing, "mse": [...]} on `points` log-SNR values spanning [T, eps]."""
    sde = model.sde
    ends = sde.log_snr(torch.tensor([sde.T, sde.eps], dtype=torch.float64))
    lams = np.linspace(float(ends[0]), float(ends[1]), points)
    dev = next(iter(model.parameters()), torch.empty(0)).device if hasattr(model, "parameters") else "cpu"
    mse = []
    for lam in lams:
        t = float(sde.t_from_log_snr(torch.tensor(lam, dtype=torch.float64)))
        alpha, sigma = (float(v) for v in sde.marginal_coeffs(torch.tensor([t], dtype=torch.float64)))
        tot, n = 0.0, 0
        for _ in range(repeats):
            for s in range(0, x_uint8.shape[0], batch):
                x = x_uint8[s:s + batch]
                y = pixels.to_model(x, torch.rand(x.shape, generator=generator))
                e = torch.randn(y.shape, generator=generator)
                z = alpha * y + sigma * e
                eh = model(z.to(dev), torch.full((len(x),), t, device=dev)).float().cpu()
                tot += float(((e - eh) ** 2).sum())
                n += e.numel()
        mse.append(tot / n)
    return {"log_snr": [float(v) for v in lams], "mse": [float(v) for v in mse]}


def interpolate(table: dict | None, lam: np.ndarray) -> np.ndarray:
    """m(lam) by linear interpolation (0 without a table: the posterior variance)."""
    lam = np.asarray(lam, dtype=np.float64)
    if not table:
        return np.zeros_like(lam)
    return em.interp(lam, np.asarray(table["log_snr"], dtype=np.float64), np.asarray(table["mse"], dtype=np.float64))


# Density floor of `step_grid`, relative to c's scale (at most 1/16): keeps steps finite where
# c <= 0 (the excess's next order takes over) and the grid sane for data unlike the table's.
STEP_FLOOR = 1e-3


def chain_step_nats(table: dict | None, lam: np.ndarray) -> np.ndarray:
    """Expected nats per dimension of each chain step between consecutive entries of `lam` (increasing).

    Exact for a reverse step with the calibrated variance when m is the model's true mean
    denoising error at the step's noisier end (tested against Monte Carlo on Gaussian data).
    """
    lam = np.asarray(lam, dtype=np.float64)
    return 0.5 * np.log1p(np.expm1(np.diff(lam)) * interpolate(table, lam[:-1]))


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
