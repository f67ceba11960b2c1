"""The trainer: a tiny model's bound falls, resume restores everything, checkpoints obey the size
limit, export gives a model the codec loads, DDP runs under torchrun (CPU, gloo)."""
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from scoreflow_codec.modelfile import load_model_file
from conftest import cifar_subset
from trainer import checkpoint as ckpt
from trainer.config import TrainConfig
from trainer.data import CropSampler, center_crops, load_images
from trainer.train import export, train

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cifar_small(shared_data, tmp_path_factory):
    return cifar_subset(shared_data, tmp_path_factory.mktemp("data"), 512, 64)


def _cfg(data, **kw):
    base = dict(preset="tiny", dequant="uniform", data=str(data / "train.npz"), eval_data=str(data / "test.npz"),
                batch=32, lr=2e-3, warmup=20, ema=0.99, eval_images=32, eval_n_t=16, log_every=10,
                eval_every=0, save_every=0, steps=20, bf16=False)
    base.update(kw)
    return TrainConfig(**base)


def test_tiny_model_learns(cifar_small, tmp_path):
    """The README's tiny run, shortened: the held-out bound falls clearly (16.27 -> 10.64 bits/dim
    here at 30 steps, 5.85 at 100; until December 2026 it ran 100 steps, 1 - 1.5 minutes in the suite)."""
    torch.manual_seed(0)
    first = train(_cfg(cifar_small, steps=1), tmp_path / "a", progress=False)
    last = train(_cfg(cifar_small, steps=30), tmp_path / "a", progress=False)
    assert last["step"] == 30
    assert last["eval_bound_bpd"] < first["eval_bound_bpd"] - 1.0, (first, last)
    recs = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert any("images_per_s" in r for r in recs) and any("train_bound_bpd" in r for r in recs)


def test_resume_restores_state(cifar_small, tmp_path):
    out = tmp_path / "r"
    train(_cfg(cifar_small, steps=6, save_every=3), out, progress=False)
    tensors, state = ckpt.load_checkpoint(out / "checkpoint")
    assert state["step"] == 6 and any(k.startswith("opt.") for k in tensors)
    res = train(_cfg(cifar_small, steps=9), out, progress=False)
    assert res["step"] == 9
    t2, s2 = ckpt.load_checkpoint(out / "checkpoint")
    # Adam's step counters continued from 6 (restored), not restarted
    assert all(v["step"] == 9 for v in s2["optimizer"]["state"].values())
    assert s2["elapsed"] >= state["elapsed"]
    # another model on resuming: one line, the checkpoint untouched (before 0.9.32: a traceback of size
    # mismatches for --preset, and for --sde the weights went on under another SDE without a word)
    for change, words in (({"preset": "cpu"}, "--preset tiny, not cpu"), ({"sde": "ve"}, "--sde vp, not ve"),
                          ({"dequant": "variational", "preset": "cpu"}, "--preset tiny, not cpu; --dequant uniform, "
                                                                       "not variational")):
        with pytest.raises(ValueError, match=f"^{out} was trained with {words}: a run keeps its model"):
            train(_cfg(cifar_small, steps=12, **change), out, progress=False)
    assert ckpt.load_checkpoint(out / "checkpoint")[1]["step"] == 9
    assert train(_cfg(cifar_small, steps=10, dropout=0.1), out, progress=False)["step"] == 10  # dropout may change
    # --init-from a run or a model file of another preset: one line naming both presets, no run directory made
    export(out, tmp_path / "tiny.safetensors", calib_images=0)
    for src in (out, tmp_path / "tiny.safetensors"):
        with pytest.raises(ValueError, match=f"^--init-from {src}: its model does not match preset 'cpu' "
                                             r"\(it is preset 'tiny'\)$"):
            train(_cfg(cifar_small, steps=1, preset="cpu", init_from=str(src)), tmp_path / "other", progress=False)
    assert not (tmp_path / "other").exists()


def test_the_last_steps_weights_are_on_disk_before_the_end_evaluation(cifar_small, tmp_path, monkeypatch):
    """An export started while the run evaluates its last step (minutes on a CPU) takes the last step's
    weights, not those of the last --save-every checkpoint; the checkpoint written after the evaluation
    holds the same weights and the evaluation's record."""
    from trainer import train as train_mod

    seen = []
    real = train_mod.eval_record

    def eval_record(step, *a, **kw):
        seen.append((step, ckpt.load_checkpoint(tmp_path / "r" / "checkpoint")))
        return real(step, *a, **kw)
    monkeypatch.setattr(train_mod, "eval_record", eval_record)
    train(_cfg(cifar_small, steps=5, save_every=4), tmp_path / "r", progress=False)
    (step, (during, state)), = seen
    assert step == 5 and state["step"] == 5 and state["last"] == {}
    after, state = ckpt.load_checkpoint(tmp_path / "r" / "checkpoint")
    assert state["step"] == 5 and state["last"]["step"] == 5
    assert during.keys() == after.keys() and all(torch.equal(during[k], after[k]) for k in after)


def test_a_checkpoint_is_written_once_a_step(cifar_small, tmp_path, monkeypatch):
    """A run whose last step is a --save-every step writes that step's checkpoint once before its end
    evaluation (in the loop) and once after it (with the evaluation's record); one that stops between
    save steps writes its last step before the evaluation too. Until 0.9.55's review the first wrote
    it twice before the evaluation."""
    from trainer import train as train_mod

    written = []
    real = train_mod.ckpt.save_checkpoint

    def save_checkpoint(path, tensors, state, **kw):
        written.append((state["step"], bool(state["last"])))
        return real(path, tensors, state, **kw)
    monkeypatch.setattr(train_mod.ckpt, "save_checkpoint", save_checkpoint)
    train(_cfg(cifar_small, steps=4, save_every=2), tmp_path / "a", progress=False)
    assert written == [(2, False), (4, False), (4, True)]
    written.clear()
    train(_cfg(cifar_small, steps=5, save_every=2), tmp_path / "b", progress=False)
    assert written == [(2, False), (4, False), (5, False), (5, True)]


def test_a_dropout_runs_evaluation_is_its_exported_models(cifar_small, tmp_path):
    """The run's evaluation of a dropout model (--dropout, presets base and ddpmpp) is the bound of the
    model it exports: dropout off, the same number from the EMA weights in eval mode with the same draws.
    Before 0.9.45 the EMA copies stayed in training mode and their evaluations drew dropout masks."""
    from trainer.train import EVAL_SEED, evaluate, load_ema

    cfg = _cfg(cifar_small, steps=4, dropout=0.5)
    rec = train(cfg, tmp_path / "d", progress=False)
    model, dequant, _, _ = load_ema(tmp_path / "d")
    assert not model.training and not dequant.training
    eval_x = center_crops(load_images(cfg.eval_data), cfg.crop, cfg.eval_images)
    again = evaluate(model, dequant, eval_x, cfg.eval_n_t, seed=EVAL_SEED)  # the trainer's one seed
    assert again["bpd_with"] == pytest.approx(rec["eval_bound_bpd"], abs=1e-6)


def test_evaluations_at_two_steps_draw_the_same(cifar_small, tmp_path):
    """Every evaluation a run records uses the same draws (train.EVAL_SEED, not the step), so that two
    of them are paired: the same weights evaluated at step 2 and, all but unchanged (lr 1e-30), at step
    4 give the same number, where the step's seed gave two that differ by about the draws' noise."""
    import json

    cfg = _cfg(cifar_small, steps=4, lr=1e-30, warmup=0, eval_every=2)
    train(cfg, tmp_path / "e", progress=False)
    recs = [json.loads(line) for line in (tmp_path / "e" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in recs if "eval_bound_bpd" in r]
    assert [r["step"] for r in evals] == [2, 4], evals
    for k in ("eval_bound_bpd", "train_bound_bpd"):  # the weights move by rounding at most
        assert evals[0][k] == pytest.approx(evals[1][k], abs=1e-5), evals


def test_variational_second_stage_and_export(cifar_small, tmp_path):
    train(_cfg(cifar_small, steps=5), tmp_path / "s1", progress=False)
    res = train(_cfg(cifar_small, steps=4, dequant="variational", init_from=str(tmp_path / "s1"),
                     freeze_model=True, batch=8, eval_images=4, eval_n_t=2), tmp_path / "s2", progress=False)
    assert np.isfinite(res["eval_bound_bpd"])
    t1, _ = ckpt.load_checkpoint(tmp_path / "s1" / "checkpoint")
    t2, _ = ckpt.load_checkpoint(tmp_path / "s2" / "checkpoint")
    k = next(k for k in t1 if k.startswith("ema.model."))
    assert torch.equal(t1[k], t2[k])  # frozen score model = stage one's EMA
    sha = export(tmp_path / "s2", tmp_path / "m.safetensors", calib_images=8)
    loaded = load_model_file(tmp_path / "m.safetensors")
    assert loaded.sha256 == sha and loaded.dequantizer.config.kind == "variational"
    assert loaded.config["info"]["step"] == 4
    assert (loaded.name, loaded.tile, loaded.chain_steps) == ("m", 32, None)  # the file's stem; the codec's defaults
    # --name, --tile and --chain-steps are recorded and come back on loading
    export(tmp_path / "s2", tmp_path / "p.safetensors", calib_images=0, name="mine", tile=64, chain_steps=96)
    loaded = load_model_file(tmp_path / "p.safetensors")
    assert (loaded.name, loaded.tile, loaded.chain_steps) == ("mine", 64, 96)

    # the commands never replace a file unasked (0.9.32: `export -o photo.png` overwrote the photo)
    from click.testing import CliRunner

    from trainer.__main__ import main

    photo = tmp_path / "photo.png"
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(photo)
    before = photo.read_bytes()
    (tmp_path / "folder").mkdir()
    for cmd in (["export", str(tmp_path / "s2"), "--calib-images", "0"], ["plot", str(tmp_path / "s1")]):
        for out, words in ((photo, " exists (--force overwrites it)"),
                           (tmp_path / "folder", ": is a folder (-o takes a file name)")):
            r = CliRunner().invoke(main, cmd + ["-o", str(out)])
            assert r.exit_code == 2 and r.stderr == f"trainer: error: {out}{words}\n", r.output
        assert photo.read_bytes() == before and list((tmp_path / "folder").iterdir()) == []
    r = CliRunner().invoke(main, ["export", str(tmp_path / "s2"), "--calib-images", "0", "-o", str(photo), "--force"])
    assert r.exit_code == 0 and load_model_file(photo).config["info"]["step"] == 4
    r = CliRunner().invoke(main, ["plot", str(tmp_path / "s1"), "-o", str(tmp_path / "curve"), "--force"])
    assert r.exit_code == 0 and Image.open(tmp_path / "curve").format == "PNG"  # the name as given
    assert not (tmp_path / "curve.png").exists() and not list(tmp_path.glob(".curve*"))


def test_export_measures_its_table_where_the_data_is(cifar_small, tmp_path):
    """A run whose training data is not where its config says (a device run names its .device_data copy,
    left on the device): export says so in one line and makes nothing; --calib-data names the images, and
    the table is the one the run's own path gives (0.9.36: before, a FileNotFoundError on that path)."""
    from click.testing import CliRunner

    from trainer.__main__ import main

    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(cifar_small / "train.npz", data / "train.npz")
    train(_cfg(data, steps=2, eval_data=""), tmp_path / "r", progress=False)
    export(tmp_path / "r", tmp_path / "here.safetensors", calib_images=8)
    (data / "train.npz").rename(tmp_path / "moved.npz")
    out = tmp_path / "m.safetensors"
    r = CliRunner().invoke(main, ["export", str(tmp_path / "r"), "-o", str(out), "--calib-images", "8"])
    assert r.exit_code == 2 and r.stderr == (
        f"trainer: error: the run's training data is not here ({data / 'train.npz'}): give the same images as the "
        "calibration data (export --calib-data PATH), or no table (--calib-images 0)\n"), r.output
    assert not out.exists()
    r = CliRunner().invoke(main, ["export", str(tmp_path / "r"), "-o", str(out), "--calib-images", "8",
                                  "--calib-data", str(tmp_path / "moved.npz")])
    assert r.exit_code == 0, r.output
    table = load_model_file(out).config["info"]["eps_mse"]
    assert table == load_model_file(tmp_path / "here.safetensors").config["info"]["eps_mse"]
    assert len(table["mse"]) == 65 and all(0 < m < 2 for m in table["mse"])
    r = CliRunner().invoke(main, ["export", str(tmp_path / "r"), "-o", str(tmp_path / "n.safetensors"),
                                  "--calib-images", "0"])  # no table: no data needed
    assert r.exit_code == 0 and "eps_mse" not in load_model_file(tmp_path / "n.safetensors").config["info"]


def test_checkpoint_shards_stay_under_the_limit(tmp_path):
    tensors = {f"w{i}": torch.zeros(3 * 1024 * 1024 // 4 * 2) for i in range(6)}  # 6 x 6 MiB
    ckpt.save_checkpoint(tmp_path / "c", tensors, {"step": 1})
    files = list((tmp_path / "c").glob("*.safetensors"))
    assert len(files) >= 3 and all(f.stat().st_size <= ckpt.MAX_SHARD_BYTES + 4096 for f in files)
    back, state = ckpt.load_checkpoint(tmp_path / "c")
    assert state["step"] == 1 and set(back) == set(tensors)


def test_folder_data_random_crops_and_scales(tmp_path):
    rng = np.random.default_rng(0)
    for i, (h, w) in enumerate([(80, 120), (64, 64), (100, 70)]):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
    (tmp_path / "._0.png").write_bytes(b"\x00\x05\x16\x07" + bytes(60))  # a Mac's AppleDouble copy, not an image
    (tmp_path / ".git").mkdir()
    Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(tmp_path / ".git" / "x.png")
    imgs = load_images(tmp_path)  # hidden files and folders left out (before 0.9.32 "._0.png" stopped the run)
    assert [im.shape[:2] for im in imgs] == [(80, 120), (64, 64), (100, 70)]
    s = CropSampler(imgs, 32, flip=True, min_scale=0.5, seed=1)
    b = s.sample(16)
    assert b.shape == (16, 3, 32, 32) and b.dtype == torch.uint8
    # two ranks draw from disjoint shards
    a0 = CropSampler(imgs, 32, rank=0, world=2).images
    a1 = CropSampler(imgs, 32, rank=1, world=2).images
    assert len(a0) + len(a1) == 3
    # one image file is not a data set: say what is (before 0.9.34 "no images found" for a PNG)
    with pytest.raises(ValueError, match="0.png: not an .npz file or a folder of images"):
        load_images(tmp_path / "0.png")


def test_grain_noise_on_half_the_crops():
    """--grain S: about half the crops get Gaussian noise, one sigma per crop drawn from [0, S] levels,
    rounded (on a flat grey image, far from 0 and 255, each crop's spread is its sigma); without it the
    sampler draws the same crops as before the option."""
    flat = [np.full((64, 64, 3), 128, np.uint8), np.full((80, 48, 3), 128, np.uint8)]
    n, grain = 600, 6.0
    b = CropSampler(flat, 32, seed=3, grain=grain).sample(n).numpy().astype(np.float64) - 128
    assert b.dtype == np.float64 and np.abs(b).max() < 128
    sd = b.reshape(n, -1).std(axis=1)
    noisy = sd > 0.3  # a crop with sigma below ~0.3 rounds back to mostly 128: counted with the clean
    assert 0.40 < noisy.mean() < 0.55  # half get noise, a few of those too weak to show
    assert sd.max() < grain + 0.2 and np.quantile(sd[noisy], 0.9) > 0.8 * grain  # sigma up to S
    m = sd[sd > 1.0]  # rounding adds 1/12 of a level squared: sd^2 ~ sigma^2 + 1/12 where sigma >~ 1
    assert abs(np.mean(m ** 2 - 1 / 12) - np.mean(np.linspace(1.0, grain, 1001) ** 2)) < 1.5  # sigma ~ U(0, S)
    assert np.abs(b.reshape(n, -1).mean(axis=1)).max() < 0.5  # zero-mean noise
    rng = np.random.default_rng(0)
    photos = [rng.integers(0, 256, (70, 90, 3), dtype=np.uint8) for _ in range(3)]
    a, c = CropSampler(photos, 32, seed=5, min_scale=0.5), CropSampler(photos, 32, seed=5, min_scale=0.5, grain=0.0)
    assert torch.equal(a.sample(8), c.sample(8))


def _torchrun(cmd: list[str], timeout: float, log: Path) -> subprocess.CompletedProcess:
    """Run a torchrun command, its output to `log`; on a timeout (a hung collective) stop it with
    SIGTERM, which torchrun passes on to its workers (they run in sessions of their own), so that
    none outlives the test, and fail."""
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.terminate()
            p.wait(timeout=60)
            pytest.fail(f"torchrun did not finish in {timeout} s (a rank waiting for ever?)")
    return subprocess.CompletedProcess(cmd, p.returncode, "", log.read_text())


def test_ddp_two_processes_cpu(cifar_small, tmp_path):
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
           "-m", "trainer", "train", "--preset", "tiny", "--dequant", "uniform",
           "--data", str(cifar_small / "train.npz"), "--eval-data", str(cifar_small / "test.npz"),
           "--steps", "3", "--batch", "8", "--eval-every", "0", "--eval-images", "4", "--eval-n-t", "1",
           "--out", str(out), "--no-progress", "--threads", "1", "--device", "cpu"]
    r = _torchrun(cmd, timeout=300, log=tmp_path / "torchrun.log")
    assert r.returncode == 0, r.stderr[-2000:]
    _, state = ckpt.load_checkpoint(out / "checkpoint")
    assert state["step"] == 3 and state["images"] == 3 * 8


def test_ddp_time_limit_stops_every_rank_on_the_same_step(cifar_small, tmp_path):
    """--max-minutes with two processes: rank 0 evaluates every step (the other does not), so it
    reaches the limit at another moment than rank 1; the ranks must agree on the step to stop at,
    or one waits for ever in the all-reduce (the run of 2026-11-26 hung so at step 22,000)."""
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29534",
           "-m", "trainer", "train", "--preset", "tiny", "--dequant", "uniform",
           "--data", str(cifar_small / "train.npz"), "--eval-data", str(cifar_small / "test.npz"),
           "--steps", "100000", "--batch", "8", "--eval-every", "1", "--eval-images", "16", "--eval-n-t", "2",
           "--save-every", "0", "--max-minutes", "0.15", "--cool-minutes", "0.1", "--out", str(out),
           "--no-progress", "--threads", "1", "--device", "cpu", "--log-every", "1", "--lr", "1e-3", "--warmup", "1"]
    r = _torchrun(cmd, timeout=240, log=tmp_path / "torchrun.log")
    assert r.returncode == 0, r.stderr[-2000:]
    _, state = ckpt.load_checkpoint(out / "checkpoint")
    assert 2 <= state["step"] < 100000 and state["images"] == state["step"] * 8
    # the clock-timed cool-down ran on rank 0's clock, broadcast to the other rank each step
    lrs = [r["lr"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "lr" in r]
    assert lrs[0] == pytest.approx(1e-3) and lrs[-1] < 1e-3


def _exit_rank() -> None:
    """A spawned rank's end once its results are written and its group destroyed: the process leaves at
    once (os._exit), without the interpreter's teardown. In that teardown torch 2.13's CPU build aborted
    now and then a process that had run a gloo group ("terminate called without an active exception",
    SIGABRT, after destroy_process_group returned: 1 exit in 4 - 40 of _guarded_rank's, measured
    2026-12-08), which mp.spawn reports as the test's failure. A rank that raised never gets here: its
    error goes to mp.spawn as before."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _clock_rank(rank: int, init: str, out: str) -> None:
    import torch.distributed as dist

    from trainer.train import _rank0_clock

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        cfg = TrainConfig(max_minutes=1.0, cool_minutes=0.5)
        got = [_rank0_clock(10.0 + rank, 2, cfg, torch.device("cpu")),
               _rank0_clock(10.0 + rank, 2, TrainConfig(max_minutes=1.0), torch.device("cpu"))]
        Path(out, f"rank{rank}.json").write_text(json.dumps(got))
    finally:
        dist.destroy_process_group()
    _exit_rank()


def test_the_cool_down_goes_by_rank_0s_clock(tmp_path):
    """Two ranks whose clocks differ see rank 0's seconds with a clock-timed cool-down (the same lr,
    so the DDP replicas stay equal), their own without one (no collective then)."""
    import torch.multiprocessing as mp

    mp.spawn(_clock_rank, args=(f"file://{tmp_path / 'init'}", str(tmp_path)), nprocs=2, join=True)
    assert [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)] == [[10.0, 10.0], [10.0, 11.0]]


def _agreeing_rank(rank: int, port: int, data: str, out: str) -> None:
    import torch.distributed as dist

    from trainer import train as tr

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    calls = []
    for name in ("_time_is_up", "_rank0_clock"):
        f = getattr(tr, name)
        setattr(tr, name, lambda *a, _f=f, _n=name: calls.append(_n) or _f(*a))
    worlds, step = set(), tr.guarded_step  # each step's skip agreed by both ranks
    tr.guarded_step = lambda opt, loss, gnorm, world=1: worlds.add(world) or step(opt, loss, gnorm, world)
    try:
        for steps in (17, 20):  # then resumed at step 17: the first step agrees whatever its number
            tr.train(_cfg(Path(data), steps=steps, batch=4, eval_images=4, eval_n_t=1, max_minutes=30.0,
                          cool_minutes=10.0), Path(out) / "run", device="cpu", progress=False)  # one run, as under torchrun
            calls.append("end")
        Path(out, f"calls{rank}.json").write_text(json.dumps(calls + [sorted(worlds)]))
    finally:
        dist.destroy_process_group()
    _exit_rank()


def test_ddp_ranks_agree_on_the_clock_every_few_steps(cifar_small, tmp_path):
    """With two ranks, the time limit and the cool-down's clock are collectives (the CPU waits for them):
    17 steps agree at steps 0, 8 and 16 only (AGREE_EVERY), on both ranks alike, and train to the end;
    resumed to step 20, they agree at step 17, the first."""
    import torch.multiprocessing as mp

    from trainer.train import AGREE_EVERY

    assert AGREE_EVERY == 8
    mp.spawn(_agreeing_rank, args=(29535, str(cifar_small), str(tmp_path)), nprocs=2, join=True)
    for r in (0, 1):
        agreed = ["_time_is_up", "_rank0_clock"]
        assert json.loads((tmp_path / f"calls{r}.json").read_text()) == agreed * 3 + ["end"] + agreed + ["end", [2]]
    _, state = ckpt.load_checkpoint(tmp_path / "run" / "checkpoint")
    assert state["step"] == 20


def test_eval_crops_spread_over_few_images():
    """Many images: the centre crop of each of the first n. Few: a regular grid of crops per image."""
    rng = np.random.default_rng(0)
    many = [rng.integers(0, 256, (40, 36, 3), dtype=np.uint8) for _ in range(10)]
    x = center_crops(many, 32, 4)
    assert x.shape == (4, 3, 32, 32)
    assert torch.equal(x[1], torch.from_numpy(many[1][4:36, 2:34].transpose(2, 0, 1).copy()))
    few = [rng.integers(0, 256, (100, 80, 3), dtype=np.uint8) for _ in range(3)]
    y = center_crops(few, 32, 10)  # 4 per image on a 2x2 grid, the first 10 kept
    assert y.shape == (10, 3, 32, 32)
    corners = [(0, 0), (0, 48), (68, 0), (68, 48)]
    for j, (r, c) in enumerate(corners):
        assert torch.equal(y[4 + j], torch.from_numpy(few[1][r:r + 32, c:c + 32].transpose(2, 0, 1).copy()))
    assert torch.equal(center_crops(few, 32, 3)[2], torch.from_numpy(few[2][34:66, 24:56].transpose(2, 0, 1).copy()))


def test_a_few_photographs_without_eval_data_hold_one_out(tmp_path):
    """A folder of fewer than 20 images and no --eval-data: one image is held out (before 0.9.32 none
    was, and the run stopped on "need at least one array to stack"); one image alone, or held-out
    images smaller than the crop, stop the run with one line naming the cause."""
    from click.testing import CliRunner

    from trainer.__main__ import main
    from trainer.data import hold_out

    ims = [np.full((40, 40, 3), i, np.uint8) for i in range(45)]
    for n, held in ((2, 1), (5, 1), (19, 1), (20, 2), (45, 4)):
        h, t = hold_out(ims[:n], 256)
        assert len(h) == held and len(t) == n - held and h[0] is ims[0] and t[0] is ims[held]
    assert len(hold_out(ims, 3)[0]) == 3 and len(hold_out(ims, 0)[0]) == 1
    with pytest.raises(ValueError, match="too few to hold one out"):
        hold_out(ims[:1], 256)
    with pytest.raises(ValueError, match="1 evaluation image"):
        center_crops([ims[0], np.zeros((20, 50, 3), np.uint8)], 32, 4)
    with pytest.raises(ValueError, match="no images"):
        center_crops([], 32, 4)

    rng = np.random.default_rng(0)
    photos, one, small = tmp_path / "photos", tmp_path / "one", tmp_path / "small"
    for d in (photos, one, small):
        d.mkdir()
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (48, 56, 3), dtype=np.uint8)).save(photos / f"{i}.png")
    Image.fromarray(rng.integers(0, 256, (48, 56, 3), dtype=np.uint8)).save(one / "a.png")
    Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)).save(small / "s.png")
    common = ["train", "--preset", "tiny", "--crop", "32", "--batch", "4", "--steps", "2", "--eval-every", "2",
              "--eval-images", "4", "--eval-n-t", "2", "--save-every", "0", "--no-progress", "--threads", "1"]
    r = CliRunner().invoke(main, common + ["--data", str(photos), "--out", str(tmp_path / "r1")])
    assert r.exit_code == 0, r.output
    evals = [m for m in map(json.loads, (tmp_path / "r1" / "metrics.jsonl").read_text().splitlines())
             if "eval_bound_bpd" in m]
    assert evals and math.isfinite(evals[-1]["eval_bound_bpd"])
    for data, extra, words in ((one, [], "too few to hold one out"),
                               (one, ["--eval-data", str(small)], "smaller than the crop size 32")):
        r = CliRunner().invoke(main, common + ["--data", str(data), "--out", str(tmp_path / "r2")] + extra)
        assert r.exit_code == 2 and "trainer: error:" in r.stderr and words in r.stderr, r.output
        assert "Traceback" not in r.output and isinstance(r.exception, SystemExit)


def test_cli_input_errors_are_one_line(tmp_path):
    """Not a run, no metrics, missing data: `trainer: error: ...`, exit 2, no traceback."""
    from click.testing import CliRunner

    from trainer.__main__ import main

    empty = tmp_path / "not-a-run"
    empty.mkdir()
    cases = [(["export", str(empty), "-o", str(tmp_path / "m.safetensors")], "not a checkpoint"),
             (["plot", str(empty), "-o", str(tmp_path / "c.png")], "not a run directory"),
             (["train", "--out", str(tmp_path / "r"), "--data", str(tmp_path / "missing.npz"), "--preset", "tiny",
               "--steps", "1", "--no-progress"], "missing.npz")]
    # an .npz without an "images" array (a KeyError's traceback before 0.9.32), a file that is not one (numpy's
    # words about pickles), one cut short
    np.savez(tmp_path / "other.npz", x=np.zeros((2, 8, 8, 3), np.uint8))
    (tmp_path / "text.npz").write_text("hello")
    np.savez(tmp_path / "whole.npz", images=np.zeros((20, 8, 8, 3), np.uint8))
    (tmp_path / "cut.npz").write_bytes((tmp_path / "whole.npz").read_bytes()[:300])
    for name, words in (("other.npz", "other.npz: no 'images' array in the .npz (it holds: x)"),
                        ("text.npz", "text.npz: not an .npz file"), ("cut.npz", "cut.npz: not")):
        cases.append((["train", "--out", str(tmp_path / "r"), "--data", str(tmp_path / name), "--preset", "tiny",
                       "--steps", "1", "--no-progress"], words))
    for args, words in cases:
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 2, (args, r.output)
        assert "trainer: error:" in r.stderr and words in r.stderr, r.stderr
        assert "Traceback" not in r.output and isinstance(r.exception, SystemExit)
    assert not (tmp_path / "m.safetensors").exists() and not (tmp_path / "c.png").exists()
    # numbers out of range are click's usage errors (--batch 0 trained with batches of 1, --log-every 0
    # divided by zero, --eval-images 0 stopped on "need at least one array to stack")
    for opt, value in (("--batch", "0"), ("--log-every", "0"), ("--eval-images", "0"), ("--eval-n-t", "0"),
                       ("--lr", "0"), ("--min-scale", "0"), ("--min-scale", "1.5"), ("--steps", "-1"), ("--ema", "1"),
                       ("--grain", "-1")):
        r = CliRunner().invoke(main, ["train", "--out", str(tmp_path / "r"), "--data", str(tmp_path / "whole.npz"),
                                      opt, value, "--no-progress"])
        assert r.exit_code == 2 and f"Invalid value for '{opt}'" in r.stderr, (opt, r.output)
    assert not (tmp_path / "r").exists()


def test_the_objective_draws_without_inverting_the_cdf(monkeypatch):
    """Training's dequantization draws (dequant.draw: no bisection, a fifth of a step's kernel launches
    on a GPU), never the flow's inverse CDF; its loss is finite and reaches the dequantizer."""
    from scoreflow_codec import dequant as dq
    from trainer.train import Objective, build

    def no_inversion(*a, **k):
        raise AssertionError("the trainer inverted the CDF")

    monkeypatch.setattr(dq, "_mix_icdf_z", no_inversion)
    model, deq, _ = build(TrainConfig(preset="tiny", dequant="variational"))
    x = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    loss = Objective(model, deq, "likelihood", True)(x, torch.Generator().manual_seed(1)).mean()
    loss.backward()
    assert torch.isfinite(loss) and any(p.grad is not None and p.grad.abs().sum() > 0 for p in deq.parameters())


HOST_READS = ("item", "__bool__", "__float__", "__int__", "__index__", "tolist", "numpy")
WAITS = {"aten::nonzero", "aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::masked_select"}


def test_the_step_never_makes_the_host_wait(cifar_small, tmp_path, monkeypatch):
    """On a GPU the step is short kernels queued by the CPU; whatever reads a value back (a bool, a
    float, a count of a mask's True entries) makes the CPU wait for the queue to drain. A step has none:
    the objective's forward and backward run no operation that reads back, and the loop reads no
    tensor between its log, eval and save steps (a run of 7 steps reads as much as one of 3)."""
    from torch.profiler import ProfilerActivity, profile

    from trainer.train import Objective, build

    model, deq, _ = build(TrainConfig(preset="tiny", dequant="variational"))
    obj = Objective(model, deq, "likelihood", True)
    x = torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    obj(x).mean().backward()  # set-up work (caches) happens once, outside the measured step
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        obj(x).mean().backward()
    names = {e.name for e in prof.events()}
    assert "aten::convolution_backward" in names and not names & WAITS, names & WAITS

    reads = []
    for name in HOST_READS:
        orig = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _f=orig, _n=name, **k: reads.append(_n) or _f(self, *a, **k))
    counts = []
    for steps in (3, 7):
        reads.clear()
        train(_cfg(cifar_small, dequant="variational", steps=steps, log_every=1000, eval_images=4),
              tmp_path / f"r{steps}", progress=False)
        counts.append(len(reads))
    assert counts[0] == counts[1], counts


def test_profile_steps_log_where_a_steps_time_goes(cifar_small, tmp_path, caplog):
    """--profile-steps 4: after 5 warm steps, 4 steps under torch.profiler, then one line (ms a step,
    operations; on a GPU device kernels and host waits) and a table in the log; the run trains on
    to its end. The profile is the command's: the run resumed without it profiles nothing."""
    import logging

    from click.testing import CliRunner

    from trainer.__main__ import main

    caplog.set_level(logging.INFO, logger="trainer")
    args = ["train", "--out", str(tmp_path / "p"), "--preset", "tiny", "--dequant", "uniform", "--data",
            str(cifar_small / "train.npz"), "--eval-data", str(cifar_small / "test.npz"), "--batch", "8",
            "--eval-images", "4", "--eval-n-t", "1", "--eval-every", "0", "--save-every", "0", "--no-progress",
            "--device", "cpu"]
    r = CliRunner().invoke(main, args + ["--steps", "12", "--profile-steps", "4"])
    assert r.exit_code == 0, r.output
    lines = [m for m in (rec.getMessage() for rec in caplog.records) if m.startswith("profile:")]
    assert len(lines) == 2, lines
    head = re.fullmatch(r"profile: 4 steps, ([0-9.]+) ms a step \(wall\), ([0-9]+) operations a step, "
                        r"a CPU: no device to wait for", lines[0])
    assert head and float(head[1]) > 0 and int(head[2]) > 100, lines[0]
    assert "aten::convolution" in lines[1] and "Self CPU" in lines[1]
    assert json.loads(r.output.strip().splitlines()[-1])["step"] == 12
    caplog.clear()
    r = CliRunner().invoke(main, args + ["--steps", "20"])
    assert r.exit_code == 0 and not [rec for rec in caplog.records if rec.getMessage().startswith("profile:")]


def test_the_profile_counts_the_steps_it_was_told_and_their_own_operations():
    """StepProfiler(steps=2, skip=1): profiling starts at the first step() and ends at the third, so two
    steps of one F.linear each: one operation a step (the aten calls inside it not counted). Stopped by
    finish() after 3 of 10 steps: those 3."""
    from trainer.profiling import StepProfiler

    prof = StepProfiler(2, torch.device("cpu"), skip=1)
    x, w = torch.randn(4, 3), torch.randn(5, 3)
    prof.step()
    for _ in range(2):
        torch.nn.functional.linear(x, w)
        prof.step()
    s = prof.summary
    assert s is not None and s["steps"] == 2 and s["ops_per_step"] == 1 and s["waits_per_step"] is None
    assert "aten::linear" in s["table"] and s["ms_per_step"] > 0
    # a run that ends inside the profiled steps (finish(), from the trainer's end) logs the ones it made
    prof = StepProfiler(10, torch.device("cpu"), skip=1)
    prof.step()
    for _ in range(3):
        torch.nn.functional.linear(x, w)
        prof.step()
    assert prof.summary is None
    prof.finish()
    assert prof.summary["steps"] == 3 and prof.summary["ops_per_step"] == 1


def test_a_failing_profiler_never_stops_the_training(cifar_small, tmp_path, caplog, monkeypatch):
    """The profiler's GPU side cannot be tried on a CPU: where it fails (starting or ending), one warning,
    and the run trains on. A run that ends inside the profiled steps logs the ones it made."""
    import logging

    from trainer import profiling

    def broken(*a, **kw):
        raise RuntimeError("no profiler here")

    caplog.set_level(logging.INFO, logger="trainer")
    for where in ("profile", "_summarize"):  # failing as it starts, and as it ends
        with monkeypatch.context() as m:
            m.setattr(profiling if where == "profile" else profiling.StepProfiler, where, broken)
            caplog.clear()
            last = train(_cfg(cifar_small, steps=8, profile_steps=2, eval_images=4, eval_n_t=1), tmp_path / where,
                         progress=False)
        warned = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
        assert last["step"] == 8 and warned == ["profile: failed (RuntimeError: no profiler here); training goes on "
                                                "without it"]
    # a run that ends inside its profiled steps (8 steps: 3 after the 5 warm ones) logs those
    caplog.clear()
    train(_cfg(cifar_small, steps=8, profile_steps=10, eval_images=4, eval_n_t=1), tmp_path / "short", progress=False)
    assert [r.getMessage()[:18] for r in caplog.records if r.getMessage().startswith("profile:")] == ["profile: 3 steps, ", "profile: the opera"]


@pytest.mark.parametrize("fused", [True, False])
def test_a_step_with_a_non_finite_loss_or_gradient_changes_nothing(fused):
    """guarded_step: a NaN or infinite loss, or a finite loss whose gradient is not (its norm NaN), leaves
    the weights, Adam's moments and its step count as they were; the next good step goes on from there.
    Fused (the trainer's on CPU and GPU: the test on the device) and not (the test on the host)."""
    from trainer.train import guarded_step

    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.Adam([w], lr=0.1, fused=fused)
    w.grad = torch.tensor([1.0, 2.0, 3.0])
    guarded_step(opt, torch.tensor(1.0), torch.tensor(3.7))
    kept = (w.detach().clone(), opt.state[w]["exp_avg"].clone(), opt.state[w]["exp_avg_sq"].clone())
    for loss, gnorm, grad in [(float("nan"), 1.0, 1.0), (float("inf"), 1.0, 1.0), (1.0, float("nan"), float("nan")),
                              (1.0, float("inf"), float("inf"))]:
        w.grad = torch.full((3,), grad)
        guarded_step(opt, torch.tensor(loss), torch.tensor(gnorm))
        assert torch.equal(w.detach(), kept[0]) and torch.equal(opt.state[w]["exp_avg"], kept[1])
        assert torch.equal(opt.state[w]["exp_avg_sq"], kept[2]) and float(opt.state[w]["step"]) == 1
    w.grad = torch.tensor([1.0, 2.0, 3.0])
    guarded_step(opt, torch.tensor(1.0), None)  # no clipping: the loss alone decides
    assert float(opt.state[w]["step"]) == 2 and (w.detach() < kept[0]).all()


def _guarded_rank(rank: int, init: str, out: str) -> None:
    import torch.distributed as dist

    from trainer.train import guarded_step

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        steps = []
        for fused in (True, False):
            w = torch.nn.Parameter(torch.ones(3))
            opt = torch.optim.Adam([w], lr=0.1, fused=fused)
            # (loss on rank 0, loss on rank 1, the gradients' norm): one rank's loss not finite, its norm
            # finite (the all-reduced gradients may well be); without clipping (no norm) alike; both fine
            for losses, gnorm in [((1.0, float("nan")), 2.0), ((float("inf"), 1.0), None), ((1.0, 1.0), 2.0),
                                  ((float("nan"), 1.0), None), ((1.0, 1.0), None)]:
                w.grad = torch.ones(3)
                guarded_step(opt, torch.tensor(losses[rank]), None if gnorm is None else torch.tensor(gnorm), 2)
                steps.append(int(opt.state[w]["step"]) if w in opt.state else 0)
            steps.append(w.detach().tolist())
        Path(out, f"rank{rank}.json").write_text(json.dumps(steps))
    finally:
        dist.destroy_process_group()
    _exit_rank()


def test_with_several_ranks_a_step_skipped_on_one_is_skipped_on_all(tmp_path):
    """Each rank's loss is its own: one rank's NaN loss skipped its step alone (0.9.39), the other
    stepped, and the replicas parted. guarded_step's flag is agreed (all-reduced): both ranks skip the
    same steps and keep equal weights, fused or not."""
    import torch.multiprocessing as mp

    mp.spawn(_guarded_rank, args=(f"file://{tmp_path / 'init'}", str(tmp_path)), nprocs=2, join=True)
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert got[0] == got[1]
    steps = [x for x in got[0] if isinstance(x, int)]
    assert steps == [0, 0, 1, 1, 2] * 2


def test_a_checkpoint_of_an_adam_that_was_not_fused_resumes_fused(cifar_small, tmp_path):
    """Checkpoints before 0.9.38 hold an Adam that was not fused (`fused: None` in its groups). Loading
    one kept that setting, and the first step handed found_inf to the loop implementation, which
    refuses it (an AssertionError: every resume of 0.9.36's GPU run failed). The optimizer's own way of
    computing stays; the state (moments, step count, lr) is the checkpoint's."""
    w = torch.nn.Parameter(torch.ones(3))
    old = torch.optim.Adam([w], lr=0.1, fused=False)
    w.grad = torch.tensor([1.0, 2.0, 3.0])
    old.step()
    tensors, scalars = ckpt.optimizer_tensors(old)
    assert scalars["param_groups"][0]["fused"] is False
    new = torch.optim.Adam([w], lr=0.5, fused=True)
    ckpt.load_optimizer(new, tensors, scalars)
    assert new.param_groups[0]["fused"] is True and new.param_groups[0]["lr"] == 0.1
    assert torch.equal(new.state[w]["exp_avg"], old.state[w]["exp_avg"]) and float(new.state[w]["step"]) == 1
    from trainer.train import guarded_step

    guarded_step(new, torch.tensor(float("nan")), None)  # found_inf on a fused Adam: skipped, no error
    assert float(new.state[w]["step"]) == 1
    guarded_step(new, torch.tensor(1.0), None)
    assert float(new.state[w]["step"]) == 2

    # the whole resume, from a run whose saved groups say what 0.9.37's said
    out = tmp_path / "r"
    train(_cfg(cifar_small, steps=3), out, progress=False)
    state_file = out / "checkpoint" / "state.json"
    state = json.loads(state_file.read_text())
    for g in state["optimizer"]["param_groups"]:
        g["fused"] = None
    state_file.write_text(json.dumps(state))
    assert train(_cfg(cifar_small, steps=5), out, progress=False)["step"] == 5


def test_a_device_this_torch_cannot_run_on_is_a_usage_error(cifar_small, tmp_path):
    """train --device: one line naming why (exit 2), no run directory; before 0.9.39 "Expected a
    torch.device with a specified index or an integer, but got:cuda" on a CPU-only torch."""
    from click.testing import CliRunner

    from trainer.__main__ import main

    cases = [("cpux", "unknown device 'cpux' (cpu or cuda)")]
    if not torch.cuda.is_available():
        cases.append(("cuda", "--device cuda: "))
    for device, words in cases:
        r = CliRunner().invoke(main, ["train", "--out", str(tmp_path / "run"), "--preset", "tiny", "--data",
                                      str(cifar_small / "train.npz"), "--steps", "1", "--device", device])
        assert r.exit_code == 2 and words in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "run").exists()


def test_lr_schedule_warmup_then_linear_cool_down():
    """lr_at against the closed form: linear warmup, constant, then (decay_from) linear to lr_end at steps."""
    from trainer.train import lr_at

    cfg = TrainConfig(lr=1e-3, warmup=4, steps=20)
    assert [lr_at(cfg, s) for s in (0, 1, 3, 19)] == pytest.approx([2.5e-4, 5e-4, 1e-3, 1e-3])
    cool = TrainConfig(lr=1e-3, warmup=4, steps=20, decay_from=10, lr_end=1e-4)
    assert [lr_at(cool, s) for s in (9, 10, 15, 20, 25)] == pytest.approx([1e-3, 1e-3, 5.5e-4, 1e-4, 1e-4])
    assert lr_at(TrainConfig(lr=1e-3, warmup=1, steps=8, decay_from=4), 6) == pytest.approx(5e-4)  # lr_end 0


def test_cool_down_branch_resumes_a_constant_run(cifar_small, tmp_path):
    """`train --decay-from` on a resumed run: the steps after it get the falling lr (the metrics and
    the optimizer's own lr), the steps before kept the constant one."""
    from click.testing import CliRunner

    from trainer.__main__ import main

    out = tmp_path / "run"
    common = ["train", "--out", str(out), "--log-every", "1", "--eval-every", "0", "--save-every", "0", "--no-progress"]
    first = common + ["--data", str(cifar_small / "train.npz"), "--eval-data", str(cifar_small / "test.npz"),
                      "--preset", "tiny", "--dequant", "uniform", "--batch", "8", "--eval-images", "8",
                      "--eval-n-t", "2", "--lr", "1e-3", "--warmup", "1", "--steps", "4", "--no-bf16"]
    for args in (first, common + ["--steps", "8", "--decay-from", "4", "--lr-end", "1e-4"]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0, r.output
    lrs = {r["step"]: r["lr"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "lr" in r}
    assert [lrs[s] for s in range(1, 9)] == pytest.approx([1e-3] * 5 + [7.75e-4, 5.5e-4, 3.25e-4])
    _, state = ckpt.load_checkpoint(out / "checkpoint")
    assert state["step"] == 8 and state["optimizer"]["param_groups"][0]["lr"] == pytest.approx(3.25e-4)
    assert json.loads((out / "config.json").read_text())["decay_from"] == 4


def test_clock_timed_cool_down_closed_form():
    """cooled(): the lr as given until the last cool_minutes of max_minutes, then linear to lr_end."""
    from trainer.train import cooled

    cfg = TrainConfig(lr=1e-3, max_minutes=10, cool_minutes=2, lr_end=1e-4)
    at = lambda minutes, lr=1e-3: cooled(cfg, lr, 60 * minutes)
    assert [at(0), at(7.9), at(8), at(9), at(9.5), at(10), at(12)] == pytest.approx(
        [1e-3, 1e-3, 1e-3, 5.5e-4, 3.25e-4, 1e-4, 1e-4])
    assert at(9, lr=5e-4) == pytest.approx(3e-4)  # from whatever lr the schedule gives (a warmup's)
    for off in (TrainConfig(lr=1e-3, max_minutes=10), TrainConfig(lr=1e-3, cool_minutes=2)):
        assert cooled(off, 1e-3, 60 * 9.9) == 1e-3  # needs both


def test_clock_timed_cool_down_in_a_run(cifar_small, tmp_path):
    """train --max-minutes M --cool-minutes C: constant lr first, then falling to --lr-end by the end
    (the metrics' lr); a resume does not inherit the cool-down; C >= M is a usage error."""
    from click.testing import CliRunner

    from trainer.__main__ import main

    out = tmp_path / "run"
    common = ["train", "--out", str(out), "--log-every", "1", "--eval-every", "0", "--save-every", "0", "--no-progress"]
    first = common + ["--data", str(cifar_small / "train.npz"), "--eval-data", str(cifar_small / "test.npz"),
                      "--preset", "tiny", "--dequant", "uniform", "--batch", "4", "--eval-images", "4",
                      "--eval-n-t", "2", "--lr", "1e-3", "--warmup", "1", "--no-bf16", "--threads", "1"]
    r = CliRunner().invoke(main, first + ["--max-minutes", "0.02", "--cool-minutes", "0.03"])
    assert r.exit_code == 2 and "--cool-minutes" in r.output and not out.exists()
    r = CliRunner().invoke(main, first + ["--max-minutes", "0.1", "--cool-minutes", "0.05"])
    assert r.exit_code == 0, r.output
    lrs = [r["lr"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "lr" in r]
    assert len(lrs) >= 4 and lrs[0] == pytest.approx(1e-3)  # the first step is long before the last 3 s
    assert all(b <= a for a, b in zip(lrs, lrs[1:])) and lrs[-1] < 0.25e-3
    assert json.loads((out / "config.json").read_text())["cool_minutes"] == 0.05
    n = len(lrs)
    r = CliRunner().invoke(main, common + ["--steps", str(n + 2)])
    assert r.exit_code == 0, r.output
    lrs = [r["lr"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "lr" in r]
    assert lrs[n:] == pytest.approx([1e-3, 1e-3])  # resumed at the constant lr
    assert json.loads((out / "config.json").read_text())["cool_minutes"] == 0.0


def test_resume_does_not_inherit_the_time_limit(cifar_small, tmp_path):
    """--max-minutes bounds one command: a run stopped by it and resumed without it trains on to
    --steps (it used to keep the saved limit and stop again after as many minutes)."""
    from click.testing import CliRunner

    from trainer.__main__ import main

    out = tmp_path / "run"
    common = ["train", "--out", str(out), "--eval-every", "0", "--save-every", "0", "--no-progress"]
    first = common + ["--data", str(cifar_small / "train.npz"), "--eval-data", str(cifar_small / "test.npz"),
                      "--preset", "tiny", "--dequant", "uniform", "--batch", "8", "--eval-images", "8",
                      "--eval-n-t", "2", "--steps", "3", "--no-bf16", "--max-minutes", "1e-7"]
    r = CliRunner().invoke(main, first)
    assert r.exit_code == 0, r.output
    assert ckpt.load_checkpoint(out / "checkpoint")[1]["step"] < 3  # the limit stopped it early
    r = CliRunner().invoke(main, common)
    assert r.exit_code == 0, r.output
    assert ckpt.load_checkpoint(out / "checkpoint")[1]["step"] == 3
    assert json.loads((out / "config.json").read_text())["max_minutes"] == 0.0


def test_bf16_autocasts_on_cpus_that_have_it(cifar_small, tmp_path, monkeypatch):
    """The bf16 setting autocasts on CUDA and on CPUs with native bfloat16 (AVX512_BF16 or AMX: about
    1.4x the images per second of float32 on a 2-core AVX-512 EPYC), not on CPUs that would emulate
    it; a run with it on the CPU trains (finite loss and bound), whichever the machine is."""
    from scoreflow_codec import models

    caps = {}
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    assert not models.bf16_is_fast(torch.device("cpu"))
    caps["avx512_bf16"] = True
    assert models.bf16_is_fast(torch.device("cpu"))
    caps.clear()
    caps["amx_bf16"] = True
    assert models.bf16_is_fast(torch.device("cpu")) and models.bf16_is_fast(torch.device("cuda"))
    seen = []
    real = torch.autocast
    monkeypatch.setattr(torch, "autocast", lambda dev, **kw: seen.append((dev, kw["enabled"])) or real(dev, **kw))
    res = train(_cfg(cifar_small, steps=2, bf16=True), tmp_path / "b", progress=False)
    assert set(seen) == {("cpu", True)} and np.isfinite(res["eval_bound_bpd"])
    seen.clear()
    caps.clear()
    train(_cfg(cifar_small, steps=3, bf16=True), tmp_path / "b", progress=False)  # resumed; no native bf16
    assert set(seen) == {("cpu", False)}


def test_folder_images_are_what_the_codec_gives_its_model(tmp_path):
    """A folder's images train the model on what the codec will code with it (codec_pixels): 8-bit images
    as Pillow shows them in RGB (every mode), a 16-bit image's high bits as the codec reduces them; a file
    that is not an image is one error naming it."""
    from trainer.data import codec_pixels
    from scoreflow_codec import images

    rng = np.random.default_rng(5)
    rgb = rng.integers(0, 256, (12, 9, 3), dtype=np.uint8)
    base = Image.fromarray(rgb)
    for mode in ("RGB", "RGBA", "L", "LA", "1", "P"):
        p = tmp_path / f"m_{mode}.png"
        base.convert(mode).save(p)
        with Image.open(p) as im:
            assert np.array_equal(codec_pixels(p), np.asarray(im.convert("RGB"))), mode
    # 10-bit data in 16-bit grey words (a scanner's): Pillow's RGB clips it to 255, or its high byte is 0 - 3
    ten = rng.integers(0, 1024, (16, 20)).astype(np.uint16)
    p = tmp_path / "ten.png"
    Image.fromarray(ten).save(p)
    got = codec_pixels(p)
    assert got.shape == (16, 20, 3) and np.array_equal(got[..., 0], got[..., 2])
    assert np.array_equal(got[..., 0], images.load_image(p).color[0]) and got.max() > 200
    assert np.array_equal(got[..., 0], (ten >> 2).astype(np.uint8))  # all 10 bits used: the top 8
    # 48-bit colour: the codec's high bits, as it codes them
    from deep_files import png16_by_hand

    wide = rng.integers(0, 65536, (8, 10, 3), dtype=np.uint16)
    p = tmp_path / "wide.png"
    p.write_bytes(png16_by_hand(wide, interlace=False))
    assert np.array_equal(codec_pixels(p), images.load_image(p).color.transpose(1, 2, 0))
    assert len(load_images(tmp_path)) == 8
    # where the coding layer is missing (the GPU machine has no constriction), folders still load
    code = ("import sys; sys.modules['constriction'] = None; from trainer.data import load_images; "
            f"print(len(load_images({str(tmp_path)!r})))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "8", r.stderr
    (tmp_path / "broken.png").write_text("no image")
    with pytest.raises(ValueError, match="broken.png"):
        load_images(tmp_path)
