"""Small complete "models" for codec tests: exact Gaussian data models and a tiny U-Net."""
from __future__ import annotations

import numpy as np
import torch

from scoreflow_codec.coding.ans import Message, padding_words
from scoreflow_codec.dequant import UniformDequantizer
from scoreflow_codec.modelfile import LoadedModel, save_model
from scoreflow_codec.models.gaussian import GaussianScoreModel
from scoreflow_codec.sde import VPSDE


def gaussian_model(shape=(3, 4, 4), seed=0, spread=(0.05, 0.25)):
    """A Gaussian data model with per-dim means/stds (model space) and discrete images from it."""
    g = torch.Generator().manual_seed(seed)
    sde = VPSDE()
    mu = torch.rand(shape, generator=g) - 0.5
    s = spread[0] + (spread[1] - spread[0]) * torch.rand(shape, generator=g)
    return GaussianScoreModel(sde, mu, s), g


def gaussian_images(model: GaussianScoreModel, n: int, g: torch.Generator) -> np.ndarray:
    mu, s = model.mu.float(), model.s.float()
    x = (mu + s * torch.randn((n,) + tuple(mu.shape), generator=g) + 1) * 128 - 0.5
    return torch.clamp(torch.round(x), 0, 255).to(torch.uint8).numpy()


def loaded_gaussian(size: int = 32, seed: int = 0, spread=(0.2, 0.5)) -> LoadedModel:
    """An exact Gaussian model on size x size RGB tiles, as the codec loads models."""
    model, _ = gaussian_model((3, size, size), seed, spread=spread)
    return LoadedModel(name="gaussian-test", sha256="ab" * 32, config={}, model=model,
                       dequantizer=UniformDequantizer(), sde=model.sde)


def tiny_preset(seed: int = 0, randomise_zeros: bool = False, sde: str = "vp"):
    """The trainer's `tiny` preset, untrained, in eval mode: (model, dequantizer). As built, its
    zero-initialised output layers make its score 0 (the probability-flow ODE is then linear, cheap to
    solve); with randomise_zeros they are drawn (std 0.05) instead, as if trained: a model whose every
    layer matters."""
    from scoreflow_codec.models.presets import build
    from scoreflow_codec.sde import SDEConfig

    torch.manual_seed(seed)
    model, deq = build("tiny", SDEConfig(kind=sde))
    if randomise_zeros:
        with torch.no_grad():
            for m in (model, deq):
                for q in m.parameters():
                    if q.abs().sum() == 0:
                        q.normal_(0, 0.05)
    return model.eval(), deq.eval()


def tiny_model_file(path, seed: int, randomise_zeros: bool = False, metadata: dict | None = None):
    """`tiny_preset(seed, randomise_zeros)` exported to path (a .safetensors the CLI and the bench take
    as --model), named tiny-SEED: seconds where the shipped models take minutes."""
    model, deq = tiny_preset(seed, randomise_zeros)
    save_model(path, model, deq, {"preset": "tiny", "info": {"name": f"tiny-{seed}"}}, metadata=metadata)
    return path


class MixtureScoreModel(torch.nn.Module):
    """Exact eps for data from a mixture of isotropic Gaussians N(mu_k, s^2 I) in model space:
    a non-linear score field with a symmetric Jacobian (a Hessian), like a trained model's."""

    def __init__(self, sde, mus: torch.Tensor, s: float, weights: torch.Tensor | None = None):
        super().__init__()
        self.sde = sde
        self.register_buffer("mus", mus.to(torch.float64))  # [K, C, H, W]
        self.s = float(s)
        k = mus.shape[0]
        self.register_buffer("logw", torch.log(weights if weights is not None else torch.full((k,), 1.0 / k)).double())

    def forward(self, x, t):
        t = torch.as_tensor(t, dtype=torch.float64)
        if t.dim() == 0:
            t = t.expand(x.shape[0])
        alpha, sigma = self.sde.marginal_coeffs(t.to(torch.float64))
        a = alpha.view(-1, 1, 1, 1, 1)
        v = a * a * self.s ** 2 + sigma.view(-1, 1, 1, 1, 1) ** 2
        xd = x.to(torch.float64).unsqueeze(1)                       # [N, 1, C, H, W]
        d2 = ((xd - a * self.mus.unsqueeze(0)) ** 2).flatten(2).sum(2)  # [N, K]
        r = torch.softmax(self.logw - 0.5 * d2 / v.view(-1, 1), dim=1)  # responsibilities
        mean = a.squeeze(1) * torch.einsum("nk,kchw->nchw", r, self.mus)
        eps = sigma.view(-1, 1, 1, 1) * (x.to(torch.float64) - mean) / v.squeeze(1)
        return eps.to(x.dtype)


def code_and_decode(tc, x: np.ndarray, pad: int):
    """Push x with a tile codec onto a padded stack, then pop it back.

    Returns (real bits, predicted bits, decoded x, the stack afterwards)."""
    m = Message(padding_words(pad))
    b0 = m.num_bits()
    tc.bits_log = []
    tc.push(m, x)
    actual = m.num_bits() - b0
    pred = sum(tc.bits_log)
    tc.bits_log = None
    return actual, pred, tc.pop(m, x.shape), m
