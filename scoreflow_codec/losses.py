"""Denoising score matching losses (Song et al. 2021; ScoreFlow likelihood weighting).

Notation: x_t = alpha_t x_0 + sigma_t z, z ~ N(0, I); grad log p_0t(x_t | x_0) = -z / sigma_t;
the model predicts eps_hat(x_t, t) and its score is s = -eps_hat / sigma_t, so
sigma_t (s - grad log p_0t) = z - eps_hat.

Every loss here is a one-sample unbiased estimate, per data point, of an integral over [eps, T]:

- "likelihood" (lambda = g^2): exactly the diffusion term of the ScoreFlow bound,
      0.5 * int_eps^T E_z[ g^2 (||s - grad log p_0t||^2 - ||grad log p_0t||^2) - 2 div f ] dt
  in nats per data point (summed over dims). The two subtracted terms don't depend on the model
  (same gradients as plain DSM) and make the value the bound's term. Both have closed-form
  expectations (E ||grad log p_0t||^2 = D / sigma_t^2; div f = drift_coef(t) D), so since 0.9.57 the
  estimate samples only the model's term and adds the rest exactly (`exact_part`):
      0.5 * int_eps^T g^2 E||s - grad log p_0t||^2 dt  +  exact_part,
      exact_part = -0.5 D int g^2 / sigma^2 dt - int div f dt = -0.5 D Z + D log(alpha_eps / alpha_T)
  with Z = log SNR(eps) - log SNR(T) (importance.py) and alpha' = drift_coef alpha. Sampling ||z||^2
  instead, as score_flow and 0.9.56 did, cancels some of the model term's noise near t = eps (where
  eps_hat - z is mostly -z) and adds its own everywhere: with one z per time sample its spread
  (Z sqrt(2 D) / 2 nats) was most of a 64-sample bound's (CIFAR-10 model: 0.054 bits/dim per image
  then, 0.027 now; and the same z draws shared by different images moved all their estimates
  together). Averaged over the data its minimum over models (the true score) is H(p_eps) - H(p_T),
  the entropies of the true marginals (for Gaussian data: 0.5 sum log(v_eps / v_T),
  v_t = alpha_t^2 s^2 + sigma_t^2). importance=True draws t ~ p(t) = g^2 / (sigma^2 Z) and weights by
  1/p(t) (the sampled term's weight is then Z exactly); importance=False draws t uniformly and
  weights by (T - eps).
- "original" (lambda = sigma_t^2, t uniform, the score_sde weighting):
      0.5 * int_eps^T sigma_t^2 E_z ||s - grad log p_0t||^2 dt = (T - eps) * 0.5 E ||eps_hat - z||^2.
"""
from __future__ import annotations

import functools

import torch

from .importance import ImportanceSampler

Tensor = torch.Tensor


def _sq(v: Tensor) -> Tensor:
    return v.reshape(v.shape[0], -1).pow(2).sum(1)


def _bcast(v: Tensor, x: Tensor) -> Tensor:
    return v.reshape(v.shape + (1,) * (x.dim() - 1))


def perturb(sde, x0: Tensor, t: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(x_t, z, sigma_t) with x_t = alpha_t x0 + sigma_t z."""
    z = torch.randn(x0.shape, generator=generator, dtype=x0.dtype, device=x0.device)
    mean, std = sde.marginal_prob(x0, t)
    return mean + _bcast(std, x0) * z, z, std


@functools.lru_cache(maxsize=8)
def _sampler(sde, eps: float) -> ImportanceSampler:
    """One ImportanceSampler per SDE and eps, not one per training step (its set-up reads two numbers
    out of tensors: in a step, that is work the GPU's queue does not need)."""
    return ImportanceSampler(sde, eps)


@functools.lru_cache(maxsize=32)
def exact_part(sde, eps: float, d: int) -> float:
    """-0.5 int_eps^T [g^2 d / sigma_t^2 + 2 div f] dt (nats; d dims): the part of the likelihood loss
    whose expectation needs no model, in closed form for every linear-drift SDE (module docstring)."""
    a = sde.marginal_coeffs(torch.tensor([eps, float(sde.T)], dtype=torch.float64))[0]
    return float(-0.5 * d * _sampler(sde, eps).Z + d * (torch.log(a[0]) - torch.log(a[1])))


def dsm_loss(
    model,
    x0: Tensor,
    weighting: str = "likelihood",
    importance: bool = True,
    generator: torch.Generator | None = None,
    eps: float | None = None,
    u: Tensor | None = None,
) -> Tensor:
    """Per-sample DSM loss in nats, [N]; see the module docstring for the exact scaling.

    `importance` applies to the likelihood weighting only ("original" always samples t uniformly).
    `u` [N] in [0, 1): the uniform variates that pick t (through p(t)'s inverse CDF, or t uniform);
    drawn from `generator` when not given. Stratified u lower the variance (`stratified_uniform`).
    """
    sde = model.sde
    eps = float(sde.eps if eps is None else eps)
    n, dev, dt = x0.shape[0], x0.device, x0.dtype
    if u is None:
        u = torch.rand(n, generator=generator, dtype=torch.float64, device=dev)
    if weighting == "likelihood":
        rest = exact_part(sde, eps, x0[0].numel())
        if importance:
            sampler = _sampler(sde, eps)
            t = sampler.icdf(u).to(dt)
            xt, z, _ = perturb(sde, x0, t, generator)
            # (1/p(t)) * g^2/sigma^2 = Z exactly
            return 0.5 * sampler.Z * _sq(model(xt, t) - z) + rest
        t = (eps + (sde.T - eps) * u).to(dt)
        xt, z, std = perturb(sde, x0, t, generator)
        w = (sde.T - eps) * sde.g2(t).to(dt) / (std * std)
        return 0.5 * w * _sq(model(xt, t) - z) + rest
    if weighting == "original":
        t = (eps + (sde.T - eps) * u).to(dt)
        xt, z, _ = perturb(sde, x0, t, generator)
        return 0.5 * (sde.T - eps) * _sq(model(xt, t) - z)
    raise ValueError(f"unknown weighting {weighting!r}; expected 'likelihood' or 'original'")


def stratified_uniform(k: int, n: int, generator: torch.Generator | None = None, device=None) -> Tensor:
    """[k, n] uniforms, column-wise stratified: row j lies in [j/k, (j+1)/k), jittered independently.

    Averaging a function over the k rows estimates its integral over [0, 1) without bias, with the
    variance left only within strata (VDM's low-discrepancy sampler uses the same idea over a batch).
    """
    jitter = torch.rand((k, n), generator=generator, dtype=torch.float64, device=device)
    rows = torch.arange(k, dtype=torch.float64, device=device).unsqueeze(1)
    return ((rows + jitter) / k).clamp(max=1.0 - 2.0**-53)


def systematic_uniform(k: int, n: int, generator: torch.Generator | None = None, device=None) -> Tensor:
    """[k, n] uniforms from one random shift per column: a shifted grid v_j = (j + c) / k, c ~ U[0, 1),
    folded by the tent map u = 1 - |2 v - 1|.

    The tent map keeps the uniform measure, so each u_j is uniform on [0, 1) and the mean over the k
    rows of a function is an unbiased estimate of its integral, as with stratified_uniform; but the
    rows' errors cancel instead of adding up: f(u(v)) is continuous and periodic in v, so for a
    smooth f the shifted rectangle rule's error is O(1/k^2) (k even: linear f exactly), where
    independent jitter leaves O(k^-1.5) and an unfolded shifted grid O((f(1) - f(0)) / k). The
    ScoreFlow bound's integrand over importance-sampled time is smooth: on 64x64 tiles of Kodak
    images 16 rows estimate a tile's bound to 0.047 bits/dim (rms, photo model), 16 independently
    jittered strata to 0.186, the rest being the noise z of each row (0.046). The rows are not
    independent, so stratified_se does not apply to them.
    """
    shift = torch.rand((1, n), generator=generator, dtype=torch.float64, device=device)
    v = (torch.arange(k, dtype=torch.float64, device=device).unsqueeze(1) + shift) / k
    return (1.0 - (2.0 * v - 1.0).abs()).clamp(max=1.0 - 2.0**-53)
