"""How far the ODE codec's real size is from the model's ODE NLL, against the number of steps.

For each image tile the encoder pops u (dequantization) and codes y = x + u through K solver
steps with local bits-back; this script measures the real size of that code (bits on the ANS
stack, no file headers, no seed tiles: the asymptotic cost of a long stream) and the model's
exact-ODE NLL of the same y (torchdiffeq dopri5, Hutchinson trace averaged over probes), and
reports actual - NLL in bits/dim for each K, with standard errors.

    python bench/ode_overhead.py --model cifar10 --images 8 --steps 32,64,128,256
    python bench/ode_overhead.py --gaussian          # exact Gaussian data model, closed-form NLL
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scoreflow_codec.coding.ans import Message, padding_words  # noqa: E402
from scoreflow_codec.coding.pipeline import build_tile_codec  # noqa: E402
from scoreflow_codec.likelihood import ode_nll_continuous  # noqa: E402

PAD = 400_000


def code_once(tc, x: np.ndarray) -> tuple[float, np.ndarray, float, float, float]:
    """(actual bits, dequantization offsets used, bits popped for them, encode s, decode s),
    round trip checked."""
    m = Message(padding_words(PAD))
    frac = tc.dq.pop(m, x.astype(np.int64))
    popped_u = m.num_bits() - Message(padding_words(PAD)).num_bits()
    m = Message(padding_words(PAD))
    b0 = m.num_bits()
    t0 = time.perf_counter()
    tc.push(m, x)
    t1 = time.perf_counter()
    bits = m.num_bits() - b0
    back = tc.pop(m, x.shape)
    t2 = time.perf_counter()
    if not np.array_equal(back, x):
        raise SystemExit("round trip failed")
    return bits, frac, -popped_u, t1 - t0, t2 - t1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="zoo name or model file")
    ap.add_argument("--gaussian", action="store_true", help="exact Gaussian data model instead")
    ap.add_argument("--images", type=int, default=8, help="CIFAR-10 test images (tiles) to use")
    ap.add_argument("--steps", default="32,64,128,256")
    ap.add_argument("--probes", type=int, default=8, help="Hutchinson probes for the ODE NLL")
    ap.add_argument("--rtol", type=float, default=1e-5)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--json", default=None, help="write the results here")
    a = ap.parse_args()
    torch.manual_seed(0)

    if a.gaussian:
        sys.path.insert(0, str(REPO / "tests"))
        from coding_models import gaussian_images, gaussian_model
        model, g = gaussian_model((3, 32, 32), spread=(0.1, 0.4))
        x = gaussian_images(model, a.images, g)
        dequant, sde, name = __import__("scoreflow_codec.dequant", fromlist=["x"]).UniformDequantizer(), model.sde, "gaussian"
    else:
        from scoreflow_codec import zoo
        lm = zoo.load_model(a.model)
        model, dequant, sde, name = lm.model, lm.dequantizer, lm.sde, lm.name
        data = Path(REPO.parent / "shared" / "data" / "cifar10" / "test.npz")
        with np.load(data) as z:
            x = z["images"][: a.images].transpose(0, 3, 1, 2).copy()

    rows = []
    nll_cache: dict = {}
    for K in [int(k) for k in a.steps.split(",")]:
        tc = build_tile_codec(model, dequant, sde, "ode", {"steps": K}, a.micro_batch)
        bits, frac, popped_u, enc_s, dec_s = code_once(tc, x)
        key = frac.tobytes()
        if key not in nll_cache:
            y = torch.from_numpy((x.astype(np.float64) + (frac + 0.5) / 2 ** tc.L) * (2 / 256) - 1)
            if a.gaussian:
                nll = -model.log_prob_t(y, sde.eps)
            else:
                est = []
                for p in range(a.probes):
                    gen = torch.Generator().manual_seed(p)
                    n, _, _ = ode_nll_continuous(model, y.float(), rtol=a.rtol, atol=a.rtol, trace="hutchinson",
                                                 generator=gen)
                    est.append(n.double())
                nll = torch.stack(est)  # [probes, N]
            nll_cache[key] = nll
        nll = nll_cache[key]
        n_img, D = x.shape[0], x[0].size
        # actual = -log2 Q(u|x) + codelength(y), Q(u|x) = q(u|x) 2^(-L D); the model's bpd is
        # (-log2 p(y) + log2 q(u|x)) / D + 7, so the overhead per dim is:
        nll_bits = (nll.mean(0) if nll.dim() == 2 else nll).sum().item() / math.log(2)
        overhead = (bits + popped_u - n_img * D * (7 + tc.L) - nll_bits) / (n_img * D)
        se = (nll.mean(1).std().item() / math.sqrt(nll.shape[0]) / math.log(2) / D) if nll.dim() == 2 else 0.0
        row = {"steps": K, "actual_bpd": bits / (n_img * D),
               "ode_nll_bpd": (nll_bits - popped_u + n_img * D * (7 + tc.L)) / (n_img * D),
               "overhead_bpd": overhead, "nll_probe_se_bpd": se,
               "encode_s_per_tile": enc_s / n_img, "decode_s_per_tile": dec_s / n_img}
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = {"model": name, "images": int(len(x)), "probes": a.probes, "rows": rows}
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
