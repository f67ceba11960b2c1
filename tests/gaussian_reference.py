"""Closed-form references for Gaussian data, written from the formulas and independent of the library.

Data x_0 ~ N(mu, diag(s^2)); "k-model": eps_hat = k * sigma (x - alpha mu) / v, i.e. the score
s(x, t) = -k (x - alpha mu) / v with v = alpha^2 s^2 + sigma^2 (k = 1 is the exact score).
All in float64; per-dimension formulas summed over dimensions; x0 has shape [N, *mu.shape].
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch


def _coef(sde, t: torch.Tensor, s: torch.Tensor):
    t = torch.as_tensor(t, dtype=torch.float64)
    a, sig = sde.marginal_coeffs(t)
    return a, sig, a * a * s * s + sig * sig, sde.g2(t), sde.drift_coef(t)


def _sum(v: torch.Tensor, n: int) -> torch.Tensor:
    return v.expand(n, *v.shape[1:]).reshape(n, -1).sum(1)


def expected_integrand(sde, mu, s, x0, t: float, k: float = 1.0) -> torch.Tensor:
    """E_z of 0.5 [g^2 (||s - grad log p_0t||^2 - ||grad log p_0t||^2) - 2 div f] at time t, [N].

    Per dim, with x = alpha x0 + sigma z, d = x0 - mu: s = -k (alpha d + sigma z) / v, grad = -z / sigma,
    E[s^2] = k^2 (alpha^2 d^2 + sigma^2) / v^2 and E[s grad] = k / v.
    """
    a, sig, v, g2, fc = _coef(sde, t, s)
    d = x0 - mu
    per = g2 * (k * k * (a * a * d * d + sig * sig) / v**2 - 2 * k / v) - 2 * fc
    return 0.5 * _sum(per, x0.shape[0])


def expected_dsm(sde, mu, s, x0, t: float, k: float = 1.0) -> torch.Tensor:
    """E_z ||s - grad log p_0t||^2, [N] (the plain DSM integrand l(t))."""
    a, sig, v, g2, fc = _coef(sde, t, s)
    d = x0 - mu
    per = k * k * (a * a * d * d + sig * sig) / v**2 - 2 * k / v + 1 / sig**2
    return _sum(per, x0.shape[0])


@functools.lru_cache(maxsize=None)
def leggauss(n: int):
    return np.polynomial.legendre.leggauss(n)  # O(n^3): cache it


def integrate_in_log_snr(sde, fn, eps: float, n: int = 400) -> torch.Tensor:
    """int_eps^T fn(t) dt by Gauss-Legendre in log-SNR (dt = -sigma^2/g^2 dlam), smooth there."""
    lam = sde.log_snr(torch.tensor([eps, sde.T], dtype=torch.float64))
    nodes, weights = leggauss(n)
    lo, hi = float(lam[1]), float(lam[0])
    total = 0.0
    for x, w in zip(nodes, weights):
        la = torch.tensor(0.5 * (hi - lo) * x + 0.5 * (hi + lo), dtype=torch.float64)
        t = sde.t_from_log_snr(la)
        _, sig = sde.marginal_coeffs(t)
        total = total + 0.5 * (hi - lo) * w * fn(t) * sig**2 / sde.g2(t)
    return total


def expected_bound(sde, mu, s, x0, k: float = 1.0, eps: float | None = None) -> dict:
    """Expectations of the bound terms given x0 (nats, [N]): prior, diffusion, eps_term."""
    eps = sde.eps if eps is None else eps
    n, dim = x0.shape[0], x0[0].numel()
    aT, sT, *_ = _coef(sde, sde.T, s)
    p2 = sde.prior_std() ** 2
    prior = 0.5 * dim * math.log(2 * math.pi * p2) + 0.5 * (aT**2 * x0.reshape(n, -1).pow(2).sum(1) + dim * sT**2) / p2
    diffusion = integrate_in_log_snr(sde, lambda t: expected_integrand(sde, mu, s, x0, t, k), eps)
    a, sig, v, *_ = _coef(sde, eps, s)
    d = x0 - mu
    # eps_hat - z = k sigma alpha d / v + (k sigma^2 / v - 1) z
    e2 = (k * sig * a * d / v) ** 2 + (k * sig * sig / v - 1) ** 2
    eps_term = -dim * math.log(float(a)) + 0.5 * _sum(e2, n) - 0.5 * dim
    return {"prior": prior, "diffusion": diffusion, "eps_term": eps_term}


def _backward_moments(sde, mu, s, k: float, eps: float, ode: bool, steps: int = 1000):
    """Mean and variance at eps of the reverse SDE (ode=False) or ODE (ode=True) of the k-model from pi.

    Forward-time drift of the reverse process: (f + g^2 k / v) x - g^2 k alpha mu / v (SDE) or half the
    score part (ODE); the reverse SDE adds g^2 |dt| of variance: dP/dt = 2 A P - g^2.
    """
    c = 0.5 if ode else 1.0

    def rhs(t, state):
        m, p = state
        a, sig, v, g2, fc = _coef(sde, t, s)
        A = fc + c * g2 * k / v
        dp = 2 * A * p - (0.0 if ode else g2)
        return A * m - c * g2 * k * a * mu / v, dp

    # classical RK4 in lam = log-SNR (dt/dlam = -sigma^2/g^2), from lam_T up to lam_eps: smooth there;
    # 1000 steps agree with 4000 to 1e-7 relative
    lam = sde.log_snr(torch.tensor([sde.T, eps], dtype=torch.float64))
    h = (lam[1] - lam[0]) / steps

    def f(la, y):
        t = sde.t_from_log_snr(la)
        _, sig = sde.marginal_coeffs(t)
        dm, dp = rhs(t, y)
        w = -sig * sig / sde.g2(t)
        return dm * w, dp * w

    y = (torch.zeros_like(mu), torch.full_like(mu, sde.prior_std() ** 2))
    la = lam[0]
    for _ in range(steps):
        k1 = f(la, y)
        k2 = f(la + h / 2, tuple(a + h / 2 * b for a, b in zip(y, k1)))
        k3 = f(la + h / 2, tuple(a + h / 2 * b for a, b in zip(y, k2)))
        k4 = f(la + h, tuple(a + h * b for a, b in zip(y, k3)))
        y = tuple(a + h / 6 * (b1 + 2 * b2 + 2 * b3 + b4) for a, b1, b2, b3, b4 in zip(y, k1, k2, k3, k4))
        la = la + h
    return y


def _gauss_nll(x, m, p) -> torch.Tensor:
    per = 0.5 * (math.log(2 * math.pi) + torch.log(p) + (x - m) ** 2 / p)
    return per.reshape(x.shape[0], -1).sum(1)


def ode_model_nll(sde, mu, s, y, k: float = 1.0, eps: float | None = None) -> torch.Tensor:
    """Exact -log p_eps(y) of the probability-flow ODE of the k-model started at pi."""
    eps = sde.eps if eps is None else eps
    m, p = _backward_moments(sde, mu, s, k, eps, ode=True)
    return _gauss_nll(y, m, p)


def sde_model_nll(sde, mu, s, x0, k: float = 1.0, eps: float | None = None) -> torch.Tensor:
    """Exact -log p_theta(x0) of the model the corrected bound bounds: reverse SDE of the k-model from pi
    down to eps, then the Gaussian decoder N((x + sigma^2 s) / alpha, sigma^2 / alpha^2)."""
    eps = sde.eps if eps is None else eps
    m, p = _backward_moments(sde, mu, s, k, eps, ode=False)
    a, sig, v, *_ = _coef(sde, eps, s)
    c1 = (1 - k * sig * sig / v) / a
    c0 = k * sig * sig * mu / v
    return _gauss_nll(x0, c1 * m + c0, c1 * c1 * p + sig * sig / (a * a))


class ScaledModel(torch.nn.Module):
    """The k-model: k times another model's eps_hat (k = 1: that model)."""

    def __init__(self, model: torch.nn.Module, k: float):
        super().__init__()
        self.inner, self.k, self.sde = model, k, model.sde

    def forward(self, x, t):
        return self.k * self.inner(x, t)


def gaussian_setup(kind: str, shape: tuple, seed: int = 0):
    """(sde, mu, s, exact model, generator) for Gaussian data with random per-dim mean and std."""
    from scoreflow_codec.models.gaussian import GaussianScoreModel
    from scoreflow_codec.sde import SDEConfig, make_sde

    sde = make_sde(SDEConfig(kind=kind))
    gen = torch.Generator().manual_seed(seed)
    mu = torch.rand(shape, generator=gen, dtype=torch.float64) * 0.6 - 0.3
    s = torch.rand(shape, generator=gen, dtype=torch.float64) * 0.4 + 0.1
    return sde, mu, s, GaussianScoreModel(sde, mu, s), gen
