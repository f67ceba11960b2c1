"""Bits-back through the dequantizer q(u | x) (DESIGN 2a).

u lives on the lattice {0, 1, ..., 2^L - 1} * 2^-L (cell m is [m, m+1) * 2^-L). The encoder pops
u ~ q(u | x) group by group: every group of the variational dequantizer is one elementwise,
exactly invertible transform (a mixture-of-logistics CDF in logit space) conditioned on x and the
earlier groups, so its lattice distribution is a CDF difference, exact up to the coder's 24-bit
probabilities. The decoder, knowing x and all of u, pushes the groups back in reverse order.
Net cost: +log Q(u | x) = log q(u|x) + D log 2^-L: it cancels the lattice term of the density code.

Two arithmetics (api: the header's setup dtype). "float32" (files before 0.2): the group's mixture
from the float32 network, rounded, and a table of all 2^L cell probabilities per dim from numpy's
tanh, whose last bits differ between machines. "exact64": the mixture from
models.exact.ExactDequantizer and the cell coded as L binary decisions, coarse to fine: each
splits the current interval of cells at its middle edge with probabilities from the exact CDF
(exactmath), so a dim costs K L sigmoids instead of K 2^L, and every machine computes the same
probabilities. The product of the decisions is the cell's probability, so the cost is the same.
"""
from __future__ import annotations

import numpy as np
import torch

from .. import exactmath as em
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


class _ExactMixture:
    """The CDF of each row's logistic mixture (in logit space) at the lattice's cell edges."""

    def __init__(self, logit_pi: np.ndarray, mu: np.ndarray, log_s: np.ndarray, bits: int):
        lp, self.mu = torch.from_numpy(logit_pi), torch.from_numpy(mu)
        e = em.exp(lp - lp.amax(1, keepdim=True))
        self.w = e / em.seq_sum(e, 1)[:, None]
        self.inv_s = em.exp(-torch.from_numpy(log_s))
        self.top = 2 ** bits
        k = torch.arange(self.top + 1, dtype=torch.float64)
        self.logit_edge = em.log(k) - em.log(self.top - k)  # logit(k / 2^L); +-inf at the ends

    def cdf(self, edge: torch.Tensor) -> torch.Tensor:
        """CDF at cell edges `edge` (int64 [n] in [0, 2^L]): exactly 0 and 1 at the ends."""
        inner = (edge > 0) & (edge < self.top)
        z = (self.logit_edge[edge.clamp(1, self.top - 1)][:, None] - self.mu) * self.inv_s
        c = em.seq_sum(self.w * em.sigmoid(z), 1)
        return torch.where(inner, c, (edge >= self.top).to(torch.float64))

    def decisions(self, m: torch.Tensor | None = None, choose=None):
        """Walk the L binary decisions of every row. Known cells m (the decoder): yields each
        level's (probs [n, 2], bits). Unknown (the encoder): `choose(probs) -> bits` picks them.
        Returns the cells and the list of (probs, bits) per level, coarse first."""
        n = self.mu.shape[0]
        lo, hi = torch.zeros(n, dtype=torch.int64), torch.full((n,), self.top, dtype=torch.int64)
        c_lo, c_hi = torch.zeros(n, dtype=torch.float64), torch.ones(n, dtype=torch.float64)
        levels = []
        while True:
            width = hi - lo
            if int(width.max()) <= 1:
                break
            mid = lo + width // 2
            c_mid = self.cdf(mid)
            p = torch.stack([(c_mid - c_lo).clamp(min=0.0), (c_hi - c_mid).clamp(min=0.0)], 1)
            p = torch.where((p.sum(1) > 0)[:, None], p, torch.ones_like(p)).numpy()
            if m is None:
                up = torch.from_numpy(np.asarray(choose(p), dtype=np.int64)).bool()
            else:
                up = m >= mid
            levels.append((p, up.numpy().astype(np.int64)))
            lo, c_lo = torch.where(up, mid, lo), torch.where(up, c_mid, c_lo)
            hi, c_hi = torch.where(up, hi, mid), torch.where(up, c_hi, c_mid)
        return lo, levels


class DequantCodec:
    """Pops / pushes the dequantization lattice offsets m (int64 [B, C, H, W] in [0, 2^L))."""

    def __init__(self, dequantizer, evaluator: Evaluator, lattice_bits: int, exact: bool = False):
        """exact: `dequantizer` is a models.exact.ExactDequantizer and cells are coded bit by bit."""
        self.dq = dequantizer
        self.ev = evaluator
        self.bits = int(lattice_bits)
        self.uniform = dequantizer.config.kind == "uniform"
        self.exact = exact
        self.bits_log: list[float] | None = None

    def _group_mixture(self, x: np.ndarray, m: np.ndarray, g: int) -> list[np.ndarray]:
        """(logit_pi, mu, log_s) of group g as rows [B * n_g, K], in the order u[:, mask_g] flattens."""
        masks = self.dq.groups(x.shape[1:])
        known = np.zeros(x.shape[1:], dtype=bool)
        for h in range(g):
            known |= masks[h].cpu().numpy()
        # only groups < g may influence group g: zero the rest here, bit for bit the same on
        # both sides whatever the decoder already knows
        u_known = np.where(known[None], (m.astype(np.float64) + 0.5) / 2 ** self.bits, 0.0)

        def fn(xb: torch.Tensor, ub: torch.Tensor):
            return self.dq.group_mixture(xb.round().clamp(0, 255).to(torch.uint8), ub, g)

        params = self.ev.batched(fn, x.astype(np.float64), u_known)
        return [np.ascontiguousarray(np.moveaxis(a, 1, 2).reshape(-1, a.shape[1])) for a in params]

    def _group_table(self, x: np.ndarray, m: np.ndarray, g: int) -> np.ndarray:
        return mixture_table(*self._group_mixture(x, m, g), self.bits)

    def _exact_mixture(self, x: np.ndarray, m: np.ndarray, g: int) -> _ExactMixture:
        return _ExactMixture(*self._group_mixture(x, m, g), self.bits)

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
            if self.exact:
                cells, levels = self._exact_mixture(x, m, g).decisions(choose=lambda p: dist.categorical(p).pop(msg))
                m[:, mk] = cells.numpy().reshape(x.shape[0], -1)
                if self.bits_log is not None:
                    self.bits_log.append(-float(sum(dist.categorical_bits(b, p).sum() for p, b in levels)))
                continue
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
            if self.exact:
                cells = torch.from_numpy(np.ascontiguousarray(m[:, mk].reshape(-1)))
                _, levels = self._exact_mixture(x, m, g).decisions(m=cells)
                for p, b in reversed(levels):
                    dist.categorical(p).push(msg, b)
                continue
            table = self._group_table(x, m, g)
            dist.categorical(table).push(msg, m[:, mk].reshape(-1))


__all__ = ["DequantCodec", "mixture_table", "quantize"]
