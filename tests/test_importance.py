"""importance.py: p(t) ~ g^2/sigma^2 against quadrature, a KS test, and a variance comparison.

References integrate in s = log t by Gauss-Legendre (g^2/sigma^2 ~ 1/t near 0 for VP / VE), which
shares nothing with the sampler's log-SNR construction.
"""
import functools
import math

import numpy as np
import pytest
import torch

from gaussian_reference import expected_dsm
from scoreflow_codec.importance import ImportanceSampler
from scoreflow_codec.sde import SDEConfig, make_sde

KINDS = ["vp", "subvp", "ve"]
F64 = torch.float64


pytestmark = pytest.mark.usefixtures("one_thread")


@functools.lru_cache(maxsize=None)
def _leggauss(n: int):
    return np.polynomial.legendre.leggauss(n)  # O(n^3): cache it


def quad_log_t(fn, a: float, b: float, n: int = 400) -> torch.Tensor:
    """int_a^b fn(t) dt with t = e^s, Gauss-Legendre in s; fn maps [n] -> [n] or [n, ...]."""
    x, w = _leggauss(n)
    la, lb = math.log(a), math.log(b)
    s = torch.tensor(0.5 * (lb - la) * x + 0.5 * (lb + la), dtype=F64)
    w = torch.tensor(0.5 * (lb - la) * w, dtype=F64)
    t = s.exp()
    v = fn(t)
    return torch.tensordot(w * t, v, dims=([0], [0]))


def weight_fn(sde):
    return lambda t: sde.g2(t) / sde.marginal_coeffs(t)[1] ** 2


@pytest.mark.parametrize("kind", KINDS)
def test_pdf_normalised_and_Z(kind):
    sde = make_sde(SDEConfig(kind=kind))
    sampler = ImportanceSampler(sde)
    assert abs(quad_log_t(weight_fn(sde), sde.eps, sde.T).item() / sampler.Z - 1) < 1e-9
    assert abs(quad_log_t(sampler.pdf, sde.eps, sde.T).item() - 1) < 1e-9
    # a different eps moves Z by the integral over the gap
    s2 = ImportanceSampler(sde, eps=0.1)
    assert abs(sampler.Z - s2.Z - quad_log_t(weight_fn(sde), sde.eps, 0.1).item()) < 1e-8
    outside = torch.tensor([sde.eps / 2, sde.T + 0.01], dtype=F64)
    assert torch.all(sampler.pdf(outside) == 0)
    t = torch.linspace(sde.eps, sde.T, 17, dtype=F64)
    torch.testing.assert_close(sampler.weight(t) * sampler.pdf(t), torch.ones_like(t))


@pytest.mark.parametrize("kind", KINDS)
def test_samples_follow_the_cdf(kind):
    """Kolmogorov-Smirnov: 20k samples against the CDF built by integrating pdf on a fine log-t grid."""
    sde = make_sde(SDEConfig(kind=kind))
    sampler = ImportanceSampler(sde)
    n = 20000
    t = sampler.sample(n, generator=torch.Generator().manual_seed(0), dtype=F64)
    assert t.dtype == F64 and t.min() >= sde.eps and t.max() <= sde.T
    assert sampler.sample(3).dtype == torch.float32
    grid = torch.logspace(math.log10(sde.eps), math.log10(sde.T), 200001, dtype=F64)
    p = sampler.pdf(grid)
    cdf_grid = torch.cat([torch.zeros(1, dtype=F64), torch.cumsum(0.5 * (p[1:] + p[:-1]) * grid.diff(), 0)])
    assert abs(cdf_grid[-1].item() - 1) < 1e-6
    ts = t.sort().values.numpy()
    ref = np.interp(ts, grid.numpy(), cdf_grid.numpy())
    emp_hi = np.arange(1, n + 1) / n
    ks = max(np.abs(emp_hi - ref).max(), np.abs(emp_hi - 1 / n - ref).max())
    assert ks < 1.63 / math.sqrt(n), ks  # 1% level
    # the closed-form CDF agrees with the numerical one, and icdf inverts it
    torch.testing.assert_close(sampler.cdf(grid[::1000]), cdf_grid[::1000], atol=1e-6, rtol=0)
    u = torch.linspace(0, 1, 101, dtype=F64)
    torch.testing.assert_close(sampler.cdf(sampler.icdf(u)), u, atol=1e-10, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_importance_estimator_unbiased_and_lower_variance(kind):
    """int g^2 l(t) dt, l = E||s - grad log p_0t||^2 for Gaussian data and the exact score (closed form).

    Both estimators (t ~ p with weight 1/p, and t ~ U[eps, T] with weight T - eps) must hit the
    quadrature value; the importance sampler's variance (exact, by quadrature, and empirical)
    must be far lower.
    """
    sde = make_sde(SDEConfig(kind=kind))
    sampler = ImportanceSampler(sde)
    gen = torch.Generator().manual_seed(3)
    mu = torch.rand(2, 2, 2, generator=gen, dtype=F64) * 0.6 - 0.3
    s = torch.rand(2, 2, 2, generator=gen, dtype=F64) * 0.4 + 0.1
    x0 = mu + s * torch.randn(1, 2, 2, 2, generator=gen, dtype=F64)

    def integrand(t: torch.Tensor) -> torch.Tensor:  # lambda(t) l(t), vectorised over t
        return torch.stack([sde.g2(ti) * expected_dsm(sde, mu, s, x0, ti)[0] for ti in t])

    exact = quad_log_t(integrand, sde.eps, sde.T).item()
    second_is = quad_log_t(lambda t: integrand(t) ** 2 / sampler.pdf(t), sde.eps, sde.T).item()
    second_u = (sde.T - sde.eps) * quad_log_t(lambda t: integrand(t) ** 2, sde.eps, sde.T).item()
    var_is, var_u = second_is - exact**2, second_u - exact**2

    n = 4000
    t_is = sampler.sample(n, generator=gen, dtype=F64)
    est_is = integrand(t_is) * sampler.weight(t_is)
    t_u = sde.eps + (sde.T - sde.eps) * torch.rand(n, generator=gen, dtype=F64)
    est_u = integrand(t_u) * (sde.T - sde.eps)
    assert abs(est_is.mean().item() - exact) < 4 * math.sqrt(var_is / n) + 1e-9 * abs(exact)
    assert abs(est_u.mean().item() - exact) < 4 * math.sqrt(var_u / n)
    assert abs(est_is.var().item() / var_is - 1) < 0.2
    assert var_is * 5 < var_u, (var_is, var_u)  # measured ratios: VP ~900, sub-VP ~9, VE ~750
    print(f"{kind}: integral {exact:.6g}  var IS {var_is:.4g}  var uniform {var_u:.4g}  ratio {var_u / var_is:.3g}")
