"""How the shells (sfcodec, the benchmarks that time it) set up torch's CPU threads: before torch loads.

Torch's CPU kernels run on OpenMP threads (GNU libgomp in the Linux wheels) that wait for each
other at the end of every parallel loop by spinning, 300,000 turns by default before they sleep.
Where another process holds one of the cores, the thread that is not scheduled holds up the one
spinning for it, and every network call becomes many times slower. Measured on a 2-core Intel
Xeon (AVX-512, AMX; 2026-11-29, torch 2.13.0+cpu, two threads) with one core busy with another
process: the exact forward of the photo model on 4 / 16 tiles 9.3 / 21.6 s against 0.32 / 1.41 s
at one thread, and `sfcodec compress` of kodim05's 256x256 centre 361 s against 37 s.

Spinning only SPIN_COUNT turns (GOMP_SPINCOUNT) keeps most of what spinning buys on an idle
machine and bounds the loss on a busy one (the same machine; the exact forward is `bench/exact_forward.py
--model photo --tile 64 --threads 2 --repeat 2`, best of two; the compress is `sfcodec compress` with
the defaults and --no-verify, the mean of two runs, one run for the default with a core busy):

| GOMP_SPINCOUNT | exact forward, 4 / 16 tiles, idle | the same, one core busy | the 256x256 compress, idle / busy |
|---|---:|---:|---:|
| libgomp's default (300,000) | 0.17 / 0.70 s | 9.3 / 21.6 s | 26.0 / 361 s |
| 30,000 | 0.18 / 0.75 s | | |
| **10,000** | 0.19 / 0.75 s | 0.92 / 3.07 s | 25.9 / 71 s |
| 3,000 | 0.22 / 0.82 s | 0.55 / 2.00 s | 24.8 / 47.5 s |
| 0 (OMP_WAIT_POLICY=PASSIVE) | 0.37 / 1.23 s | 0.35 / 1.45 s | 36.9 / 41 s |
| one thread | 0.32 / 1.35 s | 0.32 / 1.41 s | 37.1 / 37.4 s |

OpenMP reads these variables once, when torch's runtime loads, so they must be set before
`import torch`. A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT is kept; on a machine busy with
other work, OMP_NUM_THREADS=1 is the fastest.
"""
from __future__ import annotations

import os
import sys

SPIN_COUNT = 10_000


def spin_briefly() -> bool:
    """Make OpenMP's waiting threads sleep after SPIN_COUNT turns (GOMP_SPINCOUNT), unless the user
    chose a wait policy or a spin count. Returns whether it can still take effect: False where
    torch was imported before."""
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", str(SPIN_COUNT))
    return "torch" not in sys.modules
