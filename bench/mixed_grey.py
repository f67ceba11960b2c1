"""Grey images beside colour ones in one .sfc file (0.9.33): the file and the time of api.compress.

    python bench/mixed_grey.py cifar            # CIFAR-10 test images 0 - 7 in colour, 8 - 15 in grey (cifar10)
    python bench/mixed_grey.py kodcrop --fallback both   # 256x256 centres of kodim01, 14 in colour, 05, 23 in grey (photo)
    python bench/mixed_grey.py kodak            # kodim01 in colour and kodim05 in grey, whole (photo)

Each set is coded as one stream, as `sfcodec compress a.png b.png ... -o set.sfc` codes it (grey: Pillow's
convert("L")), with the given --fallback, then decoded and compared; prints one JSON line: the file's
bytes and bits/dim, which coder wrote it and why the model's stream was skipped, both files' sizes
where both were coded, the seed tiles of the stream kept, encode and decode seconds (one torch thread
unless --threads). Needs ../shared/data (SFC_SHARED_DATA elsewhere).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.datasets import shared_data_dir  # noqa: E402

DATA = shared_data_dir()


def grey(a: np.ndarray) -> np.ndarray:
    return np.asarray(Image.fromarray(a).convert("L"))


def kodak(n: int, side: int | None = None) -> np.ndarray:
    a = np.asarray(Image.open(DATA / "kodak" / f"kodim{n:02d}.png").convert("RGB"))
    if side is None:
        return a
    h, w = a.shape[:2]
    return a[(h - side) // 2:(h + side) // 2, (w - side) // 2:(w + side) // 2]


def the_set(case: str) -> tuple[list[np.ndarray], str]:
    """(arrays, model name) of a named set."""
    if case == "cifar":
        from scoreflow_codec.images import read_npz

        x = read_npz(DATA / "cifar10" / "test.npz")["images"][:16]
        return [*x[:8], *(grey(a) for a in x[8:16])], "cifar10"
    if case == "kodcrop":
        return [kodak(1, 256), grey(kodak(5, 256)), kodak(14, 256), grey(kodak(23, 256))], "photo"
    return [kodak(1), grey(kodak(5))], "photo"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("case", choices=["cifar", "kodcrop", "kodak"])
    ap.add_argument("--fallback", default="auto", choices=["auto", "both", "off"])
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    if not DATA.is_dir():
        print(f"shared data not found at {DATA} (set SFC_SHARED_DATA)", file=sys.stderr)
        return 2
    import torch

    from scoreflow_codec import api, images, zoo

    torch.set_num_threads(a.threads)
    arrays, name = the_set(a.case)
    srcs = [images.from_array(x) for x in arrays]
    model = zoo.load_model(name)
    t0 = time.perf_counter()
    data, rep = api.compress(srcs, model, fallback=a.fallback)
    t1 = time.perf_counter()
    back = api.decompress(data, model)
    t2 = time.perf_counter()
    api.check_identical(srcs, back)
    sv = rep.model_saving
    print(json.dumps({"case": a.case, "fallback": a.fallback, "bytes": len(data), "bpd": 8 * len(data) / rep.num_dims,
                      "coded_by": rep.coded_by, "skipped": rep.model_skipped, "model_bytes": rep.model_bytes,
                      "seed_bytes": rep.seed_bytes, "stream_seed_tiles": [rep.stream.n_seed, rep.stream.n_tiles],
                      "saving_bits": None if sv is None else [round(sv.bits), sv.tiles, round(sv.needed)],
                      "encode_s": round(t1 - t0, 1), "decode_s": round(t2 - t1, 1), "identical": True}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
