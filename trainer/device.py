"""Training chunks on a lent GPU (the device tool): prepare what travels, unpack what comes back.

The device machine runs one command of at most 10 minutes on a copy of the working tree, and the
whole copy must fit 64 MiB: the tracked files (the shipped models alone are ~20 MB and grow with
each release), the untracked files git does not ignore, and the git-ignored folder named in
`carry`. What comes back: at most 8 files of 16 MiB. `prepare` builds that folder
(`.device_data/`) and refuses, before any device time is spent, when the total is over the limit:

  .device_data/train/        the training images as lossless WebP files (CIFAR-10's 5,085:
                             9.3 MB against 14.4 MB as .npz; the trainer reads folders as they are)
  .device_data/test.npz      the first `eval_images` held-out images (all the trainer evaluates)
  .device_data/run/          the run to continue: config.json, metrics.jsonl and its checkpoint
                             in the compact layout (checkpoint.py: 8 bytes per parameter)
  .device_data/init.safetensors   or a model file to start from (`--init-from`)
  .device_data/chunk.sh      the command: train for `minutes`, then copy the checkpoint, the
                             metrics and the log to $OUT

`unpack` puts the returned files back into a local run directory, which then resumes, exports
or goes to the next chunk. docs/TRAINING.md has the routine.
"""
from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import numpy as np
from PIL import Image

from . import checkpoint as ckpt
from .data import load_images

TRAVEL_LIMIT = 64 * 1024 * 1024
RETURN_FILES = 8
RETURN_FILE_BYTES = 16 * 1024 * 1024
FOLDER = ".device_data"


def _git_files(repo: Path, *args: str) -> list[Path]:
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", *args], check=True,
                         capture_output=True).stdout.decode()
    return [repo / f for f in out.split("\0") if f]


def _size(paths) -> int:
    total = 0
    for p in paths:
        if p.is_file() and not p.is_symlink():
            total += p.stat().st_size
        elif p.is_dir():
            total += sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and not f.is_symlink())
    return total


def travel_size(repo: Path, carry: Path) -> dict[str, int]:
    """Bytes that a device call with `carry` sends: tracked, untracked-not-ignored and carried."""
    tracked = _size(_git_files(repo))
    untracked = _size(_git_files(repo, "--others", "--exclude-standard"))
    carried = _size([carry])
    return {"tracked": tracked, "untracked": untracked, "carried": carried,
            "total": tracked + untracked + carried}


def _write_webp_folder(images: list[np.ndarray], folder: Path) -> None:
    """Lossless WebP per image, in order (the trainer's folder loader sorts by name)."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    width = max(5, len(str(len(images))))
    for i, im in enumerate(images):
        f = tmp / f"{i:0{width}d}.webp"
        Image.fromarray(im).save(f, "WEBP", lossless=True, quality=100, method=4)
        with Image.open(f) as back:  # lossless must mean identical: check, never assume
            if not np.array_equal(np.asarray(back.convert("RGB")), im):
                raise RuntimeError(f"{f}: WebP did not keep the pixels")
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def prepare(repo: str | Path, data: str, eval_data: str, run: str | Path | None = None,
            init_from: str | Path | None = None, minutes: float = 7.0, eval_images: int = 128,
            train_args: str = "", limit: int = TRAVEL_LIMIT) -> dict:
    """Fill repo/.device_data for one chunk; returns the sizes and the command. Raises ValueError
    when what would travel is over `limit`, or when the checkpoint would not come back in
    RETURN_FILES files of RETURN_FILE_BYTES."""
    repo = Path(repo).resolve()
    dd = repo / FOLDER
    dd.mkdir(exist_ok=True)
    if run is not None and init_from is not None:
        raise ValueError("give a run to continue or a model to start from, not both")

    # the data: re-encode only when the source changed (a marker records which one it was)
    train_dir, marker = dd / "train", dd / "train.source.json"
    src = {"data": str(Path(data).resolve()), "bytes": _size([Path(data)])}
    if not (train_dir.is_dir() and marker.exists() and json.loads(marker.read_text()) == src):
        _write_webp_folder(load_images(data), train_dir)
        marker.write_text(json.dumps(src))
    ev = load_images(eval_data)[:eval_images]
    np.savez(dd / "test.npz", images=np.stack(ev))

    # the state
    shutil.rmtree(dd / "run", ignore_errors=True)
    (dd / "init.safetensors").unlink(missing_ok=True)
    init_arg = ""
    if run is not None:
        run = Path(run)
        tensors, state = ckpt.load_checkpoint(run / "checkpoint")
        state = {k: v for k, v in state.items() if k not in ("shards", "compact")}
        ckpt.save_checkpoint(dd / "run" / "checkpoint", tensors, state, compact_state=True)
        for f in ("config.json", "metrics.jsonl"):
            if (run / f).exists():
                shutil.copy2(run / f, dd / "run" / f)
        n_shards = len(json.loads((dd / "run" / "checkpoint" / "state.json").read_text())["shards"])
        if n_shards + 5 > RETURN_FILES:  # + state.json, metrics.jsonl, config.json, train.log, gpu.txt
            raise ValueError(f"the checkpoint has {n_shards} shards: with the log and metrics that is over "
                             f"the {RETURN_FILES} files a device call returns")
    elif init_from is not None:
        shutil.copy2(init_from, dd / "init.safetensors")
        init_arg = f" --init-from {FOLDER}/init.safetensors"

    cmd = (f"python -m trainer train --out {FOLDER}/run --data {FOLDER}/train --eval-data {FOLDER}/test.npz "
           f"--eval-images {eval_images} --max-minutes {minutes:g} --compact-checkpoint --no-progress"
           f"{init_arg} {train_args}".rstrip())
    script = "\n".join([
        "#!/bin/bash",
        "# One training chunk on a lent GPU (trainer/device.py wrote this; run: bash .device_data/chunk.sh)",
        "set -o pipefail",
        'OUT="${OUT:?set OUT to the folder that comes back}"',
        "nvidia-smi --query-gpu=name,memory.total --format=csv > \"$OUT/gpu.txt\" 2>&1 || true",
        f"PYTHONUNBUFFERED=1 {cmd} 2>&1 | tee \"$OUT/train.log\"",
        "rc=$?",
        f"cp {FOLDER}/run/checkpoint/* {FOLDER}/run/metrics.jsonl {FOLDER}/run/config.json \"$OUT/\" 2>/dev/null",
        "exit $rc",
        "",
    ])
    (dd / "chunk.sh").write_text(script)
    sizes = travel_size(repo, dd)
    sizes["limit"] = limit
    sizes["command"] = f"bash {FOLDER}/chunk.sh"
    sizes["train_command"] = cmd
    if sizes["total"] > limit:
        raise ValueError(
            f"{sizes['total'] / 2**20:.1f} MiB would travel (tracked {sizes['tracked'] / 2**20:.1f}, untracked "
            f"{sizes['untracked'] / 2**20:.1f}, {FOLDER} {sizes['carried'] / 2**20:.1f}), over the "
            f"{limit / 2**20:.0f} MiB a device call takes")
    return sizes


def unpack(returned: str | Path, run: str | Path) -> dict:
    """Put a chunk's returned files (a folder: state.json, weights-*.safetensors, metrics.jsonl,
    config.json) into the local run directory `run`; returns the checkpoint's state."""
    returned, run = Path(returned), Path(run)
    state_file = returned / "state.json"
    if not state_file.exists():
        raise FileNotFoundError(f"{returned}: no state.json came back (see its train.log)")
    state = json.loads(state_file.read_text())
    missing = [s for s in state["shards"] if not (returned / s).exists()]
    if missing:
        raise FileNotFoundError(f"{returned}: shards missing: {', '.join(missing)}")
    run.mkdir(parents=True, exist_ok=True)
    tmp = run / "checkpoint.new"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for f in ["state.json", *state["shards"]]:
        shutil.copy2(returned / f, tmp / f)
    ckpt.load_checkpoint(tmp)  # it loads, or this raises before the old checkpoint is replaced
    old = run / "checkpoint"
    if old.exists():
        shutil.rmtree(old)
    tmp.rename(old)
    for f in ("metrics.jsonl", "config.json"):
        if (returned / f).exists():
            shutil.copy2(returned / f, run / f)
    return state


def describe(sizes: dict) -> str:
    mib = lambda b: f"{b / 2**20:.1f} MiB"
    return (f"travels {mib(sizes['total'])} of {mib(sizes['limit'])}: tracked {mib(sizes['tracked'])}, "
            f"untracked {mib(sizes['untracked'])}, {FOLDER} {mib(sizes['carried'])}\n"
            f"device run: command {shlex.quote(sizes['command'])}, carry [\"{FOLDER}\"]\n"
            f"(it runs: {sizes['train_command']})")
