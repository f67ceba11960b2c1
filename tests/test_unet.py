import json

import pytest
import torch

from scoreflow_codec.models.precond import PrecondConfig, ScoreModel
from scoreflow_codec.models.presets import PRESETS, build, get_preset
from scoreflow_codec.models.unet import UNet, UNetConfig, count_parameters
from scoreflow_codec.sde import SDEConfig, make_sde

torch.set_num_threads(1)
TINY = UNetConfig(channels=8, channel_mult=(1, 2), num_res_blocks=1, attn_resolutions=(16,), image_size=32)


def _unzero(m: torch.nn.Module, std: float = 0.05) -> torch.nn.Module:
    """Give the zero-initialised convs random weights so every path of the net matters."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() > 1 and p.abs().sum() == 0:
                p.normal_(0, std)
    return m


def test_config_round_trip_through_json():
    cfg = UNetConfig(channels=16, channel_mult=(1, 2, 2), attn_resolutions=(8, 16), embedding="positional")
    back = UNetConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg and back.attn_levels == (1, 2)
    with pytest.raises(ValueError):
        UNetConfig(embedding="learned")


@pytest.mark.parametrize("kw", [
    {},
    dict(resblock_updown=False, embedding="positional", embedding_scale=100.0),
    dict(scale_shift=True, channel_mult=(1, 2, 2), attn_resolutions=(8,), mid_attn=False),
    dict(in_channels=1),
])
@pytest.mark.parametrize("hw", [(8, 8), (16, 16), (32, 32), (64, 32), (12, 20)])
def test_shapes(kw, hw):
    cfg = UNetConfig(**{**TINY.to_dict(), **kw})
    k = 2 ** (cfg.levels - 1)
    if hw[0] % k or hw[1] % k:
        pytest.skip("size not divisible")
    net = _unzero(UNet(cfg)).eval()
    x = torch.randn(2, cfg.in_channels, *hw)
    with torch.no_grad():
        y = net(x, torch.tensor([-3.0, 2.0]))
    assert y.shape == x.shape and torch.isfinite(y).all() and y.abs().sum() > 0


def test_rejects_sizes_not_divisible():
    net = UNet(UNetConfig(**{**TINY.to_dict(), "channel_mult": (1, 2, 2)}))
    with pytest.raises(ValueError, match="multiples of 4"):
        net(torch.randn(1, 3, 6, 8), torch.zeros(1))


def test_zero_init_output_and_train_mode_dropout():
    net = UNet(TINY)
    assert net(torch.randn(2, 3, 16, 16), torch.zeros(2)).abs().max() == 0
    net = _unzero(UNet(UNetConfig(**{**TINY.to_dict(), "dropout": 0.5}))).train()
    x, c = torch.randn(2, 3, 16, 16), torch.zeros(2)
    assert not torch.equal(net(x, c), net(x, c))


def test_eval_is_deterministic_and_batch_size_effect():
    net = _unzero(UNet(UNetConfig(**{**TINY.to_dict(), "dropout": 0.1}))).eval()
    x, c = torch.randn(8, 3, 32, 32), torch.linspace(-5, 5, 8)
    with torch.no_grad():
        a, b = net(x, c), net(x, c)
        singles = torch.cat([net(x[i:i + 1], c[i:i + 1]) for i in range(8)])
    assert torch.equal(a, b)  # same input, same batch: bitwise the same
    # One sample's output may change by float rounding with the batch it is computed in (CPU
    # kernels pick other GEMM paths for batch 1); the coders fix their micro-batch for that.
    diff = (singles - a).abs().max().item()
    print(f"max |batch-1 - batch-8| = {diff:.3g} (bitwise equal: {diff == 0})")
    assert diff < 1e-5


def test_noise_conditioning_matters():
    net = _unzero(UNet(TINY)).eval()
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        assert (net(x, torch.tensor([0.0])) - net(x, torch.tensor([0.5]))).abs().max() > 1e-4


def test_attention_follows_the_training_resolution():
    cfg = UNetConfig(**{**TINY.to_dict(), "channel_mult": (1, 2, 2), "attn_resolutions": (16,)})
    assert cfg.attn_levels == (1,)
    assert UNetConfig(**{**cfg.to_dict(), "image_size": 64}).attn_levels == (2,)


# --- preconditioning ------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["vp", "subvp", "ve"])
def test_precond_coefficients_and_score(kind):
    sde = make_sde(SDEConfig(kind=kind))
    model = ScoreModel(_unzero(UNet(TINY)), sde).eval()
    t = torch.tensor([sde.eps, 0.1, 0.5, 1.0], dtype=torch.float64)
    c = model.coefficients(t)
    assert torch.allclose(c["c_noise"], -0.5 * sde.log_snr(t))
    # c_in x_t has unit variance when x_0 has std sigma_data
    alpha, sigma = sde.marginal_coeffs(t)
    g = torch.Generator().manual_seed(0)
    x0 = 0.5 * torch.randn(20000, 4, dtype=torch.float64, generator=g)
    xt = alpha[:, None, None] * x0 + sigma[:, None, None] * torch.randn(x0.shape, dtype=torch.float64, generator=g)
    std = (c["c_in"][:, None, None] * xt).std(dim=(1, 2))
    assert torch.allclose(std, torch.ones(4, dtype=torch.float64), atol=0.02)

    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        e32, e64 = model(x, t.float()), model(x, t)
        s = model.score(x, t)
        assert e64.dtype == torch.float32 and e64.shape == x.shape
        assert torch.allclose(e32, e64, atol=1e-4)
        assert torch.allclose(s, -e64 / sigma.float().view(-1, 1, 1, 1))
        assert torch.equal(model(x[:1], t[1]), model(x[:1], t[1:2]))  # 0-d t broadcasts


def test_gaussian_skip_is_the_optimal_linear_eps_estimate_at_init():
    sde = make_sde(SDEConfig(kind="vp"))
    model = ScoreModel(UNet(TINY), sde, PrecondConfig(sigma_data=0.5, gaussian_skip=True))
    t = torch.full((1,), 0.3)
    alpha, sigma = (v.float() for v in sde.marginal_coeffs(t.double()))
    g = torch.Generator().manual_seed(0)
    x0 = 0.5 * torch.randn(64, 3, 16, 16, generator=g)
    eps = torch.randn(x0.shape, generator=g)
    xt = alpha * x0 + sigma * eps
    with torch.no_grad():
        eps_hat = model(xt, t.expand(64))
    coef = (eps * xt).sum() / (xt * xt).sum()  # least-squares eps ~ coef * x_t
    assert torch.allclose(eps_hat, coef * xt, rtol=0.02, atol=1e-3)


# --- presets --------------------------------------------------------------------------------
EXPECTED = {"tiny": (50e3, 150e3), "cpu": (0.5e6, 1.5e6), "small": (2e6, 4e6), "base": (6e6, 8e6),
            "ddpmpp": (61.7e6, 61.9e6)}


def test_preset_parameter_counts():
    counts = {}
    for name, (lo, hi) in EXPECTED.items():
        p = get_preset(name)
        n = count_parameters(UNet(p.unet))
        counts[name] = n
        assert lo <= n <= hi, (name, n)
    assert counts["ddpmpp"] == 61_804_419  # paper: 61.8M (DDPM++ cont.)
    print(counts)
    assert set(PRESETS) == set(EXPECTED)
    with pytest.raises(ValueError, match="tiny"):
        get_preset("huge")


@pytest.mark.parametrize("channels", [1, 3])
def test_tiny_preset_builds_and_runs(channels):
    model, deq = build("tiny", SDEConfig(kind="vp"), channels=channels)
    x = torch.randint(0, 256, (2, channels, 32, 32), dtype=torch.uint8)
    u, log_q = deq.sample(x)
    assert u.shape == x.shape and log_q.shape == (2,)
    out = model(torch.randn(2, channels, 32, 32), torch.rand(2))
    assert out.shape == x.shape
    assert deq.num_groups == 4


def test_bf16_wrapper_is_close_and_float32():
    """models.Bf16 runs a score model under bfloat16 autocast (the photo model's first look at a
    photograph's tiles) and gives float32 back, within a few per cent of the float32 output (about
    0.6% on `photo`'s 64px tiles) but not equal to it (the autocast did happen)."""
    from scoreflow_codec.models import Bf16

    model, _ = build("tiny", SDEConfig(kind="vp"))
    _unzero(model)
    model.eval()
    x, t = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1)), torch.tensor([0.05, 0.3, 0.6, 0.9])
    with torch.no_grad():
        ref, fast = model(x, t), Bf16(model)(x, t)
    assert fast.dtype == torch.float32 and Bf16(model).sde is model.sde
    rel = float((fast - ref).norm() / ref.norm())
    assert 1e-5 < rel < 0.03, rel


def test_channels_last_gives_the_same_scores_on_the_shipped_photo_model():
    """models.ChannelsLast, which the codec's estimates run the network in since 0.9.20 (faster CPU
    kernels): the shipped photo model's output on 64px tiles fed channels-last equals the plain
    forward to float32 rounding, comes back in the usual layout, and leaves the model as it was (a
    file's coding runs the same model in its own arithmetic)."""
    from scoreflow_codec import models, zoo

    model = zoo.load_model("photo")
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    t = torch.tensor([0.05, 0.6])
    with torch.no_grad():
        want = model.model(x, t)
        wrapped = models.ChannelsLast(model.model)
        got = wrapped(x, t)
    assert got.shape == want.shape and got.is_contiguous() and wrapped.sde is model.model.sde
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert x.is_contiguous() and all(p.is_contiguous() for p in model.model.parameters())
