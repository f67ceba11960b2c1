"""The stream (coding/stream.py): seed tiles, batch sizes and the padding, with a fake tile codec
whose deficit and rates are known exactly, so that every bit on the stack can be accounted for."""
from __future__ import annotations

import math

import numpy as np
import pytest

from scoreflow_codec.coding import distributions as dist
from scoreflow_codec.coding import stream
from scoreflow_codec.coding import tiles as T
from scoreflow_codec.coding.ans import Message
from scoreflow_codec.coding.seed_codec import LATEST, _ls_mode_bits, _plane_mode_bits, seed_bits
from scoreflow_codec.coding.stream import StreamImage, StreamSettings

DEFICIT = 6  # bits per dim the fake codec pops before it pushes


class FakeBitsBackCodec:
    """Bits-back with a latent z uniform on 2^DEFICIT per dim, independent of x: pop z, push x with a
    fixed Laplace-like categorical around 128, push z. Net cost: -log2 p(x); deficit: DEFICIT bits/dim."""

    bits_log = None
    probs = np.exp(-np.abs(np.arange(256) - 128) / 3.0)

    def __init__(self):
        self.net_bits = 0.0  # of every tile pushed: exactly -log2 p(x) (the z pop and push cancel)

    def _x(self, n):
        return dist.categorical(np.broadcast_to(self.probs, (n, 256)))

    def push(self, m: Message, tiles: np.ndarray, progress=None) -> None:
        n = tiles.size
        z = dist.uniform(1 << DEFICIT, n).pop(m)
        self._x(n).push(m, tiles.reshape(-1))
        self.net_bits += float(dist.categorical_bits(tiles.reshape(-1), np.broadcast_to(self.probs, (n, 256))).sum())
        dist.uniform(1 << DEFICIT, n).push(m, z)
        if progress:
            progress(1)

    def pop(self, m: Message, shape: tuple, progress=None) -> np.ndarray:
        n = int(np.prod(shape))
        z = dist.uniform(1 << DEFICIT, n).pop(m)
        x = self._x(n).pop(m)
        dist.uniform(1 << DEFICIT, n).push(m, z)
        if progress:
            progress(1)
        return x.reshape(shape)

    def deficit_bits_per_dim(self) -> float:
        return DEFICIT

    def steps_per_batch(self) -> int:
        return 1



def _images(seed=0):
    """A flat image first (the seed codec codes it in far fewer bits than a fixed count assumes),
    then a noisy one, a gray one with odd edges, and an RGB one with alpha."""
    rng = np.random.default_rng(seed)
    flat = np.full((3, 32, 64), 128, np.uint8)
    flat[:, :, 32:] += rng.integers(0, 2, (3, 32, 32)).astype(np.uint8)
    noisy = (128 + rng.integers(-6, 7, (3, 40, 48))).astype(np.uint8)
    gray = (128 + rng.integers(-3, 4, (1, 21, 30))).astype(np.uint8)
    rgba = (128 + rng.integers(-4, 5, (3, 16, 24))).astype(np.uint8)
    alpha = np.full((1, 16, 24), 255, np.uint8)
    alpha[0, 5:9, 3:20] = 0
    return [StreamImage(flat, None), StreamImage(noisy, None), StreamImage(gray, None), StreamImage(rgba, alpha)]


def _round_trip(images, settings, codec=None):
    codec = codec or FakeBitsBackCodec()
    payload, fields, rep = stream.encode(images, codec, settings)
    shapes = [(im.color_shape, None if im.extra is None else im.extra.shape) for im in images]
    back = stream.decode(payload, fields, shapes, codec, settings)
    for a, b in zip(images, back):
        assert np.array_equal(a.color, b.color) and (a.extra is None or np.array_equal(a.extra, b.extra))
    return payload, fields, rep


def test_bits_batching_never_reaches_the_padding_where_growth_does():
    """On a flat first image the fixed seed count leaves the first batches short of bits: they pop
    padding, which the file then stores. Batches sized by the bits on the stack pop none of it."""
    imgs = _images()
    _, _, growth = _round_trip(imgs, StreamSettings(tile=8, batching="growth"))
    _, fields, bits = _round_trip(imgs, StreamSettings(tile=8, batching="bits"))
    # <= 64: pushes rewrite the padding's top word or two (the ANS head), pops never go below
    assert growth.pad_consumed_bits > 320
    assert bits.pad_consumed_bits <= 64 and fields["pad_stripped"] >= fields["pad_words"] - 2
    assert bits.payload_bits < growth.payload_bits


@pytest.mark.parametrize("batching", stream.BATCHINGS)
def test_real_size_is_the_predicted_codelength(batching):
    """Payload = extra + seed + model net + signalled sizes (+ padding popped, + the ANS head)."""
    imgs = _images(1)
    codec = FakeBitsBackCodec()
    _, _, rep = stream.encode(imgs, codec, StreamSettings(tile=8, batching=batching))
    # rep.model_bits holds what the latent fill pixels give back (without `track`, no model log)
    predicted = rep.extra_bits + rep.seed_bits + codec.net_bits + rep.model_bits + rep.signal_bits
    assert (batching == "bits") == (rep.signal_bits > 0)
    assert rep.pad_consumed_bits <= 64 or batching == "growth"
    assert abs(rep.payload_bits - rep.pad_consumed_bits - predicted) < 64 + 1e-4 * predicted, \
        (rep.payload_bits, rep.pad_consumed_bits, predicted)


def test_batch_sizes_follow_the_bits_on_the_stack():
    """Each batch is the largest (up to max_batch) whose need fits on the stack, and at least one
    tile; the seed ends as soon as the stack holds the first batch's need."""
    imgs = _images(2)
    st = StreamSettings(tile=8, batching="bits", max_batch=5)
    _, _, rep = _round_trip(imgs, st)
    refs = T.plan_tiles([im.color_shape for im in imgs], 8)
    chans = [imgs[r.image].color.shape[0] for r in refs]

    def need(s, e):
        return stream.need_bits(refs[s:e], chans[s:e], 8, DEFICIT)

    seed_room = rep.extra_bits + rep.seed_bits
    assert rep.n_seed >= 1 and need(rep.n_seed, rep.n_seed + 1) <= seed_room + 64
    assert rep.batches[0][0] == rep.n_seed and rep.batches[-1][1] == len(refs)
    assert max(e - s for s, e in rep.batches) == 5
    for (s, e), room in zip(rep.batches, rep.room_bits):
        assert e - s == 1 or need(s, e) <= room
        assert e == len(refs) or e - s == 5 or need(s, e + 1) > room


def test_sizes_cost_what_they_say():
    """The signalled size of the batch ending at tile e is uniform on min(max_batch, e - n_seed)."""
    imgs = _images(3)
    _, _, rep = _round_trip(imgs, StreamSettings(tile=8, batching="bits", max_batch=4))
    assert rep.signal_bits == pytest.approx(sum(math.log2(min(4, e - rep.n_seed)) for _, e in rep.batches))


def test_fixed_seed_count_is_kept():
    _, fields, rep = _round_trip(_images(4), StreamSettings(tile=8, batching="bits", n_seed=2))
    assert fields["n_seed"] == rep.n_seed == 2


def test_unknown_batching_is_refused():
    with pytest.raises(ValueError, match="batching"):
        stream.encode(_images(), FakeBitsBackCodec(), StreamSettings(tile=8, batching="fixed"))


def test_seed_only_stream_codes_whole_images_for_their_seed_bits():
    """seed_only_settings: one tile per image (the largest side), the seed codec alone (the model is
    never called), the payload = the seed codec's predicted bits plus at most the ANS head."""
    imgs = _images(5)
    st = stream.seed_only_settings([im.color_shape for im in imgs])
    assert st.tile == 64 and st.max_batch == StreamSettings.max_batch  # the default up to 64px: left out of headers
    assert stream.seed_only_settings([(3, 65, 20)]).max_batch == 1  # above: 1 (max_batch x tile^2 stays small)
    codec = FakeBitsBackCodec()
    _, fields, rep = _round_trip(imgs, st, codec)
    assert fields["n_seed"] == fields["n_tiles"] == len(imgs) and rep.batches == []
    assert codec.net_bits == 0  # the model codec coded nothing
    whole = sum(seed_bits(im.color) for im in imgs)
    assert rep.seed_bits == pytest.approx(whole)
    assert 0 <= rep.payload_bits - (rep.extra_bits + rep.seed_bits) < 64 + 32


def test_seed_only_tiles_stop_at_the_format_limit():
    st = stream.seed_only_settings([(3, 1500, 700), (0, 0, 0), (1, 5, 3)])
    assert st.tile == stream.SEED_ONLY_MAX_TILE == 1024
    assert st.n_seed == 2 + 1  # 1500x700 in two tiles, the gray 5x3 in one
    assert stream.seed_only_settings([(1, 2, 3)]).tile == 4  # the format's smallest tile


def test_seed_file_tile_bits_are_the_tiles_shares_of_the_seed_file(monkeypatch):
    """seed_file_tile_bits: each tile's share of the seed codec's file, whose blocks (seed_only_settings:
    up to 1024x1024) are coded alone. A 10x1030 image is two blocks (1024 and 6 wide): the shares are
    those of each block's own pixel bits, and after the file's pushes in shared_analyses() no block
    is analysed again; an image in one block gets tile_seed_bits's shares in the image's context."""
    from scoreflow_codec.coding import seed_codec as sc
    from scoreflow_codec.coding.seed_codec import LATEST, seed_pixel_bits, seed_push

    rng = np.random.default_rng(3)
    wide = np.clip(np.cumsum(rng.integers(-3, 4, (3, 10, 1030)), axis=2) + 128, 0, 255).astype(np.uint8)
    small = _images(1)[0].color
    imgs = [StreamImage(wide, None), StreamImage(small, None)]
    refs = T.plan_tiles([im.color_shape for im in imgs], 32)
    expect_wide = np.concatenate([seed_pixel_bits(wide[:, :, :1024]), seed_pixel_bits(wide[:, :, 1024:])], axis=1)
    expect = [expect_wide, seed_pixel_bits(small)]
    st = stream.seed_only_settings([im.color_shape for im in imgs])
    blocks = T.plan_tiles([im.color_shape for im in imgs], st.tile)
    assert st.tile == 1024 and len(blocks) == 3
    with sc.shared_analyses():
        for b in blocks:  # what the seed codec's file pushes
            seed_push(Message(), T.known_block(imgs[b.image].color, b))
        monkeypatch.setattr(sc, "_analyse", lambda *a, **k: pytest.fail("analysed again"))
        got = stream.seed_file_tile_bits(imgs, refs, LATEST)
    want = [float(expect[r.image][r.y0:r.y0 + r.h, r.x0:r.x0 + r.w].sum()) for r in refs]
    assert np.array_equal(got, want)
    monkeypatch.undo()
    one = [imgs[1]]
    refs = T.plan_tiles([small.shape], 8)
    ctx = stream.tile_seed_bits(one, refs, StreamSettings(tile=8, seed_context="image"))
    assert np.array_equal(stream.seed_file_tile_bits(one, refs, LATEST), ctx)


def test_choose_seed_tiles():
    """Every tile the seed codec codes cheaper than the model's estimate, then, until the first model
    tile's need is covered, the cheapest moves; tiles without an estimate last, in tile order."""
    seed = np.array([100.0, 50.0, 80.0, 60.0, 90.0])
    model = np.array([90.0, 70.0, 60.0, np.nan, 95.0])

    def need(_j):
        return 0.0

    assert stream.choose_seed_tiles(seed, model, need, margin=0).tolist() == [False, True, False, False, True]
    # more need: the next cheapest moves are tile 0 (+10) then tile 2 (+20), the unestimated tile 3 last
    assert stream.choose_seed_tiles(seed, model, lambda j: 160.0, margin=0).tolist() == [True, True, False, False, True]
    assert stream.choose_seed_tiles(seed, model, lambda j: 300.0, margin=0).tolist() == [True, True, True, False, True]
    assert stream.choose_seed_tiles(seed, model, lambda j: 330.0, margin=0).tolist() == [True] * 5
    # the need of the first model tile (here tile 2 after the cheaper ones went) is what counts
    assert stream.choose_seed_tiles(seed, model, lambda j: 1e9 if j == 0 else 0.0, margin=0).tolist() == \
        [True, True, False, False, True]
    # no estimates at all: the first tiles, as "first" takes them
    assert stream.choose_seed_tiles(seed, None, lambda j: 120.0, margin=0).tolist() == [True, True, False, False, False]
    # a move dearer than what the first batch would pop from the padding is not made: with 140 on
    # the stack, a need of 145 leaves 5 short, and tile 0's move costs 10
    assert stream.choose_seed_tiles(seed, model, lambda j: 145.0, margin=0).tolist() == [False, True, False, False, True]
    assert stream.choose_seed_tiles(seed, model, lambda j: 151.0, margin=0).tolist() == [True, True, False, False, True]


@pytest.mark.parametrize("n,k", [(1, 0), (1, 1), (7, 0), (7, 7), (32, 4), (96, 50)])
def test_seed_choice_flags_round_trip_and_cost_log2_binomial(n, k):
    rng = np.random.default_rng(n * 100 + k)
    chosen = np.zeros(n, dtype=bool)
    chosen[rng.choice(n, k, replace=False)] = True
    m = Message(np.array([7, 1], dtype=np.uint32))
    before = m.num_bits()
    bits = stream.push_seed_choice(m, chosen)
    assert bits == pytest.approx(math.log2(math.comb(n, k)), abs=1e-3 * n + 1e-9)
    assert abs(m.num_bits() - before - bits) <= 32 + 1e-9
    assert np.array_equal(stream.pop_seed_choice(m, n, k), chosen)
    assert m.words().tolist() == [7, 1]
    assert stream.seed_order(chosen).tolist() == np.flatnonzero(chosen).tolist() + np.flatnonzero(~chosen).tolist()


def _seed_cheaper_on(imgs, cheap):
    """(tiles, their seed codec bits, an estimate of the model's bits): the model far cheaper than
    the seed codec everywhere but on the tiles `cheap`."""
    refs = T.plan_tiles([im.color_shape for im in imgs], 8)
    own = np.array([seed_bits(T.known_block(imgs[r.image].color, r)) for r in refs])
    est = own - 1000.0
    est[cheap] = own[cheap] + 1.0
    return refs, own, est


def _chosen_stream(imgs, st, own, est, cheap):
    """Encode with seed tiles "chosen" under the estimate est; check the choice (the cheap tiles are
    seed tiles, not all are), the round trip and that the size is the predicted codelength."""
    refs = T.plan_tiles([im.color_shape for im in imgs], st.tile)
    codec = FakeBitsBackCodec()
    payload, fields, rep = stream.encode(imgs, codec, st, tile_bits=est)
    chosen = stream.choose_seed_tiles(own, est, lambda j: stream.need_bits([refs[j]], [imgs[refs[j].image].color.shape[0]], 8, DEFICIT))
    assert chosen[cheap].all() and fields["n_seed"] == rep.n_seed == chosen.sum() < len(refs)
    shapes = [(im.color_shape, None if im.extra is None else im.extra.shape) for im in imgs]
    back = stream.decode(payload, fields, shapes, FakeBitsBackCodec(), st)
    assert all(np.array_equal(a.color, b.color) for a, b in zip(imgs, back))
    assert np.array_equal(back[3].extra, imgs[3].extra)
    flags = math.log2(math.comb(len(refs), int(chosen.sum())))
    sizes = sum(math.log2(min(st.max_batch, e - rep.n_seed)) for _, e in rep.batches)
    assert rep.signal_bits == pytest.approx(sizes + flags, abs=0.05)
    predicted = rep.extra_bits + rep.seed_bits + codec.net_bits + rep.model_bits + rep.signal_bits
    assert rep.pad_consumed_bits <= 64
    assert abs(rep.payload_bits - rep.pad_consumed_bits - predicted) < 64 + 1e-4 * predicted
    return payload, fields, rep, chosen, shapes


def test_chosen_seed_tiles_round_trip_and_cost_what_they_say():
    """seed_tiles "chosen": the tiles the estimate says the seed codec codes cheaper become seed
    tiles wherever they lie, the stream decodes, and its size is the predicted codelength."""
    imgs = _images(6)
    st = StreamSettings(tile=8, batching="bits", seed_tiles="chosen")
    cheap = [5, 78]  # two tiles of the 80, in the middle and at the end
    refs, own, est = _seed_cheaper_on(imgs, cheap)
    assert len(refs) == 80
    payload, fields, _, _, shapes = _chosen_stream(imgs, st, own, est, cheap)
    # decoded with "first" (the header's seed_tiles lost), the same payload does not come back
    with pytest.raises(Exception):
        wrong = stream.decode(payload, fields, shapes, FakeBitsBackCodec(), StreamSettings(tile=8, batching="bits"))
        assert all(np.array_equal(a.color, b.color) for a, b in zip(imgs, wrong))


def test_seed_tiles_in_the_image_context_round_trip_and_cost_what_they_say():
    """seed_context "image": the chosen seed tiles of each image are coded at once by the seed codec
    over the whole image, the model's tiles (decoded before them) known: the stream decodes, its size
    is the predicted codelength, the seed tiles cost at most their pixels' share of the whole-image
    coding (tile_seed_bits) plus each image's plane flags, and that share is below the same tiles
    coded each alone."""
    imgs = _images(6)
    cheap = [5, 30, 65, 78]  # the flat image's, the noisy image's, the grey image's, the last (RGBA)
    refs = T.plan_tiles([im.color_shape for im in imgs], 8)
    own = {}
    for context in ("tile", "image"):
        st = StreamSettings(tile=8, batching="bits", seed_tiles="chosen", seed_context=context)
        own[context] = stream.tile_seed_bits(imgs, refs, st)
        est = own[context] - 1000.0
        est[cheap] = own[context][cheap] + 1.0
        payload, fields, rep, chosen, shapes = _chosen_stream(imgs, st, own[context], est, cheap)
    seed_images = {refs[i].image: imgs[refs[i].image].color.shape[0] for i in np.flatnonzero(chosen)}
    flags = sum(_ls_mode_bits(LATEST) + c + (c - 1) * _plane_mode_bits(LATEST) for c in seed_images.values())
    assert rep.seed_bits <= own["image"][chosen].sum() + flags + 1e-6
    assert own["image"][chosen].sum() < own["tile"][chosen].sum()
    # decoded as "tile" (the header's seed_context lost), the same payload does not come back
    with pytest.raises(Exception):
        wrong = stream.decode(payload, fields, shapes, FakeBitsBackCodec(),
                              StreamSettings(tile=8, batching="bits", seed_tiles="chosen"))
        assert all(np.array_equal(a.color, b.color) for a, b in zip(imgs, wrong))


def test_chosen_seed_tiles_need_bits_batching():
    for st in (StreamSettings(tile=8, batching="growth", seed_tiles="chosen"),
               StreamSettings(tile=8, batching="bits", n_seed=2, seed_tiles="chosen"),
               StreamSettings(tile=8, seed_tiles="some")):
        with pytest.raises(ValueError, match="seed_tiles"):
            stream.encode(_images(), FakeBitsBackCodec(), st)
    for st in (StreamSettings(tile=8, seed_context="image"), StreamSettings(tile=8, seed_tiles="chosen", seed_context="x")):
        with pytest.raises(ValueError, match="seed_context"):
            stream.encode(_images(), FakeBitsBackCodec(), st)


def _golden_stream(name: str, st: StreamSettings, n_seed: int, est: np.ndarray) -> None:
    """tests/golden/<name>: a stream of _images(6) with the fake codec, 80 tiles: it decodes, and the
    encoder, given the same estimate, writes the same words (st names the seed codec's version the
    file was written with: version 5 for both; 0.9.17 writes version 6)."""
    from pathlib import Path

    imgs = _images(6)
    words = np.frombuffer((Path(__file__).parent / "golden" / name).read_bytes(), dtype="<u4")
    fields = {"n_seed": n_seed, "pad_words": 2001, "pad_stripped": 2000, "n_tiles": 80}
    shapes = [(im.color_shape, None if im.extra is None else im.extra.shape) for im in imgs]
    back = stream.decode(words.astype(np.uint32), fields, shapes, FakeBitsBackCodec(), st)
    assert all(np.array_equal(a.color, b.color) for a, b in zip(imgs, back))
    assert np.array_equal(back[3].extra, imgs[3].extra)
    payload, again, _ = stream.encode(imgs, FakeBitsBackCodec(), st, tile_bits=est)
    assert again == fields and np.array_equal(payload, words)


def test_a_chosen_stream_written_by_0_9_14_decodes():
    """tests/golden/stream-chosen.bin: the stream of test_chosen_seed_tiles_round_trip_and_cost_what_
    they_say as 0.9.14 wrote it (the fake codec, seed tiles 5 and 78 of 80): its choice flags and
    tile order must keep decoding as they did, and the encoder must keep writing the same words."""
    _, _, est = _seed_cheaper_on(_images(6), [5, 78])
    _golden_stream("stream-chosen.bin", StreamSettings(tile=8, batching="bits", seed_tiles="chosen", seed=5), 2, est)


def test_a_stream_in_the_image_context_written_by_0_9_15_decodes():
    """tests/golden/stream-context.bin: the stream of test_seed_tiles_in_the_image_context_round_
    trip_and_cost_what_they_say as 0.9.15 wrote it (the fake codec, seed tiles 5, 30 and 78 of 80,
    each image's coded at once by seed_push_known): it must keep decoding as it did, and the encoder
    must keep writing the same words."""
    imgs = _images(6)
    st = StreamSettings(tile=8, batching="bits", seed_tiles="chosen", seed_context="image", seed=5)
    own = stream.tile_seed_bits(imgs, T.plan_tiles([im.color_shape for im in imgs], 8), st)
    est = own - 1000.0
    est[[5, 30, 78]] = own[[5, 30, 78]] + 1.0
    _golden_stream("stream-context.bin", st, 3, est)


# --- parts: a seed-only stream in independent ANS stacks (0.9.26) ---------------------------------
def _refs(*sizes):
    """One tile per (h, w), each its own image."""
    return [T.TileRef(i, 0, 0, h, w) for i, (h, w) in enumerate(sizes)]


def test_seed_parts_start_a_part_after_one_that_holds_part_pixels():
    assert stream.PART_PIXELS == 1 << 18
    assert stream.seed_parts(_refs((512, 768))) == [[0]]  # a Kodak image: one part
    assert stream.seed_parts(_refs((512, 512), (1, 1))) == [[0], [1]]  # 2**18 pixels fill a part
    assert stream.seed_parts(_refs((511, 512), (1, 1))) == [[0, 1]]  # one pixel row short of it
    assert stream.seed_parts(_refs(*[(32, 32)] * 300)) == [list(range(256)), list(range(256, 300))]
    refs = T.plan_tiles([(3, 3000, 4000)], stream.seed_only_settings([(3, 3000, 4000)]).tile)
    assert stream.seed_parts(refs) == [[i] for i in range(12)]  # a 12 Mpix photograph's 1024px tiles


def test_parts_only_where_every_tile_is_a_seed_tile_coded_alone():
    refs = _refs((512, 512), (8, 8))
    assert stream.in_parts(StreamSettings(tile=512, n_seed=2), 2, refs)
    assert not stream.in_parts(StreamSettings(tile=512, n_seed=2), 1, refs)  # a tile through the model
    assert not stream.in_parts(StreamSettings(tile=512, n_seed=2), None, refs)
    assert not stream.in_parts(StreamSettings(tile=512, seed_context="image", seed_tiles="chosen"), 2, refs)
    assert not stream.in_parts(StreamSettings(tile=512, n_seed=1), 1, refs[:1])  # one part: one stack


def _parts_round_trip(imgs, st, jobs):
    codec = FakeBitsBackCodec()
    payload, fields, rep = stream.encode(imgs, codec, st, jobs=jobs)
    shapes = [(im.color_shape, None if im.extra is None else im.extra.shape) for im in imgs]
    for j in (1, 2):
        back = stream.decode(payload, fields, shapes, codec, st, jobs=j)
        for a, b in zip(imgs, back):
            assert np.array_equal(a.color, b.color) and (a.extra is None or np.array_equal(a.extra, b.extra))
    assert codec.net_bits == 0
    return payload, fields, rep, shapes


def test_a_seed_only_stream_in_parts_round_trips_the_same_whatever_the_processes(monkeypatch):
    """PART_PIXELS made small: _images(5)'s four tiles (2048, 1920, 630 and 384 pixels) make the parts
    [0], [1], [2, 3]. The same words with one process or two; each part decodes alone (the extra
    planes in the first); its size is the seed codec's bits of its tiles plus at most the ANS head."""
    monkeypatch.setattr(stream, "PART_PIXELS", 1024)
    imgs = _images(5)
    st = stream.seed_only_settings([im.color_shape for im in imgs])
    payload, fields, rep, shapes = _parts_round_trip(imgs, st, 2)
    assert np.array_equal(stream.encode(imgs, FakeBitsBackCodec(), st, jobs=1)[0], payload)
    assert fields["n_seed"] == fields["n_tiles"] == 4 and len(fields["parts"]) == 3
    assert sum(n for n, _ in fields["parts"]) == len(payload)
    assert rep.seed_bits == pytest.approx(sum(seed_bits(im.color) for im in imgs))
    assert rep.extra_bits == pytest.approx(seed_bits(imgs[3].extra))
    at = 0
    for k, ((n, strip), tiles) in enumerate(zip(fields["parts"], [[0], [1], [2, 3]])):
        blocks, extras = stream._pop_part(payload[at:at + n], strip, fields["pad_words"],
                                          [imgs[i].color_shape for i in tiles],
                                          [imgs[3].extra.shape] if k == 0 else [], st.seed, k)
        assert all(np.array_equal(b, imgs[i].color) for b, i in zip(blocks, tiles))
        assert len(extras) == (k == 0) and (k or np.array_equal(extras[0], imgs[3].extra))
        bits = sum(seed_bits(imgs[i].color) for i in tiles) + (seed_bits(imgs[3].extra) if k == 0 else 0)
        assert 0 <= 32 * (n + strip - fields["pad_words"]) - bits < 64 + 32
        at += n


def test_a_stream_in_parts_is_coded_at_the_callers_effort_in_every_process(monkeypatch):
    """The parts' processes code at the effort of the caller's scope (seed_codec.effort): the same words
    with one process or two, each part's bits the seed codec's at that effort. On these photograph-like
    images effort 1 makes a larger stream than the default."""
    from scoreflow_codec.coding import seed_codec as sc
    from test_seed_codec import _photo_synthetic

    monkeypatch.setattr(stream, "PART_PIXELS", 1024)
    imgs = [StreamImage(_photo_synthetic(40, 36)[:3].copy(), None),
            StreamImage(np.ascontiguousarray(_photo_synthetic(36, 40)[:3, ::-1]), None)]
    st = stream.seed_only_settings([im.color_shape for im in imgs])
    by_level = {}
    for level in (1, 3):
        with sc.effort(level):
            payload, fields, rep, shapes = _parts_round_trip(imgs, st, 2)
            assert np.array_equal(stream.encode(imgs, FakeBitsBackCodec(), st, jobs=1)[0], payload)
            assert rep.seed_bits == pytest.approx(sum(seed_bits(im.color) for im in imgs))
        assert len(fields["parts"]) == 2
        by_level[level] = rep.seed_bits
    assert by_level[1] > by_level[3]


def test_a_stream_written_in_one_stack_still_decodes(monkeypatch):
    """Files of 0.9.25 and before are one stack wherever they would be in parts now: without "parts"
    in the header the decoder pops them as one."""
    imgs = _images(5)
    st = stream.seed_only_settings([im.color_shape for im in imgs])
    payload, fields, _ = stream.encode(imgs, FakeBitsBackCodec(), st)  # 4,982 pixels: one part
    assert "parts" not in fields
    monkeypatch.setattr(stream, "PART_PIXELS", 1024)
    assert stream.in_parts(st, fields["n_seed"], T.plan_tiles([im.color_shape for im in imgs], st.tile))
    shapes = [(im.color_shape, None if im.extra is None else im.extra.shape) for im in imgs]
    back = stream.decode(payload, fields, shapes, FakeBitsBackCodec(), st)
    assert all(np.array_equal(a.color, b.color) for a, b in zip(imgs, back))


def test_bad_parts_are_refused(monkeypatch):
    from scoreflow_codec.errors import BadFileError

    monkeypatch.setattr(stream, "PART_PIXELS", 1024)
    imgs = _images(5)
    st = stream.seed_only_settings([im.color_shape for im in imgs])
    payload, fields, _, shapes = _parts_round_trip(imgs, st, 1)
    (a, sa), (b, sb), (c, sc_) = fields["parts"]
    for parts, why in (([[a + b, sa], [c, sc_]], "do not match"),               # two parts for three
                       ([[a - 1, sa], [b + 1, sb], [c, sc_]], "part"),           # a word moved across
                       ([[a, sa], [b, sb], [c + 1, sc_]], "do not match"),       # more words than the payload
                       ([[a, sa], [b, sb], [c, fields["pad_words"] + 1]], "bad list"),
                       ([[a, sa], [b, sb], [c, -1]], "bad list"), ([[a, sa], [b, sb], [c]], "bad list"),
                       ([[a, sa], [b, sb], [float(c), sc_]], "bad list"), ("3", "bad list"), ([[a, True]] * 3, "bad list")):
        with pytest.raises(BadFileError, match=why):
            stream.decode(payload, dict(fields, parts=parts), shapes, FakeBitsBackCodec(), st)
    with pytest.raises(BadFileError, match="not coded in parts"):
        stream.decode(payload, dict(fields, parts=fields["parts"], n_seed=3), shapes, FakeBitsBackCodec(), st)
    with pytest.raises(ValueError, match="jobs"):
        stream.decode(payload, fields, shapes, FakeBitsBackCodec(), st, jobs=0)
    from scoreflow_codec import api
    from scoreflow_codec.errors import UsageError

    for bad in (0, -2, 1.5, True):
        with pytest.raises(UsageError, match="jobs"):
            api.decompress(b"", None, jobs=bad)  # before the bytes are looked at
        with pytest.raises(UsageError, match="jobs"):
            api.compress([], None, fallback="seed", jobs=bad)


def test_parts_coded_in_other_processes_leave_their_pixel_bits_here(monkeypatch):
    """Within shared_analyses(), a file coded in parts by two worker processes leaves each tile's
    seed_pixel_bits in this process's store, as one coded here does: seed_file_tile_bits (compress's
    sample of a large photograph against the file) analyses nothing again, and gets the same bits."""
    from scoreflow_codec.coding import seed_codec as sc

    monkeypatch.setattr(stream, "PART_PIXELS", 1024)
    imgs = _images(5)
    st = stream.seed_only_settings([im.color_shape for im in imgs])
    refs = T.plan_tiles([im.color_shape for im in imgs], 16)
    want = stream.seed_file_tile_bits(imgs, refs, st.seed)
    with sc.shared_analyses():
        stream.encode(imgs, FakeBitsBackCodec(), st, jobs=2)
        monkeypatch.setattr(sc, "_analyse", lambda *a, **k: pytest.fail("analysed again"))
        got = stream.seed_file_tile_bits(imgs, refs, st.seed)
    assert np.array_equal(got, want)
