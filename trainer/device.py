"""Training chunks on a lent GPU (the device tool): prepare what travels, unpack what comes back.

The device machine runs one command of at most 10 minutes on a copy of the working tree, and the
whole copy must fit 64 MiB: the tracked files (the shipped models alone are ~20 MB and grow with
each release), the untracked files git does not ignore, and the git-ignored folder named in
`carry`. What comes back: at most 8 files of 16 MiB. `prepare` builds that folder
(`.device_data/`) and refuses, before any device time is spent, when the total is over the limit:

  .device_data/train/        the training images as lossless WebP files (CIFAR-10's 5,085:
                             8.6 MiB against 13.8 as .npz; the trainer reads folders as they are),
                             all of them, or a random part where they do not fit (photographs)
  .device_data/test/         the first `eval_images` held-out images (all the trainer evaluates)
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
from .data import hold_out, load_images

TRAVEL_LIMIT = 64 * 1024 * 1024
RETURN_FILES = 8
RETURN_FILE_BYTES = 16 * 1024 * 1024
FOLDER = ".device_data"


def _git_files(repo: Path, *args: str) -> list[Path]:
    r = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", *args], capture_output=True)
    if r.returncode != 0:
        raise ValueError(f"{repo}: not a git checkout (the device call sends the repository's files)")
    out = r.stdout.decode()
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


def _write_webp(im: np.ndarray, f: Path) -> int:
    """One lossless WebP file, checked pixel for pixel; returns its size."""
    Image.fromarray(im).save(f, "WEBP", lossless=True, quality=100, method=4)
    with Image.open(f) as back:  # lossless must mean identical: check, never assume
        if not np.array_equal(np.asarray(back.convert("RGB")), im):
            raise RuntimeError(f"{f}: WebP did not keep the pixels")
    return f.stat().st_size


def _write_folder(images: list[np.ndarray], folder: Path, budget: int | None = None, seed: int = 0) -> int:
    """Lossless WebP files named by their index (the trainer's folder loader sorts by name, so the
    order is kept). With a byte budget that the whole set does not fit: images in a random order
    (seed) until the next would not fit. Returns how many were written."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    width = max(5, len(str(len(images))))
    order = range(len(images)) if budget is None else np.random.default_rng(seed).permutation(len(images))
    used, n = 0, 0
    for i in order:
        f = tmp / f"{int(i):0{width}d}.webp"
        size = _write_webp(images[i], f)
        if budget is not None and used + size > budget:
            f.unlink()
            continue  # a smaller one may still fit
        used, n = used + size, n + 1
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return n


def prepare(repo: str | Path, data: str, eval_data: str | None = None, run: str | Path | None = None,
            init_from: str | Path | None = None, minutes: float = 7.0, eval_images: int = 128,
            train_args: str = "", limit: int = TRAVEL_LIMIT, holdout: int = 256, data_seed: int = 0) -> dict:
    """Fill repo/.device_data for one chunk; returns the sizes and the command.

    Without eval_data the first min(holdout, N // 10) images of `data` (at least one) are held
    out, as the trainer does (data.hold_out). The training images take the room the 64 MiB leave
    (less 1 MiB): all of them where they fit (CIFAR-10), else a random subset drawn with data_seed
    (the 135 photographs of natural/ do not fit: give each chunk another seed). Raises ValueError when what would travel is
    over `limit` anyway, or when the checkpoint would not come back in RETURN_FILES files."""
    repo = Path(repo).resolve()
    _git_files(repo)  # a checkout, or one clear error before any work
    if run is not None and init_from is not None:
        raise ValueError("give a run to continue or a model to start from, not both")
    dd = repo / FOLDER  # all of it is made here, afresh each time
    shutil.rmtree(dd, ignore_errors=True)
    dd.mkdir()

    # the state
    init_arg = ""
    if run is not None:
        run = Path(run)
        state = json.loads((run / "checkpoint" / "state.json").read_text()) \
            if (run / "checkpoint" / "state.json").exists() else {}
        if state.get("compact"):  # compact already (it came back from a chunk): as it is
            ckpt.copy_checkpoint(run / "checkpoint", dd / "run" / "checkpoint")
        else:
            tensors, state = ckpt.load_checkpoint(run / "checkpoint")
            state = {k: v for k, v in state.items() if k != "shards"}
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

    # the data: held-out images first, then the training images in the room that is left
    train_images = load_images(data)
    if eval_data:
        held = load_images(eval_data)
    else:
        held, train_images = hold_out(train_images, holdout)
    _write_folder(held[:eval_images], dd / "test")
    room = limit - travel_size(repo, dd)["total"] - (1 << 20)
    if room <= 0:
        raise ValueError(f"no room is left for the training images: the tracked files and the state "
                         f"already take {(limit - room) / 2**20:.1f} MiB of {limit / 2**20:.0f}")
    n_train = _write_folder(train_images, dd / "train", room, data_seed)
    if n_train == 0:
        raise ValueError("not one training image fits in the room the 64 MiB leave")

    cmd = (f"python -m trainer train --out {FOLDER}/run --data {FOLDER}/train --eval-data {FOLDER}/test "
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
    sizes.update(limit=limit, command=f"bash {FOLDER}/chunk.sh", train_command=cmd,
                 train_images=n_train, train_images_all=len(train_images), eval_images=len(held[:eval_images]))
    return sizes


def unpack(returned: str | Path, run: str | Path) -> dict:
    """Put a chunk's returned files (a folder: state.json, weights-*.safetensors, metrics.jsonl,
    config.json) into the local run directory `run`; returns the checkpoint's state."""
    returned, run = Path(returned), Path(run)
    if not (returned / "state.json").exists():
        raise FileNotFoundError(f"{returned}: no state.json came back (see its train.log)")
    state = ckpt.copy_checkpoint(returned, run / "checkpoint")
    for f in ("metrics.jsonl", "config.json"):
        if (returned / f).exists():
            shutil.copy2(returned / f, run / f)
    return state


def describe(sizes: dict) -> str:
    mib = lambda b: f"{b / 2**20:.1f} MiB"
    part = "" if sizes["train_images"] == sizes["train_images_all"] else " (a random part: the rest does not fit)"
    return (f"travels {mib(sizes['total'])} of {mib(sizes['limit'])}: tracked {mib(sizes['tracked'])}, "
            f"untracked {mib(sizes['untracked'])}, {FOLDER} {mib(sizes['carried'])}\n"
            f"training images {sizes['train_images']} of {sizes['train_images_all']}{part}, "
            f"held-out {sizes['eval_images']}\n"
            f"device run: command {shlex.quote(sizes['command'])}, carry [\"{FOLDER}\"]\n"
            f"(it runs: {sizes['train_command']})")
