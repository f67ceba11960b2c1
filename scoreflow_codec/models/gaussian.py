"""Exact score model for Gaussian data x_0 ~ N(mu, diag(s^2)) in model space, under any SDE.

Every marginal is Gaussian, p_t = N(alpha_t mu, v_t) per dimension with v_t = alpha_t^2 s^2 + sigma_t^2,
so the score, the eps-prediction, the marginal density and the probability-flow map are closed form.
Used as the "complete model" in tests of the likelihood code and the codecs. Arithmetic is float64;
outputs come back in the input's dtype.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..sde import SDE

Tensor = torch.Tensor


class GaussianScoreModel(nn.Module):
    def __init__(self, sde: SDE, mu: Tensor, s: Tensor):
        super().__init__()
        if mu.shape != s.shape:
            raise ValueError(f"mu {tuple(mu.shape)} and s {tuple(s.shape)} differ in shape")
        if not bool((s > 0).all()):
            raise ValueError("s must be positive")
        self.sde = sde
        self.register_buffer("mu", mu.detach().to(torch.float64).clone())
        self.register_buffer("s", s.detach().to(torch.float64).clone())

    # --- helpers --------------------------------------------------------------------------
    def _coeffs(self, t, n: int) -> tuple[Tensor, Tensor, Tensor]:
        """(alpha, sigma, v) broadcastable against [n, *mu.shape], float64."""
        # python floats straight to float64 (as_tensor would round them to float32 first)
        t = torch.as_tensor(t, dtype=None if torch.is_tensor(t) else torch.float64, device=self.mu.device)
        t = t.to(torch.float64)
        if t.dim() == 0:
            t = t.expand(n)
        alpha, sigma = self.sde.marginal_coeffs(t)
        shape = (n,) + (1,) * self.mu.dim()
        alpha, sigma = alpha.reshape(shape), sigma.reshape(shape)
        v = alpha * alpha * self.s * self.s + sigma * sigma
        return alpha, sigma, v

    def exact(self) -> "GaussianScoreModel":
        """The same model with exactmath's SDE coefficients: forward is then the same bits on any
        machine (its other operations are IEEE basic ones), as the codec's exact arithmetic needs."""
        out = GaussianScoreModel(self.sde.exact(), self.mu, self.s)
        return out

    # --- ScoreModel interface -------------------------------------------------------------
    def forward(self, x: Tensor, t) -> Tensor:
        """eps_hat = -sigma_t * score = sigma_t (x - alpha_t mu) / v_t."""
        alpha, sigma, v = self._coeffs(t, x.shape[0])
        return (sigma * (x.to(torch.float64) - alpha * self.mu) / v).to(x.dtype)

    def score(self, x: Tensor, t) -> Tensor:
        alpha, _, v = self._coeffs(t, x.shape[0])
        return (-(x.to(torch.float64) - alpha * self.mu) / v).to(x.dtype)

    # --- exact densities and flow ---------------------------------------------------------
    def log_prob_t(self, x: Tensor, t) -> Tensor:
        """log p_t(x) of the true marginal at time t, [N] (summed over dims)."""
        alpha, _, v = self._coeffs(t, x.shape[0])
        r = x.to(torch.float64) - alpha * self.mu
        lp = -0.5 * (math.log(2 * math.pi) + torch.log(v) + r * r / v)
        return lp.reshape(x.shape[0], -1).sum(1).to(x.dtype)

    def flow_map(self, x: Tensor, t_from, t_to) -> Tensor:
        """The probability-flow ODE solution from t_from to t_to (an affine map per dimension)."""
        n = x.shape[0]
        a0, _, v0 = self._coeffs(t_from, n)
        a1, _, v1 = self._coeffs(t_to, n)
        return (a1 * self.mu + torch.sqrt(v1 / v0) * (x.to(torch.float64) - a0 * self.mu)).to(x.dtype)

    def ode_nll(self, y: Tensor, eps: float | None = None) -> tuple[Tensor, Tensor]:
        """Exact -log p_eps(y) [N] of the ODE model started from the SDE's prior, and z_T.

        This is what `likelihood.ode_nll_continuous` computes numerically: the prior is the SDE's
        pi, not the true p_T, so it differs from -log_prob_t(y, eps) by the (tiny) prior mismatch.
        """
        eps = self.sde.eps if eps is None else eps
        n = y.shape[0]
        z = self.flow_map(y.to(torch.float64), eps, self.sde.T)
        _, _, v0 = self._coeffs(eps, n)
        _, _, v1 = self._coeffs(self.sde.T, n)
        log_det = 0.5 * torch.log(v1 / v0).expand(y.shape).reshape(n, -1).sum(1)
        nll = -self.sde.prior_logp(z) - log_det
        return nll.to(y.dtype), z.to(y.dtype)
