"""sfcodec's `-d DIR`: each input its own output in a directory, the files in parallel (0.9.29).

A folder of photographs: `sfcodec compress photos/*.png -d sfc/` (or `photos/`: the image files in it;
with -r its subfolders' too, mirrored under DIR), then `sfcodec decompress sfc/*.sfc -d back/`. Each
file is coded as `-o` codes it alone (the same bytes), in its own process, as many at once as --jobs
says (default: every usable core), each with its share of torch's threads, and no more at once than the
memory available at the start holds by each file's estimated peak (file_need, from the image's or the
.sfc file's header; workers.each starts the largest that fits as another ends: 0.9.30). A file
that fails (not an image, a corrupt .sfc, an output that exists) is one error line and the others go
on; the exit code is the first failed file's in the inputs' order, 0 where every file succeeded.
--skip-existing leaves a file whose output exists (outputs appear only when complete,
fileio.atomic_write), so a stopped run over a folder resumes where it ended. Output names that would
clash (a/x.png and b/x.png) are refused before anything runs: with --force the second would
overwrite the first.
"""
from __future__ import annotations

import contextlib
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import click

from scoreflow_codec.coding import workers
from scoreflow_codec.errors import OutputPresentError, SfcError, UsageError

log = logging.getLogger(__name__)

# What one file's process holds at its peak, for how many files run at once (workers.each's budget:
# the memory available when the run starts): an upper estimate. Peak RSS measured with /usr/bin/time on
# the 2-core Intel Xeon (0.9.29, one process, --jobs 1), against the estimate: compress with the defaults
# (torch, the photo model's quick look) 1024x768 820 MiB (1,136), 2048x1536 1,263 (1,472), 4000x3000
# 1,813 (2,012); --fallback seed 1024x768 580 (752), 2048x1536 1,054 (1,088), 16-bit 1,075 (1,136);
# decompress (the seed codec's files) 1024x768 363 (512), 2048x1536 458 (768).
PROCESS_BYTES = 128 << 20  # Python, numpy and the package, before the image
MODEL_BYTES = 384 << 20  # torch and a model: compress unless --fallback seed, decompress of a model's stream
# the seed codec on one part's pixels (verify: compress's, whose decode after it needs less)
CODING_BYTES_PER_PIXEL = {"compressed": 768, "verified": 768, "decompressed": 448}
PART_SIDE = 1024  # a seed codec part holds at most 1024x1024 pixels (stream.SEED_ONLY_MAX_TILE)
IMAGE_BYTES_PER_PIXEL = 64  # the whole image's arrays
DEEP_BYTES_PER_PIXEL = 16  # and a 16-bit image's low bits


@dataclass
class Summary:
    """What coding one output did: the line `-o` prints, and the sizes for the batch's total."""
    message: str
    images: int = 0
    dims: int = 0
    bytes: int = 0
    warnings: list[str] = field(default_factory=list)
    record: dict | None = None  # verify's: its --json object


@dataclass
class Outcome:
    """One file's result in a batch: exit code 0 and its summary (None: skipped, its output exists), or
    the code and the error line."""
    code: int
    summary: Summary | None = None
    error: str | None = None


def plan(inputs, out_dir: Path, suffix, recursive: bool, kinds: frozenset[str], what: str,
         raw: frozenset[str] = frozenset(), quiet: bool = False) -> tuple[list[Path], list[Path]]:
    """(files, their outputs): a file input -> out_dir / (its stem + suffix; suffix(file) where suffix is a
    function, decompress's by each file's header); a folder -> its files whose suffix is in kinds (hidden
    ones not), with `recursive` its subfolders' too, each at its place under
    out_dir. UsageError where two would share an output (also where only the case of their names
    differs: one file on macOS and Windows), or a folder holds no such file. A folder's files whose
    suffix is in `raw` (camera raw files, which compress does not read) are left out, one warning line
    counting them unless quiet (0.9.30: a photographer's folder often holds each picture as raw and as JPEG)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"{out_dir}: not a directory (-d takes a directory; -o a file)")
    files, names = [], []
    sfx = suffix if callable(suffix) else lambda f: suffix
    for i in map(Path, inputs):
        if not i.is_dir():
            files.append(i)
            names.append(out_dir / (i.stem + sfx(i)))
            continue
        for f in folder_inputs(i, recursive, kinds, what, raw, quiet):
            rel = f.relative_to(i)
            files.append(f)
            names.append(out_dir / rel.parent / (f.stem + sfx(f)))
    first: dict[str, Path] = {}
    for f, t in zip(files, names):
        key = str(t).casefold()  # a.png and A.PNG: one file where names ignore case (macOS, Windows)
        if key in first:
            raise UsageError(f"{first[key]} and {f} would both be written to {t}: give them apart (other -d, "
                             "or -o each)")
        first[key] = f
    return files, names


def expand(inputs, recursive: bool, kinds: frozenset[str], what: str, raw: frozenset[str] = frozenset()) -> list[Path]:
    """The inputs in order, each folder among them replaced by its files (folder_inputs): eval's and info's
    inputs, which name files and folders alike."""
    return [f for i in map(Path, inputs) for f in (folder_inputs(i, recursive, kinds, what, raw) if i.is_dir() else [i])]


def folder_inputs(top: Path, recursive: bool, kinds: frozenset[str], what: str, raw: frozenset[str] = frozenset(),
                 quiet: bool = False) -> list[Path]:
    """The files of the folder top (its subfolders' too where recursive) whose suffix is in kinds, sorted;
    UsageError where there is none. Camera raw files (suffix in raw) are left out, one warning line
    counting them unless quiet."""
    from scoreflow_codec import images

    found = images.folder_files(top, recursive, kinds)
    raws = len(images.folder_files(top, recursive, raw)) if raw else 0
    left = (f"{raws} camera raw file(s), which sfcodec does not read: develop them into 16-bit TIFFs or PNGs "
            "first") if raws else ""
    if not found:
        sub = "" if recursive else " (-r: its subfolders too)"
        raise UsageError(f"{top}: no {what} in the folder{sub}{'; ' + left if left else ''}")
    if left and not quiet:
        click.echo(f"sfcodec: warning: {top}: {left}; left out", err=True)
    return found


def attempt(fn: Callable, inputs, output: Path, opts: dict) -> Outcome:
    """fn(inputs, output, opts, quiet=True) (cli.main's _compress_files or _decompress_file), its errors
    as the one line sfcodec prints for them; in a worker process or in this one."""
    name = _name(inputs)
    try:
        return Outcome(0, fn(inputs, output, opts, True))
    except SfcError as e:
        if isinstance(e, OutputPresentError) and opts.get("skip_existing"):
            return Outcome(0)
        return Outcome(e.exit_code, error=error_line(name, e))
    except MemoryError:
        return Outcome(1, error=f"sfcodec: error: {name}: out of memory (try fewer files at once: --jobs)")
    except Exception as e:  # a bug: one line, as sfcodec's own handler says it
        return Outcome(1, error=f"sfcodec: internal error: {name}: {e.__class__.__name__}: {e} "
                                "(run this file alone with SFCODEC_DEBUG=1 for the traceback, and please report it)")


def file_need(inputs, opts: dict, verb: str) -> int:
    """An estimate of the memory (bytes) of the process that codes this task's file with opts["jobs"]
    processes (its parts' processes and the encoder's second analysis process included), from the
    image's or the .sfc file's header; PROCESS_BYTES where that cannot be read (the file fails at once); for a
    pipe, which can be read once, PROCESS_BYTES + MODEL_BYTES."""
    from scoreflow_codec import api, container, deep, images
    from scoreflow_codec.fileio import is_read_once

    if is_read_once(_name(inputs)):  # a pipe is read once, by the task itself
        return PROCESS_BYTES + MODEL_BYTES
    try:
        if verb in ("compressed", "verified"):
            sizes, model = [images.peek(_name(inputs))], opts.get("fallback") != "seed"
        else:
            header = api.read_header(container.head(inputs))
            sizes = [(w, h * n, mode in deep.MODES) for w, h, mode, n in header["images"]]
            model = api.needs_model(header)
    except (SfcError, OSError):
        return PROCESS_BYTES
    pixels = sum(w * h for w, h, _ in sizes)
    parts = sum(-(-w // PART_SIDE) * -(-h // PART_SIDE) for w, h, _ in sizes)
    jobs = opts.get("jobs") or 1
    coders = 1 if jobs == 1 else min(jobs, max(parts, 2 if verb != "decompressed" else 1))
    return (PROCESS_BYTES + MODEL_BYTES * model + coders * CODING_BYTES_PER_PIXEL[verb] * min(pixels, PART_SIDE ** 2)
            + sum(w * h * (IMAGE_BYTES_PER_PIXEL + DEEP_BYTES_PER_PIXEL * wide) for w, h, wide in sizes))


def _name(inputs) -> Path:
    """The input file a task names: compress's one-element list, or decompress's path."""
    return inputs[0] if isinstance(inputs, list) else inputs


def named(name, text: str) -> str:
    """A message with a file's name first where it does not hold it already."""
    return text if str(name) in text else f"{name}: {text}"


def error_line(name, e: SfcError) -> str:
    """sfcodec's line for one file's error among several: the message, the file's name first (named)."""
    return f"sfcodec: error: {named(name, str(e))}"


def _remove_empty(folders: list[Path]) -> None:
    """Remove those of `folders` that are empty, the deepest first (a folder with a file in it stays)."""
    for f in sorted(set(folders), key=lambda f: len(f.parts), reverse=True):
        with contextlib.suppress(OSError):
            f.rmdir()


def run(fn: Callable, tasks: list[tuple], jobs: int | None, quiet: bool, verb: str, out_dir: Path | None,
        outcomes: list | None = None) -> int:
    """Each task (inputs, output, opts) through attempt(fn, ...), at most `jobs` processes (None: the usable
    cores), no more files at once than the available memory holds by their estimates (file_need); prints
    each file's line as it ends and a total -> the exit code. out_dir None (verify: nothing written, each
    task's output slot the name its line shows): the lines on standard output, the warnings and errors on
    standard error. outcomes: a list to receive each task's Outcome, in the tasks' order."""
    made: list[Path] = []  # the folders this run makes: those left empty go again at its end (0.9.37)
    try:
        for folder in [] if out_dir is None else [out_dir, *sorted({t[1].parent for t in tasks} - {out_dir})]:
            made += [f for f in (folder, *folder.parents) if not f.exists()]
            folder.mkdir(parents=True, exist_ok=True)  # -r: a folder input's subfolders too
    except OSError as e:
        raise UsageError(f"{e.filename}: cannot make the directory ({e.strerror})") from None
    # --jobs (default: the usable cores) counts processes in all: files at once, and where there are fewer
    # files than that, each file's parts (a photograph above 1024x1024) in the rest; one file at a time
    # codes as -o does. How many files run at once: as many as the memory available now holds by their
    # estimates (each file's parts' processes included), the largest that fits starting as another ends
    total = jobs if jobs is not None else workers.usable_cores() if workers.parallel_by_default() else 1
    procs = max(1, min(total, len(tasks)))
    need = budget = None
    if procs > 1:  # files in other processes: how many at once is by their memory
        tasks = [(i, o, {**opts, "jobs": max(1, total // procs)}) for i, o, opts in tasks]
        need = [file_need(i, opts, verb) for i, _, opts in tasks]
        budget = workers.available_memory()
        mib = lambda b: f"{b / (1 << 20):,.0f} MiB"  # noqa: E731
        log.info(
            f"{procs} processes ({max(1, total // procs)} for each file's parts); memory "
            f"{'unknown' if budget is None else mib(budget) + ' available'}, a file's estimated peak "
            f"{mib(min(need))} - {mib(max(need))}: files start as long as their estimates fit")
    t0 = time.perf_counter()
    outcomes_by: dict[int, Outcome] = {}
    bar = None
    if not quiet and sys.stderr.isatty() and len(tasks) > 1:
        from tqdm import tqdm

        bar = tqdm(total=len(tasks), desc=verb.split()[0], unit="file", file=sys.stderr, leave=False,
                   dynamic_ncols=True)

    def say(line: str, err: bool = True) -> None:
        if bar is not None:
            bar.write(line, file=sys.stderr if err else sys.stdout)
        else:
            click.echo(line, err=err)

    try:
        for k, out in workers.each(attempt, [(fn, *t) for t in tasks], procs, need, budget):
            outcomes_by[k] = out
            if out.error is not None:
                say(out.error)
            elif not quiet and out.summary is not None:
                for w in out.summary.warnings:
                    say(w)
                say(out.summary.message, err=out_dir is not None)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        _remove_empty(made)  # every file failed (or was interrupted): no empty folders left behind
    failed = [k for k in range(len(tasks)) if outcomes_by[k].code != 0]
    done = [outcomes_by[k].summary for k in range(len(tasks)) if outcomes_by[k].code == 0 and outcomes_by[k].summary]
    skipped = sum(outcomes_by[k].code == 0 and outcomes_by[k].summary is None for k in range(len(tasks)))
    if outcomes is not None:
        outcomes[:] = [outcomes_by[k] for k in range(len(tasks))]
    if not quiet and (len(tasks) > 1 or skipped):
        size = sum(s.bytes for s in done)
        dims = sum(s.dims for s in done)
        what = (f"{size} bytes, {8 * size / dims:.3f} bits/dim" if verb != "decompressed" and dims else
                f"{sum(s.images for s in done)} image(s)")
        left = f" ({skipped} skipped: their output exists)" if skipped else ""
        into = "" if out_dir is None else f" into {out_dir}"
        click.echo(f"sfcodec: {len(done)} of {len(tasks)} file(s) {verb}{into}{left}: {what}, "
                   f"{time.perf_counter() - t0:.1f}s ({procs} process{'es' if procs > 1 else ''})", err=True)
    if failed and len(tasks) > 1:
        click.echo(f"sfcodec: {len(failed)} of {len(tasks)} file(s) failed; the first, {_name(tasks[failed[0]][0])}, "
                   f"with exit code {outcomes_by[failed[0]].code}", err=True)
    return outcomes_by[failed[0]].code if failed else 0
