"""compress(fallback=...): the file is whichever of the model's stream and the classical seed
codec alone (whole images as single tiles) is smaller, and either decodes through the same path.
"both" codes both; "auto" (the CLI's default) skips the model's stream where the model is not
expected to make a smaller file."""
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from scoreflow_codec import api, container, images
from scoreflow_codec.errors import BadFileError, ModelMismatchError, UnsupportedVersionError
from scoreflow_codec.coding.seed_codec import LATEST as LATEST_SEED

from coding_models import gaussian_images, loaded_gaussian

SETTINGS = {"steps": 32}


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    # narrow per-pixel Gaussians around random means: the model codes its own samples at about
    # 5 bits/dim, the seed codec at about 8
    return loaded_gaussian(spread=(0.03, 0.08))


def _in_distribution(model) -> np.ndarray:
    """A 64x64 RGB image of four tiles drawn from the exact Gaussian model: the model codes it
    near its entropy, far below what a classical codec can."""
    t = gaussian_images(model.model, 4, torch.Generator().manual_seed(5))  # [4, 3, 32, 32]
    rows = [np.concatenate(list(t[:2]), 2), np.concatenate(list(t[2:]), 2)]
    return np.ascontiguousarray(np.concatenate(rows, 1).transpose(1, 2, 0))


def _gradient(h=40, w=72) -> np.ndarray:
    """A smooth ramp: a few bits for the seed codec's predictor, hundreds of bytes for the model."""
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 3, y * 5, (x + y) * 2], -1).astype(np.uint8)


def _both(model, arr):
    src = [images.from_array(arr)]
    alone, rep0 = api.compress(src, model, "ode", SETTINGS, fallback="off")
    data, rep = api.compress(src, model, "ode", SETTINGS, fallback="both")
    assert rep0.seed_bytes is None and rep0.model_bytes == len(alone)
    # the model's stream is coded the same way with or without the fallback
    assert rep.model_bytes == len(alone)
    assert len(data) == min(rep.model_bytes, rep.seed_bytes) == rep.file_bytes
    assert np.array_equal(api.decompress(data, model)[0].color, src[0].color)
    return alone, data, rep


def test_the_model_stream_stays_where_it_is_smaller(model):
    alone, data, rep = _both(model, _in_distribution(model))
    assert rep.coded_by == "model" and rep.model_bytes < rep.seed_bytes
    assert data == alone


def test_the_seed_codec_alone_takes_over_where_it_is_smaller(model):
    arr = _gradient()
    alone, data, rep = _both(model, arr)
    assert rep.coded_by == "seed" and rep.seed_bytes < rep.model_bytes
    header, _ = container.unpack(data)
    # one tile for the whole 40x72 image, one tile per batch, and none of the mode's settings
    assert header["stream"] == {"tile": 72, "max_batch": 1, "seed": LATEST_SEED} and header["settings"] == {}
    assert header["fields"]["n_tiles"] == header["fields"]["n_seed"] == 1
    # its codelength is what the report predicted, to the 32-bit word
    assert abs(rep.payload_bits - rep.predicted_bits) <= 32 * 4


@pytest.mark.parametrize("make", [_in_distribution, _gradient], ids=["model-wins", "seed-wins"])
def test_fallback_seed_writes_the_seed_codec_s_file_without_running_the_model(model, make, monkeypatch):
    """fallback="seed": the seed codec's file that "both" compares against, byte for byte, even where
    the model's stream would be smaller; the model is never run (its estimate and its stream raise)."""
    src = [images.from_array(make(model) if make is _in_distribution else make())]
    _, both = api.compress(src, model, "ode", SETTINGS, fallback="both")

    def no_model(*a, **k):
        raise AssertionError("the model ran")

    for name in ("tile_model_bits", "estimate_model_bpd"):
        monkeypatch.setattr(api, name, no_model)
    monkeypatch.setattr(api.stream.TileBatchCodec, "push", no_model)
    ticks = []
    data, rep = api.compress(src, model, "ode", SETTINGS, fallback="seed", progress=ticks.append)
    assert len(data) == rep.file_bytes == both.seed_bytes and rep.model_bytes is None
    assert rep.coded_by == "seed" and rep.model_skipped == "seed only"
    assert sum(ticks) == api.compress_work_units(src, model, "ode", SETTINGS, fallback="seed") == 1  # the bar completes
    assert not api.needs_model(api.read_header(data))
    assert np.array_equal(api.decompress(data, None)[0].color, src[0].color)
    assert api.compress(src, None, "ode", SETTINGS, fallback="seed")[0] == data  # no model needed at all
    with pytest.raises(api.SfcError, match="expected off, auto, both or seed"):
        api.compress(src, model, "ode", SETTINGS, fallback="model")


def test_a_seed_only_file_names_no_model_and_decodes_without_one(model):
    """The seed codec's file carries neither the model nor the setup (0.6.0): on one 32x32 image
    that is about 85 of its header's bytes. It decodes with no model; a file the model coded does not."""
    rng = np.random.default_rng(3)
    arr = np.clip(_gradient(32, 32).astype(int) + rng.integers(-3, 4, (32, 32, 3)), 0, 255).astype(np.uint8)
    src = [images.from_array(arr)]
    data, rep = api.compress(src, model, "ode", SETTINGS, fallback="both")
    assert rep.coded_by == "seed"
    header, _ = container.unpack(data)
    assert "model" not in header and "setup" not in header and not api.needs_model(header)
    assert rep.header_bytes <= 28 + 60, rep.header_bytes  # 163 bytes with the model and setup (0.5.0)
    api.check_identical(src, api.decompress(data, None))
    api.check_identical(src, api.decompress(data, model))  # a model given is not used
    coded, rep = api.compress([images.from_array(_in_distribution(model))], model, "ode", SETTINGS, fallback="off")
    assert rep.coded_by == "model" and api.needs_model(container.unpack(coded)[0])
    with pytest.raises(ModelMismatchError, match="needs that model"):
        api.decompress(coded, None)


def test_a_newer_release_s_header_says_so(model):
    """A header this release refuses, written by a later release, says to upgrade (not just "corrupt")."""
    data, _ = api.compress([images.from_array(_gradient())], model, "ode", SETTINGS, fallback="both")
    header, payload = container.unpack(data)
    header["stream"]["some_new_setting"] = 1
    with pytest.raises(BadFileError, match="corrupt header") as plain:
        api.read_header(container.pack(header, payload))
    assert not isinstance(plain.value, UnsupportedVersionError)
    header["codec"] = "99.0.0"
    with pytest.raises(UnsupportedVersionError, match=r"written by scoreflow-codec 99\.0\.0, newer .* upgrade"):
        api.read_header(container.pack(header, payload))


def test_several_images_and_no_colour(model):
    """A gray image (no colour planes) and two sizes in one file: every image is one tile."""
    srcs = [images.from_array(_gradient()), images.from_array(_gradient(20, 30)[..., 0]),
            images.from_array(_gradient(9, 7)[..., :1].repeat(3, -1))]
    data, rep = api.compress(srcs, model, "ode", SETTINGS, fallback="both")
    assert rep.coded_by == "seed"
    assert container.unpack(data)[0]["fields"]["n_tiles"] == 3
    api.check_identical(srcs, api.decompress(data, model))


def test_auto_skips_the_model_only_where_it_saves_too_little(model):
    """Seed tiles in the image's context (compress's default): in distribution the model's tiles are
    far cheaper than the seed codec's share of them, so both are coded and the model's file is kept.
    A ramp: no tile is expected cheaper through the model, so its stream is never coded and the file
    is the seed codec's, the same bytes as "both" writes. compress names each stage as it starts it
    (phase), the model's stream only where it is coded."""
    from cli import main as cli_main
    src = [images.from_array(_in_distribution(model))]
    stages = []
    data, rep = api.compress(src, model, "ode", SETTINGS, fallback="auto", phase=stages.append)
    assert stages == ["seed codec", "model estimate", "model stream"]
    assert rep.model_saving.tiles == 4 and rep.model_saving.bits > 2 * rep.model_saving.needed
    assert rep.coded_by == "model" and rep.model_skipped is None and rep.model_estimate is None
    assert data == api.compress(src, model, "ode", SETTINGS, fallback="off")[0]
    # a ramp with a little noise: no tile cheaper through the model, and seed bits enough to pay for its
    # stream (a clean ramp's are fewer than SAVING_MIN_BITS: "small", the test below)
    noisy = _gradient() + np.random.default_rng(3).integers(0, 4, _gradient().shape, dtype=np.uint8)
    ramp = [images.from_array(noisy)]
    ticks = []
    stages.clear()
    data, rep = api.compress(ramp, model, "ode", SETTINGS, fallback=True, progress=ticks.append,  # True: "auto"
                             phase=stages.append)
    assert stages == ["seed codec", "model estimate"]
    assert rep.model_bytes is None and rep.coded_by == "seed" and rep.model_skipped == "saving"
    assert rep.model_saving.tiles == 0 and rep.model_saving.bits == 0
    # what is needed: SAVING_MIN_BITS and SAVING_MIN_FRACTION of the seed codec's shares of the tiles, whose sum
    # is about the seed codec's file less its header (independently: the file's size, 10% either way)
    frac_bits = rep.model_saving.needed - api.SAVING_MIN_BITS
    assert frac_bits == pytest.approx(api.SAVING_MIN_FRACTION * 8 * rep.seed_bytes, rel=0.1)
    assert sum(ticks) == api.compress_work_units(ramp, model, "ode", SETTINGS)  # the bar completes
    assert data == api.compress(ramp, model, "ode", SETTINGS, fallback="both")[0]
    assert "not expected to be cheaper than the seed codec on any tile" in cli_main._coded_by(rep)
    rep.model_saving = api.Saving(bits=40.0, tiles=2, needed=1024.0)  # cheaper on some, by too little
    assert ("expected to save 40 bits on 2 tile(s), less than the 1024 it must save (what its stream adds and 1% "
            "of the seed codec's bits, for its minutes;") in cli_main._coded_by(rep)
    api.check_identical(ramp, api.decompress(data, model))


def test_an_icon_whose_seed_bits_cannot_pay_for_the_models_stream_is_not_estimated(model, monkeypatch):
    """An image the seed codec codes in fewer bits than SAVING_MIN_BITS (an icon, a clean ramp): the
    model could not save that many even at 0 bits a tile, so its estimate (a tile's network calls: 12 s for a 5x3 image
    with the shipped cifar10, 0.9.39) is not run ("small"); the file is the one "both" keeps, and
    the summary says why. Just above the bound the estimate runs as before."""
    from cli import main as cli_main
    tiny = [images.from_array(np.ascontiguousarray(_in_distribution(model)[:5, :6]))]
    real, calls = api.tile_model_bits, []
    monkeypatch.setattr(api, "tile_model_bits", lambda *a, **k: calls.append(1) or real(*a, **k))
    stages = []
    data, rep = api.compress(tiny, model, "ode", SETTINGS, fallback="auto", phase=stages.append)
    assert calls == [] and stages == ["seed codec"]  # no "model estimate" said: none runs
    assert rep.coded_by == "seed" and rep.model_skipped == "small" and rep.model_bytes is None
    seed_bits = 8 * len(api.compress(tiny, model, "ode", SETTINGS, fallback="seed")[0])
    assert 0 < rep.model_saving.upper < api.SAVING_MIN_BITS < seed_bits  # the file's bits with its header
    assert data == api.compress(tiny, model, "ode", SETTINGS, fallback="both")[0]
    said = cli_main._coded_by(rep)
    assert rep.model_saving.needed == pytest.approx(api.SAVING_MIN_BITS + api.SAVING_MIN_FRACTION * rep.model_saving.upper)
    assert f"codes the image's colour in {rep.model_saving.upper:.0f} bits, fewer than the 1032" in said
    api.check_identical(tiny, api.decompress(data, model))
    ticks = []
    assert api.compress([images.from_array(_gradient())], model, "ode", SETTINGS, fallback="auto",
                        progress=ticks.append)[1].model_skipped == "small"
    assert sum(ticks) == api.compress_work_units([images.from_array(_gradient())], model, "ode", SETTINGS)
    # beside a grey image (whose tiles the seed codec codes either way) only the colour tiles' bits count
    grey = images.from_array(np.random.default_rng(1).integers(0, 256, (24, 24), dtype=np.uint8))
    calls.clear()  # ("both" above coded the model's stream)
    with_grey = api.compress(tiny + [grey], model, "ode", SETTINGS, fallback="auto")[1]
    assert with_grey.model_skipped == "small" and with_grey.model_saving.upper == rep.model_saving.upper
    assert calls == []
    calls.clear()
    monkeypatch.setattr(api, "SAVING_MIN_BITS", rep.model_saving.upper - 1)  # just above: estimated
    monkeypatch.setattr(api, "SAVING_MIN_FRACTION", 0.0)
    assert api.compress(tiny, model, "ode", SETTINGS, fallback="auto")[1].model_skipped == "saving"
    assert calls == [1]


def test_a_saving_must_also_be_a_share_of_the_seed_codecs_bits(model, monkeypatch):
    """0.9.60: "auto" codes the model's stream only where the saving also reaches SAVING_MIN_FRACTION of
    the seed codec's bits on the stream's tiles (stream.tile_seed_bits, the shares "auto" compares
    with): on an image where the model saves, a fraction just above what it saves writes the seed
    codec's file (the bytes "both" compares against), and the summary says why; just below, the
    model's stream as before."""
    from cli import main as cli_main
    from scoreflow_codec.coding import stream

    src = [images.from_array(_in_distribution(model))]
    data, rep = api.compress(src, model, "ode", SETTINGS, fallback="auto")
    sv = rep.model_saving
    assert rep.coded_by == "model" and sv.bits > sv.needed
    ss = api.default_stream_settings(model)
    refs = api._tile_refs(src, ss.tile)
    seed_total = float(stream.tile_seed_bits([stream.StreamImage(s.color, s.extra) for s in src], refs, ss).sum())
    flags = api._saving_needed(len(refs), sv.tiles, 0.0)
    assert sv.needed == pytest.approx(flags + api.SAVING_MIN_FRACTION * seed_total)
    monkeypatch.setattr(api, "SAVING_MIN_FRACTION", (sv.bits - flags) / seed_total * 1.01)
    seed_data, seed_rep = api.compress(src, model, "ode", SETTINGS, fallback="auto")
    assert seed_rep.model_skipped == "saving" and seed_rep.coded_by == "seed" and len(seed_data) == rep.seed_bytes
    assert seed_rep.model_saving.bits == pytest.approx(sv.bits) and seed_rep.model_saving.needed > sv.bits
    assert "it must save (what its stream adds and" in cli_main._coded_by(seed_rep)
    api.check_identical(src, api.decompress(seed_data, model))
    monkeypatch.setattr(api, "SAVING_MIN_FRACTION", (sv.bits - flags) / seed_total * 0.99)
    assert api.compress(src, model, "ode", SETTINGS, fallback="auto")[0] == data


def test_expected_saving_counts_the_cheaper_tiles_and_their_flags():
    sv = api.expected_saving(np.array([10.0, 50.0, 30.0, 7.0]), np.array([20.0, 20.0, np.nan, 6.0]))
    assert sv.bits == 31.0 and sv.tiles == 2
    assert sv.needed == pytest.approx(api.SAVING_MIN_BITS + api.SAVING_MIN_FRACTION * 97 + np.log2(6))
    assert api.SAVING_MIN_FRACTION == 0.01  # 1% of the seed codec's bits (api: a saving worth the stream's minutes)


def _tile_context(model):
    from dataclasses import replace
    return replace(api.default_stream_settings(model), seed_context="tile")


def test_auto_with_tile_context_skips_where_the_bound_is_above_the_seed_file(model):
    """Seed tiles each alone ("tile" context): "auto" decides from the model's bound over the image
    against the seed codec's file."""
    src = [images.from_array(_in_distribution(model))]
    data, rep = api.compress(src, model, "ode", SETTINGS, fallback="auto", stream_settings=_tile_context(model))
    assert rep.model_estimate_bpd < 8 * rep.seed_bytes / rep.num_dims and rep.coded_by == "model"
    assert rep.model_skipped is None and rep.model_saving is None
    ramp = [images.from_array(_gradient())]
    data, rep = api.compress(ramp, model, "ode", SETTINGS, fallback=True, stream_settings=_tile_context(model))
    assert rep.model_bytes is None and rep.coded_by == "seed" and rep.model_skipped == "estimate"
    assert rep.model_estimate_bpd > 8 * rep.seed_bytes / rep.num_dims + api.FALLBACK_MARGIN_BPD
    assert data == api.compress(ramp, model, "ode", SETTINGS, fallback="both")[0]


def test_auto_decides_from_a_sample_of_the_tiles(model):
    """A 288x256 ramp is 72 tiles of 32px, and a batch of the estimate is 64: the first batch puts
    the model's bound far above the seed codec's file, so the last 8 tiles are never evaluated."""
    from cli import main as cli_main
    big = [images.from_array(_gradient(288, 256))]
    data, rep = api.compress(big, model, "ode", SETTINGS, fallback="auto", stream_settings=_tile_context(model))
    e, threshold = rep.model_estimate, 8 * rep.seed_bytes / rep.num_dims + api.FALLBACK_MARGIN_BPD
    assert rep.coded_by == "seed" and rep.model_bytes is None and rep.model_estimate_bpd == e.mean
    assert e.units == 64 < e.total == 72 and e.mean - api.FALLBACK_Z * e.se > threshold
    assert "from 64 of 72 tiles" in cli_main._coded_by(rep)
    api.check_identical(big, api.decompress(data, model))


def test_the_estimate_weighs_each_image_by_its_dims(model, monkeypatch):
    """With a stand-in for the bound (a tile's mean pixel value), the estimate over every tile is
    the dims-weighted mean over the images of the mean over each image's edge-padded tiles, as
    evaluate_images pads them."""
    from scoreflow_codec import likelihood
    seen = set()

    def bound(m, x, deq, n_t, generator, **kw):
        seen.add((kw.get("systematic"), type(m).__name__, m.model is model.model))
        return {"bpd_with": x.double().mean((1, 2, 3))}
    monkeypatch.setattr(likelihood, "bound_terms", bound)
    arrs = [_gradient(40, 72), _gradient(100, 33), (np.arange(105) % 256).reshape(7, 5, 3).astype(np.uint8)]
    e = api.estimate_model_bpd([images.from_array(a) for a in arrs], model, 32)
    # times on a shifted grid (losses.systematic_uniform), the network fed channels-last
    assert seen == {(True, "ChannelsLast", True)}
    per_image = [api.image_tiles(a, 32).astype(np.float64).mean() for a in arrs]
    assert e.complete and e.se == 0.0 and e.total == 6 + 8 + 1
    assert e.mean == pytest.approx(np.average(per_image, weights=[a.size for a in arrs]), rel=1e-12)


def test_the_estimates_and_the_evaluation_draw_on_the_device_they_run_on(model, monkeypatch):
    """Torch draws on a CUDA device only from a generator of that device. Until 0.9.39 the bound's
    estimates (estimate_model_bpd, tile_model_bits) and evaluate_images (`sfcodec eval`) made CPU
    generators whatever their device, so `eval --device cuda` and `compress --device cuda` stopped at
    their first draw. No GPU here: every generator made is recorded with the device it was made for,
    and must be the device the call was given; on the CPU the draws are those of torch.Generator()."""
    from scoreflow_codec import likelihood

    real, made = torch.Generator, []

    def generator(device=None):
        made.append(None if device is None else torch.device(device).type)
        return real() if device is None else real(device=device)
    monkeypatch.setattr(torch, "Generator", generator)
    src = [images.from_array(_gradient(40, 72))]
    api.estimate_model_bpd(src, model, 32, device="cpu")
    api.tile_model_bits(src, model, 32, device="cpu")
    api.evaluate_images([_gradient(40, 72)], model, device="cpu", ode=False, n_t=2)
    assert len(made) >= 3 and set(made) == {"cpu"}, made
    monkeypatch.setattr(torch, "Generator", real)
    assert torch.equal(torch.rand(5, generator=likelihood.seeded(3)), torch.rand(5, generator=real().manual_seed(3)))


@pytest.mark.parametrize("pool", [3, 2])
def test_evaluate_images_pooled_measures_each_batch_of_tiles_across_images(model, pool):
    """evaluate_images(pool=N) (`sfcodec eval --batch N`): the tiles of all the images, N a batch, one
    draw and one ODE solve per batch, each image's row the mean of its own tiles' values. Against the
    same computation written out: the same seeded generator, the same tiles in batches of N, the
    likelihood functions called directly."""
    from scoreflow_codec import likelihood

    one, two = _gradient(32, 32), _gradient(32, 64)  # one tile and two
    kw = dict(n_t=3, rtol=1e-3, atol=1e-3)
    rows = api.evaluate_images([one, two], model, pool=pool, **kw)
    tiles = torch.from_numpy(np.concatenate([api.image_tiles(one), api.image_tiles(two)]))
    gen = likelihood.seeded(0)
    b, o = [], []
    for s in range(0, 3, pool):
        xb = tiles[s:s + pool]
        deq = likelihood.DrawnDequantization(model.dequantizer, xb, gen)
        b.append(likelihood.bound_terms(model.model, xb, deq, n_t=3, generator=gen)["bpd_with"].double())
        o.append(likelihood.ode_nll_bpd(model.model, xb, deq, rtol=1e-3, atol=1e-3, trace="hutchinson",
                                        generator=gen).detach().double())
    b, o = torch.cat(b), torch.cat(o)
    assert [r["tiles"] for r in rows] == [1, 2]
    assert rows[0]["bound_bpd"] == float(b[0]) and rows[1]["bound_bpd"] == float(b[1:].mean())
    assert rows[0]["ode_nll_bpd"] == float(o[0]) and rows[1]["ode_nll_bpd"] == float(o[1:].mean())
    # the default (each image alone) draws otherwise, and keeps its numbers
    alone = api.evaluate_images([one, two], model, **kw)
    assert alone[0]["bound_bpd"] != rows[0]["bound_bpd"] and [r["tiles"] for r in alone] == [1, 2]


@pytest.mark.parametrize("fast", [False, True])
def test_tile_model_bits_estimates_the_tiles_near_the_seed_codec_again(model, monkeypatch, fast):
    """With the seed codec's bits, tile_model_bits estimates again, from other time samples (a
    generator of another seed), the tiles that its first estimate puts below the seed codec or within
    CHOICE_REFINE_BPD of it, and keeps that second estimate for them, where the first has fewer time
    samples than the second. Where bfloat16 is fast (`fast`), that first estimate runs in it
    (models.Bf16) and the tiles within CHOICE_BF16_BPD more are estimated again too, in float32; the
    estimates without seed bits never run in it. Every estimate feeds the network channels-last
    (models.ChannelsLast, 0.9.20). A stand-in bound: a tile's mean pixel value plus its generator's
    seed; a grey image's tiles stay NaN."""
    from scoreflow_codec import likelihood, models
    nets = []

    def chain(m):  # the wrappers around the score model, outermost first
        return ">".join([type(m).__name__] + ([chain(m.model)] if hasattr(m, "model") else []))

    def bound(m, x, deq, n_t, generator, **kw):
        nets.append((chain(m), n_t))
        assert kw.get("systematic") is True  # the choice's estimates take their times on a shifted grid
        return {"bpd_with": x.double().mean((1, 2, 3)) + generator.initial_seed()}
    monkeypatch.setattr(likelihood, "bound_terms", bound)
    monkeypatch.setattr(models, "bf16_is_fast", lambda dev: fast)
    srcs = [images.from_array(_gradient(64, 96)), images.from_array(_gradient(40, 40)[..., 0])]
    refs = api.stream.T.plan_tiles([s.color.shape for s in srcs], 32)
    dims = np.array([3 * r.h * r.w for r in refs])
    first = api.tile_model_bits(srcs, model, 32, excess_bpd=0.5)
    means = first[:6] / dims[:6] - 0.5
    assert np.allclose(means, [api.image_tiles(_gradient(64, 96), 32)[i].astype(np.float64).mean() for i in range(6)])
    assert np.isnan(first[6:]).all() and len(first) == 6 + 4
    seed = np.full(len(refs), np.nan)
    seed[:6] = first[:6] + np.array([-1, 0.05, -0.05, -0.2, 1, -0.12]) * dims[:6]  # bits/dim from the first
    assert np.array_equal(api.tile_model_bits(srcs, model, 32, excess_bpd=0.5, seed_bits=seed), first, equal_nan=True)
    monkeypatch.setattr(api, "CHOICE_N_T", 16)  # a first estimate of 16 samples: estimated again
    assert np.array_equal(api.tile_model_bits(srcs, model, 32, excess_bpd=0.5), first, equal_nan=True)
    assert {net for net, _ in nets} == {"ChannelsLast>GaussianScoreModel"}
    nets.clear()
    again = api.tile_model_bits(srcs, model, 32, excess_bpd=0.5, seed_bits=seed)
    # first < seed + CHOICE_REFINE_BPD (0.1), + CHOICE_BF16_BPD (0.05) where the first ran in bf16
    near = np.array([False, True, True, False, True, fast])
    assert np.allclose(again[:6][near], first[:6][near] + dims[:6][near]) and np.array_equal(again[:6][~near], first[:6][~near])
    assert np.isnan(again[6:]).all()
    f32 = "ChannelsLast>GaussianScoreModel"
    assert nets == [("Bf16>" + f32 if fast else f32, 16), (f32, 32)]


def test_tile_model_bits_counts_an_edge_tile_whole(model, monkeypatch):
    """An edge tile's estimate is the padded tile's bound per dim times the whole tile's dims: the
    stream codes the whole tile (its padding latent), and on a 1600x1064 photograph's bottom-edge
    tiles the bound scaled to the image's pixels alone came out 40% below what the stream paid. With
    a stand-in bound of a constant, every tile, whole or cut by the image's edges, is estimated at
    (bound + excess) x 3 x 32 x 32; the seed codec's bits of a tile stay its own pixels'."""
    from scoreflow_codec import likelihood

    monkeypatch.setattr(likelihood, "bound_terms", lambda m, x, deq, n_t, generator, **kw:
                        {"bpd_with": torch.full((len(x),), 2.0, dtype=torch.float64)})
    src = [images.from_array(_gradient(40, 72))]  # 32px tiles: 2 x 3, the last row 8 high, the last column 8 wide
    refs = api.stream.T.plan_tiles([src[0].color.shape], 32)
    assert sorted({(r.h, r.w) for r in refs}) == [(8, 8), (8, 32), (32, 8), (32, 32)]
    bits = api.tile_model_bits(src, model, 32, excess_bpd=0.5)
    assert np.allclose(bits, 2.5 * 3 * 32 * 32)
    seed = api.stream.tile_seed_bits([api.stream.StreamImage(src[0].color, None)], refs, api.default_stream_settings(model, 32))
    assert seed[-1] < seed[0] / 4  # an 8x8 corner: its own 192 values


def test_tile_model_bits_only_estimates_the_tiles_asked_for(model, monkeypatch):
    """only= estimates those tiles alone (NaN elsewhere) as the whole set would: the same time
    samples, the bfloat16 first look and the second estimate of the tiles near the seed codec follow
    the number of all the tiles. A stand-in bound: a tile's mean pixel value plus its generator's seed."""
    from scoreflow_codec import likelihood, models
    sizes = []

    def bound(m, x, deq, n_t, generator, **kw):
        sizes.append((len(x), n_t, type(m).__name__))
        return {"bpd_with": x.double().mean((1, 2, 3)) + generator.initial_seed()}
    monkeypatch.setattr(likelihood, "bound_terms", bound)
    monkeypatch.setattr(models, "bf16_is_fast", lambda dev: True)
    src = [images.from_array(_gradient(96, 1472))]  # 138 tiles of 32px: 64 x 64 / 138 = 29 time samples
    dims = 3 * 32 * 32
    whole = api.tile_model_bits(src, model, 32, excess_bpd=0.5)
    seed = whole + dims * np.where(np.arange(138) % 2, 1.0, -1.0)  # the odd tiles near the seed codec
    full = api.tile_model_bits(src, model, 32, excess_bpd=0.5, seed_bits=seed)
    sizes.clear()
    part = api.tile_model_bits(src, model, 32, excess_bpd=0.5, seed_bits=seed, only=np.array([7, 2, 5]))
    assert np.isnan(np.delete(part, [2, 5, 7])).all()
    assert np.array_equal(part[[2, 5, 7]], full[[2, 5, 7]]) and part[5] != whole[5]  # 5 and 7 estimated again
    assert sizes == [(3, 29, "Bf16"), (2, 32, "ChannelsLast")]  # 3 tiles alone would take 64 samples, once
    sizes.clear()  # a screen's look: its own time samples, in bfloat16 where fast, and no second estimate
    look = api.tile_model_bits(src, model, 32, excess_bpd=0.5, seed_bits=seed, only=np.array([7, 2, 5]), look=16)
    assert sizes == [(3, 16, "Bf16")] and np.allclose(look[[2, 5, 7]], whole[[2, 5, 7]] + 2 * dims)  # its own draws
    monkeypatch.setattr(models, "bf16_is_fast", lambda dev: False)
    sizes.clear()
    api.tile_model_bits(src, model, 32, seed_bits=seed, only=np.array([7, 2, 5]), look=16)
    assert sizes == [(3, 16, "ChannelsLast")]


def test_tile_model_bits_in_chain_mode_is_the_chains_own_bound(model, monkeypatch):
    """0.9.61: with the chain's coefficients (compress in mode "chain", its default) the estimates that
    decide are the chain's bound per tile, which the excess does not shift: a chain of 6 steps costs
    far above the continuous bound (what the estimate was before: bound + an average excess, 0 here
    without a table), and each tile's estimate is one draw of discrete_chain.chain_elbo_bpd over all
    its steps (5 of them: fewer than the 64 time samples), against a mean of 24 independent draws.
    compress passes the chain's coefficients in mode "chain" and none in mode "ode"; the quick looks and
    a first estimate that only picks the tiles to refine stay the continuous bound."""
    from scoreflow_codec import discrete_chain
    from scoreflow_codec.coding.pipeline import build_tile_codec

    src = [images.from_array(_in_distribution(model))]  # 4 tiles of 32px
    refs = api._tile_refs(src, 32)
    dims = 3 * 32 * 32
    co = build_tile_codec(model.model, model.dequantizer, model.sde, "chain", {"steps": 6}, 8).chain_coeffs()
    assert co.steps == 6
    own = api.tile_model_bits(src, model, 32, excess_bpd=5.0, chain=co) / dims
    bound = api.tile_model_bits(src, model, 32) / dims
    x = torch.from_numpy(api.padded_tiles(src, refs, range(4), 32))
    g = torch.Generator().manual_seed(9)
    draws = np.array([discrete_chain.chain_elbo_bpd(model.model, x, model.dequantizer, co, g).numpy() for _ in range(24)])
    sd = draws.std(0, ddof=1)
    assert np.all(np.abs(own - draws.mean(0)) < 4 * sd + 1e-3), (own, draws.mean(0), sd)
    assert np.all(draws.mean(0) > bound + 0.5)  # 6 steps: the chain costs well above the continuous bound
    # compress hands the estimate the chain's coefficients in mode "chain", none in mode "ode"
    real, seen = api.tile_model_bits, []
    monkeypatch.setattr(api, "tile_model_bits", lambda *a, **k: seen.append(k.get("chain")) or real(*a, **k))
    data, rep = api.compress(src, model, "chain", {"steps": 6}, fallback="off")  # the choice of seed tiles
    # (its codec computes in exactmath's arithmetic: the same times to the last bits)
    assert len(seen) == 1 and np.allclose(seen[0].ts, co.ts, rtol=1e-12)
    # the chain of 6 steps is expected at about 95 bits/dim, the seed codec at about 8: every tile is a seed
    # tile; the continuous bound (about 4.8) gave two of them to the model, and the file came out 2.3 times
    # larger (the codec's reverse variances adapt per batch, kappa: its tiles cost less than the bound's 95)
    assert rep.stream.n_seed == rep.stream.n_tiles == 4
    api.check_identical(src, api.decompress(data, model))
    monkeypatch.setattr(api, "tile_model_bits", lambda *a, **k: real(*a, **{**k, "chain": None}))
    before = api.compress(src, model, "chain", {"steps": 6}, fallback="off")
    assert before[1].stream.n_seed < 4 and len(before[0]) > 2 * len(data)
    seen.clear()
    monkeypatch.setattr(api, "tile_model_bits", lambda *a, **k: seen.append(k.get("chain")) or real(*a, **k))
    assert api.compress(src, model, "ode", SETTINGS, fallback="auto")[1].coded_by == "model"
    assert seen == [None]


def _gains(model, monkeypatch, seed_bits, model_bits):
    """sample_saving with stand-ins for the seed codec's tile bits and the model's: which tiles it asked for."""
    asked, looks = [], []
    monkeypatch.setattr(api.stream, "seed_file_tile_bits", lambda ims, refs, version: np.asarray(seed_bits, float))

    def tmb(sources, m, tile, device, excess, seed, only, look=None, chain=None):
        asked.append(np.asarray(only))
        looks.append(look)
        assert np.array_equal(seed, seed_bits)
        out = np.full(len(seed), np.nan)
        out[only] = np.asarray(model_bits, float)[only]
        return out
    monkeypatch.setattr(api, "tile_model_bits", tmb)
    return asked, looks


def test_sample_saving_extrapolates_a_random_sample_of_tiles(model, monkeypatch):
    """sample_saving: SAMPLE_TILES tiles drawn by numpy's generator of seed 0, their gains max(0, seed
    codec - model) scaled to all tiles, the tiles with a gain likewise, and the upper end SAMPLE_Z
    standard errors of that total above it (finite population); where the sample is every tile, the
    expected saving itself."""
    src = [images.from_array(_gradient(96, 320))]  # 30 tiles of 32px
    seed_bits = np.arange(30) * 10.0
    model_bits = np.where(np.arange(30) % 3 == 0, 0.0, 1e6)  # every third tile saves its seed bits
    monkeypatch.setattr(api, "SAMPLE_TILES", 8)
    asked, looks = _gains(model, monkeypatch, seed_bits, model_bits)
    sv = api.sample_saving(src, model, api.default_stream_settings(model, 32))
    pick = np.sort(np.random.default_rng(0).choice(30, 8, replace=False))
    assert np.array_equal(asked[0], pick)
    gain = np.maximum(0, seed_bits[pick] - model_bits[pick])
    se = 30 * gain.std(ddof=1) / np.sqrt(8) * np.sqrt(1 - 8 / 30)
    assert sv.sampled == 8 and sv.bits == pytest.approx(30 / 8 * gain.sum())
    assert sv.tiles == round(30 / 8 * (gain > 0).sum()) and sv.upper == pytest.approx(sv.bits + api.SAMPLE_Z * se)
    assert sv.needed == pytest.approx(api.expected_saving(seed_bits, np.where(np.arange(30) < sv.tiles, -1, 1e6)).needed)
    monkeypatch.setattr(api, "SAMPLE_TILES", 64)
    sv = api.sample_saving(src, model, api.default_stream_settings(model, 32))
    full = api.expected_saving(seed_bits, model_bits)
    assert np.array_equal(asked[1], np.arange(30)) and sv.sampled == 30
    assert (sv.bits, sv.tiles, sv.needed, sv.upper) == (pytest.approx(full.bits), full.tiles, pytest.approx(full.needed), pytest.approx(full.bits))


def test_expected_gain_is_the_positive_part_of_a_normal():
    """_expected_gain(d, sd): E max(0, D) and P(D > 0) for D ~ N(d, sd^2), against a million draws;
    sd 0: max(0, d) and d > 0."""
    rng = np.random.default_rng(3)
    d = np.array([-3000.0, -900.0, -100.0, 0.0, 450.0, 2500.0])
    gain, p = api._expected_gain(d, 983.0)
    draws = d[:, None] + 983.0 * rng.standard_normal((1, 1_000_000))
    assert np.allclose(gain, np.maximum(draws, 0).mean(1), rtol=0.01, atol=0.5)
    assert np.allclose(p, (draws > 0).mean(1), atol=0.002)
    gain, p = api._expected_gain(d, 0.0)
    assert np.array_equal(gain, np.maximum(d, 0)) and np.array_equal(p, d > 0)


def test_screen_saving_counts_what_the_full_estimate_is_expected_to_find(model, monkeypatch):
    """screen_saving: SCREEN_TILES tiles drawn as sample_saving draws them, each from a look of
    SCREEN_N_T time samples; a tile's gain E max(0, D), D normal about seed codec - model with
    SCREEN_SD_BPD x the tile's dims (statistics.NormalDist here), extrapolated as sample_saving's,
    SCREEN_Z standard errors above; the tiles with a gain counted by P(D > 0)."""
    from statistics import NormalDist
    src = [images.from_array(_gradient(96, 320))]  # 30 tiles of 32px
    dims = 3 * 32 * 32
    seed_bits = np.full(30, 5000.0)
    # every tile's look: the model 0.1 (even tiles) or 0.3 bits/dim (odd) above the seed codec
    model_bits = seed_bits + dims * np.where(np.arange(30) % 2, 0.3, 0.1)
    asked, looks = _gains(model, monkeypatch, seed_bits, model_bits)
    monkeypatch.setattr(api, "SCREEN_FIRST", 30)  # no first stage (of 30 tiles): its own test, below
    sv = api.screen_saving(src, model, api.default_stream_settings(model, 32))
    pick = np.sort(np.random.default_rng(0).choice(30, api.SCREEN_TILES, replace=False))
    assert np.array_equal(asked[0], pick) and looks == [api.SCREEN_N_T]
    sd, nd = api.SCREEN_SD_BPD * dims, NormalDist()
    u = (seed_bits[pick] - model_bits[pick]) / sd
    gain = np.array([sd * (nd.pdf(v) + v * nd.cdf(v)) for v in u])
    assert (gain[pick % 2 == 0] > 10).all() and (gain[pick % 2 == 1] < 0.01).all()  # even tiles in reach, odd not
    m = api.SCREEN_TILES
    se = 30 * gain.std(ddof=1) / np.sqrt(m) * np.sqrt(1 - m / 30)
    assert sv.sampled == m and sv.bits == pytest.approx(30 / m * gain.sum())
    assert sv.tiles == round(30 / m * sum(nd.cdf(v) for v in u)) and sv.upper == pytest.approx(sv.bits + api.SCREEN_Z * se)
    sample = api.sample_saving(src, model, api.default_stream_settings(model, 32))
    assert sample.bits == 0 and looks[-1] is None  # the sample: no spread, the full estimate's samples


def test_the_screens_first_stage_looks_where_the_seed_codec_spends_most(model, monkeypatch):
    """screen_first_stage: of the screen's drawn tiles, the SCREEN_FIRST with the most seed codec bits
    (the first drawn where equal), each from the screen's look; their x = (seed codec - model) / dims,
    mean m, spread s = max(sd, SCREEN_FIRST_SPREAD_BPD): every tile saves E max(0, D), D ~ N(mu, s^2 +
    SCREEN_SD_BPD^2), bits at mu = m and upper at m + SCREEN_FIRST_Z s / sqrt(SCREEN_FIRST), over every
    tile (statistics.NormalDist here). Where the upper is below what the stream needs, it is the
    screen's answer and the 16 tiles are not looked at; else the screen is the 16 tiles' as before."""
    from statistics import NormalDist, stdev
    src = [images.from_array(_gradient(96, 320))]  # 30 tiles of 32px
    dims, nd = 3 * 32 * 32, NormalDist()
    seed_bits = 4000.0 + 100 * (np.arange(30) % 7)  # ties among the drawn: the first drawn go first
    draw = np.random.default_rng(0).choice(30, api.SCREEN_TILES, replace=False)
    first = np.sort(sorted(draw.tolist(), key=lambda i: -seed_bits[i])[:api.SCREEN_FIRST])
    assert len(set(seed_bits[first])) < api.SCREEN_FIRST  # (the test covers a tie)
    ss = api.default_stream_settings(model, 32)

    def expected(x):
        s = max(stdev(x), api.SCREEN_FIRST_SPREAD_BPD)
        sd = (s * s + api.SCREEN_SD_BPD ** 2) ** 0.5
        g = [sd * (nd.pdf(mu / sd) + mu / sd * nd.cdf(mu / sd))
             for mu in (sum(x) / len(x), sum(x) / len(x) + api.SCREEN_FIRST_Z * s / len(x) ** 0.5)]
        return 30 * dims * g[0], 30 * dims * g[1], round(30 * nd.cdf(sum(x) / len(x) / sd)), s
    # the model at parity on every tile but the first stage's, 0.5 - 0.2 bits/dim behind there
    x_first = [-0.5, -0.4, -0.3, -0.2]
    model_bits = seed_bits.copy()
    model_bits[first] = seed_bits[first] - dims * np.array(x_first)
    asked, looks = _gains(model, monkeypatch, seed_bits, model_bits)
    sv = api.screen_saving(src, model, ss)
    bits, upper, k, s = expected(x_first)
    assert s == pytest.approx(stdev(x_first)) and s > api.SCREEN_FIRST_SPREAD_BPD
    assert len(asked) == 1 and np.array_equal(asked[0], first) and looks == [api.SCREEN_N_T]
    assert sv.sampled == api.SCREEN_FIRST and sv.upper < sv.needed
    assert (sv.bits, sv.upper, sv.tiles) == (pytest.approx(bits), pytest.approx(upper), k)
    assert sv.needed == pytest.approx(api._saving_needed(30, k, seed_bits.sum()))
    # all alike: the spread is SCREEN_FIRST_SPREAD_BPD; at parity the stage passes to the 16 tiles
    for x, rules_out in ((-0.35, True), (0.0, False)):
        asked.clear()
        model_bits[:] = seed_bits - dims * x
        sv = api.screen_saving(src, model, ss)
        bits, upper, k, s = expected([x] * 4)
        first_stage = api.screen_first_stage(src, model, ss)
        assert s == api.SCREEN_FIRST_SPREAD_BPD and first_stage.upper == pytest.approx(upper)
        assert (first_stage.upper < first_stage.needed) == rules_out
        if rules_out:
            assert sv == first_stage and len(asked) == 2
        else:
            assert sv.sampled == api.SCREEN_TILES and np.array_equal(asked[1], np.sort(draw))
            assert sv.bits == pytest.approx(30 / 16 * 16 * dims * api.SCREEN_SD_BPD * nd.pdf(0))


def _skipped_by_a_look(model, monkeypatch, arr: np.ndarray, why: str):
    """compress(fallback="auto") of arr, where a quick look (`why`: "screen", "sample") finds too little:
    neither every tile's estimate nor the seed codec's analysis of the whole image in context runs, and
    the file is the seed codec's, the bytes "both" writes. Returns the report; the seed codec's analysis
    in context stays patched to fail."""
    src = [images.from_array(arr)]
    both = api.compress(src, model, "ode", SETTINGS, fallback="both")[0]
    monkeypatch.setattr(api.stream, "tile_seed_bits", lambda *a: pytest.fail("the whole image's shares"))
    stages = []
    data, rep = api.compress(src, model, "ode", SETTINGS, fallback="auto", phase=stages.append)
    assert stages == ["seed codec", "model estimate"] and rep.model_skipped == why
    assert data == both and rep.model_bytes is None
    return rep


def test_auto_screens_photographs_first(model, monkeypatch):
    """On RGB images of at least SCREEN_TILES tiles, "auto" first screens (screen_saving): where even
    the screen's saving is too small (a ramp), neither every tile's estimate nor the seed codec's
    analysis in context runs, and the file is the seed codec's, the bytes "both" writes. Where it is
    not (in distribution), the estimate of every tile decides as before: the same file as without
    the screen. Below SCREEN_TILES tiles, no screen."""
    from cli import main as cli_main
    t = gaussian_images(model.model, 16, torch.Generator().manual_seed(6))  # [16, 3, 32, 32]: 16 tiles
    arr = np.concatenate([np.concatenate(list(t[4 * i:4 * i + 4]), 2) for i in range(4)], 1)
    src = [images.from_array(np.ascontiguousarray(arr.transpose(1, 2, 0)))]
    real_screen, screens = api.screen_saving, []
    monkeypatch.setattr(api, "screen_saving", lambda *a, **k: screens.append(real_screen(*a, **k)) or screens[-1])
    data, rep = api.compress(src, model, "ode", SETTINGS, fallback="auto")
    assert screens[0].sampled == 16 and screens[0].bits > screens[0].needed and rep.model_saving.sampled == 0
    monkeypatch.setattr(api, "SCREEN_TILES", 17)  # 16 tiles: below it, no screen
    plain = api.compress(src, model, "ode", SETTINGS, fallback="auto")[0]
    assert rep.coded_by == "model" and data == plain and len(screens) == 1
    monkeypatch.setattr(api, "SCREEN_TILES", 16)
    rep = _skipped_by_a_look(model, monkeypatch, _gradient(100, 160), "screen")  # 4 x 5 tiles
    sv = rep.model_saving
    assert sv.sampled == api.SCREEN_FIRST and sv.upper < sv.needed  # the first stage rules the ramp out
    assert ("a quick look at the 4 of 16 tiles drawn at random where the seed codec spends the most, the model is "
            "expected to save") in cli_main._coded_by(rep)
    monkeypatch.setattr(api, "SCREEN_FIRST_SPREAD_BPD", 100.0)  # a first stage that never rules out
    sv = api.screen_saving([images.from_array(_gradient(100, 160))], model, api.default_stream_settings(model, 32))
    assert sv.sampled == 16 and sv.upper < sv.needed  # the 16 tiles too


def test_auto_looks_at_a_sample_first_on_a_large_image(model, monkeypatch):
    """Above SAMPLE_ABOVE_PIXELS, "auto" first estimates a sample of tiles against their shares of the
    seed codec's file: where they promise too little (a ramp), neither every tile's estimate nor the
    seed codec's analysis of the whole image in context runs, and the file is the seed codec's, the
    bytes "both" writes. Where they promise more (in distribution), the estimate of every tile decides
    as before, and the file is the one compress writes without the sample."""
    from cli import main as cli_main
    src = [images.from_array(_in_distribution(model))]
    plain = api.compress(src, model, "ode", SETTINGS, fallback="auto")[0]
    monkeypatch.setattr(api, "SAMPLE_ABOVE_PIXELS", 1000)
    real_sample = api.sample_saving
    samples = []
    monkeypatch.setattr(api, "sample_saving", lambda *a, **k: samples.append(real_sample(*a, **k)) or samples[-1])
    data, rep = api.compress(src, model, "ode", SETTINGS, fallback="auto")
    assert samples[0].sampled == 4 and samples[0].bits > samples[0].needed and rep.model_saving.sampled == 0
    assert rep.coded_by == "model" and data == plain
    ramp = [images.from_array(_gradient())]  # 40x72: 2,880 pixels, 6 tiles
    rep = _skipped_by_a_look(model, monkeypatch, _gradient(), "sample")
    sv = rep.model_saving
    assert sv.sampled == 6 and sv.bits == sv.upper == 0 and sv.needed > api.SAVING_MIN_BITS
    assert "from 6 tiles drawn at random, the model is expected to save 0 bits (at most 0)" in cli_main._coded_by(rep)
    monkeypatch.setattr(api, "SAMPLE_ABOVE_PIXELS", 2880)  # not above it: no sample
    with pytest.raises(pytest.fail.Exception, match="whole image"):
        api.compress(ramp, model, "ode", SETTINGS, fallback="auto")


def test_auto_gives_grey_images_the_seed_codec(model):
    """Grey images alone (0.9.32): the seed codec's file, the model's stream not coded (it always lost
    on them: compress's note), the same bytes "both" keeps; "both" and "off" still code a stream. With
    seed tiles each alone ("tile" context, whose estimate is the whole set's bound) a set that mixes grey
    and colour images still codes both, as before."""
    grey = images.from_array(_gradient()[..., 0])
    srcs = [grey, images.from_array(_gradient(9, 7))]
    _, rep = api.compress(srcs, model, "ode", SETTINGS, fallback="auto", stream_settings=_tile_context(model))
    assert rep.model_estimate_bpd is None and rep.model_saving is None and rep.model_skipped is None
    assert rep.model_bytes is not None and rep.seed_bytes is not None
    greys = [grey, images.from_array(_gradient(20, 30)[..., 0])]
    for ss in (None, _tile_context(model)):
        data, rep = api.compress(greys, model, "ode", SETTINGS, fallback="auto", stream_settings=ss)
        assert rep.model_skipped == "grey" and rep.model_bytes is None and rep.coded_by == "seed"
        both, rep_both = api.compress(greys, model, "ode", SETTINGS, fallback="both", stream_settings=ss)
        assert rep_both.model_bytes is not None and rep_both.model_skipped is None
        assert rep_both.seed_bytes == rep.seed_bytes == len(data)  # the same seed codec's file
        if rep_both.coded_by == "seed":
            assert both == data
        api.check_identical(greys, api.decompress(data, model))
    _, rep = api.compress(greys, model, "ode", SETTINGS, fallback="off")
    assert rep.model_bytes is not None and rep.model_skipped is None


def _chosen_seed_tiles(monkeypatch) -> list:
    """Record stream.choose_seed_tiles' answers (bool [n] each) in the list returned."""
    real, seen = api.stream.choose_seed_tiles, []
    monkeypatch.setattr(api.stream, "choose_seed_tiles", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    return seen


def test_grey_tiles_beside_colour_ones_are_seed_tiles(model, monkeypatch):
    """0.9.33: in a set that mixes grey and colour images, "auto" and "both" give every grey tile to the
    seed codec (its estimate +inf: no estimate covers it, and the model's stream lost on every grey image
    measured), and "auto" decides from the colour tiles' saving; before, "auto" coded both streams, the
    model coding the grey tiles. "off" (the model's stream only) still gives them to the model. The model
    wins on the colour image here (in distribution) and loses far on the grey ramp: the stream of "auto"
    is the smaller, and decodes to the same pixels."""
    monkeypatch.setattr(api, "SAVING_MIN_FRACTION", 0.0)  # the flags that name the seed tiles alone
    grey = images.from_array(_gradient(40, 72)[..., 0])  # 2 x 3 tiles of 32px
    srcs = [images.from_array(_in_distribution(model)), grey]  # 4 colour tiles, then 6 grey ones
    assert api.rgb_tiles(srcs, 32).tolist() == [True] * 4 + [False] * 6
    seen = _chosen_seed_tiles(monkeypatch)
    data, rep = api.compress(srcs, model, "ode", SETTINGS, fallback="auto")
    assert rep.coded_by == "model" and rep.model_skipped is None
    sv = rep.model_saving
    assert sv.bits > sv.needed and sv.tiles <= 4 and sv.needed == pytest.approx(api._saving_needed(10, sv.tiles, 0.0))
    assert seen[-1][4:].all()  # every grey tile a seed tile
    api.check_identical(srcs, api.decompress(data, model))
    both, rep_both = api.compress(srcs, model, "ode", SETTINGS, fallback="both")
    assert both == data and seen[-1][4:].all() and rep_both.seed_bytes > len(data)
    off, _ = api.compress(srcs, model, "ode", SETTINGS, fallback="off")
    assert not seen[-1][4:].all() and len(off) > len(data)  # the model coded grey tiles, at a loss
    api.check_identical(srcs, api.decompress(off, model))
    # grey images alone with "both": a stream of seed tiles only, which decodes
    greys = [grey, images.from_array(_gradient(20, 30)[..., 0])]
    both, rep = api.compress(greys, model, "ode", SETTINGS, fallback="both")
    assert seen[-1].all() and rep.model_bytes is not None
    api.check_identical(greys, api.decompress(both, model))


def test_the_quick_looks_draw_colour_tiles_beside_grey_ones(model, monkeypatch):
    """0.9.33: sample_saving (and screen_saving, which draws alike) draws its tiles from the colour
    images' (the same draw as for those images alone) and extrapolates to them; the flags that would
    name the seed tiles count every tile. _screen_first and _sample_first count colour images alone."""
    rgb = images.from_array(_gradient(96, 320))  # 30 tiles of 32px
    grey = images.from_array(_gradient(64, 64)[..., 0])  # 4 tiles
    srcs = [grey, rgb]  # the grey tiles first: the colour ones are tiles 4 - 33
    seed_bits = np.concatenate([np.full(4, 1e5), np.arange(30) * 10.0])
    model_bits = np.concatenate([np.full(4, 0.0), np.where(np.arange(30) % 3 == 0, 0.0, 1e6)])
    monkeypatch.setattr(api, "SAMPLE_TILES", 8)
    asked, _ = _gains(model, monkeypatch, seed_bits, model_bits)
    sv = api.sample_saving(srcs, model, api.default_stream_settings(model, 32))
    pick = np.sort(np.random.default_rng(0).choice(30, 8, replace=False))
    assert np.array_equal(asked[0], 4 + pick)
    gain = np.maximum(0, seed_bits[4 + pick] - model_bits[4 + pick])
    assert sv.sampled == 8 and sv.bits == pytest.approx(30 / 8 * gain.sum())
    assert sv.tiles == round(30 / 8 * (gain > 0).sum()) and sv.needed == pytest.approx(api._saving_needed(34, sv.tiles, seed_bits.sum()))
    alone = api.sample_saving([rgb], model, api.default_stream_settings(model, 32))
    assert np.array_equal(asked[1], pick) and alone.sampled == 8  # the same draw (the stand-ins' bits are the set's)
    monkeypatch.setattr(api, "SCREEN_TILES", 30)
    assert api._screen_first(srcs, 32) and not api._screen_first([grey, grey, grey, grey, grey, grey, grey, grey], 32)
    monkeypatch.setattr(api, "SCREEN_TILES", 31)
    assert not api._screen_first(srcs, 32)  # 34 tiles, 30 of them colour
    monkeypatch.setattr(api, "SAMPLE_ABOVE_PIXELS", 96 * 320 - 1)
    assert api._sample_first(srcs) and not api._sample_first([grey] * 20)
    monkeypatch.setattr(api, "SAMPLE_ABOVE_PIXELS", 96 * 320)
    assert not api._sample_first(srcs)  # the grey image's pixels not counted


def _index_palette(h=24, w=40):
    """A few-colour quantized ramp: choose_palette_coding codes it as its index plane, no colour planes."""
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([x * 6, y * 9, 255 - 3 * (x + y)], -1).clip(0, 255).astype(np.uint8)
    return Image.fromarray(rgb).quantize(6)


def test_images_without_colour_planes_skip_the_model_stream(model):
    """A palette coded as indices has nothing for the model: "auto" and "both" write the seed
    codec's file alone (the model's stream would be the same planes through the same seed codec,
    in a larger header); "off" still writes the model's stream, which is larger and decodes the same."""
    (src,) = api.choose_palette_coding([images.from_pil(_index_palette())], LATEST_SEED)
    assert src.color is None and src.meta["palette_coded"] == "indices"
    files = {}
    for fb in ("auto", "both", "off"):
        ticks = []
        files[fb], rep = api.compress([src], model, "ode", SETTINGS, fallback=fb, progress=ticks.append)
        assert rep.stream.n_tiles == 0 and sum(ticks) == api.compress_work_units([src], model, "ode", SETTINGS) == 0
        assert (rep.model_bytes is None) == (fb != "off") and (rep.seed_bytes is None) == (fb == "off")
        assert rep.model_estimate is None and rep.model_skipped == (None if fb == "off" else "no colour planes")
        (back,) = api.decompress(files[fb], None if fb != "off" else model)
        assert np.array_equal(back.extra, src.extra)
    assert files["auto"] == files["both"] and len(files["auto"]) < len(files["off"])
    assert "model" not in container.unpack(files["auto"])[0]


def test_cli_falls_back_by_default_and_not_with_no_fallback(tmp_path, monkeypatch, model):
    from cli import main as cli_main
    monkeypatch.setattr(cli_main, "_load_model", lambda *a, **k: model)
    png = tmp_path / "ramp.png"
    Image.fromarray(_gradient(96, 128)).save(png)
    runner = CliRunner()
    files = {}
    for flag in ("", "--fallback=both", "--no-fallback", "--fallback=seed"):
        out = tmp_path / f"ramp{flag}.sfc"
        r = runner.invoke(cli_main.cli, ["compress", str(png), "-o", str(out), "--steps", "32", "--mode", "ode"]
                          + ([flag] if flag else []))
        assert r.exit_code == 0, r.output
        files[flag] = out.read_bytes()
        assert ("the model's stream was not coded" in r.output) == (flag == ""), r.output
        assert ("smaller than the model's stream" in r.output) == (flag == "--fallback=both"), r.output
    assert ("seed codec alone (--fallback seed)" in r.output) and files["--fallback=seed"] == files[""]
    assert files[""] == files["--fallback=both"]
    # the model's stream puts a ramp in 32px seed tiles (the seed bits of one tile cannot pay for a
    # model batch); the fallback codes it as one 128px tile, which is smaller
    assert container.unpack(files[""])[0]["stream"] == {"tile": 128, "max_batch": 1, "seed": LATEST_SEED}
    # with --no-fallback the untrained model leaves every tile to the seed codec, in the image's context
    assert container.unpack(files["--no-fallback"])[0]["stream"] == {"seed": LATEST_SEED, "batching": "bits",
                                                                    "seed_tiles": "chosen", "seed_context": "image"}
    assert len(files[""]) < len(files["--no-fallback"])


def test_tile_activity_against_a_pixel_by_pixel_reference():
    """api.tile_activity (vectorized) against a plain loop over pixels: the median edge predictor
    from N, W, NW inside the tile, missing neighbours replicated from the edge."""
    rng = np.random.default_rng(0)
    tiles = rng.integers(0, 256, (70, 3, 5, 6)).astype(np.uint8)
    tiles[3] = 7  # flat: no residual at all

    def ref(t):
        total = 0.0
        for c in range(t.shape[0]):
            for y in range(t.shape[1]):
                for x in range(t.shape[2]):
                    at = lambda yy, xx: int(t[c, max(yy, 0), max(xx, 0)])
                    n, w, nw = at(y - 1, x), at(y, x - 1), at(y - 1, x - 1)
                    med = min(n, w) if nw >= max(n, w) else max(n, w) if nw <= min(n, w) else n + w - nw
                    total += np.log2(1 + abs(int(t[c, y, x]) - med))
        return total / t.size

    got = api.tile_activity(tiles)
    assert got[3] == 0.0
    assert np.allclose(got, [ref(t) for t in tiles], rtol=1e-12, atol=0)


def test_cli_says_why_an_index_palette_has_no_model_stream(tmp_path, monkeypatch, model):
    from cli import main as cli_main
    monkeypatch.setattr(cli_main, "_load_model", lambda *a, **k: model)
    png = tmp_path / "pal.png"
    _index_palette().save(png)
    out = tmp_path / "pal.sfc"
    r = CliRunner().invoke(cli_main.cli, ["compress", str(png), "-o", str(out), "--steps", "32", "--mode", "ode"])
    assert r.exit_code == 0, r.output
    assert "no image has colour planes for the model" in r.output, r.output
    assert images.to_pil(api.decompress(out.read_bytes(), None)[0]).tobytes() == Image.open(png).tobytes()


def test_chosen_seed_tiles_leave_the_seed_codec_s_tiles_to_it(model, tmp_path):
    """compress's seed tiles are "chosen": a ramp in the last two tiles of an image that the model
    otherwise codes far better than the seed codec goes to the seed codec, wherever it lies, and
    the file is smaller than with the first tiles as seed tiles; both decode."""
    t = gaussian_images(model.model, 8, torch.Generator().manual_seed(6))  # [8, 3, 32, 32]
    t[6:] = _gradient(32, 32).transpose(2, 0, 1)
    arr = np.ascontiguousarray(np.concatenate([np.concatenate(list(t[r * 4:r * 4 + 4]), 2) for r in (0, 1)], 1).transpose(1, 2, 0))
    src = [images.from_array(arr)]
    first, rep_f = api.compress(src, model, "chain", SETTINGS, stream_settings=api.stream.StreamSettings(), fallback="off")
    chosen, rep_c = api.compress(src, model, "chain", SETTINGS, track=True, fallback="off")
    assert container.unpack(chosen)[0]["stream"]["seed_tiles"] == "chosen"
    assert "seed_tiles" not in container.unpack(first)[0]["stream"]  # the format default, "first"
    for data in (first, chosen):
        assert np.array_equal(api.decompress(data, model)[0].color, src[0].color)
    est = api.tile_model_bits(src, model, 32)
    assert est[6:].min() > 8 * est[:6].max() / 5  # the model's estimate: the ramp is its dearest
    assert len(chosen) < len(first) - 100, (len(chosen), len(first))
    r = rep_c.stream  # the padding a stream reaches: the ANS head's words at most (coding/stream.py)
    assert r.n_seed >= 2 and r.pad_consumed_bits <= 64
    assert abs(rep_c.payload_bits - r.pad_consumed_bits - rep_c.predicted_bits) <= 64 + 1e-4 * rep_c.predicted_bits
    from dataclasses import replace

    from cli.main import cli
    from scoreflow_codec.errors import SfcError

    with pytest.raises(SfcError, match="seed_tiles 'chosen' needs batching 'bits'"):  # refused before any work
        api.compress(src, model, "chain", SETTINGS, stream_settings=replace(api.default_stream_settings(model), batching="growth"),
                     fallback="off")
    (tmp_path / "c.sfc").write_bytes(chosen)
    r = CliRunner().invoke(cli, ["info", str(tmp_path / "c.sfc")], prog_name="sfcodec")
    assert r.exit_code == 0 and f"{rep_c.stream.n_seed} seed tiles, chosen by the encoder, coded in the image's context" \
        in r.stdout, r.stdout


def test_cli_fallback_seed_loads_neither_torch_nor_a_model(tmp_path):
    """`sfcodec compress --fallback seed` (with --model auto) runs no model, so it imports no torch and
    loads no model (0.9.23: a small image in about 1.3 s and 160 MB instead of 3.4 s and 370 MB): the
    same file as api.compress with the shipped model loaded, which decodes without one; with a model
    named explicitly torch loads (the probe sees an import when there is one)."""
    import sfcodec_probe
    from scoreflow_codec import zoo

    arr = _gradient(40, 56)
    Image.fromarray(arr).save(tmp_path / "a.png")
    runs = {}
    for extra in ([], ["--model", "cifar10"]):
        out = tmp_path / f"a{len(extra)}.sfc"
        seen, r = sfcodec_probe.run(["compress", str(tmp_path / "a.png"), "-o", str(out), "--fallback", "seed"] + extra,
                                    cwd=tmp_path)
        assert seen.get("exit") in (0, None), r.stderr
        runs[len(extra)] = (seen["torch"], out.read_bytes(), r.stderr)
    assert runs[0][0] is False and runs[2][0] is True
    assert "[seed codec alone (--fallback seed)]" in runs[0][2] and "model cifar10" in runs[2][2]
    src = images.load_image(tmp_path / "a.png")
    src.meta["name"] = "a.png"
    want, _ = api.compress([src], zoo.load_model("cifar10"), fallback="seed")
    assert runs[0][1] == runs[2][1] == want
    assert np.array_equal(api.decompress(want, None)[0].color, src.color)


def test_cli_says_why_a_grey_image_has_no_model_stream(tmp_path, monkeypatch, model):
    """0.9.32: a grey image's file is the seed codec's under the defaults, and the summary says why."""
    from cli import main as cli_main
    monkeypatch.setattr(cli_main, "_load_model", lambda *a, **k: model)
    png = tmp_path / "grey.png"
    Image.fromarray(_gradient(20, 30)[..., 0]).save(png)
    out = tmp_path / "grey.sfc"
    r = CliRunner().invoke(cli_main.cli, ["compress", str(png), "-o", str(out), "--steps", "32"])
    assert r.exit_code == 0, r.output
    assert ("the model's stream was not coded: grey images, which the model codes as colour images whose colour "
            "is latent, at a loss (--fallback both codes it anyway)") in r.output, r.output
    assert images.to_pil(api.decompress(out.read_bytes(), None)[0]).tobytes() == Image.open(png).tobytes()


def test_cli_seed_tiles_first_gives_the_model_every_tile_but_the_first(tmp_path, monkeypatch, model):
    """--seed-tiles first (with --no-fallback: a model's own coding). Where the encoder's choice leaves
    every tile of a noise image to the seed codec (the model's narrow Gaussians code noise far worse),
    "first" makes only the tiles the chain needs seed tiles and gives the model the rest, the summary
    says how many; verify codes the same file; a one-tile image is all seed tiles and the line says
    why; with --fallback seed the option is a usage error."""
    from cli import main as cli_main
    monkeypatch.setattr(cli_main, "_load_model", lambda *a, **k: model)
    png, one = tmp_path / "noise.png", tmp_path / "one.png"
    noise = np.random.default_rng(3).integers(0, 256, (96, 128, 3), dtype=np.uint8)
    Image.fromarray(noise).save(png)
    Image.fromarray(noise[:32, :32]).save(one)
    runner = CliRunner()
    base = ["--steps", "32", "--mode", "ode", "--no-fallback"]
    lines, files = {}, {}
    for how in ("chosen", "first"):
        out = tmp_path / f"{how}.sfc"
        r = runner.invoke(cli_main.cli, ["compress", str(png), "-o", str(out), *base, "--seed-tiles", how])
        assert r.exit_code == 0, r.output
        lines[how], files[how] = r.output, out.read_bytes()
    head = container.unpack(files["first"])[0]["stream"]
    assert head.get("seed_tiles", "first") == "first" and head.get("seed_context", "tile") == "tile", head
    rep = api.compress([images.load_image(png)], model, "ode", SETTINGS, fallback="off",
                       stream_settings=api.default_stream_settings(model, seed_tiles="first"))[1]
    n_model = rep.stream.n_tiles - rep.stream.n_seed
    assert rep.stream.n_tiles == 12 and 0 < n_model < 12
    for how, seed in (("first", rep.stream.n_seed), ("chosen", 12)):  # the bench's way: compress_arrays
        got = api.compress_arrays([noise], model, "ode", fallback="off", seed_tiles=how, **SETTINGS)[1]
        assert got.stream.n_seed == seed, how
    assert f"model's stream, {n_model} of 12 tiles the model's" in lines["first"], lines["first"]
    assert "every tile of the model's stream a seed tile" in lines["chosen"] and "--seed-tiles first" in lines["chosen"], lines["chosen"]
    back = api.decompress(files["first"], model)[0]
    assert np.array_equal(images.to_array(back), noise)
    assert len(files["first"]) > len(files["chosen"])
    r = runner.invoke(cli_main.cli, ["verify", str(png), *base, "--seed-tiles", "first", "--json"])
    assert r.exit_code == 0, r.output
    rec = json.loads(r.stdout)
    assert rec["bytes"] == len(files["first"]) and (rec["tiles"], rec["seed_tiles"]) == (12, rep.stream.n_seed)
    r = runner.invoke(cli_main.cli, ["compress", str(one), "-o", str(tmp_path / "one.sfc"), *base,
                                     "--seed-tiles", "first"])
    assert r.exit_code == 0 and "model's stream of 1 tile(s) is all seed tiles" in r.output, r.output
    for cmd in (["compress", str(png), "-o", str(tmp_path / "s.sfc")], ["verify", str(png)]):
        r = runner.invoke(cli_main.cli, [*cmd, "--fallback", "seed", "--seed-tiles", "first"])
        assert r.exit_code == 2 and "--seed-tiles goes with the model's stream" in r.output, r.output
    assert not (tmp_path / "s.sfc").exists()
    with pytest.raises(api.SfcError, match="unknown seed tiles 'last'"):
        api.default_stream_settings(model, seed_tiles="last")
