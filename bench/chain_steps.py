"""What the chain's number of steps costs in bits/dim: predicted from a model's table, measured on tiles.

Chain mode codes the discrete chain's -ELBO, which lies above the continuous bound by what its
steps cost (calibration.grid_excess_nats: the expected cost of each calibrated step, from the
model file's denoising-error table, against the integral the continuous bound takes). This prints
that predicted excess at several step counts, and with --images measures it on tiles of those
images: the chain's bound (discrete_chain.chain_elbo_bpd, the float32 network, --draws samples)
against the continuous bound (likelihood.bound_bpd, --n-t time samples) on the same tiles. A
stream's size is the chain's bound plus its coding overhead (a few thousandths), minus or plus
what its seed tiles gain or lose against the model, and since 0.9.13 minus what the encoder's
factors on the top network calls gain (chain_codec's kappa_top; not in these numbers).

    python bench/chain_steps.py --model photo
    python bench/chain_steps.py --model photo --images ../shared/data/kodak/kodim03.png --crop 256 --steps 64
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import machine_info, model_options  # noqa: E402

STEPS = (32, 64, 96, 128, 256, 512)


def _chain(model, steps: int, schedule: str | None = None):
    """The chain that `sfcodec compress` codes with this model at `steps` (its coefficients), or
    with another placement of its steps (`schedule`, as the chain settings take it)."""
    from scoreflow_codec import api
    from scoreflow_codec.coding.chain_codec import ChainSettings

    s = ChainSettings.from_dict(api.coding_settings("chain", model, {"steps": steps, **({"schedule": schedule} if schedule else {})}))
    return s.coefficients(model.sde, api._eps_mse(model))


def predicted_excess(model, steps, schedule: str | None = None) -> dict[int, float]:
    """{steps: predicted excess of the model's chain over the continuous bound, bits/dim}; empty
    for a model file without a denoising-error table (exported with --calib-images 0): nothing to
    predict from (the formula with m = 0 would say the steps cost nothing)."""
    from scoreflow_codec import api, calibration

    table = api._eps_mse(model)
    if not table:
        return {}
    out = {}
    for n in steps:
        out[n] = calibration.chain_excess_bpd(table, model.sde, _chain(model, n, schedule).ts)
    return out


def measured_excess(model, tiles, steps: int, draws: int, n_t: int, seed: int = 0, schedule: str | None = None) -> dict:
    """The chain's bound at `steps` and the continuous bound on the same tiles (uint8 [N, 3, P, P])."""
    import torch

    from scoreflow_codec import likelihood
    from scoreflow_codec.discrete_chain import chain_elbo_bpd

    co = _chain(model, steps, schedule)
    x = torch.from_numpy(tiles)
    g = torch.Generator().manual_seed(seed)
    chain = np.mean([chain_elbo_bpd(model.model, x, model.dequantizer, co, generator=g).mean().item()
                     for _ in range(draws)])
    bound = likelihood.bound_bpd(model.model, x, model.dequantizer, n_t=n_t, generator=g).double().mean().item()
    return {"steps": steps, "tiles": len(tiles), "chain_bpd": float(chain), "bound_bpd": float(bound),
            "excess_bpd": float(chain - bound)}


def image_tiles(paths, tile: int, crop: int | None) -> np.ndarray:
    """The tiles `sfcodec eval` takes of each image (api.image_tiles), of its centre crop x crop where given."""
    from scoreflow_codec import api

    out = []
    for a in api.load_eval_inputs(paths)[0]:
        if crop:
            y0, x0 = max((a.shape[0] - crop) // 2, 0), max((a.shape[1] - crop) // 2, 0)
            a = a[y0:y0 + crop, x0:x0 + crop]
        out.append(api.image_tiles(a, tile))
    return np.concatenate(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_options(ap)
    ap.add_argument("--images", nargs="*", default=[], help="measure on these images' tiles")
    ap.add_argument("--crop", type=int, default=None, help="their centre crop of this size")
    ap.add_argument("--steps", type=int, default=None, help="steps of the measurement (default: the model's)")
    ap.add_argument("--draws", type=int, default=2, help="chain samples per tile")
    ap.add_argument("--n-t", type=int, default=64, help="time samples of the continuous bound")
    ap.add_argument("--schedule", choices=("optimized", "calibrated", "logsnr"), default=None,
                    help="where the steps go (default: what compress does, 'calibrated')")
    args = ap.parse_args(argv)

    import torch

    from scoreflow_codec import api, zoo
    from scoreflow_codec.errors import SfcError

    torch.set_num_threads(args.threads)
    try:
        model = zoo.load_model(args.model)
        tiles = image_tiles(args.images, args.tile or model.tile, args.crop) if args.images else None
    except (SfcError, ValueError, OSError) as e:
        print(f"chain_steps: {e}", file=sys.stderr)
        return 2
    steps = args.steps or getattr(model, "chain_steps", None) or 128
    pred = predicted_excess(model, sorted(set(STEPS) | {steps}), args.schedule)
    schedule = args.schedule or api.default_settings("chain", model)["schedule"]
    out = {"model": model.name, "sha256": model.sha256, "default_steps": getattr(model, "chain_steps", None), "schedule": schedule,
           "predicted_excess_bpd": pred, "machine": machine_info()}
    if pred:
        print(f"model {model.name} ({model.sha256[:12]}); the {schedule} chain's predicted excess over the continuous bound, bits/dim:")
        print("| steps | " + " | ".join(str(n) for n in pred) + " |")
        print("|---|" + "---:|" * len(pred))
        print("| excess | " + " | ".join(f"{v:.4f}" for v in pred.values()) + " |")
    else:
        print(f"model {model.name} ({model.sha256[:12]}) has no denoising-error table: no prediction (--images measures)")
    if tiles is not None:
        t0 = time.perf_counter()
        mes = out["measured"] = measured_excess(model, tiles, steps, args.draws, args.n_t, schedule=args.schedule)
        mes["seconds"] = time.perf_counter() - t0
        print(f"\nmeasured on {mes['tiles']} tiles at {steps} steps: chain {mes['chain_bpd']:.4f}, continuous bound "
              f"{mes['bound_bpd']:.4f}, excess {mes['excess_bpd']:+.4f} bits/dim"
              + (f" (predicted {pred[steps]:.4f})" if pred else "") + f"; {mes['seconds']:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
