"""models/gaussian.py: score vs autograd, marginals vs sampling, the flow map vs the ODE it solves."""
import math

import pytest
import torch

from gaussian_reference import gaussian_setup, ode_model_nll
from scoreflow_codec.models.gaussian import GaussianScoreModel
from scoreflow_codec.sde import SDEConfig, make_sde

KINDS = ["vp", "subvp", "ve"]
F64 = torch.float64
SHAPE = (2, 2, 3)


pytestmark = pytest.mark.usefixtures("one_thread")


def setup(kind, seed=0):
    return gaussian_setup(kind, SHAPE, seed)


@pytest.mark.parametrize("kind", KINDS)
def test_score_is_grad_log_prob_and_eps_is_minus_sigma_score(kind):
    sde, mu, s, model, gen = setup(kind)
    x = torch.randn((4,) + SHAPE, generator=gen, dtype=F64).requires_grad_(True)
    t = torch.tensor([sde.eps, 0.1, 0.5, 1.0], dtype=F64)
    (grad,) = torch.autograd.grad(model.log_prob_t(x, t).sum(), x)
    torch.testing.assert_close(model.score(x, t), grad)
    _, sigma = sde.marginal_coeffs(t)
    torch.testing.assert_close(model(x, t), -sigma.reshape(-1, 1, 1, 1) * grad)
    # a scalar t broadcasts; float32 in, float32 out
    assert model(x.float(), torch.tensor(0.3)).dtype == torch.float32
    torch.testing.assert_close(model(x, torch.tensor(0.3, dtype=F64)), model(x, torch.full((4,), 0.3, dtype=F64)))


@pytest.mark.parametrize("kind", KINDS)
def test_log_prob_t_is_the_marginal_of_noised_data(kind):
    """Sample x_t = alpha x0 + sigma z with x0 ~ N(mu, s^2): moments match and E[-log p_t] = entropy."""
    sde, mu, s, model, gen = setup(kind)
    n = 200_000
    t = torch.full((n,), 0.3, dtype=F64)
    x0 = mu + s * torch.randn((n,) + SHAPE, generator=gen, dtype=F64)
    mean, std = sde.marginal_prob(x0, t)
    xt = mean + std.reshape(-1, 1, 1, 1) * torch.randn(x0.shape, generator=gen, dtype=F64)
    a, sig = sde.marginal_coeffs(torch.tensor(0.3, dtype=F64))
    v = a * a * s * s + sig * sig
    assert ((xt.mean(0) - a * mu).abs() < 4.5 * (v / n).sqrt()).all()
    assert ((xt.var(0) / v - 1).abs() < 4.5 * math.sqrt(2 / n)).all()
    nll = -model.log_prob_t(xt, t)
    entropy = 0.5 * (math.log(2 * math.pi * math.e) + torch.log(v)).sum()
    assert abs(nll.mean() - entropy) < 4.5 * nll.std() / math.sqrt(n)


@pytest.mark.parametrize("kind", KINDS)
def test_flow_map_solves_the_probability_flow_ode(kind):
    sde, mu, s, model, gen = setup(kind)
    x = torch.randn((3,) + SHAPE, generator=gen, dtype=F64)
    t0 = 0.05
    for t in [0.1, 0.4, 0.9]:
        h = 1e-6
        xt = model.flow_map(x, t0, t)
        dx = (model.flow_map(x, t0, t + h) - model.flow_map(x, t0, t - h)) / (2 * h)
        tt = torch.full((3,), t, dtype=F64)
        drift = sde.f(xt, tt) - 0.5 * sde.g2(tt).reshape(-1, 1, 1, 1) * model.score(xt, tt)
        torch.testing.assert_close(dx, drift, rtol=1e-6, atol=1e-6)
    # the map pushes p_t0 to p_t1 (change of variables), and inverts
    y = model.flow_map(x, t0, 0.7)
    log_det = 0.5 * torch.log(model._coeffs(0.7, 1)[2] / model._coeffs(t0, 1)[2]).sum()
    torch.testing.assert_close(model.log_prob_t(y, 0.7) + log_det, model.log_prob_t(x, t0))
    torch.testing.assert_close(model.flow_map(y, 0.7, t0), x)


@pytest.mark.parametrize("kind", KINDS)
def test_ode_nll_matches_independent_integration(kind):
    """ode_nll (closed-form flow) vs RK4 integration of the Gaussian's mean/variance ODEs."""
    sde, mu, s, model, gen = setup(kind)
    y = mu + s * torch.randn((5,) + SHAPE, generator=gen, dtype=F64)
    nll, z = model.ode_nll(y)
    torch.testing.assert_close(nll, ode_model_nll(sde, mu, s, y), rtol=0, atol=1e-6)
    torch.testing.assert_close(z, model.flow_map(y, sde.eps, sde.T))
    # with the prior = true p_T it would be -log p_eps; the mismatch is small
    assert (nll + model.log_prob_t(y, sde.eps)).abs().max() < 0.05


def test_rejects_bad_parameters():
    sde = make_sde(SDEConfig())
    with pytest.raises(ValueError):
        GaussianScoreModel(sde, torch.zeros(2), torch.ones(3))
    with pytest.raises(ValueError):
        GaussianScoreModel(sde, torch.zeros(2), torch.tensor([1.0, 0.0]))
