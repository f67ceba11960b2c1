"""The context model (models/context.py) and its experiment (bench/context_gain.py)."""
import json

import numpy as np
import pytest
import torch

from scoreflow_codec import likelihood
from scoreflow_codec.modelfile import save_model
from scoreflow_codec.models.context import ContextScoreModel, WindowContext, known_mask
from scoreflow_codec.models.presets import build


def _tiny(seed=0):
    torch.manual_seed(seed)
    model, dq = build("tiny")
    for p in model.net.conv_out.parameters():  # a net whose output is not all zeros
        torch.nn.init.normal_(p, std=0.1)
    return model.eval(), dq.eval()


def test_known_mask_is_the_L_of_the_known_neighbours():
    tile, m = 5, 3
    top = torch.tensor([True, True, False, False])
    left = torch.tensor([True, False, True, False])
    got = known_mask(4, tile, m, top, left)
    for n in range(4):
        for i in range(tile + m):
            for j in range(tile + m):
                above, leftof = i < m, j < m
                want = (above and top[n] and (not leftof or left[n])) or (not above and leftof and left[n])
                assert got[n, 0, i, j] == float(want), (n, i, j)
    assert got[:, 0, m:, m:].sum() == 0  # the tile itself is never known


def test_a_fresh_context_model_is_its_tile_model():
    model, _ = _tiny()
    cm = ContextScoreModel.from_tile_model(model, margin=4).eval()
    win = torch.randint(0, 256, (3, 3, 12, 12), dtype=torch.uint8)
    b = cm.bind(cm.context(win, torch.tensor([True, False, True]), torch.tensor([True, True, False])))
    x, t = torch.randn(3, 3, 8, 8), torch.tensor([0.1, 0.5, 0.9])
    with torch.no_grad():
        assert torch.equal(b(x, t), model(x, t))
        assert torch.equal(b.score(x, t), model.score(x, t))


def test_only_known_pixels_reach_the_output():
    model, _ = _tiny()
    cm = ContextScoreModel.from_tile_model(model, margin=4).eval()
    torch.nn.init.normal_(cm.encoder.out.weight, std=0.5)
    win = torch.randint(0, 256, (2, 3, 12, 12), dtype=torch.uint8)
    top, left = torch.tensor([True, True]), torch.tensor([False, False])  # only the top band (not the corner)
    x, t = torch.randn(2, 3, 8, 8), torch.tensor([0.3, 0.3])

    def eps(w):
        with torch.no_grad():
            return cm.bind(cm.context(w, top, left))(x, t)

    base = eps(win)
    for (i, j), moves in [((1, 6), True), ((1, 1), False), ((6, 1), False), ((6, 6), False)]:
        w2 = win.clone()
        w2[:, :, i, j] ^= 0x80  # a known pixel above; the unknown corner, left band, and the tile itself
        assert (not torch.equal(eps(w2), base)) == moves, (i, j)


def test_the_bound_of_a_bound_context_model_is_the_tile_models_before_training():
    model, dq = _tiny()
    cm = ContextScoreModel.from_tile_model(model, margin=4).eval()
    win = torch.randint(0, 256, (4, 3, 12, 12), dtype=torch.uint8)
    ones = torch.ones(4, dtype=torch.bool)
    tiles = win[:, :, 4:, 4:].contiguous()
    with torch.no_grad():
        a = likelihood.bound_bpd(model, tiles, dq, n_t=4, generator=likelihood.seeded(3))
        b = likelihood.bound_bpd(cm.bind(cm.context(win, ones, ones)), tiles, dq, n_t=4, generator=likelihood.seeded(3))
    assert torch.isfinite(a).all() and torch.equal(a, b)


def test_window_context_runs_the_tile_model_on_the_noised_window():
    """Against the same computation by hand: the window's known part y = x + u from the dequantizer's
    seeded draw, noised as alpha_t y + sigma_t z' with z' drawn after u; the tile part x_t itself."""
    model, dq = _tiny()
    win = torch.randint(0, 256, (2, 3, 12, 12), dtype=torch.uint8)
    wc = WindowContext(model, dq, win, 4, likelihood.seeded(5))
    x, t = torch.randn(2, 3, 8, 8), torch.tensor([0.05, 0.6])
    g = likelihood.seeded(5)
    with torch.no_grad():
        u, _ = dq.sample(win, generator=g)
        y = (win.float() + u) * (2 / 256) - 1
        z = torch.randn(y.shape, generator=g)
        a, s = model.sde.marginal_coeffs(t.double())
        w = a.float().view(-1, 1, 1, 1) * y + s.float().view(-1, 1, 1, 1) * z
        w[:, :, 4:, 4:] = x
        want = model(w, t)[:, :, 4:, 4:]
        got = wc(x, t)
        assert torch.allclose(got, want, atol=1e-6)
        assert torch.equal(wc(x, t), got)  # a function of (x, t): the context's draws are fixed
        # what the window says reaches the tile's output, and the tile's own window pixels do not
        win2 = win.clone()
        win2[:, :, 4:, 4:] ^= 0x80
        assert torch.equal(WindowContext(model, dq, win2, 4, likelihood.seeded(5))(x, t), got)
        win2 = win.clone()
        win2[:, :, 3, 5] ^= 0x80
        assert not torch.equal(WindowContext(model, dq, win2, 4, likelihood.seeded(5))(x, t), got)
    with pytest.raises(ValueError, match="windows"):
        wc(torch.randn(2, 3, 4, 4), t)


def _periodic(rng, size):
    """A random 4x4 pattern repeated: the 4 rows above a tile (or the 4 columns left of it) hold all of it."""
    return np.tile(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8), (size // 4, size // 4, 1))


def test_context_gain_finds_the_gain_where_the_context_tells_the_tile(tmp_path):
    """Images that repeat a random 4x4 pattern: the context arm can read the tile off its neighbours; the
    tile arm, trained on the same crops with the same draws, cannot. The experiment must see it."""
    from PIL import Image

    from bench import context_gain

    model, dq = _tiny()
    path = tmp_path / "tiny.safetensors"
    save_model(path, model, dq, {"preset": "tiny"})
    rng = np.random.default_rng(0)
    images = [_periodic(rng, 24) for _ in range(64)]
    out = tmp_path / "ctx"
    kw = dict(model_name=str(path), tile=8, margin=4, steps=200, batch=16, lr=2e-3, encoder_lr=1e-2, warmup=5,
              ema=0.9, min_scale=1.0, p_known=1.0, images=images, save_every=100, snapshot_every=100)
    for arm in ("tile", "context"):
        rec = context_gain.train(out, arm, **kw)
        assert rec["step"] == 200 and np.isfinite(rec["loss_bpd"])
    logs = {a: [json.loads(l) for l in (out / f"{a}.jsonl").read_text().splitlines()] for a in ("tile", "context")}
    assert [r["step"] for r in logs["tile"]] == [r["step"] for r in logs["context"]] == list(range(25, 201, 25))
    # the same draws: the arms' first losses agree while the encoder's output is still near zero
    assert logs["context"][0]["loss_bpd"] == pytest.approx(logs["tile"][0]["loss_bpd"], abs=0.5)
    files = []
    for k in range(4):
        f = tmp_path / f"periodic{k}.png"
        Image.fromarray(_periodic(rng, 28)).save(f)
        files.append(str(f))
    res = context_gain.evaluate(out, files, model_name=str(path), tile=8, margin=4, region=16, n_t=8)
    assert res["steps"] == {"start": 0, "window": 0, "tile": 200, "context": 200}
    assert all(r["tiles"] == 4 for r in res["rows"])
    d = res["context_minus_tile"]
    assert d["lower"] >= 3 and d["mean"] < -0.05, res
    # the snapshots: eval --step 100 reads ARM-100.pt
    assert context_gain.load_arm(out, "context", str(path), 4, step=100)[2] == 100
    # running a finished arm again trains nothing and keeps its step
    assert context_gain.train(out, "tile", **kw) == {}
    assert torch.load(out / "tile.pt", weights_only=True)["step"] == 200


def test_region_windows_stay_inside_the_image():
    from bench.context_gain import region_windows

    img = np.arange(40 * 50 * 3, dtype=np.uint32).reshape(40, 50, 3).astype(np.uint8)
    w = region_windows(img, tile=8, margin=4, region=64)
    assert w.shape[1:] == (3, 12, 12) and len(w) == 16  # the region shrinks to 32 = (40 - 4) // 8 * 8
    # the first window's tile starts at the region's top-left: rows 4.., columns 9..
    assert np.array_equal(w[0].transpose(1, 2, 0), img[0:12, 5:17])


def test_context_gain_eval_refuses_what_it_cannot_run(tmp_path, capsys):
    from bench import context_gain

    img = tmp_path / "a.png"
    from PIL import Image

    Image.fromarray(np.zeros((40, 40, 3), np.uint8)).save(img)
    assert context_gain.main(["eval", "--out", str(tmp_path / "none"), str(img)]) == 2
    assert "lacks tile.pt, context.pt" in capsys.readouterr().err
    assert context_gain.main(["eval", "--out", str(tmp_path), "--arms", "start,oops", str(img)]) == 2
    assert "--arms takes" in capsys.readouterr().err
