"""Compress + decompress one large photo-like image (default 4000x3000): wall time and peak RSS.

    python bench/large_image.py                                  # 4000x3000 from Kodak, as `sfcodec compress`
    python bench/large_image.py --size 512x384 --threads 1       # a quick check
    python bench/large_image.py --jobs 1                         # the seed codec's parts one after another
    python bench/large_image.py --image photo.png --model my.safetensors --mode ode --fallback off
    python bench/large_image.py --bits 16                        # a 16-bit image (deep16.make16's "dense")

The image is a Kodak photo resized (bicubic) to --size, or --image as given (cropped/resized to
--size when given). The defaults are `sfcodec compress`'s: --model auto (the photo model above
64x64), chain mode, --fallback auto (the seed codec's file, and the model's stream where its
estimate promises a smaller one). Prints one JSON line: sizes, bits/dim, which coder made the file
(and why the model's stream was not coded, where it was not: "saving", "screen", "sample", ...), encode/decode
seconds, peak RSS (MiB, resource.getrusage: the high-water mark of the whole process), and whether
the pixels matched. The seed codec's file of an image above 1024x1024 comes in independent parts,
coded and decoded in --jobs processes (default: as sfcodec, every usable core within the available
memory); their peak RSS is reported apart (peak_rss_mib_workers: the largest of them).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DATA = Path(os.environ.get("SFC_SHARED_DATA", REPO.parent / "shared" / "data"))


def _peak_rss_mib(who: int = resource.RUSAGE_SELF) -> float:
    kb = resource.getrusage(who).ru_maxrss
    return kb / (1024.0 * 1024.0) if sys.platform == "darwin" else kb / 1024.0  # bytes on macOS


def _load(path: Path | None, size: tuple[int, int] | None, crop: bool) -> np.ndarray:
    if path is None:
        path = DATA / "kodak" / "kodim01.png"
        if not path.exists():
            raise SystemExit(f"large_image: no --image and {path} is missing (set SFC_SHARED_DATA)")
    try:
        with Image.open(path) as im:
            img = im.convert("RGB")
    except (OSError, ValueError) as e:  # missing, not an image: one line, exit 1
        raise SystemExit(f"large_image: {path}: not an image Pillow can read ({e.__class__.__name__})") from None
    if size is not None and img.size != size:
        if crop and img.size[0] >= size[0] and img.size[1] >= size[1]:
            img = img.crop((0, 0, size[0], size[1]))
        else:
            img = img.resize(size, Image.BICUBIC)
    return np.asarray(img)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--image", type=Path, default=None, help="input image (default: Kodak kodim01)")
    ap.add_argument("--size", default="4000x3000", help="WxH to resize (or crop, with --crop) to")
    ap.add_argument("--crop", action="store_true", help="crop the top-left WxH instead of resizing")
    ap.add_argument("--model", default="auto", help="auto (by size, as sfcodec), a shipped model's name or an exported .safetensors")
    ap.add_argument("--fallback", default="auto", choices=["auto", "both", "off", "seed"], help="as sfcodec compress --fallback")
    ap.add_argument("--mode", default="chain", choices=["chain", "ode"])
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--jobs", type=int, default=None, help="processes for the seed codec's parts (default: sfcodec's)")
    ap.add_argument("--bits", type=int, default=8, choices=[8, 16],
                    help="16: the image resized in floating point and made 16-bit (bench/deep16.py's dense kind)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    from scoreflow_codec.threads import spin_briefly

    spin_briefly()  # as sfcodec does, before torch loads

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from tqdm import tqdm

    from bench import scoreflow_runner
    from scoreflow_codec import api, images

    try:
        w, h = (int(v) for v in args.size.lower().split("x"))
    except ValueError:
        ap.error(f"--size {args.size!r}: expected WxH, e.g. 4000x3000")
    if args.bits == 16:
        from bench.deep16 import make16

        path = args.image or DATA / "kodak" / "kodim01.png"
        arr = make16(path, 1.0, "dense", size=(w, h))
    else:
        arr = _load(args.image, (w, h), args.crop)
    src = images.from_array(arr)
    try:
        model = scoreflow_runner.load_model(args.model, args.device, [(w, h)])  # "auto": as sfcodec picks
    except scoreflow_runner.ScoreflowError as e:
        raise SystemExit(f"large_image: {e}") from None
    settings = {"steps": args.steps} if args.steps else None
    rss_start = _peak_rss_mib()

    total = api.compress_work_units([src], model, args.mode, settings)
    with tqdm(total=total, desc="encode", unit="tile-step", file=sys.stderr, disable=args.no_progress) as bar:
        t0 = time.perf_counter()
        data, rep = api.compress([src], model, args.mode, settings, device=args.device, progress=bar.update,
                                 fallback=args.fallback, jobs=args.jobs)
        enc_s = time.perf_counter() - t0
    rss_enc = _peak_rss_mib()
    header = api.read_header(data)
    with tqdm(total=api.work_units(header), desc="decode", unit="tile-step", file=sys.stderr,
              disable=args.no_progress) as bar:
        t1 = time.perf_counter()
        back = api.decompress(data, model, device=args.device, progress=bar.update, jobs=args.jobs)
        dec_s = time.perf_counter() - t1
    identical = bool(np.array_equal(images.to_array(back[0]), arr))
    print(json.dumps({
        "bench": "large_image", "width": w, "height": h, "mode": args.mode, "model": model.name,
        "steps": header["settings"].get("steps", api.FORMAT_DEFAULTS[args.mode]["steps"]),
        "threads": torch.get_num_threads(), "device": args.device, "tiles": header["fields"]["n_tiles"],
        "fallback": args.fallback, "coded_by": rep.coded_by, "model_bytes": rep.model_bytes, "seed_bytes": rep.seed_bytes,
        "model_skipped": rep.model_skipped,  # why the model's stream was not coded (api.CompressReport)
        "bits": args.bits, "low_bytes": rep.low_bytes, "file_bytes": len(data), "bpd": round(rep.bpd, 4), "encode_s": round(enc_s, 2), "decode_s": round(dec_s, 2),
        "peak_rss_mib_after_load": round(rss_start, 1), "peak_rss_mib_encode": round(rss_enc, 1),
        "peak_rss_mib": round(_peak_rss_mib(), 1), "identical": identical, "jobs": args.jobs,
        "parts": len(header["fields"].get("parts", [])) or 1,
        "peak_rss_mib_workers": round(_peak_rss_mib(resource.RUSAGE_CHILDREN), 1),
        "machine": platform.machine(), "cpus": os.cpu_count(), "torch": torch.__version__,
    }))
    return 0 if identical else 7


if __name__ == "__main__":
    sys.exit(main())
