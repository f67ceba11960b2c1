#!/usr/bin/env python
"""The GPU's figures in one device call: the models' likelihoods on all the CIFAR-10 test images,
and the codec's times with --device cuda, for a session that is lent a GPU (docs/TRAINING.md).

    python bench/device_figures.py prep --model cifar10 --model cifar10-18      # writes .device_bench/
    # the device tool: run(command="bash .device_bench/run.sh", carry=[".device_bench"], timeout_s=570)
    python bench/device_figures.py show FILES_AT                                 # the tables, paired

On two CPU cores `sfcodec eval` of one model's ODE NLL takes about 2.7 minutes a CIFAR-10 image (87
minutes for 32), so the issue's figure, the ODE NLL on the test images, was only ever estimated from
48 of the 900 (docs/RESULTS.md); a GPU does all 900 in minutes. What the device machine lacks is
brought along: it has no constriction (scoreflow_codec.api imports it) and no network, so `prep`
fetches its wheel for that machine's Python (3.12) here; the repository itself travels as the
working tree, the zoo's models with it, and a model file from elsewhere (a new export) is copied in.

`prep` writes .device_bench/: test-K.npz (the CIFAR-10 test images in --parts parts), cifar.npz (the first
--stream-images of them), kodak/ (the first --kodak Kodak images), models/ (files not in the zoo),
wheels/, plan.json (the steps, each with its command) and run.sh.
`run` (run.sh calls it on the device) takes the steps in order, each in a process of its own with the
time left but what the steps after it reserve (RESERVE_S), writing into a temporary folder, and after
each packs all of it into $OUT/figures.tar, the one file in $OUT: the device returns 8 files at most,
and a step that runs out of time leaves the ones before it intact. The steps:

* eval-NAME-K: `sfcodec eval test-K.npz --model NAME --device DEV --batch 300 --json` (a part's images
  in one batch and one ODE solve: by default each CIFAR-10 image is an ODE solve of batch 1, one
  after another) for each model and each of
  --parts parts of the images (part by part, every model on a part before the next: a step cut
  short loses one part, and what came back is paired), all with the same seed, so the draws
  (dequantization, time samples, probes) are the same for every model and the per-image
  differences are paired;
* cifar: `bench/run.py cifar.npz --codecs scoreflow --model (the first) --device DEV --setting
  arith=float32 --no-nll`: a chain-mode stream and each image's file, encode and decode times
  (float32 files decode only on the kind of device that wrote them: the codec's own rule);
* kodak: the same with the photo model on the Kodak images, one file each (issue 10's times).

`show` prints each model's means with standard errors and its per-image differences from the first
model's (paired), and each bench result's bits/dim and times.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPO = Path(__file__).resolve().parents[1]
FOLDER = ".device_bench"
PACK = "figures.tar"
GPU_PYTHON = "3.12"  # the device machine's python3 (its page in the device tool)
# what each kind of step keeps for itself from the steps before it: the codec's times are worth less
# than the likelihoods, but a few minutes of them are cheap
RESERVE_S = {"eval": 20.0, "cifar": 60.0, "kodak": 90.0}
WHEEL_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                   "manylinux2014_x86_64", "manylinux1_x86_64")


class FiguresError(Exception):
    """One line for the user: bad data, a model that cannot be found, a missing wheel."""


def _wheel(dest: Path, wheel: str | None) -> None:
    """constriction's wheel for the device machine into dest: the file given, or from PyPI (pip
    download for Python 3.12 on x86-64 Linux, this machine's installed version)."""
    dest.mkdir(parents=True, exist_ok=True)
    if wheel:
        src = Path(wheel)
        if not src.is_file() or src.suffix != ".whl":
            raise FiguresError(f"--wheel {wheel}: not a wheel file")
        shutil.copy2(src, dest / src.name)
        return
    from importlib.metadata import version
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", GPU_PYTHON, "--implementation", "cp", "-d", str(dest),
           f"constriction=={version('constriction')}"]
    for p in WHEEL_PLATFORMS:
        cmd += ["--platform", p]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0 or not list(dest.glob("constriction-*.whl")):
        raise FiguresError("could not download constriction's wheel for the device machine "
                           f"({res.stderr.strip().splitlines()[-1:] or 'no wheel'}); give one with --wheel")


def _model_ref(spec: str, names: set[str], models_dir: Path, folder: str) -> tuple[str, str]:
    """(label, what the device passes as --model): a zoo name as it is, a file copied into models/."""
    if spec in names:
        return spec, spec
    path = Path(spec)
    models_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(path, models_dir / path.name)
    return path.stem, f"{folder}/models/{path.name}"


def prep(args) -> dict:
    """Write FOLDER (see the module's docstring); return the plan."""
    import numpy as np
    from PIL import Image

    from bench import datasets

    from scoreflow_codec import zoo

    names = {e["name"] for e in zoo.list_models()}
    for spec in args.model:  # before anything is written
        if spec not in names and not Path(spec).is_file():
            raise FiguresError(f"--model {spec}: neither a model of the zoo nor a file")
    folder = args.folder
    root = Path(args.repo) / folder
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    try:
        test = datasets.load(args.cifar, args.limit)
        if args.kodak:
            kodak = datasets.load("kodak", args.kodak)
    except datasets.DataError as e:
        raise FiguresError(str(e)) from None
    images = np.stack(test.images)
    parts = np.array_split(np.arange(len(images)), min(args.parts, len(images)))
    for k, idx in enumerate(parts):
        np.savez(root / f"test-{k}.npz", images=images[idx])
    np.savez(root / "cifar.npz", images=images[:args.stream_images])
    if args.kodak:
        (root / "kodak").mkdir()
        for im, name in zip(kodak.images, kodak.names):
            Image.fromarray(im).save(root / "kodak" / f"{Path(name).stem}.png")
    if args.wheel != "none":
        _wheel(root / "wheels", args.wheel)
    models = [_model_ref(m, names, root / "models", folder) for m in args.model]
    py = "python3"
    steps = []
    ev = ["--n-t", str(args.n_t), "--rtol", str(args.rtol), "--atol", str(args.rtol), "--seed", "0",
          "--batch", str(args.eval_batch)]
    if args.no_ode:
        ev.append("--no-ode")
    for k in range(len(parts)):
        for label, ref in models:
            steps.append({"name": f"eval-{label}-{k}", "stdout": f"eval-{label}-{k}.json", "kind": "eval",
                          "cmd": [py, "-m", "cli.main", "eval", f"{folder}/test-{k}.npz", "--model", ref,
                                  "--device", args.device, "--json"] + ev})
    # the bench's own bound column: a few time samples (the eval steps measure the likelihoods)
    bench = ["--codecs", "scoreflow", "--device", args.device, "--setting", "arith=float32", "--no-nll",
             "--eval-n-t", "16"] + (["--threads", str(args.threads)] if args.threads else [])
    bench += [x for s in args.setting for x in ("--setting", s)]
    if args.stream_images:
        steps.append({"name": "cifar", "kind": "cifar",
                      "cmd": [py, "bench/run.py", f"{folder}/cifar.npz", "--model", models[0][1], "--out",
                              "{out}/cifar"] + bench})
    if args.kodak:
        steps.append({"name": "kodak", "kind": "kodak",
                      "cmd": [py, "bench/run.py", f"{folder}/kodak", "--model", "photo", "--no-stream", "--out",
                              "{out}/kodak"] + bench})
    plan = {"budget_s": args.budget, "device": args.device, "threads": args.threads, "models": [m[0] for m in models],
            "parts": len(parts), "steps": steps,
            "made": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (root / "plan.json").write_text(json.dumps(plan, indent=1))
    (root / "run.sh").write_text("\n".join([
        "#!/bin/bash",
        "# The GPU's figures (bench/device_figures.py wrote this; run: bash .device_bench/run.sh)",
        'OUT="${OUT:?set OUT to the folder that comes back}"',
        f'if ls {folder}/wheels/*.whl >/dev/null 2>&1; then',
        f"  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "
        f"--target /tmp/sfc-site {folder}/wheels/*.whl || exit 1",
        '  export PYTHONPATH="/tmp/sfc-site:$PYTHONPATH"',
        "fi",
        'export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1',
        f'python3 bench/device_figures.py run {folder}/plan.json --out "$OUT"',
        ""]))
    return plan


def _pack(work: Path, out: Path) -> None:
    """Everything under work into out/PACK (replaced whole, so a later kill leaves the last one)."""
    tmp = out / (PACK + ".tmp")
    with tarfile.open(tmp, "w") as tar:
        tar.add(work, arcname="figures")
    os.replace(tmp, out / PACK)


def run(plan_path: str, out: str) -> int:
    """The plan's steps in order, each with the time left but the later steps' reserves; the log and results in
    OUT/figures.tar. Exit 0 where every step ran to its end."""
    plan = json.loads(Path(plan_path).read_text())
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    # the steps write outside OUT: the device returns 8 files at most, and the tar must be one of them
    work = Path(tempfile.mkdtemp(prefix="sfc-figures-")) / "figures"
    try:
        return _run_steps(plan, plan_path, work, out_dir)
    finally:  # where something raised too: the temporary folder does not stay on the device's disk
        shutil.rmtree(work.parent, ignore_errors=True)


def _run_steps(plan: dict, plan_path: str, work: Path, out_dir: Path) -> int:
    work.mkdir()
    shutil.copy2(plan_path, work / "plan.json")
    log = open(work / "log.txt", "a")
    start, failed = time.monotonic(), 0

    def say(msg: str) -> None:
        log.write(f"{time.strftime('%H:%M:%S')} {msg}\n")
        log.flush()
        print(msg, flush=True)

    say(f"plan: {len(plan['steps'])} steps, {plan['budget_s']} s, device {plan['device']}")
    try:
        import torch
        say(f"torch {torch.__version__}, cuda {torch.version.cuda}, "
            f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}")
    except Exception as e:  # the figures do not need this line
        say(f"torch: {e}")
    steps = plan["steps"]
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(plan["threads"])} if plan.get("threads") else {}))
    for i, step in enumerate(steps):
        left = plan["budget_s"] - (time.monotonic() - start)
        limit = left - sum(s.get("reserve", RESERVE_S[s["kind"]]) for s in steps[i + 1:])
        if limit < 5:
            say(f"{step['name']}: skipped, {left:.0f} s left")
            failed += 1
            continue
        # the python running the plan runs its steps (python3 on the device)
        cmd = [sys.executable if c == "python3" else c.replace("{out}", str(work)) for c in step["cmd"]]
        say(f"{step['name']}: {shlex.join(cmd)} (at most {limit:.0f} s)")
        t0 = time.monotonic()
        stdout = open(work / step["stdout"], "w") if step.get("stdout") else log
        try:
            res = subprocess.run(cmd, stdout=stdout, stderr=log, timeout=limit, env=env)
            rc = res.returncode
        except subprocess.TimeoutExpired:
            rc = "timed out"
        except OSError as e:  # a program the device lacks: this step fails, the later ones still run
            rc = f"could not start: {e.strerror or e}"
        finally:
            if stdout is not log:
                stdout.close()
        say(f"{step['name']}: {'done' if rc == 0 else f'failed ({rc})'} in {time.monotonic() - t0:.1f} s")
        failed += rc != 0
        _pack(work, out_dir)
    say(f"all steps in {time.monotonic() - start:.1f} s, {failed} failed")
    log.close()
    _pack(work, out_dir)
    return 1 if failed else 0


def _members(where: Path) -> dict[str, bytes]:
    """The returned figures: a folder holding figures.tar (or the tar itself), as {path: bytes}."""
    tar_path = where / PACK if where.is_dir() else where
    if not tar_path.is_file():
        raise FiguresError(f"{where}: no {PACK}")
    try:
        with tarfile.open(tar_path) as tar:
            return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    except tarfile.TarError as e:
        raise FiguresError(f"{tar_path}: damaged ({e})") from None


def _mean(v: list[float]) -> float:
    return sum(v) / len(v)


def _se(v: list[float]) -> float:
    """The standard error of the mean (sample standard deviation / sqrt(n)); nan for one value."""
    n = len(v)
    if n < 2:
        return float("nan")
    m = _mean(v)
    return math.sqrt(sum((x - m) ** 2 for x in v) / (n - 1) / n)


def show(where: str) -> str:
    """The returned figures as text: each eval's means (standard errors), paired differences from the
    first model's, and each bench result's bits/dim and times."""
    files = _members(Path(where))
    plan = json.loads(files.get("figures/plan.json", b"{}") or b"{}")
    lines, parts = [], {}  # parts: {model: {part: that part's eval}}
    for name in sorted(files):
        if name.startswith("figures/eval-") and name.endswith(".json"):
            label, _, k = name[len("figures/eval-"):-5].rpartition("-")
            try:
                d = json.loads(files[name])
                if not isinstance(d, dict) or not isinstance(d.get("rows"), list) or "sha256" not in d:
                    raise ValueError(name)
                parts.setdefault(label, {})[int(k)] = d
            except ValueError:
                lines.append(f"{name}: not complete (the step failed or ran out of time)")
    labels = [m for m in plan.get("models", []) if m in parts] or sorted(parts)
    common = sorted(set.intersection(*(set(parts[m]) for m in labels))) if labels else []
    keys = ("bound_bpd", "ode_nll_bpd")
    first = None
    for label in labels:  # each model on the parts that every model finished: the same images
        rows = [r for k in common for r in parts[label][k]["rows"]]
        sha = parts[label][common[0]]["sha256"][:8] if common else "?"
        means = []
        for k in keys:
            v = [r[k] for r in rows if k in r]
            if len(v) == len(rows) and v:
                means.append(f"{k} {_mean(v):.4f} +- {_se(v):.4f}")
        lines.append(f"{label} ({sha}), {len(rows)} images (parts {common}): {', '.join(means)}")
        if first is None:
            first = (label, rows)
            continue
        for k in keys:
            if not rows or any(k not in r for r in rows + first[1]):
                continue
            diff = [r[k] - f[k] for r, f in zip(rows, first[1])]
            lines.append(f"  {k} - {first[0]}'s: {_mean(diff):+.4f} +- {_se(diff):.4f} "
                         f"(lower on {sum(x < 0 for x in diff)} of {len(diff)})")
    for name in sorted(files):
        if name.endswith("results.json"):
            r = json.loads(files[name])
            sf = next((s for s in r["summary"] if s["codec"] == "scoreflow"), None)
            if sf is None:
                continue
            stream = (r.get("scoreflow") or {}).get("stream") or {}
            line = (f"{name.split('/')[1]}: {sf['settings']}; {sf['n_images']} images, files {sf['mean_bpd']:.3f} "
                    f"bpd, encode {sf['encode_ms'] / 1000:.1f} s, decode {sf['decode_ms'] / 1000:.1f} s an image, "
                    f"lossless {sf['lossless']}")
            if stream.get("nbytes"):
                line += (f"; one stream {stream['bpd']:.3f} bpd ({stream['nbytes']} bytes, encode "
                         f"{stream['encode_s']:.1f} s, decode {stream['decode_s']:.1f} s)")
            lines.append(line)
    log = files.get("figures/log.txt")
    if log:
        lines += ["", "log:"] + log.decode().rstrip().splitlines()
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/device_figures.py", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("prep", help=f"write {FOLDER}/ for one device call")
    pr.add_argument("--model", action="append", required=True,
                    help="a zoo name or a model file (repeatable; the first is the reference of the differences)")
    pr.add_argument("--cifar", default="cifar10", help="the set to evaluate (a named set, .npz or folder)")
    pr.add_argument("--limit", type=int, default=None, help="its first N images (default: all)")
    pr.add_argument("--parts", type=int, default=3, help="evaluate the images in this many parts (steps)")
    pr.add_argument("--n-t", type=int, default=1000, help="time samples of the bound (sfcodec eval's)")
    pr.add_argument("--rtol", type=float, default=1e-5, help="rtol = atol of the ODE (sfcodec eval's)")
    pr.add_argument("--no-ode", action="store_true", help="the bound only")
    pr.add_argument("--eval-batch", type=int, default=300,
                    help="sfcodec eval --batch: images a batch and an ODE solve (one solve for many images, not one each)")
    pr.add_argument("--stream-images", type=int, default=32, help="CIFAR-10 images coded as one stream (0: none)")
    pr.add_argument("--kodak", type=int, default=2, help="Kodak images coded with the photo model (0: none)")
    pr.add_argument("--setting", action="append", default=[], help="more bench/run.py --setting KEY=VALUE")
    pr.add_argument("--device", default="cuda")
    pr.add_argument("--threads", type=int, default=None, help="torch threads of every step (default: torch's)")
    pr.add_argument("--folder", default=FOLDER, help="where to write, from --repo (it must lie inside the repository "
                                                      "to travel)")
    pr.add_argument("--budget", type=float, default=540.0, help="seconds for all the steps")
    pr.add_argument("--wheel", default=None,
                    help="constriction's wheel for the device's Python (default: downloaded; 'none': not carried)")
    pr.add_argument("--repo", default=str(REPO))
    ru = sub.add_parser("run", help="take the plan's steps (run.sh, on the device)")
    ru.add_argument("plan")
    ru.add_argument("--out", required=True)
    sh = sub.add_parser("show", help="print what came back")
    sh.add_argument("where", help="the folder the device's files came back to, or figures.tar")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        if args.cmd == "prep":
            plan = prep(args)
            size = sum(f.stat().st_size for f in (Path(args.repo) / args.folder).rglob("*") if f.is_file())
            print(f"{args.folder}/: {size / 2**20:.1f} MiB, {len(plan['steps'])} steps in {plan['budget_s']:.0f} s: "
                  + ", ".join(s["name"] for s in plan["steps"]))
            print(f'device tool: run(command="bash {args.folder}/run.sh", carry=["{args.folder}"], '
                  f"timeout_s={int(plan['budget_s']) + 30})")
            return 0
        if args.cmd == "run":
            return run(args.plan, args.out)
        print(show(args.where))
        return 0
    except FiguresError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
