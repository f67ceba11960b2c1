#!/usr/bin/env python
"""Benchmark scoreflow-codec against classical lossless codecs.

    python bench/run.py cifar10 --limit 100 --codecs classical
    python bench/run.py kodak --codecs png,webp,jpegxl
    python bench/run.py cifar10 --model NAME|PATH --mode ode      # + the scoreflow columns
    python bench/run.py --quick --codecs classical                  # a few small images

Prints a Markdown table per set and writes results/<timestamp>_<set>/ (results.json,
results.csv, plots). bits/dim = 8 * bytes / (H * W * C), C = the image's channels.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import classical, datasets, report, scoreflow_runner  # noqa: E402
from bench.datasets import DataError  # noqa: E402
from bench.scoreflow_runner import ScoreflowError  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.split("\n")[0])
    p.add_argument("sets", nargs="*", metavar="SET_OR_PATH",
                   help=f"named set ({', '.join(datasets.NAMED)}), .npz file or image folder")
    p.add_argument("--limit", type=int, metavar="N", help="only the first N images of each set")
    p.add_argument("--model", metavar="NAME|PATH", default="auto",
                   help="scoreflow model: a zoo name, a file, or auto (as sfcodec compress: by the "
                        "set's image sizes, cifar10 up to 64x64, photo above)")
    p.add_argument("--mode", choices=["chain", "ode"], default="chain", help="as sfcodec compress (default chain)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--codecs", default="all",
                   help="all | classical | scoreflow | comma list, e.g. png,webp,scoreflow "
                        f"(classical: {', '.join(classical.BY_NAME)})")
    p.add_argument("--setting", action="append", default=[], metavar="KEY=VALUE",
                   help="extra keyword for api.compress (repeatable), e.g. steps=64; fallback=off: "
                        "the files are the model's stream even where the seed codec alone is smaller; with it "
                        "seed_tiles=first: the model codes every tile but the few the chain needs (its own coding)")
    p.add_argument("--out", type=Path, default=Path("results"), help="results folder")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's). On a busy machine 1 is far faster than "
                        "oversubscribed cores, whose spin-waiting threads can slow torch 100-fold")
    p.add_argument("--jobs", type=int, default=1,
                   help="scoreflow: code and evaluate the images in this many worker processes, each "
                        "with --threads torch threads (default 1 there); e.g. --jobs 2 on two cores")
    p.add_argument("--eval-n-t", type=int, default=1000, help="time samples for the bound")
    p.add_argument("--eval-rtol", type=float, default=1e-5, help="rtol = atol of the ODE NLL solver")
    p.add_argument("--no-nll", action="store_true", help="skip the ODE NLL (the slowest column)")
    p.add_argument("--no-stream", action="store_true",
                   help="skip the whole-set stream (it codes every image a second time; on large "
                        "images it differs from the single files only by the per-file overhead)")
    p.add_argument("--quick", action="store_true",
                   help="2 CIFAR-10 test images + one 64x32 crop, instead of SET_OR_PATH; with a "
                        "scoreflow column it also codes with 16 steps and evaluates loosely (CI smoke test)")
    args = p.parse_args(argv)
    args.argv = sys.argv if argv is None else [p.prog, *argv]
    if args.quick == bool(args.sets):
        p.error("give SET_OR_PATH ... or --quick (not both)")
    if args.limit is not None and args.limit < 1:
        p.error("--limit must be at least 1")
    if args.jobs < 1:
        p.error("--jobs must be at least 1")
    if args.eval_n_t < 1:
        p.error("--eval-n-t must be at least 1")
    if not args.eval_rtol > 0:
        p.error("--eval-rtol must be above 0")
    try:
        args.classical, args.scoreflow = parse_codecs(args.codecs)
        args.sf_settings = dict(_key_value(s) for s in args.setting)
        args.sf_eval = {"n_t": args.eval_n_t, "rtol": args.eval_rtol, "atol": args.eval_rtol, "ode": not args.no_nll}
        if args.quick:
            args.sf_settings.setdefault("steps", 16)
            args.sf_eval.update(n_t=min(args.eval_n_t, 16), rtol=max(args.eval_rtol, 1e-2),
                                atol=max(args.eval_rtol, 1e-2))
    except ValueError as e:
        p.error(str(e))
    return args


def parse_codecs(spec: str) -> tuple[list[str], bool]:
    """'all' | 'classical' | 'scoreflow' | comma list -> (classical names, scoreflow?)."""
    names, scoreflow = [], False
    for item in filter(None, (s.strip() for s in spec.split(","))):
        if item in ("all", "classical"):
            names += list(classical.BY_NAME)
            scoreflow |= item == "all"
        elif item == "scoreflow":
            scoreflow = True
        elif item in classical.BY_NAME:
            names.append(item)
        else:
            raise ValueError(f"unknown codec {item!r}; known: all, classical, scoreflow, "
                             f"{', '.join(classical.BY_NAME)}")
    if not names and not scoreflow:
        raise ValueError("--codecs selects nothing")
    return list(dict.fromkeys(names)), scoreflow


def _key_value(s: str) -> tuple[str, object]:
    key, sep, value = s.partition("=")
    if not sep or not key:
        raise ValueError(f"--setting expects KEY=VALUE, got {s!r}")
    for cast in (int, float):
        try:
            return key, cast(value)
        except ValueError:
            pass
    return key, {"true": True, "false": False}.get(value.lower(), value)


def scoreflow_label(args, model) -> str:
    """The scoreflow column's settings as one line, the steps included: a model may bring its own
    (the shipped cifar10 chains 256), and --setting steps=N overrides them."""
    steps = scoreflow_runner.coding_steps(args.mode, model, args.sf_settings)
    return (f"model={args.model} mode={args.mode} steps={steps} device={args.device} "
            f"arith={args.sf_settings.get('arith', 'exact64')}"
            f"{' seed_tiles=' + args.sf_settings['seed_tiles'] if 'seed_tiles' in args.sf_settings else ''}")


def bench_set(imgset: datasets.ImageSet, codecs, skipped: dict, model, args, model_ref: str | None = None) -> dict:
    sf_label = scoreflow_label(args, model) if model is not None else None
    total = len(imgset) * (len(codecs) + (model is not None))
    bar = _progress(total, imgset.name)
    rows = []
    for img, name in zip(imgset.images, imgset.names):
        h, w, c = img.shape
        for codec in codecs:
            m = classical.measure(codec, img)
            rows.append({"image": name, "height": h, "width": w, "channels": c,
                         "settings": codec.settings, **vars(m)})
            bar(1)
    sf = None
    if model is not None:
        sf = scoreflow_runner.run(imgset.images, imgset.names, model, args.mode, args.device,
                                  args.sf_settings, progress=bar, eval_options=args.sf_eval,
                                  stream=not args.no_stream, jobs=args.jobs, model_ref=model_ref,
                                  threads=args.threads)
        for img, r in zip(imgset.images, sf["per_image"]):
            h, w, c = img.shape
            rows.append({"height": h, "width": w, "channels": c, "codec": "scoreflow",
                         "settings": sf_label, "coded_channels": c, **r})
        sf["model"] = scoreflow_runner.model_info(model, args.model)
    bar(0, close=True)
    return {
        "set": {"name": imgset.name, "source": imgset.source, "n_images": len(imgset),
                "notes": imgset.notes},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": {"argv": args.argv, "limit": args.limit, "codecs": args.codecs,
                     "classical": {c.name: c.settings for c in codecs},
                     "scoreflow": sf_label,
                     "scoreflow_settings": args.sf_settings,
                     "jobs": args.jobs, "threads": args.threads,
                     "bpd": "8 * bytes / (H * W * C), C = the input image's channels",
                     "timing": "wall clock per call (time.perf_counter), encoders "
                               "single-threaded where the library allows; includes no I/O"},
        "machine": report.machine_info(),
        "summary": report.summarize(rows),
        "per_image": rows,
        "scoreflow": sf and {"model": sf["model"], "stream": sf["stream"]},
        "skipped": skipped,
        "published_reference": report.PUBLISHED_CIFAR10_TEST_BPD,
    }


def _progress(total: int, desc: str):
    try:
        from tqdm import tqdm
    except ImportError:
        return lambda n, close=False: None
    t = tqdm(total=total, desc=desc, unit="code", file=sys.stderr, disable=None)

    def step(n: int, close: bool = False):
        t.update(n)
        if close:
            t.close()
    return step


def main(argv=None) -> int:
    args = parse_args(argv)
    from scoreflow_codec.threads import spin_briefly

    spin_briefly()  # as sfcodec does, before torch loads
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        codecs, skipped = classical.select(args.classical) if args.classical else ([], {})
        model = None
        if args.scoreflow and args.model != "auto":
            model = scoreflow_runner.load_model(args.model, args.device)
        sets = [datasets.quick_set()] if args.quick else \
            [datasets.load(s, args.limit) for s in args.sets]
        if not codecs and not args.scoreflow:
            raise DataError("no codec is available: " + "; ".join(
                f"{k}: {v}" for k, v in skipped.items()))
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for imgset in sets:
            set_model, model_ref = model, args.model
            if args.scoreflow and model is None:  # auto: as the CLI picks, by the set's image sizes
                sizes = [(im.shape[1], im.shape[0]) for im in imgset.images]
                model_ref = scoreflow_runner.resolve_model("auto", sizes)
                set_model = scoreflow_runner.load_model(model_ref, args.device)
            result = bench_set(imgset, codecs, skipped, set_model, args, model_ref)
            safe_name = re.sub(r"[^A-Za-z0-9._-]+", "_", imgset.name)
            outdir = _fresh_dir(args.out / f"{stamp}_{safe_name}")
            report.write(result, outdir)
            print(report.markdown(result))
            print(f"\nresults: {outdir}\n", flush=True)
    except (DataError, ScoreflowError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if isinstance(e, (DataError, scoreflow_runner.ModelLoadError)) else 1
    return 0


def _fresh_dir(path: Path) -> Path:
    candidate, i = path, 1
    while candidate.exists():
        i += 1
        candidate = path.with_name(f"{path.name}-{i}")
    return candidate


if __name__ == "__main__":
    sys.exit(main())
