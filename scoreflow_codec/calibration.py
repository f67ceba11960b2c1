"""The model's denoising error as a function of log-SNR: m(lam) = E||eps - eps_hat(z_t, t)||^2 / D.

The diffusion chain's reverse step p(z_i | z_{i+1}) = N(mu_p, v I) has its best isotropic
variance (in KL, averaged over the data) at
    v = s_i^2 + c_x^2 (sigma_{i+1}/alpha_{i+1})^2 m(lam_{i+1}),
s_i the posterior std and c_x the posterior coefficient of y (Analytic-DPM's argument); using the
posterior variance alone (m = 0) is much looser when steps are coarse. m is measured once, on
training images, and stored in the model file, so encoder and decoder read the same numbers.
"""
from __future__ import annotations

import numpy as np
import torch

from . import pixels


@torch.no_grad()
def eps_mse_table(model, x_uint8: torch.Tensor, points: int = 65, repeats: int = 2, batch: int = 64,
                  generator: torch.Generator | None = None) -> dict:
    """{"log_snr": [...] increasing, "mse": [...]} on `points` log-SNR values spanning [T, eps]."""
    sde = model.sde
    ends = sde.log_snr(torch.tensor([sde.T, sde.eps], dtype=torch.float64))
    lams = np.linspace(float(ends[0]), float(ends[1]), points)
    dev = next(iter(model.parameters()), torch.empty(0)).device if hasattr(model, "parameters") else "cpu"
    mse = []
    for lam in lams:
        t = float(sde.t_from_log_snr(torch.tensor(lam, dtype=torch.float64)))
        alpha, sigma = (float(v) for v in sde.marginal_coeffs(torch.tensor([t], dtype=torch.float64)))
        tot, n = 0.0, 0
        for _ in range(repeats):
            for s in range(0, x_uint8.shape[0], batch):
                x = x_uint8[s:s + batch]
                y = pixels.to_model(x, torch.rand(x.shape, generator=generator))
                e = torch.randn(y.shape, generator=generator)
                z = alpha * y + sigma * e
                eh = model(z.to(dev), torch.full((len(x),), t, device=dev)).float().cpu()
                tot += float(((e - eh) ** 2).sum())
                n += e.numel()
        mse.append(tot / n)
    return {"log_snr": [float(v) for v in lams], "mse": [float(v) for v in mse]}


def interpolate(table: dict | None, lam: np.ndarray) -> np.ndarray:
    """m(lam) by linear interpolation (0 without a table: the posterior variance)."""
    lam = np.asarray(lam, dtype=np.float64)
    if not table:
        return np.zeros_like(lam)
    return np.interp(lam, np.asarray(table["log_snr"], dtype=np.float64), np.asarray(table["mse"], dtype=np.float64))
