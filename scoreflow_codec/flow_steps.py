"""The probability-flow ODE discretized along a fixed time grid: the flow the codec codes through.

For all three SDEs the marginals are x_t = alpha_t x_0 + sigma_t z, and the probability-flow ODE
in eps-parametrization reads d(x/alpha) = eps_hat(x, t) d(sigma/alpha). One first-order
(exponential-integrator, "DDIM") step from t_k to t_{k+1} is therefore

    F_k(y) = a_k * y + c_k * eps_hat(y, t_k),  a_k = alpha_{k+1}/alpha_k,  c_k = sigma_{k+1} - a_k sigma_k,

which is exact for the linear part of the drift, so its Jacobian a_k I + c_k d(eps_hat)/dy stays
close to a_k I when the grid is uniform in log-SNR. The composition F_{K-1} o ... o F_0 is an
invertible map (for small steps) whose density converges to the ODE's as K grows.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from . import calibration
from . import exactmath as em
from .sde import SDE

EpsFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def time_grid(sde: SDE, steps: int, t_start: float | None = None, t_end: float | None = None,
              schedule: str = "logsnr", eps_mse: dict | None = None) -> np.ndarray:
    """K+1 increasing times from t_start (default sde.eps) to t_end (default sde.T), float64.

    schedule: "logsnr" (uniform in log-SNR), "uniform" (in t), "calibrated" (log-SNRs of
    calibration.step_grid from the model's eps-MSE table; uniform in log-SNR without one) or
    "optimized" (calibration.optimized_grid: the chain's least expected cost under that table).
    """
    if steps < 1:
        raise ValueError("steps must be >= 1")
    t0 = sde.eps if t_start is None else float(t_start)
    t1 = sde.T if t_end is None else float(t_end)
    if schedule in ("logsnr", "calibrated", "optimized"):
        ends = torch.tensor([t0, t1], dtype=torch.float64)
        lam = sde.log_snr(ends)
        if schedule == "logsnr":
            lams = sde.ops.linspace(float(lam[0]), float(lam[1]), steps + 1)
        else:  # the grids run from low to high log-SNR, this one from t0 (high) to t1 (low)
            grid = calibration.step_grid if schedule == "calibrated" else calibration.optimized_grid
            lams = torch.from_numpy(grid(eps_mse, float(lam[1]), float(lam[0]), steps + 1)[::-1].copy())
        ts = sde.t_from_log_snr(lams).numpy()
        ts[0], ts[-1] = t0, t1  # exact end points despite round-off in the inverse
    elif schedule == "uniform":
        ts = em.linspace(t0, t1, steps + 1) if sde.ops.exact else np.linspace(t0, t1, steps + 1)
    else:
        raise ValueError(f"unknown schedule {schedule!r} (logsnr | uniform | calibrated | optimized)")
    if not np.all(np.diff(ts) > 0):
        raise ValueError("time grid is not strictly increasing; use fewer steps")
    return ts


def marginal_coeffs_np(sde: SDE, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a, s = sde.marginal_coeffs(torch.as_tensor(ts, dtype=torch.float64))
    return a.numpy(), s.numpy()


def ddim_coeffs(sde: SDE, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(a_k, c_k) of F_k(y) = a_k y + c_k eps_hat(y, t_k) for k = 0..K-1."""
    alpha, sigma = marginal_coeffs_np(sde, ts)
    a = alpha[1:] / alpha[:-1]
    c = sigma[1:] - a * sigma[:-1]
    return a, c


def step(eps_fn: EpsFn, y: torch.Tensor, t: float, a: float, c: float) -> torch.Tensor:
    tt = torch.full((y.shape[0],), t, dtype=y.dtype, device=y.device)
    return a * y + c * eps_fn(y, tt)


def inverse_step(eps_fn: EpsFn, y_next: torch.Tensor, t: float, a: float, c: float,
                 iters: int) -> torch.Tensor:
    """F^{-1} by fixed-point iteration y <- (y_next - c eps(y, t)) / a, started at y = y_next / a.

    Converges when |c/a| * ||d eps/dy|| < 1, i.e. for steps that are small in log-SNR.
    """
    tt = torch.full((y_next.shape[0],), t, dtype=y_next.dtype, device=y_next.device)
    y = y_next / a
    for _ in range(iters):
        y = (y_next - c * eps_fn(y, tt)) / a
    return y


def flow_nll_exact(eps_fn: EpsFn, sde: SDE, y0: torch.Tensor, ts: np.ndarray) -> torch.Tensor:
    """-log density of y0 under the discrete flow, with exact log-determinants (small D only).

    Reference for tests: the codec's codelength minus this is its bits-back overhead; this minus
    the ODE NLL is the discretization error of the K-step flow.
    """
    a, c = ddim_coeffs(sde, ts)
    y = y0.detach().to(torch.float64)
    logdet = torch.zeros(y.shape[0], dtype=torch.float64)
    for k in range(len(a)):
        for i in range(y.shape[0]):
            yi = y[i:i + 1]
            J = torch.autograd.functional.jacobian(
                lambda v: step(eps_fn, v.reshape(yi.shape), float(ts[k]), float(a[k]), float(c[k])).reshape(-1),
                yi.reshape(-1))
            logdet[i] += torch.linalg.slogdet(J)[1]
        with torch.no_grad():
            y = step(eps_fn, y, float(ts[k]), float(a[k]), float(c[k]))
    return -sde.prior_logp(y) - logdet
