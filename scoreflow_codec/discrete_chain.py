"""The discrete-time variational diffusion chain y -> z_1 -> ... -> z_T (the codec's fast mode).

y = x + u is the dequantized image in model space, as the model was trained on (a chain started
from the pixel centres would feed the model data that look nothing like its training data below
the pixel scale, and cost about D/2 nats per unit of log-SNR there).
Forward (Markov): q(z_1 | y) = N(alpha_1 y, sigma_1^2), q(z_{i+1} | z_i) = N(a_i z_i, b_i^2) with
a_i = alpha_{i+1}/alpha_i and b_i^2 = sigma_{i+1}^2 - a_i^2 sigma_i^2, so q(z_i | y) = N(alpha_i y, sigma_i^2).
Reverse: p(z_i | z_{i+1}) = N(mean of q(z_i | z_{i+1}, y = y_hat(z_{i+1})), rev_std_i^2) with the model's
denoised y_hat and the variance calibrated to the model's denoising error (calibration.py);
p(y | z_1) = N(y_hat(z_1), (sigma_1/alpha_1)^2) (the Tweedie decoder of score_flow's eps term);
p(z_T) = the prior.
-ELBO(y) = E[-log p(y|z_1)] + sum_i KL(q(z_i|z_{i+1},y) || p(z_i|z_{i+1})) + KL(q(z_T|y) || p(z_T)),
and -log P(x) <= E_u[-ELBO(x + u) + log q(u | x)].
"""
from __future__ import annotations

from dataclasses import dataclass

import math

import numpy as np
import torch

from . import calibration, pixels
from .flow_steps import marginal_coeffs_np, time_grid
from .sde import SDE


@dataclass(frozen=True)
class ChainCoeffs:
    ts: np.ndarray        # [T] times of z_1..z_T
    alpha: np.ndarray     # [T]
    sigma: np.ndarray     # [T]
    a: np.ndarray         # [T-1]  q(z_{i+1}|z_i) mean factor
    b: np.ndarray         # [T-1]  q(z_{i+1}|z_i) std
    post_zc: np.ndarray   # [T-1]  posterior mean = post_zc * z_{i+1} + post_xc * x
    post_xc: np.ndarray   # [T-1]
    post_std: np.ndarray  # [T-1]  posterior std of z_i given z_{i+1}, x
    prior_std: float
    rev_std: np.ndarray   # [T-1]  std of the model's reverse step p(z_i | z_{i+1}) (calibration.py)

    @property
    def steps(self) -> int:
        return len(self.ts)


def chain_coeffs(sde: SDE, steps: int, t_start: float | None = None, schedule: str = "logsnr",
                 eps_mse: dict | None = None) -> ChainCoeffs:
    """Coefficients for a chain of `steps` latents from t_start (default sde.eps) to T.

    eps_mse: the model's denoising-error table (calibration.py); without it the reverse steps
    use the posterior variance. schedule: as flow_steps.time_grid ("calibrated" reads eps_mse too).
    """
    ts = time_grid(sde, max(steps - 1, 1), t_start=t_start, schedule=schedule, eps_mse=eps_mse)
    if steps == 1:
        ts = ts[:1]
    alpha, sigma = marginal_coeffs_np(sde, ts)
    a = alpha[1:] / alpha[:-1]
    b2 = sigma[1:] ** 2 - (a * sigma[:-1]) ** 2
    b = np.sqrt(b2)
    s2n = sigma[1:] ** 2
    post_zc = a * sigma[:-1] ** 2 / s2n
    post_xc = alpha[:-1] * b2 / s2n
    post_std = np.sqrt(sigma[:-1] ** 2 * b2 / s2n)
    lam_next = 2.0 * (sde.ops.log(alpha[1:]) - sde.ops.log(sigma[1:]))
    m = calibration.interpolate(eps_mse, lam_next)
    rev_std = np.sqrt(post_std ** 2 + (post_xc * sigma[1:] / alpha[1:]) ** 2 * m)
    return ChainCoeffs(ts, alpha, sigma, a, b, post_zc, post_xc, post_std, float(sde.prior_std()), rev_std)


def x_hat(eps: torch.Tensor, z: torch.Tensor, alpha: float, sigma: float) -> torch.Tensor:
    return (z - sigma * eps) / alpha


def gaussian_kl(m1, s1, m2, s2) -> torch.Tensor:
    """KL(N(m1, s1^2) || N(m2, s2^2)) summed over all but the first dim."""
    kl = torch.log(s2 / s1) + (s1 ** 2 + (m1 - m2) ** 2) / (2 * s2 ** 2) - 0.5
    return kl.flatten(1).sum(1)


@torch.no_grad()
def chain_elbo_terms(model, y: torch.Tensor, coeffs: ChainCoeffs, generator=None) -> torch.Tensor:
    """Single-sample Monte-Carlo estimate of -ELBO(y) in nats per image (y in model space, float64).

    Uses the analytic KL of every step (the usual low-variance form); its expectation is what
    the chain codec's codelength reaches, up to lattice effects.
    """
    y = y.to(torch.float64)
    n = y.shape[0]
    dev = next(iter(model.parameters()), torch.empty(0)).device if hasattr(model, "parameters") else "cpu"
    co = coeffs

    def eps_at(z, i):
        tt = torch.full((n,), float(co.ts[i]), dtype=torch.float32, device=dev)
        return model(z.to(torch.float32).to(dev), tt).to("cpu", torch.float64)

    # marginals suffice: each KL term only involves one z_{i+1} ~ q(z_{i+1} | y)
    zs = [co.alpha[i] * y + co.sigma[i] * torch.randn(y.shape, generator=generator, dtype=torch.float64)
          for i in range(co.steps)]
    tau = torch.tensor(co.sigma[0] / co.alpha[0], dtype=torch.float64)
    yh = x_hat(eps_at(zs[0], 0), zs[0], co.alpha[0], co.sigma[0])
    total = (0.5 * math.log(2 * math.pi) + torch.log(tau) + 0.5 * ((y - yh) / tau) ** 2).flatten(1).sum(1)
    for i in range(co.steps - 1):
        z_next = zs[i + 1]
        yh = x_hat(eps_at(z_next, i + 1), z_next, co.alpha[i + 1], co.sigma[i + 1])
        m_q = co.post_zc[i] * z_next + co.post_xc[i] * y
        m_p = co.post_zc[i] * z_next + co.post_xc[i] * yh
        total += gaussian_kl(m_q, torch.tensor(co.post_std[i], dtype=torch.float64), m_p,
                             torch.tensor(co.rev_std[i], dtype=torch.float64))
    s_T = torch.tensor(co.sigma[-1], dtype=torch.float64)
    total += gaussian_kl(co.alpha[-1] * y, s_T, torch.zeros_like(y), torch.tensor(co.prior_std, dtype=torch.float64))
    return total


@torch.no_grad()
def chain_elbo_bpd(model, x_uint8: torch.Tensor, dequantizer, coeffs: ChainCoeffs, generator=None) -> torch.Tensor:
    """Bits/dim of the discrete chain's bound on -log P(x) (one u and one chain sample per image)."""
    u, log_q = dequantizer.sample(x_uint8, generator=generator)
    y = pixels.to_model(x_uint8, u.to(torch.float64))
    return pixels.nats_to_bpd(chain_elbo_terms(model, y, coeffs, generator) + log_q.to(torch.float64).cpu(), y[0].numel())
