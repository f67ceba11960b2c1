"""Resumable training checkpoints: safetensors shards (no pickle) of at most 15 MiB + state.json.

A checkpoint directory holds
  state.json           config, step, schedule/bookkeeping scalars, RNG states, shard list
  weights-000.safetensors ...  every tensor: "net.*", "ema.*" (model + dequantizer), "opt.*"
Writing goes to a temporary directory that replaces the old one at the end, so an interrupted
save never leaves a half checkpoint.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

MAX_SHARD_BYTES = 15 * 1024 * 1024


def _shards(tensors: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    out, cur, size = [], {}, 0
    for k in sorted(tensors):
        t = tensors[k].detach().contiguous().cpu()
        n = t.numel() * t.element_size()
        if n > MAX_SHARD_BYTES:
            raise ValueError(f"tensor {k} ({n} bytes) is larger than a shard")
        if cur and size + n > MAX_SHARD_BYTES:
            out.append(cur)
            cur, size = {}, 0
        cur[k] = t
        size += n
    if cur:
        out.append(cur)
    return out


def optimizer_tensors(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Adam-style state as flat tensors + JSON-able scalars."""
    sd = opt.state_dict()
    tensors, scalars = {}, {"param_groups": sd["param_groups"], "state": {}}
    for pid, st in sd["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v) and v.dim() > 0:
                tensors[f"opt.{pid}.{k}"] = v
            else:
                scalars["state"].setdefault(str(pid), {})[k] = float(v.item() if torch.is_tensor(v) else v)
    return tensors, scalars


def load_optimizer(opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], scalars: dict) -> None:
    state: dict = {}
    for key, v in tensors.items():
        if key.startswith("opt."):
            _, pid, k = key.split(".", 2)
            state.setdefault(int(pid), {})[k] = v
    for pid, st in scalars["state"].items():
        for k, v in st.items():
            state.setdefault(int(pid), {})[k] = torch.tensor(v)
    opt.load_state_dict({"state": state, "param_groups": scalars["param_groups"]})


def save_checkpoint(path: str | Path, tensors: dict[str, torch.Tensor], state: dict) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    names = []
    for i, shard in enumerate(_shards(tensors)):
        name = f"weights-{i:03d}.safetensors"
        save_file(shard, str(tmp / name))
        names.append(name)
    (tmp / "state.json").write_text(json.dumps({**state, "shards": names}, indent=2, sort_keys=True))
    old = path.with_name(path.name + ".old")
    if path.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(path, old)
    os.replace(tmp, path)
    if old.exists():
        shutil.rmtree(old)


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> tuple[dict[str, torch.Tensor], dict]:
    path = Path(path)
    sj = path / "state.json"
    if not sj.exists():
        raise FileNotFoundError(f"{path}: not a checkpoint (no state.json)")
    state = json.loads(sj.read_text())
    tensors: dict[str, torch.Tensor] = {}
    for name in state["shards"]:
        tensors.update(load_file(str(path / name), device=str(device)))
    return tensors, state
