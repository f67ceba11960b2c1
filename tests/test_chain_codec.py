"""The diffusion-chain path: round trips, real size vs predicted codelength, and convergence of
the real size to the chain's -ELBO (discrete_chain.py), which converges to the exact NLL."""

import numpy as np
import pytest
import torch

from scoreflow_codec import pixels
from scoreflow_codec.coding.ans import padding_words
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
