"""Importance sampling of t for the likelihood-weighted DSM loss and the ScoreFlow bound.

p(t) is proportional to g(t)^2 / sigma_t^2 on [eps, T]. For every linear-drift SDE with
alpha' = f_coef * alpha and g^2 = d(sigma^2)/dt - 2 f_coef sigma^2 (VP, sub-VP and VE all qualify),

    -d(log SNR)/dt = -2 alpha'/alpha + (sigma^2)'/sigma^2 = -2 f_coef + (g^2 + 2 f_coef sigma^2)/sigma^2
                   = g^2 / sigma^2,        with log SNR = log(alpha^2 / sigma^2),

so log-SNR is uniform under p(t): sampling is t = t_from_log_snr(uniform in [lam_T, lam_eps]),
the normaliser is Z = lam_eps - lam_T, and no table or bisection is needed.
"""
from __future__ import annotations

import torch

from .sde import SDE

Tensor = torch.Tensor


class ImportanceSampler:
    """p(t) = g(t)^2 / (sigma_t^2 Z) on [eps, T]; the weight of a sample in an integral is Z sigma^2/g^2."""

    def __init__(self, sde: SDE, eps: float | None = None):
        self.sde = sde
        self.eps = float(sde.eps if eps is None else eps)
        self.T = float(sde.T)
        ends = sde.log_snr(torch.tensor([self.eps, self.T], dtype=torch.float64))
        self.lam_eps = float(ends[0])
        self.lam_T = float(ends[1])
        self.Z = self.lam_eps - self.lam_T

    def icdf(self, u: Tensor) -> Tensor:
        """Inverse CDF: u in [0, 1] -> t in [eps, T] (float64 inside)."""
        lam = self.lam_eps - u.to(torch.float64) * self.Z
        t = self.sde.t_from_log_snr(lam)
        return t.clamp(self.eps, self.T)

    def cdf(self, t: Tensor) -> Tensor:
        return (self.lam_eps - self.sde.log_snr(t.to(torch.float64))) / self.Z

    def sample(
        self,
        n: int,
        generator: torch.Generator | None = None,
        device=None,
        dtype: torch.dtype = torch.float32,
    ) -> Tensor:
        u = torch.rand(n, generator=generator, dtype=torch.float64, device=device)
        return self.icdf(u).to(dtype)

    def pdf(self, t: Tensor) -> Tensor:
        t64 = t.to(torch.float64)
        _, sigma = self.sde.marginal_coeffs(t64)
        p = self.sde.g2(t64) / (sigma * sigma) / self.Z
        inside = (t64 >= self.eps) & (t64 <= self.T)
        return torch.where(inside, p, torch.zeros_like(p)).to(t.dtype)

    def weight(self, t: Tensor) -> Tensor:
        """1 / pdf(t) = Z sigma_t^2 / g(t)^2: multiply an integrand by it to estimate its integral."""
        t64 = t.to(torch.float64)
        _, sigma = self.sde.marginal_coeffs(t64)
        return (self.Z * sigma * sigma / self.sde.g2(t64)).to(t.dtype)
