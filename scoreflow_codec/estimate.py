"""A mean over many units, estimated from as few of them as a decision needs.

`compress(fallback="auto")` codes the model's stream only where the model's bound is not more than
a margin above the seed codec's file. The bound is a mean over the images' tiles, and evaluating
every tile of a Kodak image takes about 45 s on a CPU core, mostly to learn that the model is 0.3 -
0.7 bits/dim above the threshold. `sequential_mean` takes the units (tiles) in a random order, a
batch at a time, and stops as soon as the running weighted mean lies more than `z` standard errors
from the threshold, on either side; with no threshold, or when no batch decides, it takes every
unit, and its mean is then the mean over all of them.

Error model: the units taken are a simple random sample of all of them, each with its own
evaluation noise (independent time samples per tile). The weighted mean is a ratio estimator; its
standard error is the usual linearization, sqrt(n / (n - 1) * sum(w_i (v_i - m))^2) / sum(w_i),
which for equal weights is the sample standard deviation over sqrt(n). It leaves out the
finite-population correction sqrt(1 - n / N), which would shrink it: conservative, and right for
the evaluation noise, which does not shrink as the sample covers the population.

A covariate known for every unit (for tiles, a cheap measure of their texture) turns the mean into
a regression estimator: the sample's mean corrected by its slope times how far the sample's
covariate mean is from the population's (weighted_mean). On the photo model's 64px Kodak tiles a
covariate with a correlation of 0.8 - 0.85 halved the tiles a decision needs
(api.estimate_model_bpd). The standard errors, and the decisions' error rates over every order of
skewed populations, are checked by simulation in tests/test_estimate.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Estimate:
    """A weighted mean over `total` units from the `units` evaluated; `se` is its standard error
    (0.0 once every unit is in: the mean is then the population's, up to the units' own noise)."""

    mean: float
    se: float
    units: int
    total: int

    @property
    def complete(self) -> bool:
        return self.units == self.total


def weighted_mean(values: np.ndarray, weights: np.ndarray, covariate: np.ndarray | None = None,
                  covariate_mean: float | None = None, groups: np.ndarray | None = None) -> tuple[float, float]:
    """(the weighted mean, its linearized standard error as a ratio estimator; inf where too few).

    With a covariate (known for every unit, its weighted mean over all of them `covariate_mean`):
    the regression estimator m_v + beta (covariate_mean - m_c), beta the sample's weighted
    least-squares slope of values on covariate; its standard error from the residuals, with two
    degrees of freedom used. Where the sample is the whole population, m_c = covariate_mean and
    the estimate is the plain mean.

    groups: a label per unit, where units' evaluation noise is not independent (units evaluated with
    the same random draws share part of their error): the standard error is then the cluster-robust
    one, the residuals summed within each group, sqrt(G / (G - used) * sum_g (sum_{i in g} r_i)^2) / sum w
    over G groups (inf where G <= used). With every label distinct it is the formula above.
    """
    v, w = np.asarray(values, np.float64), np.asarray(weights, np.float64)
    n, sw = len(v), w.sum()
    m = float(np.dot(w, v) / sw)
    r = w * (v - m)
    used = 1
    if covariate is not None:
        c = np.asarray(covariate, np.float64)
        mc = float(np.dot(w, c) / sw)
        dc = c - mc
        ss = float(np.dot(w, dc * dc))
        beta = float(np.dot(w, dc * (v - m))) / ss if ss > 0 else 0.0
        m += beta * (covariate_mean - mc)
        r = r - beta * w * dc
        used = 2
    if groups is not None:
        _, inverse = np.unique(np.asarray(groups), return_inverse=True)
        r = np.bincount(inverse.ravel(), weights=r)
        n = len(r)
    if n <= used:
        return m, float("inf")
    return m, float(np.sqrt(n / (n - used) * np.dot(r, r)) / sw)


def sequential_mean(evaluate: Callable[[np.ndarray], np.ndarray], weights: np.ndarray, batch: int,
                    threshold: float | None, z: float, rng: np.random.Generator,
                    covariate: np.ndarray | None = None) -> Estimate:
    """The weighted mean of evaluate(units) over all units, or over a random sample of them that
    puts it more than z standard errors above or below `threshold`.

    evaluate(idx) returns the values of the units idx (an int array, at most `batch` of them);
    weights[i] is unit i's weight; covariate[i], where given, a cheap number known for every unit
    and correlated with its value (weighted_mean's regression estimator). Units are taken in the
    order rng.permutation(len(weights)), `batch` at a time; the test follows every batch."""
    weights = np.asarray(weights, np.float64)
    total = len(weights)
    if total == 0:
        raise ValueError("nothing to estimate")
    if batch < 1:
        raise ValueError(f"batch must be positive, got {batch}")
    cov_mean = None
    if covariate is not None:
        covariate = np.asarray(covariate, np.float64)
        cov_mean = float(np.dot(weights, covariate) / weights.sum())
    order = rng.permutation(total)
    values = np.empty(total)
    for start in range(0, total, batch):
        idx = order[start:start + batch]
        v = np.asarray(evaluate(idx), np.float64)
        if v.shape != idx.shape:
            raise ValueError(f"evaluate returned {v.shape} values for {len(idx)} units")
        values[idx] = v
        n = start + len(idx)
        if n == total:
            return Estimate(float(np.dot(weights, values) / weights.sum()), 0.0, n, total)
        taken = order[:n]
        m, se = weighted_mean(values[taken], weights[taken], None if covariate is None else covariate[taken], cov_mean)
        if threshold is not None and abs(m - threshold) > z * se:
            return Estimate(m, se, n, total)
    raise AssertionError("unreachable")
