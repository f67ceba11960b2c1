"""Graphics: palette images (GIF-style) and screenshot-like RGB pictures, .sfc against PNG, GIF
and WebP lossless on the same image.

    python bench/graphics.py kodak --limit 8 --colors 256,16 --threads 1
    python bench/graphics.py path/to/folder --crop 128
    python bench/graphics.py screens                # synthetic screenshots (text, charts), RGB

`screens` draws four RGB pictures with Pillow (code text, a bar chart, a diagram, a form; fixed
content, Pillow's default font), each coded as it is. Any other set (a named set, an .npz or a
folder, as bench/run.py takes) has each image turned into palette images the way users make
them: Pillow's adaptive palette (`convert("P", palette=ADAPTIVE)`, for 256 colours) or median-cut
quantization (`quantize`, for fewer). Each image is compressed with the codec's defaults
(`api.compress`, `--fallback auto`, exact64), decoded and compared; PNG (optimize), GIF and WebP
lossless (method 6) code the same image. Bits per pixel (an index or an RGB pixel; palettes and
headers included in every size). `v080_bpp` is how 0.8.0 coded the image, as the seed codec's
ideal codelength: its colour planes with seed codec version 4 (0.8.0's file was at least that,
or, for a palette image, the model's stream where the model's bound came near it). Prints one
JSON line per image, then a Markdown summary; `--out DIR` also writes results.json there.
"""
from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import datasets  # noqa: E402
from bench.report import machine_info  # noqa: E402
from bench.scoreflow_runner import resolve_model  # noqa: E402


def palette_versions(rgb: Image.Image, colors: int) -> Image.Image:
    """The palette image users make of `rgb` with `colors` colours."""
    if colors >= 256:
        return rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=256)
    return rgb.quantize(colors)


def _size(img: Image.Image, fmt: str, **kw) -> int:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return len(buf.getvalue())


def screens() -> list[tuple[str, Image.Image]]:
    """Four screenshot-like RGB pictures, the same every run (for a given Pillow)."""
    from PIL import ImageDraw

    out = []
    im = Image.new("RGB", (480, 320), (250, 250, 252))
    d = ImageDraw.Draw(im)
    for i in range(15):
        d.text((12, 8 + 20 * i), f"def step_{i}(x, y):  return x * {i * 7} + y  # comment {i}",
               fill=(30, 30, 140) if i % 3 else (160, 40, 40))
    out.append(("code", im))
    im = Image.new("RGB", (400, 300), (255, 255, 255))
    d = ImageDraw.Draw(im)
    d.line((40, 260, 380, 260), fill=(0, 0, 0), width=2)
    d.line((40, 20, 40, 260), fill=(0, 0, 0), width=2)
    for i, v in enumerate((120, 200, 90, 230, 160, 60, 180)):
        d.rectangle((55 + 46 * i, 260 - v, 85 + 46 * i, 258), fill=(60 + 25 * i, 120, 200 - 20 * i))
        d.text((58 + 46 * i, 266), f"Q{i + 1}", fill=(0, 0, 0))
    out.append(("chart", im))
    im = Image.new("RGB", (420, 280), (245, 245, 240))
    d = ImageDraw.Draw(im)
    for j, (x, y) in enumerate(((30, 30), (250, 30), (30, 180), (250, 180))):
        d.rounded_rectangle((x, y, x + 140, y + 60), 10, fill=(200, 225, 255), outline=(30, 60, 120), width=2)
        d.text((x + 20, y + 22), f"module {j}", fill=(20, 20, 20))
    for a, b in (((170, 60), (250, 60)), ((100, 90), (100, 180)), ((170, 210), (250, 210)), ((320, 90), (320, 180))):
        d.line((a, b), fill=(90, 90, 90), width=3)
    d.ellipse((180, 110, 240, 160), fill=(250, 200, 80), outline=(120, 80, 0))
    out.append(("diagram", im))
    im = Image.new("RGB", (360, 360), (236, 239, 244))
    d = ImageDraw.Draw(im)
    for i in range(8):
        d.text((20, 20 + 42 * i), f"Field {i}:", fill=(40, 40, 40))
        d.rectangle((110, 14 + 42 * i, 340, 38 + 42 * i), fill=(255, 255, 255), outline=(150, 160, 175))
        d.text((118, 20 + 42 * i), "value " * (i % 4 + 1), fill=(20, 20, 20))
    out.append(("form", im))
    return out


def measure(img: Image.Image, model) -> dict:
    from scoreflow_codec import api, images
    from scoreflow_codec.coding.seed_codec import seed_bits

    n = img.size[0] * img.size[1]
    src = images.from_pil(img)
    t0 = time.perf_counter()
    data, _ = api.compress([src], model, "chain", fallback="auto")
    enc = time.perf_counter() - t0
    t0 = time.perf_counter()
    back = api.decompress(data, model)
    dec = time.perf_counter() - t0
    api.check_identical([src], back)  # raises on any difference
    arr = np.asarray(img)
    row = {"colors": int(len(np.unique(arr.reshape(n, -1), axis=0))), "sfc_bpp": 8 * len(data) / n,
           "coded_as": api.read_header(data).get("meta", {}).get("0", {}).get("palette_coded", img.mode),
           "png_bpp": 8 * _size(img, "PNG", optimize=True) / n, "gif_bpp": 8 * _size(img, "GIF") / n,
           "webp_bpp": 8 * _size(img, "WEBP", lossless=True, method=6, quality=100) / n,
           "encode_s": enc, "decode_s": dec}
    if src.color is not None:
        row["v080_bpp"] = seed_bits(src.color, 4) / n
    return row


def summary(rows: list[dict]) -> str:
    cols = ["sfc_bpp", "v080_bpp", "png_bpp", "gif_bpp", "webp_bpp", "encode_s", "decode_s"]
    lines = ["| images | n | " + " | ".join(cols) + " | sfc < PNG | sfc < WebP |",
             "|---|---:|" + "---:|" * (len(cols) + 2)]
    for kind in dict.fromkeys(r["kind"] for r in rows):
        rs = [r for r in rows if r["kind"] == kind]
        means = [np.mean([r[c] for r in rs if c in r]) if any(c in r for r in rs) else float("nan") for c in cols]
        lines.append(f"| {kind} | {len(rs)} | " + " | ".join(f"{m:.3f}" for m in means)
                     + f" | {sum(r['sfc_bpp'] < r['png_bpp'] for r in rs)} | {sum(r['sfc_bpp'] < r['webp_bpp'] for r in rs)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("set", help="screens (synthetic screenshots), or kodak, misc, cifar10, an .npz or a folder (palette versions)")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--colors", default="256,16", help="comma-separated palette sizes (2 - 256)")
    ap.add_argument("--crop", type=int, default=None, help="centre crop of this size first (quick runs)")
    ap.add_argument("--model", default="auto")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    try:
        colors = [int(c) for c in args.colors.split(",")]
        if not all(2 <= c <= 256 for c in colors):
            raise ValueError
    except ValueError:
        print(f"graphics.py: error: --colors takes sizes 2 - 256, got {args.colors!r}", file=sys.stderr)
        return 2
    if args.set == "screens":
        items = [(name, [("RGB", im)]) for name, im in screens()[:args.limit]]
    else:
        try:
            data = datasets.load(args.set, args.limit)
        except datasets.DataError as e:
            print(f"graphics.py: error: {e}", file=sys.stderr)
            return 2
        items = []
        for name, arr in zip(data.names, data.images):
            rgb = Image.fromarray(arr[..., :3] if arr.shape[2] >= 3 else np.repeat(arr[..., :1], 3, 2), "RGB")
            if args.crop:
                w, h = rgb.size
                c = min(args.crop, w, h)
                rgb = rgb.crop(((w - c) // 2, (h - c) // 2, (w - c) // 2 + c, (h - c) // 2 + c))
            items.append((name, [(f"{k} colours", palette_versions(rgb, k)) for k in colors]))
    import torch

    from scoreflow_codec import zoo

    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    models = {}
    for name, versions in items:
        for kind, img in versions:
            spec = resolve_model(args.model, [img.size])
            if spec not in models:
                models[spec] = zoo.load_model(spec)
            row = {"image": name, "kind": kind, **measure(img, models[spec])}
            print(json.dumps(row), flush=True)
            rows.append(row)
    print(summary(rows))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps({"set": args.set, "machine": machine_info(), "argv": sys.argv,
                                                       "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
