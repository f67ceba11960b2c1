"""Likelihoods of a score model: the ScoreFlow bound and the probability-flow ODE NLL.

All densities are in model space (nats); `pixels.nats_to_bpd` adds the pixel Jacobian. With a
dequantizer q(u | x) and y = x + u, -log P(x) <= E_q[-log p(y) + log q(u | x)], which is what both
bits/dim functions report (one u per image).
"""
from __future__ import annotations

import logging
import math

import torch

from . import pixels
from .losses import dsm_loss, perturb, stratified_uniform, systematic_uniform

Tensor = torch.Tensor
log = logging.getLogger(__name__)


def _sq(v: Tensor) -> Tensor:
    return v.reshape(v.shape[0], -1).pow(2).sum(1)


def seeded(seed: int, device="cpu") -> torch.Generator:
    """A seeded generator for draws made on `device`. Torch draws on a CUDA device only from a CUDA
    generator (a CPU one raises "Expected a 'cuda' device type for generator"): until 0.9.39 `sfcodec
    eval --device cuda` and the estimates of `compress --device cuda` made theirs with a CPU one. On a
    CPU the same draws as torch.Generator().manual_seed(seed)."""
    return torch.Generator(device=torch.device(device)).manual_seed(seed)


class DrawnDequantization:
    """One draw (u, log q(u | x)) of a dequantizer, handed out again on every `sample` call: the
    bound and the ODE NLL of the very same y = x + u, so their difference carries no u-noise."""

    def __init__(self, dequantizer, x_uint8: Tensor, generator: torch.Generator | None = None):
        with torch.no_grad():
            self.u, self.log_q = dequantizer.sample(x_uint8, generator=generator)

    def sample(self, x_uint8: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        if x_uint8.shape != self.u.shape:
            raise ValueError(f"drawn for shape {tuple(self.u.shape)}, asked for {tuple(x_uint8.shape)}")
        return self.u, self.log_q


# --- the bound ----------------------------------------------------------------------------
def prior_term(sde, y: Tensor) -> Tensor:
    """E[-log pi(x_T)], x_T = alpha_T y + sigma_T z: a Gaussian expectation, so closed form [N]."""
    n, d = y.shape[0], y[0].numel()
    tT = torch.full((n,), sde.T, dtype=torch.float64, device=y.device)
    a, s = sde.marginal_coeffs(tT)
    p2 = sde.prior_std() ** 2
    quad = (a * a * _sq(y.to(torch.float64)) + d * s * s) / p2
    return (0.5 * d * math.log(2 * math.pi * p2) + 0.5 * quad).to(y.dtype)


def eps_term(model, y: Tensor, eps: float | None = None, generator: torch.Generator | None = None) -> Tensor:
    """The t = eps correction of score_flow's bound_likelihood.py, one-sample estimate [N].

    Decoder N(y; (x_eps + sigma^2 s) / alpha, sigma^2 / alpha^2 I) (Tweedie) minus the entropy of
    p_0eps(. | y). With s = -eps_hat / sigma, y - mean = sigma (eps_hat - z) / alpha, so the term is
    -D log alpha + 0.5 ||eps_hat - z||^2 - D / 2 with no cancellation.
    """
    sde = model.sde
    eps = float(sde.eps if eps is None else eps)
    n, d = y.shape[0], y[0].numel()
    t = torch.full((n,), eps, dtype=y.dtype, device=y.device)
    xt, z, _ = perturb(sde, y, t, generator)
    alpha, _ = sde.marginal_coeffs(t.to(torch.float64))
    return (-d * torch.log(alpha)).to(y.dtype) + 0.5 * _sq(model(xt, t) - z) - 0.5 * d


@torch.no_grad()
def bound_terms(
    model,
    x_uint8: Tensor,
    dequantizer,
    n_t: int = 1000,
    generator: torch.Generator | None = None,
    importance: bool = True,
    eps: float | None = None,
    systematic: bool = False,
) -> dict[str, Tensor]:
    """Per-image terms of the ScoreFlow bound (nats unless named bpd), each [N].

    prior: E[-log pi(x_T)]; diffusion: 0.5 int_eps^T [g^2 (||s - grad log p_0t||^2 - ||grad log p_0t||^2)
    - 2 div f] dt, estimated with n_t (importance-sampled) times, one in each of n_t equal-probability
    strata of p(t), diffusion_se its standard error (`stratified_se`); with `systematic`, the n_t times
    lie on one shifted grid per image (`systematic_uniform`: unbiased, and a few times less spread on
    a real model's tiles, where the integrand over p(t) is smooth) and diffusion_se is NaN (the rows
    are not independent: no error estimate from one shift);
    eps_term: the t = eps correction; dequant: log q(u | x); nll_with / nll_without: -log p(y) bounds;
    bpd_with / bpd_without: bits/dim of x including the dequantization term.
    """
    sde = model.sde
    u, log_q = dequantizer.sample(x_uint8, generator=generator)
    y = pixels.to_model(x_uint8, u)
    d = y[0].numel()
    strata = (systematic_uniform if systematic else stratified_uniform)(n_t, y.shape[0], generator, y.device)
    samples = torch.stack(
        [dsm_loss(model, y, "likelihood", importance=importance, generator=generator, eps=eps, u=strata[j])
         for j in range(n_t)]
    )
    diffusion = samples.mean(0)
    diffusion_se = torch.full_like(diffusion, float("nan")) if systematic else stratified_se(samples)
    prior = prior_term(sde, y)
    corr = eps_term(model, y, eps, generator)
    nll_without = prior + diffusion
    nll_with = nll_without + corr
    log_q = log_q.to(y.dtype)
    return {
        "prior": prior,
        "diffusion": diffusion,
        "diffusion_se": diffusion_se,
        "eps_term": corr,
        "dequant": log_q,
        "nll_with": nll_with,
        "nll_without": nll_without,
        "bpd_with": pixels.nats_to_bpd(nll_with + log_q, d),
        "bpd_without": pixels.nats_to_bpd(nll_without + log_q, d),
    }


def stratified_se(samples: Tensor) -> Tensor:
    """Standard error of the mean of [k, N] samples with one sample per stratum, rows in stratum order.

    Var(mean) = sum_j Var(f_j) / k^2; adjacent strata are paired, E (f_a - f_b)^2 = Var f_a + Var f_b
    + (mu_a - mu_b)^2, so sum_pairs (f_a - f_b)^2 / k^2 errs only on the high side (an odd last row
    takes half its neighbour pair's difference). k < 2: NaN.
    """
    k = samples.shape[0]
    if k < 2:
        return torch.full_like(samples[0], float("nan"))
    m = k - k % 2
    var_sum = (samples[0:m:2] - samples[1:m:2]).pow(2).sum(0)
    if k % 2:
        var_sum = var_sum + 0.5 * (samples[-1] - samples[-2]).pow(2)
    return var_sum.sqrt() / k


def bound_bpd(
    model,
    x_uint8: Tensor,
    dequantizer,
    n_t: int = 1000,
    correction: bool = True,
    generator: torch.Generator | None = None,
    importance: bool = True,
    eps: float | None = None,
    systematic: bool = False,
) -> Tensor:
    terms = bound_terms(model, x_uint8, dequantizer, n_t=n_t, generator=generator, importance=importance, eps=eps,
                        systematic=systematic)
    return terms["bpd_with" if correction else "bpd_without"]


# --- the probability-flow ODE -------------------------------------------------------------
def probability_flow_drift(model, x: Tensor, t: Tensor) -> Tensor:
    """dx/dt = f(x, t) - g^2/2 * score = f + g^2 eps_hat / (2 sigma_t)."""
    sde = model.sde
    _, sigma = sde.marginal_coeffs(t)
    c = (0.5 * sde.g2(t) / sigma).to(x.dtype).reshape((-1,) + (1,) * (x.dim() - 1))
    return sde.f(x, t) + c * model(x, t)


def ode_nll_continuous(
    model,
    y: Tensor,
    eps: float | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    method: str = "dopri5",
    trace: str = "exact",
    hutchinson: str = "rademacher",
    generator: torch.Generator | None = None,
    probes: int = 1,
) -> tuple[Tensor, Tensor, int]:
    """(-log p_eps(y) [N] in model-space nats, z_T, number of drift evaluations).

    Integrates the probability-flow ODE from eps to T with d(log p)/dt = -div(drift):
    log p_eps(y) = log pi(z_T) + int_eps^T div(drift) dt. trace="exact" takes D backward passes per
    evaluation (small D only); "hutchinson" uses `probes` fixed probes per image, averaged along
    one shared trajectory (unbiased in log p; the variance falls as 1/probes, each probe costing
    one backward pass per evaluation).
    """
    sde = model.sde
    eps = float(sde.eps if eps is None else eps)
    n = y.shape[0]
    if trace == "hutchinson":
        if probes < 1:
            raise ValueError(f"probes must be at least 1, not {probes}")
        shape = (probes,) + tuple(y.shape)  # probes = 1 draws the same numbers as one probe of y's shape
        if hutchinson == "rademacher":
            probe = torch.randint(0, 2, shape, generator=generator, device=y.device).to(y.dtype) * 2 - 1
        elif hutchinson == "gaussian":
            probe = torch.randn(shape, generator=generator, dtype=y.dtype, device=y.device)
        else:
            raise ValueError(f"unknown hutchinson probe {hutchinson!r}; expected 'rademacher' or 'gaussian'")
    elif trace != "exact":
        raise ValueError(f"unknown trace {trace!r}; expected 'exact' or 'hutchinson'")
    nfe = 0

    def func(t: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        nonlocal nfe
        nfe += 1
        with torch.enable_grad():
            x = state[0].detach().requires_grad_(True)
            v = probability_flow_drift(model, x, t.expand(n))
            if trace == "exact":
                flat = v.reshape(n, -1)
                div = torch.zeros(n, dtype=v.dtype, device=v.device)
                for i in range(flat.shape[1]):
                    (gi,) = torch.autograd.grad(flat[:, i].sum(), x, retain_graph=True)
                    div = div + gi.reshape(n, -1)[:, i]
            else:
                div = torch.zeros(n, dtype=v.dtype, device=v.device)
                for k, pk in enumerate(probe):
                    (gp,) = torch.autograd.grad((v * pk).sum(), x, retain_graph=k + 1 < probes)
                    div = div + (gp * pk).reshape(n, -1).sum(1)
                div = div / probes
        return v.detach(), div.detach()

    # imported here: torchdiffeq loads scipy.integrate (1 - 2 s), which only this adaptive solver needs
    from torchdiffeq import odeint

    ts = torch.tensor([eps, sde.T], dtype=y.dtype, device=y.device)
    state0 = (y.detach(), torch.zeros(n, dtype=y.dtype, device=y.device))
    xs, divs = odeint(func, state0, ts, rtol=rtol, atol=atol, method=method)
    z = xs[-1]
    nll = -sde.prior_logp(z) - divs[-1]
    log.debug("ode_nll_continuous: nfe=%d", nfe)
    return nll, z, nfe


def ode_nll_bpd(
    model,
    x_uint8: Tensor,
    dequantizer,
    eps: float | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    method: str = "dopri5",
    trace: str = "exact",
    hutchinson: str = "rademacher",
    generator: torch.Generator | None = None,
    probes: int = 1,
) -> Tensor:
    """Bits/dim of x: nats_to_bpd(-log p_eps(x + u) + log q(u | x)), one u ~ q per image.

    The ODE runs in the dtype of u (the dequantizer's output).
    """
    u, log_q = dequantizer.sample(x_uint8, generator=generator)
    y = pixels.to_model(x_uint8, u)
    nll, _, _ = ode_nll_continuous(
        model, y, eps=eps, rtol=rtol, atol=atol, method=method, trace=trace, hutchinson=hutchinson, generator=generator,
        probes=probes,
    )
    return pixels.nats_to_bpd(nll + log_q.to(nll.dtype).detach(), y[0].numel())
