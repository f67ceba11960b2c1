"""python -m trainer: train ScoreFlow models and export them for the codec.

\b
  python -m trainer train --preset tiny --data ../shared/data/cifar10/train.npz \\
      --eval-data ../shared/data/cifar10/test.npz --steps 300 --out runs/tiny
  python -m trainer train --out runs/tiny --steps 600          # resume: same --out, more steps
  torchrun --nproc_per_node 4 -m trainer train --preset base ...  # several GPUs (DDP)
  python -m trainer export runs/tiny -o tiny.safetensors
  python -m trainer ship tiny.safetensors --as tiny --description "..."  # into the package's zoo
  python -m trainer retire cifar10-1 photo-1       # kept models out of the package (room)
  python -m trainer device-prep --data ... --eval-data ... --run runs/x  # a chunk on a lent GPU
  sfcodec compress img.png -o img.sfc --model tiny.safetensors
"""
from __future__ import annotations

import json
import logging
import sys
from contextlib import contextmanager
from pathlib import Path

import click

from scoreflow_codec.coding.modes import STEPS_RANGE, TILE_RANGE

from .config import TrainConfig


@contextmanager
def _input_errors():
    """A missing or malformed input (data, run directory, model file, returned files) is the user's:
    one line on stderr and exit 2, never a traceback."""
    from scoreflow_codec.errors import ModelError

    try:
        yield
    except (FileNotFoundError, ValueError, ModelError) as e:
        click.echo(f"trainer: error: {e}", err=True)
        sys.exit(2)


def _new_output(path: Path, force: bool) -> None:
    """ValueError (one line, exit 2) where -o names a folder, or a file that exists and --force is not given:
    an export or a plot never replaces a file of the user's (an image given by mistake) unasked."""
    if path.is_dir():
        raise ValueError(f"{path}: is a folder (-o takes a file name)")
    if path.exists() and not force:
        raise ValueError(f"{path} exists (--force overwrites it)")


@click.group(help=__doc__)
def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")


@main.command()
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Run directory (resumes if it has a checkpoint).")
@click.option("--preset", default=None, help="tiny | cpu | small | base | ddpmpp")
@click.option("--data", default=None, help=".npz of uint8 images or a folder of images.")
@click.option("--eval-data", default=None, help="Held-out .npz / folder (default: hold out part of --data).")
@click.option("--steps", type=click.IntRange(min=0), default=None, help="Total steps to reach (resume continues to this).")
@click.option("--batch", type=click.IntRange(min=1), default=None, help="Global batch size.")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=None)
@click.option("--warmup", type=click.IntRange(min=0), default=None)
@click.option("--decay-from", type=click.IntRange(min=0), default=None,
              help="From this step the lr falls linearly to --lr-end at --steps (a cool-down; 0: constant lr).")
@click.option("--lr-end", type=click.FloatRange(min=0), default=None, help="The lr reached at --steps with --decay-from (default 0).")
@click.option("--ema", type=click.FloatRange(0, 1, max_open=True), default=None)
@click.option("--grad-clip", type=click.FloatRange(min=0), default=None, help="0: no clipping.")
@click.option("--dropout", type=click.FloatRange(0, 1, max_open=True), default=None)
@click.option("--crop", type=click.IntRange(min=2), default=None, help="Training crop size (folders: random crops).")
@click.option("--min-scale", type=click.FloatRange(0, 1, min_open=True), default=None, help="Random down-scaling of folder images to [s, 1].")
@click.option("--grain", type=click.FloatRange(min=0), default=None,
              help="Half the crops get Gaussian noise of a sigma drawn from [0, S] 8-bit levels, rounded: film "
                   "grain and sensor noise, which down-scaling removes (default 0: none).")
@click.option("--no-flip", is_flag=True, default=False)
@click.option("--sde", type=click.Choice(["vp", "subvp", "ve"]), default=None)
@click.option("--dequant", type=click.Choice(["variational", "uniform"]), default=None)
@click.option("--weighting", type=click.Choice(["likelihood", "original"]), default=None)
@click.option("--no-importance", is_flag=True, default=False, help="Uniform t instead of p(t) ~ g^2/sigma^2.")
@click.option("--init-from", default=None, help="Start from another run's EMA score model (a run dir) or an exported model file.")
@click.option("--freeze-model", is_flag=True, default=False,
              help="Train only the dequantizer (ScoreFlow's second stage; use with --init-from).")
@click.option("--max-minutes", type=click.FloatRange(min=0), default=None, help="Stop and checkpoint after this many minutes.")
@click.option("--cool-minutes", type=click.FloatRange(min=0), default=None,
              help="With --max-minutes: the lr falls linearly to --lr-end over its last this many minutes "
                   "(a cool-down timed by the clock, for a chunk whose step count is not known ahead).")
@click.option("--profile-steps", type=click.IntRange(min=0), default=None,
              help="Profile this many steps (after 5 warm ones) and write where their time went to the log.")
@click.option("--eval-every", type=click.IntRange(min=0), default=None, help="0: at the end only.")
@click.option("--eval-images", type=click.IntRange(min=1), default=None)
@click.option("--eval-n-t", type=click.IntRange(min=1), default=None)
@click.option("--save-every", type=click.IntRange(min=0), default=None, help="0: at the end only.")
@click.option("--log-every", type=click.IntRange(min=1), default=None)
@click.option("--seed", type=int, default=None)
@click.option("--no-bf16", is_flag=True, default=False)
@click.option("--device", default=None, help="cpu | cuda (default: cuda if available).")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU threads for torch.")
@click.option("--no-progress", is_flag=True, default=False)
@click.option("--compact-checkpoint", is_flag=True, default=False,
              help="Store checkpoints in 8 bytes per parameter instead of 16 (for GPU chunks; see docs/TRAINING.md).")
def train(out, device, threads, no_progress, no_flip, no_importance, no_bf16, freeze_model, compact_checkpoint, **kw):
    """Train (or resume) a run."""
    import torch

    from scoreflow_codec.models import device_problem  # not api: the device machine has no constriction

    from .train import train as run

    problem = device and device_problem(device)
    if problem:  # before: "Expected a torch.device with a specified index or an integer, but got:cuda"
        raise click.UsageError(f"--device {device}: {problem}")

    if threads:
        torch.set_num_threads(threads)
    cfg_file = out / "config.json"
    base = TrainConfig.from_dict(json.loads(cfg_file.read_text())) if cfg_file.exists() else TrainConfig()
    # A time limit is this command's, not the run's: a resumed run without --max-minutes has none
    # (the run directory's config.json keeps the last one only as a record); so is its cool-down.
    base = base.override(max_minutes=0.0, cool_minutes=0.0, profile_steps=0)  # so is a profile
    if no_flip:
        kw["flip"] = False
    if no_importance:
        kw["importance"] = False
    if no_bf16:
        kw["bf16"] = False
    if freeze_model:
        kw["freeze_model"] = True
    if compact_checkpoint:
        kw["compact_checkpoint"] = True
    cfg = base.override(**kw)
    if not cfg.data:
        raise click.UsageError("--data is required for a new run")
    if cfg.cool_minutes and not (cfg.max_minutes > cfg.cool_minutes):
        raise click.UsageError("--cool-minutes is the end of --max-minutes: give a --max-minutes longer than it")
    with _input_errors():
        res = run(cfg, out, device=device, progress=not no_progress)
    click.echo(json.dumps(res))


@main.command()
@click.argument("run", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path), help="The .safetensors to write.")
@click.option("--fp16", is_flag=True, help="Store weights in float16 (half the size; measure the bpd effect).")
@click.option("--name", default=None, help="Model name recorded in the file (default: the file stem).")
@click.option("--calib-images", type=int, default=512, show_default=True,
              help="Training images to measure the denoising-error table on (0: none).")
@click.option("--calib-data", default=None, type=click.Path(exists=True, path_type=Path),
              help="Where those images are (.npz or folder; default: the run's --data, which a device run "
                   "had in its .device_data copy: give the original).")
@click.option("--tile", type=click.IntRange(*TILE_RANGE), default=None,
              help="The tile size the codec uses with it unless told otherwise (default: 32; photos: 64).")
@click.option("--chain-steps", type=click.IntRange(*STEPS_RANGE), default=None,
              help="The chain mode's steps with it unless told otherwise (default: the codec's 128).")
@click.option("--force", is_flag=True, help="Overwrite the output if it exists.")
def export(run, output, fp16, name, calib_images, calib_data, tile, chain_steps, force):
    """Export a run's EMA model for the codec (one .safetensors with its config)."""
    from .train import export as do_export

    with _input_errors():
        _new_output(output, force)
        sha = do_export(run, output, dtype="float16" if fp16 else "float32", name=name, calib_images=calib_images,
                        tile=tile, chain_steps=chain_steps, calib_data=calib_data)
    click.echo(f"{output}: sha256 {sha}")


@main.command()
@click.argument("model_file", type=click.Path(path_type=Path))
@click.option("--as", "name", required=True, help="The zoo name it ships as (e.g. cifar10).")
@click.option("--keep-as", default=None,
              help="Where the name ships already: the name its model keeps (e.g. cifar10-8), so that its files decode.")
@click.option("--description", required=True, help="The index's line on the new model.")
@click.option("--old-description", default=None, help="The index's line on the kept model (default: says whence).")
@click.option("--old-version", default=None, help="The release the kept model was the name's in (default: this one).")
@click.option("--card", default=None, type=click.Path(path_type=Path),
              help="The new model's card (default: the old card's text, to be updated).")
@click.option("--curve", default=None, type=click.Path(path_type=Path), help="Its training curve (trainer plot).")
@click.option("--tile", type=click.IntRange(*TILE_RANGE), default=None,
              help="Its default tile (default: the file's, else the old entry's, else 32).")
@click.option("--chain-steps", type=click.IntRange(*STEPS_RANGE), default=None,
              help="Its default chain-mode steps (default: the file's, else the old entry's, else the codec's 128).")
@click.option("--default", "make_default", is_flag=True, help="Make it the zoo's default model.")
@click.option("--zoo", "zoo_dir", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="The zoo folder (default: the package's, scoreflow_codec/zoo).")
def ship(model_file, zoo_dir, **kw):
    """Put an exported model into the zoo under a name (the model that had it keeps another)."""
    from scoreflow_codec.zoo import ZOO_DIR

    from .ship import ship as do_ship

    with _input_errors():
        s = do_ship(model_file, zoo_dir=zoo_dir or ZOO_DIR, **kw)
    kept = f"; the previous {s.name} is now {s.kept_as}" if s.kept_as else ""
    click.echo(f"shipped {model_file} as {s.name} (sha256 {s.sha256}){kept}")
    if s.card_from_old:
        click.echo(f"{s.name}.md is the previous card's text: put the new model's numbers in it", err=True)


@main.command()
@click.argument("names", nargs=-1, required=True)
@click.option("--commit", default="HEAD", show_default=True,
              help="The commit whose files old files' errors point to (it must hold each file as it is).")
@click.option("--release", default=None, help="The last release that shipped them (default: this one).")
@click.option("--zoo", "zoo_dir", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="The zoo folder (default: the package's, scoreflow_codec/zoo).")
def retire(names, commit, release, zoo_dir):
    """Take kept models out of the zoo: files made with them then get one error naming the release
    and commit that have them (to make room: every tracked byte travels with a GPU chunk)."""
    from scoreflow_codec.zoo import ZOO_DIR

    from .ship import retire as do_retire

    with _input_errors():
        r = do_retire(list(names), zoo_dir or ZOO_DIR, commit=commit, release=release)
    click.echo(f"retired {', '.join(r.names)} ({r.freed / 2**20:.1f} MiB of files removed); their files stay "
               f"in commit {r.commit}, the last release that shipped them is {r.release}")


@main.command("device-prep")
@click.option("--data", required=True, help="Training .npz or folder (written to .device_data/train as WebP).")
@click.option("--eval-data", default=None,
              help="Held-out .npz or folder (its first --eval-images go; default: hold out part of --data, as the trainer does).")
@click.option("--run", "run_dir", default=None, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="The run to continue (its checkpoint travels in the compact layout).")
@click.option("--init-from", default=None, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Or a model file to start a new run from.")
@click.option("--minutes", type=click.FloatRange(min=0, min_open=True), default=7.0, show_default=True,
              help="Training time of the chunk.")
@click.option("--eval-images", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--train-args", default="", help='More trainer options, e.g. "--preset small --batch 128".')
@click.option("--data-seed", type=int, default=0, show_default=True,
              help="Which random part of the training images goes where not all fit (another per chunk).")
@click.option("--cool-minutes", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="The lr falls linearly to the runs' --lr-end over the chunk's last this many minutes.")
@click.option("--jobs", "jobs_file", default=None, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help='Several runs at once on the GPU: a JSON list of {"name", "run" or "init_from", "train_args"} '
                   "(instead of --run / --init-from / --train-args).")
@click.option("--repo", default=".", type=click.Path(exists=True, file_okay=False, path_type=Path), show_default=True)
def device_prep(data, eval_data, run_dir, init_from, minutes, eval_images, train_args, data_seed, cool_minutes,
                jobs_file, repo):
    """Prepare one GPU training chunk in .device_data/ (checks the 64 MiB the device call takes)."""
    from .device import Job, describe, prepare

    with _input_errors():
        jobs = None
        if jobs_file is not None:
            try:
                spec = json.loads(jobs_file.read_text())
                jobs = [Job(**j) for j in spec]
            except (json.JSONDecodeError, TypeError) as e:
                raise ValueError(f"{jobs_file}: not a list of jobs ({{\"name\", \"run\" or \"init_from\", "
                                 f"\"train_args\"}}): {e}") from None
            for j in jobs:
                for src in (j.run, j.init_from):
                    if src is not None and not Path(src).exists():
                        raise FileNotFoundError(f"{jobs_file}: job {j.name!r}: {src} does not exist")
        sizes = prepare(repo, data, eval_data, run_dir, init_from, minutes, eval_images, train_args,
                        data_seed=data_seed, cool_minutes=cool_minutes, jobs=jobs)
    click.echo(describe(sizes))


@main.command("device-unpack")
@click.argument("returned", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--run", "run_dir", required=True, type=click.Path(path_type=Path), help="Local run directory.")
@click.option("--job", default=None, help="From a chunk of several runs (--jobs): which one.")
def device_unpack(returned, run_dir, job):
    """Put what a GPU chunk returned (its $OUT files) into a local run directory."""
    from .device import unpack

    with _input_errors():
        state = unpack(returned, run_dir, job)
    click.echo(f"{run_dir}: checkpoint at step {state['step']}")


@main.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path), help="PNG to write.")
@click.option("--title", default="")
@click.option("--force", is_flag=True, help="Overwrite the output if it exists.")
def plot(runs, output, title, force):
    """Plot the training curve(s) of one or more runs (in order) to a PNG."""
    from .report import plot_curve

    with _input_errors():
        _new_output(output, force)
        plot_curve(list(runs), output, title)
    click.echo(str(output))


if __name__ == "__main__":
    main()
