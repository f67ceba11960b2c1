"""The training curve of a run as a PNG (for model cards)."""
from __future__ import annotations

import io
import json
from pathlib import Path

from scoreflow_codec.fileio import atomic_write


def read_metrics(run: str | Path) -> list[dict]:
    """The run's records; where a resumed run logged a step again, its later record wins."""
    path = Path(run) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{run}: not a run directory (no metrics.jsonl)")
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    out: list[dict] = []
    for r in recs:  # a resume restarts from the checkpoint's step: drop what came after it
        while out and out[-1]["step"] > r["step"]:
            out.pop()
        out.append(r)
    return out


def plot_curve(runs: list[str | Path], out: str | Path, title: str = "") -> None:
    """Training loss proxy and held-out / train bound (bits/dim) against steps, one or more runs
    (a run continued from another, e.g. the dequantizer stage, is drawn after it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    offset = 0
    for i, run in enumerate(runs):
        recs = read_metrics(run)
        tr = [(r["step"] + offset, r["loss_bpd_proxy"]) for r in recs if "loss_bpd_proxy" in r]
        ev = [(r["step"] + offset, r["eval_bound_bpd"], r["train_bound_bpd"]) for r in recs if "eval_bound_bpd" in r]
        name = Path(run).name
        if tr:
            ax.plot(*zip(*tr), lw=0.8, alpha=0.6, label=f"{name}: training loss (bound proxy)")
        if ev:
            s, e, t = zip(*ev)
            ax.plot(s, e, "o-", ms=3, label=f"{name}: held-out bound")
            ax.plot(s, t, "s--", ms=3, label=f"{name}: train bound")
        offset = max([offset] + [r["step"] + offset for r in recs])
    ax.set_xlabel("step")
    ax.set_ylabel("bits/dim")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    lo = min([l.get_ydata().min() for l in ax.lines] + [10])
    hi = max([l.get_ydata().max() for l in ax.lines] + [lo])
    ax.set_ylim(max(0, lo - 0.2), min(lo + 3, hi + 0.2))  # a from-scratch run's early steps cut off
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, dpi=120, format="png")
    plt.close(fig)
    atomic_write(out, png.getvalue())  # the name as given (savefig adds ".png" to a name without a suffix)
