"""likelihood.py on Gaussian data: ODE NLL vs closed form, the bound vs its exact expectation and vs the
exact likelihood of the model it bounds, and the bits/dim plumbing."""
import math

import numpy as np
import pytest
import torch

from conftest import SHARED_DATA
from gaussian_reference import ScaledModel, expected_bound, ode_model_nll, sde_model_nll
from scoreflow_codec import pixels
from scoreflow_codec.likelihood import (DrawnDequantization, bound_bpd, bound_terms, ode_nll_bpd, ode_nll_continuous,
                                        stratified_se)
from scoreflow_codec.losses import dsm_loss, stratified_uniform
from scoreflow_codec.models.gaussian import GaussianScoreModel
from scoreflow_codec.sde import SDEConfig, make_sde

KINDS = ["vp", "subvp", "ve"]
F64 = torch.float64
LN2 = math.log(2)


pytestmark = pytest.mark.usefixtures("one_thread")


class UniformDeq:
    """u ~ U[0, 1)^D, log q = 0 (the real dequantizers live in dequant.py)."""

    def sample(self, x_uint8, generator=None):
        u = torch.rand(x_uint8.shape, generator=generator, dtype=F64)
        return u, torch.zeros(x_uint8.shape[0], dtype=F64)


class FixedDeq:
    """Always the same u (broadcast over the batch) and a given log q."""

    def __init__(self, u, log_q=0.0):
        self.u, self.log_q = u, log_q

    def sample(self, x_uint8, generator=None):
        n = x_uint8.shape[0]
        return self.u.expand(x_uint8.shape), torch.full((n,), self.log_q, dtype=F64)


class Rotated(torch.nn.Module):
    """Data Q y with y ~ N(mu, s^2): eps_x(x) = Q eps_y(Q^T x). Non-diagonal Jacobian, same densities."""

    def __init__(self, inner, q):
        super().__init__()
        self.inner, self.q, self.sde = inner, q, inner.sde

    def rot(self, x, q):
        return (x.reshape(x.shape[0], -1) @ q.T).reshape(x.shape)

    def forward(self, x, t):
        return self.rot(self.inner(self.rot(x, self.q.T), t), self.q)


def gaussian(kind, shape, seed=0, s_lo=0.1, s_hi=0.5):
    sde = make_sde(SDEConfig(kind=kind))
    gen = torch.Generator().manual_seed(seed)
    mu = torch.rand(shape, generator=gen, dtype=F64) * 0.6 - 0.3
    s = torch.rand(shape, generator=gen, dtype=F64) * (s_hi - s_lo) + s_lo
    return sde, mu, s, GaussianScoreModel(sde, mu, s), gen


def to_bpd(nats, d):
    return nats / (d * LN2)


def test_bpd_conversion():
    d = 3 * 4 * 4
    # a uniform density on [-1, 1]^D is 2^-D, i.e. 256^-D per pixel cell: exactly 8 bits/dim
    assert pixels.nats_to_bpd(torch.tensor(d * math.log(2.0), dtype=F64), d).item() == pytest.approx(8.0, abs=1e-12)
    # the sign of the dequantization term: bpd grows by log_q / (D ln 2)
    sde, mu, s, model, gen = gaussian("vp", (1, 2, 2))
    x = torch.randint(0, 256, (2, 1, 2, 2), generator=gen, dtype=torch.uint8)
    u = torch.rand((1, 1, 2, 2), generator=gen, dtype=F64)
    a = ode_nll_bpd(model, x, FixedDeq(u, 0.0))
    b = ode_nll_bpd(model, x, FixedDeq(u, -1.5))
    torch.testing.assert_close(b - a, torch.full_like(a, -1.5 / (4 * LN2)))
    torch.testing.assert_close(a, pixels.nats_to_bpd(model.ode_nll(pixels.to_model(x, u.expand(x.shape)))[0], 4), atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_ode_nll_exact_trace_matches_closed_form(kind):
    sde, mu, s, model, gen = gaussian(kind, (3, 2, 2))
    d = 12
    y = mu + s * torch.randn((3, 3, 2, 2), generator=gen, dtype=F64)
    nll, z, nfe = ode_nll_continuous(model, y)
    ref, z_ref = model.ode_nll(y)
    err = to_bpd(nll - ref, d).abs().max().item()
    assert err < 1e-3, err  # measured ~1e-5 bpd (rtol = atol = 1e-5)
    torch.testing.assert_close(z, z_ref, atol=1e-4 * sde.prior_std(), rtol=0)
    assert 10 < nfe < 500
    # an imperfect model (eps_hat scaled by 1.2): no longer the flow of any p_t, still a linear ODE
    nll_k, _, _ = ode_nll_continuous(ScaledModel(model, 1.2), y)
    err_k = to_bpd(nll_k - ode_model_nll(sde, mu, s, y, k=1.2), d).abs().max().item()
    assert err_k < 2e-3, err_k
    # through the dequantizer: the same numbers in bits/dim
    x = torch.randint(0, 256, (3, 3, 2, 2), generator=gen, dtype=torch.uint8)
    bpd = ode_nll_bpd(model, x, UniformDeq(), generator=torch.Generator().manual_seed(5))
    u, _ = UniformDeq().sample(x, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(bpd, pixels.nats_to_bpd(model.ode_nll(pixels.to_model(x, u))[0], d), atol=1e-3, rtol=0)


def rotated_gaussian(kind, n):
    """Gaussian data seen through a random rotation (a non-diagonal Jacobian, so Hutchinson probes
    are not exact): (model, inner, n rows y, their exact -log p in nats, generator, D = 12)."""
    sde, mu, s, inner, gen = gaussian(kind, (3, 2, 2), s_lo=0.3, s_hi=0.6)
    d = 12
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=F64))
    model = Rotated(inner, q)
    y = model.rot(mu + s * torch.randn((n, 3, 2, 2), generator=gen, dtype=F64), q)
    return model, inner, y, inner.ode_nll(model.rot(y, q.T))[0], gen, d


@pytest.mark.parametrize("kind,probe", [("vp", "rademacher"), ("subvp", "rademacher"), ("ve", "rademacher"), ("vp", "gaussian")])
def test_ode_nll_hutchinson_matches_closed_form(kind, probe):
    """Rotated Gaussian data (non-diagonal Jacobian); one probe per row, K rows per image, averaged."""
    model, inner, y, ref, gen, d = rotated_gaussian(kind, 2)
    k = 20000 if probe == "rademacher" else 50000  # per-probe std: 0.08 / 0.5 bpd (measured)
    yy = y.repeat_interleave(k, 0)
    nll, _, _ = ode_nll_continuous(model, yy, trace="hutchinson", hutchinson=probe, generator=gen)
    per = to_bpd(nll.reshape(2, k), d)
    mean, se = per.mean(1), per.std(1) / math.sqrt(k)
    err = (mean - to_bpd(ref, d)).abs()
    assert (err < 0.01).all(), (err, se)
    assert (err < 4 * se + 1e-3).all(), (err, se)
    # the exact trace agrees too (and Rademacher probes are exact for a diagonal Jacobian)
    ex, _, _ = ode_nll_continuous(model, y)
    assert to_bpd(ex - ref, d).abs().max() < 1e-3
    if probe == "rademacher":
        diag, _, _ = ode_nll_continuous(inner, yy[:50], trace="hutchinson", generator=gen)
        assert to_bpd(diag - inner.ode_nll(yy[:50])[0], d).abs().max() < 1e-3


def test_ode_nll_probes_average_along_one_trajectory():
    """K probes: still unbiased against the closed form, with about 1/K of one probe's variance;
    probes=1 draws exactly what the single-probe estimator drew."""
    model, _, y, ref, _, d = rotated_gaussian("vp", 1)
    ref = to_bpd(ref, d)
    m = 2000
    yy = y.expand(m, -1, -1, -1)
    one = to_bpd(ode_nll_continuous(model, yy, trace="hutchinson", generator=torch.Generator().manual_seed(3))[0], d)
    eight = to_bpd(ode_nll_continuous(model, yy, trace="hutchinson", probes=8,
                                      generator=torch.Generator().manual_seed(4))[0], d)
    for est in (one, eight):
        assert abs(est.mean() - ref) < 4 * est.std() / math.sqrt(m) + 1e-3
    ratio = one.var() / eight.var()
    assert 5.5 < ratio < 11.5, ratio  # 8 expected; the variance estimates carry about 3% error each
    again = to_bpd(ode_nll_continuous(model, yy[:5], trace="hutchinson", probes=1,
                                      generator=torch.Generator().manual_seed(3))[0], d)
    torch.testing.assert_close(again, one[:5], atol=1e-4, rtol=0)  # the same probes (other ones: ~0.1 apart)
    with pytest.raises(ValueError, match="probes"):
        ode_nll_continuous(model, y, trace="hutchinson", probes=0)


def mc_bound(model, x, u, reps, n_t, seed):
    """bound_terms on `reps` copies of one image with one fixed u; per-term mean and standard error."""
    terms = bound_terms(model, x.expand((reps,) + x.shape[1:]), FixedDeq(u), n_t=n_t,
                        generator=torch.Generator().manual_seed(seed))
    return {k: (v.mean().item(), v.std().item() / math.sqrt(reps)) for k, v in terms.items()}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k", [1.0, 0.8])
def test_bound_matches_its_expectation_and_bounds_the_sde_likelihood(kind, k):
    """Monte-Carlo bound terms vs closed form / quadrature, and bound >= -log p_theta(x) of the SDE model."""
    sde, mu, s, exact, gen = gaussian(kind, (2, 2, 2))
    model = ScaledModel(exact, k)
    d = 8
    x = pixels.from_model(mu + s * torch.randn((1, 2, 2, 2), generator=gen, dtype=F64)).floor().clamp(0, 255).to(torch.uint8)
    u = torch.rand((1, 2, 2, 2), generator=gen, dtype=F64)
    y = pixels.to_model(x, u)
    mc = mc_bound(model, x, u, reps=10000, n_t=50, seed=11)
    ref = {key: v.item() for key, v in expected_bound(sde, mu, s, y, k).items()}
    assert mc["prior"][0] == pytest.approx(ref["prior"], abs=1e-9)
    for key in ["diffusion", "eps_term"]:
        assert abs(mc[key][0] - ref[key]) < 4 * mc[key][1] + 1e-9, (key, mc[key], ref[key])
    exact_bound = ref["prior"] + ref["diffusion"] + ref["eps_term"]
    target = sde_model_nll(sde, mu, s, y, k).item()
    gap_mc, se = mc["nll_with"][0] - target, mc["nll_with"][1]
    assert exact_bound - target > -1e-6  # the theorem, on the exact expectation
    assert gap_mc > -3 * se, (gap_mc, se)
    if k != 1.0:  # a wrong score leaves a visible variational gap (measured 1.1 - 1.7 nats)
        assert exact_bound - target > 0.5 and gap_mc > 4 * se
    else:  # the exact score: the bound is tight up to the prior mismatch (measured < 3e-5 nats)
        assert exact_bound - target < 1e-3
    # with / without the correction: both finite, differing by exactly the eps term
    assert math.isfinite(mc["bpd_with"][0]) and math.isfinite(mc["bpd_without"][0])
    assert mc["bpd_with"][0] - mc["bpd_without"][0] == pytest.approx(to_bpd(mc["eps_term"][0], d), abs=1e-9)
    assert mc["diffusion_se"][0] > 0


@pytest.mark.parametrize("kind", KINDS)
def test_bound_is_above_the_ode_nll_for_the_exact_score(kind):
    """Exact score: bound (with correction) >= ODE NLL of the same y, within MC error.

    The two differ only by the prior mismatch pi vs p_T (measured |bound - ODE NLL| < 0.013 nats in
    expectation). For a wrong score the ODE NLL is not bounded (measured bound - ODE NLL down to -35 nats).
    """
    sde, mu, s, model, gen = gaussian(kind, (2, 2, 2), seed=1)
    x = pixels.from_model(mu + s * torch.randn((1, 2, 2, 2), generator=gen, dtype=F64)).floor().clamp(0, 255).to(torch.uint8)
    u = torch.rand((1, 2, 2, 2), generator=gen, dtype=F64)
    y = pixels.to_model(x, u)
    mc = mc_bound(model, x, u, reps=10000, n_t=50, seed=12)
    nll, _, _ = ode_nll_continuous(model, y)
    gap, se = mc["nll_with"][0] - nll.item(), mc["nll_with"][1]
    assert gap > -3 * se - 0.02, (gap, se)
    assert abs(gap) < 4 * se + 0.02, (gap, se)


def test_bound_bpd_and_uniform_dequantization():
    sde, mu, s, model, gen = gaussian("vp", (2, 2, 2), seed=2)
    x = pixels.from_model(mu + s * torch.randn((3, 2, 2, 2), generator=gen, dtype=F64)).floor().clamp(0, 255).to(torch.uint8)
    terms = bound_terms(model, x, UniformDeq(), n_t=20, generator=torch.Generator().manual_seed(3))
    assert all(v.shape == (3,) and torch.isfinite(v).all() for v in terms.values())
    for corr, key in [(True, "bpd_with"), (False, "bpd_without")]:
        b = bound_bpd(model, x, UniformDeq(), n_t=20, correction=corr, generator=torch.Generator().manual_seed(3))
        torch.testing.assert_close(b, terms[key])
    with pytest.raises(ValueError):
        ode_nll_continuous(model, pixels.to_model(x).double(), trace="nope")
    with pytest.raises(ValueError):
        ode_nll_continuous(model, pixels.to_model(x).double(), trace="hutchinson", hutchinson="nope")


def test_float32_pipeline():
    """The U-Net runs in float32: the ODE NLL in float32 stays within 0.01 bpd of the float64 closed form."""
    sde, mu, s, model, gen = gaussian("vp", (3, 4, 4), seed=3)
    d = 48
    x = pixels.from_model(mu + s * torch.randn((2, 3, 4, 4), generator=gen, dtype=F64)).floor().clamp(0, 255).to(torch.uint8)
    u = torch.rand((1, 3, 4, 4), generator=gen, dtype=torch.float32)
    for trace in ["exact", "hutchinson"]:
        bpd = ode_nll_bpd(model, x, FixedDeq(u), trace=trace, generator=gen)
        assert bpd.dtype == torch.float32
        ref = pixels.nats_to_bpd(model.ode_nll(pixels.to_model(x, u.double().expand(x.shape)))[0], d)
        tol = 0.01 if trace == "exact" else 1.0  # one Rademacher probe: just a sanity bound
        assert (bpd.double() - ref).abs().max() < tol, (trace, bpd, ref)
    terms = bound_terms(model, x, FixedDeq(u), n_t=10, generator=gen)
    assert all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in terms.values())


def _wrong_score_image(kind):
    """The 192-dim Gaussian with a score scaled by 0.8, one quantized image of it, its u and y."""
    sde, mu, s, exact, gen = gaussian(kind, (3, 8, 8))
    x = pixels.from_model(mu + s * torch.randn((1, 3, 8, 8), generator=gen, dtype=F64)).floor().clamp(0, 255).to(torch.uint8)
    u = torch.rand((1, 3, 8, 8), generator=gen, dtype=F64)
    return sde, mu, s, ScaledModel(exact, 0.8), x, u, pixels.to_model(x, u)


@pytest.mark.parametrize("kind", KINDS)
def test_stratified_bound_is_unbiased_lower_variance_and_reports_a_safe_error(kind):
    """bound_terms draws one t per stratum of p(t): against independent draws (plain dsm_loss) on a
    192-dim Gaussian with a wrong score, both estimators match the closed form, the stratified one
    with less spread (measured 5.7x / 5.9x / 5.2x lower std for vp / subvp / ve; 2.3x / 2.3x / 5.5x
    before 0.9.57 sampled ||z||^2), and its reported diffusion_se is not optimistic (measured mean se^2 /
    empirical variance 1.93 - 2.13)."""
    sde, mu, s, model, x, u, y = _wrong_score_image(kind)
    reps, n_t = 400, 16
    terms = bound_terms(model, x.expand((reps,) + x.shape[1:]), FixedDeq(u), n_t=n_t,
                        generator=torch.Generator().manual_seed(11))
    g = torch.Generator().manual_seed(12)
    plain = torch.stack([dsm_loss(model, y.expand((reps,) + y.shape[1:]), generator=g) for _ in range(n_t)]).mean(0)
    ref = expected_bound(sde, mu, s, y, 0.8)["diffusion"].item()
    strat = terms["diffusion"]
    for est in (strat, plain):
        assert abs(est.mean().item() - ref) < 4 * est.std().item() / math.sqrt(reps)
    assert strat.std() < 0.6 * plain.std()
    ratio = (terms["diffusion_se"] ** 2).mean().item() / strat.var().item()
    assert 0.8 < ratio < 3.0, ratio


def test_stratified_se_formula():
    """Pairs of adjacent strata: se = sqrt(sum of squared pair differences) / k; an odd last row adds
    half its difference to the row before; fewer than two rows give NaN."""
    f = torch.tensor([[1.0], [3.0], [2.0], [6.0]], dtype=F64)
    assert stratified_se(f).item() == pytest.approx(math.sqrt(4 + 16) / 4)
    f5 = torch.cat([f, torch.tensor([[9.0]], dtype=F64)])
    assert stratified_se(f5).item() == pytest.approx(math.sqrt(4 + 16 + 0.5 * 9) / 5)
    assert math.isnan(stratified_se(f[:1]).item())


def test_drawn_dequantization_gives_the_bound_and_the_ode_the_same_y():
    """With one drawn u, bound_terms and ode_nll_bpd see the same y: the ODE NLL matches the closed form
    at that y, and a batch of another shape is refused."""
    sde, mu, s, model, gen = gaussian("vp", (2, 2, 2), seed=4)
    x = pixels.from_model(mu + s * torch.randn((3, 2, 2, 2), generator=gen, dtype=F64)).floor().clamp(0, 255).to(torch.uint8)
    deq = DrawnDequantization(UniformDeq(), x, torch.Generator().manual_seed(0))
    u1, _ = deq.sample(x)
    u2, _ = deq.sample(x, generator=torch.Generator().manual_seed(9))
    assert torch.equal(u1, u2)
    nll = ode_nll_bpd(model, x, deq)
    ref = pixels.nats_to_bpd(model.ode_nll(pixels.to_model(x, u1))[0], 8)
    assert (nll - ref).abs().max() < 1e-3
    with pytest.raises(ValueError, match="drawn for shape"):
        deq.sample(x[:2])


@pytest.mark.parametrize("kind", KINDS)
def test_systematic_bound_is_unbiased_with_less_spread(kind):
    """With systematic=True the n_t times come from one shift per image (losses.systematic_uniform):
    on the 192-dim Gaussian with a wrong score the diffusion term still matches the closed form,
    with no more spread than one time per stratum jittered on its own (here the noise z of each time
    dominates: measured 0.86x / 0.86x / 0.88x the std for vp / subvp / ve, n_t = 16; before 0.9.57
    sampled ||z||^2 too, 0.95x / 0.96x / 0.82x, and the unfolded shifted grid 0.96x / 0.97x / 1.24x,
    ve's integrand ending far from where it starts), and no standard error is claimed (NaN)."""
    sde, mu, s, model, x, u, y = _wrong_score_image(kind)
    reps, n_t = 400, 16
    xs = x.expand((reps,) + x.shape[1:])
    sys_terms = bound_terms(model, xs, FixedDeq(u), n_t=n_t, generator=torch.Generator().manual_seed(11), systematic=True)
    strat = bound_terms(model, xs, FixedDeq(u), n_t=n_t, generator=torch.Generator().manual_seed(11))["diffusion"]
    ref = expected_bound(sde, mu, s, y, 0.8)["diffusion"].item()
    est = sys_terms["diffusion"]
    assert abs(est.mean().item() - ref) < 4 * est.std().item() / math.sqrt(reps)
    assert est.std() < 0.98 * strat.std()
    assert torch.isnan(sys_terms["diffusion_se"]).all()
    b = bound_bpd(model, xs[:3], FixedDeq(u), n_t=n_t, generator=torch.Generator().manual_seed(11), systematic=True)
    again = bound_terms(model, xs[:3], FixedDeq(u), n_t=n_t, generator=torch.Generator().manual_seed(11), systematic=True)
    torch.testing.assert_close(b, again["bpd_with"])


def test_systematic_bound_on_the_shipped_photo_model():
    """What the codec's estimates rely on, on a real network: the shipped `photo` model's bound of
    four 64px tiles, 16 times, five draws each way. On the grid the draws spread far less than with
    independently jittered strata (the integrand over time is smooth, and its variation within
    strata was most of the noise), and both estimate the same bound.

    The tiles are kodim01's four top-left ones where the shared data is (what the model is made
    for; the photographs are its test set, never trained on): 0.9.62's `photo`, these five draws
    each way, 0.197x (0.021 against 0.105 bits/dim; eight draws: 0.165x, as with 0.9.59's, now
    photo-6). Without the data, four textured synthetic tiles: 0.38x with 0.9.62's `photo` (3.5
    bits/dim). Until 0.9.62 the synthetic image had noise of std 6, 8 bits/dim, near what a uniform
    model costs: 0.21x with 0.9.59's `photo`, 0.62x with 0.9.62's, a tile the model cannot code, so
    the noise std is 2 now. (Both cases ran until December 2026: two minutes each on CI's machine.)"""
    kodim01 = SHARED_DATA / "kodak" / "kodim01.png"
    if kodim01.is_file():
        from PIL import Image

        img = np.asarray(Image.open(kodim01).convert("RGB"))
        tiles = img[:64, :256].reshape(64, 4, 64, 3).transpose(1, 3, 0, 2)  # [4, 3, 64, 64]
        _check_systematic_bound(torch.from_numpy(np.ascontiguousarray(tiles)), 0.3)
        return
    yy, xx = np.mgrid[0:64, 0:64]
    base = np.stack([96 + 60 * np.sin(xx / 9.0) + 30 * np.cos(yy / 7.0), 128 + 50 * np.cos((xx + yy) / 11.0),
                     80 + xx + yy / 2], 0)
    noise = np.random.default_rng(0).normal(0, 2, (4, 3, 64, 64))
    _check_systematic_bound(torch.from_numpy(np.clip(base[None] + noise, 0, 255).astype(np.uint8)), 0.5)


def _check_systematic_bound(x: torch.Tensor, ratio: float) -> None:
    """The shipped photo model's bound of the tiles x [N, 3, 64, 64] (uint8), five draws of 16 times
    on the grid and five with jittered strata: the grid's pooled spread below `ratio` times the
    strata's, the two means within 4 standard errors."""
    from scoreflow_codec import zoo

    model = zoo.load_model("photo")
    draws = {sys_: torch.stack([bound_bpd(model.model, x, model.dequantizer, n_t=16, systematic=sys_,
                                          generator=torch.Generator().manual_seed(s)).double() for s in range(5)])
             for sys_ in (False, True)}
    var = {k: v.var(0).mean().item() for k, v in draws.items()}  # per tile over the draws, pooled
    assert math.sqrt(var[True] / var[False]) < ratio, var
    diff = draws[True].mean().item() - draws[False].mean().item()
    assert abs(diff) < 4 * math.sqrt((var[True] + var[False]) / 20), (diff, var)


def test_bound_on_the_shipped_cifar10_model_samples_only_the_models_term():
    """Since 0.9.57 dsm_loss samples only 0.5 Z ||eps_hat - z||^2 and adds the model-free terms'
    expectation (losses.exact_part). Against the sampled form of score_flow and 0.9.56 (the same u and
    z draws, computed here from the formula), on the shipped `cifar10` model and a synthetic 32px
    image: the same mean within the noise, and far less spread (here 0.068 against 0.134 bits/dim over
    24 draws of 32 times; on 16 CIFAR-10 test images 0.027 against 0.054 for 64 times)."""
    from scoreflow_codec import zoo
    from scoreflow_codec.losses import _sampler, _sq, perturb

    model = zoo.load_model("cifar10")
    net, sde = model.model, model.model.sde
    yy, xx = np.mgrid[0:32, 0:32]
    img = np.stack([90 + 50 * np.sin(xx / 5.0), 120 + 40 * np.cos((xx + yy) / 6.0), 70 + 3 * xx + yy], 0)
    x = torch.from_numpy(np.clip(img + np.random.default_rng(1).normal(0, 2, (3, 32, 32)), 0, 255).astype(np.uint8))
    reps, n_t = 24, 32
    with torch.no_grad():
        u, _ = model.dequantizer.sample(x[None], generator=torch.Generator().manual_seed(3))
        y = pixels.to_model(x[None], u).expand(reps, -1, -1, -1).contiguous()
        sampler, d = _sampler(sde, float(sde.eps)), y[0].numel()
        strata = stratified_uniform(n_t, reps, torch.Generator().manual_seed(5))
        g_new, g_old = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
        new = torch.stack([dsm_loss(net, y, u=strata[j], generator=g_new) for j in range(n_t)]).double().mean(0)
        old = []
        for j in range(n_t):
            t = sampler.icdf(strata[j]).float()
            xt, z, _ = perturb(sde, y, t, g_old)
            w = sampler.weight(t)
            old.append(0.5 * (sampler.Z * (_sq(net(xt, t) - z) - _sq(z)) - 2.0 * w * sde.div_f(xt, t)))
        old = torch.stack(old).double().mean(0)
    new, old = new / (d * math.log(2)), old / (d * math.log(2))  # bits/dim
    assert new.std() < 0.7 * old.std(), (new.std().item(), old.std().item())
    diff = (new - old).mean().item()
    assert abs(diff) < 4 * (new - old).std().item() / math.sqrt(reps), diff
