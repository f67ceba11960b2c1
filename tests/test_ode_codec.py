"""The ODE path (local bits-back along the probability-flow ODE): round trips, real size vs the
codelength the coders predict, and the overhead against exact densities."""
import math

import numpy as np
import pytest
import torch

from scoreflow_codec.coding.ans import Message, padding_words
from scoreflow_codec.coding.evaluator import Evaluator
from scoreflow_codec.coding.ode_codec import ODESettings, probe
from scoreflow_codec.coding.pipeline import build_tile_codec
from scoreflow_codec.dequant import UniformDequantizer
from scoreflow_codec.flow_steps import flow_nll_exact
from scoreflow_codec.sde import VPSDE

from coding_models import MixtureScoreModel, code_and_decode, gaussian_images, gaussian_model

PAD = 40000


def _code(tc, x):
    return code_and_decode(tc, x, PAD)


def _used_u(tc, x):
    """The dequantization offsets the encoder pops from a fresh padded stack."""
    return tc.dq.pop(Message(padding_words(PAD)), x.astype(np.int64))


def test_probe_is_rademacher_and_fixed():
    p = probe(3, (3, 8, 8))
    assert set(np.unique(p)) == {-1.0, 1.0} and abs(p.mean()) < 0.2
    assert np.array_equal(p, probe(3, (3, 8, 8))) and not np.array_equal(p, probe(4, (3, 8, 8)))


@pytest.mark.parametrize("steps", [64, 128])
def test_gaussian_round_trip_and_overhead(steps):
    """Exact Gaussian model: the file size must be within 0.02 bits/dim of the model's exact
    -log p(y) for the very y the encoder coded (plus the known lattice terms)."""
    model, g = gaussian_model((3, 8, 8))
    x = gaussian_images(model, 8, g)
    s = ODESettings(steps=steps)
    tc = build_tile_codec(model, UniformDequantizer(), model.sde, "ode", s.to_dict(), micro_batch=8)
    frac = _used_u(tc, x)
    actual, pred, back, m = _code(tc, x)
    assert np.array_equal(back, x)
    assert np.array_equal(m.words(), padding_words(PAD))  # the stack is back where it started
    assert abs(actual - pred) <= 64, (actual, pred)
    D = x.size
    y = torch.from_numpy((x.astype(np.float64) + (frac + 0.5) / 2 ** s.lattice_bits) * (2 / 256) - 1)
    exact_bits = float(-model.log_prob_t(y, model.sde.eps).sum()) / math.log(2)
    # -log2 P(y on the lattice) - (bits popped for u) = -log2 p(y) + D log2(128)
    ref = (exact_bits + D * math.log2(128)) / D
    overhead = actual / D - ref
    assert -0.01 < overhead < 0.02, overhead


def test_nonlinear_model_matches_discrete_flow_density():
    """A Gaussian-mixture data model (a non-linear score field): the codelength equals the exact
    density of the K-step discrete flow (full Jacobians), up to the local bits-back overhead."""
    g = torch.Generator().manual_seed(1)
    sde = VPSDE()
    model = MixtureScoreModel(sde, (torch.rand((3, 3, 4, 4), generator=g) - 0.5) * 0.4, s=0.25)
    x = np.random.default_rng(0).integers(100, 160, size=(6, 3, 4, 4)).astype(np.uint8)
    s = ODESettings(steps=64)
    tc = build_tile_codec(model, UniformDequantizer(), sde, "ode", s.to_dict(), micro_batch=3)
    frac = _used_u(tc, x)
    actual, pred, back, _ = _code(tc, x)
    assert np.array_equal(back, x)
    assert abs(actual - pred) <= 64
    y = torch.from_numpy((x.astype(np.float64) + (frac + 0.5) / 2 ** s.lattice_bits) * (2 / 256) - 1)
    nll = flow_nll_exact(model, sde, y, tc.flow.ts)
    ref = (float(nll.sum()) / math.log(2) + x.size * math.log2(128)) / x.size
    # one dequantization and one local bits-back noise draw per image: +-0.02 of noise
    assert abs(actual / x.size - ref) < 0.03, (actual / x.size, ref)


def test_micro_batch_is_what_decoding_must_reproduce():
    """Decoding with the encoder's micro-batch gives the pixels; the evaluator pads every call
    to exactly that many samples whatever the batch holds."""
    model, g = gaussian_model((3, 4, 4))
    calls = []
    ev = Evaluator(lambda v, t: (calls.append(v.shape[0]), model(v, t))[1], 4)
    out = ev(np.zeros((5, 3, 4, 4)), 0.5)
    assert out.shape == (5, 3, 4, 4) and calls == [4, 4]


def test_too_few_steps_fail_cleanly_or_round_trip():
    """Far too few steps make the fixed-point inverse diverge; the codec must stay finite:
    either it codes (expensively) and decodes exactly, or it refuses with ValueError."""
    model, g = gaussian_model((3, 4, 4))
    x = gaussian_images(model, 4, g)
    tc = build_tile_codec(model, UniformDequantizer(), model.sde, "ode", {"steps": 4}, micro_batch=4)
    try:
        actual, pred, back, _ = _code(tc, x)
    except ValueError:
        return
    assert np.array_equal(back, x)


@pytest.mark.parametrize("spread", [(0.05, 0.25), (0.01, 0.05)])
def test_ode_deficit_bounds_the_dip(monkeypatch, spread):
    """deficit_bits_per_dim is the stream's initial-bits need: how far below its start the stack
    falls while a batch is pushed. Measured after every pop (exact Gaussian data, in distribution,
    at 64 steps; the narrower spread is the data of lower entropy, whose tiles dip deeper): the
    dip stays within the deficit, and goes far below the first step's pop, what the deficit was
    until 0.6.0 (streams paid the difference in padding)."""
    from scoreflow_codec.coding import distributions as dist

    model, g = gaussian_model((3, 8, 8), spread=spread)
    x = gaussian_images(model, 4, g)
    tc = build_tile_codec(model, UniformDequantizer(), model.sde, "ode", ODESettings(steps=64).to_dict(), micro_batch=8)
    m = Message(padding_words(PAD))
    start, low = m.num_bits(), [0]
    real_pop = dist._pop

    def pop(mm, *a, **k):
        out = real_pop(mm, *a, **k)
        if mm is m:
            low[0] = min(low[0], mm.num_bits() - start)
        return out

    monkeypatch.setattr(dist, "_pop", pop)
    tc.push(m, x)
    dip, D = -low[0] / x.size, x.size
    first_pop = tc.L + math.log2(tc.flow.s.sigma_ratio * math.sqrt(2 * math.pi * math.e)) + 1.0  # the old deficit
    assert first_pop + 1 < dip <= tc.deficit_bits_per_dim(), (dip, first_pop, tc.deficit_bits_per_dim())
    net = (m.num_bits() - start) / D
    assert net > 0
