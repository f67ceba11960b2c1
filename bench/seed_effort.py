"""What the seed codec's effort (`sfcodec compress --effort 1-3`) saves in time and costs in bytes.

Per image and effort: the file `api.compress(..., fallback="seed", effort=E)` makes (the seed codec's
file, as `sfcodec compress --fallback seed --effort E` writes it, without the input's name), its bits
per dimension, the encode and decode time (`api.decompress`, the pixels checked identical, or it
fails); then per effort the set's bits/dim (all bits over all dims), the mean times and each against
effort 3. Effort 3 (the default) tries every mode of the seed codec, 2 no least-squares predictor, 1 nor
the mixed mode of the channels after the first (coding/seed_codec.py, EFFORTS).

    python bench/seed_effort.py kodak                           # the 24 Kodak images, efforts 3, 2, 1
    python bench/seed_effort.py FOLDER --limit 4 --efforts 3,1 --json results/effort.json

--jobs 1 (the default) codes in this process only, so that the efforts' times compare (effort 3 would
otherwise make its analysis in two processes where there are two cores). Run it with nothing else
busy on the machine: the times are wall-clock.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.datasets import DataError, load  # noqa: E402
from bench.report import machine_info  # noqa: E402


def measure(image, level: int, jobs: int) -> dict:
    """One image (uint8 [H, W, C]) at one effort: bytes, bits/dim, encode and decode seconds."""
    import numpy as np

    from scoreflow_codec import api, images

    src = images.from_array(image)
    t0 = time.perf_counter()
    data, rep = api.compress([src], None, fallback="seed", effort=level, jobs=jobs)
    t1 = time.perf_counter()
    back = api.decompress(data, None, jobs=jobs)
    t2 = time.perf_counter()
    if not np.array_equal(images.to_array(back[0]), image):
        raise SystemExit(f"seed_effort: effort {level} did not decode to the same pixels")
    return {"effort": level, "bytes": len(data), "bpd": 8 * len(data) / image.size, "encode_s": t1 - t0,
            "decode_s": t2 - t1}


def summary(rows: list[dict], efforts: list[int]) -> list[dict]:
    """Per effort: the set's bits/dim (all bits over all dims), mean times, and each against effort 3's."""
    out = []
    for level in efforts:
        mine = [r for r in rows if r["effort"] == level]
        dims = sum(r["dims"] for r in mine)
        out.append({"effort": level, "images": len(mine), "bpd": 8 * sum(r["bytes"] for r in mine) / dims,
                    "encode_s": sum(r["encode_s"] for r in mine) / len(mine),
                    "decode_s": sum(r["decode_s"] for r in mine) / len(mine)})
    base = next((s for s in out if s["effort"] == 3), None)
    for s in out:
        if base is not None:
            s["bpd_vs_3"] = s["bpd"] / base["bpd"] - 1
            s["encode_speedup"] = base["encode_s"] / s["encode_s"]
            s["decode_speedup"] = base["decode_s"] / s["decode_s"]
    return out


def _efforts(text: str) -> list[int]:
    from scoreflow_codec.coding.seed_codec import EFFORTS

    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or any(v not in EFFORTS for v in levels) or len(set(levels)) != len(levels):
        raise argparse.ArgumentTypeError(f"expected distinct efforts among {', '.join(map(str, EFFORTS))}, got {text!r}")
    return levels


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="seed_effort.py", description=__doc__.split("\n")[0])
    ap.add_argument("data", help="a named set (kodak, misc, cifar10), a folder of images or an .npz")
    ap.add_argument("--limit", type=int, default=None, help="the first N images")
    ap.add_argument("--efforts", type=_efforts, default=[3, 2, 1], help="comma-separated (default 3,2,1)")
    ap.add_argument("--jobs", type=int, default=1, help="processes for each compress and decompress (default 1)")
    ap.add_argument("--json", type=Path, default=None, help="write every row and the summary here")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    try:
        data = load(args.data, args.limit)
    except DataError as e:
        ap.exit(2, f"seed_effort.py: error: {e}\n")
    rows = []
    print("| image | " + " | ".join(f"effort {e}: bits/dim, encode s, decode s" for e in args.efforts) + " |")
    print("|---|" + "---:|" * len(args.efforts))
    for name, image in zip(data.names, data.images):
        cells = []
        for level in args.efforts:
            r = {"image": name, "dims": int(image.size), **measure(image, level, args.jobs)}
            rows.append(r)
            cells.append(f"{r['bpd']:.4f}, {r['encode_s']:.1f}, {r['decode_s']:.1f}")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    summ = summary(rows, args.efforts)
    print(f"\n{data.name}: {len(data)} images, --jobs {args.jobs}\n")
    print("| effort | bits/dim | against effort 3 | encode s (mean) | decode s (mean) | encode, decode x faster |")
    print("|---:|---:|---:|---:|---:|---|")
    for s in summ:
        vs = f"{100 * s['bpd_vs_3']:+.2f}%" if "bpd_vs_3" in s else ""
        fast = f"{s['encode_speedup']:.2f}, {s['decode_speedup']:.2f}" if "encode_speedup" in s else ""
        print(f"| {s['effort']} | {s['bpd']:.4f} | {vs} | {s['encode_s']:.2f} | {s['decode_s']:.2f} | {fast} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"data": data.name, "jobs": args.jobs, "rows": rows, "summary": summ,
                                         "machine": machine_info()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
