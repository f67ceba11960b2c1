"""A model + a mode -> the codec of a batch of full 3 x P x P tiles (what stream.py drives).

Both modes first pop the dequantization u (dequant_codec), then code y = x + u on the lattice
2^-L (Z + 1/2) pixels: mode "ode" through the probability-flow ODE (ode_codec), mode "chain"
through the discrete diffusion chain (chain_codec).
"""
from __future__ import annotations

import numpy as np

from ..errors import BadFileError
from ..models.exact import exact_dequantizer, exact_model
from .ans import Message
from .chain_codec import ChainCodec, ChainSettings
from .dequant_codec import DequantCodec
from .evaluator import Evaluator
from .modes import ARITHMETICS, MODES, steps_per_batch
from .ode_codec import ODECodec, ODESettings


class DensityTileCodec:
    """Dequantization bits-back, then a continuous-state codec (ODE or chain) for y = x + u."""

    def __init__(self, dequant: DequantCodec, flow: ODECodec | ChainCodec, lattice_bits: int):
        self.dq, self.flow = dequant, flow
        self.L = lattice_bits
        self._log: list[float] | None = None

    @property
    def bits_log(self):
        return self._log

    @bits_log.setter
    def bits_log(self, v):
        self._log = self.dq.bits_log = self.flow.bits_log = v

    def push(self, m: Message, tiles: np.ndarray, progress=None) -> None:
        x = tiles.astype(np.int64)
        frac = self.dq.pop(m, x)
        self.flow.push(m, (x << self.L) + frac - (128 << self.L), progress)

    def pop(self, m: Message, shape: tuple, progress=None) -> np.ndarray:
        n0 = self.flow.pop(m, shape, progress) + (128 << self.L)
        x, frac = n0 >> self.L, n0 & ((1 << self.L) - 1)
        if x.min() < 0 or x.max() > 255:
            raise BadFileError("corrupt payload: decoded pixel values out of range")
        self.dq.push(m, x, frac)
        return x

    def deficit_bits_per_dim(self) -> float:
        return self.L + self.flow.deficit_bits_per_dim()

    def excess_bits_per_dim(self) -> float:
        return self.flow.excess_bits_per_dim()

    def chain_coeffs(self):
        """The chain's coefficients (discrete_chain.ChainCoeffs) in mode "chain", else None: what
        api.tile_model_bits estimates the chain's own cost per tile from."""
        return self.flow.co if isinstance(self.flow, ChainCodec) else None

    def steps_per_batch(self) -> int:
        return steps_per_batch("chain" if isinstance(self.flow, ChainCodec) else "ode", self.flow.s.steps)


def build_tile_codec(model, dequantizer, sde, mode: str, settings: dict, micro_batch: int,
                     device: str = "cpu", eps_mse: dict | None = None, arith: str = "float32") -> DensityTileCodec:
    """model: eps-prediction module; settings: the mode's settings (ODESettings / ChainSettings);
    eps_mse: the model file's denoising-error table (chain mode's reverse variances).
    arith: "exact64", the networks, schedules and coder parameters in exactmath's arithmetic (the
    same bits on every machine), or "float32", the float32 networks with rounded outputs and
    torch's and numpy's own functions (files that decode only where the kernels are the same)."""
    if arith not in ARITHMETICS:
        raise ValueError(f"unknown arithmetic {arith!r}; expected one of {ARITHMETICS}")
    exact = arith == "exact64"
    if exact:
        model, dequantizer, sde = exact_model(model), exact_dequantizer(dequantizer), sde.exact()
    ev = Evaluator(model, micro_batch, device, exact=exact)
    if mode == "ode":
        s = ODESettings.from_dict(settings)
        flow = ODECodec(sde, ev, s)
    elif mode == "chain":
        s = ChainSettings.from_dict(settings)
        flow = ChainCodec(sde, ev, s, eps_mse)
    else:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    dq = DequantCodec(dequantizer, Evaluator(model, micro_batch, device, exact=exact), s.lattice_bits, exact=exact)
    return DensityTileCodec(dq, flow, s.lattice_bits)
