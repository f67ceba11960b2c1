"""Summaries, the Markdown tables, results.json / results.csv, plots and machine info."""
from __future__ import annotations

import csv
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

# DESIGN.md section 4 and section 1: numbers from the literature, NOT measured by this harness.
PUBLISHED_CIFAR10_TEST_BPD = {
    "note": "published in the literature (DESIGN.md sections 1 and 4), not measured here; "
            "on the full 10,000-image CIFAR-10 test set",
    "values": {
        "PNG": 5.87, "JPEG 2000": 5.20, "FLIF": 4.37, "Bit-Swap": 3.82, "HiLLoC": 3.56,
        "IDF": 3.34, "IDF++": 3.26, "iVPF": 3.20, "LBB": 3.12, "iFlow": 3.12,
        "VDM (actual)": 2.72,
        "ScoreFlow NLL (ODE, variational dequant, deep VP)": 2.83, "ScoreFlow bound": 2.90,
    },
}

CSV_FIELDS = ["set", "image", "height", "width", "channels", "codec", "settings",
              "coded_channels", "nbytes", "bpd", "encode_s", "decode_s", "lossless", "error",
              "bound_bpd", "bound_bpd_nocorr", "ode_nll_bpd", "model_bpd", "seed_bpd", "coded_by"]
# model_bpd: the file the model's stream makes; seed_bpd: the seed codec alone; the file (bpd) is
# the smaller of the two (coded_by "seed" or "model") unless the fallback was off
SCOREFLOW_EXTRA = ("bound_bpd", "bound_bpd_nocorr", "ode_nll_bpd", "model_bpd", "seed_bpd")


def _mean(values) -> float | None:
    v = [x for x in values if x is not None]
    return float(np.mean(v)) if v else None


def summarize(rows: list[dict]) -> list[dict]:
    """One summary per codec, in first-seen order, from the per-image rows."""
    by_codec: dict[str, list[dict]] = {}
    for r in rows:
        by_codec.setdefault(r["codec"], []).append(r)
    out = []
    for codec, rs in by_codec.items():
        ok = [r for r in rs if r["bpd"] is not None]
        bpd = np.array([r["bpd"] for r in ok])
        dims = sum(r["height"] * r["width"] * r["channels"] for r in ok)
        s = {
            "codec": codec, "settings": rs[0]["settings"], "n_images": len(rs),
            "n_failed": len(rs) - len(ok),
            "mean_bpd": float(bpd.mean()) if ok else None,
            "std_bpd": float(bpd.std(ddof=1)) if len(ok) > 1 else 0.0 if ok else None,
            "min_bpd": float(bpd.min()) if ok else None,
            "max_bpd": float(bpd.max()) if ok else None,
            # all bits over all dims: differs from mean_bpd when image sizes differ
            "pooled_bpd": 8 * sum(r["nbytes"] for r in ok) / dims if ok else None,
            "encode_ms": _mean(1000 * r["encode_s"] for r in ok if r["encode_s"] is not None),
            "decode_ms": _mean(1000 * r["decode_s"] for r in ok if r["decode_s"] is not None),
            "lossless": all(r["lossless"] for r in rs),
        }
        for k in SCOREFLOW_EXTRA:
            if k in rs[0]:
                s[k] = _mean(r[k] for r in rs)
        if "coded_by" in rs[0]:
            s["n_seed_coded"] = sum(r["coded_by"] == "seed" for r in rs)
        out.append(s)
    return out


def _f(x, fmt="{:.3f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def markdown(result: dict) -> str:
    lines = [f"### {result['set']['name']}: {result['set']['n_images']} images "
             f"({result['set']['source']})", "",
             "| codec | settings | mean bpd | std | min | max | encode ms/img | decode ms/img "
             "| lossless |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for s in result["summary"]:
        lossless = "yes" if s["lossless"] else f"NO ({s['n_failed']} failed)" if s["n_failed"] \
            else "NO"
        lines.append(f"| {s['codec']} | {s['settings']} | {_f(s['mean_bpd'])} | "
                     f"{_f(s['std_bpd'])} | {_f(s['min_bpd'])} | {_f(s['max_bpd'])} | "
                     f"{_f(s['encode_ms'], '{:.1f}')} | {_f(s['decode_ms'], '{:.1f}')} | "
                     f"{lossless} |")
    sf = result.get("scoreflow")
    if sf:
        s = next(x for x in result["summary"] if x["codec"] == "scoreflow")
        gap = None if s["mean_bpd"] is None or s["ode_nll_bpd"] is None \
            else s["mean_bpd"] - s["ode_nll_bpd"]
        st = sf["stream"] or {"bpd": None, "lossless": True}  # None: --no-stream
        lines += ["", "| scoreflow | bound bpd | bound bpd (no corr) | ODE NLL bpd "
                  "| actual single bpd | actual stream bpd | actual - NLL | model's stream bpd "
                  "| seed codec alone bpd | files by the seed codec | lossless |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
                  f"| {s['settings']} | {_f(s['bound_bpd'])} | {_f(s['bound_bpd_nocorr'])} | "
                  f"{_f(s['ode_nll_bpd'])} | {_f(s['mean_bpd'])} | {_f(st['bpd'])} | "
                  f"{_f(gap, '{:+.3f}')} | {_f(s.get('model_bpd'))} | {_f(s.get('seed_bpd'))} | "
                  f"{s.get('n_seed_coded', 'n/a')} of {s['n_images']} | "
                  f"{'yes' if s['lossless'] and st['lossless'] else 'NO'} |"]
    if result["skipped"]:
        lines += [""] + [f"skipped {k}: {v}" for k, v in result["skipped"].items()]
    if result["set"]["name"].startswith("cifar10"):
        pub = ", ".join(f"{k} {v:.2f}" for k, v in PUBLISHED_CIFAR10_TEST_BPD["values"].items())
        lines += ["", f"Published CIFAR-10 test bpd (literature, not measured here): {pub}"]
    return "\n".join(lines)


def write(result: dict, outdir: Path) -> list[Path]:
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "results.json").write_text(json.dumps(result, indent=1, default=_jsonable) + "\n")
    with open(outdir / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, CSV_FIELDS, restval="", extrasaction="ignore")
        w.writeheader()
        for r in result["per_image"]:
            w.writerow({"set": result["set"]["name"], **r})
    return [outdir / "results.json", outdir / "results.csv"] + plot(result, outdir)


def _jsonable(x):
    if isinstance(x, np.generic):
        return x.item()
    return str(x)


def plot(result: dict, outdir: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = [s for s in result["summary"] if s["mean_bpd"] is not None]
    name = result["set"]["name"]
    files = []

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar([s["codec"] for s in summary], [s["mean_bpd"] for s in summary],
           yerr=[s["std_bpd"] for s in summary], capsize=4, color="tab:blue")
    for s in summary:
        for key, style in (("ode_nll_bpd", "--"), ("bound_bpd", ":")):
            if s.get(key) is not None:
                ax.axhline(s[key], ls=style, color="tab:red", label=f"scoreflow {key} (model)")
    ax.set_ylabel("bits/dim (mean ± std over images)")
    ax.set_title(f"{name}: bits/dim per codec")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    files.append(_save(fig, outdir / "bpd_per_codec.png"))

    sf = [r for r in result["per_image"] if r["codec"] == "scoreflow"
          and r["bpd"] is not None and r.get("ode_nll_bpd") is not None]
    if sf:
        fig, ax = plt.subplots(figsize=(5, 5))
        x = [r["ode_nll_bpd"] for r in sf]
        y = [r["bpd"] for r in sf]
        ax.scatter(x, y, s=12)
        lo, hi = min(x + y), max(x + y)
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="y = x")
        ax.set_xlabel("ODE NLL bits/dim (model)")
        ax.set_ylabel("actual .sfc bits/dim (single file)")
        ax.set_title(f"{name}: actual vs NLL per image")
        ax.legend()
        files.append(_save(fig, outdir / "actual_vs_nll.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    for s in summary:
        if s["encode_ms"]:
            p = ax.scatter(s["encode_ms"], s["mean_bpd"], marker="o")
            ax.scatter(s["decode_ms"], s["mean_bpd"], marker="o", facecolors="none",
                       edgecolors=p.get_facecolor())
            ax.annotate(s["codec"], (s["encode_ms"], s["mean_bpd"]), fontsize=8,
                        xytext=(4, 4), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("ms per image (filled: encode, hollow: decode)")
    ax.set_ylabel("mean bits/dim")
    ax.set_title(f"{name}: time vs bits/dim")
    files.append(_save(fig, outdir / "time_vs_bpd.png"))
    return files


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return path


def model_options(ap, default: str = "photo") -> None:
    """The options of the scripts that time or evaluate one model: --model, --tile, --threads, --json."""
    ap.add_argument("--model", default=default, help=f"zoo name or model file (default: {default})")
    ap.add_argument("--tile", type=int, default=None, help="tile size (default: the model's)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None, help="write the results here")


def rgb_model_run(ap, argv, prog: str):
    """For the scripts that evaluate one model on RGB images: adds the `images` argument and
    model_options to ap, parses argv, sets torch to args.threads and loads the model and the images:
    (args, model, sources); None after one line on stderr where the model or an image does not load,
    or an image is not plain RGB (the caller exits 2)."""
    ap.add_argument("images", nargs="+", type=Path, help="RGB images (PNG etc.)")
    model_options(ap)
    args = ap.parse_args(argv)
    import torch

    from scoreflow_codec import images as imgs, zoo
    from scoreflow_codec.errors import SfcError

    torch.set_num_threads(args.threads)
    try:
        model = zoo.load_model(args.model)
        sources = [imgs.load_image(p) for p in args.images]
    except SfcError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return None
    for p, s in zip(args.images, sources):
        if s.color is None or s.color.shape[0] != 3 or s.extra is not None:
            print(f"{prog}: {p}: not a plain RGB image", file=sys.stderr)
            return None
    return args, model, sources


def machine_info() -> dict:
    info = {
        "cpu": _cpu_model(), "cores": os.cpu_count(), "os": platform.platform(),
        "python": sys.version.split()[0],
        "versions": {p: _version(p) for p in ("numpy", "pillow", "imagecodecs", "torch",
                                              "matplotlib")},
        "gpu": None, "git": _git(),
    }
    try:
        import torch
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def _git() -> dict:
    def run(*args):
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    try:
        return {"commit": run("rev-parse", "HEAD") or None, "dirty": bool(run("status",
                                                                               "--porcelain"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
