"""What the user's two commands cost: `sfcodec compress` and `sfcodec decompress`, per image.

    python bench/cli_times.py kodak                        # all 24, one image at a time
    python bench/cli_times.py kodak --jobs 2 --threads 1   # two images at a time (2 cores)
    python bench/cli_times.py misc --limit 4 -- --fallback both --steps 64
    python bench/cli_times.py kodak --batch                # one `compress -d` and one `decompress -d` of all 24

Each image of the set (a named set, an .npz or a folder, as bench/run.py takes) is written as a
PNG, compressed with `sfcodec compress IMG -o IMG.sfc` (arguments after `--` are added) and
decompressed with `sfcodec decompress IMG.sfc -o OUT.png`, each a process of its own as a user
runs it (start-up and model loading included). Per image: bytes, bits/dim, which coder wrote the
file (the header's seed-only mark), wall seconds and peak RSS (MiB, of that process, from
os.wait4) of both commands, and whether the decoded pixels equal the input. Prints one JSON line
per image, then a Markdown summary; `--out` also writes them to results.json there.

`--batch` (0.9.29) times what a folder costs instead: one `sfcodec compress *.png -d DIR` and one
`sfcodec decompress DIR/*.sfc -d BACK` of the whole set (its --jobs files at once: `--batch-jobs N`,
default sfcodec's own choice), wall seconds and peak RSS of each command (its largest process), and
per image bytes, bits/dim, the coder and whether the pixels came back.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import datasets  # noqa: E402
from bench.report import machine_info  # noqa: E402


def _run(cmd: list[str], env: dict) -> tuple[float, float, int, str]:
    """(wall seconds, peak RSS MiB, exit code, output) of one command, as its own process."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    rss = usage.ru_maxrss / (1024.0 * 1024.0) if sys.platform == "darwin" else usage.ru_maxrss / 1024.0
    return wall, rss, p.returncode, out.strip()


def sfcodec_command() -> list[str]:
    """`sfcodec` as a process of its own, from this checkout (with REPO on its PYTHONPATH)."""
    return [sys.executable, "-c", "from cli.main import main; main()"]


def one_image(arr: np.ndarray, name: str, work: Path, extra: list[str], env: dict) -> dict:
    from scoreflow_codec import api

    stem = Path(name).stem
    src, sfc, back = work / f"{stem}.png", work / f"{stem}.sfc", work / f"{stem}.out.png"
    Image.fromarray(arr if arr.shape[2] > 1 else arr[..., 0]).save(src)
    row = {"image": name, "dims": int(arr.size)}
    enc = _run(sfcodec_command() + ["compress", str(src), "-o", str(sfc), "--force", "-q", *extra], env)
    row.update(encode_s=enc[0], encode_rss_mib=enc[1])
    if enc[2] != 0:
        return {**row, "error": f"compress exited {enc[2]}: {enc[3][-300:]}"}
    data = sfc.read_bytes()
    header = api.read_header(data)
    row.update(bytes=len(data), bpd=8.0 * len(data) / arr.size,
               coded_by="seed" if api.seed_only(header["fields"]) else "model")
    dec = _run(sfcodec_command() + ["decompress", str(sfc), "-o", str(back), "--force", "-q"], env)
    row.update(decode_s=dec[0], decode_rss_mib=dec[1])
    if dec[2] != 0:
        return {**row, "error": f"decompress exited {dec[2]}: {dec[3][-300:]}"}
    got = np.asarray(Image.open(back))
    row["identical"] = bool(np.array_equal(got.reshape(arr.shape), arr))
    return row


def batch(imgset, work: Path, extra: list[str], env: dict, jobs: int | None) -> tuple[list[dict], dict]:
    """The set through one `compress -d` and one `decompress -d` -> (a row per image, the commands' times)."""
    from scoreflow_codec import api

    srcs, arrs = [], {}
    for arr, name in zip(imgset.images, imgset.names):
        p = work / f"{Path(name).stem}.png"
        Image.fromarray(arr if arr.shape[2] > 1 else arr[..., 0]).save(p)
        srcs.append(p)
        arrs[p.stem] = arr
    more = ["--jobs", str(jobs)] if jobs else []
    enc = _run(sfcodec_command() + ["compress", *map(str, srcs), "-d", str(work / "sfc"), "-q", *more, *extra], env)
    sfcs = sorted((work / "sfc").glob("*.sfc"))
    dec = None
    if sfcs:
        dec = _run(sfcodec_command() + ["decompress", *map(str, sfcs), "-d", str(work / "back"), "-q", *more], env)
    rows = []
    for p, name in zip(srcs, imgset.names):
        row = {"image": name, "dims": int(arrs[p.stem].size)}
        sfc, back = work / "sfc" / f"{p.stem}.sfc", work / "back" / f"{p.stem}.png"
        if not sfc.is_file() or not back.is_file():
            rows.append({**row, "error": f"not coded: compress exit {enc[2]}, decompress exit "
                                         f"{dec[2] if dec else None}: {(enc[3] + (dec[3] if dec else ''))[-300:]}"})
            continue
        data = sfc.read_bytes()
        with Image.open(back) as im:
            got = np.asarray(im)
        rows.append({**row, "bytes": len(data), "bpd": 8.0 * len(data) / arrs[p.stem].size,
                     "coded_by": "seed" if api.seed_only(api.read_header(data)["fields"]) else "model",
                     "identical": bool(np.array_equal(got.reshape(arrs[p.stem].shape), arrs[p.stem]))})
    times = {"compress_s": enc[0], "compress_rss_mib": enc[1], "compress_exit": enc[2],
             "decompress_s": dec[0] if dec else None, "decompress_rss_mib": dec[1] if dec else None,
             "decompress_exit": dec[2] if dec else None}
    return rows, times


def summary(rows: list[dict]) -> dict:
    ok = [r for r in rows if "error" not in r]
    s = {"images": len(rows), "failed": len(rows) - len(ok), "identical": sum(r.get("identical", False) for r in ok)}
    if ok:
        s["mean_bpd"] = float(np.mean([r["bpd"] for r in ok]))
        s["coded_by"] = {k: sum(r["coded_by"] == k for r in ok) for k in ("seed", "model")}
        s["bytes"] = int(sum(r["bytes"] for r in ok))
        s["bpd"] = 8.0 * s["bytes"] / sum(r["dims"] for r in ok)
        for k in ("encode_s", "decode_s", "encode_rss_mib", "decode_rss_mib"):
            if k not in ok[0]:
                continue
            v = [r[k] for r in ok]
            s[k] = {"mean": float(np.mean(v)), "min": float(np.min(v)), "max": float(np.max(v))}
    return s


def markdown(s: dict, title: str) -> str:
    lines = [f"### {title}", "", f"{s['images']} images, {s['identical']} decoded identical, {s['failed']} failed", ""]
    if "mean_bpd" in s:
        lines += ["| | mean | min | max |", "|---|---:|---:|---:|"]
        for k in ("encode_s", "decode_s", "encode_rss_mib", "decode_rss_mib"):
            if k in s:
                lines.append(f"| {k} | {s[k]['mean']:.1f} | {s[k]['min']:.1f} | {s[k]['max']:.1f} |")
        if "batch" in s:
            b = s["batch"]
            lines += [f"| one `compress -d` of all, s | {b['compress_s']:.1f} | | |",
                      f"| one `decompress -d` of all, s | {b['decompress_s'] or 0:.1f} | | |",
                      f"| their peak RSS, MiB | {b['compress_rss_mib']:.0f} / {b['decompress_rss_mib'] or 0:.0f} | | |"]
        lines += ["", f"{s['bytes']} bytes, {s['bpd']:.3f} bits/dim; mean bits/dim {s['mean_bpd']:.3f}; "
                      f"files written by the seed codec alone: {s['coded_by']['seed']}, by the model's stream: "
                      f"{s['coded_by']['model']}"]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("set", metavar="SET_OR_PATH", help="named set (kodak, misc, cifar10), .npz or folder")
    ap.add_argument("--limit", type=int, default=None, metavar="N")
    ap.add_argument("--jobs", type=int, default=1, help="images coded at the same time")
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of each command")
    ap.add_argument("--out", default=None, help="folder for results.json")
    ap.add_argument("--batch", action="store_true", help="one compress -d and one decompress -d of the whole set")
    ap.add_argument("--batch-jobs", type=int, default=None, help="with --batch: the commands' --jobs")
    args = ap.parse_args(argv)
    try:
        imgset = datasets.load(args.set, args.limit)
    except datasets.DataError as e:
        print(f"cli_times: {e}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    times = None
    if args.batch:
        with tempfile.TemporaryDirectory(prefix="sfc-cli-times-") as tmp:
            rows, times = batch(imgset, Path(tmp), extra, env, args.batch_jobs)
        for r in rows:
            print(json.dumps(r), flush=True)
    else:
        with tempfile.TemporaryDirectory(prefix="sfc-cli-times-") as tmp, ThreadPoolExecutor(max(1, args.jobs)) as pool:
            jobs = [pool.submit(one_image, a, n, Path(tmp), extra, env) for a, n in zip(imgset.images, imgset.names)]
            rows = []
            for j in jobs:
                rows.append(j.result())
                print(json.dumps(rows[-1]), flush=True)
    s = summary(rows)
    if times is not None:
        s["batch"] = times
    title = (f"sfcodec {'compress -d / decompress -d' if args.batch else 'compress / decompress'} on {imgset.name}"
             + (f" (compress {' '.join(extra)})" if extra else ""))
    print(markdown(s, title))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps({
            "set": imgset.name, "compress_args": extra, "jobs": args.batch_jobs if args.batch else args.jobs,
            "batch": args.batch, "threads": args.threads, "machine": machine_info(), "summary": s, "images": rows},
            indent=1))
    return 0 if s["failed"] == 0 and s["identical"] == s["images"] else 1


if __name__ == "__main__":
    sys.exit(main())
