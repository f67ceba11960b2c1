"""estimate.sequential_mean: the weighted mean of many units from as few as a decision needs.

Checked against independent computations: the full mean by numpy, the standard error against the
spread of the estimator over repeated samples, and the decision's error rate over every order of
skewed populations whose mean sits exactly on the threshold."""
import numpy as np
import pytest

from scoreflow_codec.estimate import Estimate, sequential_mean, weighted_mean


def _counting(values):
    calls = []

    def evaluate(idx):
        calls.append(np.array(idx))
        return values[idx]
    return evaluate, calls


def test_weighted_mean_and_its_standard_error_for_equal_weights():
    v = np.random.default_rng(0).normal(3.0, 0.7, 40)
    m, se = weighted_mean(v, np.full(40, 5.0))
    assert m == pytest.approx(v.mean(), abs=1e-12)
    assert se == pytest.approx(v.std(ddof=1) / np.sqrt(40), rel=1e-12)
    assert weighted_mean(v[:1], [1.0]) == (v[0], float("inf"))


def test_weighted_standard_error_matches_the_spread_of_the_estimator():
    """Units of two weights (images of two sizes), values correlated with the weight: the ratio
    estimator's spread over 4,000 independent samples of 24 units against the mean predicted se."""
    rng = np.random.default_rng(1)
    w_pop = np.where(rng.random(500) < 0.3, 4.0, 1.0)
    v_pop = rng.gamma(2.0, 1.0, 500) + 0.5 * w_pop
    means, ses = [], []
    for _ in range(4000):
        i = rng.integers(0, 500, 24)  # with replacement: the se leaves out the finite-population term
        m, se = weighted_mean(v_pop[i], w_pop[i])
        means.append(m), ses.append(se)
    assert np.std(means) == pytest.approx(np.sqrt(np.mean(np.square(ses))), rel=0.06)


def test_grouped_standard_error_covers_noise_shared_within_groups():
    """Units whose evaluation noise is shared within groups (bench/ode_sample.py's legacy parts: the
    images at the same place in every part drew the same random numbers): 40 units in 8 groups, each
    group one shared offset of sd 0.8 on top of unit noise of sd 1. The plain standard error
    understates the estimator's spread over 4,000 repeats (ratio about 0.7); the grouped one
    matches it, for the plain mean and the regression estimator. Distinct labels change nothing."""
    rng = np.random.default_rng(5)
    groups = np.arange(40) % 8
    means, ses, plain, reg, reg_ses = [], [], [], [], []
    for _ in range(4000):
        c = rng.normal(0, 1, 40)
        v = 2.0 + 0.8 * c + rng.normal(0, 1, 40) + rng.normal(0, 0.8, 8)[groups]
        m, se = weighted_mean(v, np.ones(40), groups=groups)
        means.append(m), ses.append(se), plain.append(weighted_mean(v, np.ones(40))[1])
        m, se = weighted_mean(v, np.ones(40), covariate=c, covariate_mean=0.0, groups=groups)
        reg.append(m), reg_ses.append(se)
    rms = lambda x: np.sqrt(np.mean(np.square(x)))  # noqa: E731
    assert np.std(means) == pytest.approx(rms(ses), rel=0.08)
    assert rms(plain) < 0.8 * np.std(means)
    assert np.std(reg) == pytest.approx(rms(reg_ses), rel=0.1)
    v, c = rng.normal(0, 1, 12), rng.normal(0, 1, 12)
    assert weighted_mean(v, np.ones(12), c, 0.1, groups=np.arange(12)[::-1]) == pytest.approx(weighted_mean(v, np.ones(12), c, 0.1))
    assert weighted_mean(v, np.ones(12), c, 0.1, groups=np.arange(12) % 2)[1] == float("inf")


def test_without_a_threshold_every_unit_counts_once():
    rng = np.random.default_rng(2)
    v, w = rng.normal(2, 1, 100), rng.integers(1, 5, 100).astype(float)
    evaluate, calls = _counting(v)
    e = sequential_mean(evaluate, w, 16, None, 4.0, np.random.default_rng(0))
    assert e == Estimate(pytest.approx(np.average(v, weights=w), abs=1e-12), 0.0, 100, 100) and e.complete
    seen = np.concatenate(calls)
    assert sorted(seen) == list(range(100)) and max(len(c) for c in calls) == 16


def test_stops_at_the_first_batch_that_decides_on_either_side():
    v = np.random.default_rng(3).normal(3.5, 0.3, 96)
    for threshold, above in ((3.0, True), (4.0, False)):
        evaluate, calls = _counting(v)
        e = sequential_mean(evaluate, np.ones(96), 16, threshold, 4.0, np.random.default_rng(0))
        assert len(calls) == 1 and e.units == 16 and not e.complete
        assert (e.mean > threshold) == above and abs(e.mean - threshold) > 4.0 * e.se
    # close to the threshold: no batch decides, every unit is taken and the mean is the population's
    e = sequential_mean(lambda i: v[i], np.ones(96), 16, v.mean() + 1e-3, 4.0, np.random.default_rng(0))
    assert e.complete and e.mean == pytest.approx(v.mean(), abs=1e-12)


def test_one_unit_never_decides():
    e = sequential_mean(lambda i: np.full(len(i), 9.0), np.ones(5), 1, 0.0, 4.0, np.random.default_rng(0))
    assert e.units == 2  # the first unit has no standard error; two equal values decide


@pytest.mark.parametrize("sigma", [0.5, 1.0, 1.5])
def test_a_population_on_the_threshold_is_rarely_called_above_it(sigma):
    """The error that costs bytes: calling the model's bound above the threshold (skipping its
    stream) when it is not. Skewed (log-normal) populations of 96 tiles, mean exactly on the
    threshold, 3,000 orders each: at z = 4, at most 0.5% of the orders stop early on the wrong side
    (measured on the photo model's Kodak tiles: 0.05% - 0.45%)."""
    pop = np.random.default_rng(4).lognormal(0.0, sigma, 96)
    wrong = 0
    for k in range(3000):
        e = sequential_mean(lambda i: pop[i], np.ones(96), 16, pop.mean() + 1e-12, 4.0, np.random.default_rng(k))
        wrong += (not e.complete) and e.mean > pop.mean()
    assert wrong / 3000 <= 0.005


def test_far_from_the_threshold_a_fraction_of_the_units_decides():
    """Spread like the photo model's 64px Kodak tiles (sd 0.3 - 0.8 bits/dim), 0.4 above the
    threshold: over 500 orders the estimate takes 36 of the 96 units on average (measured), never
    more than four of the six batches."""
    rng = np.random.default_rng(5)
    pop = 3.0 + rng.gamma(2.0, 0.4, 96)  # sd 0.54, skewed to the right
    used = [sequential_mean(lambda i: pop[i], np.ones(96), 16, pop.mean() - 0.4, 4.0,
                            np.random.default_rng(k)).units for k in range(500)]
    assert max(used) <= 64 and np.mean(used) <= 40


def _correlated(seed, n=500):
    """Values that follow a covariate (correlation 0.92), with skewed noise, and weights."""
    rng = np.random.default_rng(seed)
    c = rng.gamma(3.0, 1.0, n)
    return c, 1.0 + 0.5 * c + rng.gamma(2.0, 0.25, n), np.where(rng.random(n) < 0.3, 4.0, 1.0)


def test_regression_standard_error_matches_the_spread_of_the_estimator():
    """The regression estimator over 4,000 independent samples of 24 units: unbiased to within
    its noise, its spread against the mean predicted se (measured: 0.089 against 0.083; the
    residuals' se runs a little low at small samples, which z = 4 absorbs), and well below the
    plain mean's (0.220)."""
    c_pop, v_pop, w_pop = _correlated(6)
    c_mean, v_mean = np.average(c_pop, weights=w_pop), np.average(v_pop, weights=w_pop)
    rng = np.random.default_rng(7)
    reg, plain = [], []
    for _ in range(4000):
        i = rng.integers(0, 500, 24)
        reg.append(weighted_mean(v_pop[i], w_pop[i], c_pop[i], c_mean))
        plain.append(weighted_mean(v_pop[i], w_pop[i])[0])
    m, se = np.array(reg).T
    assert np.std(m) == pytest.approx(np.sqrt(np.mean(se ** 2)), rel=0.1)
    assert abs(np.mean(m) - v_mean) < 3 * np.std(m) / np.sqrt(4000) + 0.01 * np.std(m)
    assert np.std(m) < 0.65 * np.std(plain)
    assert weighted_mean(v_pop[:2], w_pop[:2], c_pop[:2], c_mean)[1] == float("inf")


def test_with_a_covariate_fewer_units_decide_and_all_units_give_the_plain_mean():
    """0.25 below the mean: over 300 orders the plain mean never decides before the last batch
    (96 units), the regression estimator after 50 units on average (measured)."""
    c, v, w = _correlated(8, 96)
    threshold = np.average(v, weights=w) - 0.25
    for cov in (None, c):
        used = [sequential_mean(lambda i: v[i], w, 16, threshold, 4.0, np.random.default_rng(k), cov).units
                for k in range(300)]
        if cov is None:
            plain = np.mean(used)
    assert np.mean(used) < 0.6 * plain
    e = sequential_mean(lambda i: v[i], w, 16, None, 4.0, np.random.default_rng(0), c)
    assert e.complete and e.mean == pytest.approx(np.average(v, weights=w), rel=1e-14)


@pytest.mark.parametrize("seed", [9, 10])
def test_with_a_covariate_a_population_on_the_threshold_is_rarely_called_above_it(seed):
    """As without a covariate: 3,000 orders of 96 units whose weighted mean is on the threshold
    (measured: no order stops early on the wrong side)."""
    c, v, w = _correlated(seed, 96)
    mean = np.average(v, weights=w)
    wrong = 0
    for k in range(3000):
        e = sequential_mean(lambda i: v[i], w, 16, mean + 1e-12, 4.0, np.random.default_rng(k), c)
        wrong += (not e.complete) and e.mean > mean
    assert wrong / 3000 <= 0.005


def test_bad_arguments():
    with pytest.raises(ValueError, match="nothing"):
        sequential_mean(lambda i: i, np.ones(0), 4, None, 4.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="batch"):
        sequential_mean(lambda i: i, np.ones(3), 0, None, 4.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="values for"):
        sequential_mean(lambda i: np.zeros(1), np.ones(3), 2, None, 4.0, np.random.default_rng(0))
