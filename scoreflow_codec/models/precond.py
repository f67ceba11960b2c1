"""Preconditioning (k-diffusion / EDM style) around the raw U-Net: the net never sees the schedule.

With x_t = alpha_t x_0 + sigma_t z, the net sees c_in(t) x_t, where c_in = 1/sqrt(alpha^2 sigma_data^2
+ sigma^2) keeps its input at unit variance for any SDE (VP, sub-VP, VE), and
c_noise(t) = -log_snr(t) / 2 = log(sigma_t / alpha_t), i.e. log sigma of the equivalent VE
process (the quantity score_sde feeds its Fourier embedding). Coefficients are computed in
float64 from t, then cast to x's dtype, so t may be float32 or float64.

The output is eps_hat. With `gaussian_skip=True` it is eps_hat = c_skip x + c_out F, where
c_skip x is the optimal eps estimate for x_0 ~ N(0, sigma_data^2) and c_out its residual std
(EDM's preconditioning moved to eps-space); the default predicts eps directly (c_skip = 0,
c_out = 1).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from ..sde import SDE

Tensor = torch.Tensor


@dataclass(frozen=True)
class PrecondConfig:
    sigma_data: float = 0.5
    gaussian_skip: bool = False

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> "PrecondConfig":
        return cls(**{k: v for k, v in (d or {}).items() if k in cls.__dataclass_fields__})


class ScoreModel(nn.Module):
    """forward(x, t) -> eps_hat; score(x, t) = -eps_hat / sigma_t."""

    def __init__(self, net: nn.Module, sde: SDE, config: PrecondConfig | None = None):
        super().__init__()
        self.net = net
        self.sde = sde
        self.precond = config or PrecondConfig()

    def coefficients(self, t: Tensor) -> dict[str, Tensor]:
        """float64 [N] tensors c_in, c_noise, c_skip, c_out, sigma."""
        t = torch.as_tensor(t).to(torch.float64)
        alpha, sigma = self.sde.marginal_coeffs(t)
        var = (alpha * self.precond.sigma_data) ** 2 + sigma**2
        c_in = torch.rsqrt(var)
        c_noise = -0.5 * self.sde.log_snr(t)
        if self.precond.gaussian_skip:
            c_skip, c_out = sigma / var, alpha * self.precond.sigma_data * c_in
        else:
            c_skip, c_out = torch.zeros_like(t), torch.ones_like(t)
        return dict(c_in=c_in, c_noise=c_noise, c_skip=c_skip, c_out=c_out, sigma=sigma)

    def forward(self, x: Tensor, t: Tensor, features: Tensor | None = None) -> Tensor:
        """eps_hat; `features`, where given, go to the net with its input (a context model's,
        models/context.py)."""
        if t.dim() == 0:
            t = t.expand(x.shape[0])
        c = {k: v.to(x.dtype) for k, v in self.coefficients(t).items()}
        view = (-1,) + (1,) * (x.dim() - 1)
        args = () if features is None else (features,)
        out = self.net(c["c_in"].view(view) * x, c["c_noise"], *args)
        if self.precond.gaussian_skip:
            out = c["c_skip"].view(view) * x + c["c_out"].view(view) * out
        return out

    def score(self, x: Tensor, t: Tensor) -> Tensor:
        if t.dim() == 0:
            t = t.expand(x.shape[0])
        _, sigma = self.sde.marginal_coeffs(torch.as_tensor(t).to(torch.float64))
        return -self(x, t) / sigma.to(x.dtype).view((-1,) + (1,) * (x.dim() - 1))
