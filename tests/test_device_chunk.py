"""GPU training chunks (trainer/device.py, docs/TRAINING.md): the compact checkpoint keeps the state
to within bfloat16 of the EMA's distance from the weights, and a whole chunk (prepare, run the
chunk script as the device would, unpack, resume) works end to end on the CPU."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import cifar_subset
from trainer import checkpoint as ckpt
from trainer import device
from trainer.config import TrainConfig
from trainer.train import export, train


def _state(n: int = 4096, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, generator=g)
    return {"net.model.w": w, "ema.model.w": w + 1e-3 * torch.randn(n, generator=g),
            "net.model.count": torch.tensor([7]), "ema.model.count": torch.tensor([7]),
            "opt.0.exp_avg": 1e-4 * torch.randn(n, generator=g),
            "opt.0.exp_avg_sq": 1e-8 * torch.rand(n, generator=g)}


def test_compact_checkpoint_keeps_the_state(tmp_path):
    full = _state()
    ckpt.save_checkpoint(tmp_path / "full", full, {"step": 3})
    ckpt.save_checkpoint(tmp_path / "small", full, {"step": 3}, compact_state=True)
    size = lambda d: sum(f.stat().st_size for f in d.glob("*.safetensors"))
    assert size(tmp_path / "small") < 0.55 * size(tmp_path / "full")  # 8 bytes a parameter, not 16
    back, state = ckpt.load_checkpoint(tmp_path / "small")
    assert state["step"] == 3 and state["compact"] and set(back) == set(full)
    assert torch.equal(back["net.model.w"], full["net.model.w"])  # the weights exactly
    assert torch.equal(back["ema.model.count"], full["ema.model.count"])
    delta = (full["ema.model.w"] - full["net.model.w"]).abs()
    assert torch.all((back["ema.model.w"] - full["ema.model.w"]).abs() <= 2 ** -8 * delta + 1e-12)
    assert not torch.equal(back["ema.model.w"], back["net.model.w"])
    rel = (back["opt.0.exp_avg_sq"] - full["opt.0.exp_avg_sq"]).abs() / full["opt.0.exp_avg_sq"]
    assert float(rel.max()) <= 2 ** -8 and back["opt.0.exp_avg_sq"].dtype == torch.float32
    assert torch.count_nonzero(back["opt.0.exp_avg"]) == 0  # first moments restart at zero


@pytest.fixture(scope="module")
def tiny_data(shared_data, tmp_path_factory):
    return cifar_subset(shared_data, tmp_path_factory.mktemp("chunkdata"), 64, 16)


def _git_repo(path: Path) -> Path:
    path.mkdir()
    (path / ".gitignore").write_text("/.device_data/\n")
    (path / "model.bin").write_bytes(os.urandom(50_000))  # stands for the tracked files
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", *args], cwd=path, check=True, capture_output=True)
    return path


def test_a_chunk_runs_end_to_end_and_resumes(tiny_data, tmp_path):
    cfg = TrainConfig(preset="tiny", dequant="uniform", data=str(tiny_data / "train.npz"),
                      eval_data=str(tiny_data / "test.npz"), batch=8, warmup=2, eval_images=8, eval_n_t=2,
                      eval_every=0, save_every=0, steps=3, bf16=False)
    run = tmp_path / "run"
    train(cfg, run, progress=False)
    before, _ = ckpt.load_checkpoint(run / "checkpoint")

    repo = _git_repo(tmp_path / "repo")
    sizes = device.prepare(repo, str(tiny_data / "train.npz"), str(tiny_data / "test.npz"), run=run,
                           eval_images=8, train_args="--steps 5 --batch 8 --eval-n-t 2 --threads 1")
    assert sizes["tracked"] >= 50_000 and sizes["carried"] > 0 and sizes["total"] <= device.TRAVEL_LIMIT
    dd = repo / device.FOLDER
    assert len(list((dd / "train").glob("*.webp"))) == 64 == sizes["train_images"]
    assert len(list((dd / "test").glob("*.webp"))) == 8
    out = tmp_path / "OUT"
    r = _run_chunk(repo, out, tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    back = sorted(p.name for p in out.iterdir())
    assert "state.json" in back and "train.log" in back and len(back) <= device.RETURN_FILES
    assert all((out / f).stat().st_size <= device.RETURN_FILE_BYTES for f in back)

    local = tmp_path / "local"
    state = device.unpack(out, local)
    assert state["step"] == 5 and state["compact"]
    after, _ = ckpt.load_checkpoint(local / "checkpoint")
    assert set(after) == set(before)
    k = next(k for k in after if k.startswith("ema.model.") and after[k].is_floating_point())
    assert not torch.equal(after[k], before[k])  # it trained on
    # the next chunk carries that compact checkpoint as it came back, byte for byte (no re-encoding)
    device.prepare(repo, str(tiny_data / "train.npz"), str(tiny_data / "test.npz"), run=local, eval_images=8)
    for f in (local / "checkpoint").iterdir():
        assert (dd / "run" / "checkpoint" / f.name).read_bytes() == f.read_bytes(), f.name
    # and resumes here, from the unpacked checkpoint (its data now the chunk's folder in the repo)
    cfg2 = cfg.override(steps=6, data=str(dd / "train"), eval_data=str(dd / "test"), compact_checkpoint=True)
    assert train(cfg2, local, progress=False)["step"] == 6


def _run_chunk(repo: Path, out: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """The chunk script as the device runs it: in the tree, $OUT an empty folder, and no constriction
    (the GPU image has torch, numpy, pillow, click and safetensors, not the coder: KINDS.md)."""
    out.mkdir()
    block = tmp_path / "block"
    block.mkdir(exist_ok=True)
    (block / "constriction.py").write_text("raise ImportError('not on the device machine')\n")
    path = os.pathsep.join([str(block), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(["bash", ".device_data/chunk.sh"], cwd=repo, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OUT": str(out), "OMP_NUM_THREADS": "1", "PYTHONPATH": path})


def test_several_runs_share_a_chunk(tiny_data, tmp_path, monkeypatch):
    """jobs: a run continued and a new one train at once on the same data; what comes back (a log
    each, one tar in parts) fits the device's 8 files, and each unpacks into its own run directory,
    which resumes. The clock-timed cool-down reaches the runs' options."""
    cfg = TrainConfig(preset="tiny", dequant="uniform", data=str(tiny_data / "train.npz"),
                      eval_data=str(tiny_data / "test.npz"), batch=8, warmup=2, eval_images=8, eval_n_t=2,
                      eval_every=0, save_every=0, steps=3, bf16=False)
    run = tmp_path / "run"
    train(cfg, run, progress=False)
    repo = _git_repo(tmp_path / "repo")
    monkeypatch.setattr(device, "PART_BYTES", 1_000_000)  # the tiny runs' tar in several parts, as small's is
    jobs = [device.Job("on", run=run, train_args="--steps 5 --eval-n-t 2 --threads 1"),
            device.Job("new", train_args="--preset tiny --dequant uniform --batch 4 --steps 2 --eval-n-t 2 "
                                         "--threads 1 --no-bf16")]
    sizes = device.prepare(repo, str(tiny_data / "train.npz"), str(tiny_data / "test.npz"), jobs=jobs,
                           eval_images=8, minutes=5, cool_minutes=1)
    script = (repo / device.FOLDER / "chunk.sh").read_text()
    assert script.count("--cool-minutes 1 ") == 2 and "& " not in sizes["command"]
    out = tmp_path / "OUT"
    r = _run_chunk(repo, out, tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "on: " in r.stdout and "new: " in r.stdout  # each run's lines marked
    back = sorted(p.name for p in out.iterdir())
    parts = [b for b in back if b.startswith("chunk.tar.")]
    assert {"gpu.txt", "on.log", "new.log"} <= set(back) and len(parts) >= 2 and len(back) <= device.RETURN_FILES
    assert all((out / f).stat().st_size <= 1_000_000 for f in parts)

    assert device.unpack(out, tmp_path / "on", job="on")["step"] == 5
    state = device.unpack(out, tmp_path / "new", job="new")
    assert state["step"] == 2 and state["compact"]
    assert json.loads((tmp_path / "new" / "config.json").read_text())["preset"] == "tiny"
    assert (tmp_path / "on" / "metrics.jsonl").read_text().startswith((run / "metrics.jsonl").read_text())
    with pytest.raises(ValueError, match="name the one to unpack"):
        device.unpack(out, tmp_path / "x")
    with pytest.raises(ValueError, match="no run 'other' came back"):
        device.unpack(out, tmp_path / "x", job="other")
    broken = tmp_path / "broken"  # a run that came back without its checkpoint (it failed before saving)
    broken.mkdir()
    (broken / "new").mkdir()
    (broken / "new" / "config.json").write_text("{}")
    subprocess.run(["tar", "-cf", str(broken / "chunk.tar.00"), "new"], cwd=broken, check=True)
    with pytest.raises(FileNotFoundError, match=r"run 'new'\): no state.json came back \(see new.log\)"):
        device.unpack(broken, tmp_path / "x", job="new")
    # a member that would climb out of the run's folder is never written
    import tarfile
    import tempfile
    name = f"escaped-{os.getpid()}-{os.urandom(4).hex()}.txt"
    with tarfile.open(broken / "chunk.tar.00", "w") as tar:
        tar.add(broken / "new" / "config.json", arcname="new/config.json")
        tar.add(broken / "new" / "config.json", arcname=f"new/../../{name}")
    with pytest.raises(FileNotFoundError):
        device.unpack(broken, tmp_path / "x", job="new")
    assert not (Path(tempfile.gettempdir()) / name).exists()
    (out / parts[-1]).unlink()  # a part lost on the way
    with pytest.raises(ValueError, match="incomplete or damaged"):
        device.unpack(out, tmp_path / "y", job="new")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
    cfg2 = cfg.override(steps=3, data=str(repo / device.FOLDER / "train"), compact_checkpoint=True,
                        eval_data=str(repo / device.FOLDER / "test"), batch=4)
    assert train(cfg2, tmp_path / "new", progress=False)["step"] == 3  # and it resumes here


def test_a_failed_run_fails_the_chunk_but_keeps_the_others(tiny_data, tmp_path):
    """One run of a chunk that fails (here a model file of another preset) makes the chunk's exit status
    non-zero, and the run beside it still comes back whole."""
    repo = _git_repo(tmp_path / "repo")
    other = tmp_path / "other.safetensors"
    cfg = TrainConfig(preset="tiny", dequant="uniform", data=str(tiny_data / "train.npz"),
                      eval_data=str(tiny_data / "test.npz"), batch=4, warmup=1, eval_images=4, eval_n_t=2,
                      eval_every=0, save_every=0, steps=1, bf16=False)
    train(cfg, tmp_path / "r", progress=False)
    export(tmp_path / "r", other, calib_images=0)
    jobs = [device.Job("bad", init_from=other, train_args="--preset cpu --steps 2 --threads 1"),
            device.Job("good", train_args="--preset tiny --dequant uniform --batch 4 --steps 2 --eval-n-t 2 "
                                          "--threads 1 --no-bf16")]
    device.prepare(repo, str(tiny_data / "train.npz"), str(tiny_data / "test.npz"), jobs=jobs, eval_images=4)
    out = tmp_path / "OUT"
    r = _run_chunk(repo, out, tmp_path)
    assert r.returncode != 0 and "does not match preset 'cpu'" in (out / "bad.log").read_text()
    assert device.unpack(out, tmp_path / "good", job="good")["step"] == 2
    with pytest.raises(ValueError, match="no run 'bad' came back"):
        device.unpack(out, tmp_path / "bad", job="bad")


def test_jobs_that_cannot_be(tiny_data, tmp_path):
    """Refused before any work: runs named alike or badly, a cool-down as long as the chunk, a
    return over the device's 8 files (base's checkpoint is 67 MiB even compact), both forms at once."""
    repo = _git_repo(tmp_path / "repo")
    data = str(tiny_data / "train.npz")
    for jobs, match in (([device.Job("a"), device.Job("a")], "distinct names"),
                        ([device.Job("a/b")], "distinct names"), ([device.Job("train")], "distinct names"),
                        ([device.Job("big", train_args="--preset base")], "over what a device call returns")):
        with pytest.raises(ValueError, match=match):
            device.prepare(repo, data, jobs=jobs)
    with pytest.raises(ValueError, match="not both"):
        device.prepare(repo, data, train_args="--steps 2", jobs=[device.Job("a")])
    # a model file the repository tracks (a shipped one) travels once, from where it is
    sizes = device.prepare(repo, data, init_from=repo / "model.bin")
    assert "--init-from model.bin " in sizes["train_command"] + " "
    assert not (repo / device.FOLDER / "init.safetensors").exists()
    other = tmp_path / "other.bin"
    other.write_bytes(b"x" * 1000)
    sizes = device.prepare(repo, data, init_from=other)
    assert f"--init-from {device.FOLDER}/init.safetensors" in sizes["train_command"]
    with pytest.raises(ValueError, match="the end of the chunk"):
        device.prepare(repo, data, minutes=2, cool_minutes=2)
    spec = tmp_path / "jobs.json"
    for text, msg in (('[{"name": "a", "nope": 1}]', "not a list of jobs"), ("{", "not a list of jobs"),
                      ('[{"name": "a", "run": "missing"}]', "does not exist")):
        spec.write_text(text)
        r = subprocess.run([sys.executable, "-m", "trainer", "device-prep", "--data", data, "--jobs", str(spec),
                            "--repo", str(repo)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_data_takes_the_room_that_is_left(tiny_data, tmp_path):
    """Where not all training images fit (photographs), a random part goes, another per seed; where
    not even the tracked files and the state leave room, prepare refuses."""
    repo = _git_repo(tmp_path / "repo")
    tracked = device.travel_size(repo, repo / "none")["tracked"]
    limit = tracked + (1 << 20) + 60_000  # about 30 of the 64 images, and the held-out ones
    a = device.prepare(repo, str(tiny_data / "train.npz"), limit=limit, data_seed=1)
    names_a = sorted(p.name for p in (repo / device.FOLDER / "train").iterdir())
    assert a["total"] <= limit and 0 < a["train_images"] < a["train_images_all"] == 64 - 6
    assert a["eval_images"] == 6  # without --eval-data: N // 10 held out, as the trainer does
    b = device.prepare(repo, str(tiny_data / "train.npz"), limit=limit, data_seed=2)
    assert sorted(p.name for p in (repo / device.FOLDER / "train").iterdir()) != names_a
    assert "a random part" in device.describe(b)
    with pytest.raises(ValueError, match="no room is left"):
        device.prepare(repo, str(tiny_data / "train.npz"), str(tiny_data / "test.npz"), limit=60_000)


def test_prepare_outside_a_checkout_is_one_clear_error(tiny_data, tmp_path):
    r = subprocess.run([sys.executable, "-m", "trainer", "device-prep", "--data", str(tiny_data / "train.npz"),
                        "--repo", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "not a git checkout" in r.stderr and "Traceback" not in r.stderr
    for opt, value in (("--minutes", "0"), ("--eval-images", "0")):  # usage errors since 0.9.32
        r = subprocess.run([sys.executable, "-m", "trainer", "device-prep", "--data", str(tiny_data / "train.npz"),
                            "--repo", str(tmp_path), opt, value], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and f"Invalid value for '{opt}'" in r.stderr, r.stderr


def test_unpack_refuses_an_incomplete_return(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "state.json").write_text(json.dumps({"step": 1, "shards": ["weights-000.safetensors"]}))
    with pytest.raises(FileNotFoundError, match="shards missing"):
        device.unpack(tmp_path / "r", tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoint").exists()


def test_the_package_leaves_a_chunk_room_for_all_cifar10_training_images(shared_data):
    """Every tracked byte travels with a GPU chunk (64 MiB in all): a chunk that continues the shipped
    cifar10 model must still carry the whole CIFAR-10 training set. A ship that breaks this must
    retire the oldest kept models first (python -m trainer retire NAME ..., docs/TRAINING.md)."""
    repo = Path(__file__).resolve().parents[1]
    try:
        room = device.training_room(repo, str(shared_data / "cifar10" / "train.npz"),
                                     str(shared_data / "cifar10" / "test.npz"))
    except ValueError as e:
        if "not a git checkout" in str(e):
            pytest.skip(f"an installed copy, not a checkout: {e}")
        raise
    sizes = device.travel_size(repo, repo / "none")
    assert room["train_images"] == room["train_images_all"] == 5085, (
        f"a GPU chunk would carry {room['train_images']} of {room['train_images_all']} CIFAR-10 training images: "
        f"the tracked files take {sizes['tracked'] / 2**20:.1f} MiB, untracked {sizes['untracked'] / 2**20:.1f}; "
        "retire the oldest kept models (python -m trainer retire NAME ...)")
