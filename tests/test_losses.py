"""losses.py on Gaussian data, against closed-form expectations (tests/gaussian_reference.py)."""
import math

import pytest
import torch

from gaussian_reference import gaussian_setup, ScaledModel, expected_dsm, expected_integrand, integrate_in_log_snr
from scoreflow_codec.losses import dsm_loss, exact_part, stratified_uniform, systematic_uniform
from scoreflow_codec.models.gaussian import GaussianScoreModel

KINDS = ["vp", "subvp", "ve"]
F64 = torch.float64
SHAPE = (2, 2, 2)


pytestmark = pytest.mark.usefixtures("one_thread")


def setup(kind, seed=0):
    return gaussian_setup(kind, SHAPE, seed)


def mean_se(v: torch.Tensor) -> tuple[float, float]:
    return v.mean().item(), v.std().item() / math.sqrt(v.numel())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k", [1.0, 0.8])
def test_likelihood_loss_estimators_agree_with_closed_form(kind, k):
    """IS and uniform-t estimators of the diffusion term have the same mean: the quadrature value."""
    sde, mu, s, model, gen = setup(kind)
    model = ScaledModel(model, k)
    x0 = mu + s * torch.randn((1,) + SHAPE, generator=gen, dtype=F64)
    ref = integrate_in_log_snr(sde, lambda t: expected_integrand(sde, mu, s, x0, t, k), sde.eps).item()
    n = 200_000
    x = x0.expand((n,) + SHAPE)
    m_is, se_is = mean_se(dsm_loss(model, x, "likelihood", importance=True, generator=gen))
    m_u, se_u = mean_se(dsm_loss(model, x, "likelihood", importance=False, generator=gen))
    assert abs(m_is - ref) < 4 * se_is, (m_is, se_is, ref)
    assert abs(m_u - ref) < 4 * se_u, (m_u, se_u, ref)
    assert abs(m_is - m_u) < 4 * math.hypot(se_is, se_u)


@pytest.mark.parametrize("kind", KINDS)
def test_exact_part_is_the_quadrature_of_the_model_free_terms(kind):
    """exact_part's closed form -0.5 D Z + D log(alpha_eps / alpha_T) against Gauss-Legendre quadrature
    of -0.5 [g^2 D / sigma^2 + 2 div f] over [eps, T] (div f = drift_coef D), at two eps."""
    sde, *_ = setup(kind)
    d = 12
    for eps in (sde.eps, 1e-3):
        ref = integrate_in_log_snr(
            sde, lambda t: -0.5 * d * (sde.g2(t) / sde.marginal_coeffs(t)[1] ** 2 + 2 * sde.drift_coef(t)), eps)
        assert exact_part(sde, eps, d) == pytest.approx(float(ref), rel=1e-8, abs=1e-8)


@pytest.mark.parametrize("kind", KINDS)
def test_likelihood_loss_minimised_by_exact_score(kind):
    """Over data x0 ~ N(mu, s^2), the exact model reaches 0.5 sum log(v_eps / v_T) and beats perturbed ones.

    Common random numbers (same seed per model) make the paired differences precise.
    """
    sde, mu, s, exact, _ = setup(kind)
    n = 100_000

    def loss(model, seed=7):
        gen = torch.Generator().manual_seed(seed)
        x0 = mu + s * torch.randn((n,) + SHAPE, generator=gen, dtype=F64)
        return dsm_loss(model, x0, "likelihood", importance=True, generator=gen)

    def v(t):
        a, sig = sde.marginal_coeffs(torch.tensor(t, dtype=F64))
        return a * a * s * s + sig * sig

    analytic_min = 0.5 * torch.log(v(sde.eps) / v(sde.T)).sum().item()
    base = loss(exact)
    m, se = mean_se(base)
    assert abs(m - analytic_min) < 4 * se, (m, se, analytic_min)
    others = {
        "k=0.8": ScaledModel(exact, 0.8),
        "k=1.2": ScaledModel(exact, 1.2),
        "mu+0.1": GaussianScoreModel(sde, mu + 0.1, s),
        "s*1.3": GaussianScoreModel(sde, mu, s * 1.3),
    }
    for name, model in others.items():
        d, se_d = mean_se(loss(model) - base)
        assert d > 4 * se_d, (name, d, se_d)


@pytest.mark.parametrize("kind", KINDS)
def test_original_weighting(kind):
    """lambda = sigma^2, t uniform: mean = 0.5 int sigma^2 E||s - grad log p_0t||^2 dt; exact score is best."""
    sde, mu, s, model, gen = setup(kind)
    x0 = mu + s * torch.randn((1,) + SHAPE, generator=gen, dtype=F64)

    def integrand(t):
        return 0.5 * sde.marginal_coeffs(t)[1] ** 2 * expected_dsm(sde, mu, s, x0, t)[0]

    ref = integrate_in_log_snr(sde, integrand, sde.eps).item()
    n = 100_000
    x = x0.expand((n,) + SHAPE)
    m, se = mean_se(dsm_loss(model, x, "original", generator=torch.Generator().manual_seed(1)))
    assert abs(m - ref) < 4 * se, (m, se, ref)
    # importance is ignored for "original"
    again = dsm_loss(model, x, "original", importance=False, generator=torch.Generator().manual_seed(1))
    assert again.mean().item() == m
    worse = dsm_loss(ScaledModel(model, 0.9), x, "original", generator=torch.Generator().manual_seed(1))
    d, se_d = mean_se(worse - dsm_loss(model, x, "original", generator=torch.Generator().manual_seed(1)))
    assert d > 4 * se_d


class LearnableGaussian(torch.nn.Module):
    """eps_hat of N(m, e^{2 ls}) data, with m and ls trainable (float32)."""

    def __init__(self, sde, shape):
        super().__init__()
        self.sde = sde
        self.m = torch.nn.Parameter(torch.zeros(shape))
        self.ls = torch.nn.Parameter(torch.zeros(shape))

    def forward(self, x, t):
        a, sig = self.sde.marginal_coeffs(t)
        a, sig = a.reshape(-1, 1, 1, 1), sig.reshape(-1, 1, 1, 1)
        return sig * (x - a * self.m) / (a * a * torch.exp(2 * self.ls) + sig * sig)


@pytest.mark.parametrize("weighting,importance", [("likelihood", True), ("likelihood", False), ("original", True)])
def test_training_recovers_the_data_distribution(weighting, importance):
    """600 Adam steps on the loss drive a Gaussian eps-model to the data's mu and s."""
    sde, mu, s, _, gen = setup("vp", seed=4)
    model = LearnableGaussian(sde, SHAPE)
    opt = torch.optim.Adam(model.parameters(), lr=0.03)
    steps = 600
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1 - i / steps)  # decay: end near the optimum
    for _ in range(steps):
        x0 = (mu + s * torch.randn((512,) + SHAPE, generator=gen, dtype=F64)).float()
        loss = dsm_loss(model, x0, weighting, importance, generator=gen).mean()
        assert loss.dtype == torch.float32 and torch.isfinite(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    assert (model.m.detach().double() - mu).abs().max() < 0.03
    assert (model.ls.detach().double().exp() / s - 1).abs().max() < 0.1


def test_unknown_weighting():
    _, _, _, model, _ = setup("vp")
    with pytest.raises(ValueError):
        dsm_loss(model, torch.zeros((1,) + SHAPE, dtype=F64), "nope")


def test_stratified_uniform():
    k, n = 7, 5
    a = stratified_uniform(k, n, torch.Generator().manual_seed(0))
    b = stratified_uniform(k, n, torch.Generator().manual_seed(0))
    assert a.shape == (k, n) and a.dtype == torch.float64 and torch.equal(a, b)
    rows = torch.arange(k, dtype=torch.float64).unsqueeze(1)
    assert bool(((a >= rows / k) & (a < (rows + 1) / k)).all())
    assert not torch.equal(a[:, 0], a[:, 1])  # each column jittered on its own


@pytest.mark.parametrize("importance", [True, False])
def test_dsm_loss_takes_its_time_variates(importance):
    """Given u, dsm_loss uses t = icdf(u) (or eps + (T - eps) u); without u it draws u from the generator
    first, so both calls see the same t and z."""
    sde, mu, s, model, gen = setup("vp")
    x0 = mu + s * torch.randn((6,) + SHAPE, generator=gen, dtype=F64)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    drawn = dsm_loss(model, x0, importance=importance, generator=g1)
    u = torch.rand(x0.shape[0], generator=g2, dtype=torch.float64)
    given = dsm_loss(model, x0, importance=importance, generator=g2, u=u)
    torch.testing.assert_close(drawn, given)
    other = dsm_loss(model, x0, importance=importance, generator=torch.Generator().manual_seed(5), u=1 - u)
    assert not torch.allclose(drawn, other)


def test_systematic_uniform():
    """One shift c per column: v_j = (j + c) / k folded by the tent map; uniform values; a linear
    function's mean exact for every shift (k even); a smooth non-periodic one's error far below
    independent jitter's, and unbiased (the variance reduction bound_terms(systematic=True) uses)."""
    k, n = 8, 20000
    a = systematic_uniform(k, n, torch.Generator().manual_seed(0))
    assert a.shape == (k, n) and a.dtype == torch.float64
    assert torch.equal(a, systematic_uniform(k, n, torch.Generator().manual_seed(0)))
    assert bool(((a >= 0) & (a < 1)).all())
    c = a[0] * k / 2  # row 0: v = c / k < 1/2, so u = 2 c / k
    rows = torch.arange(k, dtype=torch.float64).unsqueeze(1)
    torch.testing.assert_close(a, 1 - (2 * (rows + c) / k - 1).abs())  # one shift for every row of a column
    assert abs(c.mean().item() - 0.5) < 0.01 and abs(c.var().item() - 1 / 12) < 0.003  # uniform shifts
    assert abs(a.mean().item() - 0.5) < 0.005 and abs(a.var().item() - 1 / 12) < 0.002  # uniform values
    torch.testing.assert_close(a.mean(0), torch.full((n,), 0.5, dtype=torch.float64))  # linear f: exact
    g = lambda v: torch.sin(2 * v) + v * v  # smooth, g(1) - g(0) = 1.9
    exact = (1 - math.cos(2)) / 2 + 1 / 3
    sys_err = g(a).mean(0) - exact
    ind_err = g(stratified_uniform(k, n, torch.Generator().manual_seed(1))).mean(0) - exact
    shifted = g((rows + c) / k).mean(0) - exact  # the grid without the fold
    assert abs(sys_err.mean().item()) < 4 * sys_err.std().item() / math.sqrt(n) + 1e-12  # unbiased
    assert abs(ind_err.mean().item()) < 4 * ind_err.std().item() / math.sqrt(n)
    assert sys_err.std() < 0.2 * ind_err.std() and ind_err.std() < shifted.std()
