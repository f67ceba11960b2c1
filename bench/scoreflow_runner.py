"""Every call the benchmark makes into scoreflow-codec, in one place.

Uses exactly ``zoo.load_model``, ``api.compress_arrays``, ``api.decompress_arrays``,
``api.evaluate_images``, ``api.coding_settings`` and ``models.device_problem``. Files are made with
the seed-codec fallback "both": the smaller of the model's stream and the seed codec alone, as
`sfcodec compress` writes them, except that the model's stream is always coded (``--setting
fallback=off``: the model's stream only); every row gives the model's stream (model_bpd), the seed
codec alone (seed_bpd) and which the file is. If the library API is missing this fails with
``ScoreflowError`` ("scoreflow_codec.api not available ..."); it never reports an estimate as a size.
"""
from __future__ import annotations

import hashlib
import importlib
import math
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np


class ScoreflowError(Exception):
    """The scoreflow side can't run (API missing, model not loadable); one line for the user."""


class ModelLoadError(ScoreflowError):
    """The model asked for cannot be found or loaded (or not on the device asked for): the user's
    input, as a data set's absence is (bench/run.py exits 2 for both, as the other bench scripts do
    for a bad --model)."""


def _import_api():
    try:
        api = importlib.import_module("scoreflow_codec.api")
        zoo = importlib.import_module("scoreflow_codec.zoo")
    except ModuleNotFoundError as e:
        if e.name in ("scoreflow_codec.api", "scoreflow_codec.zoo", "scoreflow_codec"):
            raise ScoreflowError(f"scoreflow_codec.api not available ({e}); "
                                 "run with --codecs classical") from None
        raise ScoreflowError(f"scoreflow_codec.api could not be imported: {e}") from None
    except ImportError as e:
        raise ScoreflowError(f"scoreflow_codec.api could not be imported: {e}") from None
    return api, zoo


def check_available() -> None:
    _import_api()


def coding_steps(mode: str, model, settings: dict) -> int:
    """The steps a stream of this mode codes with: the model's own default unless settings give them."""
    api, _ = _import_api()
    return api.coding_settings(mode, model, settings)["steps"]


def resolve_model(name_or_path: str | None, sizes: list[tuple[int, int]] | None = None) -> str:
    """A zoo name or a file, as given; "auto" (or nothing): the model `sfcodec compress` picks for
    images of these (width, height) sizes, else the shipped default."""
    _, zoo = _import_api()
    from scoreflow_codec.errors import ModelError
    if (not name_or_path or name_or_path == "auto") and sizes:
        try:
            return zoo.auto_model_name(sizes)
        except ModelError as e:
            raise ModelLoadError(str(e)) from None
    if not name_or_path or name_or_path == "auto":
        name_or_path = zoo.default_model()
        if name_or_path is None:
            raise ModelLoadError("no model ships with this installation: pass --model PATH")
    return name_or_path


def load_model(name_or_path: str | None, device: str, sizes: list[tuple[int, int]] | None = None):
    """The model `resolve_model` names, loaded on device (ModelLoadError where this machine's torch
    cannot run there: before 0.9.39 an internal error from deep in torch)."""
    _, zoo = _import_api()
    from scoreflow_codec.models import device_problem
    problem = device_problem(device)
    if problem:
        raise ModelLoadError(f"--device {device}: {problem}")
    name_or_path = resolve_model(name_or_path, sizes)
    from scoreflow_codec.errors import ModelError
    try:
        return zoo.load_model(name_or_path, device=device)
    except ModelError as e:
        raise ModelLoadError(f"model {name_or_path!r}: {e}") from None


def model_info(model, name_or_path: str) -> dict:
    sha = getattr(model, "sha256", None)
    if sha is None and Path(name_or_path).is_file():
        sha = hashlib.sha256(Path(name_or_path).read_bytes()).hexdigest()
    return {"name_or_path": name_or_path, "name": getattr(model, "name", None), "sha256": sha,
            "config": getattr(model, "config", None)}


def run(images: list[np.ndarray], names: list[str], model, mode: str, device: str,
        settings: dict[str, Any] | None = None,
        progress: Callable[[int], None] | None = None, eval_options: dict | None = None,
        stream: bool = True, jobs: int = 1, model_ref: str | None = None, threads: int | None = None) -> dict:
    """Bound / NLL / actual single-file / actual stream numbers for ``images``.

    Returns {"per_image": [row per image], "stream": {...} or None when ``stream`` is False}.
    Every file is decoded and compared to its input; a failure is recorded in the row, never
    hidden. jobs > 1: the per-image rows come from that many worker processes, each loading
    ``model_ref`` (a zoo name or a file) with ``threads`` torch threads (default 1); the whole-set
    stream is coded here afterwards. The files are the same bytes as with jobs=1 (coding is
    deterministic); the bound and NLL draw their time samples per chunk of images, so they differ
    within their noise.
    """
    api, _ = _import_api()
    settings = settings or {}
    if jobs > 1 and len(images) > 1:
        rows = _run_parallel(images, names, model_ref, mode, device, settings, progress,
                             eval_options, jobs, threads)
        return {"per_image": rows,
                "stream": _code(images, api, model, mode, device, settings) if stream else None}
    evals = api.evaluate_images(images, model, device=device, bound=True, **{"ode": True, **(eval_options or {})})
    if len(evals) != len(images):
        raise ScoreflowError(f"evaluate_images returned {len(evals)} rows for {len(images)} images")

    rows = []
    for img, name, ev in zip(images, names, evals):
        row = {"image": name, "bound_bpd": ev.get("bound_bpd"),
               "bound_bpd_nocorr": ev.get("bound_bpd_nocorr"), "ode_nll_bpd": ev.get("ode_nll_bpd")}
        row.update(_code([img], api, model, mode, device, settings))
        rows.append(row)
        if progress:
            progress(1)
    return {"per_image": rows,
            "stream": _code(images, api, model, mode, device, settings) if stream else None}


_WORKER: dict = {}


def _worker_init(model_ref: str, device: str, threads: int | None) -> None:
    import torch

    torch.set_num_threads(threads or 1)
    _WORKER["model"] = load_model(model_ref, device)


def _worker_rows(images, names, mode, device, settings, eval_options) -> list[dict]:
    return run(images, names, _WORKER["model"], mode, device, settings, eval_options=eval_options,
               stream=False)["per_image"]


def _run_parallel(images, names, model_ref, mode, device, settings, progress, eval_options,
                  jobs: int, threads: int | None) -> list[dict]:
    """The per-image rows in ``jobs`` spawned processes, chunk by chunk, in the images' order."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    if model_ref is None:
        raise ScoreflowError("parallel jobs need the model's name or file")
    k = max(1, math.ceil(len(images) / (4 * jobs)))  # a few chunks per worker keep them all busy
    chunks = [slice(i, i + k) for i in range(0, len(images), k)]
    rows: list[dict] = []
    from concurrent.futures.process import BrokenProcessPool

    try:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_worker_init, initargs=(model_ref, device, threads)) as pool:
            futures = [pool.submit(_worker_rows, images[c], names[c], mode, device, settings, eval_options)
                       for c in chunks]
            for c, f in zip(chunks, futures):
                rows += f.result()
                if progress:
                    progress(len(images[c]))
    except BrokenProcessPool as e:
        raise ScoreflowError(f"a benchmark worker process died ({e}); run with --jobs 1 to see why") from None
    return rows


def _code(images, api, model, mode, device, settings) -> dict:
    """Compress ``images`` as one stream, decompress, compare; sizes and seconds."""
    dims = sum(img.size for img in images)
    try:
        t0 = time.perf_counter()
        data, rep = api.compress_arrays(images, model, mode=mode, device=device, **{"fallback": "both", **settings})
        t1 = time.perf_counter()
        out = api.decompress_arrays(data, model=model, device=device)
        t2 = time.perf_counter()
    except Exception as e:  # noqa: BLE001 - recorded per image; the benchmark goes on
        return {"nbytes": None, "bpd": None, "model_bpd": None, "seed_bpd": None, "coded_by": None,
                "encode_s": None, "decode_s": None, "lossless": False, "error": f"{type(e).__name__}: {e}"}
    lossless = len(out) == len(images) and all(map(_same, out, images))
    return {"nbytes": len(data), "bpd": 8 * len(data) / dims,
            "model_bpd": None if rep.model_bytes is None else 8 * rep.model_bytes / dims,
            "seed_bpd": None if rep.seed_bytes is None else 8 * rep.seed_bytes / dims,
            "coded_by": rep.coded_by, "encode_s": t1 - t0,
            "decode_s": t2 - t1, "lossless": lossless, **_stream_shape(rep),
            "error": None if lossless else "decoded images differ from the inputs"}


def _stream_shape(rep) -> dict:
    """How the model's stream was made: its seed tiles of all tiles and the sizes of its bits-back
    batches (what its times depend on: only the batches' tiles run the model)."""
    st = rep.stream
    return {"seed_tiles": [st.n_seed, st.n_tiles], "batch_sizes": [int(e - s) for s, e in st.batches]}


def _same(decoded, original: np.ndarray) -> bool:
    a = np.asarray(decoded)
    a = a[..., None] if a.ndim == 2 else a  # a gray image may come back as [H, W]
    return a.shape == original.shape and np.array_equal(a, original)
