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


def expected_step_nats(coeffs: ChainCoeffs, table: dict | None) -> np.ndarray | None:
    """Each reverse step's expected KL term in nats per dim (calibration.step_nats of the step from
    log-SNR lambda_{i+1} to lambda_i), chain order: chain_elbo_terms's step_weights; None without
    a table (the terms are then not predicted)."""
    if not table:
        return None
    lam = 2.0 * (np.log(coeffs.alpha) - np.log(coeffs.sigma))  # decreasing along the chain
    return calibration.step_nats(table, lam[1:], lam[:-1])


def sample_probs(weights: np.ndarray, k: int) -> np.ndarray:
    """Inclusion probabilities of a sample of k of len(weights) items proportional to the weights,
    capped at 1 (the capped ones always drawn, the rest shared out again), summing to k."""
    w = np.maximum(np.asarray(weights, dtype=np.float64), 0.0)
    n = len(w)
    if k >= n:
        return np.ones(n)
    if not np.any(w > 0):
        w = np.ones(n)
    w = np.where(w > 0, w, w[w > 0].min() * 1e-3)  # every step can be drawn (unbiased)
    certain = np.zeros(n, dtype=bool)
    while True:
        share = (k - certain.sum()) * w / w[~certain].sum()
        over = ~certain & (share >= 1.0)
        if not over.any():
            return np.where(certain, 1.0, share)
        certain |= over


@torch.no_grad()
def chain_elbo_terms(model, y: torch.Tensor, coeffs: ChainCoeffs, generator=None, steps: int | None = None,
                     step_weights: np.ndarray | None = None) -> torch.Tensor:
    """Single-sample Monte-Carlo estimate of -ELBO(y) in nats per image (y in model space, float64).

    Uses the analytic KL of every step (the usual low-variance form); its expectation is what
    the chain codec's codelength reaches, up to lattice effects. Each KL term involves one
    z_{i+1} ~ q(z_{i+1} | y), so the marginals suffice.

    steps: how many of the T - 1 reverse steps' KL terms to evaluate per image (None or T - 1 and
    more: all, in order), in steps + 1 network calls instead of T. Fewer: a systematic sample with
    inclusion probabilities pi_i (sample_probs: proportional to step_weights, the steps' expected
    terms, capped at 1; equal without them), each drawn term weighted 1 / pi_i, so the estimate is
    unbiased: the steps whose intervals [C_i, C_i + pi_i) on [0, steps) (C: the cumulative sum)
    hold one of the points u + j, j < steps, u uniform per image; pi_i <= 1, so none twice. The
    terms are far from equal (on a photo tile of 64 steps, every other step drawn at equal
    probabilities left 0.19 bits/dim of spread against 0.010 from all): weigh them.
    """
    y = y.to(torch.float64)
    n, place = y.shape[0], y.device  # the draws and the float64 sums on y's device (generator's too)
    dev = next(iter(model.parameters()), torch.empty(0)).device if hasattr(model, "parameters") else "cpu"
    co = coeffs
    f64 = {name: torch.from_numpy(np.ascontiguousarray(getattr(co, name), dtype=np.float64)).to(place)
           for name in ("ts", "alpha", "sigma", "post_xc", "post_std", "rev_std")}
    last = co.steps - 1  # the reverse steps' KL terms: i = 0 .. last - 1

    def per_image(name: str, i: torch.Tensor) -> torch.Tensor:
        return f64[name][i].view(-1, *([1] * (y.dim() - 1)))

    def eps_at(z, i):
        tt = f64["ts"][i].to(torch.float32).to(dev)
        return model(z.to(torch.float32).to(dev), tt).to(place, torch.float64)

    def z_at(i):
        noise = torch.randn(y.shape, generator=generator, dtype=torch.float64, device=place)
        return per_image("alpha", i) * y + per_image("sigma", i) * noise

    first = torch.zeros(n, dtype=torch.long, device=place)
    z0 = z_at(first)
    tau = torch.tensor(co.sigma[0] / co.alpha[0], dtype=torch.float64, device=place)
    yh = x_hat(eps_at(z0, first), z0, per_image("alpha", first), per_image("sigma", first))
    total = (0.5 * math.log(2 * math.pi) + torch.log(tau) + 0.5 * ((y - yh) / tau) ** 2).flatten(1).sum(1)
    if steps is None or steps >= last:
        k, inv_pi = last, torch.ones(last, dtype=torch.float64, device=place)
        idx = torch.arange(last, device=place).expand(n, last)
    else:
        k = max(1, int(steps))
        pi = torch.from_numpy(sample_probs(step_weights if step_weights is not None else np.ones(last), k)).to(place)
        edges = torch.cumsum(pi, 0)  # step i holds the points in [edges_i - pi_i, edges_i)
        edges[-1] = float(k)  # the sum's rounding: no point past the last step
        u = torch.rand(n, generator=generator, dtype=torch.float64, device=place)
        points = torch.arange(k, dtype=torch.float64, device=place)[None] + u[:, None]
        idx = torch.searchsorted(edges, points, right=True).clamp(max=last - 1)
        inv_pi = 1.0 / pi
    for j in range(k):
        i = idx[:, j]
        z_next = z_at(i + 1)
        yh = x_hat(eps_at(z_next, i + 1), z_next, per_image("alpha", i + 1), per_image("sigma", i + 1))
        # q's and p's means differ by post_xc (y - y_hat): the rest of the mean (post_zc z_{i+1}) cancels
        total += inv_pi[i] * gaussian_kl(per_image("post_xc", i) * y, per_image("post_std", i),
                                      per_image("post_xc", i) * yh, per_image("rev_std", i))
    s_T = torch.tensor(co.sigma[-1], dtype=torch.float64, device=place)
    prior_std = torch.tensor(co.prior_std, dtype=torch.float64, device=place)
    total += gaussian_kl(co.alpha[-1] * y, s_T, torch.zeros_like(y), prior_std)
    return total


@torch.no_grad()
def chain_elbo_bpd(model, x_uint8: torch.Tensor, dequantizer, coeffs: ChainCoeffs, generator=None,
                   steps: int | None = None, step_weights: np.ndarray | None = None) -> torch.Tensor:
    """Bits/dim of the discrete chain's bound on -log P(x) (one u and one chain sample per image;
    steps, step_weights: chain_elbo_terms's sample of the reverse steps)."""
    u, log_q = dequantizer.sample(x_uint8, generator=generator)
    y = pixels.to_model(x_uint8, u.to(torch.float64))
    terms = chain_elbo_terms(model, y, coeffs, generator, steps, step_weights).cpu()
    return pixels.nats_to_bpd(terms + log_q.to(torch.float64).cpu(), y[0].numel())
