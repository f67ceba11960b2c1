"""How fast the exact (exact64) network forward runs on this CPU, and where its time goes.

Four measurements, best of --repeat each, all in one process:

1. convolutions: every distinct convolution of the model's exact forward on a batch of
   --conv-batch tiles, as torch's own float64 F.conv2d and as `exactmath.int_conv2d` (one matrix
   product per kernel tap), on random integer operands of the sizes the coder uses, the two
   results checked identical;
2. the whole exact score-model forward on batches of --batches tiles, split into the
   convolutions (with their rounding to the integer grid), SiLU, GroupNorm and the rest;
3. the same forwards after `api._keep_freed_memory()` (glibc keeps freed blocks instead of
   page-faulting them in again), with the page faults per forward;
4. the cost of a call before any arithmetic: the forward of one tile of the smallest size the
   U-Net takes (4x4 for three levels), with the number of torch calls it makes. The coder pays it
   on every call (kodim01's stream: 20 calls per chain step).

    python bench/exact_forward.py                              # photo, 64px tiles, one thread
    python bench/exact_forward.py --model cifar10 --tile 32 --batches 1,8,32
    python bench/exact_forward.py --threads 2 --json results/exact_forward.json

Run it with nothing else busy on the machine: the numbers are wall-clock.
"""
from __future__ import annotations

import argparse
import collections
import json
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import machine_info, model_options  # noqa: E402


def best_of(fn, repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def conv_shapes(ex, x, t) -> collections.Counter:
    """(input shape, weight shape, stride, padding) -> calls, of one exact forward."""
    from scoreflow_codec import exactmath as em

    seen: collections.Counter = collections.Counter()
    orig = em.ExactConv.__call__

    def record(self, a):
        if a.dim() == 4:
            seen[(tuple(a.shape), tuple(self.w_int.shape), self.stride, self.padding)] += 1
        return orig(self, a)
    em.ExactConv.__call__ = record
    try:
        ex(x, t)
    finally:
        em.ExactConv.__call__ = orig
    return seen


def time_convolutions(shapes: collections.Counter, repeat: int) -> list[dict]:
    import torch
    import torch.nn.functional as F

    from scoreflow_codec import exactmath as em

    gen = torch.Generator().manual_seed(0)
    rows = []
    for (ash, wsh, s, p), calls in sorted(shapes.items(), key=lambda kv: -kv[1] * kv[0][0][0] * kv[0][0][2] ** 2):
        a = torch.randint(-2 ** 20, 2 ** 20, ash, generator=gen).double()
        w = torch.randint(-2 ** 10, 2 ** 10, wsh, generator=gen).double()
        if not torch.equal(F.conv2d(a, w, None, s, p), em.int_conv2d(a, w, s, p)):
            raise SystemExit(f"int_conv2d differs from F.conv2d on {ash} x {wsh}")
        rows.append({"input": list(ash), "weight": list(wsh), "stride": s, "padding": p, "calls": calls,
                     "f_conv2d_ms": 1e3 * best_of(lambda: F.conv2d(a, w, None, s, p), repeat),
                     "int_conv2d_ms": 1e3 * best_of(lambda: em.int_conv2d(a, w, s, p), repeat)})
    return rows


def time_forward(ex, batches: list[int], tile: int, repeat: int) -> list[dict]:
    """Per batch: the forward's seconds (best of repeat), its parts in the best run, page faults."""
    import torch

    from scoreflow_codec import exactmath as em
    from scoreflow_codec.models import exact as mx

    parts = collections.defaultdict(float)
    patched = [(em.ExactConv, "__call__", "convolutions"), (mx._SiluTable, "__call__", "silu"),
               (mx._GroupNorm, "__call__", "groupnorm")]
    originals = [getattr(cls, name) for cls, name, _ in patched]

    def timed(fn, part):
        def run(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                parts[part] += time.perf_counter() - t0
        return run
    rows = []
    for (cls, name, part), fn in zip(patched, originals):
        setattr(cls, name, timed(fn, part))
    try:
        for n in batches:
            gen = torch.Generator().manual_seed(n)
            x = torch.randn(n, 3, tile, tile, generator=gen, dtype=torch.float64)
            t = torch.full((n,), 0.3, dtype=torch.float64)
            ex(x, t)
            best, best_parts, faults = float("inf"), {}, 0
            for _ in range(repeat):
                parts.clear()
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                t0 = time.perf_counter()
                ex(x, t)
                dt = time.perf_counter() - t0
                faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
                if dt < best:
                    best, best_parts = dt, dict(parts)
            best_parts["rest"] = best - sum(best_parts.values())
            rows.append({"batch": n, "seconds": best, "per_tile_s": best / n, "page_faults": faults,
                         "parts_s": best_parts})
    finally:
        for (cls, name, _), fn in zip(patched, originals):
            setattr(cls, name, fn)
    return rows


def call_overhead(ex, repeat: int) -> dict:
    """Seconds (best of repeat) and torch calls of the forward of one smallest tile."""
    import torch
    from torch.overrides import TorchFunctionMode

    k = 2 ** (ex.net.levels - 1)
    x, t = torch.zeros(1, 3, k, k, dtype=torch.float64), torch.full((1,), 0.3, dtype=torch.float64)

    class Count(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Count.calls += 1
            return func(*args, **(kwargs or {}))
    with Count():
        ex(x, t)
    return {"tile": k, "seconds": best_of(lambda: ex(x, t), max(repeat, 5)), "torch_calls": Count.calls}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_options(ap)
    ap.add_argument("--batches", default="1,2,4,8", help="batch sizes of the forward timings")
    ap.add_argument("--conv-batch", type=int, default=8, help="batch of the convolution timings (0: skip them)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)

    import torch

    from scoreflow_codec import api, zoo
    from scoreflow_codec.errors import SfcError
    from scoreflow_codec.models.exact import exact_model

    torch.set_num_threads(args.threads)
    try:
        model = zoo.load_model(args.model)
        batches = [int(b) for b in args.batches.split(",") if b]
    except (SfcError, ValueError) as e:
        print(f"exact_forward: {e}", file=sys.stderr)
        return 2
    tile = args.tile or model.tile
    ex = exact_model(model.model)
    print(f"model {model.name} ({model.sha256[:12]}), {tile}px tiles, {args.threads} thread(s), best of {args.repeat}")
    out = {"model": model.name, "sha256": model.sha256, "tile": tile, "threads": args.threads,
           "repeat": args.repeat, "machine": machine_info(),
           "cpu_capability": torch.backends.cpu.get_cpu_capability()}

    if args.conv_batch:
        x = torch.zeros(args.conv_batch, 3, tile, tile, dtype=torch.float64)
        rows = time_convolutions(conv_shapes(ex, x, torch.full((args.conv_batch,), 0.3, dtype=torch.float64)),
                                 args.repeat)
        out["convolutions"] = rows
        print(f"\n| convolution (batch, channels in -> out, size, kernel/stride) | calls | F.conv2d | int_conv2d |")
        print("|---|---:|---:|---:|")
        for r in rows:
            n, c, h, w = r["input"]
            print(f"| {n}, {c} -> {r['weight'][0]}, {h}x{w}, {r['weight'][2]}x{r['weight'][3]}/{r['stride']} | "
                  f"{r['calls']} | {r['f_conv2d_ms']:.1f} ms | {r['int_conv2d_ms']:.1f} ms |")
        tot_f = sum(r["calls"] * r["f_conv2d_ms"] for r in rows)
        tot_i = sum(r["calls"] * r["int_conv2d_ms"] for r in rows)
        print(f"| all of one forward | | {tot_f:.0f} ms | {tot_i:.0f} ms |")

    for label, setup in (("default malloc", None), ("malloc keeping freed memory", api._keep_freed_memory)):
        if setup is not None:
            setup()
        rows = time_forward(ex, batches, tile, args.repeat)
        out["forward_" + ("keep" if setup else "default")] = rows
        print(f"\nexact forward, {label}:\n")
        print("| tiles | seconds | per tile | convolutions | SiLU | GroupNorm | rest | page faults |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            p = r["parts_s"]
            print(f"| {r['batch']} | {r['seconds']:.3f} | {r['per_tile_s']:.3f} | {p.get('convolutions', 0):.3f} | "
                  f"{p.get('silu', 0):.3f} | {p.get('groupnorm', 0):.3f} | {p['rest']:.3f} | {r['page_faults']} |")
    oh = out["call_overhead"] = call_overhead(ex, args.repeat)
    print(f"\ncost of a call: one {oh['tile']}x{oh['tile']} tile, {1e3 * oh['seconds']:.1f} ms, "
          f"{oh['torch_calls']:,} torch calls")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
