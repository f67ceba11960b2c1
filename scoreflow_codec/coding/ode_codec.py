"""Coding a continuous y_0 through the discretized probability-flow ODE with local bits-back
(DESIGN 2b; Ho, Lohn & Abbeel 2019).

State: y_k on the lattice delta * (Z + 1/2) in model space (delta = 2/256 * 2^-lattice_bits).
Step k maps y_k -> F_k(y_k) = a_k y_k + c_k eps_hat(y_k, t_k) (flow_steps.py). To code y_k given
that y_{k+1} will be coded next, the encoder
    pops   y_{k+1} ~ N(F_k(y_k), (sigma d_k)^2 I)        (d_k: isotropic estimate of |det J_k|^(1/D))
    pushes y_k     ~ N(F_k^{-1}(y_{k+1}), sigma^2 I)     (F^-1 by fixed-point iterations)
and finally pushes y_K under the prior. The net cost of a step is -log|det J_k| plus
KL(N(0, A) || N(0, I)), A = J^-1 D^2 J^-T: O(h^2) per step, O(1/K) in total.
The decoder runs the same steps backwards with the same arithmetic.

All coder parameters are float64 numpy computed from lattice integers and quantized network
outputs, so both sides agree bit for bit (evaluator.py).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from ..flow_steps import ddim_coeffs, marginal_coeffs_np, time_grid
from ..sde import SDE
from . import distributions as dist
from .ans import Message
from .evaluator import Evaluator


SIGMA_DATA = 0.5
Y_LIMIT = 1e3  # |y| bound on fixed-point iterates (the data live in [-1, 1], the prior in a few units)


@dataclass(frozen=True)
class ODESettings:
    steps: int = 128
    lattice_bits: int = 8        # lattice of y: 2^-lattice_bits of a pixel
    sigma_ratio: float = 4.0     # local bits-back noise, in lattice units
    fp_iters: int = 2            # fixed-point iterations for F^-1: at least this many,
    fp_max: int = 30             # then on until the largest update is < fp_tol lattice units
    fp_tol: float = 0.01
    fp_stall: float = 0.7        # or until an update is > fp_stall x the previous one: a float32
    #                              network's iteration stalls at ~0.015 units, below which it only
    #                              jitters (the old rule then ran all fp_max iterations)
    schedule: str = "logsnr"
    trace_probe: str = "rademacher"  # isotropic D_k from one Hutchinson probe per step

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ODESettings":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    @property
    def delta(self) -> float:
        return (2.0 / 256.0) * 2.0 ** (-self.lattice_bits)


def probe(k: int, shape: tuple) -> np.ndarray:
    """The fixed Rademacher probe of step k (same on both sides, any platform)."""
    n = int(np.prod(shape))
    # splitmix-style integer hash of (k, i): platform independent, no RNG state involved
    i = np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = i + np.uint64(0x9E3779B97F4A7C15) * np.uint64(k + 1)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return np.where((z & np.uint64(1)) == 1, 1.0, -1.0).reshape(shape)


class ODECodec:
    """Codes batches of lattice states n_0 (int64 [B, C, H, W]) through the K-step flow."""

    def __init__(self, sde: SDE, evaluator: Evaluator, settings: ODESettings):
        self.sde = sde
        self.ev = evaluator
        self.s = settings
        self.ts = time_grid(sde, settings.steps, schedule=settings.schedule)
        self.a, self.c = ddim_coeffs(sde, self.ts)
        alpha, sigma = marginal_coeffs_np(sde, self.ts[:-1])
        self.kappa = sigma / (alpha ** 2 * SIGMA_DATA ** 2 + sigma ** 2)
        self.delta = settings.delta
        self.prior_std = sde.prior_std() / self.delta
        self.bits_log: list[float] | None = None  # predicted codelength, when tracking

    # -- values <-> lattice ---------------------------------------------------------------
    def value(self, n: np.ndarray) -> np.ndarray:
        return (n.astype(np.float64) + 0.5) * self.delta

    def to_units(self, y: np.ndarray) -> np.ndarray:
        """A model-space mean -> lattice units of the integer index."""
        return y / self.delta - 0.5

    # -- one step's coder parameters -------------------------------------------------------
    def forward_params(self, k: int, n_k: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Mean (lattice units) and std of y_{k+1} given y_k, and eps_hat(y_k, t_k)."""
        y = np.clip(self.value(n_k), -Y_LIMIT, Y_LIMIT)
        eps, quad = self.ev.with_trace(y, float(self.ts[k]), probe(k, y.shape[1:]))
        a, c = float(self.a[k]), float(self.c[k])
        mean = self.to_units(np.clip(np.nan_to_num(a * y + c * eps, nan=0.0), -Y_LIMIT, Y_LIMIT))
        quad = np.nan_to_num(quad, nan=0.0)
        d = y[0].size
        # |det J|^(1/D) ~ a (1 + (c/a) tr(d eps/dy) / D), clamped against a wild probe
        rel = np.clip(1.0 + (c / a) * quad / d, 0.5, 2.0)
        ops = self.sde.ops
        scale = ops.exp(np.rint(ops.log(a * rel) * 2.0 ** 20) / 2.0 ** 20)
        std = np.broadcast_to((self.s.sigma_ratio * scale).reshape((-1,) + (1,) * (y.ndim - 1)), y.shape)
        return mean, np.ascontiguousarray(std), eps

    def eps_at_end(self, n_K: np.ndarray) -> np.ndarray:
        """eps_hat(y_K, T): the warm start of the last step's inverse."""
        return self.ev(np.clip(self.value(n_K), -Y_LIMIT, Y_LIMIT), float(self.ts[-1]))

    def inverse_mean(self, k: int, n_next: np.ndarray, eps_next: np.ndarray) -> np.ndarray:
        """F_k^{-1}(y_{k+1}) in lattice units, by fixed-point iterations.

        Write eps_hat(y) = kappa y + r(y) with kappa the eps of Gaussian data N(0, SIGMA_DATA^2);
        then y = (y_next - c r(y)) / (a + c kappa) contracts by about c |d eps/dy - kappa| / (a + c kappa),
        small both near t = eps (small c) and near T (eps ~ kappa y), unlike y = (y_next - c eps) / a.
        The start uses eps_next = eps_hat(y_{k+1}, t_{k+1}), which both sides have computed anyway
        (for step k+1), so the first iterate is already close.
        """
        y_next = np.clip(self.value(n_next), -Y_LIMIT, Y_LIMIT)
        a, c, kappa = float(self.a[k]), float(self.c[k]), float(self.kappa[k])
        t = float(self.ts[k])
        den = a + c * kappa
        y = np.clip((y_next - c * (eps_next - kappa * y_next)) / den, -Y_LIMIT, Y_LIMIT)
        # The stopping rule only looks at values both sides compute identically, so the
        # encoder and the decoder stop after the same iteration.
        prev = math.inf
        for i in range(max(self.s.fp_iters, self.s.fp_max)):
            y_new = (y_next - c * (self.ev(y, t) - kappa * y)) / den
            # a diverging iteration (steps too large for the model) must stay finite and
            # deterministic: it then costs bits, it never breaks decoding
            y_new = np.clip(np.nan_to_num(y_new, nan=0.0), -Y_LIMIT, Y_LIMIT)
            change = float(np.abs(y_new - y).max()) / self.delta
            y = y_new
            if i + 1 >= self.s.fp_iters and (change < self.s.fp_tol or change > self.s.fp_stall * prev):
                break
            prev = change
        return self.to_units(y)

    def _track(self, bits: float) -> None:
        if self.bits_log is not None:
            self.bits_log.append(bits)

    # -- coding ------------------------------------------------------------------------------
    def push(self, m: Message, n0: np.ndarray, progress=None) -> None:
        n = n0
        sig = np.full(n0.shape, float(self.s.sigma_ratio))
        K = self.s.steps
        fwd = self.forward_params(0, n)
        for k in range(K):
            mean, std, _ = fwd
            n_next = dist.gaussian(mean, std, sampled=True).pop(m)
            fwd = self.forward_params(k + 1, n_next) if k + 1 < K else None
            inv = self.inverse_mean(k, n_next, fwd[2] if fwd else self.eps_at_end(n_next))
            dist.gaussian(inv, sig).push(m, n)
            if self.bits_log is not None:
                self._track(float(dist.gaussian_bits(n, inv, sig).sum() - dist.gaussian_bits(n_next, mean, std).sum()))
            n = n_next
            if progress:
                progress(1)
        prior = np.full(n.shape, self.prior_std)
        dist.gaussian(np.full(n.shape, -0.5), prior).push(m, n)
        self._track(float(dist.gaussian_bits(n, np.full(n.shape, -0.5), prior).sum()))

    def pop(self, m: Message, shape: tuple, progress=None) -> np.ndarray:
        prior = np.full(shape, self.prior_std)
        n = dist.gaussian(np.full(shape, -0.5), prior).pop(m)
        sig = np.full(shape, float(self.s.sigma_ratio))
        eps_next = self.eps_at_end(n)
        for k in reversed(range(self.s.steps)):
            inv = self.inverse_mean(k, n, eps_next)
            n_prev = dist.gaussian(inv, sig).pop(m)
            mean, std, eps_next = self.forward_params(k, n_prev)
            dist.gaussian(mean, std, sampled=True).push(m, n)
            n = n_prev
            if progress:
                progress(1)
        return n

    def excess_bits_per_dim(self) -> float:
        """What the solver's steps are expected to cost above the model's NLL: not predicted here
        (0; `bench/ode_overhead.py` measures it, about 0.07 bits/dim at 128 steps on CIFAR-10)."""
        return 0.0

    def deficit_bits_per_dim(self) -> float:
        """How deep (bits per dim) the stack dips while a batch is pushed: its initial-bits need.

        Not just the first pop: every step pops y_{k+1} at scale sigma d_k and pushes y_k back at
        scale sigma, a net -log2 d_k, and the flow expands (d_k > 1) from the data to the prior, so
        the stack falls step after step until the prior's push at the end. Its low point (measured
        on CIFAR-10 tiles at 128 steps: within 0.1 of the last steps) is the prior's codelength plus
        one step's pop, less the tile's net codelength through the flow, which is at least about
        lattice_bits - 1 (the data cost >= 0, less the dequantizer's gain of < 1 bit/dim):
            prior bits + log2(sigma sqrt(2 pi e)) + 1 - lattice_bits
        (14.1 at the defaults, 22.1 with the dequantizer's lattice_bits; cifar10's tiles dipped
        16.5 - 17.9 with theirs). Until 0.6.0 this was the first pop alone (13.05 with the
        lattice bits), and ODE streams paid for the difference in padding: 0.68 bits/dim on the
        first 16 CIFAR-10 test images (test_ode_deficit_bounds_the_dip)."""
        gauss = math.log2(math.sqrt(2 * math.pi * math.e))
        step = math.log2(self.s.sigma_ratio) + gauss
        prior = math.log2(self.prior_std) + gauss
        return max(step + 1.0, prior + step + 1.0 - self.s.lattice_bits)
