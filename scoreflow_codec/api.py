"""What the shells call: compress, decompress, info, evaluate.

    model = zoo.load_model("cifar10")
    data, report = api.compress([images.load_image("a.png")], model)
    sources = api.decompress(data, model)        # pixel CRC checked; raises on any mismatch

compress's defaults are `sfcodec compress`'s: chain mode (the discrete diffusion chain) and
fallback "auto", so the call above writes the bytes that `sfcodec compress a.png -o a.sfc --model
cifar10` writes (the CLI also records each file's name, src.meta["name"] = "a.png"; set it for the
very same bytes). mode="ode" is the probability-flow ODE path (slower, and larger files with the
shipped models); fallback="off" codes the model's stream whatever the seed codec alone would make.
Each source's `metadata` (ICC profile, EXIF, XMP ...: metadata.py; load_image reads it) goes into
the file, and decompress gives it back; an empty dict for the pixels only (`--no-metadata`).
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import time
import zlib
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from . import __version__, container, deep, images as imgs, metadata
from .coding import stream, workers
from .coding.ans import Message
from .coding.modes import ARITHMETICS, MODES, STEPS_RANGE, steps_per_batch
from .coding import seed_codec
from .coding.seed_codec import shared_analyses
from .errors import (BadFileError, DecodeMismatchError, ModelMismatchError, SfcError, UnsupportedVersionError,
                     UsageError, one_line)
from .estimate import Estimate, sequential_mean

log = logging.getLogger(__name__)

DEFAULT_MICRO_BATCH = 8
DEFAULT_ARITH = "exact64"
MAX_IMAGES = 100_000
MAX_TOTAL_PIXELS = 1_000_000_000  # all images of one file together (10 x images.MAX_PIXELS)
# Bounds on what a header may ask the decoder to do, checked before anything is allocated or
# run: a corrupt or hostile header must not make the decoder allocate gigabytes or loop for hours.
MAX_STEPS = STEPS_RANGE[1]  # = the CLI's --steps limit
MAX_MICRO_BATCH = 1024
MAX_THREADS = 1024
MAX_PAD_WORDS = 1 << 22   # 16 MiB of padding; the defaults use ~56k words
MAX_BATCH_PIXELS = 1 << 22  # max_batch * tile^2 (the default is 32 * 32^2 = 32768)
MAX_TILES = 1 << 22       # tiles of one file (10^9 pixels in 32x32 tiles is ~1M)

# Settings of format version 1 that a header leaves out when they hold these values. Frozen:
# changing a default in the code must not change what an old file means.
FORMAT_DEFAULTS = {
    "ode": {"steps": 128, "lattice_bits": 8, "sigma_ratio": 4.0, "fp_iters": 2, "fp_max": 30,
            "fp_tol": 0.01, "fp_stall": 0.7, "schedule": "logsnr", "trace_probe": "rademacher"},
    "chain": {"steps": 64, "lattice_bits": 8, "lattice_ratio": 4.0, "schedule": "logsnr", "reverse_var": "calibrated",
              "kappa_top": 0},
    "stream": {"tile": 32, "n_seed": None, "batching": "growth", "growth": 0.25, "max_batch": 32, "fill_std": 1.5, "pad_words": None,
               "seed": 1, "seed_tiles": "first", "seed_context": "tile"},
}


def _non_default(values: dict, defaults: dict) -> dict:
    return {k: v for k, v in values.items() if k not in defaults or defaults[k] != v}


def full_settings(header: dict) -> tuple[dict, dict]:
    """(mode settings, stream settings) of a header, its omitted values filled in."""
    return ({**FORMAT_DEFAULTS[header["mode"]], **header["settings"]},
            {**FORMAT_DEFAULTS["stream"], **header["stream"]})


SEED_TILE_CHOICES = ("chosen", "first")  # `sfcodec compress --seed-tiles`


def default_stream_settings(model, tile: int | None = None, seed_tiles: str = "chosen") -> stream.StreamSettings:
    """The stream settings compress uses with a model: its tile size (LoadedModel.tile) unless given.

    seed_tiles: "chosen" (the default), the encoder makes a seed tile of every tile that the seed codec
    is expected to code in fewer bits than the model, coded in its image's context (on photographs with
    the shipped `photo` model: every tile); "first", only as many seed tiles as the chain needs to have
    bits to pop, the first in tile order, each coded alone, and every other tile the model's: the
    model's own coding of the images (how every stream was coded up to 0.9.13)."""
    if seed_tiles not in SEED_TILE_CHOICES:
        raise SfcError(f"unknown seed tiles {seed_tiles!r}; expected chosen or first")
    chosen = seed_tiles == "chosen"
    return stream.StreamSettings(tile=int(tile or getattr(model, "tile", 32)), seed_tiles=seed_tiles,
                                 seed_context="image" if chosen else "tile")


def tiles_like(n32: int, tile: int) -> int:
    """How many tiles of `tile` px hold as many pixels as n32 tiles of 32x32 (at least one)."""
    return max(1, n32 * 32 * 32 // (tile * tile))


def default_micro_batch(tile: int) -> int:
    """Tiles per network call: as many pixels as 8 tiles of 32x32. Calls are zero-padded to this
    size, and the first batches of a stream hold few tiles: a fixed 8 wasted most of each call at
    64px tiles (a 256x384 crop took 103 s instead of 58 s at 32px)."""
    return tiles_like(DEFAULT_MICRO_BATCH, tile)


# torch, the networks and the model codecs are imported where a model runs, not at the top:
# reading a header (sfcodec info) and decoding a seed-only file (every Kodak file today) need none
# of them, and importing torch takes seconds.


def default_settings(mode: str, model=None) -> dict:
    """The mode's settings compress uses unless told otherwise; with a model, its own default chain
    steps (LoadedModel.chain_steps, from its zoo entry) where it has them."""
    from .coding.chain_codec import ChainSettings
    from .coding.ode_codec import ODESettings

    if mode == "ode":
        return ODESettings().to_dict()
    if mode == "chain":
        steps = getattr(model, "chain_steps", None)
        return ChainSettings(**({"steps": int(steps)} if steps else {})).to_dict()
    raise SfcError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")


def coding_settings(mode: str, model=None, settings: dict | None = None) -> dict:
    """The settings compress codes with: the mode's defaults with this model, then the caller's."""
    return {**default_settings(mode, model), **(settings or {})}


@dataclass
class CompressReport:
    num_images: int
    num_dims: int
    file_bytes: int
    header_bytes: int
    payload_bits: int
    predicted_bits: float
    seconds: float
    stream: stream.StreamReport
    settings: dict = field(default_factory=dict)  # the mode's (fallback "seed": the caller's; its file holds none)
    model_bytes: int | None = None  # the file the model's stream makes (None: not coded)
    seed_bytes: int | None = None   # the file the seed codec alone makes (compress(fallback=...))
    model_estimate: Estimate | None = None  # fallback "auto": the model's bound that decided
    # why the model's stream was not coded: "estimate" (fallback "auto": the bound above the seed
    # file), "saving" (fallback "auto", seed tiles in the image's context: the tiles the model is
    # expected to code more cheaply save too little), "sample" (the same, extrapolated from a sample of
    # tiles of a large photograph, sample_saving, even at SAMPLE_Z standard errors above), "screen" (the
    # same from a quicker look at fewer tiles, screen_saving: photographs, streams), "small" (the same
    # without a look: the seed codec's bits on the colour tiles are fewer than the saving needed,
    # SAVING_MIN_BITS and SAVING_MIN_FRACTION of them, so the model could not save that many even at
    # 0 bits a tile), "no colour planes" (only palette index planes,
    # which the seed codec codes either way), "grey" (fallback "auto", every image grey: compress),
    # "seed only" (fallback "seed": not asked for)
    model_skipped: str | None = None
    model_saving: "Saving | None" = None  # fallback "auto", seed tiles in the image's context: what decided
    metadata_bytes: int = 0  # the images' metadata section with its length and CRC (file_bytes counts it)
    low_bytes: int = 0  # 16-bit images: their low-bit section with its length and CRC (file_bytes counts it)

    @property
    def model_estimate_bpd(self) -> float | None:
        return None if self.model_estimate is None else self.model_estimate.mean

    @property
    def coded_by(self) -> str:
        """"seed" where every tile went through the seed codec alone, else "model"."""
        return "seed" if self.stream.n_seed == self.stream.n_tiles else "model"

    @property
    def bpd(self) -> float:
        return 8.0 * self.file_bytes / self.num_dims


def _eps_mse(model) -> dict | None:
    """The model file's denoising-error table (calibration.py), if it has one."""
    return (getattr(model, "config", None) or {}).get("info", {}).get("eps_mse")


def _device_class(device: str) -> str:
    import torch

    return torch.device(device).type


def _build_codec(model, mode: str, settings: dict, micro_batch: int, device: str, arith: str):
    """The model's tile codec (coding.pipeline, imported here with torch and the networks)."""
    from .coding.pipeline import build_tile_codec

    return build_tile_codec(model.model, model.dequantizer, model.sde, mode, settings, micro_batch, device,
                            _eps_mse(model), arith)


_MALLOC_KEEP = 256 << 20


@functools.cache
def _keep_freed_memory() -> None:
    """Ask glibc's malloc to keep freed blocks for reuse (once per process; elsewhere a no-op).

    By default glibc serves every allocation above a threshold (128 KiB at first, adapting up to
    32 MiB) with its own mmap and gives the heap's freed top back to the system, so that the next
    activation tensor of the same size is page-faulted in and zeroed again: about 12,800 page
    faults per exact forward of `photo` on 2 tiles of 64px, 1,200 with this. It does not change
    a single bit of the results; the process keeps up to _MALLOC_KEEP of freed memory."""
    import ctypes
    import ctypes.util
    import platform

    if platform.system() != "Linux":
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    mallopt(M_MMAP_THRESHOLD, 32 << 20)  # the most glibc's own adaptive threshold reaches on 64-bit systems
    mallopt(M_TRIM_THRESHOLD, _MALLOC_KEEP)


@contextlib.contextmanager
def _model_run(threads: int | None):
    """Where a model codes: torch's deterministic algorithms and, where given, this many threads (the
    file's, for float32 files); the caller's thread count comes back after."""
    import torch

    from .coding.evaluator import deterministic_torch

    _keep_freed_memory()
    prev = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        with deterministic_torch():
            yield
    finally:
        torch.set_num_threads(prev)


def _images_crc(sources: list[imgs.SourceImage]) -> int:
    crc = 0
    for s in sources:
        crc = zlib.crc32(imgs.image_crc(s).to_bytes(4, "little"), crc)
    return crc & 0xFFFFFFFF


def _describe_images(sources: list[imgs.SourceImage]) -> list:
    """Run-length list of [width, height, mode, count] plus per-image metadata where present."""
    runs: list[list] = []
    for s in sources:
        w, h = s.size
        key = [w, h, s.mode]
        if runs and runs[-1][:3] == key:
            runs[-1][3] += 1
        else:
            runs.append(key + [1])
    return runs


PALETTE_SAMPLE = 512  # choose_palette_coding compares the two ways on at most this square


def choose_palette_coding(sources: list[imgs.SourceImage], seed_version: int) -> list[imgs.SourceImage]:
    """Each palette image whose colours could be coded (imgs: "colors") as its index plane instead
    where that codes in fewer bits: the seed codec's ideal codelengths both ways (of a larger image,
    its centre PALETTE_SAMPLE square's, scaled by area: a few seconds at most) plus each way's
    header metadata (the colours' way lists the palette entries used), deflated. Every image is
    marked as chosen, so a second call costs nothing. The colours are what the model can code,
    but a palette's few colours make poor planes for it and for the seed codec (a 16-colour
    128x128 Kodak crop: 5.14 bits/pixel as colours, 1.13 as indices, PNG 1.53), while a palette in
    arbitrary order makes poor indices. Decoding needs nothing new: the header says which way each
    image went."""
    from .coding.seed_codec import seed_bits

    def bits(planes: np.ndarray | None) -> float:  # from the centre PALETTE_SAMPLE square at most, scaled
        if planes is None:
            return 0.0
        h, w = planes.shape[1:]
        y, x = max(0, (h - PALETTE_SAMPLE) // 2), max(0, (w - PALETTE_SAMPLE) // 2)
        crop = planes[:, y:y + PALETTE_SAMPLE, x:x + PALETTE_SAMPLE]
        return seed_bits(crop, seed_version) * (h * w) / (crop.shape[1] * crop.shape[2])

    def meta_bits(src: imgs.SourceImage) -> float:  # the header's share (the colours' list of used entries)
        return 8.0 * len(zlib.compress(json.dumps(src.meta, sort_keys=True).encode(), 9))

    out = []
    for s in sources:
        if not s.coding_chosen:
            alt = imgs.palette_as_indices(s)
            if alt is not None and bits(alt.extra) + meta_bits(alt) < bits(s.color) + bits(s.extra) + meta_bits(s):
                s = alt
            s = replace(s, coding_chosen=True)
        out.append(s)
    return out


def _shapes(sources: list[imgs.SourceImage]):
    return [(s.color.shape if s.color is not None else (0, 0, 0), s.extra.shape if s.extra is not None else None)
            for s in sources]


@shared_analyses()  # the seed codec analyses each image once: fallback file, tile shares, seed tiles
def compress(sources: list[imgs.SourceImage], model, mode: str = "chain", settings: dict | None = None,
             stream_settings: stream.StreamSettings | None = None, device: str = "cpu",
             micro_batch: int | None = None, progress: Callable[[int], None] | None = None,
             track: bool = False, fallback: bool | str = "auto", arith: str = DEFAULT_ARITH,
             phase: Callable[[str], None] | None = None, jobs: int | None = None,
             effort: int | None = None) -> tuple[bytes, CompressReport]:
    """Code images with a loaded model into .sfc bytes.

    The defaults are `sfcodec compress`'s (cli/main.py: --mode chain, --fallback auto, --arith
    exact64, the model's tile and chain steps): with no options, the same bytes as the CLI writes
    for the same images (with the same src.meta, which the CLI gives each file's name) and model.
    mode: "chain" (the default), the discrete diffusion chain; "ode", the probability-flow ODE
    (with the shipped models slower and larger). settings: the mode's (coding_settings).

    progress(n): n more tile-steps of the model's stream done (compress_work_units in all);
    phase(what): called as each stage starts: "seed codec" (the fallback's file), "model estimate"
    (the bound that decides fallback "auto" or chooses the seed tiles; a minute on a Kodak image,
    with no ticks), "model stream".

    jobs: processes for the seed codec's file where it comes in parts (a photograph of more than
    1024x1024 pixels, several images of more than 512x512 in all: stream.in_parts), and 1 or not for
    its encoder's analysis of an image of 2**16 pixels or more, whose first least-squares option it
    otherwise makes in a second process (seed_codec.jobs); None, the default: every usable core, within
    the available memory (coding.workers), where processes fork (Linux) or the program said its main
    module is guarded (workers.allow_spawn: sfcodec does), else one process. The same bytes whatever
    it is.

    effort: how many of its modes the classical seed codec's encoder tries (seed_codec.EFFORTS): 3 (the
    default, and None) every one; 2 no least-squares predictor (on the 24 Kodak images +0.79% bits, the
    seed codec's encode 2.0x and decode 1.7x faster); 1 nor the mixed mode of the channels after the first
    (+2.76%, 2.5x and 2.8x faster; seed_codec's docstring). Every effort's files decode with the same
    decoder (the modes are in the stream). With fallback "auto" the model's stream is weighed against
    the file of this effort.

    arith: "exact64" (the default), every number that parametrizes a coder computed in exactmath's
    arithmetic, so that any machine decodes the file; "float32", the float32 networks (about 3x
    faster), whose files decode only where the kernels are the same (the machine type that made them).

    fallback: "auto" (the default; below); "off" (or False), the model's stream; "seed", the
    classical seed codec alone (the file "both" and "auto" compare against, with no model run at
    all and no torch imported: model may be None; `sfcodec compress` of a Kodak image, its check
    decode included, in about 24 s against 27 s for "auto" on a 2-core Intel Xeon, 0.9.27); "both", also the
    classical seed codec alone, whole images as single tiles (stream.seed_only_settings), returning the smaller file, with both
    sizes in the report (model_bytes, seed_bytes); "auto" (or True), the seed codec's file first,
    then the model's stream only where it promises a smaller file: with seed tiles in the image's
    context (compress's default), where the tiles that the model is expected to code more cheaply
    than the seed codec's share of them save more than the stream adds and SAVING_MIN_FRACTION of the
    seed codec's bits, a saving worth the stream's minutes (expected_saving, from
    tile_model_bits: the float32 network, about a minute on a Kodak image, where the stream takes
    minutes; on RGB images of more than SAMPLE_ABOVE_PIXELS in all, only where a sample of the tiles
    promises such a saving, sample_saving); with seed tiles each alone, where the model's bound over the images (FALLBACK_N_T time
    samples, seconds) is not FALLBACK_MARGIN_BPD above that file's bits/dim (colour images without
    other planes; others are coded both ways). "auto" and "both" never
    code the model's stream of images without colour planes (palettes coded as index planes): it would
    code the same planes with the same seed codec."""
    _check_jobs(jobs)
    with seed_codec.jobs(jobs), seed_codec.effort(_checked_effort(effort)):
        return _compress(sources, model, mode, settings, stream_settings, device, micro_batch, progress, track,
                         fallback, arith, phase, jobs)


def _compress(sources, model, mode, settings, stream_settings, device, micro_batch, progress, track, fallback,
              arith, phase, jobs) -> tuple[bytes, CompressReport]:
    """compress, within its seed_codec.jobs scope."""
    fallback = {False: "off", True: "auto"}.get(fallback, fallback)
    if fallback not in ("off", "auto", "both", "seed"):
        raise SfcError(f"unknown fallback {fallback!r}; expected off, auto, both or seed")
    seed_alone = fallback == "seed"  # no model runs: no torch, no network, the model unused (may be None)
    if not sources:
        raise SfcError("nothing to compress")
    t0 = time.perf_counter()
    # the seed codec's file holds no mode settings (_pack): the caller's are only checked
    settings = dict(settings or {}) if seed_alone else coding_settings(mode, model, settings)
    ss = stream_settings or default_stream_settings(model)
    sources = choose_palette_coding(sources, ss.seed)
    micro_batch = micro_batch or default_micro_batch(ss.tile)
    # refuse up front what the decoder would refuse (api._validate_coding), not after the work
    try:
        _check_values(mode, settings, _SETTING_RULES[mode], False)
        _check_values("stream", ss.to_dict(), _SETTING_RULES["stream"], False)
        _check_values("setup", {"micro_batch": micro_batch}, _SETTING_RULES["setup"], False)
        stream.check_seed_tiles(ss)
    except BadFileError as e:
        raise SfcError(str(e).replace("corrupt header: ", "")) from None
    except ValueError as e:
        raise SfcError(str(e)) from None
    if sum(s.size[0] * s.size[1] for s in sources) > MAX_TOTAL_PIXELS:
        raise SfcError(f"too many pixels for one file (limit {MAX_TOTAL_PIXELS}); split the images over several files")
    _check_arith(arith, None if seed_alone else device)
    low = low_section(sources)  # 16-bit images' low bits: their own section, whatever codes the rest
    images = [stream.StreamImage(s.color, s.extra) for s in sources]
    if seed_alone:  # a seed-only file's header names no model and no setup (_pack)
        codec, head = stream.NO_MODEL, {"codec": __version__, "mode": mode}
    else:
        import torch

        try:
            codec = _build_codec(model, mode, settings, micro_batch, device, arith)
        except TypeError as e:
            raise SfcError(f"{e}; use arith='float32'") from None
        head = {
            "codec": __version__,
            "model": {"name": model.name, "sha256": model.sha256},
            "mode": mode,
            "setup": {"device": _device_class(device), "dtype": arith, "micro_batch": micro_batch,
                      "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "constriction": _constriction_version()},
        }
    head.update(images=_describe_images(sources), crc32=_images_crc(sources))
    kept, section = metadata.pack([s.metadata for s in sources])  # ICC, EXIF ...: a section beside the payload
    meta = {str(i): {**{n: v for n, v in s.meta.items() if n != "kept"}, **({"kept": k} if k else {})}
            for i, (s, k) in enumerate(zip(sources, kept))}  # "kept" is the section's: never a caller's
    meta = {i: m for i, m in meta.items() if m}
    if meta:
        head["meta"] = meta
    dims = sum(s.num_dims for s in sources)
    best = None  # (data, payload, stream report) of the smaller file so far
    seed_bytes = estimate = threshold = saving = None
    in_context = ss.seed_context == "image"
    phase = phase or (lambda what: None)
    if fallback != "off":
        phase("seed codec")
        alt_ss = stream.seed_only_settings([im.color_shape for im in images])
        alt_payload, alt_fields, alt_rep = stream.encode(images, codec, alt_ss, jobs=jobs)
        best = (_pack(head, settings, alt_ss, alt_payload, alt_fields, section, low), alt_payload, alt_rep)
        seed_bytes = len(best[0])
        if fallback == "auto" and not in_context:
            threshold = 8 * seed_bytes / dims + FALLBACK_MARGIN_BPD
            phase("model estimate")
            estimate = estimate_model_bpd(sources, model, ss.tile, device, threshold)
    model_bytes = None
    # with no colour planes (palette index planes, alpha) the model's stream codes the same planes
    # with the same seed codec, in a larger header: only the seed codec's file is worth writing
    skipped = None
    tile_bits = seed_tile_bits = None
    if fallback == "seed":
        skipped = "seed only"
    elif fallback != "off" and all(s.color is None for s in sources):
        skipped = "no colour planes"
    elif fallback == "auto" and not any(map(_is_rgb, sources)):
        # grey images: the model codes an RGB tile whose colour is latent (popped, given back), and no
        # estimate covers that (tile_model_bits: NaN), so before 0.9.32 "auto" coded both, and the model's
        # stream always lost (the 2-core Intel Xeon, --fallback both: kodim05 in grey, 768x512, 6.137
        # against the seed codec's 4.515 bits/dim, 321 s instead of about 20; the 256x256 centres of
        # kodim01, 14, 23 in grey +13%, +11%, +4%; the first 16 CIFAR-10 test images in grey as one stream
        # with `cifar10`, 6.448 against 5.368): "auto" writes the seed codec's file. In a set that mixes
        # grey and colour images the grey ones' tiles are seed tiles (below).
        skipped = "grey"
    elif estimate is not None and estimate.mean > threshold:
        skipped = "estimate"
    elif ss.seed_tiles == "chosen":
        announced = False  # "model estimate" is said as the model's first estimate starts ("small": never)

        def estimating() -> None:
            nonlocal announced
            if not announced:
                phase("model estimate")
                announced = True

        if in_context and fallback == "auto":  # quick looks first, where they apply: the screen, a sample
            for applies, look, why in ((_screen_first(sources, ss.tile), screen_saving, "screen"),
                                       (_sample_first(sources), sample_saving, "sample")):
                if applies and skipped is None:
                    estimating()
                    saving = look(sources, model, ss, device, codec.excess_bits_per_dim(), codec.chain_coeffs())
                    if saving.upper < saving.needed:
                        skipped = why
        if skipped is None:
            refs = _tile_refs(sources, ss.tile)
            seed_tile_bits = stream.tile_seed_bits(images, refs, ss)
            rgb = _rgb_of(sources, refs)
            if in_context and fallback == "auto":
                # at most the seed codec's bits on the colour tiles are saved: an icon's do not pay for
                # the model's stream, and its estimate (a whole tile's network calls) is not run
                most = float(np.sum(seed_tile_bits[rgb]))
                needed = _saving_needed(len(refs), 0, _seed_total(seed_tile_bits))
                if most < needed:
                    saving, skipped = Saving(most, 0, needed, upper=most), "small"
        if skipped is None:
            estimating()
            tile_bits = tile_model_bits(sources, model, ss.tile, device, codec.excess_bits_per_dim(), seed_tile_bits,
                                        chain=codec.chain_coeffs())
            if fallback != "off":
                # a grey image's tiles go to the seed codec, as a grey image alone does ("grey" above): no
                # estimate covers them (NaN), and before 0.9.33 the model coded them and its stream lost
                # (fallback "off", the model's stream only, still gives them to the model: what measured that)
                tile_bits[~rgb] = np.inf
            if in_context and fallback == "auto":
                saving = expected_saving(seed_tile_bits, tile_bits)
                if saving.bits < saving.needed:
                    skipped = "saving"
    if skipped is None:
        phase("model stream")
        try:
            with _model_run(None):
                payload, fields, rep = stream.encode(images, codec, ss, progress, track, tile_bits, seed_tile_bits)
        except ValueError as e:
            # a coder refused a value: the solver left the range it can code (steps far too few)
            hint = "try more --steps" + (" or --mode chain" if mode == "ode" else "")
            raise SfcError(f"encoding failed ({e}); {hint}") from None
        data = _pack(head, settings, ss, payload, fields, section, low)
        model_bytes = len(data)
        if best is None or model_bytes <= len(best[0]):
            best = (data, payload, rep)
    elif progress:  # the model's stream was skipped: its work is done
        progress(compress_work_units(sources, model, mode, settings, ss, fallback))
    data, payload, rep = best
    section_bytes = len(section) + 8 if section else 0
    # a version 6 file frames its metadata section even when empty: those 8 bytes are the low bits' cost
    low_bytes = 4 * len(low) + 8 + (0 if section else 8) if low is not None else 0
    report = CompressReport(len(sources), dims, len(data), len(data) - 4 * len(payload) - section_bytes - low_bytes,
                            32 * len(payload), rep.predicted_bits, time.perf_counter() - t0, rep, settings, model_bytes,
                            seed_bytes, estimate, skipped, saving, section_bytes, low_bytes)
    return data, report


# fallback "auto" with seed tiles in the image's context: the model's stream is coded only if the
# tiles that the model is expected to code more cheaply than the seed codec save this many bits
# beyond the flags that name them (about what the model's stream adds to the header: the model,
# the setup, its settings), plus SAVING_MIN_FRACTION of the seed codec's bits on the stream's tiles
SAVING_MIN_BITS = 1024.0
# 0.9.60: a saving must also be worth its time. The model's stream takes minutes to code and to decode
# where the seed codec's file takes seconds, and since 0.9.59's small photo model its bound lies near
# the seed codec's share on many photograph tiles: on the 2-core Intel Xeon (bench/screen_spread.py,
# one thread), the full estimate of a Kodak image took 150 - 280 s and found kodim14, 15 and 22 to
# save 5,812, 4,142 and 3,626 bits (0.1 - 0.2% of their files), kodim13, 04 and 05 99 - 933 bits,
# where the seed codec's file takes about 39 s and decodes in 11 (all 24 Kodak, 0.9.60's defaults).
# The stream is coded only where it saves at least this share of the seed codec's bits too (1% of a
# Kodak file: about 30,000 bits); `--fallback both` still codes both and keeps the smaller file,
# whatever the saving. On misc it is kept on 4.1.06 (-0.70%) and 4.1.08 (-1.78%), 400 - 600 s each
# (0.9.61, whose estimate is the chain's own bound: 4.1.06 -0.80%, still kept, its estimate 0.013
# bits/dim low there; 4.1.08 the same)
SAVING_MIN_FRACTION = 0.01


# fallback "auto" on more than SAMPLE_ABOVE_PIXELS (a large photograph): before the estimate of every
# tile, and the seed codec's analysis of the whole image in context that it compares with (0.6 - 0.8 KB
# a pixel), the same estimate of SAMPLE_TILES tiles drawn at random (a fixed seed: the same choice every
# run) against their shares of the seed codec's file (sample_saving). The model's stream is not coded
# where the saving extrapolated from them, plus SAMPLE_Z standard errors, is below what its stream adds.
SAMPLE_ABOVE_PIXELS, SAMPLE_TILES, SAMPLE_Z = 1 << 20, 64, 2.0

# fallback "auto" on RGB images of at least SCREEN_TILES tiles in all (photographs, CIFAR-10 streams):
# before any other estimate, a screen (screen_saving): SCREEN_TILES tiles drawn at random, each from
# SCREEN_N_T time samples (bfloat16 where fast), each tile's gain what the full estimate is expected to
# find given that look (SCREEN_SD_BPD: the look's standard deviation about it). The model's stream is
# not coded where that saving, plus SCREEN_Z standard errors, is below what its stream adds.
SCREEN_TILES, SCREEN_N_T, SCREEN_SD_BPD, SCREEN_Z = 16, 16, 0.08, 2.0
# the screen's first stage (0.10.2, screen_first_stage): of the screen's tiles, the SCREEN_FIRST on which
# the seed codec spends the most bits (where the model, if anywhere, wins: on every photograph where the
# screen passes, bench/screen_first.py), each from the same look. Their bits/dim of seed codec - model
# have a mean and a spread (at least SCREEN_FIRST_SPREAD_BPD); every tile is taken to save what a tile
# like them would, E max(0, D), D normal about that mean raised by SCREEN_FIRST_Z standard errors, with
# that spread and SCREEN_SD_BPD together. Where even that is below what the stream adds, the screen stops
# there (compress writes the seed codec's file); else its tiles decide as before 0.10.2 (the same look
# of the same draws).
SCREEN_FIRST, SCREEN_FIRST_SPREAD_BPD, SCREEN_FIRST_Z = 4, 0.1, 1.5


@dataclass(frozen=True)
class Saving:
    """What the model's tiles are expected to save against the seed codec in the image's context."""
    bits: float     # sum over the tiles of max(0, seed codec - model), the model's estimate
    tiles: int      # tiles where the model is expected to be cheaper
    needed: float   # SAVING_MIN_BITS plus the flags that would name the seed tiles
    sampled: int = 0  # tiles estimated, where a sample (sample_saving; bits and tiles extrapolated); 0: all
    upper: float | None = None  # a sample's bits plus SAMPLE_Z standard errors


def _saving_needed(n: int, k: int, seed_bits: float) -> float:
    """SAVING_MIN_BITS, SAVING_MIN_FRACTION of the seed codec's bits on the n tiles (seed_bits) and the
    flags that name k seed tiles of n."""
    flags = (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)) / math.log(2)
    return SAVING_MIN_BITS + SAVING_MIN_FRACTION * seed_bits + flags


def _is_rgb(src: imgs.SourceImage) -> bool:
    """Whether an image has three colour planes (what the model's estimates cover)."""
    return src.color is not None and src.color.shape[0] == 3


def _tile_refs(sources: list[imgs.SourceImage], tile: int) -> list:
    """The stream's tiles (stream.T.plan_tiles order; an image without colour planes has none)."""
    return stream.T.plan_tiles([s.color.shape if s.color is not None else (0, 0, 0) for s in sources], tile)


def rgb_tiles(sources: list[imgs.SourceImage], tile: int) -> np.ndarray:
    """Per tile of the stream: whether its image is RGB (bool [n]); the others are grey images' tiles,
    which no estimate covers (tile_model_bits: NaN) and which compress gives the seed codec."""
    return _rgb_of(sources, _tile_refs(sources, tile))


def _rgb_of(sources: list[imgs.SourceImage], refs: list) -> np.ndarray:
    """rgb_tiles of tiles already planned (refs)."""
    return np.array([_is_rgb(sources[r.image]) for r in refs], dtype=bool)


def _screen_first(sources: list[imgs.SourceImage], tile: int) -> bool:
    """Whether compress's fallback "auto" screens first (screen_saving): at least SCREEN_TILES tiles of
    colour images (RGB; since 0.9.33 also where grey images are beside them)."""
    return int(rgb_tiles(sources, tile).sum()) >= SCREEN_TILES


def _sample_first(sources: list[imgs.SourceImage]) -> bool:
    """Whether compress's fallback "auto" looks at a sample of tiles first (sample_saving): colour
    images (RGB) of more than SAMPLE_ABOVE_PIXELS in all (grey images beside them not counted)."""
    return sum(s.color.shape[1] * s.color.shape[2] for s in sources if _is_rgb(s)) > SAMPLE_ABOVE_PIXELS


def _seed_total(seed_tile_bits: np.ndarray) -> float:
    """The seed codec's bits over the stream's tiles (what SAVING_MIN_FRACTION is a share of)."""
    b = np.asarray(seed_tile_bits, np.float64)
    return float(b[np.isfinite(b)].sum())


def expected_saving(seed_tile_bits: np.ndarray, model_bits: np.ndarray) -> Saving:
    """Saving for these per-tile costs (NaN model bits: no estimate, counted as no saving)."""
    gain = np.nan_to_num(np.asarray(seed_tile_bits) - np.asarray(model_bits), nan=0.0)
    k, n = int((gain > 0).sum()), len(gain)
    return Saving(float(gain[gain > 0].sum()), k, _saving_needed(n, k, _seed_total(seed_tile_bits)))


def sample_saving(sources: list[imgs.SourceImage], model, ss: stream.StreamSettings, device: str = "cpu",
                  excess_bpd: float = 0.0, chain=None) -> Saving:
    """Saving extrapolated from SAMPLE_TILES tiles drawn at random (numpy's generator, seed 0): each
    estimated by tile_model_bits as the whole set would estimate it, against its share of the seed
    codec's file (stream.seed_file_tile_bits: blocks of up to 1024x1024 coded alone, from the
    analyses that file made). bits and tiles: the sample's scaled to all tiles; upper: bits plus
    SAMPLE_Z standard errors of that total (finite population). The tiles are drawn from the colour
    (RGB) images' and the extrapolation is to those; a grey image's tiles save nothing (compress gives
    them the seed codec) but count in the flags that name the seed tiles."""
    return _sampled_saving(sources, model, ss, device, excess_bpd, SAMPLE_TILES, None, 0.0, SAMPLE_Z, chain)


def screen_saving(sources: list[imgs.SourceImage], model, ss: stream.StreamSettings, device: str = "cpu",
                  excess_bpd: float = 0.0, chain=None) -> Saving:
    """sample_saving's extrapolation from a quicker look: SCREEN_TILES tiles, each from SCREEN_N_T
    time samples (bfloat16 where fast: tile_model_bits(look=...)), whose estimate lies within about
    SCREEN_SD_BPD of the full one (its standard deviation): each tile's gain is what the full estimate
    is expected to find, E max(0, D) with D ~ N(seed codec - model, SCREEN_SD_BPD x its dims), and the
    tiles with a gain are counted by P(D > 0). chain: as sample_saving's (the look itself is the
    continuous bound plus excess_bpd: tile_model_bits).

    First, where there are more than SCREEN_FIRST colour tiles, screen_first_stage: where its look at
    SCREEN_FIRST of those tiles already rules the model out, its Saving (sampled SCREEN_FIRST) is the
    screen's."""
    seed = _file_shares(sources, ss)
    if int(rgb_tiles(sources, ss.tile).sum()) > SCREEN_FIRST:
        first = screen_first_stage(sources, model, ss, device, excess_bpd, seed)
        if first.upper < first.needed:
            return first
    return _sampled_saving(sources, model, ss, device, excess_bpd, SCREEN_TILES, SCREEN_N_T, SCREEN_SD_BPD,
                           SCREEN_Z, chain, seed)


def screen_first_stage(sources: list[imgs.SourceImage], model, ss: stream.StreamSettings, device: str = "cpu",
                       excess_bpd: float = 0.0, seed: np.ndarray | None = None) -> Saving:
    """The screen's first stage: of the screen's tiles (drawn as the screen draws them), the
    SCREEN_FIRST with the most seed codec bits (the first drawn where equal), each from the screen's
    look, in a call of their own. Their x = (seed codec - model) / dims have a mean m and a spread
    s = max(their standard deviation, SCREEN_FIRST_SPREAD_BPD); every colour tile is taken to save
    E max(0, D), D ~ N(mu, s^2 + SCREEN_SD_BPD^2) in bits/dim: bits with mu = m, upper with mu = m +
    SCREEN_FIRST_Z s / sqrt(SCREEN_FIRST) (first_stage_saving). The tiles chosen are those where the
    model is most likely to win (it is furthest behind where the seed codec spends little), so the
    extrapolation leans to the model. seed: the seed codec's bits per tile (stream.seed_file_tile_bits),
    computed where not given."""
    refs = _tile_refs(sources, ss.tile)
    seed = _file_shares(sources, ss) if seed is None else seed
    rgb = np.flatnonzero(_rgb_of(sources, refs))
    n, dims = len(rgb), 3 * ss.tile ** 2
    pick = np.sort(by_seed_bits(rgb[_draw(n, SCREEN_TILES)], seed)[:SCREEN_FIRST])
    model_bits = tile_model_bits(sources, model, ss.tile, device, excess_bpd, seed, only=pick, look=SCREEN_N_T)
    return first_stage_saving(seed[pick] - model_bits[pick], n, dims, len(refs), _seed_total(seed))


def by_seed_bits(tiles: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """These tiles (the screen's, in the order drawn) by the seed codec's bits on them (seed), most
    first, the first drawn first where equal: screen_first_stage takes the first SCREEN_FIRST."""
    return tiles[np.argsort(-seed[tiles], kind="stable")]


def first_stage_saving(d: np.ndarray, n: int, dims: int, n_refs: int, seed_total: float) -> Saving:
    """screen_first_stage's Saving from its tiles' seed codec - model bits d (each of dims), of n
    colour tiles, n_refs tiles in all, the seed codec's bits on them seed_total."""
    x = np.asarray(d, np.float64) / dims
    s = max(float(x.std(ddof=1)), SCREEN_FIRST_SPREAD_BPD)
    sd = math.hypot(s, SCREEN_SD_BPD)
    mean = float(x.mean())
    (gain, hi), (p, _) = _expected_gain(np.array([mean, mean + SCREEN_FIRST_Z * s / math.sqrt(len(x))]), sd)
    k = int(round(n * p))
    return Saving(n * dims * float(gain), k, _saving_needed(n_refs, k, seed_total), len(x), n * dims * float(hi))


def _file_shares(sources: list[imgs.SourceImage], ss: stream.StreamSettings) -> np.ndarray:
    """The stream's tiles' shares of the seed codec's file (stream.seed_file_tile_bits)."""
    images = [stream.StreamImage(s.color, s.extra) for s in sources]
    return stream.seed_file_tile_bits(images, _tile_refs(sources, ss.tile), ss.seed)


def _draw(n: int, tiles: int) -> np.ndarray:
    """The tiles a quick look (the sample, the screen) takes of n colour tiles (indices into them):
    numpy's generator of seed 0, in the order drawn (each estimate takes its tiles in sorted order)."""
    return np.random.default_rng(0).choice(n, min(tiles, n), replace=False)


def _expected_gain(d: np.ndarray, sd: float) -> tuple[np.ndarray, np.ndarray]:
    """(E max(0, D), P(D > 0)) for D ~ N(d, sd^2), elementwise; sd 0: (max(0, d), d > 0)."""
    if sd <= 0:
        return np.maximum(0.0, d), (d > 0).astype(np.float64)
    u = np.asarray(d, np.float64) / sd
    cdf = np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in u])
    return sd * (np.exp(-u * u / 2) / math.sqrt(2 * math.pi) + u * cdf), cdf


def _sampled_saving(sources, model, ss: stream.StreamSettings, device: str, excess_bpd: float, tiles: int,
                    look: int | None, sd_bpd: float, z: float, chain=None, seed: np.ndarray | None = None) -> Saving:
    refs = _tile_refs(sources, ss.tile)
    rgb = np.flatnonzero(_rgb_of(sources, refs))  # all tiles where every image is RGB: the same draw
    n = len(rgb)
    pick = rgb[np.sort(_draw(n, tiles))]
    seed = _file_shares(sources, ss) if seed is None else seed
    model_bits = tile_model_bits(sources, model, ss.tile, device, excess_bpd, seed, only=pick, look=look, chain=chain)
    return extrapolated_saving(seed[pick] - model_bits[pick], n, len(refs), _seed_total(seed),
                               sd_bpd * 3 * ss.tile ** 2, z)


def extrapolated_saving(d: np.ndarray, n: int, n_refs: int, seed_total: float, sd: float, z: float) -> Saving:
    """A sample's Saving (sample_saving, screen_saving) from its tiles' seed codec - model bits d, of n
    colour tiles, n_refs tiles in all, the seed codec's bits on them seed_total: each tile's gain
    E max(0, D), D ~ N(d, sd^2) (_expected_gain), scaled to the n tiles, upper z standard errors above."""
    gain, p = _expected_gain(d, sd)
    m, scale = len(gain), n / len(gain)
    se = n * float(gain.std(ddof=1)) / math.sqrt(m) * math.sqrt(1 - m / n) if 1 < m < n else 0.0
    k = int(round(scale * float(p.sum())))
    bits = scale * float(gain.sum())
    return Saving(bits, k, _saving_needed(n_refs, k, seed_total), m, bits + z * se)


FALLBACK_N_T = 16          # time samples per tile of the bound that decides fallback "auto"
FALLBACK_MARGIN_BPD = 0.05  # the model's stream is coded unless its bound is this far above the seed file
FALLBACK_Z = 4.0            # the estimate stops once this many standard errors from the threshold
# time samples per tile of the bound that chooses the seed tiles (tile_model_bits): the choice ranks
# single tiles, so it wants each tile's bound to a few hundredths of a bit/dim (with 16 independently
# stratified samples at 32x32, 0.9.13's, the first 32 CIFAR-10 test images' chosen seed tiles cost
# 3,449 bits more than the model would, with 64 1,100, the least possible); the samples fall as
# 1 / tiles (as 32x32 tiles) beyond CHOICE_TILES, to CHOICE_N_T_MIN, so that the estimate stays a
# small part of the encode. Since 0.9.19 the times lie on a shifted grid (bound_bpd(systematic=True)):
# on Kodak's 64px tiles (photo model) a tile's bound to about 0.05 bits/dim from 16 samples
# (independent strata: 0.19), 0.04 from 32, 0.03 from 64; from 8 to 0.20 (too few grid points for
# the integrand's trough), hence the floor of 16. Since 0.9.57 (losses.exact_part: no sampled ||z||^2)
# 16 grid samples give 0.028 where they gave 0.056 on 32 tiles of kodim14 and kodim05: these counts
# were chosen for the noisier estimate and were not measured again
CHOICE_N_T, CHOICE_N_T_MIN, CHOICE_TILES = 64, 16, 64
# the second estimate (tile_model_bits with seed bits): the tiles within this many bits/dim of the
# seed codec or below it, from this many other time samples (32 on the grid: 0.031 bits/dim on 32
# of kodim14's tiles, two draws each, where 0.9.18's 64 independently stratified ones left 0.036,
# in twice the time)
CHOICE_REFINE_BPD, CHOICE_REFINE_N_T = 0.1, 32
# where the first estimate runs in bfloat16 (models.bf16_is_fast: 36 s against 58 s for kodim14's
# 96 tiles, one thread), the tiles within this much more are refined too: bf16's bound lies 0.004 -
# 0.070 bits/dim above float32's there (median 0.016, 95% below 0.056; on the grid, 16 samples,
# against float32's from 64: 0.016 - 0.027 above on average on four Kodak images, spread 0.058, and
# no tile that the 64 put below the seed codec's share or within 0.05 of it was left out)
CHOICE_BF16_BPD = 0.05


def estimate_model_bpd(sources: list[imgs.SourceImage], model, tile: int, device: str = "cpu",
                       threshold: float | None = None) -> Estimate | None:
    """The model's bound in bits/dim over these images' colour planes, with the float32 network (an
    estimate, never reported as a size), or None where some image is not plain RGB (grey, alpha and
    palettes go partly through the seed codec in the model's stream too).

    Per tile (edge tiles padded as evaluate_images pads them; each image weighs its dims, spread over
    its tiles), FALLBACK_N_T time samples on a shifted grid (losses.systematic_uniform). With a
    threshold, tiles are taken in a random order (fixed seed: the same decision every run) and the
    estimate stops once it lies FALLBACK_Z standard errors above or below it
    (estimate.sequential_mean); without one, every tile counts."""
    import torch

    from . import likelihood, models

    if not all(s.color is not None and s.color.shape[0] == 3 and s.extra is None for s in sources):
        return None
    refs = stream.T.plan_tiles([s.color.shape for s in sources], tile)
    per_image = np.bincount([r.image for r in refs], minlength=len(sources))
    weights = np.array([sources[r.image].num_dims / per_image[r.image] for r in refs])

    def tiles_at(idx) -> np.ndarray:  # built per batch: never every tile of a large set at once
        return padded_tiles(sources, refs, idx, tile)

    gen = likelihood.seeded(0, device)
    net = models.ChannelsLast(model.model)  # faster kernels; an estimate, never a file's arithmetic

    def evaluate(idx: np.ndarray) -> np.ndarray:
        xb = torch.from_numpy(tiles_at(idx)).to(device)
        return likelihood.bound_bpd(net, xb, model.dequantizer, n_t=FALLBACK_N_T, generator=gen,
                                   systematic=True).double().cpu().numpy()

    activity = np.concatenate([tile_activity(tiles_at(range(s, min(s + 64, len(refs))))) for s in range(0, len(refs), 64)])
    return sequential_mean(evaluate, weights, tiles_like(64, tile), threshold, FALLBACK_Z, np.random.default_rng(0),
                           covariate=activity)


def tile_model_bits(sources: list[imgs.SourceImage], model, tile: int, device: str = "cpu",
                    excess_bpd: float = 0.0, seed_bits: np.ndarray | None = None,
                    only: np.ndarray | None = None, look: int | None = None, chain=None) -> np.ndarray:
    """Per tile of the stream (stream.T.plan_tiles order), the bits the model's stream is expected to
    take for its colour values: (bound + excess_bpd) x the whole tile's dims (3 tile^2), the bound per
    dim of the tile edge-padded as evaluate_images pads it, with the float32 network (time samples on
    a shifted grid per tile, losses.systematic_uniform: CHOICE_N_T, fewer for many tiles). An edge
    tile's padding counts in full (0.9.18): the stream codes the whole tile, its padding latent
    (popped around the edge replication, given back), and that costs about what the padded bound
    charges it. Scaled to the image's pixels alone (0.9.17) the estimate of an edge tile came out
    far too low: a 1600x1064 photograph's 24 bottom-edge tiles (40 of 64 rows) were to cost 287,267
    bits and took 489,336 in the stream (their chain's bound over the whole padded tiles: 478,555),
    so the model's stream was coded (about 100 s) and came out 15,452 bytes above the seed codec's
    file.
    With seed_bits (the seed codec's bits per tile) and a first estimate of fewer than
    CHOICE_REFINE_N_T time samples (many tiles: a photograph), a second estimate of the tiles the
    first puts below the seed codec or within CHOICE_REFINE_BPD of it, from CHOICE_REFINE_N_T other
    time samples, replaces the first: the tiles the choice gives the model are those whose first
    estimate came out low, so that estimate is biased low on them; the second is not (kodim14,
    `photo`: the 18 tiles whose first estimate was below the seed codec's share were to save 50,263
    bits, saved 18,352). Where the first already has as many samples (a CIFAR-10 stream: 64), a
    second is only another draw of the same noise: the first 32 CIFAR-10 test images' choice moved
    from images 3, 21, 25, 29 to 3, 13, 21, 29, whose moves cost 732 bits more by an independent
    64-sample bound, and the stream came out 23 bytes larger.
    Where there is a second estimate and bfloat16 is fast (models.bf16_is_fast), the first runs in it
    (models.Bf16) and the second takes the tiles within CHOICE_BF16_BPD more: the first only picks the
    tiles to refine, every tile it could give the model is estimated again in float32.
    An estimate that steers the encoder's choice of seed tiles (stream.choose_seed_tiles), never a
    size. NaN for the tiles of grey images (their colour planes are partly latent in the model).
    only (tile indices): estimate these tiles alone (NaN elsewhere), as the whole set would estimate
    them: the time samples and the bfloat16 first look follow the number of all tiles (sample_saving).
    look (time samples): one estimate from that many, in bfloat16 where it is fast, and no second
    (screen_saving's quick look), from time samples of its own (a generator of seed 2: the full
    estimate's first look draws with seed 0, so a look of every tile would repeat it).
    chain (the chain codec's coefficients, DensityTileCodec.chain_coeffs; compress's default mode):
    the float32 estimates are the chain's own bound per tile (discrete_chain.chain_elbo_bpd, as many
    of its steps as there are time samples, drawn in proportion to their expected terms:
    expected_step_nats), with no excess_bpd added: what the chain costs on each tile rather than the
    continuous bound plus the chain table's average excess (0.9.61: on misc 4.1.06, 256x256
    textures, the chain's bound lay 0.109 bits/dim above the continuous one, on 4.1.08 0.060, where
    the table says 0.080; the 13 model tiles of 4.1.06's stream cost 4.272 bits/dim, the chain's
    bound 4.259, the continuous bound with the excess 4.231, and the file saved 6,688 bits of payload
    where 12,470 were expected). From 32 of 64 steps a tile's estimate lies within 0.020 bits/dim
    (0.010 from all), the continuous bound's from 32 grid samples within 0.031. The bfloat16 first
    look and the screen's look stay the continuous bound plus excess_bpd (quick, and only filters)."""
    import torch

    from . import discrete_chain, likelihood, models

    refs = _tile_refs(sources, tile)
    out = np.full(len(refs), np.nan)
    rgb = np.flatnonzero(_rgb_of(sources, refs)).tolist()
    dims = 3 * tile * tile  # every tile is coded whole, padding included
    step = tiles_like(64, tile)
    n32 = len(rgb) * tile * tile / (32 * 32)

    weights = None if chain is None else discrete_chain.expected_step_nats(chain, _eps_mse(model))

    def estimate(idx: list[int], n_t: int, seed: int, net, own: bool = False) -> None:
        """own: the chain's own bound (chain given, the float32 network), else the continuous one."""
        gen = likelihood.seeded(seed, device)
        for s in range(0, len(idx), step):
            part = idx[s:s + step]
            xb = torch.from_numpy(padded_tiles(sources, refs, part, tile)).to(device)
            if own:
                bpd = discrete_chain.chain_elbo_bpd(net, xb, model.dequantizer, chain, gen, n_t, weights)
            else:
                bpd = likelihood.bound_bpd(net, xb, model.dequantizer, n_t=n_t, generator=gen,
                                           systematic=True) + excess_bpd
            out[part] = bpd.double().cpu().numpy() * dims

    n_t = look or max(CHOICE_N_T_MIN, min(CHOICE_N_T, int(CHOICE_N_T * CHOICE_TILES / max(n32, 1))))
    refine = seed_bits is not None and n_t < CHOICE_REFINE_N_T and look is None
    # bfloat16 for a look that only picks the tiles to refine, or only screens
    fast = (refine or look is not None) and models.bf16_is_fast(device)
    net = models.ChannelsLast(model.model)  # faster kernels; an estimate, never a file's arithmetic
    if only is not None:
        chosen = set(np.asarray(only).tolist())
        rgb = [i for i in rgb if i in chosen]
    # a look draws its own times (seed 2), independent of the full estimate's first (0) and second (1)
    # the chain's own bound where this estimate is the last (a first one only picks the tiles to refine)
    estimate(rgb, n_t, 2 if look else 0, models.Bf16(net) if fast else net, chain is not None and not (look or refine))
    if refine:
        margin = CHOICE_REFINE_BPD + (CHOICE_BF16_BPD if fast else 0.0)
        near = [i for i in rgb if out[i] < seed_bits[i] + margin * dims]
        estimate(near, CHOICE_REFINE_N_T, 1, net, chain is not None)
    return out


def tile_activity(tiles: np.ndarray) -> np.ndarray:
    """Per tile [n, C, h, w] of uint8: the mean of log2(1 + |x - MED|) over its values, MED the
    median edge predictor from the N, W and NW neighbours within the tile (edge-replicated): a
    texture measure that costs nothing beside the model's bound and tracks it (correlation 0.78 -
    0.84 over the photo model's 64px tiles of four Kodak images)."""
    x = tiles.astype(np.int16)
    p = np.pad(x, ((0, 0), (0, 0), (1, 0), (1, 0)), mode="edge")
    n, w, nw = p[..., :-1, 1:], p[..., 1:, :-1], p[..., :-1, :-1]
    lo, hi = np.minimum(n, w), np.maximum(n, w)
    med = np.where(nw >= hi, lo, np.where(nw <= lo, hi, n + w - nw))
    return np.log2(1.0 + np.abs(x - med)).mean(axis=(1, 2, 3))


def _pack(head: dict, settings: dict, ss: stream.StreamSettings, payload: np.ndarray, fields: dict,
          section: bytes = b"", low: np.ndarray | None = None) -> bytes:
    """The .sfc bytes of a stream: `head` (what does not depend on the stream) plus its coding, the
    images' metadata `section` (metadata.pack; format version 5 where there is one) and the 16-bit
    images' `low` words (low_section; version 6 where there are any)."""
    so = seed_only(fields)
    header = {
        # a seed-only stream decodes without a model or floats: it leaves out the model and the
        # setup (about 85 of a one-image file's ~160 header bytes, 0.22 bits/dim at 32x32)
        **{k: head[k] for k in (("codec", "mode") if so else ("codec", "model", "mode"))},
        # a seed-only stream leaves out the mode's settings: they cannot change its decoding, and
        # the header weighs most on such files (one small image)
        "settings": {} if so else _non_default(settings, FORMAT_DEFAULTS[head["mode"]]),
        # and of the stream's, all but the tile size (the tile count depends on it), max_batch
        # (the decoder bounds max_batch x tile^2; a whole-image tile above 64px comes with max_batch 1),
        # the seed codec's version and the seed tiles' context ("image": the seed codec over the
        # whole image, not tile by tile)
        "stream": _non_default(_seed_only_stream(ss) if so else ss.to_dict(), FORMAT_DEFAULTS["stream"]),
        "fields": fields,
        **{k: v for k, v in head.items() if k not in ("codec", "model", "mode") and not (so and k == "setup")},
    }
    return container.pack(header, payload, section=section, low_words=low)


def low_section(sources: list[imgs.SourceImage]) -> np.ndarray | None:
    """The uint32 ANS words of the 16-bit images' low bits and tables (deep.push_image, the images in
    order); None where no image is 16-bit."""
    if not any(s.deep for s in sources):
        return None
    m = Message()
    for s in reversed(sources):
        if s.deep:
            deep.push_image(m, s.high_planes(), s.low, s.table, s.meta["deep"])
    return m.words()


def _pop_low(sources: list[imgs.SourceImage], low: np.ndarray | None) -> None:
    """Give each decoded 16-bit image its low bits and table from the low-bit section's words."""
    deep_ones = [s for s in sources if s.deep]
    if bool(deep_ones) != (low is not None):
        raise BadFileError("corrupt .sfc file: 16-bit images and a low-bit section go together (format version 6)")
    if not deep_ones:
        return
    try:
        m = Message(low)
        for s in deep_ones:
            s.low, s.table = deep.pop_image(m, s.high_planes(), s.meta["deep"])
        left = not m.is_empty()
    except (ValueError, OverflowError, IndexError, KeyError) as e:
        raise BadFileError(f"corrupt low-bit section: it does not decode ({e.__class__.__name__})") from None
    if left:
        raise BadFileError("corrupt low-bit section: words left over after the last image")


def _seed_only_stream(ss: stream.StreamSettings) -> dict:
    """The stream settings that a seed-only stream's decoding depends on."""
    kept = {"tile": ss.tile, "max_batch": ss.max_batch, "seed": ss.seed}
    if ss.seed_context != "tile":
        kept.update(batching=ss.batching, seed_tiles=ss.seed_tiles, seed_context=ss.seed_context)
    return kept


def seed_only(fields: dict) -> bool:
    """Whether every tile of a stream (its header's "fields") is in the seed codec, none through the model."""
    return fields["n_tiles"] == fields["n_seed"]


def needs_model(header: dict) -> bool:
    """Whether decoding this (validated) header runs a model: not for a seed-only stream, whose
    header names no model since 0.6.0 (older such files name one, which decoding ignores)."""
    return not seed_only(header["fields"])


def read_header(data: bytes) -> dict:
    """The header of .sfc bytes, structurally validated (no decoding)."""
    header = container.peek_header(data)
    _validate(header)
    return header


def _release(v) -> tuple[int, ...] | None:
    try:
        return tuple(int(p) for p in str(v).split("."))
    except ValueError:
        return None


def _validate(h: dict) -> None:
    """Structure and bounds of a header; what a newer release wrote and this one refuses says so."""
    try:
        _validate_fields(h)
    except BadFileError as e:
        made, this = _release(h.get("codec")), _release(__version__)
        if made is not None and this is not None and made > this:
            raise UnsupportedVersionError(f"{e} (the file was written by scoreflow-codec {h['codec']}, newer than "
                                          f"this {__version__}: upgrade to decode it)") from None
        raise


def _validate_fields(h: dict) -> None:
    req = container.require
    req(h, "mode", str)
    req(h, "settings", dict)
    req(h, "stream", dict)
    req(h, "fields", dict)
    for k in ("n_seed", "n_tiles"):
        req(h["fields"], k, int)
    if "model" in h or not seed_only(h["fields"]):  # a seed-only stream may name no model and setup
        req(h, "model", dict)
        req(h["model"], "sha256", str)
        req(h, "setup", dict)
    req(h, "images", list)
    req(h, "crc32", int)
    if h["mode"] not in MODES:
        raise BadFileError(f"unknown coding mode {h['mode']!r} in header")
    total = 0
    for run in h["images"]:
        if (not isinstance(run, list) or len(run) != 4 or not all(isinstance(v, int) for v in (run[0], run[1], run[3]))
                or run[2] not in ("RGB", "RGBA", "L", "LA", "1", "P", "PA", *deep.MODES)):
            raise BadFileError("corrupt header: bad image list")
        w, hh, _, n = run
        if not (1 <= w and 1 <= hh and w * hh <= imgs.MAX_PIXELS and 1 <= n <= MAX_IMAGES):
            raise BadFileError("corrupt header: image size out of range")
        total += n
    if not 1 <= total <= MAX_IMAGES:
        raise BadFileError("corrupt header: image count out of range")
    if sum(run[0] * run[1] * run[3] for run in h["images"]) > MAX_TOTAL_PIXELS:
        raise BadFileError(f"corrupt header: images total more than {MAX_TOTAL_PIXELS} pixels")
    meta = h.get("meta", {})
    if not isinstance(meta, dict) or not all(isinstance(v, dict) for v in meta.values()):
        raise BadFileError("corrupt header: per-image metadata is not an object of objects")
    metadata.check_entries([v["kept"] for v in meta.values() if "kept" in v])  # what the section holds
    for _, _, mode, m in expand_images(h):
        if mode in deep.MODES:
            deep.check(m.get("deep"))
        elif "deep" in m:
            raise BadFileError("corrupt header: a 16-bit description on an 8-bit image")
        if mode not in ("P", "PA") and "transparency" in m:  # a PNG's transparent colour (0.10.6)
            try:
                imgs.checked_colour_key(mode, m["transparency"])
            except SfcError as e:
                raise BadFileError(f"corrupt header: {e}") from None
    _validate_coding(h)


# Allowed values of the coding settings a header may carry: (type, low, high) for numbers, a
# tuple of strings for choices. Anything else, and any key not listed, is refused.
_INT, _NUM = (int,), (int, float)
_SETTING_RULES = {
    "ode": {"steps": (_INT, 2, MAX_STEPS), "lattice_bits": (_INT, 1, 16), "sigma_ratio": (_NUM, 1e-3, 1e6),
            "fp_iters": (_INT, 0, 1000), "fp_max": (_INT, 1, 1000), "fp_tol": (_NUM, 1e-9, 1e6),
            "fp_stall": (_NUM, 0.0, 1e6), "schedule": ("logsnr", "uniform"), "trace_probe": ("rademacher",)},
    "chain": {"steps": (_INT, 2, MAX_STEPS), "lattice_bits": (_INT, 1, 16), "lattice_ratio": (_NUM, 1e-3, 1e6),
              "schedule": ("logsnr", "uniform", "calibrated", "optimized"), "reverse_var": ("calibrated", "posterior"),
              "kappa_top": (_INT, 0, MAX_STEPS)},
    "stream": {"tile": (_INT, 4, 1024), "n_seed": (_INT, 0, None), "batching": stream.BATCHINGS,
               "growth": (_NUM, 0, 1e6),
               "max_batch": (_INT, 1, MAX_MICRO_BATCH * 64), "fill_std": (_NUM, 1e-3, 1e3),
               "pad_words": (_INT, 0, MAX_PAD_WORDS), "seed": (_INT, 1, max(stream.SEED_VERSIONS)),
               "seed_tiles": stream.SEED_TILES, "seed_context": stream.SEED_CONTEXTS},
    "setup": {"micro_batch": (_INT, 1, MAX_MICRO_BATCH), "threads": (_INT, 1, MAX_THREADS)},
    "fields": {"n_seed": (_INT, 0, None), "n_tiles": (_INT, 0, None), "pad_words": (_INT, 0, MAX_PAD_WORDS),
               "pad_stripped": (_INT, 0, MAX_PAD_WORDS)},
}


def _check_values(where: str, values: dict, rules: dict, exhaustive: bool) -> None:
    for k, v in values.items():
        rule = rules.get(k)
        if rule is None:
            if exhaustive:
                raise BadFileError(f"corrupt header: unknown {where} setting {k!r}")
            continue
        if k in ("n_seed", "pad_words") and where == "stream" and v is None:
            continue  # "decide from the model", as the encoder's default
        if isinstance(rule[0], tuple):
            typ, lo, hi = rule
            ok = isinstance(v, typ) and not isinstance(v, bool) and v >= lo and (hi is None or v <= hi)
            want = f"{'an integer' if typ is _INT else 'a number'} in [{lo}, {hi if hi is not None else 'inf'}]"
        else:
            ok, want = v in rule, " or ".join(rule)
        if not ok:
            raise BadFileError(f"corrupt header: {where} setting {k!r} is {v!r}, expected {want}")


def _validate_coding(h: dict) -> None:
    """Coding settings, setup and stream fields within bounds, before any of them is used."""
    mode_settings, stream_settings = full_settings(h)
    _check_values(h["mode"], mode_settings, _SETTING_RULES[h["mode"]], True)
    _check_values("stream", stream_settings, _SETTING_RULES["stream"], True)
    if stream_settings["max_batch"] * stream_settings["tile"] ** 2 > MAX_BATCH_PIXELS:
        raise BadFileError("corrupt header: stream batches of more than "
                           f"{MAX_BATCH_PIXELS} pixels (max_batch x tile^2)")
    if "setup" in h:
        container.require(h, "setup", dict)
        setup = h["setup"]
        for k in ("device", "dtype", "torch"):
            container.require(setup, k, str)
        for k in ("micro_batch", "threads"):
            container.require(setup, k, int)
        _check_values("setup", setup, _SETTING_RULES["setup"], False)
    fields = h["fields"]
    for k in _SETTING_RULES["fields"]:
        container.require(fields, k, int)
    _check_values("fields", {k: v for k, v in fields.items() if k != "parts"}, _SETTING_RULES["fields"], True)
    if "parts" in fields:  # a seed-only stream in independent parts (stream.in_parts, 0.9.26)
        stream.check_parts_field(fields["parts"], fields["pad_words"])
        if len(fields["parts"]) > fields["n_tiles"]:
            raise BadFileError("corrupt header: more parts than tiles")
    # the tile count, computed without listing the tiles (a header may declare 10^13 pixels)
    t = stream_settings["tile"]
    if sum(-(-w // t) * -(-hh // t) * n for w, hh, _, n in h["images"]) > MAX_TILES:
        raise BadFileError(f"corrupt header: more than {MAX_TILES} tiles")
    n_tiles = sum(-(-c[2] // t) * -(-c[1] // t) for c, _ in _stream_shapes(h) if c[0])
    if fields["n_tiles"] != n_tiles or fields["n_seed"] > fields["n_tiles"] \
            or fields["pad_stripped"] > fields["pad_words"]:
        raise BadFileError("corrupt header: tile counts do not match the image sizes")


def expand_images(h: dict) -> list[tuple[int, int, str, dict]]:
    """(width, height, mode, meta) of each image of a (validated) header."""
    out = []
    meta = h.get("meta", {})
    for w, hh, mode, n in h["images"]:
        for _ in range(n):
            out.append((w, hh, mode, meta.get(str(len(out)), {})))
    return out


def _stream_shapes(h: dict) -> list:
    shapes = []
    for w, hh, mode, meta in expand_images(h):
        mode = deep.BASE_MODE.get(mode, mode)  # a 16-bit image's high bits: its 8-bit mode's planes
        color_c = {"RGB": 3, "RGBA": 3, "L": 1, "LA": 1, "1": 1}.get(mode)
        extra_c = 0
        if mode in ("RGBA", "LA") and "alpha_const" not in meta:
            extra_c = 1
        if mode in ("P", "PA"):
            coded = meta.get("palette_coded")
            if coded not in ("colors", "indices"):
                raise BadFileError("corrupt header: palette image without palette")
            color_c = 3 if coded == "colors" else None
            extra_c = (coded == "indices") + (mode == "PA")
        shapes.append(((color_c, hh, w) if color_c else (0, 0, 0), (extra_c, hh, w) if extra_c else None))
    return shapes


def check_setup(h: dict, model, device: str) -> None:
    """Refuse what we can't reproduce: another model, another device class. A seed-only stream
    runs neither model nor floats: nothing to check (the pixel CRC still checks the decode)."""
    if not needs_model(h):
        return
    if model is None:
        raise ModelMismatchError(f"file was made with model {h['model'].get('name', '?')} "
                                 f"(sha256 {h['model']['sha256'][:12]}...): decoding it needs that model")
    if h["model"]["sha256"] != model.sha256:
        raise ModelMismatchError(
            f"file was made with model {h['model'].get('name', '?')} (sha256 {h['model']['sha256'][:12]}...), "
            f"not {model.name} (sha256 {model.sha256[:12]}...); pass --model with the right one")
    setup = h["setup"]
    if setup.get("constriction", _constriction_version()) != _constriction_version():
        log.warning("file was encoded with constriction %s, this is %s: decoding may fail its CRC check",
                    one_line(str(setup.get("constriction"))), _constriction_version())  # the header's text: one line
    if setup.get("dtype") not in ARITHMETICS:
        raise ModelMismatchError(f"file was encoded in {setup.get('dtype')} arithmetic; this release knows "
                                 f"{' and '.join(ARITHMETICS)} only and cannot reproduce it")
    if setup["dtype"] == "exact64":
        if _device_class(device) != "cpu":
            raise ModelMismatchError("the file uses the exact arithmetic, which runs on the CPU: decode with --device cpu")
        return  # the same bits on any machine, thread count and torch build
    if setup.get("device") != _device_class(device):
        raise ModelMismatchError(
            f"file was encoded on {setup.get('device')}; its floats can only be reproduced there: "
            f"decode with --device {setup.get('device')}")
    import torch

    if setup.get("torch") != torch.__version__:
        log.warning("file was encoded with torch %s, this is %s: decoding may fail its CRC check",
                    one_line(str(setup.get("torch"))), torch.__version__)


def _why(h: dict) -> str:
    """What a payload that passed its CRC but does not decode points to (same words as the CRC check)."""
    if not needs_model(h):
        return "; the file is corrupt (its seed codec's coding is exact: any machine decodes an intact file)"
    st = h["setup"]
    if st.get("dtype") == "exact64":
        return "; the file is corrupt (its arithmetic is exact: any machine decodes an intact file)"
    return (f"; the file is corrupt, or this machine does not reproduce the encoder's arithmetic (encoded on "
            f"{st['device']} with torch {st['torch']}, {st['threads']} thread(s), micro-batch {st['micro_batch']})")


def _constriction_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("constriction")
    except PackageNotFoundError:  # an unusual install: nothing to compare
        return "unknown"


def _check_arith(arith: str, device: str | None) -> None:
    """The arithmetic's name, and (device given) that exact64 runs on the CPU."""
    if arith not in ARITHMETICS:
        raise SfcError(f"unknown arithmetic {arith!r}; expected one of {', '.join(ARITHMETICS)}")
    if device is not None and arith == "exact64" and _device_class(device) != "cpu":
        raise SfcError("the exact arithmetic runs on the CPU only: use --device cpu (or --arith float32 on "
                       f"{_device_class(device)}, whose files then decode only there)")


def decompress(data: bytes, model=None, device: str = "cpu", progress: Callable[[int], None] | None = None,
               jobs: int | None = None) -> list[imgs.SourceImage]:
    """Decode .sfc bytes; raises DecodeMismatchError unless the pixels' CRC matches. model: the
    file's model (None will do for a seed-only file, see needs_model). jobs: processes for a file in
    parts (compress's jobs; None: every usable core within the available memory), and whether the seed
    codec's decoder makes its least-squares fits in a second process (1: no; seed_codec.jobs)."""
    _check_jobs(jobs)
    header, payload, section, low = container.unpack_all(data)
    _validate(header)
    kept = metadata.unpack([m.get("kept", {}) for *_, m in expand_images(header)], section)  # before the long part
    check_setup(header, model, device)
    shapes = _stream_shapes(header)
    use_model = needs_model(header)
    try:
        mode_settings, stream_settings = full_settings(header)
        ss = stream.StreamSettings.from_dict(stream_settings)
        codec = _build_codec(model, header["mode"], mode_settings, int(header["setup"]["micro_batch"]), device,
                             header["setup"]["dtype"]) if use_model else stream.NO_MODEL
    except (TypeError, ValueError, KeyError) as e:
        raise BadFileError(f"corrupt header: bad coding settings ({e})") from None
    setup = header.get("setup", {}) if use_model else {}
    threads = setup.get("threads")
    if not (isinstance(threads, int) and threads >= 1 and setup.get("dtype") != "exact64"):
        threads = None  # exact64 decodes alike at any thread count
    # a seed-only stream runs no model: integers only, no torch
    run = _model_run(threads) if use_model else contextlib.nullcontext()
    try:
        with run, seed_codec.jobs(jobs):
            decoded = stream.decode(payload, header["fields"], shapes, codec, ss, progress, jobs)
    except (ValueError, OverflowError, IndexError) as e:
        raise BadFileError(f"corrupt payload: it does not decode ({e.__class__.__name__}){_why(header)}") from None
    except BadFileError as e:
        raise BadFileError(f"{e}{_why(header)}") from None
    sources = [imgs.SourceImage(mode, d.color, d.extra, {k: v for k, v in meta.items() if k != "kept"}, md)
               for (w, hh, mode, meta), d, md in zip(expand_images(header), decoded, kept)]
    _pop_low(sources, low)
    try:
        crc = _images_crc(sources)
    except (SfcError, KeyError, ValueError, IndexError, TypeError, AttributeError):
        crc = None  # the header's per-image metadata (palette ...) is unusable: corrupt
    if crc != header["crc32"]:
        raise DecodeMismatchError(
            "decoded pixels do not match the encoder's (CRC mismatch): the file is corrupt or this "
            "machine does not reproduce the encoder's arithmetic; nothing was written")
    return sources


def _checked_effort(effort) -> int:
    try:
        return seed_codec.check_effort(effort)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _check_jobs(jobs) -> None:
    try:
        workers.check_jobs(jobs)
    except ValueError as e:
        raise UsageError(str(e)) from None


def work_units(header: dict) -> int:
    """Progress ticks (solver steps x tiles) of decoding a file with this header."""
    ms, _ = full_settings(header)
    steps = steps_per_batch(header["mode"], ms["steps"]) if needs_model(header) else stream.NO_MODEL.steps_per_batch()
    return steps * header["fields"]["n_tiles"]


def compress_work_units(sources: list[imgs.SourceImage], model, mode: str, settings: dict | None = None,
                        stream_settings: stream.StreamSettings | None = None, fallback: str = "auto") -> int:
    """Progress ticks (solver steps x tiles) of compressing these images; with fallback "seed" (no model
    runs) one, ticked when the file is done."""
    if fallback == "seed":
        return 1
    settings = coding_settings(mode, model, settings)
    ss = stream_settings or default_stream_settings(model)
    shapes = [s.color.shape if s.color is not None else (0, 0, 0) for s in sources]
    return steps_per_batch(mode, settings["steps"]) * len(stream.T.plan_tiles(shapes, ss.tile))


# --- conveniences for the bench -------------------------------------------------------------
def compress_arrays(arrays: list[np.ndarray], model, mode: str = "ode", device: str = "cpu", tile: int | None = None,
                    fallback: bool = False, arith: str = DEFAULT_ARITH, seed_tiles: str = "chosen",
                    **settings) -> tuple[bytes, CompressReport]:
    """compress of uint8 arrays; tile and seed_tiles as default_stream_settings, settings the mode's."""
    return compress([imgs.from_array(a) for a in arrays], model, mode, settings or None,
                    stream_settings=default_stream_settings(model, tile, seed_tiles), device=device,
                    fallback=fallback, arith=arith)


def compress_images(arrays: list[np.ndarray], model, mode: str = "ode", device: str = "cpu", tile: int | None = None,
                    fallback: bool = False, arith: str = DEFAULT_ARITH, seed_tiles: str = "chosen", **settings) -> bytes:
    return compress_arrays(arrays, model, mode, device, tile, fallback, arith, seed_tiles, **settings)[0]


def decompress_arrays(data: bytes, model, device: str = "cpu") -> list[np.ndarray]:
    return [imgs.to_array(s) for s in decompress(data, model, device)]


def verify_is_cheap(sources: list[imgs.SourceImage], mode: str) -> bool:
    """Whether compress should decode its own output by default (about doubles the time)."""
    dims = sum(s.num_dims for s in sources)
    return mode == "chain" or dims <= 64 * 64 * 3 * 4


def check_identical(sources: list[imgs.SourceImage], decoded: list[imgs.SourceImage]) -> None:
    """Pixel-exact comparison of what was read and what came back (as Pillow images, with their palette
    and transparency since 0.10.6; 16-bit ones as their arrays and transparent colour), and of their
    metadata (ICC profile, EXIF ...)."""
    if len(sources) != len(decoded):
        raise DecodeMismatchError("decoded a different number of images than were encoded")
    for i, (a, b) in enumerate(zip(sources, decoded)):
        if a.mode != b.mode or a.size != b.size or not _same_image(a, b):
            raise DecodeMismatchError(f"image {i}: decoded pixels differ from the input; nothing was written")
        if a.metadata != b.metadata:
            raise DecodeMismatchError(f"image {i}: decoded metadata (ICC, EXIF ...) differs from the input; "
                                      "nothing was written")


def _same_image(a: imgs.SourceImage, b: imgs.SourceImage) -> bool:
    """check_identical's test of two images of one mode and size: their pixels, and (0.10.6) what makes
    them look as they do beside their pixel values, a palette and a transparency (a palette's, or a
    transparent colour's). One Pillow image each, as the pixels' comparison made before."""
    if a.deep:
        return np.array_equal(imgs.to_array(a), imgs.to_array(b)) and \
            a.meta.get("transparency") == b.meta.get("transparency")
    ia, ib = imgs.to_pil(a), imgs.to_pil(b)
    look = [(im.getpalette() if im.mode in ("P", "PA") else None, im.info.get("transparency")) for im in (ia, ib)]
    return np.array_equal(np.asarray(ia), np.asarray(ib)) and look[0] == look[1]


# --- evaluation: the model's bits/dim (bound, ODE NLL) on images -------------------------------
def load_eval_inputs(paths, limit: int | None = None) -> tuple[list[np.ndarray], list[str]]:
    """Image files and/or .npz files (key "images", uint8 [N, H, W, C]) -> arrays, names. A palette or
    1-bit image is its RGB picture (before 0.9.32 a palette image was evaluated as its index plane, as if
    grey, and a 1-bit image was refused with "got bool"); a 16-bit image its high bits (deep.split's: the
    8-bit planes the model codes in its file, the trainer's training pixels), named "NAME (high bits)"
    (refused before 0.9.33)."""
    from pathlib import Path

    arrays, names = [], []
    for p in map(Path, paths):
        if p.suffix.lower() == ".npz":
            a = imgs.read_npz(p)["images"]
            if a.dtype != np.uint8 or a.ndim != 4:
                raise imgs.BadImageError(f"{p}: 'images' must be uint8 [N, H, W, C]")
            for i in range(len(a)):
                arrays.append(a[i])
                names.append(f"{p.name}[{i}]")
        else:
            src = imgs.load_image(p)
            if src.deep:  # its high bits, as compress gives them to the model (and the trainer trains on them)
                c = src.color.transpose(1, 2, 0)
                arrays.append(np.ascontiguousarray(c[..., 0] if c.shape[2] == 1 else c))
                names.append(f"{p.name} (high bits)")
            else:
                im = imgs.to_pil(src)
                if im.mode in ("P", "PA", "1"):  # the picture, as the trainer gives it (not the index plane or bools)
                    im = im.convert("RGB")
                arrays.append(np.asarray(im))
                names.append(p.name)
        if limit is not None and len(arrays) >= limit:
            break
    if limit is not None:
        arrays, names = arrays[:limit], names[:limit]
    if not arrays:
        raise imgs.BadImageError("no images to evaluate")
    return arrays, names


def padded_tile(color: np.ndarray, ref, size: int) -> np.ndarray:
    """One tile (a tiles.TileRef) of colour planes [C, H, W], edge-padded to [C, size, size]."""
    blk = stream.T.known_block(color, ref)
    return np.pad(blk, ((0, 0), (0, size - blk.shape[1]), (0, size - blk.shape[2])), mode="edge")


def padded_tiles(sources: list[imgs.SourceImage], refs, idx, size: int) -> np.ndarray:
    """The colour planes of tiles `idx` of refs (tiles.TileRef over sources), edge-padded: [n, C, size, size]."""
    return np.stack([padded_tile(sources[refs[i].image].color, refs[i], size) for i in idx])


def image_tiles(arr: np.ndarray, size: int = 32) -> np.ndarray:
    """uint8 [H, W, C] -> edge-padded RGB tiles [n, 3, size, size] (gray replicated, alpha dropped)."""
    src = imgs.from_array(arr)
    if src.color is None:
        raise imgs.UnsupportedImageError("palette images with duplicate colours have no colour planes to evaluate")
    c = src.color if src.color.shape[0] == 3 else np.repeat(src.color, 3, axis=0)
    return np.stack([padded_tile(c, r, size) for r in stream.T.plan_tiles([c.shape], size)])


def evaluate_images(arrays: list[np.ndarray], model, device: str = "cpu", ode: bool = True, bound: bool = True,
                    n_t: int = 1000, rtol: float = 1e-5, atol: float = 1e-5, seed: int = 0,
                    tile: int | None = None, batch: int = 64, probes: int = 1, pool: int | None = None) -> list[dict]:
    """Per image: bound bpd (with and without the eps correction) and ODE NLL bpd, averaged over
    its tiles (edge tiles padded by replication, so counted over the padded dims; tile: the
    model's by default, as compress uses). Both are of the same dequantized y (one u per tile).
    probes: Hutchinson probes per tile for the ODE's divergence (its noise falls as 1/sqrt).
    By default each image's tiles go through the network alone, `batch` 32x32 tiles' worth at a
    time; pool (0.9.39): the tiles of all the images together, that many a batch (and one ODE solve
    per batch), for many small images on a GPU: a CIFAR-10 image is one tile, so by default each is an
    ODE solve of batch 1, one after another. The draws then fall differently over the images (as do the
    ODE's steps, shared within a solve), so the numbers differ from the default's by that noise."""
    import torch

    from . import likelihood

    tile = default_stream_settings(model, tile).tile
    batch = tiles_like(batch, tile)  # about as many pixels per batch at any tile size
    gen = likelihood.seeded(seed, device)

    def measure(xb: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per tile of xb, each measure asked for (float64 on the CPU)."""
        deq = likelihood.DrawnDequantization(model.dequantizer, xb, gen)
        out = {}
        if bound:
            terms = likelihood.bound_terms(model.model, xb, deq, n_t=n_t, generator=gen)
            out["bound_bpd"] = terms["bpd_with"].cpu()
            out["bound_bpd_nocorr"] = terms["bpd_without"].cpu()
        if ode:
            out["ode_nll_bpd"] = likelihood.ode_nll_bpd(model.model, xb, deq, rtol=rtol, atol=atol, trace="hutchinson",
                                                        generator=gen, probes=probes).detach().cpu()
        return {k: v.double() for k, v in out.items()}

    def cat(parts: list[dict]) -> dict[str, torch.Tensor]:
        return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}

    counts, per_image = [], []  # each image's tiles, and their values
    if pool and arrays:
        tiles = [image_tiles(arr, tile) for arr in arrays]
        every = np.concatenate(tiles)
        values = cat([measure(torch.from_numpy(every[s:s + pool]).to(device)) for s in range(0, len(every), pool)])
        counts = [len(t) for t in tiles]
        ends = np.cumsum([0] + counts)
        per_image = [{k: v[a:b] for k, v in values.items()} for a, b in zip(ends[:-1], ends[1:])]
    else:  # one image's tiles at a time (made as it comes: all of them at once could be large)
        for arr in arrays:
            x = torch.from_numpy(image_tiles(arr, tile)).to(device)
            counts.append(x.shape[0])
            per_image.append(cat([measure(x[s:s + batch]) for s in range(0, x.shape[0], batch)]))
    return [{"tiles": n, **{k: float(v.mean()) for k, v in m.items()}} for n, m in zip(counts, per_image)]


_EVAL_KEYS = ("bound_bpd", "bound_bpd_nocorr", "ode_nll_bpd")


def _measures(rows: list[dict]) -> dict[str, np.ndarray]:
    """Each of evaluate_images' measures the rows have, over the rows, in _EVAL_KEYS order."""
    return {k: np.array([r[k] for r in rows]) for k in _EVAL_KEYS if rows and k in rows[0]}


def summarize(rows: list[dict]) -> dict:
    """The mean of each of evaluate_images' measures over the rows."""
    return {k: float(v.mean()) for k, v in _measures(rows).items()}


def standard_errors(rows: list[dict]) -> dict:
    """The standard error of each mean in `summarize` over the images (sample std / sqrt(n)):
    how far another draw of as many images could move it. None with fewer than two rows."""
    return {k: float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else None for k, v in _measures(rows).items()}
