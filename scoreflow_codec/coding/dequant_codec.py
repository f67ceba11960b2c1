"""Bits-back through the dequantizer q(u | x) (DESIGN 2a).

u lives on the lattice {0, 1, ..., 2^L - 1} * 2^-L (cell m is [m, m+1) * 2^-L). The encoder pops
u ~ q(u | x) group by group: every group of the variational dequantizer is one elementwise,
exactly invertible transform (a mixture-of-logistics CDF in logit space) conditioned on x and the
earlier groups, so its lattice distribution is a CDF difference, exact up to the coder's 24-bit
probabilities. The decoder, knowing x and all of u, pushes the groups back in reverse order.
Net cost: +log Q(u | x) = log q(u|x) + D log 2^-L: it cancels the lattice term of the density code.
"""
from __future__ import annotations

import numpy as np
import torch

from . import distributions as dist
from .ans import Message
from .evaluator import Evaluator, quantize

_CHUNK = 4096  # dims per CDF table: bounds memory at ~ _CHUNK * (2^L + 1) * K floats


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def mixture_table(logit_pi: np.ndarray, mu: np.ndarray, log_s: np.ndarray, bits: int) -> np.ndarray:
    """Probabilities of the 2^bits lattice cells for each dim.

    logit_pi, mu, log_s: [n, K] (float64). Returns [n, 2^bits] (rows sum to 1).
    """
    n_cells = 2 ** bits
    edges = np.arange(1, n_cells, dtype=np.float64) / n_cells
    logit_e = np.log(edges) - np.log1p(-edges)                    # interior edges in logit space
    w = np.exp(logit_pi - logit_pi.max(1, keepdims=True))
    w /= w.sum(1, keepdims=True)
    inv_s = np.exp(-log_s)
    out = np.empty((logit_pi.shape[0], n_cells), dtype=np.float64)
    for s in range(0, logit_pi.shape[0], _CHUNK):
        e = slice(s, s + _CHUNK)
        z = (logit_e[None, :, None] - mu[e, None, :]) * inv_s[e, None, :]
        cdf = (_sigmoid(z) * w[e, None, :]).sum(-1)             # [n, 2^bits - 1]
        full = np.concatenate([np.zeros((cdf.shape[0], 1)), cdf, np.ones((cdf.shape[0], 1))], 1)
        out[e] = np.maximum(np.diff(full, axis=1), 0.0)  # round-off can make a flat cell -1e-17
    return out


class DequantCodec:
    """Pops / pushes the dequantization lattice offsets m (int64 [B, C, H, W] in [0, 2^L))."""

    def __init__(self, dequantizer, evaluator: Evaluator, lattice_bits: int):
        self.dq = dequantizer
        self.ev = evaluator
        self.bits = int(lattice_bits)
        self.uniform = dequantizer.config.kind == "uniform"
        self.bits_log: list[float] | None = None

    def _group_table(self, x: np.ndarray, m: np.ndarray, g: int) -> np.ndarray:
        masks = self.dq.groups(x.shape[1:])
        known = np.zeros(x.shape[1:], dtype=bool)
        for h in range(g):
            known |= masks[h].cpu().numpy()
        # only groups < g may influence group g: zero the rest here, bit for bit the same on
        # both sides whatever the decoder already knows
        u_known = np.where(known[None], (m.astype(np.float64) + 0.5) / 2 ** self.bits, 0.0)

        def fn(xb: torch.Tensor, ub: torch.Tensor):
            return self.dq.group_mixture(xb.round().clamp(0, 255).to(torch.uint8), ub, g)

        logit_pi, mu, log_s = self.ev.batched(fn, x.astype(np.float64), u_known)
        # [B, K, n_g] -> [B * n_g, K], rows in the order u[:, mask_g] flattens
        flat = [np.moveaxis(a, 1, 2).reshape(-1, a.shape[1]) for a in (logit_pi, mu, log_s)]
        return mixture_table(*flat, self.bits)

    def pop(self, msg: Message, x: np.ndarray) -> np.ndarray:
        """Encoder side: sample the lattice offsets m ~ Q(m | x) from the stack."""
        if self.uniform:
            m = dist.uniform(2 ** self.bits, x.shape).pop(msg)
            if self.bits_log is not None:
                self.bits_log.append(-float(x.size * self.bits))
            return m.astype(np.int64)
        m = np.zeros(x.shape, dtype=np.int64)
        for g, mask in enumerate(self.dq.groups(x.shape[1:])):
            mk = mask.cpu().numpy()
            table = self._group_table(x, m, g)
            vals = dist.categorical(table).pop(msg)
            m[:, mk] = vals.reshape(x.shape[0], -1)
            if self.bits_log is not None:
                self.bits_log.append(-float(dist.categorical_bits(vals, table).sum()))
        return m

    def push(self, msg: Message, x: np.ndarray, m: np.ndarray) -> None:
        """Decoder side: give the bits of m back."""
        if self.uniform:
            dist.uniform(2 ** self.bits, x.shape).push(msg, m)
            return
        masks = self.dq.groups(x.shape[1:])
        for g in reversed(range(len(masks))):
            mk = masks[g].cpu().numpy()
            table = self._group_table(x, m, g)
            dist.categorical(table).push(msg, m[:, mk].reshape(-1))


__all__ = ["DequantCodec", "mixture_table", "quantize"]
