"""Lattice Gaussian, categorical and uniform codecs (coding/distributions.py).

Size accuracy: `*_bits(quantized=True)` mirror constriction's fixed-point probabilities, so the
real size (difference of `num_bits`) equals their sum up to the ANS state: the stack's size is
measured as bulk words plus the bit length of a 64-bit state, which the state's fractional
position moves by a few bits at either end (we see -3 .. +1 bits, independent of the number of
symbols), plus rounding inside the ANS update that averages out below 1e-6 bits per symbol.
Hence the tolerance 4 + 1e-6 * n bits.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from scoreflow_codec.coding.ans import Message, padding_words
from scoreflow_codec.coding.distributions import (
    MAX_ABS,
    categorical,
    categorical_bits,
    gaussian,
    gaussian_bits,
    uniform,
)

PAD = padding_words(64)


def _tol(n: int) -> float:
    return 4 + 1e-6 * n


def _roundtrip(codec, x, pad=PAD) -> int:
    m = Message(pad)
    b0 = m.num_bits()
    codec.push(m, x)
    size = m.num_bits() - b0
    y = codec.pop(m)
    assert np.array_equal(np.asarray(y), np.asarray(x))
    assert np.array_equal(m.words(), pad)
    return size


@pytest.mark.parametrize("scale", [0.3, 1.0, 7.0, 300.0, 1e4, 1e6])
def test_gaussian_size_matches_prediction(scale):
    rng = np.random.default_rng(int(scale * 10))
    n = 50_000
    mean = rng.normal(0, 1000, n)
    std = scale * np.exp(rng.uniform(-0.5, 0.5, n))
    x = np.rint(rng.normal(mean, std)).astype(np.int64)
    size = _roundtrip(gaussian(mean, std), x)
    pred = gaussian_bits(x, mean, std)
    assert abs(size - pred.sum()) < _tol(n)
    # Quantization to 24-bit counts costs little against the float64 model: at most about
    # (2R+1) / 2**24 / ln 2 bits per value from the one-count floor (R <= 3073 after the
    # coarse/fine split), plus < 1e-5 from the uniform fine bits.
    ideal = gaussian_bits(x, mean, std, quantized=False)
    assert abs(pred.sum() - ideal.sum()) / n < 6e-4


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(-1e15, 1e15, allow_nan=False),  # mean
            st.floats(-3, 6.5),  # log10 std
            st.one_of(st.floats(-8, 8), st.floats(-1e6, 1e6)),  # offset in std units
        ),
        min_size=1,
        max_size=40,
    )
)
def test_gaussian_roundtrip_property(items):
    mean = np.array([a for a, _, _ in items])
    std = 10.0 ** np.array([b for _, b, _ in items])
    x = np.clip(np.rint(mean + std * np.array([c for _, _, c in items])), -(MAX_ABS - 1), MAX_ABS - 1)
    x = x.astype(np.int64)
    size = _roundtrip(gaussian(mean, std), x)
    assert abs(size - gaussian_bits(x, mean, std).sum()) < _tol(len(x))


def test_gaussian_escapes_and_extremes():
    big = MAX_ABS - 1
    x = np.array([0, 5, -5, 100, -100, 2**40, -(2**40), big, -big, 13, 7], dtype=np.int64)
    mean = np.array([0.2, 0, 0, 0, 0, 0, 0, 0, 0, 2.0**61, -3.7e15])
    std = np.array([0.3, 0.3, 1e-3, 1, 1, 1e6, 1, 1e3, 0.5, 1.0, 2.0**40])
    size = _roundtrip(gaussian(mean, std), x)
    bits = gaussian_bits(x, mean, std)
    assert abs(size - bits.sum()) < _tol(len(x))
    # An escape costs the 2**-24 floor plus its class and low bits, never more than ~90 bits.
    assert bits[6] < 24 + 24 + 40 + 1 and bits[3] < 24 + 24 + 7


def test_gaussian_shapes_and_errors():
    mean = np.zeros((2, 3, 4))
    std = np.ones((2, 3, 4))
    x = np.arange(24).reshape(2, 3, 4) - 12
    _roundtrip(gaussian(mean, std), x)
    _roundtrip(gaussian(np.zeros(0), np.ones(0)), np.zeros(0, np.int64))
    g = gaussian(mean, std)
    m = Message(PAD)
    with pytest.raises(ValueError):
        g.push(m, x[0])
    with pytest.raises(ValueError):
        g.push(m, x + 0.5)
    with pytest.raises(ValueError):
        gaussian(np.zeros(2), np.array([1.0, 0.0]))
    with pytest.raises(ValueError):
        gaussian(np.array([np.nan]), np.ones(1))
    with pytest.raises(ValueError):
        gaussian(np.zeros(1), np.array([2.0**41]))
    with pytest.raises(ValueError):
        gaussian(np.zeros(1), np.array([np.nan]))
    with pytest.raises(ValueError):
        gaussian(np.zeros(3), np.ones(2))
    with pytest.raises(ValueError):
        gaussian(np.zeros(1), np.ones(1)).push(m, np.array([MAX_ABS]))


def test_sampled_layout_round_trips_with_the_same_cost():
    x = np.array([0, 5, -5, 100, -100, 2**40, -(2**40), 13], dtype=np.int64)
    mean, std = np.zeros(8), np.ones(8)
    plain, sampled = _roundtrip(gaussian(mean, std), x), _roundtrip(gaussian(mean, std, sampled=True), x)
    assert abs(plain - sampled) <= 2 and abs(sampled - gaussian_bits(x, mean, std).sum()) < _tol(8)


def test_a_pop_after_escape_pushes_is_no_wild_outlier():
    """Bits-back pops read what the last pushes left. After a push in which 10% of the values
    lie far in the model's tail (escapes, as a poor model at few steps produces), a pop under the
    next model must not return absurd values: with the plain class order it returns values up
    to ~2**63 (an escape cascade that broke chain mode at few steps); sampled=True keeps them
    within the classes that were pushed."""
    n, rng = 3072, np.random.default_rng(0)
    worst = {False: 0, True: 0}
    for trial in range(10):
        x = rng.normal(0, 4, n).round().astype(np.int64)
        idx = rng.choice(n, 300, replace=False)
        x[idx] += (rng.choice([-1, 1], 300) * 2.0 ** rng.uniform(5, 12, 300)).astype(np.int64)
        means = rng.normal(0, 3, n)
        for sampled in worst:
            m = Message(padding_words(20000, seed=trial))
            gaussian(np.zeros(n), np.full(n, 4.0)).push(m, x)
            z = gaussian(means, np.full(n, 5.0), sampled=sampled).pop(m)
            worst[sampled] = max(worst[sampled], int(np.abs(z).max()))
    assert worst[False] > 2**40  # the cascade this layout exists to stop
    assert worst[True] < 2**13


@pytest.mark.parametrize("std", [0.3, 2.5, 1000.0, 3e5])
def test_gaussian_pop_is_sampling_and_push_restores(std):
    # Pops from random bits are samples from the lattice Gaussian; pushing them back restores
    # the stack word for word.
    n = 20_000
    mean = np.full(n, 123.4)
    g = gaussian(mean, np.full(n, std))
    pad = padding_words(n * 2 + 100, seed=3)  # >= 64 bits per pop: never runs dry
    m = Message(pad)
    z = g.pop(m)
    if std < 10:  # the lattice pmf's own moments: for small std they are not 123.4 and std**2
        k = np.arange(int(123 - 12 * std) - 2, int(124 + 12 * std) + 3)
        pmf = np.exp2(-gaussian_bits(k, np.full(k.shape, 123.4), np.full(k.shape, std), quantized=False))
        mu, var = (k * pmf).sum(), (k**2 * pmf).sum() - (k * pmf).sum() ** 2
    else:  # Sheppard: rounding adds 1/12
        mu, var = 123.4, std**2 + 1 / 12
    assert abs(z.mean() - mu) < 5 * np.sqrt(var / n)
    assert abs(z.var() / var - 1) < 0.05
    g.push(m, z)
    assert np.array_equal(m.words(), pad)


@pytest.mark.parametrize(
    "n", [1, 2, 3, 255, 2**16, 2**24, 2**24 + 1, 3 * 2**16 + 5, 2**40, 2**40 + 12345, 2**62 - 1, 2**62]
)
def test_uniform(n):
    rng = np.random.default_rng(n % 1000)
    x = rng.integers(0, n, (50, 3), endpoint=False)
    x[0, 0], x[0, 1] = n - 1, 0
    u = uniform(n, (50, 3))
    size = _roundtrip(u, x)
    if n > 1:
        assert abs(size - 150 * np.log2(n)) < 30  # the short last bucket may be cheaper
    m = Message(padding_words(1000))
    z = u.pop(m)
    assert z.min() >= 0 and z.max() < n
    u.push(m, z)
    assert np.array_equal(m.words(), padding_words(1000))
    with pytest.raises(ValueError):
        u.push(m, np.full((50, 3), n))


def test_uniform_is_uniform():
    m = Message(padding_words(3000))
    z = uniform(2**40 + 3, (4000,)).pop(m)
    assert abs(z.mean() / (2**40) - 0.5) < 0.03


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 300), st.integers(2, 40), st.integers(0, 2**31))
def test_categorical_roundtrip_and_bits(n, k, seed):
    rng = np.random.default_rng(seed)
    p = rng.random((n, k)) ** 4 * rng.choice([1e-9, 1.0, 1e6])
    p[rng.random((n, k)) < 0.2] = 0.0
    p[:, 0] += 1e-300 * (p.sum(axis=1) == 0)  # keep every row normalizable
    x = rng.integers(0, k, n)
    size = _roundtrip(categorical(p), x)
    assert abs(size - categorical_bits(x, p).sum()) < _tol(n)


def test_categorical_prediction_close_to_float():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(256), 20_000)
    x = np.array([rng.choice(256, p=row) for row in p[:2000]])
    q = categorical_bits(x, p[:2000])
    f = categorical_bits(x, p[:2000], quantized=False)
    assert np.abs(q - f).max() < 1e-3  # symbols of reasonable probability: ~1e-5 relative
    with pytest.raises(ValueError):
        categorical(np.ones((3, 1)))
    with pytest.raises(ValueError):
        categorical(-np.ones((3, 2)))
    with pytest.raises(ValueError):
        categorical(np.ones((3, 2))).push(Message(PAD), np.array([0, 1, 2]))
