"""The screen's first stage against the screen's 16 tiles: what each decides, and how near the first
stage comes to ruling out an image that the 16 pass.

`sfcodec compress` (--fallback auto) first looks at the api.SCREEN_FIRST (4) of the screen's drawn tiles
on which the seed codec spends the most bits (api.screen_first_stage, 0.10.2) and writes the seed
codec's file where they already rule the model out; else the screen's api.SCREEN_TILES (16) tiles decide
as before (api.screen_saving, their own look). Per image this script prints: the 16 tiles' "at most"
over what the stream must save (the screen's decision without a first stage: passes at 1 and above);
the first stage's (rules the model out below 1), and the same from the 16's look of its tiles (another
draw of the look's noise); and the rank, by the seed codec's bits, of the tile of the 16 where the
model's look is furthest ahead (1-4: among the first stage's). Images that the 16 pass and the first
stage rules out are named on the last line, with the lowest first-stage ratio among the images the 16
pass (the margin). Re-measure when a model changes.

    python bench/screen_first.py ../shared/data/kodak/*.png ../shared/data/misc/*.tiff --model photo
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


def first_stage(source, model, tile: int) -> dict | None:
    """One RGB image: the screen's 16 tiles and its first stage (module docstring); None where the image
    has fewer than api.SCREEN_TILES tiles (no screen)."""
    from scoreflow_codec import api
    from scoreflow_codec.coding.seed_codec import shared_analyses

    sources = [source]
    ss = api.default_stream_settings(model, tile)
    codec = api._build_codec(model, "chain", api.coding_settings("chain", model), api.default_micro_batch(tile),
                             "cpu", "exact64")
    excess = codec.excess_bits_per_dim()
    n = int(api.rgb_tiles(sources, tile).sum())
    if n < api.SCREEN_TILES:
        return None
    dims = 3 * tile * tile
    with shared_analyses():
        seed = api._file_shares(sources, ss)
        first = api.screen_first_stage(sources, model, ss, "cpu", excess, seed)
        drawn = api._draw(n, api.SCREEN_TILES)  # one RGB image: its tiles are the stream's
        pick = np.sort(drawn)
        look = api.tile_model_bits(sources, model, tile, "cpu", excess, seed, only=pick, look=api.SCREEN_N_T)
    d, total = seed[pick] - look[pick], api._seed_total(seed)
    screen = api.extrapolated_saving(d, n, n, total, api.SCREEN_SD_BPD * dims, api.SCREEN_Z)
    ranked = api.by_seed_bits(drawn, seed)  # the 16 as the first stage ranks them: its own are the first 4
    again = api.first_stage_saving(d[np.searchsorted(pick, np.sort(ranked[:api.SCREEN_FIRST]))], n, dims, n, total)
    return {"tiles": n, "screen_upper": screen.upper, "screen_needed": screen.needed,
            "screen_passes": screen.upper >= screen.needed, "first_ratio": first.upper / first.needed,
            "first_rules_out": first.upper < first.needed, "first_ratio_16s_look": again.upper / again.needed,
            "best_tile_rank": int(np.flatnonzero(ranked == pick[np.argmax(d)])[0]) + 1,
            "model_minus_seed_bpd": (-d / dims).tolist(), "seed_bpd": (seed[pick] / dims).tolist()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    run = rgb_model_run(ap, argv, "screen_first")
    if run is None:
        return 2
    args, model, sources = run
    from scoreflow_codec import api

    tile = args.tile or model.tile
    print(f"model {model.name} ({model.sha256[:12]}), {tile}px tiles; first stage: {api.SCREEN_FIRST} of the screen's "
          f"{api.SCREEN_TILES} tiles, spread at least {api.SCREEN_FIRST_SPREAD_BPD}, mean + {api.SCREEN_FIRST_Z} se")
    print(f"{'image':16s} {'tiles':>5s} {'16: at most/needed':>18s} {'first stage':>12s} {'(16s look)':>10s} "
          f"{'best tile':>9s} {'s':>5s}")
    rows = {}
    for p, s in zip(args.images, sources):
        t0 = time.perf_counter()
        r = first_stage(s, model, tile)
        if r is None:
            print(f"{p.name[:16]:16s} fewer than {api.SCREEN_TILES} tiles: no screen")
            continue
        r["seconds"] = time.perf_counter() - t0
        rows[p.name] = r
        print(f"{p.name[:16]:16s} {r['tiles']:5d} {r['screen_upper'] / r['screen_needed']:11.3f} "
              f"{'passes' if r['screen_passes'] else 'skips':>6s} {r['first_ratio']:6.3f} "
              f"{'out' if r['first_rules_out'] else 'on':>5s} {r['first_ratio_16s_look']:10.3f} "
              f"{r['best_tile_rank']:9d} {r['seconds']:5.0f}", flush=True)
    passed = [k for k, r in rows.items() if r["screen_passes"]]
    lost = [k for k in passed if rows[k]["first_rules_out"]]
    margin = min((min(rows[k]["first_ratio"], rows[k]["first_ratio_16s_look"]) for k in passed), default=None)
    print(f"the 16 pass {len(passed)} of {len(rows)}; the first stage rules out "
          f"{sum(r['first_rules_out'] for r in rows.values())}, of those the 16 pass: {', '.join(lost) or 'none'}"
          + ("" if margin is None else f"; lowest first-stage ratio where the 16 pass {margin:.3f}"))
    if args.json:
        args.json.write_text(json.dumps({"model": model.name, "sha256": model.sha256, "tile": tile,
                                         "first": api.SCREEN_FIRST, "spread_bpd": api.SCREEN_FIRST_SPREAD_BPD,
                                         "z": api.SCREEN_FIRST_Z, "machine": machine_info(), "images": rows,
                                         "lost": lost, "margin": margin}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
