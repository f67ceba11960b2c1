"""Shipped models by name: `zoo/index.json` maps names to packaged model files with their sha256.

index.json = {"models": {name: {"file", "sha256", "description", "image_size", "tile"?, "chain_steps"?}},
"default": name | null, "retired"?: {name: {"sha256", "file", "description", "release", "commit"}}};
"file" is NAME.safetensors, or NAME.safetensors.xz (xz-compressed; "sha256" is of the file it holds)
for the models kept so that old files decode;
"tile" (optional; default: the model file's own "codec" default, else 32) is the tile size the codec
uses with that model unless told otherwise; "chain_steps" (optional; default: the file's, else
ChainSettings' 128) the chain mode's steps with it unless told otherwise
(a file's header records the steps it was coded with, so changing them never changes an old file).
A model given by path takes these defaults too where its bytes are a shipped model's (same sha256):
the defaults follow the model, not the way it was named.

"retired" lists the kept models the package no longer carries (`python -m trainer retire`: every
tracked byte travels with a GPU training chunk, whose carry is capped): "release" is the last release
that shipped the model and "commit" the commit of this project's history that has its file, so that a
file made with it gets one error saying how to decode it (that release, or --model with the file
taken from that commit), never "unknown model".
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ModelError
# modelfile (torch, the networks) is imported where a model is loaded: looking a name or sha up in
# the index (sfcodec info, models) needs neither

if TYPE_CHECKING:
    from .modelfile import LoadedModel

ZOO_DIR = Path(__file__).resolve().parent / "zoo"
SMALL_MODEL, PHOTO_MODEL = "cifar10", "photo"  # the names `--model auto` takes (auto_model_name)


def read_index(zoo_dir: Path | None = None) -> dict:
    """The index of `zoo_dir` (default: the package's zoo), {"models": {}, "default": None} where
    there is none. Raises ModelError where it is unreadable."""
    path = (zoo_dir or ZOO_DIR) / "index.json"
    try:
        index = json.loads(path.read_text())
    except FileNotFoundError:
        return {"models": {}, "default": None}
    except (OSError, json.JSONDecodeError) as e:
        raise ModelError(f"model zoo index {path} is unreadable ({e})") from None
    index.setdefault("models", {})
    index.setdefault("default", None)
    return index


def list_models() -> list[dict]:
    """[{name, file, sha256, description, image_size, default}] in index order."""
    index = read_index()
    return [{"name": n, **e, "default": n == index["default"]} for n, e in index["models"].items()]


def default_model() -> str | None:
    return read_index()["default"]


def load_model(name_or_path: str | os.PathLike | None = None, device: str = "cpu") -> LoadedModel:
    """An existing path -> that file; a name in the index -> the packaged file, sha256 checked;
    None -> the index's default. Anything else raises ModelError listing the shipped names."""
    import hashlib

    from .modelfile import load_model_bytes, load_model_file, read_model_bytes

    index = read_index()
    if name_or_path is None:
        name_or_path = index["default"]
        if name_or_path is None:
            raise ModelError("no model given and no default model ships with this installation; pass a model file")
    if Path(name_or_path).is_file():
        loaded = load_model_file(name_or_path, device)
        shipped = shipped_name(loaded.sha256)  # the same bytes as a shipped model: its defaults too
        if shipped is not None:
            _entry_defaults(loaded, index["models"][shipped])
        return loaded
    name = str(name_or_path)
    if name not in index["models"] and Path(name).is_dir():
        if (Path(name) / "checkpoint" / "state.json").is_file():
            raise ModelError(f"{name}: a training run, not a model file: export its model first "
                             f"(python -m trainer export {name} -o model.safetensors)")
        raise ModelError(f"{name}: a folder, not a model file")
    if name not in index["models"] and name in index.get("retired", {}):
        raise ModelError(f"model {name!r} no longer ships with the package: {retired_advice(name, index['retired'][name])}")
    if name not in index["models"]:
        names = ", ".join(index["models"]) or "none"
        raise ModelError(f"unknown model {name!r}: not a file, and not a shipped model (shipped: {names})")
    entry = index["models"][name]
    path = ZOO_DIR / entry["file"]
    if not path.is_file():
        raise ModelError(f"shipped model {name!r} is missing its file {path}")
    data = read_model_bytes(path)  # NAME.safetensors, or NAME.safetensors.xz for a kept model
    sha = hashlib.sha256(data).hexdigest()
    if sha != entry["sha256"]:
        raise ModelError(f"shipped model {name!r} is corrupt: sha256 {sha[:12]}... differs from the index")
    loaded = load_model_bytes(data, path, device)
    loaded.name = name
    _entry_defaults(loaded, entry)
    return loaded


def _entry_defaults(loaded: LoadedModel, entry: dict) -> None:
    """The coding defaults an index entry gives its model: tile size and chain steps."""
    loaded.tile = int(entry.get("tile", loaded.tile))
    if entry.get("chain_steps") is not None:
        loaded.chain_steps = int(entry["chain_steps"])


def auto_model_name(sizes: list[tuple[int, int]]) -> str:
    """`--model auto`: images up to 64x64 take the CIFAR-10 model, larger ones the photo model
    (when one ships; else the default)."""
    index = read_index()
    names = index["models"]
    small = all(w <= 64 and h <= 64 for w, h in sizes) if sizes else True
    for cand in ([SMALL_MODEL] if small else [PHOTO_MODEL, SMALL_MODEL]):
        if cand in names:
            return cand
    if index["default"]:
        return index["default"]
    raise ModelError("no model ships with this installation; pass --model PATH to an exported model")


def shipped_name(sha256: str | None) -> str | None:
    """The zoo name of the shipped model with this sha256, or None. Names move (a newer model takes
    `photo`), the sha256 in a file's header does not."""
    for name, entry in read_index()["models"].items():
        if entry.get("sha256") == sha256:
            return name
    return None


def retired_models() -> dict:
    """{name: entry} of the models the package shipped once and no longer carries (`trainer retire`)."""
    return read_index().get("retired", {})


def retired_name(sha256: str | None) -> str | None:
    """The name of the retired model with this sha256 (one the package shipped once), or None."""
    for name, entry in retired_models().items():
        if entry.get("sha256") == sha256:
            return name
    return None


def retired_advice(name: str, entry: dict) -> str:
    """How to decode a file made with the retired model `name`: its last release, or its file from
    the commit that has it, given with --model."""
    path = entry.get("path") or f"scoreflow_codec/zoo/{entry['file']}"
    return (f"it was retired after release {entry['release']}; decode with scoreflow-codec {entry['release']}, or take "
            f"its file from that release's commit (git show {entry['commit']}:{path} > {entry['file']}) and pass "
            f"--model {entry['file']}")


def model_for_header(header: dict, device: str = "cpu") -> LoadedModel:
    """The shipped model a .sfc file was made with, found by the sha256 in its header."""
    want = header.get("model", {})
    name = shipped_name(want.get("sha256"))
    if name is not None:
        return load_model(name, device)
    gone = retired_name(want.get("sha256"))
    if gone is not None:
        raise ModelError(f"the file was made with model {want.get('name', '?')} (sha256 {str(want.get('sha256'))[:12]}..., "
                         f"zoo name {gone}), which this installation no longer ships: "
                         f"{retired_advice(gone, retired_models()[gone])}")
    raise ModelError(f"the file was made with model {want.get('name', '?')} (sha256 {str(want.get('sha256'))[:12]}...), "
                     "which does not ship with this installation; pass --model PATH to that model file")
