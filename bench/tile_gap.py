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

    python bench/tile_gap.py ../shared/data/kodak/kodim01.png ../shared/data/kodak/kodim20.png --model photo
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

from bench.report import rgb_model_run  # noqa: E402


def tile_costs(source, model, tile: int, n_t: int, batch: int = 16, seed: int = 0) -> dict:
    """The three costs of one RGB image (module docstring), per tile and in all."""
    import torch

    from scoreflow_codec import likelihood
    from scoreflow_codec.api import padded_tile
    from scoreflow_codec.coding import stream
    from scoreflow_codec.coding.seed_codec import seed_bits, seed_pixel_bits, shared_analyses

    refs = stream.T.plan_tiles([source.color.shape], tile)
    tiles = np.stack([padded_tile(source.color, r, tile) for r in refs])
    gen = torch.Generator().manual_seed(seed)
    bound = []
    with torch.no_grad():
        for i in range(0, len(tiles), batch):
            xb = torch.from_numpy(tiles[i:i + batch])
            bound.append(likelihood.bound_bpd(model.model, xb, model.dequantizer, n_t=n_t, generator=gen).double().numpy())
    model_bpd = np.concatenate(bound)
    seed_tile = np.array([seed_bits(t) / t.size for t in tiles])
    with shared_analyses():  # the whole image's pixel shares and its size: one analysis
        pix = seed_pixel_bits(source.color)
        seed_whole = seed_bits(source.color) / source.color.size
    seed_ctx = np.array([pix[r.y0:r.y0 + r.h, r.x0:r.x0 + r.w].sum() / t.size for r, t in zip(refs, tiles)])
    return {"tiles": len(tiles), "model": float(model_bpd.mean()), "seed_tile": float(seed_tile.mean()),
            "seed_whole": float(seed_whole),
            "best_per_tile": float(np.minimum(model_bpd, seed_tile).mean()),
            "model_wins": float((model_bpd < seed_tile).mean()),
            "seed_ctx": float(seed_ctx.mean()), "best_ctx": float(np.minimum(model_bpd, seed_ctx).mean()),
            "model_wins_ctx": float((model_bpd < seed_ctx).mean()),
            "per_tile": {"model": model_bpd.tolist(), "seed_tile": seed_tile.tolist(), "seed_ctx": seed_ctx.tolist()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-t", type=int, default=16, help="time samples per tile of the bound")
    run = rgb_model_run(ap, argv, "tile_gap")
    if run is None:
        return 2
    args, model, sources = run
    tile = args.tile or model.tile
    print(f"model {model.name} ({model.sha256[:12]}), {tile}px tiles, bound with {args.n_t} time samples")
    print(f"{'image':16s} {'tiles':>5s} {'model':>7s} {'seed tile':>9s} {'best/tile':>9s} {'seed whole':>10s} "
          f"{'model wins':>10s} {'best ctx':>8s} {'wins ctx':>8s} {'s':>5s}")
    rows = {}
    for p, s in zip(args.images, sources):
        t0 = time.perf_counter()
        r = tile_costs(s, model, tile, args.n_t)
        r["seconds"] = time.perf_counter() - t0
        rows[p.name] = r
        print(f"{p.name[:16]:16s} {r['tiles']:5d} {r['model']:7.3f} {r['seed_tile']:9.3f} {r['best_per_tile']:9.3f} "
              f"{r['seed_whole']:10.3f} {100 * r['model_wins']:9.0f}% {r['best_ctx']:8.3f} "
              f"{100 * r['model_wins_ctx']:7.0f}% {r['seconds']:5.0f}", flush=True)
    mean = {k: float(np.mean([r[k] for r in rows.values()])) for k in
            ("model", "seed_tile", "best_per_tile", "seed_whole", "model_wins", "seed_ctx", "best_ctx", "model_wins_ctx")}
    print(f"{'mean':16s} {'':5s} {mean['model']:7.3f} {mean['seed_tile']:9.3f} {mean['best_per_tile']:9.3f} "
          f"{mean['seed_whole']:10.3f} {100 * mean['model_wins']:9.0f}% {mean['best_ctx']:8.3f} "
          f"{100 * mean['model_wins_ctx']:7.0f}%")
    if args.json:
        args.json.write_text(json.dumps({"model": model.name, "sha256": model.sha256, "tile": tile, "n_t": args.n_t,
                                         "images": rows, "mean": mean}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
