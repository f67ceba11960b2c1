"""How far the screen's quick look lies from the model's full estimate, and what each decides.

`sfcodec compress` (--fallback auto) screens RGB images of at least api.SCREEN_TILES tiles with a
quick look (api.screen_saving: api.SCREEN_N_T time samples per tile, bfloat16 where fast) and takes
that look to lie about the full estimate (api.tile_model_bits with the seed codec's bits, as compress
runs it) with a standard deviation of api.SCREEN_SD_BPD. This script estimates every tile of each
image both ways, as compress does in chain mode (the look: the continuous bound plus the chain's
average excess; the full estimate: the chain's own bound, since 0.9.61), and prints per image: the
tiles, the look minus the full estimate in bits/dim (mean, standard deviation, largest), the saving
the full estimate finds and whether it would code the model's stream (api.expected_saving), and
the screen's own decision. Re-measure the spread whenever a model changes (a model trained longer
estimates differently); the last line gives it over all tiles.

    python bench/screen_spread.py ../shared/data/kodak/kodim0[1-4].png --model photo
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

from bench.report import machine_info, rgb_model_run  # noqa: E402


def spread(source, model, tile: int) -> dict:
    """One RGB image: every tile's full estimate and quick look, and both decisions (module docstring)."""
    from scoreflow_codec import api
    from scoreflow_codec.coding import stream
    from scoreflow_codec.coding.seed_codec import shared_analyses

    sources = [source]
    ss = api.default_stream_settings(model, tile)
    settings = api.coding_settings("chain", model)
    codec = api._build_codec(model, "chain", settings, api.default_micro_batch(tile), "cpu", "exact64")
    excess, chain = codec.excess_bits_per_dim(), codec.chain_coeffs()
    images = [stream.StreamImage(source.color, source.extra)]
    refs = stream.T.plan_tiles([source.color.shape], tile)
    with shared_analyses():
        seed = stream.tile_seed_bits(images, refs, ss)
        full = api.tile_model_bits(sources, model, tile, "cpu", excess, seed, chain=chain)
        look = api.tile_model_bits(sources, model, tile, "cpu", excess, seed, look=api.SCREEN_N_T)
        screen = api.screen_saving(sources, model, ss, "cpu", excess, chain)
    d = (look - full) / (3 * tile * tile)
    saving = api.expected_saving(seed, full)
    return {"tiles": len(refs), "excess_bpd": excess, "look_minus_full": d.tolist(),
            "mean": float(d.mean()), "sd": float(d.std()), "largest": float(np.abs(d).max()),
            "full_saving_bits": saving.bits, "needed_bits": saving.needed, "full_codes_model": saving.bits >= saving.needed,
            "screen_bits": screen.bits, "screen_upper": screen.upper, "screen_needed": screen.needed,
            "screen_passes": screen.upper >= screen.needed, "screen_sampled": screen.sampled}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    run = rgb_model_run(ap, argv, "screen_spread")
    if run is None:
        return 2
    args, model, sources = run
    from scoreflow_codec import api

    tile = args.tile or model.tile
    print(f"model {model.name} ({model.sha256[:12]}), {tile}px tiles; the look: {api.SCREEN_N_T} time samples, "
          f"taken to spread {api.SCREEN_SD_BPD} bits/dim")
    print(f"{'image':16s} {'tiles':>5s} {'mean':>7s} {'sd':>6s} {'largest':>7s} {'full saving':>11s} "
          f"{'needed':>7s} {'full':>6s} {'screen':>7s} {'s':>5s}")
    rows, diffs = {}, []
    for p, s in zip(args.images, sources):
        t0 = time.perf_counter()
        r = spread(s, model, tile)
        r["seconds"] = time.perf_counter() - t0
        rows[p.name] = r
        diffs.extend(r["look_minus_full"])
        print(f"{p.name[:16]:16s} {r['tiles']:5d} {r['mean']:+7.3f} {r['sd']:6.3f} {r['largest']:7.3f} "
              f"{r['full_saving_bits']:11.0f} {r['needed_bits']:7.0f} {'model' if r['full_codes_model'] else 'seed':>6s} "
              f"{'passes' if r['screen_passes'] else 'skips':>7s} {r['seconds']:5.0f}", flush=True)
    d = np.asarray(diffs)
    total = {"tiles": len(d), "mean": float(d.mean()), "sd": float(d.std()), "largest": float(np.abs(d).max()),
             "wrong": [k for k, r in rows.items() if r["full_codes_model"] and not r["screen_passes"]]}
    print(f"all {total['tiles']} tiles: the look minus the full estimate, mean {total['mean']:+.4f}, "
          f"sd {total['sd']:.4f}, largest {total['largest']:.3f} bits/dim; screened out where the full estimate "
          f"codes the model: {', '.join(total['wrong']) or 'none'}")
    if args.json:
        args.json.write_text(json.dumps({"model": model.name, "sha256": model.sha256, "tile": tile,
                                         "look_n_t": api.SCREEN_N_T, "sd_bpd": api.SCREEN_SD_BPD,
                                         "machine": machine_info(), "images": rows, "all": total}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
