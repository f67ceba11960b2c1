"""Pixels <-> model space, and nats <-> bits/dim.

Pixel units: y = k + u with k in {0..255} and u in [0, 1). Model space: x = 2y/256 - 1 in [-1, 1).
A density in model space converts to pixel units with the Jacobian (2/256)^D = 128^-D.
"""
from __future__ import annotations

import math

import numpy as np
import torch

LOG_128 = math.log(128.0)


def to_model(pixels: torch.Tensor, u: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 (or integer-valued) pixels plus dequantization noise u -> model space."""
    y = pixels.to(torch.float32 if u is None else u.dtype)
    if u is not None:
        y = y + u
    return y * (2.0 / 256.0) - 1.0


def from_model(x: torch.Tensor) -> torch.Tensor:
    """Model space -> pixel units (continuous)."""
    return (x + 1.0) * 128.0


def nats_to_bpd(nll_model_nats, num_dims: int):
    """-log p in model space (nats, per image) -> bits/dim of the pixels."""
    return (nll_model_nats + num_dims * LOG_128) / (num_dims * math.log(2.0))


def bits_to_bpd(bits, num_dims: int):
    return bits / num_dims


def num_dims(shape) -> int:
    return int(np.prod(shape))
