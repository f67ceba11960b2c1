"""Many images -> one ANS stack -> payload words, and back (DESIGN 2d).

Push order on the stack (the decoder pops in reverse):
  1. extra planes (alpha, palette indices) of every image, with the classical seed codec;
  2. `n_seed` tiles with the seed codec: real bits for the bits-back below to pop (with
     `seed_context` "image", each image's seed tiles at once, coded in the image's context);
  3. the remaining tiles in batches of growing size, each with bits-back through the model;
  4. with `seed_tiles` "chosen", which tiles were the seed tiles (popped first).
The stack starts from `pad_words` pseudo-random words (ans.padding_words); whatever a batch pops
beyond what is on the stack comes from them. At the end the untouched bottom of the stack equals
a prefix of the padding and is not stored: the decoder re-prepends it, and checks at the end that
the stack is back to exactly the padding. Padding that a pop does reach is stored, and paid in
full: it carried no information. (Pushes rewrite the padding's top one or two words, which sit in
the ANS head, so those are always stored: 64 bits at most.)

Batch sizes (`batching`). A batch pops about `need_bits` (deficit x dims, plus the latent fill
pixels) before it pushes anything back, so a batch no larger than the bits already on the stack
never touches the padding.
  "bits": the encoder adds seed tiles until the stack holds one tile's need, then makes each batch
    as large as the stack allows (up to max_batch) and pushes its size after it (uniform on
    1..min(max_batch, tiles after the seed so far), about 5 bits a batch). The decoder pops the
    size before the batch. This follows the bits, whatever the image: on a smooth image (sky)
    the seed codes at well under the 4.5 bits/dim a fixed count assumes.
  "growth": sizes floor(growth x tiles so far) and ceil(deficit / SEED_RATE_GUESS) seed tiles,
    fixed by the tile count alone (the first schedule; files that name no batching use it).

Seed tiles (`seed_tiles`).
  "first": the first n_seed tiles in tile order (files that name none).
  "chosen" ("bits" batching only): the encoder picks them (`choose_seed_tiles`). Each seed tile
    costs what the seed codec makes of it where the model would have cost its bits-back codelength,
    so the encoder takes every tile that the seed codec codes in fewer bits than the model is
    expected to (the caller's estimate, `tile_bits`), then, while the stack would not yet cover the
    first model tile's need, the tiles whose move costs least. The seed tiles are coded first and
    the model's tiles after them, each in tile order; which tiles are which is pushed last, one flag
    per tile with probability (seed tiles left) / (tiles left): log2 C(n, n_seed) bits in all.

Seed context (`seed_context`, "chosen" seed tiles only).
  "tile": each seed tile alone through the seed codec (files that name none): its adaptive counts
    start afresh on every tile and its edges see nothing beyond the tile.
  "image": the decoder has every model tile before the first seed tile (they are pushed after
    them), so each image's seed tiles are coded at once by the seed codec run over the whole image
    (seed_push_known): its causal context and adaptive counts go through every pixel, the model's
    tiles' pixels known, the seed tiles' pixels coded. A pixel's bits do not depend on which other
    pixels are coded, so a seed tile costs its pixels' share of the whole image's seed coding
    (tile_seed_bits, seed_pixel_bits), which is what the choice compares with the model's estimate:
    with every tile a seed tile, the stream is the seed codec's whole-image coding. On Kodak's 64px
    tiles that share is 0.228 bits/dim below the tiles coded alone (bench/tile_gap.py).

Parts (0.9.26). Where every tile is a seed tile, "first" seed tiles in "tile" context (the seed
codec's file, seed_only_settings: up to 1024x1024 pixels a tile) and the tiles make more than one
part (seed_parts: consecutive tiles, a new part once one holds PART_PIXELS pixels), each part is an
ANS stack of its own, started from the same padding: the first part holds the extra planes and its
tiles, each later part its tiles, pushed in the order above; the payload is the parts' stored words
one after the other, and the header's fields list each part's [stored words, padding words
stripped] ("parts"). The parts are coded and decoded in parallel (workers). Files without "parts"
(one part, or written before 0.9.26) are one stack.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Protocol

import numpy as np

from ..errors import BadFileError
from . import distributions as dist
from . import tiles as T
from . import workers
from .ans import Message, common_prefix_len, padding_words
from .seed_codec import (LATEST as LATEST_SEED, VERSIONS as SEED_VERSIONS, current_effort, effort as seed_effort,
                         remember_pixel_bits, seed_bits, seed_codec, seed_pixel_bits, seed_pop_known, seed_push,
                         seed_push_known, shared_analyses, sharing)

SEED_RATE_GUESS = 4.5  # bits/dim the seed codec gives on natural tiles, to size the seed ("growth")
BATCHINGS = ("bits", "growth")
SEED_TILES = ("first", "chosen")
SEED_CONTEXTS = ("tile", "image")
SEED_MARGIN_BITS = 64.0  # "chosen": the seed tiles' bits cover the first model tile's need by this much
FILL_BITS = math.log2(2 * T.FILL_WINDOW + 1)  # at most, per latent fill pixel


class TileModelCodec(Protocol):
    bits_log: list[float] | None

    def push(self, m: Message, tiles: np.ndarray, progress=None) -> None: ...

    def pop(self, m: Message, shape: tuple, progress=None) -> np.ndarray: ...

    def deficit_bits_per_dim(self) -> float: ...

    def steps_per_batch(self) -> int: ...


@dataclass(frozen=True)
class StreamSettings:
    tile: int = 32
    n_seed: int | None = None    # None: enough seed tiles to cover the first batch's deficit
    batching: str = "bits"       # "bits" or "growth" (module docstring)
    growth: float = 0.25         # "growth" batching only
    max_batch: int = 32
    fill_std: float = 1.5
    pad_words: int | None = None  # None: sized from the deficit of the largest batch
    seed: int = LATEST_SEED      # the seed codec's version (files that name none: 1)
    seed_tiles: str = "first"    # "first" or "chosen" (module docstring); compress: "chosen"
    seed_context: str = "tile"   # "tile" or "image" (module docstring); compress: "image"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "StreamSettings":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


@dataclass
class StreamImage:
    color: np.ndarray | None  # uint8 [Cc, H, W], Cc in {1, 3}: coded through the model
    extra: np.ndarray | None  # uint8 [Ce, H, W]: coded with the seed codec (alpha, indices)

    @property
    def color_shape(self) -> tuple[int, int, int]:
        return (0, 0, 0) if self.color is None else tuple(self.color.shape)


@dataclass
class StreamReport:
    n_tiles: int = 0
    n_seed: int = 0
    batches: list[tuple[int, int]] = field(default_factory=list)
    room_bits: list[int] = field(default_factory=list)  # bits on the stack above the padding before each batch
    pad_words: int = 0
    pad_consumed_bits: int = 0
    predicted_bits: float = 0.0   # sum of the codelengths the coders predict (net of bits back)
    extra_bits: float = 0.0
    seed_bits: float = 0.0
    model_bits: float = 0.0       # net predicted bits of the bits-back batches
    signal_bits: float = 0.0      # the batch sizes ("bits" batching)
    payload_bits: int = 0


def resolve(settings: StreamSettings, codec: TileModelCodec, n_tiles: int) -> tuple[int | None, int]:
    """(n_seed, pad_words) for this stream; n_seed None: the encoder counts them by bits."""
    dims = T.MODEL_CHANNELS * settings.tile ** 2
    deficit = codec.deficit_bits_per_dim() + FILL_BITS
    n_seed = settings.n_seed
    if n_seed is None and settings.batching == "growth":
        n_seed = math.ceil(deficit / SEED_RATE_GUESS)
    if n_seed is not None:
        n_seed = min(n_seed, n_tiles)
    pad = settings.pad_words
    if pad is None:
        pad = math.ceil(deficit * dims * settings.max_batch / 32) + 64
    return n_seed, pad


class _NoModel:
    """The TileModelCodec of a seed-only stream's decoder: no tile reaches it (every tile is in the
    seed codec), so a file decodes without loading any model."""
    bits_log = None

    def push(self, m, tiles, progress=None):
        raise ValueError("this stream codes every tile with the seed codec: it has no model")

    pop = push

    def deficit_bits_per_dim(self) -> float:
        return 0.0

    def steps_per_batch(self) -> int:
        return 1


NO_MODEL = _NoModel()

SEED_ONLY_MAX_TILE = 1024  # the largest tile the format allows (api._SETTING_RULES)


def seed_only_settings(shapes: list[tuple[int, int, int]]) -> StreamSettings:
    """A stream of the seed codec alone: every image's colour planes (shapes: (C, H, W), C may be 0)
    in as few tiles as the format allows, one per image up to 1024x1024, so that the seed codec's
    adaptive statistics and causal context run over the whole image (kodim01-06: 3.026 bits/dim
    whole, 3.093 in 64px tiles). No batch is ever coded, so max_batch only has to keep max_batch x
    tile^2 within what a decoder accepts: the default (which the header leaves out: a few bytes of a
    32x32 image's file) up to 64px tiles, 1 above; two padding words: nothing is popped, the stack
    only needs a start."""
    side = max([max(h, w) for c, h, w in shapes if c] or [4])
    tile = min(max(side, 4), SEED_ONLY_MAX_TILE)
    n_tiles = len(T.plan_tiles(shapes, tile))
    max_batch = StreamSettings.max_batch if tile <= 64 else 1
    return StreamSettings(tile=tile, n_seed=n_tiles, max_batch=max_batch, pad_words=2)


PART_PIXELS = 1 << 18  # every part of a stream in parts but the last holds at least this many pixels


def seed_parts(refs: list[T.TileRef]) -> list[list[int]]:
    """The tiles (indices into refs) of each part of a stream coded in parts: consecutive tiles, a new
    part after one that holds PART_PIXELS pixels or more. A Kodak image is one part; a 4000x3000
    photograph's twelve 1024px tiles (at most) are twelve."""
    parts: list[list[int]] = []
    held = PART_PIXELS
    for i, r in enumerate(refs):
        if held >= PART_PIXELS:
            parts.append([])
            held = 0
        parts[-1].append(i)
        held += r.h * r.w
    return parts


def in_parts(settings: StreamSettings, n_seed: int | None, refs: list[T.TileRef]) -> bool:
    """Whether this stream is coded in independent parts (the module docstring's Parts)."""
    return (n_seed == len(refs) and settings.seed_tiles == "first" and settings.seed_context == "tile"
            and len(seed_parts(refs)) > 1)


def check_parts_field(spec, pad_words: int) -> None:
    """The header's "parts": a list of [stored words, padding words stripped] pairs of integers, each
    at least 0 and the second at most pad_words; else BadFileError."""
    ok = isinstance(spec, list) and 2 <= len(spec) <= 1 << 24 and all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in p)
        and p[1] <= pad_words for p in spec)
    if not ok:
        raise BadFileError("corrupt header: bad list of parts")


def _part_jobs(parts: list[list[int]], refs: list[T.TileRef], jobs: int | None) -> int:
    """The processes for these parts: jobs, or where None workers.auto_jobs by the largest part."""
    workers.check_jobs(jobs)
    return jobs if jobs is not None else workers.auto_jobs(
        len(parts), max(sum(refs[i].h * refs[i].w for i in p) for p in parts))


def _stored(m: Message, pad: np.ndarray) -> tuple[np.ndarray, int]:
    """(the words a file stores of stack m, started from `pad`; how many of the padding's words it
    leaves out: the untouched bottom, which the decoder puts back)."""
    words = m.words()
    n_strip = common_prefix_len(words, pad)
    return words[n_strip:], n_strip


def _reopen(stored: np.ndarray, pad: np.ndarray, n_strip: int, what: str) -> Message:
    """The stack of `stored` words with the padding's n_strip words put back under them."""
    words = np.concatenate([pad[:n_strip], stored]).astype(np.uint32)
    if len(words) == 0 or words[-1] == 0:
        raise BadFileError(f"corrupt payload: {what} is not a valid ANS stack")
    return Message(words)


def _check_unwound(m: Message, pad: np.ndarray, what: str) -> None:
    """Every pop done, the stack must be back to exactly its padding."""
    rest = m.words()
    if len(rest) != len(pad) or not np.array_equal(rest, pad):
        raise BadFileError(f"corrupt payload: {what} did not decode back to its initial state")


def _push_part(blocks: list, extras: list, version: int, pad_n: int, want_bits: bool, level: int):
    """A worker's part: (stored words, padding words stripped, extras' bits, tiles' bits, each tile's
    seed_pixel_bits where want_bits), at the seed codec's effort `level`."""
    pad = padding_words(pad_n)
    m = Message(pad)
    tile_bits, pixel_bits = 0.0, []
    with seed_effort(level):
        extra_bits = sum(seed_push(m, e, version) for e in extras)
        with shared_analyses():
            for b in blocks:
                tile_bits += seed_push(m, b, version)
                if want_bits:
                    pixel_bits.append(seed_pixel_bits(b, version))
    return *_stored(m, pad), extra_bits, tile_bits, pixel_bits


def _pop_part(words, n_strip: int, pad_n: int, block_shapes: list, extra_shapes: list, version: int, k: int):
    """A worker's part back: (its tiles' pixels, its extra planes)."""
    pad = padding_words(pad_n)
    m = _reopen(words, pad, n_strip, f"part {k + 1}")
    blocks = [seed_codec(s, version).pop(m) for s in reversed(block_shapes)][::-1]
    extras = [seed_codec(s, version).pop(m) for s in reversed(extra_shapes)][::-1]
    _check_unwound(m, pad, f"part {k + 1}")
    return blocks, extras


def _encode_parts(images: list[StreamImage], refs: list[T.TileRef], settings: StreamSettings, pad_n: int,
                  jobs: int | None, rep: "StreamReport") -> tuple[np.ndarray, list[list[int]]]:
    """The payload and the header's "parts" of a stream coded in parts; fills rep's bits."""
    parts = seed_parts(refs)
    want = sharing()  # the caller's analyses scope gets each tile's pixel bits, as if coded here
    extras = [im.extra for im in images if im.extra is not None]
    items = [([T.known_block(images[refs[i].image].color, refs[i]) for i in part], extras if k == 0 else [],
              settings.seed, pad_n, want, current_effort()) for k, part in enumerate(parts)]
    payload, spec = [], []
    jobs = _part_jobs(parts, refs, jobs)
    for item, (words, n_strip, extra_bits, tile_bits, pixel_bits) in zip(items, workers.run(_push_part, items, jobs)):
        payload.append(words)
        spec.append([len(words), int(n_strip)])
        rep.extra_bits += extra_bits
        rep.seed_bits += tile_bits
        rep.pad_consumed_bits += 32 * (pad_n - n_strip)
        for b, bits in zip(item[0], pixel_bits):
            remember_pixel_bits(b, settings.seed, bits)
    return np.concatenate(payload).astype(np.uint32), spec


def _decode_parts(payload: np.ndarray, spec, refs: list[T.TileRef], shapes: list, settings: StreamSettings,
                  pad_n: int, jobs: int | None) -> tuple[list, list]:
    """(colour planes, extra planes) per image of a stream coded in parts (header's "parts": spec)."""
    parts = seed_parts(refs)
    check_parts_field(spec, pad_n)
    if len(spec) != len(parts) or sum(n for n, _ in spec) != len(payload):
        raise BadFileError("corrupt header: the parts do not match the images and the payload")
    extra_shapes = [tuple(s[1]) for s in shapes if s[1] is not None]
    items, at = [], 0
    for k, (part, (n_words, n_strip)) in enumerate(zip(parts, spec)):
        block_shapes = [(shapes[refs[i].image][0][0], refs[i].h, refs[i].w) for i in part]
        items.append((payload[at:at + n_words], n_strip, pad_n, block_shapes, extra_shapes if k == 0 else [],
                      settings.seed, k))
        at += n_words
    jobs = _part_jobs(parts, refs, jobs)
    colors = [np.zeros(s[0], dtype=np.uint8) if s[0][0] else None for s in shapes]
    extras: list[np.ndarray | None] = [None] * len(shapes)
    for k, (part, (blocks, ex)) in enumerate(zip(parts, workers.run(_pop_part, items, jobs))):
        for i, blk in zip(part, blocks):
            r = refs[i]
            colors[r.image][:, r.y0:r.y0 + r.h, r.x0:r.x0 + r.w] = blk
        if k == 0:
            it = iter(ex)
            extras = [next(it) if s[1] is not None else None for s in shapes]
    return colors, extras


def need_bits(refs: list[T.TileRef], channels: list[int], size: int, deficit: float) -> float:
    """Bits a batch of these tiles may pop before it pushes any back: the model's deficit on every
    dim and at most FILL_BITS on each latent fill pixel (edge padding, a gray tile's colour planes)."""
    dims = T.MODEL_CHANNELS * size * size
    fill = sum(dims - c * r.h * r.w for r, c in zip(refs, channels))
    return deficit * dims * len(refs) + FILL_BITS * fill


def size_choices(max_batch: int, n_seed: int, end: int) -> int:
    """How many sizes the batch that ends at tile `end` can have ("bits" batching): 1..this."""
    return min(max_batch, end - n_seed)


def size_codec(max_batch: int, n_seed: int, end: int):
    """The signalled size b - 1 of the batch that ends at tile `end`, uniform over its choices."""
    return dist.uniform(size_choices(max_batch, n_seed, end), 1)


def choose_seed_tiles(seed: np.ndarray, model_bits: np.ndarray | None,
                      need_of: Callable[[int], float], margin: float = SEED_MARGIN_BITS) -> np.ndarray:
    """Which tiles ("chosen" seed tiles) go through the seed codec: bool [n].

    seed: the bits the seed codec makes of each tile; model_bits: what the model is expected to
    (NaN: no estimate; None: none at all); need_of(j): the first batch's need if tile j is the
    first model tile. Every tile with seed < model_bits, then, until the seed tiles' bits
    cover the first model tile's need plus `margin`, the tile whose move costs least (seed -
    model_bits; tiles without an estimate after those with one, in tile order), unless that move
    costs more than the first batch would pop beyond the stack: those bits come from the padding,
    which the file stores in full, so they cost what they are and no more."""
    seed = np.asarray(seed, dtype=np.float64)
    n = len(seed)
    model = np.full(n, np.nan) if model_bits is None else np.asarray(model_bits, dtype=np.float64)
    chosen = seed < model  # False where model is NaN
    known = ~np.isnan(model)
    cost = np.where(known, seed - model, np.inf)
    order = iter(np.lexsort((np.arange(n), cost)))  # by cost, NaN (inf) last, ties in tile order
    have = float(np.sum(seed[chosen]))
    while not chosen.all():
        short = need_of(int(np.argmin(chosen))) + margin - have  # argmin: the first model tile
        if short <= 0:
            break
        j = next(i for i in order if not chosen[i])
        if np.isfinite(cost[j]) and cost[j] >= short:  # an unestimated tile's move is taken
            break
        chosen[j] = True
        have += float(seed[j])
    return chosen


def _choice_probs(k_left: int, n_left: int) -> np.ndarray:
    return np.array([[float(n_left - k_left), float(k_left)]])


def push_seed_choice(m: Message, chosen: np.ndarray) -> float:
    """Push the flags of `chosen` (bool [n]) so that pop_seed_choice reads them in tile order, each
    with probability (seed tiles left) / (tiles left); returns their bits (log2 C(n, k) up to the
    coder's rounding; a flag that the counts decide costs nothing and is not coded)."""
    n, bits = len(chosen), 0.0
    left = np.concatenate([np.cumsum(chosen[::-1])[::-1], [0]])  # seed tiles among i..n-1
    for i in reversed(range(n)):
        k_left, n_left = int(left[i]), n - i
        if 0 < k_left < n_left:
            p = _choice_probs(k_left, n_left)
            dist.categorical(p).push(m, np.array([int(chosen[i])]))
            bits += float(dist.categorical_bits(np.array([int(chosen[i])]), p)[0])
    return bits


def pop_seed_choice(m: Message, n: int, k: int) -> np.ndarray:
    """The flags push_seed_choice pushed, for n tiles of which k are seed tiles."""
    chosen = np.zeros(n, dtype=bool)
    for i in range(n):
        n_left = n - i
        if k == 0:
            break
        if k == n_left:
            chosen[i:] = True
            break
        chosen[i] = bool(dist.categorical(_choice_probs(k, n_left)).pop(m)[0])
        k -= int(chosen[i])
    return chosen


def seed_order(chosen: np.ndarray) -> np.ndarray:
    """Tile indices in coding order: the seed tiles, then the model's, each in tile order."""
    return np.concatenate([np.flatnonzero(chosen), np.flatnonzero(~chosen)])


class TileBatchCodec:
    """A batch of tiles: bits-back over the latent fill pixels, then the model codec."""

    def __init__(self, model_codec: TileModelCodec, settings: StreamSettings):
        self.mc = model_codec
        self.size = settings.tile
        self.fill = T.FillCodec(settings.fill_std)

    def _layout(self, knowns: list[np.ndarray]):
        lays = [T.layout(k, self.size) for k in knowns]
        return (np.stack([l[0] for l in lays]), np.stack([l[1] for l in lays]), np.stack([l[2] for l in lays]))

    def push(self, m: Message, knowns: list[np.ndarray], progress=None) -> float:
        tiles, masks, centres = self._layout(knowns)
        full = self.fill.pop(m, tiles, masks, centres)
        self.mc.push(m, full, progress)
        return -self.fill.bits(full, masks, centres)

    def pop(self, m: Message, refs: list[T.TileRef], channels: list[int], progress=None) -> list[np.ndarray]:
        shape = (len(refs), T.MODEL_CHANNELS, self.size, self.size)
        full = self.mc.pop(m, shape, progress)
        if full.min() < 0 or full.max() > 255:
            raise BadFileError("corrupt payload: decoded pixel values out of range")
        knowns = []
        for i, (r, c) in enumerate(zip(refs, channels)):
            blk = full[i, :, :r.h, :r.w] if c == 3 else full[i, T.GRAY_KNOWN_CHANNEL:T.GRAY_KNOWN_CHANNEL + 1, :r.h, :r.w]
            knowns.append(blk.astype(np.uint8))
        _, masks, centres = self._layout(knowns)
        self.fill.push(m, full, masks, centres)
        return knowns


def _ticks(progress, n: int):
    """The codec's progress (one tick per solver step of a batch) in tile-steps."""
    return None if progress is None else (lambda k: progress(k * n))


def check_seed_tiles(settings: StreamSettings, error=ValueError) -> None:
    if settings.seed_tiles not in SEED_TILES:
        raise error(f"unknown seed_tiles {settings.seed_tiles!r}")
    if settings.seed_tiles == "chosen" and (settings.batching != "bits" or settings.n_seed is not None):
        raise error("seed_tiles 'chosen' needs batching 'bits' and no fixed n_seed")
    if settings.seed_context not in SEED_CONTEXTS:
        raise error(f"unknown seed_context {settings.seed_context!r}")
    if settings.seed_context == "image" and settings.seed_tiles != "chosen":
        raise error("seed_context 'image' needs seed_tiles 'chosen'")


def seed_masks(refs: list[T.TileRef], shapes: list[tuple[int, int, int]]) -> list[np.ndarray | None]:
    """Per image (colour shapes (C, H, W)), the pixels of these tiles: bool [H, W], None where the
    image has none of them."""
    masks: list[np.ndarray | None] = [None] * len(shapes)
    for r in refs:
        if masks[r.image] is None:
            masks[r.image] = np.zeros(shapes[r.image][1:], dtype=bool)
        masks[r.image][r.y0:r.y0 + r.h, r.x0:r.x0 + r.w] = True
    return masks


def tile_seed_bits(images: list[StreamImage], refs: list[T.TileRef], settings: StreamSettings) -> np.ndarray:
    """The seed codec's bits for each tile: the tile alone ("tile" context), or its pixels' share of
    the whole image's coding ("image" context: seed_pixel_bits, what seed_push_known makes of them
    whichever other tiles are coded)."""
    if settings.seed_context == "tile":
        return np.array([seed_bits(T.known_block(images[r.image].color, r), settings.seed) for r in refs])
    pix = {i: seed_pixel_bits(images[i].color, settings.seed) for i in sorted({r.image for r in refs})}
    return np.array([float(pix[r.image][r.y0:r.y0 + r.h, r.x0:r.x0 + r.w].sum()) for r in refs])


def seed_file_tile_bits(images: list[StreamImage], refs: list[T.TileRef], version: int) -> np.ndarray:
    """The bits of each tile as its pixels' share of the seed codec's file (seed_only_settings: each
    image in blocks of up to 1024x1024, each coded alone; seed_pixel_bits of each block). Where an
    image fits in one block these are tile_seed_bits's in the image's context; where it does not,
    close to them (each block's statistics start afresh). Within seed_codec.shared_analyses() after
    that file was encoded, no block is analysed again."""
    shapes = [im.color_shape for im in images]
    maps: dict[int, np.ndarray] = {}
    for b in T.plan_tiles(shapes, seed_only_settings(shapes).tile):
        pix = maps.setdefault(b.image, np.zeros(shapes[b.image][1:]))
        pix[b.y0:b.y0 + b.h, b.x0:b.x0 + b.w] = seed_pixel_bits(T.known_block(images[b.image].color, b), version)
    return np.array([float(maps[r.image][r.y0:r.y0 + r.h, r.x0:r.x0 + r.w].sum()) for r in refs])


def encode(images: list[StreamImage], codec: TileModelCodec, settings: StreamSettings,
           progress: Callable[[int], None] | None = None, track: bool = False,
           tile_bits: np.ndarray | None = None,
           seed_tile_bits: np.ndarray | None = None, jobs: int | None = None) -> tuple[np.ndarray, dict, StreamReport]:
    """Returns (payload words, header fields needed to decode, report).

    jobs: processes for a stream coded in parts (in_parts; None: workers.auto_jobs); the same bytes
    whatever it is.

    tile_bits: with seed_tiles "chosen", the bits the model is expected to take for each tile
    (T.plan_tiles order; NaN where unknown), which steers the choice of seed tiles (without it the
    choice follows the need alone); seed_tile_bits: tile_seed_bits for this stream, where the caller
    has computed them."""
    if settings.batching not in BATCHINGS:
        raise ValueError(f"unknown batching {settings.batching!r}")
    check_seed_tiles(settings)
    refs = T.plan_tiles([im.color_shape for im in images], settings.tile)
    chans = [images[r.image].color.shape[0] for r in refs]
    n = len(refs)
    n_seed, pad_n = resolve(settings, codec, n)
    chosen = None
    if settings.seed_tiles == "chosen":
        deficit = codec.deficit_bits_per_dim()
        own = tile_seed_bits(images, refs, settings) if seed_tile_bits is None else np.asarray(seed_tile_bits)
        chosen = choose_seed_tiles(own, tile_bits,
                                   lambda j: need_bits([refs[j]], [chans[j]], settings.tile, deficit))
        order = seed_order(chosen)
        refs, chans, n_seed = [refs[i] for i in order], [chans[i] for i in order], int(chosen.sum())
    rep = StreamReport(n_tiles=n, pad_words=pad_n)
    if in_parts(settings, n_seed, refs):
        payload, spec = _encode_parts(images, refs, settings, pad_n, jobs, rep)
        rep.n_seed = n
        if progress is not None:
            progress(codec.steps_per_batch() * n)
        rep.predicted_bits = rep.extra_bits + rep.seed_bits
        rep.payload_bits = 32 * len(payload)
        return payload, {"n_seed": n, "pad_words": pad_n, "pad_stripped": 0, "n_tiles": n, "parts": spec}, rep
    pad = padding_words(pad_n)
    m = Message(pad)
    base = m.num_bits()
    deficit = codec.deficit_bits_per_dim()

    def need(s: int, e: int) -> float:
        return need_bits(refs[s:e], chans[s:e], settings.tile, deficit)

    def on_stack() -> int:
        return m.num_bits() - base

    for im in images:
        if im.extra is not None:
            rep.extra_bits += seed_push(m, im.extra, settings.seed)
    i = 0
    if settings.seed_context == "image":  # every image's seed tiles at once, in the image's context
        for im, mask in zip(images, seed_masks(refs[:n_seed], [im.color_shape for im in images])):
            if mask is not None:
                rep.seed_bits += seed_push_known(m, im.color, mask, settings.seed)
        i = n_seed
    while i < n and (i < n_seed if n_seed is not None else need(i, i + 1) > on_stack()):
        blk = T.known_block(images[refs[i].image].color, refs[i])
        rep.seed_bits += seed_push(m, blk, settings.seed)
        i += 1
    rep.n_seed = n_seed = i
    if progress is not None:
        progress(codec.steps_per_batch() * n_seed)
    bbc = TileBatchCodec(codec, settings)
    codec.bits_log = [] if track else None
    fixed = T.batch_schedule(n, n_seed, settings.growth, settings.max_batch) if settings.batching == "growth" else None
    s = n_seed
    while s < n:
        room = on_stack()
        if fixed is not None:
            e = fixed[len(rep.batches)][1]
        else:
            e = s + 1
            while e < min(n, s + settings.max_batch) and need(s, e + 1) <= room:
                e += 1
        rep.model_bits += bbc.push(m, [T.known_block(images[r.image].color, r) for r in refs[s:e]],
                                   _ticks(progress, e - s))
        if fixed is None:
            size_codec(settings.max_batch, n_seed, e).push(m, np.array([e - s - 1]))
            rep.signal_bits += math.log2(size_choices(settings.max_batch, n_seed, e))
        rep.batches.append((s, e))
        rep.room_bits.append(room)
        s = e
    if chosen is not None:
        rep.signal_bits += push_seed_choice(m, chosen)
    if track:
        rep.model_bits += float(sum(codec.bits_log))
    codec.bits_log = None
    rep.predicted_bits = rep.extra_bits + rep.seed_bits + rep.model_bits + rep.signal_bits

    payload, n_strip = _stored(m, pad)
    rep.pad_consumed_bits = 32 * (pad_n - n_strip)
    rep.payload_bits = 32 * len(payload)
    fields = {"n_seed": n_seed, "pad_words": pad_n, "pad_stripped": n_strip, "n_tiles": n}
    return payload, fields, rep


def decode(payload: np.ndarray, fields: dict, shapes: list[tuple[tuple[int, int, int], tuple[int, int, int] | None]],
           codec: TileModelCodec, settings: StreamSettings, progress: Callable[[int], None] | None = None,
           jobs: int | None = None) -> list[StreamImage]:
    """shapes: per image ((Cc, H, W) of colour planes or (0,0,0), (Ce, H, W) of extra planes or None).
    jobs: processes for a stream coded in parts (None: workers.auto_jobs)."""
    refs = T.plan_tiles([s[0] for s in shapes], settings.tile)
    n_seed, pad_n = int(fields["n_seed"]), int(fields["pad_words"])
    n_strip = int(fields["pad_stripped"])
    if len(refs) != int(fields["n_tiles"]) or not (0 <= n_seed <= len(refs)) or not (0 <= n_strip <= pad_n):
        raise BadFileError("corrupt header: tile counts do not match the image sizes")
    if settings.batching not in BATCHINGS:
        raise BadFileError(f"corrupt header: unknown batching {settings.batching!r}")
    if settings.seed not in SEED_VERSIONS:
        raise BadFileError(f"corrupt header: unknown seed codec version {settings.seed!r}")
    check_seed_tiles(settings, lambda msg: BadFileError(f"corrupt header: {msg}"))
    if "parts" in fields:
        if not in_parts(settings, n_seed, refs):
            raise BadFileError("corrupt header: parts in a stream that is not coded in parts")
        colors, extras = _decode_parts(np.asarray(payload), fields["parts"], refs, shapes, settings, pad_n, jobs)
        if progress is not None:
            progress(codec.steps_per_batch() * n_seed)
        return [StreamImage(c, x) for c, x in zip(colors, extras)]
    pad = padding_words(pad_n)
    m = _reopen(payload, pad, n_strip, "the stream")
    if settings.seed_tiles == "chosen":
        refs = [refs[i] for i in seed_order(pop_seed_choice(m, len(refs), n_seed))]
    fixed = T.batch_schedule(len(refs), n_seed, settings.growth, settings.max_batch) \
        if settings.batching == "growth" else None
    colors = [np.zeros(s[0], dtype=np.uint8) if s[0][0] else None for s in shapes]
    bbc = TileBatchCodec(codec, settings)
    e = len(refs)
    while e > n_seed:
        if fixed is not None:
            s = fixed.pop()[0]
        else:
            s = e - 1 - int(size_codec(settings.max_batch, n_seed, e).pop(m)[0])
        chans = [shapes[r.image][0][0] for r in refs[s:e]]
        knowns = bbc.pop(m, refs[s:e], chans, _ticks(progress, e - s))
        for r, k in zip(refs[s:e], knowns):
            colors[r.image][:, r.y0:r.y0 + r.h, r.x0:r.x0 + r.w] = k
        e = s
    if settings.seed_context == "image":  # the model's tiles are in: the seed tiles in their context
        masks = seed_masks(refs[:n_seed], [s[0] for s in shapes])
        for i in reversed(range(len(shapes))):
            if masks[i] is not None:
                colors[i] = seed_pop_known(m, colors[i], masks[i], settings.seed)
    else:
        for r in reversed(refs[:n_seed]):
            c = shapes[r.image][0][0]
            blk = seed_codec((c, r.h, r.w), settings.seed).pop(m)
            colors[r.image][:, r.y0:r.y0 + r.h, r.x0:r.x0 + r.w] = blk
    if progress is not None:
        progress(codec.steps_per_batch() * n_seed)
    extras: list[np.ndarray | None] = [None] * len(shapes)
    for i in reversed(range(len(shapes))):
        if shapes[i][1] is not None:
            extras[i] = seed_codec(tuple(shapes[i][1]), settings.seed).pop(m)
    _check_unwound(m, pad, "the stream")
    return [StreamImage(c, x) for c, x in zip(colors, extras)]
