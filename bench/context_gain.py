"""What a tile model gains from seeing the pixels above it and to its left (models/context.py).

The photo model loses to the seed codec across the image, not within the tile (`bench/tile_gap.py`):
its tiles know nothing of each other. This measures the lever before anything is built on it, as
the bound of the same test tiles with the same draws (the dequantizer's u, the times t, the noise
z), paired, under up to four arms:

  start    the model as it is, on the tile alone (what the codec does);
  window   the same model, untrained, on the tile's window, its known part dequantized and noised
           to x_t's level (models/context.py's WindowContext);
  tile     the model fine-tuned here on the tile alone;
  context  the model with a context encoder (ContextScoreModel, its new weights starting at zero),
           fine-tuned here the same number of steps on the same crops with the same draws as "tile".

    # the untrained arms: nothing to train
    python bench/context_gain.py eval --out runs/ctx --arms start,window --tile 64 ../shared/data/kodak/*.png
    # the trained arms, each in its own process (one thread each on a 2-core CPU); run again to go on
    python bench/context_gain.py train --arm tile --out runs/ctx --model photo --steps 3000
    python bench/context_gain.py train --arm context --out runs/ctx --model photo --steps 3000
    python bench/context_gain.py eval --out runs/ctx ../shared/data/kodak/*.png --json runs/ctx/eval.json

Training: windows of (tile + margin) px cropped from the photographs after a random down-scaling
(`--min-scale`, the photo recipe) with random flips; the tile is the window's bottom-right; each
of the top and left bands is known with probability `--p-known` (the image's first row and column of
tiles have none), the score model trained with the likelihood weighting and importance sampling
(dsm_loss), the model's dequantizer frozen (the same u for both arms), Adam with a short warm-up
(the encoder and its gate at their own lr), grad clip 1, EMA; a copy of the state every 500 steps
(ARM-STEP.pt, `eval --step`). Evaluation: the centre `--region` px of each image in tiles, each
interior (its margin lies in the image), so both bands are known.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ARMS = ("tile", "context")  # the trained arms
EVAL_ARMS = ("start", "window") + ARMS  # "window": the start model on the window (models/context.py), untrained


def _models(model_name: str, arm: str, margin: int):
    from scoreflow_codec.zoo import load_model
    from scoreflow_codec.models.context import ContextScoreModel

    lm = load_model(model_name)
    score = ContextScoreModel.from_tile_model(lm.model, margin) if arm == "context" else lm.model
    return score, lm.dequantizer


def _windows(sampler, n: int, margin: int, p_known: float, rng: np.random.Generator):
    w = sampler.sample(n)  # uint8 [N, C, T + m, T + m]
    known = rng.random((2, n)) < p_known
    import torch

    return w, torch.from_numpy(known[0]), torch.from_numpy(known[1])


def objective(score, arm: str, window, top, left, dequant, margin: int, generator):
    """The likelihood-weighted DSM loss of the windows' tiles in bits/dim (the bound's model-dependent
    part; the dequantizer is frozen), the tile arm seeing the tile alone."""
    import torch

    from scoreflow_codec import pixels
    from scoreflow_codec.losses import dsm_loss, stratified_uniform

    tile = window[:, :, margin:, margin:]
    with torch.no_grad():
        u, _ = dequant.draw(tile, generator=generator)
    y = pixels.to_model(tile, u.to(torch.float32))
    model = score.bind(score.context(window, top, left)) if arm == "context" else score
    u_t = stratified_uniform(y.shape[0], 1, generator, y.device).reshape(-1)
    nats = dsm_loss(model, y, "likelihood", importance=True, generator=generator, u=u_t)
    return nats.mean() / (y[0].numel() * math.log(2.0))


def train(out: Path, arm: str, model_name: str = "photo", data: str = "../shared/data/natural", tile: int = 32,
          margin: int = 16, steps: int = 600, batch: int = 32, lr: float = 5e-5, encoder_lr: float = 2e-3,
          warmup: int = 100,
          ema: float = 0.999, min_scale: float = 0.25, p_known: float = 0.85, seed: int = 0,
          minutes: float | None = None, log_every: int = 25, save_every: int = 50, snapshot_every: int = 500,
          images=None) -> dict:
    """Train one arm to `steps` (resuming out/ARM.pt where it exists, a copy ARM-STEP.pt every
    `snapshot_every` steps: arms that stopped at different steps are compared at the same one);
    returns the last log record."""
    import copy

    import torch

    from trainer.data import CropSampler, hold_out, load_images

    out.mkdir(parents=True, exist_ok=True)
    score, dequant = _models(model_name, arm, margin)
    dequant.requires_grad_(False).eval()
    ema_model = copy.deepcopy(score).requires_grad_(False)
    groups = [dict(params=list(score.net.parameters()), lr=lr, base=lr)]
    if arm == "context":  # the fresh encoder at its own (higher) lr
        groups.append(dict(params=list(score.encoder.parameters()) + list(score.gate.parameters()), lr=encoder_lr,
                           base=encoder_lr))
    opt = torch.optim.Adam(groups)
    state_path, log_path = out / f"{arm}.pt", out / f"{arm}.jsonl"
    step, elapsed = 0, 0.0
    if state_path.exists():
        st = torch.load(state_path, weights_only=True)
        score.load_state_dict(st["model"])
        ema_model.load_state_dict(st["ema"])
        opt.load_state_dict(st["opt"])
        step, elapsed = int(st["step"]), float(st["elapsed"])
    if images is None:
        _, images = hold_out(load_images(data), 13)  # natural/'s first 13 (BSD68) held out, as the photo runs
    sampler = CropSampler(images, tile + margin, flip=True, min_scale=min_scale, seed=seed + step)
    rng = np.random.default_rng([seed, step, 1])
    rec: dict = {}

    def save(path=state_path):
        torch.save(dict(model=score.state_dict(), ema=ema_model.state_dict(), opt=opt.state_dict(), step=step,
                        elapsed=elapsed, arm=arm, model_name=model_name, margin=margin, tile=tile), path)

    t0, start_elapsed, losses = time.monotonic(), elapsed, []
    while step < steps:
        if minutes is not None and (time.monotonic() - t0) / 60 >= minutes:
            break
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)  # the same draws for both arms
        window, top, left = _windows(sampler, batch, margin, p_known, rng)
        for g in opt.param_groups:
            g["lr"] = g["base"] * min(1.0, (step + 1) / max(1, warmup))
        loss = objective(score, arm, window, top, left, dequant, margin, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(score.parameters(), 1.0)
        opt.step()
        step += 1
        d = min(ema, (1 + step) / (10 + step))
        with torch.no_grad():
            for pe, p in zip(ema_model.parameters(), score.parameters()):
                pe.lerp_(p, 1 - d)
        losses.append(loss.item())
        elapsed = start_elapsed + time.monotonic() - t0
        if step % log_every == 0 or step == steps:
            rec = dict(step=step, loss_bpd=float(np.mean(losses)), elapsed_s=round(elapsed, 1), arm=arm)
            with open(log_path, "a") as f:
                f.write(json.dumps(rec) + "\n")
            losses = []
        if step % save_every == 0 or step == steps:
            save()
        if snapshot_every and step % snapshot_every == 0:
            save(out / f"{arm}-{step}.pt")
    save()
    return rec


def region_windows(image: np.ndarray, tile: int, margin: int, region: int) -> np.ndarray:
    """uint8 [K, C, T + m, T + m]: the windows of the centre region's tiles in raster order (the region
    shrunk so that every window lies in the image)."""
    h, w = image.shape[:2]
    r = min(region, (h - margin) // tile * tile, (w - margin) // tile * tile)
    top, left = max(margin, (h - r) // 2), max(margin, (w - r) // 2)
    out = [image[y - margin:y + tile, x - margin:x + tile]
           for y in range(top, top + r, tile) for x in range(left, left + r, tile)]
    return np.ascontiguousarray(np.stack(out).transpose(0, 3, 1, 2))


def load_arm(out: Path, arm: str, model_name: str, margin: int, step: int | None = None):
    """(EMA score model, dequantizer, step) of an arm: its last state, or its snapshot at `step`."""
    import torch

    score, dequant = _models(model_name, arm, margin)
    if arm != "start":
        st = torch.load(out / (f"{arm}.pt" if step is None else f"{arm}-{step}.pt"), weights_only=True)
        score.load_state_dict(st["ema"])
    return score.eval(), dequant.eval(), (0 if arm == "start" else int(st["step"]))


def bound_tiles(score, arm: str, dequant, windows, margin: int, n_t: int, seed: int):
    """Per-tile bound (bits/dim) of the windows' tiles, the draws fixed by `seed` (the window arm's
    context draws by their own generator: the tiles' draws are every arm's)."""
    import torch

    from scoreflow_codec import likelihood
    from scoreflow_codec.models.context import WindowContext

    w = torch.from_numpy(windows)
    tiles = w[:, :, margin:, margin:].contiguous()
    ones = torch.ones(len(w), dtype=torch.bool)
    with torch.no_grad():
        if arm == "context":
            model = score.bind(score.context(w, ones, ones))
        elif arm == "window":
            model = WindowContext(score, dequant, w, margin, likelihood.seeded(seed + 1_000_003))
        else:
            model = score
        return likelihood.bound_bpd(model, tiles, dequant, n_t=n_t, generator=likelihood.seeded(seed)).double().numpy()


def paired(a: np.ndarray, b: np.ndarray) -> dict:
    d = np.asarray(b) - np.asarray(a)
    return dict(mean=float(d.mean()), se=float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else float("nan"),
                lower=int((d < 0).sum()), n=len(d))


def evaluate(out: Path, files: list[str], arms=EVAL_ARMS, model_name: str = "photo", tile: int = 32,
             margin: int = 16, region: int = 128, n_t: int = 32, seed: int = 0, step: int | None = None) -> dict:
    from trainer.data import codec_pixels

    sources = {a: "start" if a == "window" else a for a in arms}  # "window" runs the start model
    models = {src: load_arm(out, src, model_name, margin, step) for src in set(sources.values())}
    loaded = {a: models[sources[a]] for a in arms}
    rows = []
    for i, f in enumerate(files):
        win = region_windows(codec_pixels(Path(f)), tile, margin, region)
        row = dict(image=Path(f).name, tiles=len(win))
        for a, (score, dq, _) in loaded.items():
            row[a] = float(bound_tiles(score, a, dq, win, margin, n_t, seed + i).mean())
        rows.append(row)
    res = dict(model=model_name, tile=tile, margin=margin, region=region, n_t=n_t, seed=seed,
               steps={a: s for a, (_, _, s) in loaded.items()}, rows=rows,
               mean={a: float(np.mean([r[a] for r in rows])) for a in arms})
    if "tile" in arms and "context" in arms:
        res["context_minus_tile"] = paired([r["tile"] for r in rows], [r["context"] for r in rows])
    if "start" in arms:
        res["vs_start"] = {a: paired([r["start"] for r in rows], [r[a] for r in rows]) for a in arms if a != "start"}
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("train", "eval"):
        p = sub.add_parser(name)
        p.add_argument("--out", type=Path, required=True, help="the experiment's folder (ARM.pt, ARM.jsonl)")
        p.add_argument("--model", default="photo", help="the tile model both arms start from")
        p.add_argument("--tile", type=int, default=32)
        p.add_argument("--margin", type=int, default=16)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--threads", type=int, default=1)
    t = sub.choices["train"]
    t.add_argument("--arm", choices=ARMS, required=True)
    t.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "natural"))
    t.add_argument("--steps", type=int, default=600)
    t.add_argument("--batch", type=int, default=32)
    t.add_argument("--lr", type=float, default=5e-5, help="the U-Net's (both arms)")
    t.add_argument("--encoder-lr", type=float, default=2e-3, help="the context encoder's (and its gate's)")
    t.add_argument("--minutes", type=float, default=None, help="stop (resumably) after this long")
    e = sub.choices["eval"]
    e.add_argument("images", nargs="+")
    e.add_argument("--region", type=int, default=128, help="the centre region of each image, in px")
    e.add_argument("--n-t", type=int, default=32)
    e.add_argument("--json", type=Path, default=None)
    e.add_argument("--step", type=int, default=None, help="the arms' snapshots at this step (ARM-STEP.pt)")
    e.add_argument("--arms", default=",".join(EVAL_ARMS), help="which of them, comma-separated (start and window "
                   "need no training)")
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    if a.cmd == "train":
        if not Path(a.data).exists():
            print(f"context_gain: training data {a.data} not found (../shared/data/natural beside the repo)",
                  file=sys.stderr)
            return 2
        rec = train(a.out, a.arm, a.model, a.data, a.tile, a.margin, a.steps, a.batch, a.lr, a.encoder_lr,
                    seed=a.seed, minutes=a.minutes)
        print(json.dumps(rec))
        return 0
    arms = tuple(x for x in a.arms.split(",") if x)
    bad = [x for x in arms if x not in EVAL_ARMS]
    if bad or not arms:
        print(f"context_gain: --arms takes {', '.join(EVAL_ARMS)}, not {a.arms!r}", file=sys.stderr)
        return 2
    names = [f"{arm}.pt" if a.step is None else f"{arm}-{a.step}.pt" for arm in ARMS if arm in arms]
    missing = [n for n in names if not (a.out / n).exists()]
    if missing:
        print(f"context_gain: {a.out} lacks {', '.join(missing)}: train those arms first (or leave them out of "
              f"--arms)", file=sys.stderr)
        return 2
    res = evaluate(a.out, a.images, arms, model_name=a.model, tile=a.tile, margin=a.margin, region=a.region,
                   n_t=a.n_t, seed=a.seed, step=a.step)
    text = json.dumps(res, indent=1)
    if a.json:
        a.json.write_text(text + "\n")
    m = res["mean"]
    print(f"{len(res['rows'])} images, {res['rows'][0]['tiles']} tiles of {a.tile}px each: "
          + ", ".join(f"{k} {v:.4f}" for k, v in m.items()))
    pairs = ([("context - tile", res["context_minus_tile"])] if "context_minus_tile" in res else []) + \
        [(f"{k} - start", v) for k, v in res.get("vs_start", {}).items()]
    for name, d in pairs:
        print(f"{name}: {d['mean']:+.4f} +- {d['se']:.4f} bits/dim (lower on {d['lower']} of {d['n']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
