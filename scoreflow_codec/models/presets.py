"""Named model sizes: a U-Net config plus a dequantizer config (and the preconditioning).

Parameter counts (3 channels) are pinned by tests/test_unet.py::test_preset_parameter_counts.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..dequant import DequantConfig, Dequantizer, make_dequantizer
from ..sde import SDE, SDEConfig, make_sde
from .precond import PrecondConfig, ScoreModel
from .unet import UNet, UNetConfig


@dataclass(frozen=True)
class Preset:
    name: str
    unet: UNetConfig
    dequant: DequantConfig
    description: str = ""
    precond: PrecondConfig = field(default_factory=PrecondConfig)

    def with_channels(self, channels: int) -> "Preset":
        """The same sizes for C-channel images (C = 1: grayscale)."""
        d = self.dequant
        dq = DequantConfig.default_for(channels, components=d.components, hidden=d.hidden, blocks=d.blocks,
                                       dropout=d.dropout)
        return replace(self, unet=replace(self.unet, in_channels=channels, out_channels=None), dequant=dq)


def _p(name, desc, ch, mult, blocks, attn, dq, dropout=0.0, scale_shift=True) -> Preset:
    unet = UNetConfig(channels=ch, channel_mult=mult, num_res_blocks=blocks, attn_resolutions=attn,
                      dropout=dropout, scale_shift=scale_shift)
    return Preset(name, unet, DequantConfig.default_for(3, **dq), desc)


PRESETS: dict[str, Preset] = {p.name: p for p in [
    _p("tiny", "tests: trains in seconds on a CPU", 12, (1, 2), 1, (),
       dict(hidden=8, blocks=1, components=4)),
    _p("cpu", "what a 2-core CPU can train overnight", 24, (1, 2, 2), 1, (8,),
       dict(hidden=16, blocks=1, components=8)),
    _p("small", "a few hours on one GPU", 40, (1, 2, 2), 2, (16,),
       dict(hidden=32, blocks=2, components=8)),
    _p("base", "GPU default", 64, (1, 2, 2), 2, (16,),
       dict(hidden=64, blocks=2, components=16), dropout=0.1),
    _p("ddpmpp", "DDPM++ cont. of the ScoreFlow paper (61.8M U-Net)", 128, (1, 2, 2, 2), 4, (16,),
       dict(hidden=96, blocks=2, components=32), dropout=0.1, scale_shift=False),
]}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def build_score_model(unet: UNetConfig, sde: SDE | SDEConfig | dict | None = None,
                      precond: PrecondConfig | None = None) -> ScoreModel:
    if not isinstance(sde, SDE):
        sde = make_sde(sde)
    return ScoreModel(UNet(unet), sde, precond)


def build(preset: str | Preset, sde: SDE | SDEConfig | dict | None = None,
          channels: int = 3) -> tuple[ScoreModel, Dequantizer]:
    """A fresh (untrained) score model and variational dequantizer of a preset."""
    p = get_preset(preset) if isinstance(preset, str) else preset
    if channels != p.unet.in_channels:
        p = p.with_channels(channels)
    return build_score_model(p.unet, sde, p.precond), make_dequantizer(p.dequant)
