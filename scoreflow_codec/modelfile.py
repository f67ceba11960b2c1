"""An exported model is one .safetensors file: weights + config JSON in its metadata.

Tensors: `model.<ScoreModel state_dict key>` and `dequant.<dequantizer state_dict key>`,
float32 or float16 (parameters only; buffers such as the Fourier frequencies stay float32),
always loaded back as float32. Metadata (all strings):
    format = "scoreflow-codec-model", format_version = "1", dtype = "float32" | "float16",
    config = JSON {"sde": SDEConfig, "unet": UNetConfig, "precond": PrecondConfig,
                   "dequant": DequantConfig, "preset": str | null, "info": {...},
                   "codec"?: {"tile"?: int, "chain_steps"?: int}}.
"codec" holds the settings the codec uses with the model unless told otherwise (`trainer export
--tile/--chain-steps`); a zoo entry's own "tile" / "chain_steps" take precedence over them.
The sha256 of the file's bytes identifies the model (the .sfc header records it). No pickle.

A model file may also be stored xz-compressed (`NAME.safetensors.xz`, as the zoo keeps the models
that files still need but no name points at first): it is read as the .safetensors it holds, and
its sha256 is that file's, so a compressed and a plain copy are the same model.
"""
from __future__ import annotations

import hashlib
import json
import lzma
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from .coding.modes import STEPS_RANGE, TILE_RANGE
from .dequant import DequantConfig, Dequantizer, make_dequantizer
from .fileio import atomic_write
from .errors import ModelError
from .models.precond import PrecondConfig, ScoreModel
from .models.unet import UNet, UNetConfig
from .sde import SDE, SDEConfig, make_sde

FORMAT = "scoreflow-codec-model"
FORMAT_VERSION = "1"


@dataclass
class LoadedModel:
    name: str
    sha256: str
    config: dict
    model: ScoreModel
    dequantizer: Dequantizer
    sde: SDE
    tile: int = 32  # the tile size the codec uses with it by default (the file's "codec", then a zoo entry, may set another)
    chain_steps: int | None = None  # the chain mode's steps by default (None: ChainSettings'; set as the tile is)


def codec_defaults(entry) -> dict:
    """The "codec" entry of a model file's config, checked: an object whose "tile" and
    "chain_steps" (each optional) are integers in their ranges; returns those that are set.
    Anything else is a ValueError naming what is wrong (other keys are ignored, for newer writers)."""
    if entry is None:
        return {}
    if not isinstance(entry, dict):
        raise ValueError(f"codec must be an object, not {entry!r}")
    out = {}
    for key, (lo, hi) in (("tile", TILE_RANGE), ("chain_steps", STEPS_RANGE)):
        v = entry.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ValueError(f"codec {key} must be an integer in [{lo}, {hi}], not {v!r}")
        out[key] = v
    return out


def model_config(model: ScoreModel, dequantizer: Dequantizer, preset: str | None = None,
                 info: dict | None = None) -> dict:
    """The config dict of a model file, read off the modules themselves."""
    return {"sde": model.sde.config.to_dict(), "unet": model.net.config.to_dict(),
            "precond": model.precond.to_dict(), "dequant": dequantizer.config.to_dict(),
            "preset": preset, "info": dict(info or {})}


def save_model(path: str | os.PathLike, model: ScoreModel, dequantizer: Dequantizer, config: dict | None = None,
               metadata: dict | None = None, dtype: str = "float32") -> str:
    """Write the model file atomically (temp file + rename); return its sha256 (hex).

    `config` may carry "preset", "info" and "codec" (the coding defaults, see codec_defaults; and
    sde/unet/precond/dequant, which must then match the modules); `metadata` entries are merged
    into config["info"].
    """
    if dtype not in ("float32", "float16"):
        raise ValueError(f"dtype must be 'float32' or 'float16', not {dtype!r}")
    config = dict(config or {})
    codec = codec_defaults(config.pop("codec", None))  # checked; written only where it sets something
    if codec:
        config["codec"] = codec
    full = model_config(model, dequantizer, config.get("preset"), {**config.get("info", {}), **(metadata or {})})
    for k in ("sde", "unet", "precond", "dequant"):
        if k in config and json.loads(json.dumps(config[k])) != json.loads(json.dumps(full[k])):
            raise ValueError(f"config[{k!r}] does not match the module being saved")
    full.update({k: v for k, v in config.items() if k not in full})

    half = {f"model.{n}" for n, _ in model.named_parameters()} | {f"dequant.{n}" for n, _ in dequantizer.named_parameters()}
    tensors = {}
    for prefix, mod in (("model.", model), ("dequant.", dequantizer)):
        for k, v in mod.state_dict().items():
            v = v.detach().to("cpu", copy=True).contiguous()
            if v.is_floating_point():
                v = v.to(torch.float16 if dtype == "float16" and prefix + k in half else torch.float32)
            tensors[prefix + k] = v
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "dtype": dtype,
            "config": json.dumps(full, sort_keys=True)}
    data = _canonical(st_save(tensors, metadata=meta))

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, data)
    return hashlib.sha256(data).hexdigest()


def _canonical(data: bytes) -> bytes:
    """The same file with its JSON header key-sorted: safetensors writes metadata in hash-map
    order, which changes from call to call; sorted, the same weights give the same sha256."""
    n = int.from_bytes(data[:8], "little")
    header = json.dumps(json.loads(data[8:8 + n]), sort_keys=True, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # keep the tensor data 8-byte aligned
    return len(header).to_bytes(8, "little") + header + data[8 + n:]


XZ_MAGIC = b"\xfd7zXZ\x00"


def read_model_bytes(path: str | os.PathLike) -> bytes:
    """The .safetensors bytes of a model file, decompressed where it is stored xz-compressed."""
    p = Path(path)
    if not p.is_file():
        raise ModelError(f"model file not found: {p}")
    data = p.read_bytes()
    if data.startswith(XZ_MAGIC):
        try:
            data = lzma.decompress(data, format=lzma.FORMAT_XZ)
        except lzma.LZMAError as e:
            raise ModelError(f"{p}: corrupt xz-compressed model file ({e})") from None
    return data


def _header(data: bytes, where: str) -> dict:
    """The safetensors JSON header (8-byte little-endian length, then JSON)."""
    if len(data) < 8:
        raise ModelError(f"{where}: not a safetensors model file (too short)")
    n = int.from_bytes(data[:8], "little")
    if n > len(data) - 8:
        raise ModelError(f"{where}: not a safetensors model file (bad or truncated header)")
    try:
        header = json.loads(data[8:8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ModelError(f"{where}: not a safetensors model file (unreadable header)") from None
    if not isinstance(header, dict):
        raise ModelError(f"{where}: not a safetensors model file (unreadable header)")
    return header


def load_model_file(path: str | os.PathLike, device: str | torch.device = "cpu") -> LoadedModel:
    """Read, check and build a model file (eval mode, float32). Raises errors.ModelError."""
    p = Path(path)
    return load_model_bytes(read_model_bytes(p), p, device)


def load_model_bytes(data: bytes, p: Path, device: str | torch.device = "cpu") -> LoadedModel:
    """Check and build a model from the .safetensors bytes `data` read from `p` (named in errors;
    its stem is the model's name where the file records none)."""
    header = _header(data, str(p))
    meta = header.get("__metadata__") or {}
    if meta.get("format") != FORMAT:
        if meta.get("format") is None and any(k.startswith(("ema.", "emadelta.", "net.", "opt.")) for k in header):
            raise ModelError(f"{p}: a training checkpoint's weights, not a model file: export the run's model "
                             f"first (python -m trainer export RUN -o model.safetensors)")
        raise ModelError(f"{p}: not a scoreflow-codec model (format {meta.get('format')!r})")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ModelError(f"{p}: model format version {meta.get('format_version')!r} is not supported "
                         f"(this version reads {FORMAT_VERSION})")
    try:
        config = json.loads(meta["config"])
        missing = [k for k in ("sde", "unet", "dequant") if k not in config]
        if missing:
            raise KeyError(", ".join(missing))
        model = ScoreModel(UNet(UNetConfig.from_dict(config["unet"])), make_sde(SDEConfig.from_dict(config["sde"])),
                           PrecondConfig.from_dict(config.get("precond")))
        dequantizer = make_dequantizer(DequantConfig.from_dict(config["dequant"]))
        codec = codec_defaults(config.get("codec"))
        # the name the file records: info's (older exports wrote it at the top level)
        name = (config.get("info") or {}).get("name") or config.get("name")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a string, not {name!r}")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ModelError(f"{p}: bad model config ({e.__class__.__name__}: {e})") from None
    try:
        tensors = st_load(data)
    except Exception as e:  # safetensors raises its own error types for corrupt payloads
        raise ModelError(f"{p}: corrupt safetensors payload ({e})") from None

    for prefix, mod in (("model.", model), ("dequant.", dequantizer)):
        want = mod.state_dict()
        have = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
        if missing or extra:
            what = f"missing {prefix}{missing[0]}" if missing else f"unexpected {prefix}{extra[0]}"
            raise ModelError(f"{p}: weights do not match the config ({what}; "
                             f"{len(missing)} missing, {len(extra)} unexpected)")
        for k, v in have.items():
            if v.shape != want[k].shape:
                raise ModelError(f"{p}: weight {prefix}{k} has shape {tuple(v.shape)}, "
                                 f"config expects {tuple(want[k].shape)}")
        mod.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in have.items()})
    unknown = [k for k in tensors if not k.startswith(("model.", "dequant."))]
    if unknown:
        raise ModelError(f"{p}: unexpected tensor {unknown[0]!r} in model file")

    model.to(device).eval()
    dequantizer.to(device).eval()
    name = name or Path(p.name.removesuffix(".xz")).stem
    return LoadedModel(name, hashlib.sha256(data).hexdigest(), config, model, dequantizer, model.sde,
                       tile=codec.get("tile", 32), chain_steps=codec.get("chain_steps"))
