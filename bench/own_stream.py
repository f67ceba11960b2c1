"""A model's own chain (or ODE) stream of each image, encode and decode timed: what issue 10's "a Kodak
image in chain mode in under 10 minutes on the 2-core CPU" measures.

    python bench/own_stream.py ../shared/data/kodak/kodim01.png          # photo (--model auto), 2 threads
    python bench/own_stream.py a.png b.png --model cifar10 --threads 1 --steps 64

`sfcodec compress --no-fallback` codes the model's stream with the seed tiles the encoder chooses: on
Kodak every tile goes to the seed codec (the photo model's estimate is above it on each), so it no
longer shows the model coding a photograph. Here the seed tiles are "first" (only as many as the chain
needs to have bits to pop, coded alone: stream settings seed_tiles "first", seed_context "tile"), as
0.9.13 and before coded every stream, and as `sfcodec compress --no-fallback --seed-tiles first` (0.9.34)
does. Each image is its own stream, decoded and compared; one JSON line
each: bytes, bits/dim, seed tiles of all, threads, encode and decode seconds, and the model's own rate:
"model_bpd", the net bits the coders predict for the model's tiles (pushed minus popped back) over
their dims, and "seed_bpd", the seed tiles' bits over theirs. On an image of few tiles the seed tiles,
which the chain needs to have bits to pop, weigh on the file's bits/dim; model_bpd is the rate the
model's tiles add, what the file's bits/dim tends to on a large image.

    python bench/own_stream.py ../shared/data/misc/4.1.07.tiff --mode ode --arith float32 --seed-tiles 10

--seed-tiles N fixes how many (the first N; default: as many as the chain needs), so that two modes
code the same model tiles; --arith float32 as `sfcodec compress --arith float32` (about 3x faster, the
file decodes on the same kind of machine only).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("images", nargs="+", type=Path)
    ap.add_argument("--model", default="auto")
    ap.add_argument("--mode", default="chain", choices=["chain", "ode"])
    ap.add_argument("--steps", type=int, default=None, help="default: the model's own (photo: 64)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--arith", default="exact64", choices=["exact64", "float32"])
    ap.add_argument("--seed-tiles", type=int, default=None, metavar="N",
                    help="the first N tiles are seed tiles (default: as many as the chain needs)")
    a = ap.parse_args(argv)
    if a.seed_tiles is not None and a.seed_tiles < 1:
        ap.error("--seed-tiles: at least 1 (the chain needs bits to pop)")
    import torch

    from scoreflow_codec import api, images, zoo
    from scoreflow_codec.coding import tiles
    from scoreflow_codec.errors import BadImageError, ModelError

    torch.set_num_threads(a.threads)
    for path in a.images:
        try:  # a bad image or model: one line, exit 2 (a decode that differs raises: a bug)
            src = [images.load_image(path)]
            model = zoo.load_model(zoo.auto_model_name([src[0].size]) if a.model == "auto" else a.model)
        except (BadImageError, ModelError) as e:
            print(f"own_stream: {e}", file=sys.stderr)
            return 2
        ss = dataclasses.replace(api.default_stream_settings(model, seed_tiles="first"), n_seed=a.seed_tiles)
        settings = {"steps": a.steps} if a.steps else None
        t0 = time.perf_counter()
        data, rep = api.compress(src, model, a.mode, settings, stream_settings=ss, fallback="off", arith=a.arith,
                                 track=True)
        t1 = time.perf_counter()
        api.check_identical(src, api.decompress(data, model))
        t2 = time.perf_counter()
        st = rep.stream
        per_tile = tiles.MODEL_CHANNELS * ss.tile ** 2  # every tile a whole RGB tile (else null: unequal dims)
        whole = rep.num_dims == per_tile * st.n_tiles
        own = {"model_bpd": st.model_bits / (per_tile * (st.n_tiles - st.n_seed))
               if whole and st.n_seed < st.n_tiles else None,
               "seed_bpd": st.seed_bits / (per_tile * st.n_seed) if whole and st.n_seed else None}
        print(json.dumps({"image": path.name, "model": model.name, "mode": a.mode, "arith": a.arith,
                          "bytes": len(data), "bpd": 8 * len(data) / rep.num_dims, **own,
                          "seed_tiles": [st.n_seed, st.n_tiles],
                          "threads": torch.get_num_threads(), "encode_s": round(t1 - t0, 1),
                          "decode_s": round(t2 - t1, 1), "identical": True}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
