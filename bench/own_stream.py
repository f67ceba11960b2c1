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
each: bytes, bits/dim, seed tiles of all, threads, encode and decode seconds.
"""
from __future__ import annotations

import argparse
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
    a = ap.parse_args(argv)
    import torch

    from scoreflow_codec import api, images, zoo
    from scoreflow_codec.errors import BadImageError, ModelError

    torch.set_num_threads(a.threads)
    for path in a.images:
        try:  # a bad image or model: one line, exit 2 (a decode that differs raises: a bug)
            src = [images.load_image(path)]
            model = zoo.load_model(zoo.auto_model_name([src[0].size]) if a.model == "auto" else a.model)
        except (BadImageError, ModelError) as e:
            print(f"own_stream: {e}", file=sys.stderr)
            return 2
        ss = api.default_stream_settings(model, seed_tiles="first")
        settings = {"steps": a.steps} if a.steps else None
        t0 = time.perf_counter()
        data, rep = api.compress(src, model, a.mode, settings, stream_settings=ss, fallback="off")
        t1 = time.perf_counter()
        api.check_identical(src, api.decompress(data, model))
        t2 = time.perf_counter()
        print(json.dumps({"image": path.name, "model": model.name, "mode": a.mode, "bytes": len(data),
                          "bpd": 8 * len(data) / rep.num_dims, "seed_tiles": [rep.stream.n_seed, rep.stream.n_tiles],
                          "threads": torch.get_num_threads(), "encode_s": round(t1 - t0, 1),
                          "decode_s": round(t2 - t1, 1), "identical": True}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
