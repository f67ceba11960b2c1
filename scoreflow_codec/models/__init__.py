"""The networks (unet, precond, exact, gaussian, presets), how fast they run where, and where they can run."""
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


def device_problem(device: str) -> str | None:
    """Why this machine's torch cannot run on `device` (one line), None where it can: an unknown name,
    a device other than the CPU and CUDA (the codec's two), CUDA in a torch built without it or with
    no GPU present, a CUDA index past the last GPU. Before 0.9.39 those stopped as internal errors
    (an AssertionError from deep in torch). Here, not in api, so that the trainer asks it on a device
    machine without constriction (which api's coders import)."""
    if device == "cpu":
        return None
    try:
        d = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        return f"unknown device {device!r} (cpu or cuda)"
    if d.type == "cpu":
        return None
    if d.type != "cuda":
        return f"device {device!r} is not supported (cpu or cuda)"
    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) was built without CUDA"
    n = torch.cuda.device_count()
    if n == 0:
        return "no CUDA device is available on this machine"
    if d.index is not None and d.index >= n:
        return f"no {device} on this machine (it has {n} CUDA device{'s' if n > 1 else ''})"
    return None


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


class ChannelsLast(torch.nn.Module):
    """A score model fed its input channels-last (NHWC), its output back in the usual layout: the
    CPU's convolution kernels (oneDNN) run faster on it. For estimates that only steer the encoder
    (api.tile_model_bits, api.estimate_model_bpd; since 0.9.20), never for anything that codes a
    file: other kernels round differently, and a --arith float32 file decodes only with the kernels
    that made it. Measured (the photo model on 64px Kodak tiles, one thread, the 2-core AVX-512
    EPYC): float32, 16 tiles x 32 time samples, 14.4 - 16.5 s -> 11.1 - 12.4 s; under bfloat16
    autocast (Bf16 around it), the first look at kodim05's and kodim14's 96 tiles 31.1 - 31.5 s ->
    27.9 - 28.2 s; the bounds the same to 1.2e-6 bits/dim in float32, 8e-4 in bfloat16 (16 of
    kodim14's tiles, the same draws)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.sde = model.sde

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.model(x.contiguous(memory_format=torch.channels_last), t).contiguous()
