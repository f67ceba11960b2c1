#!/usr/bin/env python
"""A model's ODE NLL on a whole test set, measured on a random sample of its images and anchored to
the likelihood bound of all of them.

    python bench/ode_sample.py run DIR --model cifar10 --n 160 --workers 2 --minutes 100
    python bench/ode_sample.py show DIR --bound b0.json --bound b300.json --bound b600.json

The ODE NLL (`sfcodec eval` without --no-ode) costs about 1.5 minutes of one CPU core a CIFAR-10
image, the bound with 64 time samples about 2 seconds: all 900 test images' bound is cheap, their
ODE NLL is not. Across images the two move together (the ODE NLL minus the bound varies by about
0.07 bits/dim image to image, the images themselves by 0.4), so the ODE NLL of all of them is
estimated from a sample by the regression estimator (`scoreflow_codec.estimate.weighted_mean`): the
sample's mean ODE NLL corrected by its slope on the bound times how far the sample's bound lies from
the bound of every image; or, the same idea with a slope of one, the bound of every image plus the
sample's mean gap below each image's own bound (`show` gives both). Standard errors: no
finite-population correction (conservative, and right for the ODE's own noise, the Hutchinson
probe's, which does not shrink as the sample grows).

`run` draws the sample (the first --n of `numpy.random.default_rng(--seed).permutation(N)`, or the
order in --indices, a .npy of image indices), writes it to DIR as parts of --part images
(partNNN.npz) and evaluates part k with `sfcodec eval PART --model M --seed S+k --json`
(partNNN.json; S is --draw-seed, 1000 by default), --workers processes at a time, each with
OMP_NUM_THREADS=--threads. It can be stopped and started again (a part is claimed by a partNNN.lock
folder holding the run's process id; a killed run's parts are taken again), stops starting parts after
--minutes, or when a file DIR/STOP appears (the parts under way finish). DIR/manifest.json records the
data set, the model, the sample, each part's seed and eval's options; a second `run` on the same DIR
must name the same ones.

Why a seed per part: eval draws each image's numbers (its dequantization, time samples, noise, the
Hutchinson probe) from one stream per process, so with one seed for every part, as until 0.9.56, the
images at the same place in their parts drew the same numbers, and their errors moved together: the
probe's error is largely the same for different CIFAR-10 images (mean ODE NLL minus bound by place in
the part, 0.9.56's 80-image sample: +0.031, -0.046, -0.001, -0.073, each +- 0.009), so such a
sample's mean carried the error of only part-size draws. `show` reads those samples too, with
standard errors over their sets of draws (estimate.weighted_mean's groups); `run` does not add to them.
The same holds across samples: two samples whose estimates are to be pooled must not share draws, so
give the second another --draw-seed (at least the first one's number of parts above it; the sample
of 0.9.58's `cifar10`, taken after its ship, took 2000; 0.9.57's of the `cifar10` before it, 1000).

`show` reads the parts that are done: each image's ODE NLL and its own bound (1000 time samples),
their means with standard errors over the sample, and with --bound (eval JSONs of every image of the
data set in order, e.g. `sfcodec eval test.npz --no-ode --n-t 64 --seed S --json` on a few files, each
with its own S for the same reason) the estimate for the whole set, three ways: the regression above;
the bound of every image plus the sample's mean ODE NLL below each image's own 1000-sample bound (the
tightest where the bound files take few time samples, 64); and the bound of every image plus the
sample's mean ODE NLL below the --bound files' own value for each sampled image (the regression with a
slope of one; wider, since the 64-sample bound's noise is in it: evaluate the sample's images again
with other --seed values and average to narrow it). Both bounds estimate each image's bound without
bias (0.9.56 reported the 1000-sample bound 0.0070 +- 0.0020 above the 64-sample one on 192 images:
that was the shared draws above, the standard error taken as if the images' errors were independent).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import datasets  # noqa: E402
from bench.cli_times import sfcodec_command  # noqa: E402
from scoreflow_codec.estimate import weighted_mean  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MANIFEST = "manifest.json"
PART_SEED = 1000  # --draw-seed's default: part k evaluates with --seed PART_SEED + k, so no two images of a
# sample share their draws


class SampleError(Exception):
    """One line for the user: a missing data set, a DIR of another sample, unusable bound files."""


def _part_name(k: int) -> str:
    return f"part{k:03d}"


def _manifest(args, total: int) -> dict:
    if args.indices:
        try:
            order = np.load(args.indices).astype(np.int64).ravel()
        except (OSError, ValueError) as e:
            raise SampleError(f"--indices {args.indices}: not a .npy of image indices ({e})") from None
        if len(order) == 0 or order.min() < 0 or order.max() >= total or len(set(order.tolist())) != len(order):
            raise SampleError(f"--indices {args.indices}: expected distinct indices in 0 .. {total - 1}")
        order = order[:args.n]
    else:
        order = np.random.default_rng(args.seed).permutation(total)[:args.n]
    eval_args = ["--rtol", str(args.rtol), "--atol", str(args.atol), "--probes", str(args.probes),
                 "--n-t", str(args.n_t)]
    parts = [{"name": _part_name(k // args.part), "indices": [int(i) for i in order[k:k + args.part]],
              "seed": args.draw_seed + k // args.part} for k in range(0, len(order), args.part)]
    return {"data": args.data, "total": total, "model": args.model, "eval_args": eval_args, "parts": parts}


def _claim(lock: Path) -> bool:
    """Take a part: its lock folder, with this process's id in it. A lock whose process is gone (a run
    that was killed) is taken over."""
    try:
        lock.mkdir()
    except FileExistsError:
        try:
            os.kill(int((lock / "pid").read_text()), 0)
            return False  # its process is alive (maybe another run's)
        except ProcessLookupError:
            pass  # a killed run's: take it
        except (OSError, ValueError):
            return False  # being written just now
    (lock / "pid").write_text(str(os.getpid()))
    return True


def _release(lock: Path) -> None:
    (lock / "pid").unlink(missing_ok=True)
    lock.rmdir()


def run(args) -> int:
    try:
        imgs = datasets.load(args.data)
    except datasets.DataError as e:
        raise SampleError(str(e)) from None
    if args.n < 1 or args.part < 1 or args.workers < 1:
        raise SampleError("--n, --part and --workers must be positive")
    if args.draw_seed < 0:
        raise SampleError("--draw-seed must be 0 or more")
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    want = _manifest(args, len(imgs))
    path = out / MANIFEST
    if path.exists():
        have = json.loads(path.read_text())
        if have["parts"] and "seed" not in have["parts"][0]:
            raise SampleError(f"{out} holds a sample begun before 0.9.57, whose parts all drew with --seed 0 (the "
                              "images at the same place in their parts share their draws): `show` still reads it; "
                              "run new samples in another DIR")
        if {k: have.get(k) for k in want} != want:
            raise SampleError(f"{out} holds another sample (its {MANIFEST}: {have['data']}, {have['model']}, "
                              f"{sum(len(p['indices']) for p in have['parts'])} images, --draw-seed "
                              f"{have['parts'][0]['seed'] if have['parts'] else PART_SEED}): use another DIR")
    else:
        path.write_text(json.dumps(want, indent=1))
    for p in want["parts"]:
        f = out / f"{p['name']}.npz"
        if not f.exists():
            np.savez(f, images=np.stack([imgs.images[i] for i in p["indices"]]))
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    deadline = time.monotonic() + 60 * args.minutes if args.minutes else None
    failed, lock = [], threading.Lock()

    def worker() -> None:
        for p in want["parts"]:
            if (out / "STOP").exists() or (deadline and time.monotonic() > deadline):
                return
            name = p["name"]
            if (out / f"{name}.json").exists():
                continue
            if not _claim(out / f"{name}.lock"):
                continue
            if (out / f"{name}.json").exists():  # finished by another worker between the look and the claim
                _release(out / f"{name}.lock")
                continue
            t0 = time.monotonic()
            tmp = out / f"{name}.part"
            with open(tmp, "w") as f:
                r = subprocess.run(sfcodec_command() + ["eval", str(out / f"{name}.npz"), "--model", want["model"],
                                                 *want["eval_args"], "--seed", str(p["seed"]), "--json"],
                                   stdout=f, stderr=subprocess.PIPE, text=True, env=env)
            with lock:
                if r.returncode == 0:
                    tmp.replace(out / f"{name}.json")
                    print(f"{name}: {len(p['indices'])} images in {time.monotonic() - t0:.0f} s", flush=True)
                else:
                    failed.append(name)
                    why = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
                    print(f"{name}: failed: {why}", flush=True)
            _release(out / f"{name}.lock")

    threads = [threading.Thread(target=worker) for _ in range(args.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done = sum((out / f"{p['name']}.json").exists() for p in want["parts"])
    print(f"{done} of {len(want['parts'])} parts done in {out}")
    return 1 if failed else 0


def _draw_seed(man: dict, part: dict) -> int:
    """The --seed a part was evaluated with: its own since 0.9.57, before that eval_args' (0) for all."""
    if "seed" in part:
        return int(part["seed"])
    args = man["eval_args"]
    return int(args[args.index("--seed") + 1])


def _rows(out: Path) -> tuple[dict, list[tuple[int, dict]], set[str]]:
    """The manifest, (image index, eval row) of every part done, and the model files' sha256s. Each row
    also gets "draws": which random draws it was evaluated with (its part's --seed, its place in the part)."""
    path = out / MANIFEST
    if not path.exists():
        raise SampleError(f"{out}: no {MANIFEST} (not a `run` folder)")
    man = json.loads(path.read_text())
    rows, shas = [], set()
    for p in man["parts"]:
        f = out / f"{p['name']}.json"
        if not f.exists():
            continue
        got = json.loads(f.read_text())
        if len(got["rows"]) != len(p["indices"]):
            raise SampleError(f"{f}: {len(got['rows'])} rows for {len(p['indices'])} images")
        shas.add(got["sha256"])
        seed = _draw_seed(man, p)
        rows += [(i, {**r, "draws": f"{seed}:{j}"}) for j, (i, r) in enumerate(zip(p["indices"], got["rows"]))]
    return man, rows, shas


def _bounds(files: list[str], total: int, sha: str | None) -> np.ndarray:
    vals = []
    for name in files:
        try:
            got = json.loads(Path(name).read_text())
            vals += [r["bound_bpd"] for r in got["rows"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SampleError(f"--bound {name}: not an `sfcodec eval --json` file ({e})") from None
        if sha and got.get("sha256", sha) != sha:
            raise SampleError(f"--bound {name}: another model's (sha256 {got['sha256'][:12]}, the sample's {sha[:12]})")
    if len(vals) != total:
        raise SampleError(f"--bound: {len(vals)} images in all, the data set has {total}")
    return np.asarray(vals, np.float64)


def summarize(man: dict, rows: list[tuple[int, dict]], bounds: np.ndarray | None) -> dict:
    """The sample's means (standard errors) and, with every image's bound, the whole set's estimate."""
    n = len(rows)
    if n == 0:
        raise SampleError("no part is done yet")
    ode = np.array([r["ode_nll_bpd"] for _, r in rows])
    own = np.array([r["bound_bpd"] for _, r in rows])
    ones = np.ones(n)
    draws = np.array([r["draws"] for _, r in rows])
    s = {"images": n, "total": man["total"], "model": man["model"], "draw_sets": len(set(draws.tolist()))}
    for k, v in (("ode_nll", ode), ("bound_1000", own), ("gap", ode - own)):
        m, se = weighted_mean(v, ones, groups=draws)
        s[k] = {"mean": m, "se": se}
    if bounds is not None:
        idx = np.array([i for i, _ in rows])
        b = bounds[idx]
        m, se = weighted_mean(ode, ones, covariate=b, covariate_mean=float(bounds.mean()), groups=draws)
        s["bound_all"] = float(bounds.mean())
        s["estimate"] = {"mean": m, "se": se, "slope": float(np.polyfit(b, ode, 1)[0]) if n > 1 else None}
        # the bound of all plus the sample's gap below its own bound: both bounds estimate each image's
        # bound without bias, the few-sample one (--bound) with more noise, which over all the images
        # averages out to its spread over sqrt(total) (the spread of b - own bounds it from above)
        noise = float(np.std(b - own, ddof=1) / np.sqrt(man["total"])) if n > 1 else float("inf")
        s["by_gap"] = {"mean": float(bounds.mean() + s["gap"]["mean"]), "se": float(np.hypot(s["gap"]["se"], noise))}
        # the same with the --bound files' own values on the sample: wider (their noise is in it), but it
        # needs neither bound's mean to be right, only each image's difference
        m, se = weighted_mean(ode - b, ones, groups=draws)
        s["by_gap_same"] = {"mean": float(bounds.mean() + m), "se": se}
    return s


def report(s: dict) -> str:
    def f(k):
        return f"{s[k]['mean']:.4f} +- {s[k]['se']:.4f}"
    lines = [f"{s['model']}: {s['images']} of {s['total']} images",
             f"  ODE NLL on the sample        {f('ode_nll')}",
             f"  bound (1000 t) on the sample {f('bound_1000')}",
             f"  ODE NLL - bound              {f('gap')}"]
    if s["draw_sets"] < s["images"]:
        lines.insert(1, f"  (parts begun before 0.9.57: the images drew from only {s['draw_sets']} sets of random numbers, "
                        "each shared by the images at the same place in their parts; standard errors over those sets)")
    if "estimate" in s:
        lines += [f"  bound on all {s['total']} (--bound)  {s['bound_all']:.4f}",
                  f"  ODE NLL of all {s['total']}, regression on the bound (slope {s['estimate']['slope']:.3f}): "
                  f"{f('estimate')}",
                  f"  ODE NLL of all {s['total']}, bound of all + the sample's ODE NLL - bound: {f('by_gap')}",
                  f"  ODE NLL of all {s['total']}, bound of all + the sample's ODE NLL - that same bound: "
                  f"{f('by_gap_same')}"]
    return "\n".join(lines)


def show(args) -> int:
    man, rows, shas = _rows(Path(args.dir))
    if len(shas) > 1:
        raise SampleError(f"{args.dir}: the parts were evaluated with {len(shas)} different model files")
    sha = next(iter(shas), None)
    s = summarize(man, rows, _bounds(args.bound, man["total"], sha) if args.bound else None)
    s["sha256"] = sha
    print(report(s))
    if args.json:
        Path(args.json).write_text(json.dumps(s, indent=1))
    return 0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/ode_sample.py", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="evaluate the ODE NLL of a random sample, part by part")
    r.add_argument("dir")
    r.add_argument("--model", default="cifar10")
    r.add_argument("--data", default="cifar10", help="a named set (cifar10: the test images), an .npz or a folder")
    r.add_argument("--n", type=int, default=160, help="images in the sample")
    r.add_argument("--seed", type=int, default=20261204, help="the sample's permutation")
    r.add_argument("--indices", default=None, help="a .npy of image indices: the sample, in this order")
    r.add_argument("--draw-seed", type=int, default=PART_SEED,
                   help="part k draws its numbers with eval's --seed DRAW_SEED+k; samples to be pooled need draws "
                        "of their own (no two parts of theirs with the same seed)")
    r.add_argument("--part", type=int, default=8, help="images per eval process")
    r.add_argument("--workers", type=int, default=2)
    r.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each eval process")
    r.add_argument("--minutes", type=float, default=None, help="start no part after this many minutes")
    r.add_argument("--rtol", type=float, default=1e-5)
    r.add_argument("--atol", type=float, default=1e-5)
    r.add_argument("--probes", type=int, default=1)
    r.add_argument("--n-t", type=int, default=1000, help="time samples of each image's own bound")
    s = sub.add_parser("show", help="the sample's means and the whole set's estimate")
    s.add_argument("dir")
    s.add_argument("--bound", action="append", default=[], help="eval JSON(s) of every image's bound, in order")
    s.add_argument("--json", default=None, help="write the figures here too")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return run(args) if args.cmd == "run" else show(args)
    except SampleError as e:
        print(f"ode_sample: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
