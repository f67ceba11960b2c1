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

Several runs can share one chunk (`jobs`: the GPU is far from busy with one small model, and a
session draws one machine of 15 minutes at most): each in .device_data/NAME/ (its model file
.device_data/NAME.init.safetensors), all training at once on the same data; what comes back is each
one's log (NAME.log) and one tar of all their run directories in parts of 15 MiB (chunk.tar.00, ...),
which `unpack(returned, run, job=NAME)` takes apart.

`unpack` puts the returned files back into a local run directory, which then resumes, exports
or goes to the next chunk. docs/TRAINING.md has the routine.
"""
from __future__ import annotations

import io
import json
import math
import re
import shlex
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from . import checkpoint as ckpt
from .config import TrainConfig
from .data import hold_out, load_images

TRAVEL_LIMIT = 64 * 1024 * 1024
RETURN_FILES = 8
RETURN_FILE_BYTES = 16 * 1024 * 1024
RETURN_BYTES = 64 * 1024 * 1024  # all of them together
FOLDER = ".device_data"
PART_BYTES = 15 * 1024 * 1024  # a multi-run chunk's tar comes back in parts of this size
PACK = "chunk.tar"


@dataclass(frozen=True)
class Job:
    """One run of a chunk: a run directory to continue, or a model file to start from, or neither (a
    new run), with its trainer options (`--preset small --batch 128 ...`)."""
    name: str
    run: str | Path | None = None
    init_from: str | Path | None = None
    train_args: str = ""


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


def _state_bytes(job: Job, dd_run: Path | None) -> int:
    """What a job's compact checkpoint takes (8 bytes a parameter): measured where it travels, else
    counted from its preset (the one its options name, else its run's or model file's, else the
    trainer's default)."""
    from .train import build

    if dd_run is not None and (dd_run / "checkpoint").exists():
        return _size([dd_run / "checkpoint"])
    args = shlex.split(job.train_args)
    preset = next((args[k + 1] for k, a in enumerate(args[:-1]) if a == "--preset"), None)
    preset = preset or next((a.split("=", 1)[1] for a in args if a.startswith("--preset=")), None)
    if preset is None and job.init_from is not None:
        from scoreflow_codec.modelfile import load_model_file

        preset = load_model_file(job.init_from).config.get("preset")
    model, dequant, _ = build(TrainConfig(preset=preset or TrainConfig().preset))
    return 8 * sum(p.numel() for m in (model, dequant) for p in m.parameters()) + 4096


def _job_state(job: Job, dd: Path, single: bool, tracked: set[Path]) -> tuple[str, Path | None]:
    """Copy a job's state into dd (its run's checkpoint in the compact layout, or its model file, unless
    the repository tracks it: `tracked`, the repository's files); returns the trainer's --init-from
    option and where its run directory travels."""
    if job.run is not None and job.init_from is not None:
        raise ValueError("give a run to continue or a model to start from, not both")
    if job.run is not None:
        run, dest = Path(job.run), dd / job.name
        state = json.loads((run / "checkpoint" / "state.json").read_text()) \
            if (run / "checkpoint" / "state.json").exists() else {}
        if state.get("compact"):  # compact already (it came back from a chunk): as it is
            ckpt.copy_checkpoint(run / "checkpoint", dest / "checkpoint")
        else:
            tensors, state = ckpt.load_checkpoint(run / "checkpoint")
            state = {k: v for k, v in state.items() if k != "shards"}
            ckpt.save_checkpoint(dest / "checkpoint", tensors, state, compact_state=True)
        for f in ("config.json", "metrics.jsonl"):
            if (run / f).exists():
                shutil.copy2(run / f, dest / f)
        return "", dest
    if job.init_from is not None:
        src = Path(job.init_from).resolve()
        if src in tracked:  # a shipped model: it travels with the tracked files already
            return f" --init-from {shlex.quote(src.relative_to(dd.parent).as_posix())}", None
        name = "init.safetensors" if single else f"{job.name}.init.safetensors"
        shutil.copy2(job.init_from, dd / name)
        return f" --init-from {FOLDER}/{name}", None
    return "", None


def prepare(repo: str | Path, data: str, eval_data: str | None = None, run: str | Path | None = None,
            init_from: str | Path | None = None, minutes: float = 7.0, eval_images: int = 128,
            train_args: str = "", limit: int = TRAVEL_LIMIT, holdout: int = 256, data_seed: int = 0,
            cool_minutes: float = 0.0, jobs: list[Job] | None = None) -> dict:
    """Fill repo/.device_data for one chunk; returns the sizes and the command.

    One run (`run` to continue, or `init_from` a model file, or neither, with `train_args`), or
    several at once (`jobs`, not with those three). Without eval_data the first min(holdout, N // 10) images of `data` (at least one) are held
    out, as the trainer does (data.hold_out). The training images take the room the 64 MiB leave
    (less 1 MiB): all of them where they fit (CIFAR-10), else a random subset drawn with data_seed
    (the 135 photographs of natural/ do not fit: give each chunk another seed). `cool_minutes`: the
    lr falls to the runs' --lr-end over the chunk's last minutes (train --cool-minutes). Raises
    ValueError when what would travel is over `limit` anyway, or when the checkpoints would not
    come back in RETURN_FILES files."""
    repo = Path(repo).resolve()
    tracked = set(_git_files(repo))  # a checkout, or one clear error before any work
    single = jobs is None
    if single:
        jobs = [Job("run", run, init_from, train_args)]
    elif run is not None or init_from is not None or train_args:
        raise ValueError("give the runs as jobs, or one run with run/init_from/train_args, not both")
    names = [j.name for j in jobs]
    if not jobs or len(set(names)) != len(names) or \
            any(not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", n) or n in ("train", "test") for n in names):
        raise ValueError(f"the jobs need distinct names of letters, digits, '-' and '_' (not train or test): {names}")
    if cool_minutes and not cool_minutes < minutes:
        raise ValueError(f"the cool-down ({cool_minutes:g} minutes) is the end of the chunk's {minutes:g}")
    dd = repo / FOLDER  # all of it is made here, afresh each time
    shutil.rmtree(dd, ignore_errors=True)
    dd.mkdir()

    # the states, and whether they come back
    states = {j.name: _job_state(j, dd, single, tracked) for j in jobs}
    if single:
        if states["run"][1] is not None:
            n_shards = len(json.loads((dd / "run" / "checkpoint" / "state.json").read_text())["shards"])
            if n_shards + 5 > RETURN_FILES:  # + state.json, metrics.jsonl, config.json, train.log, gpu.txt
                raise ValueError(f"the checkpoint has {n_shards} shards: with the log and metrics that is over "
                                 f"the {RETURN_FILES} files a device call returns")
    else:
        back = sum(_state_bytes(j, states[j.name][1]) + (256 << 10) for j in jobs)  # + metrics, config
        parts = math.ceil(back / PART_BYTES)
        if back + (1 << 20) > RETURN_BYTES or parts + len(jobs) + 1 > RETURN_FILES:
            raise ValueError(f"the runs' checkpoints (about {back / 2**20:.0f} MiB, {parts} parts of "
                             f"{PART_BYTES / 2**20:g} MiB) with a log each and gpu.txt are over what a device call "
                             f"returns: {RETURN_FILES} files, {RETURN_BYTES >> 20} MiB in all")

    counts = _write_data(repo, dd, data, eval_data, eval_images, holdout, limit, data_seed)

    cool = f" --cool-minutes {cool_minutes:g}" if cool_minutes else ""
    cmds = {j.name: (f"python3 -m trainer train --out {FOLDER}/{j.name} --data {FOLDER}/train "
                     f"--eval-data {FOLDER}/test --eval-images {eval_images} --max-minutes {minutes:g}{cool} "
                     f"--compact-checkpoint --no-progress{states[j.name][0]} {j.train_args}").rstrip()
            for j in jobs}
    head = [
        "#!/bin/bash",
        "# One training chunk on a lent GPU (trainer/device.py wrote this; run: bash .device_data/chunk.sh)",
        "set -o pipefail",
        'OUT="${OUT:?set OUT to the folder that comes back}"',
        "nvidia-smi --query-gpu=name,memory.total --format=csv > \"$OUT/gpu.txt\" 2>&1 || true",
        "python3 -c 'import sys, torch; print(\"python\", sys.version.split()[0], \"torch\", torch.__version__, "
        "\"cuda\", torch.version.cuda)' >> \"$OUT/gpu.txt\" 2>&1 || true",
    ]
    if single:
        body = [
            f"PYTHONUNBUFFERED=1 {cmds['run']} 2>&1 | tee \"$OUT/train.log\"",
            "rc=$?",
            f"cp {FOLDER}/run/checkpoint/* {FOLDER}/run/metrics.jsonl {FOLDER}/run/config.json \"$OUT/\" 2>/dev/null",
        ]
    else:  # all at once, each line of output marked with its run; then one tar of their run directories
        body = []
        for n, c in cmds.items():
            body += [f"(PYTHONUNBUFFERED=1 {c} 2>&1 | tee \"$OUT/{n}.log\" | sed -u 's/^/{n}: /') &",
                     f"pid_{n.replace('-', '_')}=$!"]
        body += ["rc=0"] + [f"wait $pid_{n.replace('-', '_')} || rc=$?" for n in cmds]
        body += ["keep=()",
                 f"for n in {' '.join(cmds)}; do for f in checkpoint metrics.jsonl config.json; do "
                 f"[ -e {FOLDER}/$n/$f ] && keep+=(\"$n/$f\"); done; done",
                 f"tar -C {FOLDER} -cf - \"${{keep[@]}}\" | split -b {PART_BYTES} -d -a 2 - \"$OUT/{PACK}.\" || rc=$?"]
    script = "\n".join(head + body + ["exit $rc", ""])
    (dd / "chunk.sh").write_text(script)
    sizes = travel_size(repo, dd)
    sizes.update(limit=limit, command=f"bash {FOLDER}/chunk.sh", train_command="\n".join(cmds.values()), **counts)
    return sizes


def _write_data(repo: Path, dd: Path, data: str, eval_data: str | None, eval_images: int, holdout: int, limit: int,
                data_seed: int) -> dict[str, int]:
    """The held-out images into dd/test, then the training images into dd/train in the room that is
    left of `limit` after the repository's files and everything already in dd (the state)."""
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
    return {"train_images": n_train, "train_images_all": len(train_images), "eval_images": len(held[:eval_images])}


def training_room(repo: str | Path, data: str, eval_data: str | None = None, eval_images: int = 128,
                  limit: int = TRAVEL_LIMIT) -> dict[str, int]:
    """How many of `data`'s training images a chunk that starts from a shipped model (a tracked file:
    nothing but the data is carried) would take along, written to a temporary folder, the
    repository's .device_data untouched. What each `trainer ship` must keep whole for CIFAR-10
    (tests/test_device_chunk.py): else retire kept models first (`trainer retire`)."""
    repo = Path(repo).resolve()
    _git_files(repo)  # a checkout, or one clear error
    with tempfile.TemporaryDirectory() as tmp:
        return _write_data(repo, Path(tmp), data, eval_data, eval_images, 256, limit, 0)


def _unpack_job(returned: Path, job: str | None, into: Path) -> Path:
    """A multi-run chunk's return: the tar's parts put together, the run `job`'s files taken out into
    `into`; returns its folder. ValueError names the runs where job is None or not among them."""
    parts = sorted(returned.glob(PACK + ".[0-9][0-9]"))
    data = b"".join(p.read_bytes() for p in parts)
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            members = [m for m in tar.getmembers() if m.isfile()]
            names = sorted({m.name.split("/", 1)[0] for m in members})
            if job is None or job not in names:
                raise ValueError(f"{returned}: the chunk trained runs {', '.join(names) or '(none)'}: "
                                 f"name the one to unpack (--job)" if job is None else
                                 f"{returned}: no run {job!r} came back (runs: {', '.join(names) or 'none'}; "
                                 f"see {job}.log)")
            for m in members:
                rel = Path(m.name)
                if rel.parts[0] != job or rel.is_absolute() or ".." in rel.parts:
                    continue
                dest = into / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(tar.extractfile(m).read())
    except tarfile.TarError as e:
        raise ValueError(f"{returned}: the chunk's tar is incomplete or damaged ({e}; parts: "
                         f"{', '.join(p.name for p in parts)})") from None
    return into / job


def unpack(returned: str | Path, run: str | Path, job: str | None = None) -> dict:
    """Put a chunk's returned files (a folder: state.json, weights-*.safetensors, metrics.jsonl,
    config.json; or, from a chunk of several runs, the parts of its tar, of which `job` is taken)
    into the local run directory `run`; returns the checkpoint's state."""
    returned, run = Path(returned), Path(run)
    log = "its train.log"
    with tempfile.TemporaryDirectory() as tmp:
        if (returned / (PACK + ".00")).exists():
            where, log = f"{returned} (run {job!r})", f"{job}.log"
            returned = _unpack_job(returned, job, Path(tmp))
        elif job is not None:
            raise ValueError(f"{returned}: a chunk of one run came back (no {PACK}.00): unpack it without --job")
        else:
            where = str(returned)
        if not (returned / "state.json").exists() and not (returned / "checkpoint" / "state.json").exists():
            raise FileNotFoundError(f"{where}: no state.json came back (see {log})")
        src = returned / "checkpoint" if (returned / "checkpoint" / "state.json").exists() else returned
        state = ckpt.copy_checkpoint(src, run / "checkpoint")
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
