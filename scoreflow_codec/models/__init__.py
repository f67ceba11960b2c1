"""The networks (unet, precond, exact, gaussian, presets) and how fast they run where."""
from __future__ import annotations

import torch


def bf16_is_fast(dev: torch.device | str) -> bool:
    """Whether bfloat16 autocast of the networks pays on this device: CUDA, and CPUs whose
    instructions do bfloat16 natively (AVX512_BF16, AMX). Elsewhere a CPU emulates it, slower than
    float32. Measured on a 2-core AVX-512 EPYC, one thread: a training step of the shipped cifar10
    model at batch 64 in 0.70 s against 1.2 - 1.4 s (the trainer's images per second 1.4x), the photo
    model's forward on 64x64 tiles in 26 ms per tile against 46 ms."""
    dev = torch.device(dev)
    if dev.type == "cuda":
        return True
    caps = torch.cpu.get_capabilities() if dev.type == "cpu" else {}
    return bool(caps.get("avx512_bf16") or caps.get("amx_bf16"))


class Bf16(torch.nn.Module):
    """A score model run under bfloat16 autocast, its output cast back: for estimates that only steer
    the encoder (api.tile_model_bits' first look), never for anything that codes a file. Its bound is
    a little higher than float32's (the rounding error adds to the denoising error): on kodim14's 96
    tiles of 64px, `photo`, 16 time samples, the same draws, +0.004 to +0.070 bits/dim (median 0.016)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.sde = model.sde

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            return self.model(x, t).to(x.dtype)
