"""Training configuration: one frozen dataclass, saved beside every checkpoint."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace


@dataclass(frozen=True)
class TrainConfig:
    # model
    preset: str = "tiny"
    sde: str = "vp"
    dequant: str = "variational"          # "variational" | "uniform"
    weighting: str = "likelihood"         # "likelihood" (lambda = g^2) | "original"
    importance: bool = True               # t ~ p(t) ∝ g^2/sigma^2 (only with weighting=likelihood)
    dropout: float | None = None          # None: the preset's
    init_from: str = ""                   # start from this run's EMA score model, or an exported .safetensors
    freeze_model: bool = False            # train the dequantizer alone (ScoreFlow's second stage)
    # data
    data: str = ""                        # .npz of uint8 [N,H,W,C] or a folder of images
    eval_data: str = ""                   # held-out .npz / folder (empty: hold out `holdout` train images)
    holdout: int = 256
    crop: int = 32
    flip: bool = True
    min_scale: float = 1.0                # random down-scaling of folder images, factor in [min_scale, 1]
    grain: float = 0.0                    # half the crops get Gaussian noise, sigma ~ U(0, grain) 8-bit levels (CropSampler)
    # optimisation
    batch: int = 128                      # global batch (split across ranks)
    lr: float = 2e-4
    warmup: int = 5000
    decay_from: int = 0                   # from this step the lr falls linearly to lr_end at `steps` (0: constant)
    lr_end: float = 0.0
    grad_clip: float = 1.0
    ema: float = 0.9999
    steps: int = 1_300_000
    max_minutes: float = 0.0              # stop (and checkpoint) after this wall time; 0 = no limit
    cool_minutes: float = 0.0             # with max_minutes: the lr falls linearly to lr_end over its last minutes
    profile_steps: int = 0                # profile this many steps after 5 warm ones, into the log (profiling.py)
    seed: int = 0
    # bookkeeping
    log_every: int = 50
    eval_every: int = 2000
    eval_images: int = 128
    eval_n_t: int = 64
    save_every: int = 2000
    compact_checkpoint: bool = False      # 8 bytes per parameter instead of 16 (checkpoint.py)
    bf16: bool = True                     # autocast on CUDA and CPUs with native bf16 (models.bf16_is_fast)
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def override(self, **kw) -> "TrainConfig":
        return replace(self, **{k: v for k, v in kw.items() if v is not None})
