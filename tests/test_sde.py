"""sde.py against Monte-Carlo simulation, numerical derivatives, autograd and torch.distributions."""
import math

import pytest
import torch

from scoreflow_codec.sde import SDEConfig, SubVPSDE, VESDE, VPSDE, make_sde

KINDS = ["vp", "subvp", "ve"]
F64 = torch.float64


def grid(sde, n=41):
    return torch.linspace(sde.eps, sde.T, n, dtype=F64)


@pytest.fixture
def one_thread():
    # 2 000 small sequential steps: thread hand-offs cost more than they save on a shared CPU
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("kind", KINDS)
def test_marginals_match_euler_maruyama(kind, one_thread):
    """Simulate dx = f dt + g dW from fixed x0 (50k paths x 4 starts, 2000 steps); compare mean / std.

    Coefficients at step midpoints; the drift's Euler bias is (dt/2) int f_coef^2 relative, < 1% of the
    (then tiny) VP mean at t = 1 and far below the Monte-Carlo error elsewhere.
    """
    sde = make_sde(SDEConfig(kind=kind))
    gen = torch.Generator().manual_seed(0)
    x0 = torch.tensor([-0.9, -0.2, 0.4, 1.0], dtype=F64)
    paths, steps = 50000, 2000
    x = x0.expand(paths, 4).clone()
    dt = sde.T / steps
    checks = {100: None, 400: None, 1000: None, 2000: None}  # step index -> t = step * dt
    for i in range(steps):
        tm = torch.tensor([(i + 0.5) * dt], dtype=F64)
        noise = torch.randn(x.shape, generator=gen).to(F64)
        x = x + sde.f(x, tm) * dt + sde.g(tm) * math.sqrt(dt) * noise
        if i + 1 in checks:
            checks[i + 1] = x.clone()
    for step, xs in checks.items():
        t = torch.tensor([step * dt], dtype=F64)
        alpha, sigma = sde.marginal_coeffs(t)
        mean_ref, std_ref = alpha * x0, sigma.expand(4)
        se_mean = std_ref / math.sqrt(paths)
        assert torch.all((xs.mean(0) - mean_ref).abs() < 4.5 * se_mean + 0.02 * mean_ref.abs()), (kind, step)
        # sigma_t does not depend on x0: pool the 4 starts (SE 0.16%, so a 1% error in sigma fails)
        pooled_std = (xs - mean_ref).square().mean().sqrt()
        assert abs(pooled_std / sigma - 1) < 4.5 / math.sqrt(2 * 4 * paths) + 2e-3, (kind, step, pooled_std, sigma)
        m, s = sde.marginal_prob(x0.expand(1, 4), t)
        assert torch.allclose(m[0], mean_ref) and torch.allclose(s, sigma)


@pytest.mark.parametrize("kind", KINDS)
def test_variance_and_mean_odes(kind):
    """g^2 = d(sigma^2)/dt - 2 f sigma^2 and d(alpha)/dt = f alpha, by central differences."""
    sde = make_sde(SDEConfig(kind=kind))
    t = torch.linspace(0.01, 0.99, 50, dtype=F64)
    h = 1e-6
    a_p, s_p = sde.marginal_coeffs(t + h)
    a_m, s_m = sde.marginal_coeffs(t - h)
    a, s = sde.marginal_coeffs(t)
    dvar = (s_p**2 - s_m**2) / (2 * h)
    dalpha = (a_p - a_m) / (2 * h)
    fc = sde.drift_coef(t)
    torch.testing.assert_close(dvar - 2 * fc * s**2, sde.g2(t), rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(dalpha, fc * a, rtol=1e-6, atol=1e-9)
    f, g = sde.sde(torch.ones(t.shape[0], 3, dtype=F64), t)
    torch.testing.assert_close(g**2, sde.g2(t))
    torch.testing.assert_close(f, fc[:, None].expand(-1, 3))


@pytest.mark.parametrize("kind", KINDS)
def test_log_snr_and_inverse(kind):
    sde = make_sde(SDEConfig(kind=kind))
    t = torch.cat([torch.tensor([sde.eps, 2 * sde.eps, 1e-3], dtype=F64), grid(sde)])
    lam = sde.log_snr(t)
    a, s = sde.marginal_coeffs(t)
    torch.testing.assert_close(lam, torch.log(a**2 / s**2), rtol=1e-9, atol=1e-9)
    assert torch.all(lam[4:].diff() < 0), "log-SNR must decrease in t"
    torch.testing.assert_close(sde.t_from_log_snr(lam), t, rtol=1e-9, atol=1e-12)
    lam_grid = torch.linspace(-12.0, 15.0, 101, dtype=F64)
    torch.testing.assert_close(sde.log_snr(sde.t_from_log_snr(lam_grid)), lam_grid, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("kind", KINDS)
def test_prior(kind):
    sde = make_sde(SDEConfig(kind=kind))
    gen = torch.Generator().manual_seed(1)
    z = sde.prior_sampling((4000, 2, 3, 3), generator=gen).to(F64)
    ref = torch.distributions.Normal(torch.tensor(0.0, dtype=F64), torch.tensor(sde.prior_std(), dtype=F64)).log_prob(z).reshape(4000, -1).sum(1)
    torch.testing.assert_close(sde.prior_logp(z), ref, rtol=1e-10, atol=1e-8)
    assert abs(z.std().item() / sde.prior_std() - 1) < 0.02
    # the prior is the marginal of x_T at x0 = 0 (exactly for VE; within 1e-4 of 1 for VP / sub-VP)
    _, s_T = sde.marginal_coeffs(torch.tensor([sde.T], dtype=F64))
    assert abs(s_T.item() / sde.prior_std() - 1) < 1e-4


@pytest.mark.parametrize("kind", KINDS)
def test_div_f_matches_autograd(kind):
    sde = make_sde(SDEConfig(kind=kind))
    x = torch.randn(3, 2, 2, 2, dtype=F64, generator=torch.Generator().manual_seed(2))
    t = torch.tensor([0.01, 0.3, 0.9], dtype=F64)
    for i in range(3):
        jac = torch.autograd.functional.jacobian(lambda xi: sde.f(xi[None], t[i : i + 1])[0], x[i])
        ref = jac.reshape(8, 8).trace()
        torch.testing.assert_close(sde.div_f(x[i : i + 1], t[i : i + 1])[0], ref)


def test_make_sde_and_config_roundtrip():
    for kind, cls in [("vp", VPSDE), ("subvp", SubVPSDE), ("ve", VESDE)]:
        sde = make_sde({"kind": kind, "beta_max": 15.0})
        assert type(sde) is cls
        assert make_sde(SDEConfig.from_dict(sde.to_dict())).to_dict() == sde.to_dict()
    assert make_sde(SDEConfig(kind="vp")).eps == 1e-5 and make_sde(SDEConfig(kind="subvp")).eps == 1e-2
    with pytest.raises(ValueError):
        make_sde(SDEConfig(kind="nope"))
