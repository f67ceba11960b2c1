"""Put an exported model into the package's zoo (`python -m trainer ship`).

A zoo name (`cifar10`) moves to each newer model; files name their model by sha256, so the model
that had the name stays in the zoo under another (`--keep-as cifar10-8`) and old files keep
decoding. Shipping therefore moves the old model's file (xz-compressed: `cifar10-8.safetensors.xz`,
the same model and sha256, about 15% smaller), card and curve to the kept name, writes its card a
new opening paragraph, adds its index entry under the kept name, and points the name at the new file
with its sha256. The index format is `scoreflow_codec.zoo`'s.

`retire` takes kept models out again where the package must shrink (every tracked byte travels
with a GPU training chunk, 64 MiB in all, the training images included): the index keeps a
"retired" entry per model naming the last release that shipped it and the commit with its file,
and files made with it get one error saying how to decode them; the other cards' mentions of its card
and curve say where they went.

Everything is checked before anything is written (the new file loads as a model and is not
already shipped, the kept name is free, the old files are there), and index.json is written last,
in one atomic replace: a refused ship changes nothing.
"""
from __future__ import annotations

import json
import lzma
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from scoreflow_codec.fileio import atomic_write
from scoreflow_codec.modelfile import load_model_bytes, read_model_bytes
from scoreflow_codec.zoo import PHOTO_MODEL, SMALL_MODEL, read_index

_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")


@dataclass
class Shipped:
    name: str
    sha256: str
    kept_as: str | None
    card_from_old: bool  # the new card is the old one's text: its numbers are the old model's


def _files(zoo_dir: Path, name: str, kept: bool = False) -> dict[str, Path]:
    """A zoo model's files; a kept model's weights are stored xz-compressed (about 15% smaller)."""
    return {"model": zoo_dir / f"{name}.safetensors{'.xz' if kept else ''}", "card": zoo_dir / f"{name}.md",
            "curve": zoo_dir / f"{name}_curve.png"}


def kept_card(text: str, name: str, keep_as: str, old_version: str, older: list[str]) -> str:
    """The old model's card under its kept name: a new title and opening paragraph (everything
    before the first table or section), its curve's new file name; the rest as it was."""
    lines = text.splitlines(keepends=True)
    body_from = next((i for i, ln in enumerate(lines) if i > 0 and ln.startswith(("|", "## "))), len(lines))
    rest = "".join(lines[body_from:]).replace(f"`{name}_curve.png`", f"`{keep_as}_curve.png`")
    names = ", ".join(f"`{o}` (`{o}.md`)" for o in older)
    older_s = f"The models it replaced keep decoding their files under the names {names}. " if older else ""
    para = (f"The `{name}` model of {old_version}, replaced by a newer `{name}` (its card: `{name}.md`); it stays "
            f"in the zoo under the name `{keep_as}` so that files made with it keep decoding (a file names its "
            f"model by sha256). In the text below, `{name}` means this model. {older_s}"
            f"Its training curve is `{keep_as}_curve.png`.")
    para = textwrap.fill(para, 100, break_on_hyphens=False, break_long_words=False)
    return f"# Model card: `{keep_as}`\n\n{para}\n\n{rest}"


def ship(new_file: Path, name: str, zoo_dir: Path, *, keep_as: str | None = None, description: str | None = None,
         old_description: str | None = None, old_version: str | None = None, card: Path | None = None,
         curve: Path | None = None, tile: int | None = None, chain_steps: int | None = None,
         make_default: bool = False) -> Shipped:
    """Ship `new_file` as `name` in `zoo_dir` (see the module's docstring). Raises ValueError or
    FileNotFoundError (nothing written) where the ship is refused, ModelError for a bad model file."""
    from scoreflow_codec import __version__

    new_file, zoo_dir = Path(new_file), Path(zoo_dir)
    for n in (name, keep_as):
        if n is not None and not _NAME.fullmatch(n):
            raise ValueError(f"bad model name {n!r} (lower-case letters, digits, '.', '_', '-')")
    if not new_file.is_file():
        raise FileNotFoundError(f"model file not found: {new_file}")
    new_bytes = read_model_bytes(new_file)  # the .safetensors, also where new_file is an .xz copy
    lm = load_model_bytes(new_bytes, new_file)  # raises ModelError for anything that is not a model
    sha = lm.sha256
    for extra in (card, curve):
        if extra is not None and not Path(extra).is_file():
            raise FileNotFoundError(f"file not found: {extra}")
    # read now: --curve may be the zoo's own curve, which is about to be renamed
    card_text = Path(card).read_bytes() if card is not None else None
    curve_png = Path(curve).read_bytes() if curve is not None else None
    index = read_index(zoo_dir)
    models: dict = index["models"]
    for n, e in models.items():
        if e.get("sha256") == sha:
            raise ValueError(f"{new_file} is already shipped as {n!r}")
    old = models.get(name)
    if old is not None and keep_as is None:
        raise ValueError(f"{name!r} ships already: give --keep-as NAME, the name its model keeps so that "
                         "files made with it still decode")
    if old is None and keep_as is not None:
        raise ValueError(f"--keep-as: {name!r} is not in the zoo, there is no model to keep")
    if not description:
        raise ValueError("give --description: the index's one line on the model (what it was trained on, how long)")
    src, dst = _files(zoo_dir, name), (_files(zoo_dir, keep_as, kept=True) if keep_as else {})
    if keep_as is not None:
        taken = keep_as in models or keep_as in index.get("retired", {})  # a retired name stays taken
        if taken or any(p.exists() for p in [*dst.values(), _files(zoo_dir, keep_as)["model"]]):
            raise ValueError(f"--keep-as {keep_as!r} is taken in {zoo_dir}")
        if old.get("file") != src["model"].name or not src["model"].is_file():
            raise FileNotFoundError(f"{name!r}'s file is not {src['model']}: rename it by hand")
        if not src["card"].is_file():
            raise FileNotFoundError(f"{name!r} has no card {src['card']}")
    zoo_dir.mkdir(parents=True, exist_ok=True)

    if keep_as is not None:
        old_version = old_version or __version__
        older = [n for n in models if re.fullmatch(re.escape(name) + r"-\d+", n)]
        atomic_write(dst["model"], lzma.compress(src["model"].read_bytes(), format=lzma.FORMAT_XZ, preset=9))
        if src["curve"].exists():
            src["curve"].rename(dst["curve"])
        # the name's card keeps the old text until --card replaces it
        atomic_write(dst["card"], kept_card(src["card"].read_text(), name, keep_as, old_version, older).encode())
    card_from_old = keep_as is not None and card is None
    if card_text is not None:
        atomic_write(src["card"], card_text)
    if curve_png is not None:
        atomic_write(src["curve"], curve_png)
    atomic_write(src["model"], new_bytes)

    own = lm.config.get("codec") or {}  # the defaults the file records (trainer export --tile/--chain-steps)
    entry = {"file": src["model"].name, "sha256": sha,
             "description": description,
             "image_size": int(old["image_size"]) if old else int(lm.config["unet"]["image_size"]),
             "tile": int(tile or own.get("tile") or (old or {}).get("tile") or lm.tile)}
    chain_steps = chain_steps or own.get("chain_steps") or (old or {}).get("chain_steps")
    if chain_steps:
        entry["chain_steps"] = int(chain_steps)
    out = {}
    for n, e in models.items():
        if n == name:
            out[name] = entry
            out[keep_as] = {**e, "file": dst["model"].name,
                            "description": old_description or (f"the {name} model of {old_version}, kept so that files "
                                                               f"made with it still decode; see {keep_as}.md")}
        else:
            out[n] = e
    if name not in out:
        out[name] = entry
    index["models"] = out
    if make_default or not index.get("default"):
        index["default"] = name
    atomic_write(zoo_dir / "index.json", (json.dumps(index, indent=2) + "\n").encode())
    return Shipped(name, sha, keep_as, card_from_old)


@dataclass
class Retired:
    names: list[str]
    release: str
    commit: str
    freed: int  # bytes of the files removed


def _git(cwd: Path, *args: str) -> str | None:
    """git's output in `cwd`, or None where git fails (not a checkout, no such object)."""
    import subprocess

    try:
        r = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, timeout=60)
    except OSError:
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def retire(names: list[str], zoo_dir: Path, *, commit: str = "HEAD", release: str | None = None) -> Retired:
    """Take kept models out of the zoo (`python -m trainer retire`): their files (weights, card, curve)
    are removed and their index entries move to "retired" with the last release that shipped them
    and the commit that has their file, which old files' errors then name (zoo.retired_advice).

    Refused (ValueError, nothing changed): the default model, a name `--model auto` takes, a name
    not in the zoo, and a model whose file is not in `commit` byte for byte (the error would send
    users to a file that is not there). The index is written first, then the files go: a crash
    between leaves files no entry names, never an entry without its file."""
    from scoreflow_codec import __version__

    zoo_dir = Path(zoo_dir).resolve()
    index = read_index(zoo_dir)
    models: dict = index["models"]
    if not names:
        raise ValueError("name the kept models to retire")
    for n in names:
        if n not in models:
            raise ValueError(f"{n!r} is not in the zoo ({zoo_dir})")
        if n == index.get("default") or n in (SMALL_MODEL, PHOTO_MODEL):
            raise ValueError(f"{n!r} is a name the codec picks by itself (the default, or --model auto's): "
                             "retire only kept models")
    full = _git(zoo_dir, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    if not full:
        raise ValueError(f"{zoo_dir} is not in a git checkout with commit {commit!r}: the retired models' "
                         "errors must name a commit that has their files")
    short = full[:12]
    entries = {}
    for n in names:
        f = zoo_dir / models[n]["file"]
        rel = _git(zoo_dir, "ls-files", "--full-name", "--error-unmatch", f.name)
        blob = _git(zoo_dir, "rev-parse", "--verify", "--quiet", f"{full}:{rel}") if rel else None
        if not f.is_file() or blob is None or _git(zoo_dir, "hash-object", f.name) != blob:
            raise ValueError(f"{n!r}: its file {f.name} is not in commit {short} as it is here: commit the zoo "
                             "first (the error that old files get sends users to that commit's file)")
        said = re.sub(r",? kept so that files made with it still decode(; see \S+\.md)?", "",
                      models[n].get("description", ""))
        entries[n] = {"sha256": models[n]["sha256"], "file": f.name, "path": rel, "description": said,
                      "release": release or __version__, "commit": short}
    index["models"] = {n: e for n, e in models.items() if n not in entries}
    index["retired"] = {**index.get("retired", {}), **entries}
    atomic_write(zoo_dir / "index.json", (json.dumps(index, indent=2) + "\n").encode())
    freed = 0
    for n, e in entries.items():
        for p in (zoo_dir / e["file"], zoo_dir / f"{n}.md", zoo_dir / f"{n}_curve.png"):
            if p.exists():
                freed += p.stat().st_size
                p.unlink()
    mark_retired_in_cards(zoo_dir, entries)
    return Retired(list(entries), release or __version__, short, freed)


CARD_WIDTH = 105  # the cards' prose lines (tables are one line a row, whatever their length)


def mark_retired_in_cards(zoo_dir: Path, entries: dict) -> None:
    """The other cards name the retired models' cards and curves (`cifar10-3.md`, `cifar10-3_curve.png`):
    each such name is followed by where it went, so that no card points at a file that is gone. A
    paragraph of prose that this leaves with a line over CARD_WIDTH is wrapped again."""
    for card in sorted(Path(zoo_dir).glob("*.md")):
        text = old = card.read_text()
        for n, e in entries.items():
            where = f"retired after {e['release']}, in commit {e['commit']}"
            for f in (f"{n}.md", f"{n}_curve.png"):
                text = re.sub(rf"`{re.escape(f)}`(?! \[retired)", f"`{f}` [{where}]", text)
        if text != old:
            old_paras = set(old.split("\n\n"))
            text = "\n\n".join(p if p in old_paras else rewrap_prose(p) for p in text.split("\n\n"))
            atomic_write(card, text.encode())


def rewrap_prose(para: str, width: int = CARD_WIDTH) -> str:
    """`para` (a block between blank lines) with each paragraph or list item ("- ", "* ") that has a
    line over `width` filled again to `width`, a list item's lines under its text; the rest as it
    was. Tables, headings, code and indented blocks are left alone."""
    body = para.rstrip("\n")
    tail = para[len(body):]  # the card's last newline stays
    lines = body.split("\n")
    if any(ln.startswith(("|", "#", "```", "    ", "\t", ">")) for ln in lines if ln.strip()):
        return para
    items: list[list[str]] = []
    for ln in lines:
        if not items or re.match(r"[-*] ", ln):
            items.append([ln])
        else:
            items[-1].append(ln)
    out = []
    for item in items:
        if all(len(ln) <= width for ln in item):
            out.extend(item)
            continue
        mark = item[0][:2] if re.match(r"[-*] ", item[0]) else ""
        words = " ".join(ln.strip() for ln in item)[len(mark):]
        out.append(textwrap.fill(words, width, initial_indent=mark, subsequent_indent=" " * len(mark),
                                 break_on_hyphens=False, break_long_words=False))
    return "\n".join(out) + tail
