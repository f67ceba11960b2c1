"""Every call the benchmark makes into scoreflow-codec, in one place.

Uses exactly ``zoo.load_model``, ``api.compress_images``, ``api.decompress_arrays`` and
``api.evaluate_images``. If the library API is missing this fails with ``ScoreflowError``
("scoreflow_codec.api not available ..."); it never reports an estimate as a size.
"""
from __future__ import annotations

import hashlib
import importlib
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np


class ScoreflowError(Exception):
    """The scoreflow side can't run (API missing, model not loadable); one line for the user."""


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


def load_model(name_or_path: str | None, device: str, sizes: list[tuple[int, int]] | None = None):
    """A zoo name or a file; "auto" (or nothing): the model `sfcodec compress` picks for images of
    these (width, height) sizes, else the shipped default."""
    _, zoo = _import_api()
    if (not name_or_path or name_or_path == "auto") and sizes:
        from scoreflow_codec.errors import ModelError
        try:
            name_or_path = zoo.auto_model_name(sizes)
        except ModelError as e:
            raise ScoreflowError(str(e)) from None
    if not name_or_path or name_or_path == "auto":
        name_or_path = zoo.default_model()
        if name_or_path is None:
            raise ScoreflowError("no model ships with this installation: pass --model PATH")
    from scoreflow_codec.errors import ModelError
    try:
        return zoo.load_model(name_or_path, device=device)
    except ModelError as e:
        raise ScoreflowError(f"model {name_or_path!r}: {e}") from None


def model_info(model, name_or_path: str) -> dict:
    sha = getattr(model, "sha256", None)
    if sha is None and Path(name_or_path).is_file():
        sha = hashlib.sha256(Path(name_or_path).read_bytes()).hexdigest()
    return {"name_or_path": name_or_path, "name": getattr(model, "name", None), "sha256": sha,
            "config": getattr(model, "config", None)}


def run(images: list[np.ndarray], names: list[str], model, mode: str, device: str,
        settings: dict[str, Any] | None = None,
        progress: Callable[[int], None] | None = None, eval_options: dict | None = None,
        stream: bool = True) -> dict:
    """Bound / NLL / actual single-file / actual stream numbers for ``images``.

    Returns {"per_image": [row per image], "stream": {...} or None when ``stream`` is False}.
    Every file is decoded and compared to its input; a failure is recorded in the row, never
    hidden.
    """
    api, _ = _import_api()
    settings = settings or {}
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


def _code(images, api, model, mode, device, settings) -> dict:
    """Compress ``images`` as one stream, decompress, compare; sizes and seconds."""
    dims = sum(img.size for img in images)
    try:
        t0 = time.perf_counter()
        data = api.compress_images(images, model, mode=mode, device=device, **settings)
        t1 = time.perf_counter()
        out = api.decompress_arrays(data, model=model, device=device)
        t2 = time.perf_counter()
    except Exception as e:  # noqa: BLE001 - recorded per image; the benchmark goes on
        return {"nbytes": None, "bpd": None, "encode_s": None, "decode_s": None,
                "lossless": False, "error": f"{type(e).__name__}: {e}"}
    lossless = len(out) == len(images) and all(map(_same, out, images))
    return {"nbytes": len(data), "bpd": 8 * len(data) / dims, "encode_s": t1 - t0,
            "decode_s": t2 - t1, "lossless": lossless,
            "error": None if lossless else "decoded images differ from the inputs"}


def _same(decoded, original: np.ndarray) -> bool:
    a = np.asarray(decoded)
    a = a[..., None] if a.ndim == 2 else a  # a gray image may come back as [H, W]
    return a.shape == original.shape and np.array_equal(a, original)
