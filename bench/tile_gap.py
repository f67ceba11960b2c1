"""Where the model loses to the seed codec: per tile, or across the image.

For each image, cut into the codec's tiles (edge tiles padded as the stream pads them), three
costs in bits/dim of its colour planes:
  model      the model's bound on each tile (the float32 network, --n-t stratified time samples:
             an estimate of what the model's stream costs, as `sfcodec eval --no-ode`);
  seed tile  the seed codec on each tile alone (its ideal codelength: the same context model, but
             its adaptive statistics start afresh on every tile, as the model's tiles know nothing
             of each other);
  seed whole the seed codec on the whole image (what `sfcodec compress` writes where it wins);
  seed ctx   per tile, its pixels' share of "seed whole" (seed_pixel_bits): what a seed tile costs
             in the model's stream since 0.9.15 (seed tiles coded in the image's context), whatever
             the other tiles are; over the image it adds up to "seed whole".
The "best per tile" column takes the cheaper of model and seed tile per tile: what a stream that
chose per tile could at best reach with tiles coded alone; "best ctx" the cheaper of model and
seed ctx: what 0.9.15's stream could at best reach (less with the model's estimate's noise, more
by what the chain adds to the bound). Where it stays above "seed whole", no per-tile switching
between the two beats the seed codec's own file; "seed tile - seed whole" is what the seed codec
gains from seeing the whole image. Per-tile costs count a padded edge tile's padding as pixels
(the stream codes it as latents): the comparison is exact where the tiles divide the image, as
64px tiles divide Kodak's 768x512.

The clean end: "eps" is the bound's t = eps term on each tile (likelihood.eps_term, in bits/dim: the
network's noise estimate at the smallest time, 0 for an estimate of zero, below 0 where the network
sees the noise). A tile above EPS_FLAG is one where the network, at the clean end, does worse than
predicting zero: it takes the image's own fine texture (film grain) for the noise it is to remove.
"flagged" counts them and "flag gap" is their share of the model's gap to "seed ctx" over the image
(none, printed "-", where the model beats "seed ctx" over the image: no gap to share).
With --mse N the denoising error E||eps - eps_hat||^2 / D of the flagged tiles (up to 24 an image,
else every tile) is measured at N log-SNR points (calibration.eps_mse_table, the model's own
dequantizer) beside the model's table (its training crops, stored in the model file): above 1 the
network's noise estimate costs more than none.

    python bench/tile_gap.py ../shared/data/kodak/kodim01.png ../shared/data/kodak/kodim20.png --model photo
    python bench/tile_gap.py ../shared/data/misc/4.2.06.tiff --model photo --mse 9
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import rgb_model_run  # noqa: E402


# A tile's t = eps term above this (bits/dim): the network does worse than zero at the clean end.
# With the shipped `photo`, on every tile of kodim05, 08 and 13: -0.043 .. +0.016; on misc's grainy scans up to 0.63.
EPS_FLAG = 0.1
MSE_TILES = 24  # tiles per image for --mse


def tile_costs(source, model, tile: int, n_t: int, batch: int = 16, seed: int = 0, mse: int = 0) -> dict:
    """The costs of one RGB image (module docstring), per tile and in all; mse > 0: also "mse",
    the denoising error of its flagged tiles (or, none flagged, of all) at that many log-SNR points."""
    import torch

    from scoreflow_codec import likelihood
    from scoreflow_codec.api import padded_tile
    from scoreflow_codec.coding import stream
    from scoreflow_codec.coding.seed_codec import seed_bits, seed_pixel_bits, shared_analyses

    refs = stream.T.plan_tiles([source.color.shape], tile)
    tiles = np.stack([padded_tile(source.color, r, tile) for r in refs])
    gen = torch.Generator().manual_seed(seed)
    bound, eps = [], []
    with torch.no_grad():
        for i in range(0, len(tiles), batch):
            xb = torch.from_numpy(tiles[i:i + batch])
            terms = likelihood.bound_terms(model.model, xb, model.dequantizer, n_t=n_t, generator=gen)
            bound.append(terms["bpd_with"].double().numpy())
            eps.append((terms["eps_term"] / (xb[0].numel() * math.log(2))).double().numpy())  # a difference: no offset
    model_bpd, eps_bpd = np.concatenate(bound), np.concatenate(eps)
    seed_tile = np.array([seed_bits(t) / t.size for t in tiles])
    with shared_analyses():  # the whole image's pixel shares and its size: one analysis
        pix = seed_pixel_bits(source.color)
        seed_whole = seed_bits(source.color) / source.color.size
    seed_ctx = np.array([pix[r.y0:r.y0 + r.h, r.x0:r.x0 + r.w].sum() / t.size for r, t in zip(refs, tiles)])
    flagged = eps_bpd > EPS_FLAG
    gap = model_bpd - seed_ctx
    extra = {}
    if mse:
        which = np.flatnonzero(flagged) if flagged.any() else np.arange(len(tiles))
        extra["mse"] = denoising_error(model, tiles[which[:MSE_TILES]], mse, seed)
        extra["mse"]["tiles"] = "flagged" if flagged.any() else "all"
    return extra | {"tiles": len(tiles), "model": float(model_bpd.mean()), "seed_tile": float(seed_tile.mean()),
            "eps": float(eps_bpd.mean()), "flagged": int(flagged.sum()),
            "flag_gap": float(gap[flagged].sum() / gap.sum()) if gap.sum() > 0 else None,
            "seed_whole": float(seed_whole),
            "best_per_tile": float(np.minimum(model_bpd, seed_tile).mean()),
            "model_wins": float((model_bpd < seed_tile).mean()),
            "seed_ctx": float(seed_ctx.mean()), "best_ctx": float(np.minimum(model_bpd, seed_ctx).mean()),
            "model_wins_ctx": float((model_bpd < seed_ctx).mean()),
            "per_tile": {"model": model_bpd.tolist(), "seed_tile": seed_tile.tolist(), "seed_ctx": seed_ctx.tolist(),
                         "eps": eps_bpd.tolist()}}


def _share(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def denoising_error(model, tiles: np.ndarray, points: int, seed: int = 0) -> dict:
    """calibration.eps_mse_table of these tiles (the model's dequantizer) and, at the same log-SNR, the
    model's own table (None where its file has none)."""
    import torch

    from scoreflow_codec import calibration

    t = calibration.eps_mse_table(model.model, torch.from_numpy(tiles), points=points, repeats=1, batch=16,
                                  generator=torch.Generator().manual_seed(seed), dequantizer=model.dequantizer)
    table = (model.config or {}).get("info", {}).get("eps_mse")
    t["model_table"] = calibration.interpolate(table, np.array(t["log_snr"])).tolist() if table else None
    return t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-t", type=int, default=16, help="time samples per tile of the bound")
    ap.add_argument("--mse", type=int, default=0, metavar="N",
                    help="also the denoising error of the flagged tiles at N log-SNR points (module docstring)")
    run = rgb_model_run(ap, argv, "tile_gap")
    if run is None:
        return 2
    args, model, sources = run
    tile = args.tile or model.tile
    print(f"model {model.name} ({model.sha256[:12]}), {tile}px tiles, bound with {args.n_t} time samples")
    print(f"{'image':16s} {'tiles':>5s} {'model':>7s} {'seed tile':>9s} {'best/tile':>9s} {'seed whole':>10s} "
          f"{'model wins':>10s} {'best ctx':>8s} {'wins ctx':>8s} {'eps':>6s} {'flagged':>7s} {'flag gap':>8s} {'s':>5s}")
    rows = {}
    for p, s in zip(args.images, sources):
        t0 = time.perf_counter()
        r = tile_costs(s, model, tile, args.n_t, mse=args.mse)
        r["seconds"] = time.perf_counter() - t0
        rows[p.name] = r
        print(f"{p.name[:16]:16s} {r['tiles']:5d} {r['model']:7.3f} {r['seed_tile']:9.3f} {r['best_per_tile']:9.3f} "
              f"{r['seed_whole']:10.3f} {100 * r['model_wins']:9.0f}% {r['best_ctx']:8.3f} "
              f"{100 * r['model_wins_ctx']:7.0f}% {r['eps']:6.3f} {r['flagged']:7d} {_share(r['flag_gap']):>8s} "
              f"{r['seconds']:5.0f}", flush=True)
        if "mse" in r:
            m = r["mse"]
            which = "its flagged tiles" if m["tiles"] == "flagged" else "its tiles (none flagged)"
            print(f"  denoising error of {which} by log-SNR, and the model's table (its training crops):")
            for lam, v, ref in zip(m["log_snr"], m["mse"], m["model_table"] or [None] * len(m["mse"])):
                print(f"    {lam:6.1f} {v:7.3f}" + ("" if ref is None else f" {ref:7.3f}"))
    mean = {k: float(np.mean([r[k] for r in rows.values()])) for k in
            ("model", "seed_tile", "best_per_tile", "seed_whole", "model_wins", "seed_ctx", "best_ctx", "model_wins_ctx",
             "eps")}
    print(f"{'mean':16s} {'':5s} {mean['model']:7.3f} {mean['seed_tile']:9.3f} {mean['best_per_tile']:9.3f} "
          f"{mean['seed_whole']:10.3f} {100 * mean['model_wins']:9.0f}% {mean['best_ctx']:8.3f} "
          f"{100 * mean['model_wins_ctx']:7.0f}% {mean['eps']:6.3f}")
    if args.json:
        args.json.write_text(json.dumps({"model": model.name, "sha256": model.sha256, "tile": tile, "n_t": args.n_t,
                                         "images": rows, "mean": mean}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
