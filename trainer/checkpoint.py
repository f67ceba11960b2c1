"""Resumable training checkpoints: safetensors shards (no pickle) of at most 15 MiB + state.json.

A checkpoint directory holds
  state.json           config, step, schedule/bookkeeping scalars, RNG states, shard list
  weights-000.safetensors ...  every tensor: "net.*", "ema.*" (model + dequantizer), "opt.*"
Writing goes to a temporary directory that replaces the old one at the end, so an interrupted
save never leaves a half checkpoint.

A compact checkpoint (`compact=True`, the trainer's `--compact-checkpoint`: the state that travels
to a lent GPU and back, where the whole working tree must fit 64 MiB) stores 8 bytes per parameter
instead of 16: the trained weights in float32 as they are, each EMA tensor as its difference from
them in bfloat16 ("emadelta.*": the EMA lies close to the weights, so the error is 2^-9 of a small
difference), Adam's second moments in bfloat16, and not its first moments, which restart at zero
(an average over about 10 steps: the next 10 - 20 updates are damped, nothing more). Loading
expands it back, so callers always see the full layout.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

MAX_SHARD_BYTES = 15 * 1024 * 1024
_DELTA = "emadelta."


def compact(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The compact layout (module doc) of a full checkpoint's tensors."""
    out = {}
    for k, v in tensors.items():
        if k.startswith("ema.") and v.is_floating_point() and f"net.{k[4:]}" in tensors:
            out[_DELTA + k[4:]] = (v.float() - tensors[f"net.{k[4:]}"].float()).to(torch.bfloat16)
        elif k.startswith("opt.") and k.endswith(".exp_avg"):
            continue
        elif k.startswith("opt.") and k.endswith(".exp_avg_sq") and v.dtype == torch.float32:
            out[k] = v.to(torch.bfloat16)
        else:
            out[k] = v
    return out


def expand(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The full layout back from a compact one (first moments zero, the rest float32)."""
    out = {}
    for k, v in tensors.items():
        if k.startswith(_DELTA):
            net = tensors[f"net.{k[len(_DELTA):]}"]
            out[f"ema.{k[len(_DELTA):]}"] = (net.float() + v.float()).to(net.dtype)
        elif k.startswith("opt.") and k.endswith(".exp_avg_sq"):
            v = v.float()
            out[k] = v
            out[k[:-len("_sq")]] = torch.zeros_like(v)
        else:
            out[k] = v
    return out


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


# an optimizer's settings that choose its implementation (kernels), not its training state
IMPLEMENTATION = ("foreach", "fused", "capturable", "differentiable")


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
    # how the update is computed is this optimizer's, not the checkpoint's: a run saved by a release whose
    # Adam was not fused (before 0.9.38) resumed with the fused one's settings replaced, and its
    # guarded_step then handed found_inf to the loop implementation, which refuses it
    groups = [{**g, **{k: mine[k] for k in IMPLEMENTATION if k in mine}}
              for g, mine in zip(scalars["param_groups"], opt.param_groups)]
    opt.load_state_dict({"state": state, "param_groups": groups})


def _new_dir(path: Path) -> Path:
    """An empty temporary directory beside `path`, for a checkpoint that replace_dir moves in."""
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def _replace_dir(tmp: Path, path: Path) -> None:
    """Move the finished directory `tmp` to `path`; the old one goes only after that."""
    old = path.with_name(path.name + ".old")
    if path.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(path, old)
    os.replace(tmp, path)
    if old.exists():
        shutil.rmtree(old)


def save_checkpoint(path: str | Path, tensors: dict[str, torch.Tensor], state: dict, compact_state: bool = False) -> None:
    path = Path(path)
    if compact_state:
        tensors, state = compact(tensors), {**state, "compact": True}
    tmp = _new_dir(path)
    names = []
    for i, shard in enumerate(_shards(tensors)):
        name = f"weights-{i:03d}.safetensors"
        save_file(shard, str(tmp / name))
        names.append(name)
    (tmp / "state.json").write_text(json.dumps({**state, "shards": names}, indent=2, sort_keys=True))
    _replace_dir(tmp, path)


def copy_checkpoint(src: str | Path, dst: str | Path) -> dict:
    """Copy a checkpoint's files as they are (no re-encoding: a compact one stays bit for bit) to
    dst, replacing it only once the copy loads; returns its state. FileNotFoundError names what
    is missing."""
    src, dst = Path(src), Path(dst)
    if not (src / "state.json").exists():
        raise FileNotFoundError(f"{src}: not a checkpoint (no state.json)")
    state = json.loads((src / "state.json").read_text())
    missing = [s for s in state["shards"] if not (src / s).exists()]
    if missing:
        raise FileNotFoundError(f"{src}: shards missing: {', '.join(missing)}")
    tmp = _new_dir(dst)
    for f in ["state.json", *state["shards"]]:
        shutil.copy2(src / f, tmp / f)
    load_checkpoint(tmp)  # it loads, or this raises before dst is touched
    _replace_dir(tmp, dst)
    return state


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> tuple[dict[str, torch.Tensor], dict]:
    path = Path(path)
    sj = path / "state.json"
    if not sj.exists():
        raise FileNotFoundError(f"{path}: not a checkpoint (no state.json)")
    state = json.loads(sj.read_text())
    tensors: dict[str, torch.Tensor] = {}
    for name in state["shards"]:
        tensors.update(load_file(str(path / name), device=str(device)))
    return (expand(tensors) if state.get("compact") else tensors), state
