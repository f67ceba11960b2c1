"""Message, combinators, bits-back and the initial-bits scheme (coding/ans.py)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from scoreflow_codec.coding.ans import (
    Codec,
    Message,
    bits_back,
    chain,
    common_prefix_len,
    padding_words,
    repeat,
    serial,
)
from scoreflow_codec.coding.distributions import (
    categorical,
    categorical_bits,
    gaussian,
    gaussian_bits,
    uniform,
)

# Fixed so that a change of the generator (which would break old files) fails loudly.
# splitmix64(seed 0) = 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f, ...: high halves.
GOLDEN_PAD_SEED0 = [0xE220A839, 0x6E789E6A, 0x06C45D18, 0xF88BB8A8]


def test_message_basics():
    m = Message()
    assert m.is_empty() and m.num_bits() == 0 and m.words().dtype == np.uint32
    uniform(256, (10,)).push(m, np.arange(10))
    w = m.words()
    c = m.clone()
    assert (uniform(256, (10,)).pop(c) == np.arange(10)).all()
    assert (m.words() == w).all()  # the clone is independent
    assert (Message(w).words() == w).all()
    with pytest.raises(ValueError):
        Message(np.array([5, 0], dtype=np.uint32))


def test_padding_words_golden_prefix_nonzero():
    pad = padding_words(10_000)
    assert pad.dtype == np.uint32 and (pad != 0).all()
    assert [int(v) for v in pad[:4]] == GOLDEN_PAD_SEED0
    assert (padding_words(17) == pad[:17]).all()
    assert not (padding_words(8, seed=1) == pad[:8]).all()
    # looks random: mean bit ~ 0.5
    assert abs(np.unpackbits(pad.view(np.uint8)).mean() - 0.5) < 0.01


def test_common_prefix_len():
    pad = padding_words(10)
    assert common_prefix_len(pad, pad) == 10
    assert common_prefix_len(pad[:4], pad) == 4
    w = np.concatenate([pad[:6], np.array([1, 2], dtype=np.uint32)])
    assert common_prefix_len(w, pad) == 6
    assert common_prefix_len(np.zeros(0, np.uint32), pad) == 0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 2**40 - 1), min_size=0, max_size=6), st.integers(0, 3))
def test_serial_repeat_roundtrip(values, seed):
    codecs = [uniform(2**40, ()) for _ in values]
    m = Message(padding_words(4, seed))
    w0 = m.words()
    serial(codecs).push(m, [np.int64(v) for v in values])
    assert [int(v) for v in serial(codecs).pop(m)] == values
    assert (m.words() == w0).all()
    r = repeat(uniform(7, (2,)), 3)
    xs = [np.array([i, 6 - i]) for i in range(3)]
    r.push(m, xs)
    assert all((a == b).all() for a, b in zip(r.pop(m), xs))
    with pytest.raises(ValueError):
        serial(codecs).push(m, [0] * (len(values) + 1))


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 1000), st.integers(-(2**50), 2**50))
def test_chain_roundtrip(n, x2):
    # x2's distribution depends on x1: the mean is x1 * 1000, the std x1.
    then = lambda x1: gaussian(np.array([x1 * 1000.0]), np.array([float(x1)]))
    c = chain(uniform(1001, ()), then)
    m = Message(padding_words(8))
    w0 = m.words()
    c.push(m, (np.int64(n), np.array([x2])))
    x1, y2 = c.pop(m)
    assert int(x1) == n and int(y2[0]) == x2 and (m.words() == w0).all()


def _toy_model(n: int, seed: int):
    """z ~ Cat(pi) over K clusters, x | z ~ lattice N(mu_z, s_z): closed-form posterior."""
    rng = np.random.default_rng(seed)
    k = 4
    pi = np.array([0.1, 0.2, 0.3, 0.4])
    mu = np.array([-40.0, -5.0, 10.0, 60.0])
    s = np.array([3.0, 8.0, 2.0, 20.0])
    z = rng.choice(k, size=n, p=pi)
    x = np.rint(rng.normal(mu[z], s[z])).astype(np.int64)
    return pi, mu, s, x


def _log2_px_given_z(x, mu, s):
    """[N, K] log2 p(x | z = j) under the float64 lattice Gaussian."""
    return np.stack(
        [-gaussian_bits(x, np.full(len(x), m), np.full(len(x), sd), quantized=False) for m, sd in zip(mu, s)],
        axis=1,
    )


@pytest.mark.parametrize("exact_posterior", [True, False])
def test_bits_back_toy_matches_closed_form(exact_posterior):
    n = 4000
    pi, mu, s, x = _toy_model(n, 0)
    lpxz = _log2_px_given_z(x, mu, s)
    log_joint = lpxz + np.log2(pi)
    post = np.exp2(log_joint - log_joint.max(axis=1, keepdims=True))
    post /= post.sum(axis=1, keepdims=True)
    # A worse q (tempered posterior) costs the ELBO gap. Not a mixture with a uniform: that would
    # put mass on clusters 100 std away, where the float64 model's cost (hundreds of bits) and the
    # codec's escape (capped near 40 bits) part ways.
    q = post if exact_posterior else np.sqrt(post) / np.sqrt(post).sum(axis=1, keepdims=True)
    prior_table = np.broadcast_to(pi, (n, 4))

    posterior = lambda x_: categorical(q)
    likelihood = lambda z: gaussian(mu[z], s[z])
    prior = categorical(prior_table)
    codec = bits_back(posterior, likelihood, prior)

    pad = padding_words(20_000)  # enough initial bits for the first pops
    m = Message(pad)
    b0 = m.num_bits()
    codec.push(m, x)
    net = m.num_bits() - b0

    # Net cost of the sampled z, from the coder's own (quantized) probabilities.
    z = categorical(q).pop(Message(pad))  # the same first pop the encoder made
    predicted = (
        gaussian_bits(x, mu[z], s[z]).sum() + categorical_bits(z, prior_table).sum()
        - categorical_bits(z, q).sum()
    )
    assert abs(net - predicted) < 4
    # Closed form: -log2 p(x) for the exact posterior, -ELBO (an expectation over q) otherwise.
    neg_log_px = -(np.log2(np.exp2(log_joint - log_joint.max(1, keepdims=True)).sum(1)) + log_joint.max(1))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(q > 0, np.log2(q) - log_joint, 0.0)
    neg_elbo = (q * ratio).sum(axis=1)
    sd = np.sqrt(((q * ratio**2).sum(axis=1) - neg_elbo**2).clip(0).sum())
    if exact_posterior:
        assert abs(net - neg_log_px.sum()) < 1e-3 * n  # only 24-bit quantization separates them
    else:
        assert neg_elbo.sum() > neg_log_px.sum() + 50  # the worse q really costs
        # z is random: the sampled net cost is within a few std of its expectation.
        assert abs(net - neg_elbo.sum()) < 5 * sd + 1e-3 * n

    # Decode: strip the untouched padding, re-prepend it, pop, and the padding comes back.
    words = m.words()
    k = common_prefix_len(words, pad)
    assert k > 0
    m2 = Message(np.concatenate([padding_words(k), words[k:]]))
    assert (codec.pop(m2) == x).all()
    assert (m2.words() == pad).all()


def test_codec_is_frozen():
    c = uniform(3, ())
    assert isinstance(c, Codec)
    with pytest.raises(Exception):
        c.push = None  # type: ignore[misc]
