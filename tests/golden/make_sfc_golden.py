"""Make the golden .sfc files that tests/test_golden_files.py decodes: files written by a released
model and codec, which every later version must still decode to the same pixels.

Run once per new shipped model (python tests/golden/make_sfc_golden.py NAME), never to "fix" a
failing golden test: a failure there means old files no longer decode.

The images are synthetic (no data-set pixels in the repo): smooth colour fields plus a
deterministic integer-hash texture, so that the seed codec fills the stack quickly and later tiles
go through the model.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent

# name -> (zoo model, [(width, height)], extra sfcodec arguments). --no-fallback: the golden file
# must go through the model even where the seed codec alone would be smaller.
CASES = {
    # (the models of photo-1, photo-2, cifar10-1 to -x4 and photo-x1 are retired since 0.9.43, cifar10-x5's
    # since 0.9.44, cifar10-x6 to -x9's since 0.9.45, cifar10-x10 to -x13's since 0.9.46, cifar10-x14's
    # since 0.9.47, cifar10-x15's since 0.9.48, cifar10-x16's since 0.9.49: these cases cannot be made
    # again, and test_golden_files checks their files' errors instead)
    # the float32 arithmetic, written 2026-11-24 on the session machine of that day (not this
    # project's CI machine type): they decode only where the kernels are the same
    "photo-1": ("photo-1", [(192, 128)], ["--arith", "float32"]),  # while photo-1 was the zoo's photo
    "photo-2": ("photo", [(192, 128)], ["--arith", "float32"]),
    "cifar10-1": ("cifar10", [(32, 32)] * 6, ["--arith", "float32"]),
    # the exact arithmetic (2026-11-25): every machine must decode them
    "photo-x1": ("photo", [(192, 128)], ["--no-fallback", "--steps", "16"]),  # 16 steps: a fast test
    "cifar10-x1": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--steps", "16"]),
    # 0.3.0 (2026-11-25): seed codec version 2, in a model stream's seed tiles and alone
    "cifar10-x2": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--steps", "16"]),
    "seed-x2": ("photo", [(192, 128), (40, 24)], ["--fallback", "both", "--steps", "16"]),
    # 0.4.0 (2026-11-25): seed codec version 3; red and blue are green plus slow offsets, so its
    # difference mode codes them
    "seed-x3": ("photo", [(192, 128), (40, 24)], ["--fallback", "both", "--steps", "16"], "chroma"),
    # seed codec version 4: red carries its own noise and blue follows (green + red) // 2, so
    # version 4's difference mode (blue against (G + R) // 2, coarse rows mixed in) codes both
    "seed-x4": ("photo", [(192, 128), (40, 24)], ["--fallback", "both", "--steps", "16"], "chroma4"),
    # 0.5.0: the cifar10 model of 2026-11-25 (the earlier one is cifar10-1 in the zoo now)
    "cifar10-x3": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--steps", "16"]),
    # 0.6.0: a seed-only file's header names no model and no setup (one 32x32 image: one tile,
    # always the seed codec's)
    "seed-h6": ("cifar10", [(32, 32)], ["--steps", "16"], "chroma4"),
    # 0.6.0: the cifar10 model of 0.6.0 (0.5.0's is cifar10-2 in the zoo now)
    "cifar10-x4": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--steps", "16"]),
    # 0.7.0: the cifar10 model of 0.7.0, float16 weights (0.6.0's is cifar10-3 in the zoo now)
    "cifar10-x5": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--steps", "16"]),
    # 0.8.0: the cifar10 model of 0.8.0 (0.7.0's is cifar10-4 in the zoo now), format version 2
    "cifar10-x6": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--steps", "16"]),
    # 0.8.0: format version 2 (the header's longer DEFLATE dictionary), a seed-only one-image file
    "seed-f2": ("cifar10", [(32, 32)], ["--steps", "16"], "chroma4"),
    # 0.9.0: the cifar10 model of 0.9.0 (0.8.0's is cifar10-5 in the zoo now), seed codec version 5
    "cifar10-x7": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--steps", "16"]),
    # 0.9.0: seed codec version 5, its LZMA mode (flat colours, stripes, lines: graphics)
    "seed-x5": ("photo", [(96, 64), (40, 24)], ["--steps", "16"], "graphic"),
    # 0.9.1: format version 4 (the release in the fixed header, not in the deflated JSON), a
    # seed-only one-image file of seed-f2's image
    "seed-f4": ("cifar10", [(32, 32)], ["--steps", "16"], "chroma4"),
    # 0.9.1: the cifar10 model of 0.9.1 (0.9.0's is cifar10-6 in the zoo now), format version 4
    "cifar10-x8": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--steps", "16"]),
    # 0.9.2: the cifar10 model of 0.9.2 (0.9.1's is cifar10-7 in the zoo now), format version 4
    "cifar10-x9": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--steps", "16"]),
    # 0.9.3: the cifar10 model of 0.9.3 (0.9.2's is cifar10-8 in the zoo now), format version 4
    "cifar10-x10": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--steps", "16"]),
    # 0.9.4: the cifar10 model of 0.9.4 (0.9.3's is cifar10-9 in the zoo now), format version 4
    "cifar10-x11": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--steps", "16"]),
    # 0.9.5: the cifar10 model of 0.9.5 (0.9.4's is cifar10-10 in the zoo now), format version 4
    "cifar10-x12": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--steps", "16"]),
    # 0.9.6: the photo model of 0.9.6, float16 weights (0.9.5's is photo-2 in the zoo now)
    "photo-x2": ("photo", [(192, 128)], ["--no-fallback", "--steps", "16"]),
    # 0.9.7: the cifar10 model of 0.9.7 (0.9.5's and 0.9.6's is cifar10-11 in the zoo now)
    "cifar10-x13": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--steps", "16"]),
    # 0.9.8: the photo model of 0.9.8 (0.9.6's and 0.9.7's is photo-3 in the zoo now)
    "photo-x3": ("photo", [(192, 128)], ["--no-fallback", "--steps", "16"]),
    # 0.9.9: the photo model of 0.9.9 (0.9.8's is photo-4 in the zoo now)
    "photo-x4": ("photo", [(192, 128)], ["--no-fallback", "--steps", "16"]),
    # 0.9.13: the encoder's factors on the top two network calls (chain_codec, kappa_top 2),
    # photo-x4's model
    "photo-x5": ("photo", [(192, 128)], ["--no-fallback", "--steps", "16"]),
    # 0.9.23: seed codec version 7, its mixed mode (on these images red in the difference mode, blue
    # mixed with the blend)
    "seed-x7": ("photo", [(96, 64), (40, 24)], ["--fallback", "seed"], "chroma"),
    # 0.9.25: seed codec version 8, the error feedback on the blend (the same images as seed-x7)
    "seed-x8": ("photo", [(96, 64), (40, 24)], ["--fallback", "seed"], "chroma"),
    # 0.10.3: the seed codec's encoder at effort 1 (no least squares, no mixed mode; seed-x8's images):
    # the modes it leaves out are the decoder's choice to read, not the format's
    "seed-e1": ("photo", [(96, 64), (40, 24)], ["--fallback", "seed", "--effort", "1"], "chroma"),
    # 0.9.26: a seed codec file in independent parts (stream.in_parts: the first image's 512x512
    # pixels fill a part, so the second image starts another)
    "seed-parts": ("photo", [(512, 512), (40, 24)], ["--fallback", "seed"], "graphic"),
    # 0.9.27: format version 5, the images' metadata kept (metadata.py): the first PNG with an ICC
    # profile, EXIF (orientation 6), XMP, text chunks, gamma, chromaticities and a resolution, the
    # second with a text chunk only
    "seed-meta": ("photo", [(96, 64), (40, 24)], ["--fallback", "seed"], "meta"),
    # 0.9.28: format version 6, 16-bit images (deep.py): a 48-bit RGB PNG with all 16 bits used (8 low
    # bits), a 32-bit grey + alpha one of 12-bit samples shifted up 4 bits, a 16-bit grey one of 10-bit
    # samples scaled to 16 bits (a table of values)
    "seed-deep": ("photo", [(96, 64), (64, 48), (64, 64)], ["--fallback", "seed"], "deep"),
    # 0.9.36: the cifar10 model of 0.9.36, preset small, the first GPU-trained one (0.9.7 - 0.9.35's
    # was cifar10-12 in the zoo, retired in 0.9.46)
    "cifar10-x14": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--seed-tiles", "first", "--steps", "16"]),
    # 0.9.40: the cifar10 of 0.9.40 (0.9.36's GPU run continued on a CPU core; 0.9.36 - 0.9.39's was
    # cifar10-13 in the zoo, retired in 0.9.47)
    "cifar10-x15": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--seed-tiles", "first", "--steps", "16"]),
    # 0.9.41: the cifar10 of 0.9.41 (0.9.40's trained on for 62 minutes on a CPU; 0.9.40's was cifar10-14
    # in the zoo, retired in 0.9.48)
    "cifar10-x16": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--seed-tiles", "first", "--steps", "16"]),
    # 0.9.42: the cifar10 of 0.9.42 (0.9.41's trained on for 62 more minutes on a CPU; 0.9.41's was
    # cifar10-15 in the zoo, retired in 0.9.49)
    "cifar10-x17": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--seed-tiles", "first", "--steps", "16"]),
    # 0.9.43: the cifar10 of 0.9.43 (0.9.42's trained on for 62 more minutes on a CPU; 0.9.42's was
    # cifar10-16 in the zoo, retired in 0.9.50)
    "cifar10-x18": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--seed-tiles", "first", "--steps", "16"]),
    # 0.9.44: the cifar10 of 0.9.44 (0.9.43's trained on for 62 more minutes on a CPU; 0.9.43's was
    # cifar10-17 in the zoo, retired in 0.9.51)
    "cifar10-x19": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--seed-tiles", "first", "--steps", "16"]),
    # 0.9.45: the cifar10 of 0.9.45 (0.9.44's trained on for 60 more minutes on a CPU; 0.9.44's was
    # cifar10-18 in the zoo, retired in 0.9.52)
    "cifar10-x20": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--seed-tiles", "first", "--steps", "16"]),
    # 0.9.46: the cifar10 of 0.9.46 (0.9.45's trained on for 55 more minutes on a CPU, two processes;
    # 0.9.45's was cifar10-19 in the zoo, retired in 0.9.53)
    "cifar10-x21": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--seed-tiles", "first", "--steps", "16"]),
    # 0.9.47: the cifar10 of 0.9.47 (0.9.46's trained on for 55 more minutes the same way; 0.9.46's was
    # cifar10-20 in the zoo, retired in 0.9.54)
    "cifar10-x22": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--seed-tiles", "first", "--steps", "16"]),
    # 0.9.48: the cifar10 of 0.9.48 (0.9.47's trained on for 55 more minutes the same way; 0.9.47's was
    # cifar10-21 in the zoo, retired in 0.9.56)
    "cifar10-x23": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--seed-tiles", "first", "--steps", "16"]),
    # 0.9.49: the cifar10 of 0.9.49 (0.9.48's trained on for 55 more minutes the same way, from its
    # shipped weights; 0.9.48's was cifar10-22 in the zoo, retired in 0.9.58)
    "cifar10-x24": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--seed-tiles", "first", "--steps", "16"]),
    # 0.9.50: the cifar10 of 0.9.50 (0.9.49's trained on for 65 more minutes the same way, resumed from
    # its run; 0.9.49's was cifar10-23 in the zoo, retired in 0.9.59)
    "cifar10-x25": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--seed-tiles", "first", "--steps", "16"]),
    # 0.9.51: the cifar10 of 0.9.51 (0.9.50's trained on for 55 more minutes the same way, from its
    # shipped weights; 0.9.50's was cifar10-24 in the zoo, retired in 0.9.59)
    "cifar10-x26": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--seed-tiles", "first", "--steps", "16"]),
    # 0.9.52: the cifar10 of 0.9.52 (0.9.51's trained on for 55 more minutes the same way, resumed
    # from its run; 0.9.51's is cifar10-25 in the zoo now)
    "cifar10-x27": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--seed-tiles", "first", "--steps", "16"]),
    # 0.9.53: the cifar10 of 0.9.53 (0.9.52's trained on for 52 more minutes the same way, from its
    # shipped weights; 0.9.52's is cifar10-26 in the zoo now)
    "cifar10-x28": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--seed-tiles", "first", "--steps", "16"]),
    # 0.9.54: the cifar10 of 0.9.54 (0.9.53's trained on for 68 more minutes the same way, resumed
    # from its run; 0.9.53's is cifar10-27 in the zoo now)
    "cifar10-x29": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--seed-tiles", "first", "--steps", "16"]),
    # 0.9.56: the cifar10 of 0.9.56 (0.9.54's trained on for 68 more minutes the same way, resumed
    # from its run; 0.9.54's is cifar10-28 in the zoo now)
    "cifar10-x30": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--seed-tiles", "first", "--steps", "16"]),
    # 0.9.58: the cifar10 of 0.9.58 (0.9.56's trained on for 68 more minutes the same way, resumed
    # from its run; 0.9.56's is cifar10-29 in the zoo now)
    "cifar10-x31": ("cifar10", [(32, 32)] * 6, ["--no-fallback", "--seed-tiles", "first", "--steps", "16"]),
    # 0.9.59: the photo model of 0.9.59, preset small (0.9.58's cifar10 fine-tuned on natural/ crops;
    # 0.9.9 - 0.9.58's photo is photo-5 in the zoo now)
    "photo-x6": ("photo", [(192, 128)], ["--no-fallback", "--seed-tiles", "first", "--steps", "16"]),
    # 0.9.62: the photo model of 0.9.62 (0.9.59's trained on for 120 more minutes the same way;
    # 0.9.59 - 0.9.61's photo is photo-6 in the zoo now)
    "photo-x7": ("photo", [(192, 128)], ["--no-fallback", "--seed-tiles", "first", "--steps", "16"]),
    # 0.9.64: the photo model of 0.9.64 (0.9.62's trained on for 36 more minutes with grain on half the
    # crops; 0.9.62 - 0.9.63's photo is photo-7 in the zoo now, 0.9.59 - 0.9.61's photo-6 retired)
    "photo-x8": ("photo", [(192, 128)], ["--no-fallback", "--seed-tiles", "first", "--steps", "16"]),
    # 0.10.1: the photo model of 0.10.1 (0.9.64's trained on for about 222 more minutes with grain;
    # 0.9.64 - 0.10.0's photo is photo-8 in the zoo now, 0.9.62 - 0.9.63's photo-7 retired)
    "photo-x9": ("photo", [(192, 128)], ["--no-fallback", "--seed-tiles", "first", "--steps", "16"]),
}


def synthetic(width: int, height: int, k: int) -> np.ndarray:
    yy, xx = np.mgrid[0:height, 0:width].astype(np.int64)
    out = np.empty((height, width, 3), np.uint8)
    for c in range(3):
        field = (xx * (3 + c + k) + yy * (5 - c) + 40 * c + 17 * k) % 256
        h = (xx * 73856093 ^ yy * 19349663 ^ (c + 7 * k) * 83492791) & 0xFFFF
        noise = (h % 13) - 6
        smooth = (field // 2 + 64 + (((xx // 8 + yy // 8 + c) % 3) * 20))
        out[..., c] = np.clip(smooth + noise, 0, 255).astype(np.uint8)
    return out


def synthetic_chroma(width: int, height: int, k: int) -> np.ndarray:
    """synthetic's green, with red and blue = green + slowly varying offsets (like photographs)."""
    out = synthetic(width, height, k)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.int64)
    g = out[..., 1].astype(np.int64)
    out[..., 0] = np.clip(g + xx // 7 - yy // 9 + 10, 0, 255)
    out[..., 2] = np.clip(g - (xx + yy) // 11 - 5, 0, 255)
    return out


def synthetic_chroma4(width: int, height: int, k: int) -> np.ndarray:
    """synthetic's green; red = green + slow offsets + its own integer-hash noise; blue =
    (green + red) // 2 + a slow offset (red's noise shared, as in photographs' chroma)."""
    out = synthetic(width, height, k)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.int64)
    g = out[..., 1].astype(np.int64)
    noise = ((xx * 2654435761 ^ yy * 40503 ^ k * 97) >> 3) % 7 - 3
    r = np.clip(g + xx // 7 - yy // 9 + 10 + noise, 0, 255)
    out[..., 0] = r
    out[..., 2] = np.clip((g + r) // 2 + (xx - yy) // 13 - 4, 0, 255)
    return out


def synthetic_graphic(width: int, height: int, k: int) -> np.ndarray:
    """Flat colours, stripes and lines (a chart or a screenshot): seed codec version 5's LZMA mode."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.int64)
    out = np.empty((height, width, 3), np.uint8)
    box = (xx // 16 + yy // 12 + k) % 4
    out[..., 0] = np.where(box == 0, 230, np.where(box == 1, 40, 250))
    out[..., 1] = np.where((xx + 2 * yy) % 23 == 0, 0, np.where(box == 2, 120, 245))
    out[..., 2] = np.where(yy % 9 == 4, 30, np.where(box == 3, 200, 248))
    return out


def synthetic_deep(width: int, height: int, k: int) -> np.ndarray:
    """uint16 [H, W, C] for case "deep"'s k-th PNG: RGB (k = 0), grey + alpha (1), grey (2): smooth
    ramps plus Gaussian noise of 60 16-bit units (a seeded generator)."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.int64)
    noise = np.round(np.random.default_rng(k).normal(0, 60, (height, width))).astype(np.int64)
    base = 9000 + 400 * xx + 250 * yy + noise
    if k == 0:
        return np.clip(np.stack([base, base + 3000 + 40 * xx, base // 2 + 60 * yy], -1), 0, 65535).astype(np.uint16)
    if k == 1:  # 12-bit samples in the top 12 bits, the alpha too (0xFFF0 opaque)
        return np.stack([(base >> 4) << 4, np.where(xx < width // 2, 0xFFF0, 40000 + yy * 16)], -1).astype(np.uint16)
    return ((base % 40000) // 40 * 65535 // 1023)[..., None].astype(np.uint16)  # 10-bit, scaled


def png_metadata(k: int) -> dict:
    """Pillow save() arguments for case "meta"'s k-th PNG."""
    import struct

    from PIL import ImageCms, PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("Title", f"golden {k}")
    if k:
        return {"pnginfo": info}
    info.add_itxt("Description", "Größe, 色", "de", "Beschreibung")
    info.add_itxt("XML:com.adobe.xmp", '<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF/></x:xmpmeta>')
    info.add(b"gAMA", struct.pack(">I", 45455))
    info.add(b"cHRM", struct.pack(">8I", 31270, 32900, 64000, 33000, 30000, 60000, 15000, 6000))
    exif = Image.Exif()
    exif[0x0112], exif[0x010F] = 6, "golden camera"
    return {"pnginfo": info, "exif": exif.tobytes(), "dpi": (300, 300),
            "icc_profile": ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()}


def make(name: str) -> None:
    model, sizes, extra, *kind = CASES[name]
    kinds = {"chroma": synthetic_chroma, "chroma4": synthetic_chroma4, "graphic": synthetic_graphic, "meta": synthetic_chroma4}
    make_image = kinds.get(kind[0] if kind else None, synthetic)
    pngs = []
    for k, (w, h) in enumerate(sizes):
        p = HERE / f"{name}-{k}.png"
        if kind == ["deep"]:  # 16-bit PNGs, which Pillow cannot write in colour
            from scoreflow_codec import images
            p.write_bytes(images.encode_source(images.from_array(synthetic_deep(w, h, k)), ".png"))
        else:
            Image.fromarray(make_image(w, h, k)).save(p, **(png_metadata(k) if kind == ["meta"] else {}))
        pngs.append(str(p))
    sfc = HERE / f"{name}.sfc"
    subprocess.run(["sfcodec", "compress", *pngs, "-o", str(sfc), "--model", model, "--force", *extra],
                   check=True)


if __name__ == "__main__":
    for n in sys.argv[1:] or list(CASES):
        make(n)
