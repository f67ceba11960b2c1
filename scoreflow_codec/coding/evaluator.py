"""Deterministic network calls for coding (DESIGN 2e).

The encoder and decoder must compute bit-identical coder parameters. On the same machine and
torch build, a network's output for one sample can still change with the batch it is computed
in (kernel choice depends on the batch size), so every call here runs in micro-batches of
exactly `micro_batch` samples (zero-padded), in a fixed order, and rounds outputs to a grid
before they parametrize a coder. That is the "float32" arithmetic: its files decode only where
the kernels are the same (the same machine type and build).

exact=True ("exact64" files): `fn` is an exact forward (models/exact.py) whose outputs are the
same bits on every machine and in any batch, so nothing is rounded, and the Jacobian's quadratic
form of the ODE mode comes from a finite difference of two exact forwards instead of autograd.
Nor is anything padded: the rows run in chunks of at least EXACT_CHUNK_PIXELS pixels (the
file's micro-batch, which the float32 arithmetic needs, is only a lower bound there).
"""
from __future__ import annotations

import contextlib
import sys
from typing import Callable

import numpy as np
import torch

from .. import exactmath as em

QUANT_BITS = 20
# exact forwards: rows per call so that a call holds at most about this many pixels (8 tiles of
# 64px): on the 2-core AVX2 EPYC the photo model's exact forward (0.9.11) costs 0.100 / 0.075 /
# 0.072 / 0.063 / 0.063 / 0.066 / 0.063 / 0.069 / 0.083 s per 64px tile in calls of 1 / 2 / 3 / 4 /
# 6 / 8 / 12 / 16 / 24 tiles (two threads, best of 5, interleaved): flat from 4 to 12. With 0.9.63's
# blocked attention on the 2-core Intel Xeon: 0.193 / 0.191 / 0.190 / 0.185 / 0.206 / 0.208 s in calls
# of 2 / 4 / 6 / 8 / 12 / 16 tiles (two threads, best of 4): 8 is still best
EXACT_CHUNK_PIXELS = 8 * 64 * 64
FD_STEP = 2.0 ** -10  # the finite difference of exact mode's Jacobian quadratic form (model space)


def quantize(v: np.ndarray, bits: int = QUANT_BITS) -> np.ndarray:
    """Round to multiples of 2^-bits (float64): a last-ulp difference rarely survives this."""
    scale = float(2 ** bits)
    return np.rint(v * scale) / scale


def _set_deterministic(mode: bool, warn_only: bool) -> None:
    """torch.use_deterministic_algorithms(mode, warn_only=...) without its first step, an import of
    torch._inductor.config to set the flag of graphs that torch.compile builds (we build none):
    that import took 3 - 6 s of every sfcodec run that coded or decoded a model's stream (a 4x4
    image's compress, 13 s, spent 9 of them there on a busy 2-core CPU). Where inductor is already
    loaded, the public call keeps its flag in step."""
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None or "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)
    else:
        setter(mode, warn_only=warn_only)


@contextlib.contextmanager
def deterministic_torch():
    """torch's deterministic algorithms (warn only) for the duration of a coding run; the caller's
    setting is restored after."""
    prev = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    _set_deterministic(True, warn_only=True)
    try:
        yield
    finally:
        _set_deterministic(*prev)


class Evaluator:
    """Runs `fn(x[M, ...], t[M]) -> out[M, ...]` on fixed-size micro-batches."""

    def __init__(self, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], micro_batch: int,
                 device: str | torch.device = "cpu", exact: bool = False):
        if micro_batch < 1:
            raise ValueError("micro_batch must be >= 1")
        self.fn = fn
        self.micro_batch = int(micro_batch)
        self.device = torch.device(device)
        self.exact = exact
        self.dtype = torch.float64 if exact else torch.float32
        self.calls = 0  # network evaluations, counted in samples (for reports)

    def _out(self, v: np.ndarray) -> np.ndarray:
        return v if self.exact else quantize(v)

    def _chunks(self, x: np.ndarray):
        """(start, end) of each call's rows: micro-batches, or for exact forwards (which no batch
        can change) chunks of about EXACT_CHUNK_PIXELS pixels."""
        n, size = x.shape[0], self.micro_batch
        if not (self.exact and x.ndim >= 3):
            for s in range(0, n, size):
                yield s, min(s + size, n)
            return
        # as few calls as chunks of that size need, of balanced sizes: 10 rows of 64px go as 5 + 5,
        # not 8 + 2 (a call of 2 tiles costs 15% more per tile than one of 5)
        size = max(size, EXACT_CHUNK_PIXELS // (x.shape[-1] * x.shape[-2]))
        k = -(-n // size)
        for i in range(k):
            yield n * i // k, n * (i + 1) // k

    def _pad(self, x: np.ndarray, s: int, e: int) -> torch.Tensor:
        """Rows s:e of x as a tensor, zero-padded to a whole micro-batch (float32 only)."""
        if self.exact:
            return torch.from_numpy(np.array(x[s:e], dtype=np.float64)).to(self.device)
        buf = np.zeros((self.micro_batch,) + x.shape[1:], dtype=np.float64)
        buf[: e - s] = x[s:e]
        return torch.from_numpy(buf).to(self.device, self.dtype)

    def _t(self, t: float, rows: int) -> torch.Tensor:
        return torch.full((rows,), float(t), dtype=self.dtype, device=self.device)

    @torch.no_grad()
    def __call__(self, x: np.ndarray, t: float) -> np.ndarray:
        """fn(x, t) for all rows of x (float64 numpy), quantized float64 output."""
        out = np.empty(x.shape, dtype=np.float64)
        for s, e in self._chunks(x):
            xb = self._pad(x, s, e)
            y = self.fn(xb, self._t(t, xb.shape[0]))
            out[s:e] = y[: e - s].to("cpu", torch.float64).numpy()
            self.calls += e - s
        return self._out(out)

    @torch.no_grad()
    def batched(self, fn: Callable[..., tuple], *arrays: np.ndarray) -> list[np.ndarray]:
        """fn(*micro_batch_tensors) -> tuple of tensors [M, ...]; rows of every array in fixed
        micro-batches; returns the quantized float64 outputs with the padding rows dropped."""
        outs: list[list[np.ndarray]] = []
        for s, e in self._chunks(arrays[0]):
            res = fn(*[self._pad(a, s, e) for a in arrays])
            if not outs:
                outs = [[] for _ in res]
            for acc, r in zip(outs, res):
                acc.append(r[: e - s].to("cpu", torch.float64).numpy())
            self.calls += e - s
        return [self._out(np.concatenate(acc, 0)) for acc in outs]

    def with_trace(self, x: np.ndarray, t: float, probe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(fn(x, t), v^T (d fn/dx) v per row) with the probe v broadcast to every row.

        The quadratic form comes from one vector-Jacobian product: v . (J^T v) = v^T J v, or with
        exact arithmetic from (v . (fn(x + h v) - fn(x))) / h, summed in a fixed order.
        """
        if self.exact:
            out = self(x, t)
            shifted = self(x + FD_STEP * np.asarray(probe)[None], t)
            d = torch.from_numpy(((shifted - out) * np.asarray(probe)[None]).reshape(x.shape[0], -1))
            return out, em.tree_sum(d).numpy() / FD_STEP
        out = np.empty(x.shape, dtype=np.float64)
        quad = np.empty(x.shape[0], dtype=np.float64)
        v = torch.from_numpy(np.broadcast_to(probe, (self.micro_batch,) + x.shape[1:]).copy()).to(self.device, self.dtype)
        for s, e in self._chunks(x):
            xin = self._pad(x, s, e).requires_grad_(True)
            with torch.enable_grad():
                y = self.fn(xin, self._t(t, self.micro_batch))
                (g,) = torch.autograd.grad((y * v).sum(), xin)
            out[s:e] = y.detach()[: e - s].to("cpu", torch.float64).numpy()
            quad[s:e] = (g * v).flatten(1).sum(1)[: e - s].to("cpu", torch.float64).numpy()
            self.calls += 3 * (e - s)  # forward + backward ~ 3 forwards
        return quantize(out), quantize(quad)
