"""The ScoreFlow training loop: likelihood-weighted DSM with importance sampling, jointly with a
variational dequantizer, EMA, Adam with warmup and clipping, bf16 on GPU and on CPUs with native
bfloat16, DDP under torchrun.

Objective per image (nats): dsm_loss(y) + E[-log pi(y_T)] + log q(u | x), y = x + u, which is the
ScoreFlow bound on -log P(x) up to terms that do not depend on the parameters.
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from scoreflow_codec import likelihood, pixels
from scoreflow_codec.dequant import DequantConfig, make_dequantizer
from scoreflow_codec.losses import dsm_loss, stratified_uniform
from scoreflow_codec.models import bf16_is_fast, presets
from scoreflow_codec.models.precond import ScoreModel
from scoreflow_codec.modelfile import model_config
from scoreflow_codec.sde import SDEConfig

from . import checkpoint as ckpt
from .config import TrainConfig
from .data import CropSampler, center_crops, hold_out, load_images
from .profiling import StepProfiler

log = logging.getLogger("trainer")


class Objective(nn.Module):
    """Score model + dequantizer; forward(x_uint8) -> per-image loss in nats."""

    def __init__(self, model: ScoreModel, dequant: nn.Module, weighting: str, importance: bool):
        super().__init__()
        self.model, self.dequant = model, dequant
        self.weighting, self.importance = weighting, importance

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        u, log_q = self.dequant.draw(x, generator=generator)  # no CDF inversion (dequant.py)
        y = pixels.to_model(x, u.to(torch.float32))
        # one t per stratum of the batch (VDM's low-discrepancy sampler): the batch mean is unbiased
        # with far less t-noise than independent draws
        u_t = stratified_uniform(y.shape[0], 1, generator, y.device).reshape(-1)
        loss = dsm_loss(self.model, y, weighting=self.weighting, importance=self.importance, generator=generator,
                        u=u_t)
        sde = self.model.sde
        tT = torch.full((y.shape[0],), sde.T, dtype=torch.float64, device=y.device)
        mean, std = sde.marginal_prob(y, tT.to(y.dtype))
        yT = mean + std.view(-1, 1, 1, 1) * torch.randn(y.shape, device=y.device, generator=generator)
        return loss - sde.prior_logp(yT) + log_q.to(loss.dtype)


def build(cfg: TrainConfig) -> tuple[ScoreModel, nn.Module, dict]:
    """Model, dequantizer and the config dict an exported model carries."""
    p = presets.get_preset(cfg.preset)
    unet_cfg = p.unet if cfg.dropout is None else p.unet.__class__.from_dict({**p.unet.to_dict(), "dropout": cfg.dropout})
    model = presets.build_score_model(unet_cfg, SDEConfig(kind=cfg.sde), p.precond)
    dequant = make_dequantizer(DequantConfig.from_dict({**p.dequant.to_dict(), "kind": cfg.dequant}))
    return model, dequant, model_config(model, dequant, cfg.preset)


# the options that make the networks: a resumed run keeps them (its checkpoint's weights fit no other)
MODEL_OPTIONS = ("preset", "sde", "dequant")


def _same_model(out: Path, saved: dict, cfg: TrainConfig) -> None:
    """ValueError (one line) where a resumed run is given another model than its checkpoint's (--preset,
    --sde, --dequant): before 0.9.32 a traceback of size mismatches, or a model of another SDE silently."""
    changed = [f"--{k} {saved[k]}, not {getattr(cfg, k)}" for k in MODEL_OPTIONS
               if k in saved and saved[k] != getattr(cfg, k)]
    if changed:
        raise ValueError(f"{out} was trained with {'; '.join(changed)}: a run keeps its model (a new --out "
                         f"starts another)")


def _dist_info() -> tuple[int, int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    return rank, world, local


def lr_at(cfg: TrainConfig, step: int) -> float:
    """The lr of step `step` (0-based): a linear warmup over cfg.warmup steps, then constant; with
    cfg.decay_from, linear from cfg.lr at that step to cfg.lr_end at cfg.steps (a cool-down, run on a
    copy of the run directory; a later resume with decay_from 0 is at the constant lr again)."""
    lr = cfg.lr * min(1.0, (step + 1) / max(1, cfg.warmup))
    if cfg.decay_from and step >= cfg.decay_from:
        frac = min(1.0, (step - cfg.decay_from) / max(1, cfg.steps - cfg.decay_from))
        lr += (cfg.lr_end - lr) * frac
    return lr


def cooled(cfg: TrainConfig, lr: float, elapsed_s: float) -> float:
    """`lr` in the clock-timed cool-down (cfg.cool_minutes, the end of cfg.max_minutes): it falls
    linearly to cfg.lr_end over the last cool_minutes of the command's time (elapsed_s, from its start
    of training). For a GPU chunk, whose step count per minute is not known ahead; unchanged otherwise."""
    if not (cfg.cool_minutes and cfg.max_minutes):
        return lr
    start = 60.0 * (cfg.max_minutes - cfg.cool_minutes)
    if elapsed_s <= start:
        return lr
    frac = min(1.0, (elapsed_s - start) / (60.0 * cfg.cool_minutes))
    return lr + (cfg.lr_end - lr) * frac


@torch.no_grad()
def evaluate(model: ScoreModel, dequant: nn.Module, x: torch.Tensor, n_t: int, seed: int) -> dict:
    gen = likelihood.seeded(seed, x.device)
    vals: dict[str, list] = {}
    for s in range(0, x.shape[0], 64):
        terms = likelihood.bound_terms(model, x[s:s + 64], dequant, n_t=n_t, generator=gen)
        for k in ("bpd_with", "bpd_without"):
            vals.setdefault(k, []).append(terms[k].float().cpu())
    return {k: float(torch.cat(v).mean()) for k, v in vals.items()}


def _init_from(cfg: TrainConfig, model: ScoreModel, dequant: nn.Module, dev: torch.device) -> None:
    """Start from another run's EMA score model (a run directory), or from an exported model
    file (score model, and its dequantizer where the kinds match). Mismatched architectures
    raise ValueError with the reason."""
    src = Path(cfg.init_from)
    if src.is_file():
        from scoreflow_codec.modelfile import load_model_file

        lm = load_model_file(src, dev)
        weights, deq = lm.model.state_dict(), lm.dequantizer.state_dict()
        if lm.config["dequant"].get("kind") != dequant.config.kind:
            deq = None
        theirs = lm.config.get("preset")
    else:
        tensors, state = ckpt.load_checkpoint(src / "checkpoint", dev)
        weights = {k[len("ema.model."):]: v for k, v in tensors.items() if k.startswith("ema.model.")}
        deq = None
        theirs = (state.get("config") or {}).get("preset")
    try:
        model.load_state_dict(weights)
        if deq is not None:
            dequant.load_state_dict(deq)
    except RuntimeError as e:
        why = f"it is preset {theirs!r}" if theirs and theirs != cfg.preset else str(e).splitlines()[0]
        raise ValueError(f"--init-from {src}: its model does not match preset {cfg.preset!r} ({why})") from None


def train(cfg: TrainConfig, out: str | Path, device: str | None = None, resume: bool = True,
          progress: bool = True) -> dict:
    """Train (or continue) the run in `out`; returns the final metrics."""
    out = Path(out)
    rank, world, local = _dist_info()
    if device is None:
        device = f"cuda:{local}" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True  # the step's shapes never change: cuDNN times its choices once
    torch.manual_seed(cfg.seed + 1000 * rank)
    # the data first: a run that cannot start leaves no run directory behind (a later command would resume
    # its config.json)
    train_images = load_images(cfg.data)
    if cfg.eval_data:
        eval_images = load_images(cfg.eval_data)
    else:
        eval_images, train_images = hold_out(train_images, cfg.holdout)
    eval_x = center_crops(eval_images, cfg.crop, cfg.eval_images).to(dev)
    train_x = center_crops(train_images, cfg.crop, cfg.eval_images).to(dev)

    model, dequant, mconfig = build(cfg)
    model.to(dev), dequant.to(dev)
    ema_model, ema_dequant, _ = build(cfg)
    ema_model.to(dev), ema_dequant.to(dev)
    ema_model.load_state_dict(model.state_dict()), ema_dequant.load_state_dict(dequant.state_dict())
    for p in list(ema_model.parameters()) + list(ema_dequant.parameters()):
        p.requires_grad_(False)
    # the EMA copies are only averaged into and evaluated: eval mode, so that dropout (presets base and
    # ddpmpp, --dropout) is off in the run's evaluations as it is in the exported model (before 0.9.45 the
    # evaluations of a dropout run drew dropout masks: at --dropout 0.1 3.564 where the model had 3.440)
    ema_model.eval(), ema_dequant.eval()
    ck = out / "checkpoint"
    if cfg.init_from and not (ck / "state.json").exists():
        _init_from(cfg, model, dequant, dev)
        ema_model.load_state_dict(model.state_dict()), ema_dequant.load_state_dict(dequant.state_dict())
        if rank == 0:
            log.info("initialised from %s", cfg.init_from)
    if cfg.freeze_model:
        for p in model.parameters():
            p.requires_grad_(False)
    objective = Objective(model, dequant, cfg.weighting, cfg.importance)
    params = [p for p in objective.parameters() if p.requires_grad]
    # fused: one kernel for the update, which also reads `found_inf` on the device (below)
    opt = torch.optim.Adam(params, lr=cfg.lr, fused=dev.type in ("cuda", "cpu"))

    step, elapsed_total, images_seen = 0, 0.0, 0
    if resume and (ck / "state.json").exists():
        tensors, state = ckpt.load_checkpoint(ck, dev)
        _same_model(out, state.get("config") or {}, cfg)
        model.load_state_dict({k[len("net.model."):]: v for k, v in tensors.items() if k.startswith("net.model.")})
        dequant.load_state_dict({k[len("net.dequant."):]: v for k, v in tensors.items() if k.startswith("net.dequant.")})
        ema_model.load_state_dict({k[len("ema.model."):]: v for k, v in tensors.items() if k.startswith("ema.model.")})
        ema_dequant.load_state_dict({k[len("ema.dequant."):]: v for k, v in tensors.items() if k.startswith("ema.dequant.")})
        ckpt.load_optimizer(opt, tensors, state["optimizer"])
        step, elapsed_total, images_seen = state["step"], state.get("elapsed", 0.0), state.get("images", 0)
        if rank == 0:
            log.info("resumed from %s at step %d", ck, step)
    sampler = CropSampler(train_images, cfg.crop, cfg.flip, cfg.min_scale, rank, world, seed=cfg.seed + step,
                          grain=cfg.grain)
    out.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        (out / "config.json").write_text(cfg.to_json())

    obj = objective
    if world > 1:
        obj = nn.parallel.DistributedDataParallel(objective, device_ids=[dev.index] if dev.type == "cuda" else None)
    local_batch = max(1, cfg.batch // world)
    use_bf16 = cfg.bf16 and bf16_is_fast(dev)
    dims = 3 * cfg.crop * cfg.crop
    metrics_f = open(out / "metrics.jsonl", "a") if rank == 0 else None
    bar = None
    if progress and rank == 0:
        from tqdm import tqdm
        bar = tqdm(total=cfg.steps, initial=step, desc="train", dynamic_ncols=True)
    live_params = list(model.parameters()) + list(dequant.parameters())
    ema_params = list(ema_model.parameters()) + list(ema_dequant.parameters())
    live_buffers = list(model.buffers()) + list(dequant.buffers())
    ema_buffers = list(ema_model.buffers()) + list(ema_dequant.buffers())
    t_start = time.perf_counter()
    t_log, n_log, loss_acc = t_start, 0, 0.0
    last = {}
    saved_at = None  # the step of the checkpoint on disk from this process
    clock = None  # the seconds the cool-down goes by, as the ranks last agreed
    profiler = StepProfiler(cfg.profile_steps, dev, log=log) if cfg.profile_steps and rank == 0 else None

    def save():
        nonlocal saved_at
        tensors = {**{f"net.model.{k}": v for k, v in model.state_dict().items()},
                   **{f"net.dequant.{k}": v for k, v in dequant.state_dict().items()},
                   **{f"ema.model.{k}": v for k, v in ema_model.state_dict().items()},
                   **{f"ema.dequant.{k}": v for k, v in ema_dequant.state_dict().items()}}
        ot, oscal = ckpt.optimizer_tensors(opt)
        tensors.update(ot)
        state = {"step": step, "elapsed": elapsed_total + time.perf_counter() - t_start, "images": images_seen,
                 "optimizer": oscal, "config": cfg.to_dict(), "model_config": mconfig, "last": last}
        ckpt.save_checkpoint(ck, tensors, state, compact_state=cfg.compact_checkpoint)
        saved_at = step

    try:
        while step < cfg.steps:
            # ranks agree on the time (a collective, which waits for the queue) every AGREE_EVERY steps
            agree = world == 1 or step % AGREE_EVERY == 0 or clock is None
            if cfg.max_minutes and agree and _time_is_up(time.perf_counter() - t_start > 60 * cfg.max_minutes, world, dev):
                break
            if agree:
                clock = _rank0_clock(time.perf_counter() - t_start, world, cfg, dev)
            x = sampler.sample(local_batch)
            # from pinned memory the copy is queued like any kernel (from pageable memory it may hold the CPU)
            x = (x.pin_memory() if dev.type == "cuda" else x).to(dev, non_blocking=True)
            lr = cooled(cfg, lr_at(cfg, step), clock)
            for g in opt.param_groups:
                g["lr"] = lr
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_bf16):
                loss = obj(x).float().mean() / dims
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip) if cfg.grad_clip > 0 else torch.tensor(0.0)
            guarded_step(opt, loss, gnorm if cfg.grad_clip > 0 else None, world)
            step += 1
            images_seen += local_batch * world
            decay = min(cfg.ema, (1 + step) / (10 + step))
            with torch.no_grad():  # one fused update for all parameters (a launch per tensor on a GPU otherwise)
                torch._foreach_lerp_(ema_params, live_params, 1 - decay)
                for b, c in zip(live_buffers, ema_buffers):
                    c.copy_(b)
            loss_acc = loss_acc + loss.detach()  # read at the log steps only: float() here would wait for the GPU
            n_log += 1
            if profiler:
                profiler.step()
            if bar:
                bar.update(1)
            if rank == 0 and (step % cfg.log_every == 0 or step == cfg.steps):
                now = time.perf_counter()
                loss_acc = float(loss_acc)
                rec = {"step": step, "loss_nats_per_dim": loss_acc / n_log,
                       "loss_bpd_proxy": (loss_acc / n_log + pixels.LOG_128) / math.log(2),
                       "lr": lr, "grad_norm": float(gnorm),
                       "images_per_s": n_log * local_batch * world / max(now - t_log, 1e-9),
                       "elapsed_s": elapsed_total + now - t_start}
                metrics_f.write(json.dumps(rec) + "\n")
                metrics_f.flush()
                if bar:
                    bar.set_postfix(loss=f"{rec['loss_bpd_proxy']:.3f}", ips=f"{rec['images_per_s']:.0f}")
                t_log, n_log, loss_acc = now, 0, 0.0
            if rank == 0 and cfg.eval_every and step % cfg.eval_every == 0:
                last = eval_record(step, ema_model, ema_dequant, eval_x, train_x, cfg, metrics_f, elapsed_total + time.perf_counter() - t_start)
            if rank == 0 and cfg.save_every and step % cfg.save_every == 0:
                save()
    finally:
        if bar:
            bar.close()
        if profiler:
            profiler.finish()  # a run that ended inside the profiled steps logs the ones it made
    if rank == 0:
        if not last or last.get("step") != step:
            # the last step's weights on disk before the end evaluation (minutes on a CPU), so that an
            # export started meanwhile takes them and not the last --save-every checkpoint's (0.9.54's
            # `cifar10` was exported from step 7,000 while the run's evaluation of step 7,032 ran);
            # written already where the last step is a --save-every step
            if saved_at != step:
                save()
            last = eval_record(step, ema_model, ema_dequant, eval_x, train_x, cfg, metrics_f, elapsed_total + time.perf_counter() - t_start)
        save()
        metrics_f.close()
    if world > 1:
        dist.barrier()
    return last


def guarded_step(opt: torch.optim.Optimizer, loss: torch.Tensor, gnorm: torch.Tensor | None,
                 world: int = 1) -> None:
    """opt.step(), which changes nothing where the loss or the gradients' norm is not finite.

    A fused Adam takes the test on the device: it reads `found_inf` there (as under AMP's GradScaler)
    and then leaves the weights, its moments and its step count as they were. Until 0.9.38 the trainer
    asked `if torch.isfinite(loss)` in Python, which made the CPU wait for the GPU at every step (and a
    non-finite gradient with a finite loss went through). An optimizer that is not fused ignores
    found_inf, so there the test is made on the host.

    With several ranks (world > 1) the ranks agree (an all-reduce of the flag, on the device): a step
    is skipped on every rank if it is on one. Each rank's loss is its own, so until 0.9.40 a rank whose
    loss was not finite skipped while the others stepped (without clipping, with the NaN gradients
    DDP had averaged into theirs), and the replicas, which DDP keeps equal only by equal steps, parted."""
    ok = torch.isfinite(loss) if gnorm is None else torch.isfinite(loss) & torch.isfinite(gnorm.to(loss.device))
    if world > 1:
        flag = ok.to(torch.int32).reshape(1)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        ok = flag[0].bool()
    if opt.defaults.get("fused"):
        opt.found_inf = (~ok).to(torch.float32)
        opt.step()
    elif ok:
        opt.step()


# with several ranks, the steps at which they agree on the time limit and on the cool-down's clock: each
# agreement is a collective whose result the CPU reads, a wait for the GPU's queue (until 0.9.38 two a
# step). A limit is then overshot by at most AGREE_EVERY - 1 steps, and the lr moves every AGREE_EVERY.
AGREE_EVERY = 8


def _time_is_up(mine: bool, world: int, dev) -> bool:
    """--max-minutes, agreed by all ranks: rank 0 falls behind the others while it evaluates and
    saves, so a rank alone would stop a step before or after them and leave them waiting in the
    gradient all-reduce (or the final barrier) for ever. Any rank over the limit stops all."""
    if world == 1:
        return mine
    flag = torch.tensor([int(mine)], device=dev)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _rank0_clock(elapsed: float, world: int, cfg: TrainConfig, dev) -> float:
    """The seconds the clock-timed cool-down goes by: rank 0's, on every rank. Each rank's own
    clock differs by a little, so each would step with another lr and the replicas (which DDP keeps
    equal only by their equal steps) would drift apart."""
    if world == 1 or not cfg.cool_minutes:
        return elapsed
    t = torch.tensor([elapsed], dtype=torch.float64, device=dev)
    dist.broadcast(t, 0)
    return float(t.item())


# The draws of every evaluation a run records (its t and dequantization noise): one fixed seed, so that
# two evaluations of the same images, at two steps or in two runs (a chunk and the chunk after it), are
# paired and their difference is the models', not the draws'. Until 0.9.49 the seed was the step.
EVAL_SEED = 0


def eval_record(step, ema_model, ema_dequant, eval_x, train_x, cfg, metrics_f, elapsed) -> dict:
    ev = evaluate(ema_model, ema_dequant, eval_x, cfg.eval_n_t, seed=EVAL_SEED)
    tr = evaluate(ema_model, ema_dequant, train_x, cfg.eval_n_t, seed=EVAL_SEED)
    rec = {"step": step, "eval_bound_bpd": ev["bpd_with"], "eval_bound_bpd_nocorr": ev["bpd_without"],
           "train_bound_bpd": tr["bpd_with"], "train_bound_bpd_nocorr": tr["bpd_without"], "elapsed_s": elapsed}
    metrics_f.write(json.dumps(rec) + "\n")
    metrics_f.flush()
    log.info("step %d: bound %.4f bpd held-out, %.4f train", step, ev["bpd_with"], tr["bpd_with"])
    return rec


def load_ema(run: str | Path, device: str = "cpu") -> tuple[ScoreModel, nn.Module, dict, dict]:
    """EMA model + dequantizer of a run's latest checkpoint, with its model config and state."""
    tensors, state = ckpt.load_checkpoint(Path(run) / "checkpoint", device)
    cfg = TrainConfig.from_dict(state["config"])
    model, dequant, mconfig = build(cfg)
    model.load_state_dict({k[len("ema.model."):]: v for k, v in tensors.items() if k.startswith("ema.model.")})
    dequant.load_state_dict({k[len("ema.dequant."):]: v for k, v in tensors.items() if k.startswith("ema.dequant.")})
    return model.eval(), dequant.eval(), mconfig, state


def calibrate(model, data: str, images: int = 512, seed: int = 0, dequant: nn.Module | None = None) -> dict:
    """The model's denoising-error table (scoreflow_codec.calibration) on training images, with
    u from `dequant` (the model's own dequantizer: what the codec codes with) where given."""
    from scoreflow_codec.calibration import eps_mse_table

    x = center_crops(load_images(data), 32, images)  # the codec's tile size
    return eps_mse_table(model, x, generator=torch.Generator().manual_seed(seed), dequantizer=dequant)


def export(run: str | Path, path: str | Path, dtype: str = "float32", name: str | None = None,
           extra: dict | None = None, calib_images: int = 512, tile: int | None = None,
           chain_steps: int | None = None, calib_data: str | Path | None = None) -> str:
    """Write the EMA model of a run as the one-file format the codec loads; returns its sha256.

    With calib_images > 0 the file also carries the model's denoising-error table, measured on
    that many training images (chain mode's reverse variances): the run's training data, or
    calib_data where given (the same images elsewhere: a run trained on a device names its
    .device_data copy, which stays there). tile / chain_steps, where given,
    are recorded as the defaults the codec uses with the model (modelfile's "codec").
    """
    from scoreflow_codec import modelfile

    model, dequant, mconfig, state = load_ema(run)
    data = calib_data or state["config"]["data"]
    if calib_images > 0 and not Path(data).exists():
        raise FileNotFoundError(f"the run's training data is not here ({data}): give the same images as the "
                                "calibration data (export --calib-data PATH), or no table (--calib-images 0)")
    info = {"step": state["step"], "images_seen": state.get("images", 0), "train_seconds": state.get("elapsed", 0.0),
            "train_config": state["config"], "last_eval": state.get("last", {}), **(extra or {})}
    if calib_images > 0:
        info["eps_mse"] = calibrate(model, data, calib_images, dequant=dequant)
    info["name"] = name or Path(path).stem  # the name the codec loads it as (modelfile reads info's)
    config = {"preset": mconfig["preset"], "info": info, "codec": {"tile": tile, "chain_steps": chain_steps}}
    return modelfile.save_model(path, model, dequant, config, dtype=dtype)


def set_threads_from_env() -> None:
    n = os.environ.get("SFC_THREADS")
    if n:
        torch.set_num_threads(int(n))


__all__ = ["train", "export", "build", "load_ema", "Objective"]
