"""sfcodec: lossless image compression with score-based diffusion models.

Exit codes: 0 ok, 1 internal error or a failed write (disk full), 2 usage error, 3 bad/unsupported input image,
4 corrupt/truncated/foreign .sfc file, 5 model missing or not the file's model,
6 output exists (use --force), 7 decode did not reproduce the pixels (nothing written),
130 interrupted, 141 standard output closed early (`sfcodec info f.sfc | head -1`; quietly, as
cat does).
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import click

from scoreflow_codec import __version__
from scoreflow_codec.coding.modes import STEPS_RANGE, TILE_RANGE
from scoreflow_codec.errors import (BadFileError, BadImageError, ModelError, ModelMismatchError, OutputExistsError,
                                    OutputPresentError, SfcError, UsageError, WriteError)
from scoreflow_codec.fileio import atomic_write, is_block_device, is_read_once, is_special

EPILOG_COMPRESS = """\b
Examples:
  sfcodec compress photo.png -o photo.sfc
  sfcodec compress a.png b.png c.png -o set.sfc      # one stream: cheaper per image
  sfcodec compress photos/ -d sfc/                   # each image in photos/ its own sfc/NAME.sfc (-r: subfolders)
  sfcodec compress img.png -o img.sfc --mode ode     # the probability-flow ODE (slow on a CPU)
  sfcodec compress - -o - < img.png > img.sfc        # - : standard input / output
"""


def _debug() -> bool:
    return os.environ.get("SFCODEC_DEBUG") == "1"


class _Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except SfcError as e:
            click.echo(f"sfcodec: error: {e}", err=True)
            sys.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("sfcodec: interrupted", err=True)
            sys.exit(130)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort, SystemExit):
            raise
        except BrokenPipeError:
            # whoever read stdout went away: stop without a word (as a SIGPIPE'd C tool does), and
            # point stdout at /dev/null so that the interpreter's last flush does not raise again
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError):
                pass
            sys.exit(141)
        except MemoryError:
            click.echo("sfcodec: error: out of memory (try smaller images, or fewer per file)", err=True)
            sys.exit(1)
        except Exception as e:  # a bug: say so in one line; the traceback only on request
            if _debug():
                raise
            click.echo(f"sfcodec: internal error: {e.__class__.__name__}: {e} "
                       "(set SFCODEC_DEBUG=1 for the traceback, and please report it)", err=True)
            sys.exit(1)


@click.group(cls=_Group, epilog="Exit codes: 0 ok, 2 usage, 3 bad image, 4 bad .sfc file, 5 model "
                                "missing/mismatch, 6 output exists, 7 decode mismatch, 1 write failed or internal error.")
@click.version_option(__version__, prog_name="sfcodec")
@click.option("-v", "--verbose", is_flag=True, help="Log what happens.")
def cli(verbose: bool) -> None:
    """Lossless image compression with score-based diffusion models (ScoreFlow).

    \b
      sfcodec compress img.png -o img.sfc
      sfcodec decompress img.sfc -o out.png
      sfcodec info img.sfc
      sfcodec verify img.png
    """
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="sfcodec: %(message)s")


# --- helpers -----------------------------------------------------------------------------------
def _check_output(path: Path, force: bool, inputs: list[Path] = ()) -> None:
    for i in inputs:
        if i.exists() and path.exists() and path.resolve() == i.resolve():
            raise OutputExistsError(f"{path}: output would overwrite an input")
    if path.is_dir():
        raise OutputExistsError(f"{path} is a directory; give a file name")
    if is_block_device(path):  # before any work: a disk is never written to, --force or not
        raise OutputExistsError(f"{path}: a block device (a disk or partition); give a file name")
    if is_special(path):  # /dev/null, a FIFO: written into, nothing of the user's replaced (atomic_write)
        return
    if path.exists() and not force:
        raise OutputPresentError(f"{path} exists (use --force to overwrite)")
    if not path.parent.exists():
        raise OutputExistsError(f"{path.parent}: no such directory")


@contextmanager
def _progress(total: int, desc: str, quiet: bool):
    if quiet or total <= 0 or not sys.stderr.isatty():  # no bar in logs and pipes
        yield None
        return
    from tqdm import tqdm

    with tqdm(total=total, desc=desc, unit="tile-step", file=sys.stderr, leave=False, dynamic_ncols=True) as bar:
        yield _Tick(bar, desc)


class _Tick:
    """A progress bar's update (the api's progress callback), and describe(what): the work under way
    beside the bar's name, for the stages that tick nothing (compress's seed codec and estimate)."""

    def __init__(self, bar, desc: str):
        self.bar, self.desc = bar, desc

    def __call__(self, n: int) -> None:
        self.bar.update(n)

    def describe(self, what: str) -> None:
        self.bar.set_description_str(f"{self.desc}: {what}")


def _device_option(ctx, param, value):
    """--device: one line (a usage error) where this machine's torch cannot run on it, not an internal
    error from deep in torch later (models.device_problem)."""
    if value is None or value == "cpu":
        return value
    from scoreflow_codec.models import device_problem  # loads torch: not for the default cpu

    problem = device_problem(value)
    if problem:
        raise click.BadParameter(problem)
    return value


def _load_model(spec: str, device: str, sizes: list[tuple[int, int]] | None = None, fallback: str = "auto"):
    """The model to code with; None for --fallback seed with --model auto: no model runs, and neither
    the model nor torch is loaded (a model named explicitly is still loaded, so a wrong name fails)."""
    from scoreflow_codec import zoo

    if spec == "auto" and fallback == "seed":
        return None
    if spec == "auto":
        spec = zoo.auto_model_name(sizes or [])
    return zoo.load_model(spec, device=device)


def _encode(sources, m, mode: str, o: dict, quiet: bool):
    """api.compress with the CLI's options (o: compress's and verify's: steps, tile, fallback, seed_tiles,
    device, arith, effort, jobs) and an encode progress bar -> (data, report)."""
    from scoreflow_codec import api

    settings = {"steps": o["steps"]} if o["steps"] else None
    ss = api.default_stream_settings(m, o["tile"], o["seed_tiles"])
    sources = api.choose_palette_coding(sources, ss.seed)  # before the progress bar counts model tiles
    fallback = o["fallback"]
    with _progress(api.compress_work_units(sources, m, mode, settings, ss, fallback), "encode", quiet) as tick:
        return api.compress(sources, m, mode, settings, stream_settings=ss, device=o["device"], progress=tick,
                            fallback=fallback, arith=o["arith"], phase=tick.describe if tick else None,
                            jobs=o["jobs"], effort=o["effort"])


def _effort(o: dict) -> str:
    """The summary line's note of --effort where it is not the default."""
    return "" if o["effort"] == 3 else f"; seed codec effort {o['effort']}"


def _run_label(mode: str, m) -> str:
    """The summary line's mode and model: none where no model was loaded (--fallback seed)."""
    return f"{mode}, model {m.name}; " if m is not None else ""


def _needed_why() -> str:
    """What a saving must pay for before --fallback auto codes the model's stream (api._saving_needed)."""
    from scoreflow_codec import api

    return f"what its stream adds and {100 * api.SAVING_MIN_FRACTION:g}% of the seed codec's bits, for its minutes"


def _coded_by(rep, seed_tiles: str = "chosen") -> str:
    """What wrote the file, for the summary lines (seed_tiles: --seed-tiles)."""
    if rep.coded_by == "model":
        st = rep.stream
        seed = f"; the seed codec alone: {8 * rep.seed_bytes / rep.num_dims:.3f}" if rep.seed_bytes else ""
        return f"model's stream, {st.n_tiles - st.n_seed} of {st.n_tiles} tiles the model's{seed}"
    if rep.model_bytes is not None and rep.model_bytes != rep.file_bytes:
        return f"seed codec alone, smaller than the model's stream ({8 * rep.model_bytes / rep.num_dims:.3f} bits/dim)"
    if rep.model_bytes is not None:  # the model's stream was coded and kept: each of its tiles a seed tile
        if seed_tiles == "first":
            return (f"seed codec alone: the model's stream of {rep.stream.n_tiles} tile(s) is all seed tiles, "
                    f"which the chain needs first to have bits to pop")
        return ("seed codec alone: the encoder made every tile of the model's stream a seed tile (--seed-tiles "
                "first: the model codes all but the first few)")
    if rep.model_skipped == "estimate":
        e = rep.model_estimate
        sample = "" if e.complete else f" (+- {e.se:.3f}, from {e.units} of {e.total} tiles)"
        return (f"seed codec alone; the model's stream was not coded: the model's bound, "
                f"{e.mean:.3f} bits/dim{sample}, is above this file's (--fallback both codes it anyway)")
    if rep.model_skipped == "saving":
        sv = rep.model_saving
        if not sv.tiles:
            return ("seed codec alone; the model's stream was not coded: the model is not expected to be cheaper "
                    "than the seed codec on any tile (--fallback both codes it anyway)")
        return (f"seed codec alone; the model's stream was not coded: the model is expected to save "
                f"{sv.bits:.0f} bits on {sv.tiles} tile(s), less than the {sv.needed:.0f} it must save "
                f"({_needed_why()}; --fallback both codes it anyway)")
    if rep.model_skipped == "small":
        return (f"seed codec alone; the model's stream was not coded: the seed codec codes the image's colour "
                f"in {rep.model_saving.upper:.0f} bits, fewer than the {rep.model_saving.needed:.0f} the model's "
                f"stream must save ({_needed_why()}; --fallback both codes it anyway)")
    if rep.model_skipped in ("sample", "screen"):
        from scoreflow_codec import api

        sv = rep.model_saving
        tiles = f"{sv.sampled} tiles drawn at random"
        if rep.model_skipped == "screen" and sv.sampled < api.SCREEN_TILES:  # the screen's first stage
            tiles = f"the {sv.sampled} of {api.SCREEN_TILES} tiles drawn at random where the seed codec spends the most"
        look = "a quick look at" if rep.model_skipped == "screen" else "from"
        return (f"seed codec alone; the model's stream was not coded: {look} {tiles}, "
                f"the model is expected to save {sv.bits:.0f} bits (at most {sv.upper:.0f}), less than the "
                f"{sv.needed:.0f} it must save ({_needed_why()}; --fallback both codes it anyway)")
    if rep.model_skipped == "seed only":
        return "seed codec alone (--fallback seed)"
    if rep.model_skipped == "grey":
        return "seed codec alone; the model's stream was not coded: grey images, which the model codes as colour " \
               "images whose colour is latent, at a loss (--fallback both codes it anyway)"
    if rep.model_skipped == "no colour planes":
        return "seed codec alone; the model's stream was not coded: no image has colour planes for the model " \
               "(palette index planes go through the seed codec either way)"
    return "seed codec alone"


def _sections(rep) -> str:
    """" (N of them metadata, M of them 16-bit low bits)" where a file has such sections."""
    parts = [f"{n} of them {what}" for n, what in ((rep.metadata_bytes, "metadata"), (rep.low_bytes, "16-bit low bits"))
             if n]
    return f" ({', '.join(parts)})" if parts else ""


def _load_images(paths, keep_metadata: bool) -> list:
    from scoreflow_codec import images

    sources = [_read_once_image(p) if _stdio(p) or is_read_once(p) else images.load_image(p) for p in paths]
    if not keep_metadata:  # the pixels alone, as asked: nothing kept, nothing to say was not
        for s in sources:
            s.metadata, s.not_kept = {}, []
    return sources


# --- "-": standard input and output (0.9.30) ----------------------------------------------------
# `sfcodec compress - -o - < img.png > img.sfc`, `sfcodec decompress - -o - < img.sfc > out.png`: an input
# "-" is read from standard input (alone), an output "-" written to standard output (never a terminal);
# the summary and any error stay on stderr.
STDIO_NAME = "<stdin>"


def _stdio(path) -> bool:
    return path is not None and str(path) == "-"


def _shown(path) -> str:
    """A path as messages name it: <stdin> for "-"."""
    return STDIO_NAME if _stdio(path) else str(path)


def _stdin_stream(what: str):
    stream = click.get_binary_stream("stdin")
    if stream.isatty():
        raise UsageError(f"- reads {what} from standard input, which is a terminal: redirect or pipe one in")
    return stream


def _check_stdout() -> None:
    """Before any work: standard output must not be a terminal (binary data would fill it)."""
    if click.get_binary_stream("stdout").isatty():
        raise UsageError("-o - writes binary data to standard output, which is a terminal: redirect it (> FILE) "
                         "or pipe it")


def _write(path: Path, data: bytes, like: list[Path] = ()) -> None:
    """The output's bytes: to standard output for "-", else atomic_write, with the modification time of
    `like` where that is one file (0.9.30: a .sfc gets its image's date, an image its .sfc's, so a
    photograph keeps its file date through compress and decompress, as with gzip, xz and zstd)."""
    if _stdio(path):
        out = click.get_binary_stream("stdout")
        out.write(data)
        out.flush()
        return
    mtime = None
    if len(like) == 1 and not _stdio(like[0]):
        try:
            mtime = like[0].stat().st_mtime_ns
        except OSError:
            pass
    try:
        atomic_write(path, data, mtime)
    except OSError as e:  # a full disk, no permission, a read-only file system: nothing is left behind
        raise WriteError(f"{path}: cannot write: {e.strerror or e}") from None


def _read_once_image(path):
    """The image on standard input ("-"; 0.9.30) or in a named pipe or a device (`sfcodec compress <(curl
    ...)`, a FIFO: fileio.is_read_once; 0.9.34: load_image opened it a second time for the metadata, and
    waited for a writer that never came), which can be read once: read whole (images.read_image_stream:
    an endless input is refused at its first bytes), its errors naming it."""
    from scoreflow_codec import images

    with _opened(path, "an image", BadImageError) as f:
        data = images.read_image_stream(f, _shown(path))
    return _image_of_bytes(data, _shown(path))


@contextmanager
def _opened(path, what: str, error: type[SfcError]):
    """Standard input ("-") or the file at path, opened to read `what`; an OSError reading it (no
    permission, a device's I/O error) is `error`, one line naming it (before 0.9.37 a .sfc's, and standard
    input's, was an internal error)."""
    try:
        with nullcontext(_stdin_stream(what)) if _stdio(path) else open(path, "rb") as f:
            yield f
    except OSError as e:
        raise error(f"{_shown(path)}: cannot read: {e.strerror or e}") from None


def _image_of_bytes(data: bytes, name: str):
    """An image read whole into memory: loaded through a temporary file (as load_image reads every kind),
    its errors naming `name`."""
    import tempfile

    from scoreflow_codec import images

    with tempfile.TemporaryDirectory(prefix="sfcodec-") as d:
        tmp = Path(d) / "stdin"
        tmp.write_bytes(data)
        try:
            return images.load_image(tmp)
        except SfcError as e:
            raise type(e)(str(e).replace(str(tmp), name)) from None


@contextmanager
def _naming(path):
    """A .sfc file's own errors (not a .sfc file, truncated, corrupt, another model's) name the file where
    their message does not, as compress's name the image and batch.error_line names each of several."""
    try:
        yield
    except (BadFileError, ModelError) as e:
        from cli.batch import named

        raise type(e)(named(_shown(path), str(e))) from None


def _read_sfc(path: Path) -> bytes:
    """A .sfc file's bytes, read to the end only after its magic number (container.read_stream: a device
    or a pipe that never ends is refused at its first bytes)."""
    from scoreflow_codec import container

    if not _stdio(path):
        if not path.exists():
            raise BadFileError(f"{path}: no such file")
        if path.is_dir():
            raise BadFileError(f"{path}: is a directory")
    with _opened(path, "a .sfc file", BadFileError) as f:
        return container.read_stream(f)


def _image_bytes(src, path: Path, warnings: list[str]) -> bytes:
    """The output file's bytes, with the image's metadata; a warning (added to warnings) names what its
    format cannot hold."""
    from scoreflow_codec import images

    dropped = images.metadata_dropped(src.metadata, path.suffix, src.meta)
    if dropped:
        warnings.append(f"sfcodec: warning: {path.name}: {images.LOSSLESS_SAVE[path.suffix.lower()]} cannot hold "
                        f"the image's {', '.join(dropped)}: not written (a .png keeps them)")
    return images.encode_source(src, path.suffix)


def _out_name(name: str | None, index: int, n: int, suffix: str) -> str:
    if name:
        return Path(name).stem + suffix
    return f"image_{index:0{max(4, len(str(n)))}d}{suffix}"


TILE_OPTION = click.option("--tile", type=click.IntRange(*TILE_RANGE), default=None,
                           help="Tile size in pixels the model sees at a time (default: the model's: "
                                "64 for photo, what a model file records, else 32).")
MODE_HELP = ("chain: the discrete diffusion chain (about 3x faster with cifar10, 16x with photo); ode: the "
             "probability-flow ODE (the paper's likelihood; slow on a CPU; with cifar10 the larger file; with photo "
             "it needs more seed tiles, about 10, and codes the other tiles in about 3.5% fewer bits).")
FALLBACK_OPTION = click.option(
    "--fallback", type=click.Choice(["auto", "both", "off", "seed"]), default="auto", show_default=True,
    help="Also code the images with the package's classical seed codec alone and keep the smaller file. "
         "auto: the model's stream is coded only where the model's estimated cost (its bound per tile; on 16 tiles "
         "or more first a quick look at 16 drawn at random, a few seconds, then above 1 Mpix 64 tiles, and all only "
         "where those promise a saving) promises a smaller file than the seed codec's; both: always code both; off: the model's stream only; seed: the seed codec alone, the model not run "
         "(neither torch nor the model is loaded unless --model names one; a Kodak image in about 24 s against 27 s for auto, "
         "the file auto writes for every Kodak image since 0.9.23). A file of the model's stream "
         "decodes with the model it names; a seed codec file needs no model.")
NO_FALLBACK_OPTION = click.option("--no-fallback", is_flag=True, help="The same as --fallback off.")
SEED_TILES_OPTION = click.option(
    "--seed-tiles", type=click.Choice(["chosen", "first"]), default="chosen", show_default=True,
    help="Which tiles of the model's stream the seed codec codes. chosen: every tile it is expected to code in "
         "fewer bits than the model (on photographs with the shipped photo model: all of them, so the file is the "
         "seed codec's coding); first: only the few the chain needs to have bits to pop, every other tile the "
         "model's. With --no-fallback, first shows a model's own coding of the images: to measure a model you "
         "trained (slower and usually larger).")
JOBS_OPTION = click.option(
    "--jobs", type=click.IntRange(min=1), default=None,
    help="Processes for a seed codec file in parts (a photograph above 1024x1024, or several images above "
         "512x512 in all: each part alone, the same bytes whatever the count); compress also makes the seed "
         "codec's analysis of an image of 256x256 or more in two processes, and the seed codec's decoder "
         "(decompress, and compress's check) makes its least-squares fits in a second process beside it, unless "
         "this is 1. With -d (verify: a folder "
         "or --each): processes in "
         "all, the files coded at once (each in its own; no more at once than the available memory holds by "
         "each file's estimated peak) and, with fewer files, their parts in the rest. "
         "Default: every usable core, as many as the available memory holds.")
OUTPUT_DIR_OPTION = click.option(
    "-d", "--output-dir", type=click.Path(path_type=Path), default=None,
    help="Each input its own output in this directory (made if missing), named as the input with the new "
         "suffix; a folder given as input: each file in it (-r: in its subfolders too, mirrored here). The files "
         "are coded in parallel (--jobs); a file that fails is one line and the others go on.")
SKIP_OPTION = click.option(
    "--skip-existing", is_flag=True,
    help="With -d: leave a file whose output exists as it is and go on (a folder's run that was stopped "
         "resumes where it ended: an output appears only once complete).")
RECURSIVE_OPTION = click.option("-r", "--recursive", is_flag=True,
                                help="With -d: a folder's subfolders too, their outputs in the same subfolders of DIR.")
ARITH_OPTION = click.option(
    "--arith", type=click.Choice(["exact64", "float32"]), default="exact64", show_default=True,
    help="exact64: every number that drives the coder is computed bit-exactly, so any machine decodes the "
         "file. float32: the float32 network, about 3x faster, but the file decodes only on the same kind of "
         "machine (the same CPU instruction set and torch build).")
EFFORT_OPTION = click.option(
    "--effort", type=click.IntRange(1, 3), default=3, show_default=True,
    help="How hard the classical seed codec (the file of every photograph so far) works: 3, every one of its "
         "modes; 2, without its least-squares predictor; 1, without its mixed mode either. Lower is faster both "
         "ways and makes larger files (on the 24 Kodak images: effort 2 +0.8%, the seed codec 2.0x faster to "
         "encode and 1.7x to decode; effort 1 +2.8%, 2.5x and 2.8x; all below JPEG-XL's effort 9). Every "
         "effort's files decode alike. The model's stream is not affected; --fallback auto weighs it against "
         "this effort's file.")
METADATA_OPTION = click.option(
    "--metadata/--no-metadata", "keep_metadata", default=True, show_default=True,
    help="Keep each image's ICC colour profile, EXIF, XMP, PNG text chunks, gamma / chromaticities and "
         "resolution (decompress writes them back), or code the pixels only.")
MODEL_HELP = "Model: 'auto' (by image size), a name from `sfcodec models`, or a path to an exported .safetensors."


# --- commands ----------------------------------------------------------------------------------
@cli.command(epilog=EPILOG_COMPRESS)
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(),
              help="The .sfc file to write (all the inputs in one file); - : standard output.")
@OUTPUT_DIR_OPTION
@RECURSIVE_OPTION
@SKIP_OPTION
@click.option("--model", default="auto", show_default=True, help=MODEL_HELP)
@click.option("--mode", type=click.Choice(["chain", "ode"]), default="chain", show_default=True, help=MODE_HELP)
@click.option("--steps", type=click.IntRange(*STEPS_RANGE), default=None, help="Solver / chain steps (default 128 in both modes, but in chain mode the model's own where its zoo entry or its file gives one: see `sfcodec models`; fewer is faster and larger).")
@TILE_OPTION
@click.option("--device", default="cpu", show_default=True, callback=_device_option,
              help="cpu, or cuda with --arith float32 (such files decode on the same kind of device only).")
@click.option("--verify/--no-verify", "verify", default=None,
              help="Decode before declaring success. Default: on where cheap (small inputs or chain mode).")
@ARITH_OPTION
@FALLBACK_OPTION
@NO_FALLBACK_OPTION
@SEED_TILES_OPTION
@EFFORT_OPTION
@JOBS_OPTION
@METADATA_OPTION
@click.option("--force", is_flag=True, help="Overwrite the output if it exists.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or summary.")
def compress(inputs, output, output_dir, recursive, skip_existing, model, mode, steps, tile, device, verify, arith,
             fallback, no_fallback, seed_tiles, effort, jobs, keep_metadata, force, quiet):
    """Compress images into one .sfc file (-o), or each into its own (-d)."""
    output, to_dir = _output_path(output)
    opts = {"model": model, "mode": mode, "steps": steps, "tile": tile, "device": device, "verify": verify,
            "arith": arith, "fallback": _fallback(fallback, no_fallback, seed_tiles), "seed_tiles": seed_tiles,
            "effort": effort, "jobs": jobs, "keep_metadata": keep_metadata, "force": force, "skip_existing": skip_existing}
    how = _one_of(output, output_dir, recursive, skip_existing, force)
    if to_dir:
        raise UsageError(f"-o {output}/ names a directory: give the .sfc file's name, or -d {output}/ for each "
                         "input its own file in it")
    if any(_stdio(i) for i in inputs) and (len(inputs) > 1 or how == "dir"):
        raise UsageError("- (an image on standard input) goes alone, with -o")
    if how == "dir":
        from cli import batch
        from scoreflow_codec.images import IMAGE_SUFFIXES, RAW_SUFFIXES

        files, targets = batch.plan(inputs, output_dir, ".sfc", recursive, IMAGE_SUFFIXES, "image files",
                                    RAW_SUFFIXES, quiet)
        sys.exit(batch.run(_compress_files, [([i], t, opts) for i, t in zip(files, targets)], jobs, quiet,
                           "compressed", output_dir))
    for i in inputs:
        if i.is_dir() and not _stdio(i):
            raise BadImageError(f"{i}: is a directory, not an image (-d DIR codes each image in it)")
    if _stdio(output):
        _check_stdout()
    summary = _compress_files(list(inputs), output, opts, quiet)
    if not quiet:
        for w in summary.warnings:
            click.echo(w, err=True)
        click.echo(summary.message, err=True)


def _fallback(fallback: str, no_fallback: bool, seed_tiles: str) -> str:
    """--fallback's value (--no-fallback: off), checked against --seed-tiles."""
    fallback = "off" if no_fallback else fallback
    if fallback == "seed" and seed_tiles != "chosen":
        raise UsageError("--seed-tiles goes with the model's stream, which --fallback seed does not code")
    return fallback


def _output_path(value: str | None) -> tuple[Path | None, bool]:
    """-o's value -> (its Path, whether it ends in a slash: a directory by what the user wrote, which Path's
    normalization loses; before 0.9.34 `compress -o out/` wrote a file named out)."""
    if value is None:
        return None, False
    return Path(value), value.endswith(("/", os.sep)) and value.strip("/" + os.sep) != ""


def _one_of(output: Path | None, output_dir: Path | None, recursive: bool, skip: bool, force: bool) -> str:
    """"file" (-o) or "dir" (-d): exactly one is given (and -r, --skip-existing only with -d)."""
    if (output is None) == (output_dir is None):
        raise UsageError("give either -o FILE (one output) or -d DIR (each input its own output in DIR)")
    if recursive and output_dir is None:
        raise UsageError("-r goes with -d DIR (a folder's images, each its own output)")
    if skip and output_dir is None:
        raise UsageError("--skip-existing goes with -d DIR")
    if skip and force:
        raise UsageError("--skip-existing and --force contradict each other: give one")
    return "file" if output is not None else "dir"


def _compress_files(inputs: list[Path], output: Path, o: dict, quiet: bool):
    """compress's work: the inputs into one .sfc file at output -> batch.Summary (the summary line, sizes)."""
    from cli.batch import Summary
    from scoreflow_codec import api

    if not _stdio(output):
        _check_output(output, o["force"], inputs)
    sources = _named(_load_images(inputs, o["keep_metadata"]), inputs)
    mode, device, jobs = o["mode"], o["device"], o["jobs"]
    m = _load_model(o["model"], device, [s.size for s in sources], o["fallback"])
    t0 = time.perf_counter()
    data, rep = _encode(sources, m, mode, o, quiet)
    enc_s = time.perf_counter() - t0
    verify = o["verify"]
    if verify is None:
        verify = api.verify_is_cheap(sources, mode)
    dec_s = None
    if verify:
        t1 = time.perf_counter()
        with _progress(api.work_units(api.read_header(data)), "verify", quiet) as tick:
            back = api.decompress(data, m, device=device, progress=tick, jobs=jobs)
        dec_s = time.perf_counter() - t1
        api.check_identical(sources, back)
    _write(output, data, inputs)
    warnings = _not_kept(sources, inputs)
    warnings += [] if any(_stdio(i) or is_read_once(i) for i in inputs) else _larger_than_inputs(output, len(data), inputs)
    msg = (f"{'<stdout>' if _stdio(output) else output}: {len(data)} bytes{_sections(rep)}, {rep.bpd:.3f} bits/dim "
           f"over {rep.num_images} image(s) [{_run_label(mode, m)}{_coded_by(rep, o['seed_tiles'])}{_effort(o)}] in "
           f"{enc_s:.1f}s")
    msg += f", verified in {dec_s:.1f}s" if verify else ", not verified"
    return Summary(msg, images=rep.num_images, dims=rep.num_dims, bytes=len(data), warnings=warnings)


def _named(sources, inputs) -> list:
    """The sources, each with its input's file name to record in the file (src.meta["name"]; an image from
    standard input has none)."""
    for src, p in zip(sources, inputs):
        if not _stdio(p):
            src.meta.setdefault("name", p.name)
    return sources


def _not_kept(sources, inputs) -> list[str]:
    """A warning line per input that holds what the .sfc does not keep beside its pixels (0.9.31:
    metadata.unkept; none with --no-metadata, for which _load_images clears it)."""
    return [f"sfcodec: warning: {_shown(p)}: not kept in the .sfc file: {', '.join(s.not_kept)}"
            for s, p in zip(sources, inputs) if s.not_kept]


def _larger_than_inputs(output: Path, size: int, inputs: list[Path]) -> list[str]:
    """A warning where the inputs hold a JPEG and the .sfc file is larger than they are together: a JPEG
    is lossy already, and its decoded pixels, kept exactly, take more bytes than the JPEG file (2.5x for
    kodim05 saved at quality 90). Not for other inputs (a tiny image's .sfc can be larger by its header)."""
    from PIL import Image

    from scoreflow_codec import images

    def jpeg(p: Path) -> bool:
        try:
            with images.opened(p) as img:
                return img.format in ("JPEG", "MPO")
        except (OSError, ValueError, Image.DecompressionBombError):
            return False

    total = sum(p.stat().st_size for p in inputs)
    if size <= total or not any(jpeg(p) for p in inputs):
        return []
    files = "files" if len(inputs) > 1 else "file"
    return [f"sfcodec: warning: {output.name} ({size} bytes) is larger than its input {files} ({total} bytes): a "
            "JPEG is lossy already, and its decoded pixels, kept exactly, take more bytes than the JPEG file (keep the "
            "JPEG itself)"]


@cli.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(),
              help="Image file (.png, .tif, .bmp, .webp lossless; a 16-bit image: .png or .tif) or, for several "
                   "images or a name ending in /, a directory; - : standard output (one image, as --format says).")
@OUTPUT_DIR_OPTION
@RECURSIVE_OPTION
@SKIP_OPTION
@click.option("--format", "fmt", type=click.Choice(["png", "tif", "webp", "bmp"]), default=None,
              help="With -d (and -o DIR): the images' format (default: each image's input's where that is "
                   "lossless and holds it, .tif, .webp, .bmp, .ppm or .png, else png); with -o - or a device or pipe "
                   "(-o /dev/null): the format (default png); with -o FILE the file name's suffix says it.")
@click.option("--model", default=None, help="Model to decode with (default: the one named in the file; a file "
              "coded by the seed codec alone names none and needs none).")
@click.option("--device", default=None, callback=_device_option,
              help="cpu or cuda (default: the kind the file was encoded on).")
@JOBS_OPTION
@click.option("--force", is_flag=True, help="Overwrite existing outputs.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or summary.")
def decompress(inputs, output, output_dir, recursive, skip_existing, fmt, model, device, jobs, force, quiet):
    """Decompress a .sfc file back to the identical pixels (-o), or several, each into DIR (-d)."""
    output, to_dir = _output_path(output)
    opts = {"model": model, "device": device, "jobs": jobs, "force": force, "skip_existing": skip_existing,
            "to_dir": to_dir}
    how = _one_of(output, output_dir, recursive, skip_existing, force)
    if any(_stdio(i) for i in inputs) and (len(inputs) > 1 or how == "dir"):
        raise UsageError("- (a .sfc file on standard input) goes alone, with -o")
    if how == "dir":
        opts["batch"], opts["format"] = True, fmt  # format None: each image its input's (images.same_format)
        from cli import batch

        files, targets = batch.plan(inputs, output_dir, "." + fmt if fmt else _sfc_suffix, recursive,
                                    frozenset({".sfc"}), ".sfc files")
        sys.exit(batch.run(_decompress_file, [(i, t, opts) for i, t in zip(files, targets)], jobs, quiet,
                           "decompressed", output_dir))
    if len(inputs) > 1:
        raise UsageError(f"{len(inputs)} .sfc files and one -o: give -d DIR to decompress each into DIR")
    if inputs[0].is_dir():
        raise BadFileError(f"{inputs[0]}: is a directory (-d DIR decodes each .sfc file in it)")
    if _stdio(output) or is_special(output):  # a device or a pipe (/dev/null) has no suffix: --format's
        if _stdio(output):
            _check_stdout()
        else:
            _check_output(output, force, inputs)  # a disk is refused here
        opts["format"] = fmt or "png"
    else:  # -o DIR: the images' format (None: each its input's); -o FILE: its suffix's (_decompress_file)
        opts["format"] = fmt
    with _naming(inputs[0]):
        summary = _decompress_file(inputs[0], output, opts, quiet)
    if not quiet:
        for w in summary.warnings:
            click.echo(w, err=True)
        click.echo(summary.message, err=True)


def _sfc_suffix(path: Path) -> str:
    """-d's output suffix for a .sfc file without --format (0.9.31): its image's input's format, as the
    header's file name says (images.same_format); .png for a file of several images (a directory then, each
    image by its own name) or one whose header cannot be read (it fails on its own), or a pipe's (read once,
    when it is decoded)."""
    from scoreflow_codec import api, container, images

    if is_read_once(path):
        return ".png"
    try:
        h = api.read_header(container.head(path))
    except (SfcError, OSError):
        return ".png"
    runs = h["images"]
    if len(runs) != 1 or runs[0][3] != 1:
        return ".png"
    return images.same_format(h.get("meta", {}).get("0", {}).get("name"), runs[0][2])


def _decompress_file(input: Path, output: Path, o: dict, quiet: bool):
    """decompress's work: one .sfc file to output (an image file, or a directory for several images; with
    -d, where the file holds several, the directory of output's name without its suffix) -> batch.Summary."""
    from cli.batch import Summary
    from scoreflow_codec import api, container, deep, images, zoo

    data = _read_sfc(input)
    header = api.read_header(data)
    container.unpack(data)  # a truncated or corrupt payload is the file's fault: say so before looking for a model
    device = o["device"] or header.get("setup", {}).get("device", "cpu")
    problem = None
    if not o["device"] and api.needs_model(header):
        from scoreflow_codec.models import device_problem
        problem = device_problem(device)
    if problem:  # a float32 file decodes on the kind of device that wrote it only
        raise ModelMismatchError(f"{_shown(input)}: the file was encoded on {device} in float32 arithmetic, which "
                                 f"only that kind of device reproduces, and {problem}")
    n = sum(run[3] for run in header["images"])
    names = [header.get("meta", {}).get(str(i), {}).get("name") for i in range(n)]
    modes = [mode for *_, mode, count in header["images"] for _ in range(count)]
    # images into a directory: each its input's format (images.same_format), or --format's
    suffix = "." + o["format"] if o.get("format") else None
    if o.get("batch") and n > 1:  # -d: DIR/stem.png for one image, DIR/stem/ for several
        output = output.with_suffix("")
    stream_out = _stdio(output) or (not o.get("batch") and is_special(output))  # standard output, /dev/null
    if stream_out:
        where = "standard output" if _stdio(output) else str(output)
        if n > 1:
            raise UsageError(f"{_shown(input)}: the file holds {n} images and {where} takes one: give -o DIR")
        targets = [Path(f"{'<stdout>' if _stdio(output) else output} as .{o['format']}")]  # checked below
    elif n == 1 and not o.get("to_dir") and (o.get("batch") or not output.is_dir()):
        if o.get("format") and not o.get("batch"):
            raise UsageError(f"--format goes with -d, -o DIR, -o - or a device (-o /dev/null); with -o FILE "
                             f"({output.name}) the file name's suffix gives the format")
        targets = [output]
    else:
        if output.exists() and not output.is_dir():
            why = f"the file holds {n} images" if n > 1 else "-o ending in / names a directory"
            raise OutputExistsError(f"{output}: not a directory ({why}); give a directory")
        sfx = [suffix or images.same_format(nm, mode) for nm, mode in zip(names, modes)]
        targets = [output / _out_name(nm, i, n, sfx[i]) for i, nm in enumerate(names)]
        if len(set(targets)) != len(targets):
            targets = [output / _out_name(None, i, n, sfx[i]) for i in range(n)]
    for t, mode in zip(targets, modes):
        if t.suffix.lower() not in images.LOSSLESS_SAVE:
            raise UsageError(f"{t.name}: output must be a lossless format ({', '.join(sorted(images.LOSSLESS_SAVE))})")
        if mode in deep.MODES and images.LOSSLESS_SAVE[t.suffix.lower()] not in deep.WRITTEN_AS[mode]:
            raise UsageError(f"{t.name}: the image is 16-bit ({mode}): the output must be "
                             f"{' or '.join('.' + f.lower().replace('tiff', 'tif') for f in deep.WRITTEN_AS[mode])}")
        if not stream_out and (t.parent != output or output.exists()):
            _check_output(t, o["force"], [input])
    m = None  # a seed-only file decodes without a model (--model is then not needed, and unused)
    if api.needs_model(header):
        m = zoo.load_model(o["model"], device=device) if o["model"] else zoo.model_for_header(header, device)
    t0 = time.perf_counter()
    with _progress(api.work_units(header), "decode", quiet) as tick:
        sources = api.decompress(data, m, device=device, progress=tick, jobs=o["jobs"])
    warnings: list[str] = []
    blobs = [_image_bytes(s, t, warnings) for s, t in zip(sources, targets)]
    if len(targets) > 1 or targets[0].parent == output:
        try:
            output.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # as batch.run says it
            raise UsageError(f"{e.filename}: cannot make the directory ({e.strerror})") from None
    for b, t in zip(blobs, targets):
        _write(output if stream_out else t, b, [input])
    return Summary(f"{_shown(input)}: {n} image(s) decoded in {time.perf_counter() - t0:.1f}s, pixels verified (CRC)",
                   images=n, dims=sum(s.num_dims for s in sources), bytes=len(data), warnings=warnings)


@cli.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True,
              help="Print the whole header as JSON (of several files: a list of {\"file\", \"header\"}).")
@click.option("-r", "--recursive", is_flag=True, help="A folder's subfolders' .sfc files too.")
def info(inputs, as_json, recursive):
    """Show what .sfc files hold (without decoding them); a folder stands for its .sfc files (--json: a
    list, as of several files). Of several files, one that cannot be read is an error line and the others
    are shown; the exit code is then the first such file's."""
    from cli import batch
    from scoreflow_codec import api

    one = len(inputs) == 1 and not inputs[0].is_dir()  # a folder's files are listed, however many
    inputs = batch.expand(inputs, recursive, frozenset({".sfc"}), ".sfc files")
    if one:
        with _naming(inputs[0]):
            data = _read_sfc(inputs[0])
            h = api.read_header(data)
        if as_json:
            click.echo(json.dumps(h, indent=2, sort_keys=True))
        else:
            _show_info(inputs[0], data, h)
        return
    code, listed, shown = 0, [], 0
    for input in inputs:
        try:
            data = _read_sfc(input)
            h = api.read_header(data)
        except SfcError as e:
            click.echo(batch.error_line(input, e), err=True)
            code = code or e.exit_code
            continue
        if as_json:
            listed.append({"file": str(input), "header": h})
        else:
            if shown:
                click.echo("")
            shown += 1
            _show_info(input, data, h)
    if as_json:
        click.echo(json.dumps(listed, indent=2, sort_keys=True))
    sys.exit(code)


def _png_chunk_types(data: bytes, h: dict) -> dict[int, list[str]]:
    """Per image, the types of the PNG chunks its file keeps (0.9.31), from the metadata section; {} where
    the file cannot be read that far (info still shows the header)."""
    from scoreflow_codec import api, container, metadata

    try:
        section = container.unpack_all(data)[2]
        mds = metadata.unpack([m.get("kept", {}) for *_, m in api.expand_images(h)], section)
    except SfcError:
        return {}
    return {i: metadata.png_chunk_types(md["png"]) for i, md in enumerate(mds) if "png" in md}


def _show_info(input: Path, data: bytes, h: dict) -> None:
    """info's lines for one file (its bytes and header)."""
    from scoreflow_codec import api, container, deep, images, metadata, zoo

    version = container.format_version(data)
    n = sum(r[3] for r in h["images"])
    dims = sum(r[0] * r[1] * images.channels_of(r[2]) * r[3] for r in h["images"])
    click.echo(f"file:      {_shown(input)} ({len(data)} bytes, {8 * len(data) / dims:.3f} bits/dim)")
    click.echo(f"format:    .sfc v{version}, written by {h.get('codec', '?')}")
    if "model" in h:
        made, now = h["model"].get("name", "?"), zoo.shipped_name(h["model"]["sha256"])
        gone = zoo.retired_name(h["model"]["sha256"]) if now is None else None
        where = (f"retired as {gone}: {zoo.retired_advice(gone, zoo.retired_models()[gone])}" if gone else
                 "not shipped with this installation" if now is None else
                 "shipped" if now == made else f"shipped, now named {now}")
        unused = "" if api.needs_model(h) else "; not needed to decode: every tile is in the seed codec"
        click.echo(f"model:     {made} (sha256 {h['model']['sha256']}; {where}{unused})")
    else:
        click.echo("model:     none: every tile is in the seed codec (decodes without a model)")
    ms, ss = api.full_settings(h)
    f = h["fields"]
    st = ", ".join(f"{k}={v}" for k, v in sorted(ms.items()))
    if api.seed_only(f):
        st = "unused: every tile is in the seed codec"
    click.echo(f"mode:      {h['mode']} ({st})")
    s = h.get("setup")
    if s is None:
        click.echo("setup:     none needed (the seed codec's integer coding decodes on any machine)")
    elif s.get("dtype") == "exact64":
        click.echo(f"setup:     exact64 arithmetic (decodes on any machine), micro-batch {s.get('micro_batch')}, "
                   f"encoded with torch {s.get('torch')}")
    else:
        click.echo(f"setup:     {s.get('device')} {s.get('dtype')}, micro-batch {s.get('micro_batch')}, "
                   f"torch {s.get('torch')}, {s.get('threads')} threads (decodes on the same kind of machine only)")
    click.echo(f"images:    {n}")
    for w, hh, mode, count in h["images"][:20]:
        click.echo(f"           {count} x {w}x{hh} {mode}")
    if len(h["images"]) > 20:
        click.echo(f"           ... {len(h['images']) - 20} more runs")
    wide = [(i, m["deep"]) for i, (*_, m) in enumerate(api.expand_images(h)) if "deep" in m]
    for i, d in wide[:20]:
        click.echo(f"{'16-bit:' if i == wide[0][0] else '':11s}{'image ' + str(i) + ': ' if n > 1 else ''}{deep.describe(d)}")
    if len(wide) > 20:
        click.echo(f"           ... {len(wide) - 20} more 16-bit images")
    kept = sorted((int(i), m["kept"]) for i, m in h.get("meta", {}).items() if "kept" in m and i.isdigit())
    chunks = _png_chunk_types(data, h) if any("png" in k for _, k in kept[:20]) else {}
    for i, k in kept[:20]:
        name = h["meta"][str(i)].get("name")
        types = f" ({', '.join(chunks[i])})" if chunks.get(i) else ""
        click.echo(f"{'metadata:' if i == kept[0][0] else '':11s}{'image ' + str(i) if n > 1 else 'kept'}"
                   f"{' (' + name + ')' if n > 1 and isinstance(name, str) else ''}: {metadata.describe(k)}{types}")
    if len(kept) > 20:
        click.echo(f"           ... {len(kept) - 20} more images with metadata")
    if not kept:
        click.echo("metadata:  none (pixels only)")
    if api.seed_only(f):
        parts = f", in {len(f['parts'])} independent parts (decoded in parallel)" if "parts" in f else ""
        click.echo(f"stream:    the seed codec alone (classical, version {ss['seed']}), {f['n_tiles']} tile(s) "
                   f"of up to {ss['tile']}px{parts}")
    else:
        which = "chosen by the encoder" if ss.get("seed_tiles") == "chosen" else "the first"
        if ss.get("seed_context") == "image":
            which += ", coded in the image's context"
        click.echo(f"stream:    {f['n_tiles']} tiles of {ss['tile']}px, {f['n_seed']} seed tiles, {which} "
                   f"(seed codec version {ss['seed']}), batching={ss['batching']}")


@cli.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--model", default="auto", show_default=True, help=MODEL_HELP)
@click.option("--mode", type=click.Choice(["chain", "ode"]), default="chain", show_default=True, help=MODE_HELP)
@click.option("--steps", type=click.IntRange(*STEPS_RANGE), default=None)
@TILE_OPTION
@click.option("--device", default="cpu", show_default=True, callback=_device_option)
@ARITH_OPTION
@FALLBACK_OPTION
@NO_FALLBACK_OPTION
@SEED_TILES_OPTION
@EFFORT_OPTION
@JOBS_OPTION
@METADATA_OPTION
@click.option("--each", is_flag=True,
              help="Each image alone, as compress -d codes it (the default where an input is a folder): a line "
                   "per image, the images in parallel (--jobs); without it several images are one stream, as "
                   "compress -o codes them.")
@click.option("-r", "--recursive", is_flag=True, help="A folder's subfolders' images too.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (each image alone: a list, one object each).")
@click.option("-q", "--quiet", is_flag=True)
def verify(inputs, model, mode, steps, tile, device, arith, fallback, no_fallback, seed_tiles, effort, jobs, keep_metadata,
           each, recursive, as_json, quiet):
    """Compress and decompress in memory, check the pixels (and metadata) are identical, report size and time.

    Several images are one stream, as `compress -o` codes them; a folder (its images; -r: its subfolders'
    too) or --each verifies each image alone, as `compress -d` codes it: nothing is written either way.
    """
    opts = {"model": model, "mode": mode, "steps": steps, "tile": tile, "device": device, "arith": arith,
            "fallback": _fallback(fallback, no_fallback, seed_tiles), "seed_tiles": seed_tiles, "effort": effort,
            "jobs": jobs, "keep_metadata": keep_metadata}
    if each or any(i.is_dir() and not _stdio(i) for i in inputs):
        from cli import batch
        from scoreflow_codec.images import IMAGE_SUFFIXES, RAW_SUFFIXES

        if any(_stdio(i) for i in inputs):
            raise UsageError("- (an image on standard input) goes alone, without a folder or --each")
        files = batch.expand(inputs, recursive, IMAGE_SUFFIXES, "image files", RAW_SUFFIXES)
        outcomes: list = []
        code = batch.run(_verify_files, [([f], f, opts) for f in files], jobs, quiet or as_json, "verified", None,
                         outcomes)
        if as_json:
            click.echo(json.dumps([o.summary.record if o.code == 0 else
                                   {"file": str(f), "identical": False, "exit_code": o.code, "error": o.error}
                                   for f, o in zip(files, outcomes)]))
        sys.exit(code)
    done = _verify_files(list(inputs), None, opts, quiet)
    if as_json:
        click.echo(json.dumps(done.record))
    else:
        for w in [] if quiet else done.warnings:
            click.echo(w, err=True)
        click.echo(done.message)


def _verify_files(inputs: list[Path], name: Path | None, o: dict, quiet: bool):
    """verify's work: the inputs as one stream, coded and decoded in memory -> batch.Summary (its line,
    which begins with `name` where one is given, and its --json record); a decode that differs raises
    (exit 7)."""
    from cli.batch import Summary
    from scoreflow_codec import api

    sources = _named(_load_images(inputs, o["keep_metadata"]), inputs)  # as compress: its size, byte for byte
    mode, device, fallback, jobs = o["mode"], o["device"], o["fallback"], o["jobs"]
    m = _load_model(o["model"], device, [s.size for s in sources], fallback)
    t0 = time.perf_counter()
    data, rep = _encode(sources, m, mode, o, quiet)
    t1 = time.perf_counter()
    with _progress(api.work_units(api.read_header(data)), "decode", quiet) as tick:
        back = api.decompress(data, m, device=device, progress=tick, jobs=jobs)
    t2 = time.perf_counter()
    api.check_identical(sources, back)
    record = {**({"file": str(name)} if name is not None else {}),
              "images": len(sources), "bytes": len(data), "metadata_bytes": rep.metadata_bytes,
              "low_bytes": rep.low_bytes, "bpd": rep.bpd, "mode": mode, "model": m.name if m else None,
              "coded_by": rep.coded_by, "model_bytes": rep.model_bytes, "seed_bytes": rep.seed_bytes,
              "tiles": rep.stream.n_tiles, "seed_tiles": rep.stream.n_seed,
              "model_estimate_bpd": rep.model_estimate_bpd,
              "model_estimate_tiles": None if rep.model_estimate is None else rep.model_estimate.units,
              "model_saving_bits": None if rep.model_saving is None else rep.model_saving.bits,
              "effort": o["effort"], "encode_s": t1 - t0, "decode_s": t2 - t1, "identical": True,
              "not_kept": {_shown(p): s.not_kept for s, p in zip(sources, inputs) if s.not_kept}}
    msg = (f"{'' if name is None else f'{name}: '}OK: {len(sources)} image(s) -> {len(data)} bytes{_sections(rep)}, "
           f"{rep.bpd:.3f} bits/dim [{_run_label(mode, m)}{_coded_by(rep, o['seed_tiles'])}{_effort(o)}]; encode "
           f"{t1 - t0:.1f}s, decode "
           f"{t2 - t1:.1f}s; pixels identical" + ("" if not rep.metadata_bytes else ", metadata identical"))
    return Summary(msg, images=rep.num_images, dims=rep.num_dims, bytes=len(data), warnings=_not_kept(sources, inputs),
                   record=record)


@cli.command(name="eval")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--model", default="auto", show_default=True, help=MODEL_HELP)
@click.option("--device", default="cpu", show_default=True, callback=_device_option)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Use the first N images (of an .npz, a folder, all inputs).")
@click.option("-r", "--recursive", is_flag=True, help="A folder's subfolders' images too.")
@click.option("--no-ode", is_flag=True, help="Bound only (the ODE NLL is the slow part).")
@click.option("--n-t", type=click.IntRange(min=1), default=1000, show_default=True, help="Time samples for the bound.")
@click.option("--rtol", type=click.FloatRange(min=0, min_open=True), default=1e-5, show_default=True,
              help="The ODE solver's relative tolerance.")
@click.option("--atol", type=click.FloatRange(min=0, min_open=True), default=1e-5, show_default=True,
              help="The ODE solver's absolute tolerance.")
@click.option("--probes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Hutchinson probes per tile for the ODE NLL: its noise falls as 1/sqrt(probes), "
                   "each probe adding one backward pass per solver step.")
@click.option("--batch", "pool", type=click.IntRange(min=1), default=None,
              help="Evaluate the tiles of all the images together, this many at a time (one ODE solve each), "
                   "for many small images on a GPU. The draws then fall differently from the default's "
                   "(each image's tiles alone).")
@click.option("--seed", type=int, default=0, show_default=True)
@TILE_OPTION
@click.option("--json", "as_json", is_flag=True)
def eval_cmd(inputs, model, device, limit, recursive, no_ode, n_t, rtol, atol, probes, pool, seed, tile, as_json):
    """Bits/dim a model assigns: the likelihood bound and the ODE NLL (the paper's numbers).

    INPUTS are image files, folders of images (-r: their subfolders too) or .npz files of uint8 images
    (key "images"). A 16-bit image is evaluated on its high bits, the 8-bit planes the model codes in its
    file (and the trainer trains on).
    """
    from cli import batch
    from scoreflow_codec import api
    from scoreflow_codec.images import IMAGE_SUFFIXES, RAW_SUFFIXES

    arrays, names = api.load_eval_inputs(batch.expand(inputs, recursive, IMAGE_SUFFIXES, "image files", RAW_SUFFIXES),
                                         limit)
    m = _load_model(model, device, [(a.shape[1], a.shape[0]) for a in arrays])
    rows = api.evaluate_images(arrays, m, device=device, ode=not no_ode, n_t=n_t, rtol=rtol, atol=atol, seed=seed,
                               tile=tile, probes=probes, pool=pool)
    for r, nm in zip(rows, names):
        r["image"] = nm
    summary, se = api.summarize(rows), api.standard_errors(rows)
    if as_json:
        click.echo(json.dumps({"model": m.name, "sha256": m.sha256, "rows": rows, "mean": summary, "se": se},
                              indent=2))
        return
    cols = list(summary)  # the measures evaluated, in api's order
    click.echo("image".ljust(24) + "".join(c.rjust(18) for c in cols))
    for r in rows:
        click.echo(str(r["image"])[:24].ljust(24) + "".join(f"{r[c]:18.4f}" for c in cols))
    click.echo("mean".ljust(24) + "".join(f"{summary[c]:18.4f}" for c in cols))
    if len(rows) > 1:  # the spread over images: what another sample of as many could give
        click.echo("standard error".ljust(24) + "".join(f"{se[c]:18.4f}" for c in cols))


@cli.command()
def models():
    """List the shipped models with the tile size and chain steps each codes with by default."""
    from scoreflow_codec import zoo
    from scoreflow_codec.coding.chain_codec import ChainSettings

    entries = zoo.list_models()
    width = max([len(e["name"]) + 2 for e in entries] + [12])
    click.echo(f"{'name':{width}s} {'tile':>4s} {'steps':>5s}  description")
    for e in entries:
        name = e["name"] + (" *" if e["default"] else "")
        steps = e.get("chain_steps") or ChainSettings().steps
        click.echo(f"{name:{width}s} {e.get('tile', 32):4d} {steps:5d}  {e.get('description', '')}")
    retired = zoo.retired_models()
    if retired:
        releases = sorted({e["release"] for e in retired.values()})
        click.echo(f"retired: {', '.join(retired)} (last shipped in {', '.join(releases)}; `sfcodec info FILE` "
                   "says how to decode a file made with one)")
    if entries:
        click.echo("* the default model. tile: the tile size; steps: the chain mode's steps (--steps overrides). "
                   "--model auto takes cifar10 for images up to 64x64 and photo for larger ones.")


def main() -> None:
    from scoreflow_codec.threads import spin_briefly

    spin_briefly()  # before anything loads torch: a busy core otherwise slows network calls 10 - 30x
    from scoreflow_codec.coding import workers

    workers.allow_spawn()  # this entry point is guarded: spawned workers (macOS, Windows) do not re-run it
    cli(prog_name="sfcodec")


if __name__ == "__main__":
    main()
