"""Forward SDEs of score-based models: VP, sub-VP and VE (Song et al. 2021).

Each SDE is linear in x, so its marginals are Gaussian: x_t = alpha_t * x_0 + sigma_t * z.
Everything here is closed form; `tests/test_sde.py` checks it against Monte-Carlo.
"""
from __future__ import annotations

import abc
import copy
import math
from dataclasses import asdict, dataclass

import torch

from .exactmath import EXACT, NATIVE, Ops

Tensor = torch.Tensor


@dataclass(frozen=True)
class SDEConfig:
    kind: str = "vp"  # "vp" | "subvp" | "ve"
    beta_min: float = 0.1
    beta_max: float = 20.0
    sigma_min: float = 0.01
    sigma_max: float = 50.0
    eps: float | None = None  # None: the SDE's default start time
    T: float = 1.0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "SDEConfig":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def _bcast(v: Tensor, x: Tensor) -> Tensor:
    """[N] -> [N, 1, 1, ...] to broadcast against x."""
    return v.reshape(v.shape + (1,) * (x.dim() - v.dim()))


def _as_t(t, ref: Tensor | None = None) -> Tensor:
    if not torch.is_tensor(t):
        t = torch.as_tensor(t, dtype=torch.float64 if ref is None else ref.dtype)
    return t


class SDE(abc.ABC):
    """dx = f(x, t) dt + g(t) dW on [0, T], with Gaussian marginals."""

    default_eps: float = 1e-5
    # the elementwise functions of the coefficients: torch's own, or exactmath's for coding
    ops: Ops = NATIVE

    def __init__(self, config: SDEConfig):
        self.config = config
        self.T = float(config.T)
        self.eps = float(config.eps if config.eps is not None else self.default_eps)

    def exact(self) -> "SDE":
        """This SDE with every coefficient computed by exactmath: the same bits on any machine
        (the coder's schedules); NATIVE differs from it by an ulp here and there."""
        out = copy.copy(self)
        out.ops = EXACT
        return out

    # --- the SDE itself -------------------------------------------------------------------
    @abc.abstractmethod
    def drift_coef(self, t: Tensor) -> Tensor:
        """f(x, t) = drift_coef(t) * x (all our SDEs have linear drift)."""

    @abc.abstractmethod
    def g2(self, t: Tensor) -> Tensor:
        """g(t)^2."""

    def g(self, t: Tensor) -> Tensor:
        return torch.sqrt(self.g2(t))

    def f(self, x: Tensor, t: Tensor) -> Tensor:
        return _bcast(self.drift_coef(t).to(x.dtype), x) * x

    def sde(self, x: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
        return self.f(x, t), self.g(t)

    def div_f(self, x: Tensor, t: Tensor) -> Tensor:
        """Divergence of the drift, per sample: drift_coef(t) * D."""
        d = x[0].numel()
        return self.drift_coef(t).to(x.dtype) * d

    # --- marginals ------------------------------------------------------------------------
    @abc.abstractmethod
    def marginal_coeffs(self, t: Tensor) -> tuple[Tensor, Tensor]:
        """(alpha_t, sigma_t) with x_t | x_0 ~ N(alpha_t x_0, sigma_t^2 I)."""

    def marginal_prob(self, x0: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
        a, s = self.marginal_coeffs(t)
        return _bcast(a.to(x0.dtype), x0) * x0, s.to(x0.dtype)

    # --- prior ----------------------------------------------------------------------------
    @abc.abstractmethod
    def prior_std(self) -> float:
        """Std of the prior N(0, prior_std^2 I) at T."""

    def prior_sampling(self, shape, generator: torch.Generator | None = None, device=None) -> Tensor:
        return torch.randn(shape, generator=generator, device=device) * self.prior_std()

    def prior_logp(self, z: Tensor) -> Tensor:
        s = self.prior_std()
        d = z[0].numel()
        zz = z.reshape(z.shape[0], -1)
        return -0.5 * d * math.log(2 * math.pi * s * s) - 0.5 * (zz * zz).sum(1) / (s * s)

    # --- log-SNR --------------------------------------------------------------------------
    def log_snr(self, t: Tensor) -> Tensor:
        a, s = self.marginal_coeffs(t)
        return 2.0 * (self.ops.log(a) - self.ops.log(s))

    @abc.abstractmethod
    def t_from_log_snr(self, lam: Tensor) -> Tensor:
        """Inverse of log_snr."""

    def to_dict(self) -> dict:
        return self.config.to_dict()


class VPSDE(SDE):
    """Variance preserving: beta(t) = beta_min + t (beta_max - beta_min), f = -beta x / 2, g = sqrt(beta)."""

    default_eps = 1e-5

    def __init__(self, config: SDEConfig | None = None):
        super().__init__(config or SDEConfig(kind="vp"))
        self.b0 = float(self.config.beta_min)
        self.b1 = float(self.config.beta_max)

    def beta(self, t: Tensor) -> Tensor:
        return self.b0 + t * (self.b1 - self.b0)

    def int_beta(self, t: Tensor) -> Tensor:
        """B(t) = int_0^t beta."""
        return self.b0 * t + 0.5 * (self.b1 - self.b0) * t * t

    def drift_coef(self, t):
        return -0.5 * self.beta(t)

    def g2(self, t):
        return self.beta(t)

    def marginal_coeffs(self, t):
        B = self.int_beta(t)
        alpha = self.ops.exp(-0.5 * B)
        sigma = torch.sqrt(-self.ops.expm1(-B))
        return alpha, sigma

    def log_snr(self, t):
        # log(alpha^2 / (1 - alpha^2)) = -log(e^B - 1), computed stably.
        B = self.int_beta(t)
        return -self.ops.log(self.ops.expm1(B))

    def _t_from_int_beta(self, B: Tensor) -> Tensor:
        # Solve b0 t + (b1 - b0) t^2 / 2 = B for t >= 0.
        db = self.b1 - self.b0
        if db == 0:
            return B / self.b0
        return 2.0 * B / (self.b0 + torch.sqrt(self.b0 * self.b0 + 2.0 * db * B))

    def t_from_log_snr(self, lam):
        # e^B - 1 = e^{-lam}  =>  B = log1p(e^{-lam})
        B = self.ops.softplus(-lam)
        return self._t_from_int_beta(B)

    def prior_std(self):
        return 1.0


class SubVPSDE(VPSDE):
    """sub-VP: same drift as VP, g^2 = beta(t) (1 - e^{-2B(t)}), sigma_t = 1 - e^{-B(t)}."""

    default_eps = 1e-2

    def __init__(self, config: SDEConfig | None = None):
        super().__init__(config or SDEConfig(kind="subvp"))

    def g2(self, t):
        return self.beta(t) * (-self.ops.expm1(-2.0 * self.int_beta(t)))

    def marginal_coeffs(self, t):
        B = self.int_beta(t)
        return self.ops.exp(-0.5 * B), -self.ops.expm1(-B)

    def log_snr(self, t):
        B = self.int_beta(t)
        return -B - 2.0 * self.ops.log(-self.ops.expm1(-B))

    def t_from_log_snr(self, lam):
        # lam = -B - 2 log(1 - e^{-B}) = -2 log(e^{B/2} - e^{-B/2}) = -2 log(2 sinh(B/2))
        B = 2.0 * self.ops.asinh(0.5 * self.ops.exp(-0.5 * lam))
        return self._t_from_int_beta(B)


class VESDE(SDE):
    """Variance exploding: sigma(t) = sigma_min (sigma_max/sigma_min)^t, f = 0, g^2 = d sigma(t)^2/dt.

    The marginal std from x_0 is exact: sigma_t^2 = sigma(t)^2 - sigma_min^2.
    """

    default_eps = 1e-5

    def __init__(self, config: SDEConfig | None = None):
        super().__init__(config or SDEConfig(kind="ve"))
        self.smin = float(self.config.sigma_min)
        self.smax = float(self.config.sigma_max)
        self.log_r = math.log(self.smax / self.smin)
        self.log_smin = math.log(self.smin)

    def exact(self) -> "VESDE":
        out = super().exact()
        out.log_r = float(EXACT.log(torch.tensor(self.smax / self.smin, dtype=torch.float64)))
        out.log_smin = float(EXACT.log(torch.tensor(self.smin, dtype=torch.float64)))
        return out

    def sigma_fn(self, t):
        return self.smin * self.ops.exp(t * self.log_r)

    def drift_coef(self, t):
        return torch.zeros_like(t)

    def g2(self, t):
        return self.sigma_fn(t) ** 2 * 2.0 * self.log_r

    def marginal_coeffs(self, t):
        # sigma(t)^2 - sigma_min^2 = sigma_min^2 (e^{2 t log r} - 1)
        return torch.ones_like(t), self.smin * torch.sqrt(self.ops.expm1(2.0 * t * self.log_r))

    def log_snr(self, t):
        return -2.0 * self.log_smin - self.ops.log(self.ops.expm1(2.0 * t * self.log_r))

    def t_from_log_snr(self, lam):
        # expm1(2 t log r) = e^{-lam} / smin^2
        return self.ops.log1p(self.ops.exp(-lam - 2.0 * self.log_smin)) / (2.0 * self.log_r)

    def prior_std(self):
        return math.sqrt(self.smax * self.smax - self.smin * self.smin)  # no pow(): libm's may differ


def make_sde(config: SDEConfig | dict | None = None) -> SDE:
    if config is None:
        config = SDEConfig()
    if isinstance(config, dict):
        config = SDEConfig.from_dict(config)
    kinds = {"vp": VPSDE, "subvp": SubVPSDE, "ve": VESDE}
    if config.kind not in kinds:
        raise ValueError(f"unknown SDE kind {config.kind!r}; expected one of {sorted(kinds)}")
    return kinds[config.kind](config)
