"""Coding a dequantized image y through the discrete diffusion chain with bits-back, in Bit-Swap
order (DESIGN 2c; math in discrete_chain.py).

Encoder (y already popped by the dequantizer, on the lattice delta_y (Z + 1/2)):
          pop z_1 ~ q(z_1|y), push y ~ p(y|z_1),
          for i = 1..T-1: pop z_{i+1} ~ q(z_{i+1}|z_i), push z_i ~ p(z_i|z_{i+1}),
          push z_T ~ p(z_T).
Net codelength = -ELBO(y) on the lattice. One network call per latent on each side.

Each z_i lives on its own lattice delta_i Z (a power of two, about 1/lattice_ratio of the
smallest std it is coded with); a variable's lattice width cancels between its pop and its push.

Near the clean end the network's eps_hat overshoots: on Kodak tiles the shipped `photo`'s error
at z_1 is E||eps - eps_hat||^2 / D = 1.035, more than predicting no noise at all (1), while
kappa * eps_hat with kappa = 0.38 makes it 0.976. So the encoder scales eps_hat in the top
`kappa_top` network calls of each batch (the decoder p(y | z_1), then p(z_1 | z_2), ...) by the
factor k / KAPPA_LEVELS, k in 0..KAPPA_LEVELS, that fits the values it pushes there best (least
squares: it knows them), where that saves more than the 5.04 bits k costs; after those values it
pushes k (uniform on 0..32) and a flag (1 bit: factor or none); the decoder pops the flag, then k,
before it decodes them. Files before 0.9.13 have no such factors (kappa_top 0).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from .. import calibration
from ..discrete_chain import ChainCoeffs, chain_coeffs
from ..sde import SDE
from . import distributions as dist
from .ans import Message
from .evaluator import Evaluator


@dataclass(frozen=True)
class ChainSettings:
    # latents z_1..z_T. What compress uses unless told; files record any value other than the
    # format's default (64, api.FORMAT_DEFAULTS), so changing this never changes an old file.
    # 128: with the calibrated schedule the chain's bound falls 0.055 bpd from 64 steps on
    # CIFAR-10 and 0.018 on Kodak crops, for twice the time (docs/ARCHITECTURE.md).
    steps: int = 128
    lattice_bits: int = 8        # lattice of y: 2^-lattice_bits of a pixel (as in ODE mode)
    lattice_ratio: float = 4.0   # z_i lattice ~ (smallest std of z_i) / lattice_ratio
    # where the latents sit in log-SNR, by the model file's eps-MSE table (uniform in log-SNR
    # without one): "calibrated" at a density that the table's small-step expansion says is best
    # (calibration.step_grid; on 8 Kodak crops it took the chain's bound from 3.653 to 3.611 bpd at
    # 128 steps, continuous bound 3.607), or "optimized" (0.9.13) where the table's exact step costs
    # are least (calibration.optimized_grid). Not the default: it trusts the table's top end, which
    # today's model files measured with uniform u, not the dequantizer's: the first 32 CIFAR-10 test
    # images lost 0.007 bpd with it, the kodim03 crop gained 0.004 (docs/ARCHITECTURE.md).
    schedule: str = "calibrated"
    reverse_var: str = "calibrated"  # "calibrated" (the model file's eps-MSE table, if any) | "posterior"
    # network calls from the clean end whose eps_hat the encoder scales per batch by a coded factor
    # (module docstring; 0 in files before 0.9.13). 2: on 24 Kodak crops the decoder's factor
    # gains about 0.04 bits/dim with `photo`, the next call's 0.01, the rest little.
    kappa_top: int = 2

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ChainSettings":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    @property
    def delta(self) -> float:
        return (2.0 / 256.0) * 2.0 ** (-self.lattice_bits)

    def coefficients(self, sde: SDE, eps_mse: dict | None = None) -> ChainCoeffs:
        """The chain these settings code: the model file's table (eps_mse) places its steps and
        sets its reverse variances where reverse_var is "calibrated"."""
        table = eps_mse if self.reverse_var == "calibrated" else None
        return chain_coeffs(sde, self.steps, schedule=self.schedule, eps_mse=table)


KAPPA_LEVELS = 32  # a coded factor is k / KAPPA_LEVELS, k in 0..KAPPA_LEVELS
KAPPA_BITS = math.log2(KAPPA_LEVELS + 1)


def kappa_index(r: np.ndarray, w: np.ndarray) -> int:
    """The encoder's factor for one network call of a batch: the k of k / KAPPA_LEVELS nearest the
    least-squares kappa of r ~ kappa w (r: what the mean without the network's term misses by,
    w: that term), clamped to 0..KAPPA_LEVELS. Only the encoder computes it; the stream carries k."""
    r, w = np.asarray(r, dtype=np.float64).ravel(), np.asarray(w, dtype=np.float64).ravel()
    ww = float(np.dot(w, w))
    kappa = float(np.dot(r, w)) / ww if ww > 0 else 1.0
    return int(np.clip(np.rint(kappa * KAPPA_LEVELS), 0, KAPPA_LEVELS)) if math.isfinite(kappa) else KAPPA_LEVELS


def scramble(i: int, n: int) -> np.ndarray:
    """A fixed permutation of range(n) for step i: k -> (a k + b) mod n with gcd(a, n) = 1.

    Plain integer arithmetic, so it is the same on every platform and numpy version; a stride
    near n / golden ratio sends neighbouring elements far apart.
    """
    a = int(n * 0.6180339887498949) | 1
    while math.gcd(a, n) != 1:
        a += 2
    b = (i * 7919) % max(n, 1)
    return (a * np.arange(n, dtype=np.int64) + b) % max(n, 1)


class ChainCodec:
    """Codes batches of y lattice states n_y (int64 [B, C, H, W]) through the chain."""

    def __init__(self, sde: SDE, evaluator: Evaluator, settings: ChainSettings, eps_mse: dict | None = None):
        if settings.steps < 2:
            raise ValueError("chain mode needs at least 2 steps")
        self.ev = evaluator
        self.s = settings
        self.sde, self.eps_mse = sde, eps_mse
        self.co: ChainCoeffs = settings.coefficients(sde, eps_mse)
        co = self.co
        T = co.steps
        smallest = np.empty(T)
        for i in range(T):
            q_std = co.sigma[0] if i == 0 else co.b[i - 1]
            p_std = co.rev_std[i] if i < T - 1 else co.prior_std
            smallest[i] = min(q_std, p_std)
        self.delta = sde.ops.floor_pow2(smallest / settings.lattice_ratio)
        self.dy = settings.delta
        self.tau = co.sigma[0] / co.alpha[0]
        self.bits_log: list[float] | None = None

    # --- distributions, each in lattice units of the coded variable ---------------------
    def _q1(self, n_y: np.ndarray):
        y = (n_y + 0.5) * self.dy
        return self.co.alpha[0] * y / self.delta[0], np.full(n_y.shape, self.co.sigma[0] / self.delta[0])

    def _eps_y(self, n1: np.ndarray):
        """z_1 and the network's eps_hat there (one call at t_1)."""
        z1 = n1 * self.delta[0]
        return z1, self.ev(z1, float(self.co.ts[0]))

    def _p_y(self, z1: np.ndarray, eps: np.ndarray, k: int | None = None):
        """p(y | z_1): the Tweedie decoder, eps_hat scaled by k / KAPPA_LEVELS where k is given."""
        co = self.co
        if k is not None:
            eps = eps * (k / KAPPA_LEVELS)
        y_hat = (z1 - co.sigma[0] * eps) / co.alpha[0]
        return y_hat / self.dy - 0.5, np.full(z1.shape, self.tau / self.dy)

    def _q_next(self, i: int, n_i: np.ndarray):
        """q(z_{i+1} | z_i) for 0-based i (z_1 is index 0)."""
        z = n_i * self.delta[i]
        return self.co.a[i] * z / self.delta[i + 1], np.full(n_i.shape, self.co.b[i] / self.delta[i + 1])

    def _eps_prev(self, i: int, n_next: np.ndarray):
        """z_{i+1} and the network's eps_hat there (one call at t_{i+1}), for p(z_i | z_{i+1})."""
        z_next = n_next * self.delta[i + 1]
        return z_next, self.ev(z_next, float(self.co.ts[i + 1]))

    def _p_prev(self, i: int, z_next: np.ndarray, eps: np.ndarray, k: int | None = None):
        """p(z_i | z_{i+1}) for 0-based i, eps_hat scaled by k / KAPPA_LEVELS where k is given."""
        co = self.co
        if k is not None:
            eps = eps * (k / KAPPA_LEVELS)
        y_hat = (z_next - co.sigma[i + 1] * eps) / co.alpha[i + 1]
        mean = co.post_zc[i] * z_next + co.post_xc[i] * y_hat
        return mean / self.delta[i], np.full(z_next.shape, co.rev_std[i] / self.delta[i])

    def _scaled(self, call: int) -> bool:
        """Whether network call `call` (0: the decoder's at t_1, i + 1: p(z_i | z_{i+1})'s) carries a factor."""
        return call < self.s.kappa_top

    @staticmethod
    def _worth(k: int, x: np.ndarray, scaled: tuple, plain: tuple) -> int | None:
        """k where the factor saves more than it costs to send (its bits beyond the flag's), else None."""
        if k == KAPPA_LEVELS:
            return None
        saved = float(dist.gaussian_bits(x, *plain).sum() - dist.gaussian_bits(x, *scaled).sum())
        return k if saved > KAPPA_BITS else None

    def _choose_kappa(self, params, x: np.ndarray) -> int | None:
        """The encoder's factor for one call: params(k) gives the coded distribution (mean, std)
        of x, whose mean is linear in the factor, so the fit needs it at k = 0 and unscaled."""
        plain, m0 = params(None), params(0)[0]
        k = kappa_index(m0 - x, m0 - plain[0])
        return self._worth(k, x, params(k), plain)

    def _push_kappa(self, m: Message, k: int | None) -> None:
        """A flag (1 bit: whether this call's eps_hat is scaled), after it k where it is."""
        if k is not None:
            dist.uniform(KAPPA_LEVELS + 1, 1).push(m, np.array([k]))
        dist.uniform(2, 1).push(m, np.array([0 if k is None else 1]))
        if self.bits_log is not None:
            self.bits_log.append(1.0 + (0.0 if k is None else KAPPA_BITS))

    @staticmethod
    def _pop_kappa(m: Message) -> int | None:
        if not dist.uniform(2, 1).pop(m)[0]:
            return None
        return int(dist.uniform(KAPPA_LEVELS + 1, 1).pop(m)[0])

    def _perm(self, i: int, size: int) -> np.ndarray:
        return scramble(i, size)

    def _pop_q(self, m: Message, i: int, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
        """Pop z_{i+1} with its elements in a fixed scrambled order: each element's sample then
        comes from the bits of another dimension's last push, so a dimension's model error does
        not feed back into its own noise."""
        p = self._perm(i, mean.size)
        out = np.empty(mean.size, dtype=np.int64)
        out[p] = dist.gaussian(mean.reshape(-1)[p], std.reshape(-1)[p], sampled=True).pop(m)
        return out.reshape(mean.shape)

    def _push_q(self, m: Message, i: int, mean: np.ndarray, std: np.ndarray, x: np.ndarray) -> None:
        p = self._perm(i, mean.size)
        dist.gaussian(mean.reshape(-1)[p], std.reshape(-1)[p], sampled=True).push(m, x.reshape(-1)[p])

    def _prior(self, shape):
        return np.zeros(shape), np.full(shape, self.co.prior_std / self.delta[-1])

    def _track(self, pop_params, push_params, x_push: np.ndarray, popped: np.ndarray) -> None:
        if self.bits_log is not None:
            self.bits_log.append(float(dist.gaussian_bits(x_push, *push_params).sum()
                                       - dist.gaussian_bits(popped, *pop_params).sum()))

    # --- coding -----------------------------------------------------------------------------
    def push(self, m: Message, n_y: np.ndarray, progress=None) -> None:
        qm, qs = self._q1(n_y)
        n = dist.gaussian(qm, qs, sampled=True).pop(m)
        z1, eps = self._eps_y(n)
        k = self._choose_kappa(lambda k: self._p_y(z1, eps, k), n_y) if self._scaled(0) else None
        pm, ps = self._p_y(z1, eps, k)
        dist.gaussian(pm, ps).push(m, n_y)
        self._track((qm, qs), (pm, ps), n_y, n)
        if self._scaled(0):
            self._push_kappa(m, k)
        for i in range(self.co.steps - 1):
            qm, qs = self._q_next(i, n)
            n_next = self._pop_q(m, i, qm, qs)
            z_next, eps = self._eps_prev(i, n_next)
            k = self._choose_kappa(lambda k: self._p_prev(i, z_next, eps, k), n) if self._scaled(i + 1) else None
            pm, ps = self._p_prev(i, z_next, eps, k)
            dist.gaussian(pm, ps).push(m, n)
            self._track((qm, qs), (pm, ps), n, n_next)
            if self._scaled(i + 1):
                self._push_kappa(m, k)
            n = n_next
            if progress:
                progress(1)
        pm, ps = self._prior(n.shape)
        dist.gaussian(pm, ps).push(m, n)
        if self.bits_log is not None:
            self.bits_log.append(float(dist.gaussian_bits(n, pm, ps).sum()))

    def pop(self, m: Message, shape: tuple, progress=None) -> np.ndarray:
        pm, ps = self._prior(shape)
        n = dist.gaussian(pm, ps).pop(m)
        for i in reversed(range(self.co.steps - 1)):
            k = self._pop_kappa(m) if self._scaled(i + 1) else None
            pm, ps = self._p_prev(i, *self._eps_prev(i, n), k)
            n_prev = dist.gaussian(pm, ps).pop(m)
            qm, qs = self._q_next(i, n_prev)
            self._push_q(m, i, qm, qs, n)
            n = n_prev
            if progress:
                progress(1)
        k = self._pop_kappa(m) if self._scaled(0) else None
        pm, ps = self._p_y(*self._eps_y(n), k)
        n_y = dist.gaussian(pm, ps).pop(m)
        qm, qs = self._q1(n_y)
        dist.gaussian(qm, qs, sampled=True).push(m, n)
        return n_y

    def excess_bits_per_dim(self) -> float:
        """What the chain is expected to cost above the model's continuous bound, bits/dim, from the
        model's denoising-error table (calibration.chain_excess_bpd; 0 without a table)."""
        return calibration.chain_excess_bpd(self.eps_mse, self.sde, self.co.ts) if self.eps_mse else 0.0

    def deficit_bits_per_dim(self) -> float:
        """Bits per dim a batch pops (z_1) before it pushes any back (lattice stds < 2 ratio)."""
        return math.log2(self.s.lattice_ratio * 2.0 * math.sqrt(2 * math.pi * math.e)) + 1.0
