"""16-bit images: .sfc file sizes beside PNG and JPEG-XL (lossless, 16 bits per sample), every file decoded.

    python bench/deep16.py                       # the 24 Kodak images, made 16-bit (below), --fallback auto
    python bench/deep16.py --limit 4 --fallback seed
    python bench/deep16.py --folder my16bit/     # 16-bit PNGs and TIFFs of your own, as they are

No 16-bit photographs are in ../shared/data, so by default the set is made from the Kodak images (the
photo model's test set: it never trained on them), as a raw developer's output would be: each image
resized by --scale (Lanczos, in floating point, per channel) and scaled to 16 bits (x 257, rounded):
"dense" samples whose low bits carry the resampling's extra precision. --kind twelve makes the same
images 12-bit and scales them to 16 bits (v * 65535 // 4095, as a 12-bit camera's TIFF/PNG), which
the codec reduces to their table of values (deep.py).

Sizes are bits per sample (bits/dim) of the 16-bit images: PNG (imagecodecs, zlib level 9), JPEG-XL
(imagecodecs' libjxl, lossless, effort 9, one thread), sfc (api.compress of the PNG as `sfcodec
compress` reads it: --fallback auto with the model `--model auto` picks by size, or the seed codec alone), with
its low-bit section apart, encode and decode seconds. Writes a Markdown table and a JSON file to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.datasets import shared_data_dir  # noqa: E402

DATA = shared_data_dir()


def make16(path: Path, scale: float, kind: str, size: tuple[int, int] | None = None) -> np.ndarray:
    """uint16 [H, W, 3]: the image resized by `scale` (or to `size`; Lanczos, float) and made 16-bit (`kind`)."""
    img = Image.open(path).convert("RGB")
    size = size or (round(img.width * scale), round(img.height * scale))
    planes = [np.asarray(ch.convert("F").resize(size, Image.LANCZOS), dtype=np.float64) for ch in img.split()]
    v = np.clip(np.stack(planes, -1) / 255.0, 0.0, 1.0)
    if kind == "twelve":
        return (np.round(v * 4095).astype(np.int64) * 65535 // 4095).astype(np.uint16)
    return np.round(v * 65535).astype(np.uint16)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--folder", type=Path, default=None, help="16-bit PNGs and TIFFs to measure as they are")
    ap.add_argument("--kind", choices=["dense", "twelve"], default="dense")
    ap.add_argument("--scale", type=float, default=0.5, help="resize factor of the Kodak images (default 0.5)")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--fallback", choices=["auto", "seed"], default="auto")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "deep16")
    args = ap.parse_args(argv)
    try:
        import imagecodecs
    except ImportError:
        raise SystemExit("deep16: needs imagecodecs (pip install -e '.[bench]')")
    from bench.scoreflow_runner import load_model, resolve_model
    from scoreflow_codec import api, images

    if args.folder:
        paths = sorted(p for p in args.folder.iterdir() if p.suffix.lower() in (".png", ".tif", ".tiff"))
    else:
        kodak = DATA / "kodak"
        if not kodak.is_dir():
            raise SystemExit(f"deep16: {kodak} is missing (set SFC_SHARED_DATA)")
        paths = sorted(kodak.glob("kodim*.png"))
    paths = paths[: args.limit]
    models: dict = {}  # the models --model auto picks by size, each loaded once
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for p in paths:
            if args.folder:
                png_path = p
            else:
                png_path = Path(tmp) / p.name
                png_path.write_bytes(images.encode_source(images.from_array(make16(p, args.scale, args.kind)), ".png"))
            src = images.load_image(png_path)
            if not src.deep:
                print(f"deep16: {p.name} is not a 16-bit image; skipped", file=sys.stderr)
                continue
            arr = images.to_array(src)
            dims = arr.size
            png = len(imagecodecs.png_encode(arr, level=9))
            t = time.perf_counter()
            jxl = imagecodecs.jpegxl_encode(arr, lossless=True, effort=9, numthreads=1)
            jxl_s = time.perf_counter() - t
            assert np.array_equal(np.asarray(imagecodecs.jpegxl_decode(jxl)).reshape(arr.shape), arr)
            model = None
            if args.fallback != "seed":
                name = resolve_model("auto", [src.size])
                model = models[name] if name in models else models.setdefault(name, load_model(name, "cpu"))
            t = time.perf_counter()
            data, rep = api.compress([src], model, fallback=args.fallback)
            enc_s = time.perf_counter() - t
            t = time.perf_counter()
            back = api.decompress(data, model)
            dec_s = time.perf_counter() - t
            identical = bool(np.array_equal(images.to_array(back[0]), arr))
            row = {"image": p.name, "size": f"{arr.shape[1]}x{arr.shape[0]}", "deep": src.meta["deep"],
                   "png_bpd": 8 * png / dims, "jxl_bpd": 8 * len(jxl) / dims, "sfc_bpd": 8 * len(data) / dims,
                   "sfc_low_bpd": 8 * rep.low_bytes / dims, "coded_by": rep.coded_by, "sfc_encode_s": enc_s,
                   "sfc_decode_s": dec_s, "jxl_encode_s": jxl_s, "identical": identical}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if not rows:
        raise SystemExit("deep16: no 16-bit images")
    mean = {k: float(np.mean([r[k] for r in rows])) for k in ("png_bpd", "jxl_bpd", "sfc_bpd", "sfc_low_bpd",
                                                              "sfc_encode_s", "sfc_decode_s", "jxl_encode_s")}
    what = str(args.folder) if args.folder else f"Kodak x{args.scale} Lanczos, {args.kind}"
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "deep16.json").write_text(json.dumps({"set": what, "fallback": args.fallback, "machine": machine,
                                                       "rows": rows, "mean": mean}, indent=1))
    lines = [f"16-bit images: {what}, {len(rows)} images, sfc --fallback {args.fallback} ({machine})", "",
             "| image | size | PNG | JPEG-XL e9 | sfc | of it low bits | sfc encode s | decode s | identical |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows + [{"image": "mean", "size": "", **mean, "identical": all(r["identical"] for r in rows)}]:
        lines.append(f"| {r['image']} | {r['size']} | {r['png_bpd']:.3f} | {r['jxl_bpd']:.3f} | {r['sfc_bpd']:.3f} | "
                     f"{r['sfc_low_bpd']:.3f} | {r['sfc_encode_s']:.1f} | {r['sfc_decode_s']:.1f} | {r['identical']} |")
    (args.out / "deep16.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
