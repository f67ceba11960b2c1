import math

import pytest
import torch

from scoreflow_codec.dequant import (
    DequantConfig,
    UniformDequantizer,
    VariationalDequantizer,
    gather_group,
    group_layout,
    group_masks,
    make_dequantizer,
    put_group,
    mixture_cdf,
    mixture_icdf,
    mixture_log_pdf,
)

torch.set_num_threads(1)
TINY = dict(hidden=8, blocks=1, components=3)


def _randomised(cfg: DequantConfig, std: float = 0.05, seed: int = 0, double: bool = True) -> VariationalDequantizer:
    """A dequantizer far from its (uniform) initialisation: random output convs."""
    torch.manual_seed(seed)
    d = VariationalDequantizer(cfg)
    with torch.no_grad():
        for net in d.nets:
            net[-1].weight.normal_(0.0, std)
            net[-1].bias.normal_(0.0, 20 * std)
    d = d.double() if double else d
    return d.eval()


def _x(shape, seed=1):
    return torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


@pytest.mark.parametrize("shape,spatial,chunks", [
    (s, sp, ch) for s in [(3, 4, 4), (3, 5, 7), (1, 6, 6), (1, 3, 5)]
    for sp, ch in [("checkerboard", 2), ("quad", 1), ("none", 1), ("checkerboard", 3)] if ch <= s[0]])
def test_groups_partition(shape, spatial, chunks):
    masks = group_masks(shape, spatial, chunks)
    assert len(masks) == {"none": 1, "checkerboard": 2, "quad": 4}[spatial] * chunks
    total = torch.stack(masks).long().sum(0)
    assert torch.equal(total, torch.ones(shape, dtype=torch.long))


@pytest.mark.parametrize("shape,spatial,chunks", [((3, 5, 7), "checkerboard", 2), ((3, 4, 4), "quad", 3),
                                                   ((1, 3, 5), "none", 1)])
def test_group_layout_is_the_masks_by_position(shape, spatial, chunks):
    """The cached layout the networks and the flow use: each group's positions are its mask's True
    entries in row-major order, so gathering by them is v[..., mask] and putting by them is
    torch.where(mask, ...), value for value; known[g] is the union of the groups before g."""
    masks = group_masks(shape, spatial, chunks)
    lay = group_layout(shape, spatial, chunks, torch.device("cpu"))
    assert lay is group_layout(shape, spatial, chunks, torch.device("cpu"))  # made once
    v = torch.randn((2, 5) + shape, dtype=torch.float64)
    z = torch.randn((2,) + shape, dtype=torch.float64)
    for g, m in enumerate(masks):
        assert torch.equal(lay.masks[g], m)
        assert torch.equal(lay.known[g], torch.stack(masks[:g]).any(0) if g else torch.zeros(shape, dtype=torch.bool))
        assert torch.equal(gather_group(v, lay.index[g]), v[:, :, m])
        vals = torch.randn(2, int(m.sum()), dtype=torch.float64)
        full = torch.zeros_like(z)
        full[:, m] = vals
        assert torch.equal(put_group(z, lay.index[g], vals), torch.where(m, full, z))


def test_default_groups():
    assert DequantConfig.default_for(3).num_groups == 4
    assert DequantConfig.default_for(1).num_groups == 4
    with pytest.raises(ValueError):
        DequantConfig(in_channels=1, channel_groups=2)


def test_fresh_dequantizer_is_uniform():
    d = VariationalDequantizer(DequantConfig(**TINY)).double().eval()
    x = _x((2, 3, 4, 4))
    eps = torch.rand(x.shape, dtype=torch.float64)
    u, log_q = d.transform(eps, x)
    assert torch.allclose(u, eps, atol=1e-12)
    assert torch.allclose(log_q, torch.zeros(2, dtype=torch.float64), atol=1e-9)


@pytest.mark.parametrize("cfg", [DequantConfig(**TINY), DequantConfig.default_for(1, **TINY),
                                 DequantConfig(spatial="quad", channel_groups=3, **TINY)])
def test_log_q_is_minus_log_det_of_numerical_jacobian(cfg):
    d = _randomised(cfg)
    c = cfg.in_channels
    x = _x((1, c, 4, 4))
    eps = 0.05 + 0.9 * torch.rand((1, c, 4, 4), dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        u0, log_q = d.transform(eps, x)
        n, h = eps.numel(), 1e-6
        jac = torch.empty(n, n, dtype=torch.float64)
        for i in range(n):
            e = torch.zeros(n, dtype=torch.float64)
            e[i] = h
            up, _ = d.transform(eps + e.view_as(eps), x)
            um, _ = d.transform(eps - e.view_as(eps), x)
            jac[:, i] = (up - um).flatten() / (2 * h)
    sign, logdet = torch.linalg.slogdet(jac)
    assert sign > 0
    assert abs(float(log_q) + float(logdet)) < 1e-5, (float(log_q), float(logdet))
    assert abs(float(log_q)) > 1.0  # the randomised flow is far from uniform
    assert torch.allclose(d.log_prob(u0, x), log_q, atol=1e-9)


def test_sample_log_prob_consistency_and_range():
    x = _x((4, 3, 8, 8))
    d64 = _randomised(DequantConfig(**TINY))
    u, log_q = d64.sample(x, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(d64.log_prob(u, x), log_q, atol=1e-8)
    # float32, with wide mixtures so that samples come close to 0 and 1
    d32 = _randomised(DequantConfig(**TINY), std=0.5, double=False)
    u, log_q = d32.sample(x, generator=torch.Generator().manual_seed(0))
    assert u.dtype == torch.float32 and torch.isfinite(log_q).all()
    assert (u > 0).all() and (u < 1).all()
    lp = d32.log_prob(u, x)
    assert torch.isfinite(lp).all()
    # log_q is that of the float64 sample; log_prob sees u rounded to float32
    assert torch.allclose(lp, log_q, rtol=1e-5, atol=1e-2)


def test_sampling_is_deterministic_in_eval():
    x = _x((2, 3, 8, 8))
    d = _randomised(DequantConfig(**TINY), double=False)
    a = d.sample(x, generator=torch.Generator().manual_seed(5))
    b = d.sample(x, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_mixture_cdf_monotone_and_invertible():
    g = torch.Generator().manual_seed(0)
    n, k = 64, 5
    logit_pi = torch.randn(1, k, n, generator=g, dtype=torch.float64)
    mu = 2 * torch.randn(1, k, n, generator=g, dtype=torch.float64)
    log_s = torch.rand(1, k, n, generator=g, dtype=torch.float64) * 3 - 2
    grid = torch.linspace(0, 1, 2001, dtype=torch.float64)
    cdfs = torch.stack([mixture_cdf(grid[i].expand(1, n), logit_pi, mu, log_s)[0] for i in range(len(grid))])
    assert (cdfs[1:] > cdfs[:-1]).all()
    assert torch.equal(cdfs[0], torch.zeros(n, dtype=torch.float64))
    assert (cdfs[-1] - 1).abs().max() < 1e-15  # the softmax weights sum to 1 up to rounding
    u = torch.rand(1, n, generator=g, dtype=torch.float64) * 0.98 + 0.01
    assert (mixture_icdf(mixture_cdf(u, logit_pi, mu, log_s), logit_pi, mu, log_s) - u).abs().max() < 1e-9
    p = torch.rand(1, n, generator=g, dtype=torch.float64) * 0.98 + 0.01
    assert (mixture_cdf(mixture_icdf(p, logit_pi, mu, log_s), logit_pi, mu, log_s) - p).abs().max() < 1e-12
    # log pdf is the derivative of the cdf
    h = 1e-6
    num = (mixture_cdf(u + h, logit_pi, mu, log_s) - mixture_cdf(u - h, logit_pi, mu, log_s)) / (2 * h)
    assert torch.allclose(mixture_log_pdf(u, logit_pi, mu, log_s), num.log(), atol=1e-6)


@pytest.mark.parametrize("c", [1, 3])
def test_group_mixture_order_and_dependencies(c):
    cfg = DequantConfig.default_for(c, **TINY)
    d = _randomised(cfg)
    x = _x((2, c, 6, 4))
    u, _ = d.sample(x, generator=torch.Generator().manual_seed(1))
    masks = d.groups(x.shape[1:])
    total = torch.zeros(2, dtype=torch.float64)
    for g, m in enumerate(masks):
        lp, mu, ls = d.group_mixture(x, u, g)
        assert lp.shape == (2, cfg.components, int(m.sum()))
        total += mixture_log_pdf(u[:, m], lp, mu, ls).sum(1)
        later = torch.zeros_like(m)
        for mm in masks[g:]:
            later |= mm
        garbage = torch.where(later, torch.full_like(u, float("nan")), u)
        assert torch.equal(d.group_mixture(x, garbage, g)[1], mu)  # ignores groups >= g
        if g > 0:
            moved = torch.where(masks[0], 1 - u, u)
            assert not torch.equal(d.group_mixture(x, moved, g)[1], mu)  # uses earlier groups
    assert torch.allclose(total, d.log_prob(u, x), atol=1e-10)


def test_reparameterised_gradients_match_finite_differences():
    d = _randomised(DequantConfig(**TINY))
    x = _x((1, 3, 4, 4))
    eps = 0.05 + 0.9 * torch.rand(x.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def f():
        u, log_q = d.transform(eps, x)
        return (u * torch.linspace(-1, 1, u.numel(), dtype=u.dtype).view_as(u)).sum() + 0.1 * log_q.sum()

    p = d.nets[1][-1].bias
    f().backward()
    for i in range(3):
        with torch.no_grad():
            p[i] += 1e-6
            fp = f()
            p[i] -= 2e-6
            fm = f()
            p[i] += 1e-6
        assert abs(float(p.grad[i]) - float(fp - fm) / 2e-6) < 1e-5


def _levels(d, u, x):
    """Each dim's CDF level F_g(u) under its group's mixture (given x and the earlier groups' u), as u."""
    e = torch.zeros_like(u)
    for g, m in enumerate(d.groups(x.shape[1:])):
        lp, mu, ls = d.group_mixture(x, u, g)
        e[:, m] = mixture_cdf(u[:, m], lp, mu, ls)
    return e


def test_draw_has_the_flows_distribution():
    """draw (a component by Gumbel-max, then a logistic draw) against the closed form: its log q is
    log_prob's, and its CDF levels are uniform (the probability integral transform; KS at 1%), with
    mixtures wide enough that no one component dominates."""
    d = _randomised(DequantConfig(**TINY), std=0.1)
    x = _x((256, 3, 12, 12))  # 110,592 levels: KS's 1% bound 0.0049 (a spread 5% off moves them about 0.01)
    u, log_q = d.draw(x, generator=torch.Generator().manual_seed(3))
    assert torch.allclose(d.log_prob(u, x), log_q, atol=1e-8)
    lp, _, _ = d.group_mixture(x, u, 1)
    assert float(torch.softmax(lp.detach(), 1).max(1).values.mean()) < 0.8  # mixtures, not single logistics
    with torch.no_grad():
        e = _levels(d, u, x).flatten().sort().values
    n = e.numel()
    ks = float(torch.maximum(torch.arange(1, n + 1) / n - e, e - torch.arange(n) / n).max())
    assert ks < 1.63 / math.sqrt(n), ks
    a = d.draw(x[:2], generator=torch.Generator().manual_seed(5))
    b = d.draw(x[:2], generator=torch.Generator().manual_seed(5))
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], d.draw(x[:2])[0])
    assert UniformDequantizer().draw(x[:1])[0].shape == x[:1].shape  # the base class's: sample's


def test_draw_gradients_are_the_flows():
    """At the same point, draw's implicit-reparameterisation gradient is the flow's: transform of
    the drawn u's CDF levels gives back u, log q and the parameters' gradients of a function of them."""
    d = _randomised(DequantConfig(**TINY))
    x = _x((2, 3, 4, 4))
    weights = torch.linspace(-1, 1, x.numel(), dtype=torch.float64).view(x.shape)
    grads = []
    for how in ("draw", "flow"):
        d.zero_grad()
        if how == "draw":
            u, log_q = d.draw(x, generator=torch.Generator().manual_seed(4))
            with torch.no_grad():
                eps = _levels(d, u, x)
        else:
            u2, log_q2 = d.transform(eps, x)
            assert torch.allclose(u2, u, atol=1e-10) and torch.allclose(log_q2, log_q, atol=1e-8)
            u, log_q = u2, log_q2
        ((u * weights).sum() + 0.1 * log_q.sum()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in d.parameters() if p.grad is not None]))
    assert grads[0].abs().max() > 1e-3 and torch.allclose(grads[0], grads[1], rtol=1e-6, atol=1e-9)


def test_training_raises_the_elbo_on_a_toy_target():
    torch.manual_seed(0)
    d = VariationalDequantizer(DequantConfig(**TINY)).train()
    x = _x((8, 3, 4, 4))
    centre = 0.2 + 0.6 * x.double() / 255  # fixed p: u | x ~ N(centre(x), 0.1^2), per dim

    def elbo(gen):
        u, log_q = d.sample(x, generator=gen)
        log_p = (-0.5 * ((u.double() - centre) / 0.1) ** 2 - math.log(0.1 * math.sqrt(2 * math.pi))).flatten(1).sum(1)
        return (log_p - log_q.double()).mean() / x[0].numel()

    with torch.no_grad():
        before = float(elbo(torch.Generator().manual_seed(9)))
    opt = torch.optim.Adam(d.parameters(), lr=1e-2)
    for step in range(60):
        opt.zero_grad()
        (-elbo(torch.Generator().manual_seed(step))).backward()
        opt.step()
    with torch.no_grad():
        after = float(elbo(torch.Generator().manual_seed(9)))
    assert before < -4.0  # uniform q: about -5.5 nats/dim
    print(f"toy ELBO per dim: before {before:.3f}, after {after:.3f}")
    assert after > before + 3.0, (before, after)


def test_uniform_dequantizer():
    d = make_dequantizer(DequantConfig(kind="uniform", channel_groups=1))
    assert isinstance(d, UniformDequantizer) and d.num_groups == 1
    x = _x((2, 1, 5, 3))
    u, log_q = d.sample(x, generator=torch.Generator().manual_seed(0))
    assert u.shape == x.shape and (u >= 0).all() and (u < 1).all() and (log_q == 0).all()
    assert (d.log_prob(u, x) == 0).all()
    (m,) = d.groups(x.shape[1:])
    lp, mu, ls = d.group_mixture(x, u, 0)
    assert lp.shape == (2, 1, 15)
    assert torch.allclose(mixture_cdf(u[:, m], lp, mu, ls), u[:, m].double(), atol=1e-12)
