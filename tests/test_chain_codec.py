"""The diffusion-chain path: round trips, real size vs predicted codelength, and convergence of
the real size to the chain's -ELBO (discrete_chain.py), which converges to the exact NLL."""

import numpy as np
import pytest
import torch

from scoreflow_codec import pixels
from scoreflow_codec.coding.ans import Message, padding_words
from scoreflow_codec.coding.chain_codec import ChainSettings, scramble
from scoreflow_codec.coding.pipeline import build_tile_codec
from scoreflow_codec.dequant import UniformDequantizer
from scoreflow_codec.discrete_chain import chain_coeffs, chain_elbo_bpd

from coding_models import code_and_decode, gaussian_images, gaussian_model

PAD = 60000


def test_scramble_is_a_fixed_permutation():
    for n in (1, 2, 48, 3072, 1000):
        p = scramble(5, n)
        assert sorted(p.tolist()) == list(range(n))
        assert np.array_equal(p, scramble(5, n))
    assert scramble(0, 12).tolist() == [0, 7, 2, 9, 4, 11, 6, 1, 8, 3, 10, 5]  # pinned: part of the format


def test_chain_coefficients_are_consistent():
    model, _ = gaussian_model()
    co = chain_coeffs(model.sde, 50)
    # forward steps compose to the marginals: sigma_{i+1}^2 = a_i^2 sigma_i^2 + b_i^2
    assert np.allclose(co.sigma[1:] ** 2, co.a ** 2 * co.sigma[:-1] ** 2 + co.b ** 2)
    # posterior of z_i | z_{i+1}, y by completing the square vs the closed form used
    prec = 1 / co.sigma[:-1] ** 2 + co.a ** 2 / co.b ** 2
    assert np.allclose(co.post_std ** 2, 1 / prec)
    assert np.allclose(co.post_zc, co.a / co.b ** 2 / prec)
    assert np.allclose(co.post_xc, co.alpha[:-1] / co.sigma[:-1] ** 2 / prec)


@pytest.mark.parametrize("steps,tol", [(64, None), (1024, 0.05)])
def test_gaussian_round_trip_and_elbo(steps, tol):
    model, g = gaussian_model((3, 4, 4))
    x = gaussian_images(model, 32, g)
    dq = UniformDequantizer()
    tc = build_tile_codec(model, dq, model.sde, "chain", ChainSettings(steps=steps).to_dict(), micro_batch=8)
    actual, pred, back, m = code_and_decode(tc, x, PAD)
    assert abs(actual - pred) <= 64
    assert np.array_equal(back, x)
    assert np.array_equal(m.words(), padding_words(PAD))
    if tol is not None:
        xt = torch.from_numpy(x)
        elbo = np.mean([chain_elbo_bpd(model, xt, dq, tc.flow.co, generator=g).mean().item() for _ in range(8)])
        # and the chain's -ELBO itself approaches the exact dequantization bound as T grows
        u = torch.rand((64,) + x.shape, generator=g, dtype=torch.float64).reshape(-1, *x.shape[1:])
        y = pixels.to_model(xt.repeat(64, 1, 1, 1), u)
        exact = pixels.nats_to_bpd(-model.log_prob_t(y, model.sde.eps), y[0].numel()).mean().item()
        assert abs(actual / x.size - elbo) < tol, (actual / x.size, elbo)
        assert 0 < elbo - exact < 0.15, (elbo, exact)


def test_calibrated_reverse_variance_is_the_kl_optimum():
    """With the model's denoising error m, v = s^2 + c_x^2 (sigma/alpha)^2 m minimises the expected
    KL of a reverse step; check on an exact Gaussian model, where m and the KL are computable."""
    from scoreflow_codec.calibration import eps_mse_table, interpolate

    model, g = gaussian_model((3, 4, 4))
    x = torch.from_numpy(gaussian_images(model, 256, g))
    table = eps_mse_table(model, x, points=9, repeats=1, generator=g)
    assert all(0 <= v <= 1.05 for v in table["mse"])  # eps_hat is never worse than predicting 0
    lam = np.array(table["log_snr"])
    assert np.allclose(interpolate(table, lam), table["mse"]) and np.all(interpolate(None, lam) == 0)
    co = chain_coeffs(model.sde, 8, eps_mse=table)
    plain = chain_coeffs(model.sde, 8)
    assert np.all(co.rev_std >= plain.post_std) and np.any(co.rev_std > 1.01 * plain.post_std)
    # the calibrated chain's bound is lower (better) than the posterior-variance one
    dq = UniformDequantizer()
    b_cal = np.mean([chain_elbo_bpd(model, x[:64], dq, co, generator=g).mean().item() for _ in range(4)])
    b_post = np.mean([chain_elbo_bpd(model, x[:64], dq, plain, generator=g).mean().item() for _ in range(4)])
    assert b_cal < b_post, (b_cal, b_post)


class _HalfLinearEps(torch.nn.Module):
    """eps_hat(z, t) = z / (2 sigma_t): on constant images x its error has the closed form
    E||eps - eps_hat||^2 / D = 1/4 + 1/4 snr E[y^2], which depends on how u is drawn."""

    def __init__(self):
        super().__init__()
        from scoreflow_codec.sde import VPSDE

        self.sde = VPSDE()

    def forward(self, z, t):
        _, sigma = self.sde.marginal_coeffs(t.to(torch.float64))
        return 0.5 * z / sigma.to(z.dtype).view(-1, 1, 1, 1)


class _QuarterDequantizer(UniformDequantizer):
    """u uniform on [1/4, 3/4): E[u^2] = 1/48 + 1/4 = 13/48 instead of the uniform 1/3."""

    def sample(self, x_uint8, generator=None):
        u = 0.25 + 0.5 * torch.rand(x_uint8.shape, generator=generator)
        return u, torch.zeros(x_uint8.shape[0])


def test_eps_mse_table_draws_u_from_the_dequantizer():
    """The table's y = x + u takes u from the model's dequantizer where given (what the codec
    codes), uniform otherwise; checked against the closed form of a linear network at every
    log-SNR, where the two differ by up to 19%."""
    from scoreflow_codec.calibration import eps_mse_table

    model = _HalfLinearEps()
    x = torch.full((128, 3, 4, 4), 128, dtype=torch.uint8)  # y = u / 128
    closed = {}
    for dq, eu2 in ((None, 1 / 3), (_QuarterDequantizer(), 13 / 48)):
        table = eps_mse_table(model, x, points=9, repeats=2, generator=torch.Generator().manual_seed(5), dequantizer=dq)
        snr = np.exp(np.array(table["log_snr"]))
        closed[eu2] = 0.25 + 0.25 * snr * eu2 / 128 ** 2
        assert np.allclose(table["mse"], closed[eu2], rtol=0.04, atol=0.01), (table["mse"], closed[eu2])
        assert table.get("u") == (None if dq is None else "dequantizer")
    assert closed[1 / 3][-1] > 1.15 * closed[13 / 48][-1]  # the tolerance tells the two apart


def _exact_gaussian_table(model, points=2001):
    """m(lam) of the exact (Bayes) denoiser of N(mu, s^2) data: Var(eps | z) = a^2 s^2 / (a^2 s^2 + sig^2)."""
    sde = model.sde
    ends = sde.log_snr(torch.tensor([sde.T, sde.eps], dtype=torch.float64))
    lam = torch.linspace(float(ends[0]), float(ends[1]), points, dtype=torch.float64)
    snr_s2 = torch.exp(lam)[:, None] * model.s.flatten()[None] ** 2
    return {"log_snr": lam.tolist(), "mse": (snr_s2 / (1 + snr_s2)).mean(1).tolist()}


def test_chain_step_nats_is_the_expected_kl_of_each_step():
    """E[-ELBO] of the calibrated chain on exact Gaussian data = decoder + sum of chain_step_nats + prior
    (closed forms), against a Monte Carlo mean of chain_elbo_terms."""
    from scoreflow_codec.calibration import chain_step_nats, interpolate
    from scoreflow_codec.discrete_chain import chain_elbo_terms, expected_step_nats

    model, g = gaussian_model((3, 4, 4))
    table = _exact_gaussian_table(model)
    for schedule in ("logsnr", "calibrated", "optimized"):
        co = chain_coeffs(model.sde, 12, schedule=schedule, eps_mse=table)
        lam = (2 * (np.log(co.alpha) - np.log(co.sigma)))[::-1]  # increasing: noisy -> clean
        D = model.mu.numel()
        mu, s = model.mu.flatten().numpy(), model.s.flatten().numpy()
        dec = 0.5 * np.log(2 * np.pi * (co.sigma[0] / co.alpha[0]) ** 2) + 0.5 * interpolate(table, lam[-1:])[0]
        p, sT, aT = co.prior_std, co.sigma[-1], co.alpha[-1]
        prior = np.mean(np.log(p / sT) + (sT ** 2 + aT ** 2 * (mu ** 2 + s ** 2)) / (2 * p ** 2) - 0.5)
        predicted = D * (dec + chain_step_nats(table, lam).sum() + prior)
        y = model.mu + model.s * torch.randn((20000,) + tuple(model.mu.shape), generator=g, dtype=torch.float64)
        mc = chain_elbo_terms(model, y, co, generator=g)
        assert abs(mc.mean().item() - predicted) < 4 * mc.std().item() / len(mc) ** 0.5 + 1e-3, (schedule, mc.mean().item(), predicted)
    # a systematic sample of the 11 reverse steps (3, 5: a stride of 11/3, 11/5 steps, not whole) is
    # unbiased too: its mean is the same closed form
    co = chain_coeffs(model.sde, 12, schedule="optimized", eps_mse=table)
    lam = (2 * (np.log(co.alpha) - np.log(co.sigma)))[::-1]
    dec = 0.5 * np.log(2 * np.pi * (co.sigma[0] / co.alpha[0]) ** 2) + 0.5 * interpolate(table, lam[-1:])[0]
    p, sT, aT = co.prior_std, co.sigma[-1], co.alpha[-1]
    prior = np.mean(np.log(p / sT) + (sT ** 2 + aT ** 2 * (mu ** 2 + s ** 2)) / (2 * p ** 2) - 0.5)
    steps = chain_step_nats(table, lam)
    predicted = D * (dec + steps.sum() + prior)
    assert steps.max() > 2 * steps.min()  # unequal terms: a biased sample of them would show
    for k in (3, 5):
        y = model.mu + model.s * torch.randn((40000,) + tuple(model.mu.shape), generator=g, dtype=torch.float64)
        mc = chain_elbo_terms(model, y, co, generator=g, steps=k)
        assert abs(mc.mean().item() - predicted) < 4 * mc.std().item() / len(mc) ** 0.5 + 1e-3, (k, mc.mean().item(), predicted)
        # the tolerance tells it from a sample that does not shift (u = 0: the steps floor(j r) alone)
        r = 11 / k
        unshifted = D * (dec + r * steps[::-1][np.floor(np.arange(k) * r).astype(int)].sum() + prior)  # chain order
        assert abs(unshifted - predicted) > 8 * mc.std().item() / len(mc) ** 0.5 + 1e-3, (k, unshifted, predicted)
        # drawn in proportion to the steps' expected terms (expected_step_nats): unbiased, and a smaller spread
        w = expected_step_nats(co, table)
        assert np.allclose(w, steps[::-1], rtol=1e-12)  # the same terms, in chain order
        pps = chain_elbo_terms(model, y, co, generator=g, steps=k, step_weights=w)
        assert abs(pps.mean().item() - predicted) < 4 * pps.std().item() / len(pps) ** 0.5 + 1e-3, (k, pps.mean().item())
        assert pps.std().item() < 0.8 * mc.std().item()
    assert expected_step_nats(co, None) is None


def test_sample_probs_are_proportional_capped_and_sum_to_the_sample():
    """discrete_chain.sample_probs: inclusion probabilities summing to k, none above 1, the items whose
    share would pass 1 always drawn and the rest proportional to their weights (a closed case by hand);
    zero weights keep a small probability (the estimate stays unbiased), equal weights give k / n."""
    from scoreflow_codec.discrete_chain import sample_probs

    p = sample_probs(np.array([10.0, 1, 1, 1, 1, 1]), 3)  # 10 / 15 x 3 = 2 > 1: drawn; 2 left over 5 equal
    assert np.allclose(p, [1, 0.4, 0.4, 0.4, 0.4, 0.4])
    p = sample_probs(np.array([50.0, 20, 4, 2, 1, 1]), 3)  # 50 and then 20 capped; 1 left over 4, 2, 1, 1
    assert np.allclose(p, [1, 1, 0.5, 0.25, 0.125, 0.125])
    p = sample_probs(np.array([3.0, 0.0, 1.0]), 2)
    assert p.sum() == pytest.approx(2) and p[1] > 0 and p.max() <= 1
    assert np.allclose(sample_probs(np.ones(11), 3), 3 / 11) and np.array_equal(sample_probs(np.ones(4), 4), np.ones(4))


def test_calibrated_step_grid():
    """step_grid: exact ends, uniform in log-SNR without a table; its excess over the continuous bound
    (exact per-step formula) is below the uniform grid's, and one small step's excess is c d^2."""
    from scoreflow_codec.calibration import grid_excess_nats, interpolate, step_grid

    assert np.allclose(step_grid(None, -10.0, 14.0, 9), np.linspace(-10, 14, 9), rtol=0, atol=1e-9)

    def sigmoid_table(points):  # m rises from 0 to 1 as for images, slope m (1 - m) / 1.5
        lam = np.linspace(-10, 14, points)
        return {"log_snr": lam.tolist(), "mse": (1 / (1 + np.exp(-(lam - 4) / 1.5))).tolist()}

    table = sigmoid_table(97)

    def excess(grid):
        return grid_excess_nats(table, grid)

    for n in (16, 64, 128):
        grid = step_grid(table, -10.0, 14.0, n)
        assert len(grid) == n and grid[0] == -10.0 and grid[-1] == 14.0 and np.all(np.diff(grid) > 0)
        assert np.array_equal(grid * 2.0 ** 20, np.round(grid * 2.0 ** 20))  # on the 2^-20 lattice
        assert 0 < excess(grid) < 0.8 * excess(np.linspace(-10, 14, n)), n
    # the expansion behind the density: excess of one step of size d ~ c d^2, c = (m (1 - m) - m') / 4
    table = sigmoid_table(48001)
    l0 = 2.0
    m0 = float(interpolate(table, np.array([l0]))[0])
    c = (m0 * (1 - m0) - m0 * (1 - m0) / 1.5) / 4  # m' of the sigmoid
    for d in (0.04, 0.02):
        assert abs(excess(np.array([l0, l0 + d])) / (c * d * d) - 1) < 0.05


def test_grid_excess_nats():
    """grid_excess_nats against closed forms: with m constant (= c) each step of size d costs
    0.5 log(1 + (e^d - 1) c) against 0.5 c d (above it for 0 < c < 1: log is concave); with m
    piecewise linear between few knots, the integral is exact where a fine trapezoid converges to it."""
    from scoreflow_codec.calibration import chain_step_nats, grid_excess_nats, interpolate

    grid = np.array([-10.0, -7.5, -1.0, 3.0, 3.25, 14.0])
    d = np.diff(grid)
    for c in (0.0, 0.3, 1.0):
        table = {"log_snr": [-10.0, 14.0], "mse": [c, c]}
        expected = float(np.sum(0.5 * np.log1p(np.expm1(d) * c)) - 0.5 * c * 24.0)
        assert abs(grid_excess_nats(table, grid) - expected) < 1e-12, c
        if 0.0 < c < 1.0:
            assert grid_excess_nats(table, grid) > 0.0
    assert abs(grid_excess_nats(None, grid)) < 1e-15  # no table is m = 0: a perfect model's steps cost nothing
    # knots that the grid does not hit: the exact integral of the interpolant
    table = {"log_snr": [-10.0, -2.3, 5.1, 14.0], "mse": [0.001, 0.05, 0.7, 1.0]}
    fine = np.linspace(-10.0, 14.0, 2_400_001)
    slow = chain_step_nats(table, grid).sum() - 0.5 * np.trapezoid(interpolate(table, fine), fine)
    assert abs(grid_excess_nats(table, grid) - slow) < 1e-9

def _sigmoid_table(points: int, top: float) -> dict:
    """m rising from 0 to `top` as for images (the shipped models' tables end at 1.004 and 1.021)."""
    lam = np.linspace(-10, 14, points)
    return {"log_snr": lam.tolist(), "mse": (top / (1 + np.exp(-(lam - 4) / 1.5))).tolist()}


def _best_single_move(table: dict, grid: np.ndarray, candidates: int = 2001) -> float:
    """The most that moving any one interior point of `grid` between its neighbours lowers the
    chain's expected cost (nats per dimension), by a dense scan with numpy's own log1p and expm1."""
    def m(x):
        return np.interp(x, table["log_snr"], table["mse"])

    best = 0.0
    for i in range(1, len(grid) - 1):
        a, b = grid[i - 1], grid[i + 1]

        def cost(x):
            return 0.5 * np.log1p(np.expm1(x - a) * m(a)) + 0.5 * np.log1p(np.expm1(b - x) * m(x))

        best = max(best, float(cost(np.array([grid[i]]))[0] - cost(np.linspace(a, b, candidates)[1:-1]).min()))
    return best


def test_optimized_step_grid():
    """optimized_grid: step_grid's uniform grid without a table; with one, exact ends on the 2^-20
    lattice, a lower expected cost than step_grid's, and (an independent check of the search) no
    single point can be moved to lower it by more than 2e-4 nats, where step_grid's can by 1e-3 or
    more. Its points are pinned: files of the "optimized" schedule decode only with this grid."""
    import hashlib

    from scoreflow_codec.calibration import grid_excess_nats, optimized_grid, step_grid

    assert np.array_equal(optimized_grid(None, -10.0, 14.0, 9), step_grid(None, -10.0, 14.0, 9))
    for top in (0.97, 1.03):
        table = _sigmoid_table(97, top)
        for n in (16, 64):
            grid, cal = optimized_grid(table, -10.0, 14.0, n), step_grid(table, -10.0, 14.0, n)
            assert len(grid) == n and grid[0] == -10.0 and grid[-1] == 14.0 and np.all(np.diff(grid) > 0)
            assert np.array_equal(grid * 2.0 ** 20, np.round(grid * 2.0 ** 20))
            assert grid_excess_nats(table, grid) < grid_excess_nats(table, cal) - 5e-4, (top, n)
            assert _best_single_move(table, grid) < 2e-4, (top, n)
            if n == 16:
                assert _best_single_move(table, cal) > 1e-3, (top, n)
    # where m passes 1 the exact cost takes one long last step instead of step_grid's floor density
    table = _sigmoid_table(97, 1.03)
    grid = optimized_grid(table, -10.0, 14.0, 64)
    assert np.diff(grid)[-1] > 5.0 and np.diff(step_grid(table, -10.0, 14.0, 64))[-1] < 1.0
    assert hashlib.sha256(grid.tobytes()).hexdigest() == (
        "08eeceea8636bd6447a4c059aab6427ab61c39ef63a0023d04e592b19c17e54c")


def test_optimized_grid_on_the_shipped_models_tables():
    """What "optimized" gains over "calibrated" on the shipped models' own tables (bits/dim of the chain
    above the continuous bound): 0.9.9 - 0.9.58's photo (preset cpu, now photo-5) at its 64 steps, more
    than 0.004 (as cifar10-12, 0.9.7 - 0.9.35's cifar10, did at its 256 until it was retired in 0.9.46).
    On the preset-small models the two are close: 0.9.59's photo (photo-6, retired in 0.9.64) 0.0798
    against 0.0793 at 64 steps, 0.9.62's photo (photo-7, retired in 0.10.1) 0.0797 against 0.0792,
    0.9.64's (now photo-8) 0.0795 against 0.0784, 0.10.1's 0.0791 against 0.0784; cifar10-26 (0.9.52's
    cifar10), cifar10-27 (0.9.53's), cifar10-28 (0.9.54's), cifar10-29 (0.9.56's) and 0.9.58's cifar10
    within 0.0001 at 256 steps (0.0275, 0.0275, 0.0276, 0.0276 and 0.0276 bpd; cifar10-13 to -25, 0.9.36
    - 0.9.51's, retired in 0.9.47 to 0.9.62: 0.0279, 0.0281, 0.0277, 0.0277, 0.0277, 0.0276, 0.0276,
    0.0275, 0.0275, 0.0275, 0.0275, 0.0275 and 0.0275):
    optimized is never above calibrated. The cifar10 models are every one the zoo ships (`trainer ship`
    and `retire` change the list), each at its own chain steps."""
    import math
    import re

    from scoreflow_codec import api, zoo
    from scoreflow_codec.calibration import grid_excess_nats, optimized_grid, step_grid

    cifar = [(m["name"], m["chain_steps"], 0.0) for m in zoo.list_models()
             if re.fullmatch(r"cifar10(-\d+)?", m["name"])]
    assert len(cifar) >= 5 and ("cifar10", 256, 0.0) in cifar  # as test_golden_files_exist: the last few defaults
    for name, steps, least_gain in [("photo-5", 64, 0.004), ("photo-8", 64, 0.0), ("photo", 64, 0.0)] + cifar:
        model = zoo.load_model(name)
        table = api._eps_mse(model)
        ends = model.sde.log_snr(torch.tensor([model.sde.T, model.sde.eps], dtype=torch.float64))
        lo, hi = float(ends[0]), float(ends[1])
        cal, opt = (grid_excess_nats(table, f(table, lo, hi, steps)) / math.log(2) for f in (step_grid, optimized_grid))
        assert cal - opt > least_gain, (name, cal, opt)


@pytest.mark.parametrize("schedule", ["calibrated", "optimized"])
def test_calibrated_schedule_round_trip(schedule):
    model, g = gaussian_model((3, 4, 4))
    x = gaussian_images(model, 32, g)
    table = _exact_gaussian_table(model, 65)
    settings = ChainSettings(steps=32, schedule=schedule).to_dict()
    tc = build_tile_codec(model, UniformDequantizer(), model.sde, "chain", settings, micro_batch=8, eps_mse=table)
    assert not np.allclose(tc.flow.co.ts, chain_coeffs(model.sde, 32, eps_mse=table).ts)
    actual, pred, back, m = code_and_decode(tc, x, PAD)
    assert abs(actual - pred) <= 64
    assert np.array_equal(back, x)
    assert np.array_equal(m.words(), padding_words(PAD))


def test_kappa_index():
    """The encoder's factor: the least-squares kappa of r ~ kappa w, to the nearest 1/32, in [0, 1]."""
    from scoreflow_codec.coding.chain_codec import KAPPA_LEVELS, kappa_index

    w = np.array([0.5, -2.0, 1.5, 3.0])
    assert KAPPA_LEVELS == 32
    for kappa in (0.0, 0.25, 0.38, 0.9, 1.0):
        assert kappa_index(kappa * w, w) == round(kappa * 32)
    noise = np.array([0.01, 0.02, -0.03, 0.0])  # orthogonal parts do not move it
    assert kappa_index(0.5 * w + noise - w * (noise @ w) / (w @ w), w) == 16
    assert kappa_index(1.7 * w, w) == 32 and kappa_index(-0.4 * w, w) == 0  # clamped
    assert kappa_index(w, np.zeros(4)) == 32  # no network term: nothing to scale


class _Overshooting(torch.nn.Module):
    """A model whose eps_hat is c times the exact one (as a trained network's near the clean end)."""

    def __init__(self, inner, c: float):
        super().__init__()
        self.inner, self.c, self.sde = inner, c, inner.sde

    def forward(self, x, t):
        return self.inner(x, t) * self.c


def test_kappa_factors_undo_an_overshooting_network():
    """With every network call scaled (kappa_top = steps), a network that overshoots by 4/3 (the factor 24/32 undoes it) codes
    far smaller than without factors; round trips are exact and the real size is the predicted
    one, the factors' bits and flags included."""
    from scoreflow_codec.coding.chain_codec import KAPPA_BITS

    model, g = gaussian_model((3, 4, 4))
    x = gaussian_images(model, 32, g)
    steps = 16

    def run(m, kappa_top):
        s = ChainSettings(steps=steps, schedule="logsnr", kappa_top=kappa_top).to_dict()
        tc = build_tile_codec(m, UniformDequantizer(), model.sde, "chain", s, micro_batch=8)
        actual, pred, back, msg = code_and_decode(tc, x, PAD)
        assert abs(actual - pred) <= 64 and np.array_equal(back, x)
        assert np.array_equal(msg.words(), padding_words(PAD))
        return actual

    exact, bad = run(model, 0), run(_Overshooting(model, 4.0 / 3.0), 0)
    # each scaled call logs its flag (1 bit) and, where sent, its k: one entry per call and batch
    s = ChainSettings(steps=steps, schedule="logsnr", kappa_top=3).to_dict()
    tc = build_tile_codec(_Overshooting(model, 4.0 / 3.0), UniformDequantizer(), model.sde, "chain", s, micro_batch=8)
    tc.bits_log = []
    tc.push(Message(padding_words(PAD)), x)
    assert sum(b in (1.0, 1.0 + KAPPA_BITS) for b in tc.bits_log) == 3, tc.bits_log
    fixed = run(_Overshooting(model, 4.0 / 3.0), steps)
    assert bad > exact + 0.05 * x.size, (exact, bad)           # the overshoot costs
    assert fixed < bad - 0.85 * (bad - exact), (exact, bad, fixed)  # the factors win most of it back
    # (each run is one draw of the chain's bits-back: a few hundred bits apart at this size)
    # a factor is sent only where it saves more than its 5.04 bits; a flag says which
    from scoreflow_codec.coding.chain_codec import ChainCodec
    mean, std = np.zeros(400), np.ones(400)
    x = np.round(np.linspace(-2, 2, 400)).astype(np.int64)
    assert ChainCodec._worth(32, x, (mean, std), (mean, std)) is None  # k = 32 is no factor
    assert ChainCodec._worth(20, x, (mean, std), (mean, std)) is None  # saves nothing
    assert ChainCodec._worth(20, x, (0.9 * x, std), (mean, std)) == 20
    assert KAPPA_BITS > 5.0
