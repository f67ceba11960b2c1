"""sfcodec's -d DIR (cli/batch.py, 0.9.29): each input (or each image of a folder, -r its subfolders
too) its own output in a directory, the files coded in parallel processes.

What a user relies on: each file is the same bytes as `-o` makes of it alone, whatever --jobs; a
file that fails (not an image, a corrupt .sfc, an output that exists) is one error line naming it,
the others are still written, and the exit code is the first failure's; names that would clash are
refused before anything runs; decompress -d gives back every file's pixels, in the format asked.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from cli import batch
from cli.main import cli
from scoreflow_codec import images
from scoreflow_codec.coding import workers

EXIT = {"usage": 2, "image": 3, "sfc": 4, "model": 5, "exists": 6}
SEED = ("--fallback", "seed")  # the seed codec alone: no model, seconds per file


def sfcodec(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="sfcodec", catch_exceptions=False)


def lines(result) -> list[str]:
    return [ln for ln in result.stderr.split("\n") if ln.strip()]


def _image(path: Path, seed: int, size=(23, 17), mode="RGB") -> Path:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size[1], 0:size[0]]
    base = np.stack([60 + 4 * xx, 90 + 3 * yy, 200 - 2 * (xx + yy)], -1) + rng.integers(-9, 10, (size[1], size[0], 3))
    im = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8), "RGB")
    im.convert(mode).save(path)
    return path


@pytest.fixture
def photos(tmp_path) -> list[Path]:
    d = tmp_path / "in"
    d.mkdir()
    return [_image(d / "a.png", 1), _image(d / "b.png", 2, (40, 9)), _image(d / "c.tif", 3, mode="L")]


def same_pixels(a: Path, b: Path) -> bool:
    with Image.open(a) as x, Image.open(b) as y:
        return x.mode == y.mode and np.array_equal(np.asarray(x), np.asarray(y))


def test_each_file_is_what_o_makes_of_it_alone_whatever_the_jobs(photos, tmp_path):
    """-d writes DIR/<stem>.sfc per input, byte for byte `-o`'s file of that input alone, in one
    process (--jobs 1) or several; decompress -d gives back each image (in its input's format by default since
    0.9.31, or --format's)."""
    alone = {}
    for p in photos:
        out = tmp_path / f"{p.stem}.alone.sfc"
        r = sfcodec("compress", p, "-o", out, *SEED, "-q")
        assert r.exit_code == 0, r.stderr
        alone[p.stem] = out.read_bytes()
    for jobs in ("1", "3"):
        d = tmp_path / f"sfc{jobs}"
        r = sfcodec("compress", *photos, "-d", d, *SEED, "--jobs", jobs)
        assert r.exit_code == 0, r.stderr
        assert sorted(x.name for x in d.iterdir()) == ["a.sfc", "b.sfc", "c.sfc"]
        assert {x.stem: x.read_bytes() for x in d.iterdir()} == alone
        out = lines(r)  # a line per file, then the total
        assert len(out) == 4 and f"3 of 3 file(s) compressed into {d}" in out[-1] and f"({jobs} process" in out[-1]
        assert sum(map(len, alone.values())) == int(out[-1].split(": ")[2].split(" bytes")[0])
    back = tmp_path / "back"
    r = sfcodec("decompress", *sorted((tmp_path / "sfc3").iterdir()), "-d", back, "--jobs", "2")
    assert r.exit_code == 0, r.stderr
    assert sorted(x.name for x in back.iterdir()) == ["a.png", "b.png", "c.tif"]  # each its input's format (0.9.31)
    for p in photos:
        assert same_pixels(p, back / p.name)
    tif = tmp_path / "tif"
    r = sfcodec("decompress", *sorted((tmp_path / "sfc1").iterdir()), "-d", tif, "--format", "tif", "-q")
    assert r.exit_code == 0 and r.stderr == ""
    for p in photos:
        assert same_pixels(p, tif / f"{p.stem}.tif")


def test_the_files_run_in_other_processes(photos, tmp_path, monkeypatch):
    """--jobs N codes N files at once, each in a process of its own with its share of the threads; with
    fewer files than N, each file's parts get the other processes."""
    seen = []
    real = workers.each

    def spy(fn, items, jobs, need=None, budget=None):
        seen.append((jobs, {item[-1]["jobs"] for item in items}))
        yield from real(fn, items, jobs, need, budget)

    monkeypatch.setattr(workers, "each", spy)
    assert sfcodec("compress", *photos, "-d", tmp_path / "x", *SEED, "--jobs", "2", "-q").exit_code == 0
    assert sfcodec("compress", photos[0], "-d", tmp_path / "z", *SEED, "-q").exit_code == 0
    assert sfcodec("compress", *photos[:2], "-d", tmp_path / "w", *SEED, "--jobs", "5", "-q").exit_code == 0
    monkeypatch.setattr(workers, "usable_cores", lambda: 8)
    monkeypatch.setattr(workers, "available_memory", lambda: None)
    assert sfcodec("compress", *photos, "-d", tmp_path / "y", *SEED, "-q").exit_code == 0
    # --jobs counts processes in all: files at once, the rest for each file's parts; one file: as -o
    assert seen == [(2, {1}), (1, {None}), (2, {2}), (3, {2})]


def test_the_files_at_once_fit_in_the_available_memory(photos, tmp_path, monkeypatch):
    """With -d, each file's process has its memory estimated (file_need, from the image's or the .sfc
    file's header) and workers.each starts no more files at once than the memory available at the
    start holds; the files are the same."""
    seen = []
    real = workers.each

    def spy(fn, items, jobs, need=None, budget=None):
        seen.append((need, budget))
        yield from real(fn, items, jobs, need, budget)

    monkeypatch.setattr(workers, "each", spy)
    monkeypatch.setattr(workers, "available_memory", lambda: 5 << 30)
    assert sfcodec("compress", *photos, "-d", tmp_path / "x", *SEED, "--jobs", "2", "-q").exit_code == 0
    sfc = sorted((tmp_path / "x").iterdir())
    assert sfcodec("decompress", *sfc, "-d", tmp_path / "y", "--jobs", "3", "-q").exit_code == 0
    opts = {"fallback": "seed", "jobs": 1}
    assert seen == [([batch.file_need([p], opts, "compressed") for p in photos], 5 << 30),
                    ([batch.file_need(p, {"jobs": 1}, "decompressed") for p in sfc], 5 << 30)]
    for p in photos:
        assert same_pixels(p, tmp_path / "y" / p.name)


def test_a_files_memory_estimate(tmp_path):
    """file_need: the process, torch and a model where they load, the seed codec's part (at most
    1024x1024 pixels) once per process coding parts, the whole image's arrays (16-bit: its low bits too)."""
    MiB, part = 1 << 20, batch.CODING_BYTES_PER_PIXEL
    big = tmp_path / "big.png"
    Image.new("RGB", (2000, 1500), (9, 99, 199)).save(big)  # 2 x 2 parts of up to 1024x1024
    deep = tmp_path / "deep.png"
    Image.fromarray(np.full((1500, 2000), 40000, np.uint16)).save(deep)  # 16-bit grey
    base = batch.PROCESS_BYTES + batch.IMAGE_BYTES_PER_PIXEL * 3_000_000
    seed = {"fallback": "seed", "jobs": 1}
    assert batch.file_need([big], seed, "compressed") == base + part["compressed"] * MiB
    assert batch.file_need([big], {**seed, "jobs": 3}, "verified") == base + 3 * part["verified"] * MiB  # as compress
    assert batch.file_need([big], {**seed, "fallback": "auto"}, "compressed") == (
        base + batch.MODEL_BYTES + part["compressed"] * MiB)
    assert batch.file_need([big], {**seed, "jobs": 3}, "compressed") == base + 3 * part["compressed"] * MiB
    assert batch.file_need([big], {**seed, "jobs": 8}, "compressed") == base + 4 * part["compressed"] * MiB
    assert batch.file_need([deep], seed, "compressed") == (
        base + batch.DEEP_BYTES_PER_PIXEL * 3_000_000 + part["compressed"] * MiB)
    small = _image(tmp_path / "s.png", 4, (60, 40))
    assert batch.file_need([small], {**seed, "jobs": 2}, "compressed") == (  # the encoder's two analyses
        batch.PROCESS_BYTES + (batch.IMAGE_BYTES_PER_PIXEL + 2 * part["compressed"]) * 2_400)
    assert sfcodec("compress", small, "-o", tmp_path / "s.sfc", *SEED, "-q").exit_code == 0
    assert batch.file_need(tmp_path / "s.sfc", {"jobs": 2}, "decompressed") == (  # one part, no model
        batch.PROCESS_BYTES + (batch.IMAGE_BYTES_PER_PIXEL + part["decompressed"]) * 2_400)
    three = [_image(tmp_path / f"t{k}.png", k, (60, 40)) for k in range(3)]
    assert sfcodec("compress", *three, "-o", tmp_path / "t.sfc", *SEED, "-q").exit_code == 0
    assert batch.file_need(tmp_path / "t.sfc", {"jobs": 2}, "decompressed") == (  # three images' pixels
        batch.PROCESS_BYTES + (batch.IMAGE_BYTES_PER_PIXEL + part["decompressed"]) * 7_200)
    small16 = tmp_path / "s16.png"
    Image.fromarray(np.random.default_rng(6).integers(0, 1 << 16, (40, 60)).astype(np.uint16)).save(small16)
    assert sfcodec("compress", small16, "-o", tmp_path / "s16.sfc", *SEED, "-q").exit_code == 0
    assert batch.file_need(tmp_path / "s16.sfc", {"jobs": 1}, "decompressed") == (  # its low bits too
        batch.PROCESS_BYTES + (batch.IMAGE_BYTES_PER_PIXEL + batch.DEEP_BYTES_PER_PIXEL + part["decompressed"]) * 2_400)
    (tmp_path / "x.png").write_text("not an image")
    for p in (tmp_path / "x.png", tmp_path / "missing.png"):
        assert batch.file_need([p], seed, "compressed") == batch.PROCESS_BYTES  # fails at once in its worker
    assert batch.file_need(tmp_path / "x.png", seed, "decompressed") == batch.PROCESS_BYTES


def _pid(x):
    return os.getpid(), os.environ.get("OMP_NUM_THREADS")


def _threads(x):
    import torch

    return torch.get_num_threads()


def test_each_yields_every_result_from_other_processes():
    got = dict(workers.each(_pid, [(k,) for k in range(5)], 2))
    assert sorted(got) == list(range(5)) and os.getpid() not in {p for p, _ in got.values()}
    assert list(workers.each(_pid, [(0,)], 4)) == [(0, _pid(0))]  # one item: this process
    pytest.importorskip("torch")  # loaded here: a forked worker's torch runs one thread (OpenMP after fork)
    if workers.forks():
        assert {t for _, t in workers.each(_threads, [(0,), (1,)], 2)} == {1}


def test_a_failing_file_is_one_line_and_the_others_go_on(photos, tmp_path):
    """Not an image, an output that exists (left untouched), a corrupt .sfc: each one line naming the
    file, the rest written, exit code the first failure's in the inputs' order."""
    bad = tmp_path / "in" / "notes.png"
    bad.write_text("not an image")
    d = tmp_path / "sfc"
    d.mkdir()
    (d / "b.sfc").write_bytes(b"keep me")
    r = sfcodec("compress", photos[0], bad, *photos[1:], "-d", d, *SEED, "--jobs", "2")
    assert r.exit_code == EXIT["image"], r.stderr
    errs = [ln for ln in lines(r) if "error" in ln]
    assert len(errs) == 2 and "Traceback" not in r.output
    assert any("notes.png" in e and "not an image" in e for e in errs)
    assert any("b.sfc" in e and "exists" in e for e in errs)
    assert lines(r)[-1].startswith("sfcodec: 2 of 4 file(s) failed; the first,") and "notes.png" in lines(r)[-1]
    assert (d / "b.sfc").read_bytes() == b"keep me" and (d / "a.sfc").is_file() and (d / "c.sfc").is_file()
    assert not (d / "notes.sfc").exists() and len(list(d.iterdir())) == 3  # no temporary file left
    r = sfcodec("compress", *photos, "-d", d, *SEED, "--force", "-q")  # --force: written over
    assert r.exit_code == 0 and r.stderr == "" and (d / "b.sfc").read_bytes()[:4] != b"keep"
    (d / "a.sfc").write_bytes((d / "a.sfc").read_bytes()[:-9])  # truncated
    back = tmp_path / "back"
    r = sfcodec("decompress", *sorted(d.iterdir()), "-d", back, "-q")
    assert r.exit_code == EXIT["sfc"]
    assert len(lines(r)) == 2 and "a.sfc" in lines(r)[0] and "failed" in lines(r)[1]
    assert sorted(x.name for x in back.iterdir()) == ["b.png", "c.tif"]


def test_a_single_file_fails_as_with_o(photos, tmp_path):
    """One input with -d fails as -o does: one line, its exit code, no total. A directory where the
    output would go is refused (never written into)."""
    bad = tmp_path / "x.png"
    bad.write_text("no")
    r = sfcodec("compress", bad, "-d", tmp_path / "out", *SEED)
    assert r.exit_code == EXIT["image"] and len(lines(r)) == 1 and lines(r)[0].startswith("sfcodec: error: ")
    s = tmp_path / "a.sfc"
    assert sfcodec("compress", photos[0], "-o", s, *SEED, "-q").exit_code == 0
    (tmp_path / "back" / "a.png").mkdir(parents=True)
    for flag in ("--force", "--skip-existing"):  # not an output that exists: not skipped either
        r = sfcodec("decompress", s, "-d", tmp_path / "back", flag)
        assert r.exit_code == EXIT["exists"] and len(lines(r)) == 1 and "is a directory" in lines(r)[0]
    assert list((tmp_path / "back" / "a.png").iterdir()) == []


def test_folders_a_run_makes_and_writes_nothing_into_go_again(photos, tmp_path):
    """-d DIR (and -r's subfolders under it) is made before the files run; where every file in one fails,
    the run leaves no empty folder behind (before 0.9.37 it did). A folder that was there stays, and so
    does one that a file was written into."""
    bad = [tmp_path / "in" / "notes.png", tmp_path / "in" / "todo.png"]
    for b in bad:
        b.write_text("not an image")
    out = tmp_path / "new" / "deeper"
    for jobs in ("1", "2"):
        r = sfcodec("compress", *bad, "-d", out, *SEED, "--jobs", jobs)
        assert r.exit_code == EXIT["image"] and len(lines(r)) == 4, r.stderr
        assert not (tmp_path / "new").exists()
    r = sfcodec("compress", bad[0], "-d", out, *SEED)  # one file: as -o
    assert r.exit_code == EXIT["image"] and not (tmp_path / "new").exists()
    keep = tmp_path / "keep"
    keep.mkdir()
    assert sfcodec("compress", *bad, "-d", keep, *SEED).exit_code == EXIT["image"]
    assert keep.is_dir() and list(keep.iterdir()) == []
    assert sfcodec("compress", bad[0], photos[0], "-d", out, *SEED).exit_code == EXIT["image"]
    assert sorted(x.name for x in out.iterdir()) == ["a.sfc"]
    f = tmp_path / "tree"  # -r: a subfolder whose files all fail goes, the others stay
    (f / "sub").mkdir(parents=True)
    (f / "ok").mkdir()
    (f / "sub" / "x.png").write_text("not an image")
    _image(f / "ok" / "y.png", 4)
    r = sfcodec("compress", f, "-r", "-d", tmp_path / "tree-sfc", *SEED, "-q")
    assert r.exit_code == EXIT["image"], r.stderr
    assert sorted(str(x.relative_to(tmp_path / "tree-sfc")) for x in (tmp_path / "tree-sfc").rglob("*")) == [
        "ok", "ok/y.sfc"]


@pytest.mark.parametrize("args, words", [
    (["compress", "{a}", "{b}", *SEED], "either -o"),                             # neither -o nor -d
    (["compress", "{a}", "-o", "{t}/x.sfc", "-d", "{t}/d", *SEED], "either -o"),  # both
    (["compress", "{a}", "{a2}", "-d", "{t}/d", *SEED], "both be written"),       # a.png and sub/a.png
    (["compress", "{a}", "{a}", "-d", "{t}/d", *SEED], "both be written"),        # the same file twice
    (["compress", "{a}", "{A}", "-d", "{t}/d", *SEED], "both be written"),        # a.png, sub/A.PNG: one file on macOS
    (["compress", "{a}", "-d", "{a}", *SEED], "not a directory"),                 # -d names a file
    (["decompress", "{s}", "{s}", "-o", "{t}/x.png"], "-d dir"),                  # several .sfc, one -o
    (["decompress", "{s}", "-o", "{t}/x.png", "--format", "tif"], "--format goes with -d"),
])
def test_usage_errors_are_refused_before_anything_runs(photos, tmp_path, args, words):
    sub = tmp_path / "sub"
    sub.mkdir()
    a2 = _image(sub / "a.png", 9)
    big_a = _image(sub / "A.PNG", 10)
    s = tmp_path / "a.sfc"
    assert sfcodec("compress", photos[0], "-o", s, *SEED, "-q").exit_code == 0
    before = sorted(tmp_path.rglob("*"))
    fill = {"a": photos[0], "b": photos[1], "a2": a2, "A": big_a, "t": tmp_path, "s": s}
    r = sfcodec(*[x.format(**fill) for x in args])
    assert r.exit_code == EXIT["usage"], r.stderr
    assert len(lines(r)) == 1 and words.lower() in lines(r)[0].lower() and "Traceback" not in r.output
    assert sorted(tmp_path.rglob("*")) == before  # nothing written, no directory made


def test_a_file_of_several_images_decompresses_into_its_own_directory(photos, tmp_path):
    """decompress -d: DIR/<stem>.png for a file of one image, DIR/<stem>/ (the images' names, the format
    asked) for a file of several."""
    one, many = tmp_path / "one.sfc", tmp_path / "many.sfc"
    assert sfcodec("compress", photos[0], "-o", one, *SEED, "-q").exit_code == 0
    assert sfcodec("compress", *photos, "-o", many, *SEED, "-q").exit_code == 0
    d = tmp_path / "d"
    r = sfcodec("decompress", one, many, "-d", d, "--format", "tif", "--jobs", "1")
    assert r.exit_code == 0, r.stderr
    assert sorted(str(x.relative_to(d)) for x in d.rglob("*")) == [
        "many", "many/a.tif", "many/b.tif", "many/c.tif", "one.tif"]
    assert same_pixels(photos[0], d / "one.tif") and same_pixels(photos[2], d / "many" / "c.tif")
    assert "3 image(s)" not in lines(r)[-1] and "4 image(s)" in lines(r)[-1]


def test_a_model_coded_file_in_a_batch(tmp_path):
    """Files of the model's stream, coded in worker processes (forked from this one, torch loaded: one
    thread each), are the bytes `-o` makes and decode identical."""
    pytest.importorskip("torch")
    from coding_models import tiny_model_file

    mpath = tiny_model_file(tmp_path / "tiny.safetensors", 0)
    ins = [_image(tmp_path / f"m{k}.png", k, (64, 32)) for k in range(2)]
    opts = ("--model", mpath, "--fallback", "off", "--steps", "4")
    d = tmp_path / "d"
    r = sfcodec("compress", *ins, "-d", d, *opts, "--jobs", "2")
    assert r.exit_code == 0, r.stderr
    for p in ins:
        alone = tmp_path / f"{p.stem}.alone.sfc"
        assert sfcodec("compress", p, "-o", alone, *opts, "-q").exit_code == 0
        assert (d / f"{p.stem}.sfc").read_bytes() == alone.read_bytes()
    back = tmp_path / "back"
    r = sfcodec("decompress", *sorted(d.iterdir()), "-d", back, "--model", mpath, "--jobs", "2", "-q")
    assert r.exit_code == 0, r.stderr
    for p in ins:
        assert same_pixels(p, back / p.name)


def test_a_folder_gives_its_images_and_r_its_subfolders(tmp_path):
    """compress FOLDER -d DIR: the image files in it (any case of suffix; not hidden files, not other
    files); -r: its subfolders too, mirrored under DIR; decompress -d -r takes the .sfc files back the
    same way. A folder without images, -r without -d, a folder given to -o: one line, nothing written."""
    f = tmp_path / "photos"
    (f / "trip" / "day2").mkdir(parents=True)
    (f / ".cache").mkdir()
    ins = [_image(f / "a.png", 1), _image(f / "B.TIF", 2), _image(f / "trip" / "c.png", 3),
           _image(f / "trip" / "day2" / "d.png", 4)]
    _image(f / ".hidden.png", 5)
    _image(f / ".cache" / "e.png", 6)
    (f / "notes.txt").write_text("not an image, not taken")
    d = tmp_path / "sfc"
    r = sfcodec("compress", f, "-d", d, *SEED, "-q")
    assert r.exit_code == 0, r.stderr
    assert sorted(str(x.relative_to(d)) for x in d.rglob("*")) == ["B.sfc", "a.sfc"]
    r = sfcodec("compress", f, "-d", d, "-r", *SEED, "-q", "--force")
    assert r.exit_code == 0, r.stderr
    assert sorted(str(x.relative_to(d)) for x in d.rglob("*.sfc")) == [
        "B.sfc", "a.sfc", "trip/c.sfc", "trip/day2/d.sfc"]
    back = tmp_path / "back"
    r = sfcodec("decompress", d, "-d", back, "-r", "--jobs", "2", "-q")
    assert r.exit_code == 0, r.stderr
    for p in ins:
        assert same_pixels(p, back / p.relative_to(f).with_suffix(p.suffix.lower()))  # B.TIF back as B.tif
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    _image(empty / "sub" / "x.png", 7)
    before = sorted(tmp_path.rglob("*"))
    for args, words in ((["compress", empty, "-d", tmp_path / "o1", *SEED], "no image files in the folder (-r"),
                        (["decompress", f, "-d", tmp_path / "o2", "-r"], "no .sfc files"),
                        (["compress", f, "-o", tmp_path / "x.sfc", "-r", *SEED], "-r goes with -d"),
                        (["compress", f, "-o", tmp_path / "x.sfc", *SEED], "is a directory, not an image (-d"),
                        (["decompress", d, "-o", tmp_path / "x.png"], "is a directory (-d dir decodes")):
        r = sfcodec(*args)
        assert r.exit_code in (EXIT["usage"], EXIT["image"], EXIT["sfc"]) and len(lines(r)) == 1, r.stderr
        assert words.lower() in lines(r)[0].lower(), lines(r)
    assert sorted(tmp_path.rglob("*")) == before


def test_a_folders_camera_raw_files_are_left_out_with_a_warning(tmp_path):
    """A folder of pictures as raw and JPEG: -d codes the images, and one warning line counts the raw files
    left out (sfcodec does not read them); a folder of raw files alone is one error line saying why."""
    f = tmp_path / "card"
    f.mkdir()
    _image(f / "p1.jpg", 1)
    for name in ("p1.NEF", "p2.nef", "p3.dng"):
        (f / name).write_bytes(b"a camera's raw data")
    r = sfcodec("compress", f, "-d", tmp_path / "out", *SEED)
    assert r.exit_code == 0, r.stderr
    assert [ln for ln in lines(r) if "warning" in ln] == [
        f"sfcodec: warning: {f}: 3 camera raw file(s), which sfcodec does not read: develop them into 16-bit TIFFs "
        "or PNGs first; left out"]
    assert sorted(x.name for x in (tmp_path / "out").iterdir()) == ["p1.sfc"]
    r = sfcodec("compress", f, "-d", tmp_path / "out", *SEED, "-q", "--force")
    assert r.exit_code == 0 and r.stderr == ""  # -q: no warning either
    (f / "p1.jpg").unlink()
    r = sfcodec("compress", f, "-d", tmp_path / "out2", *SEED)
    assert r.exit_code == EXIT["usage"] and len(lines(r)) == 1
    assert "no image files in the folder" in r.stderr and "3 camera raw file(s)" in r.stderr
    assert not (tmp_path / "out2").exists()


def test_skip_existing_resumes_a_stopped_run(photos, tmp_path):
    """--skip-existing: a file whose output exists is left as it is (not coded again), the others are
    coded, exit 0, the total counts the skipped; it contradicts --force and needs -d."""
    d = tmp_path / "sfc"
    assert sfcodec("compress", *photos, "-d", d, *SEED, "-q").exit_code == 0
    kept = {p.name: p.stat().st_mtime_ns for p in d.iterdir()}
    (d / "b.sfc").unlink()
    (d / "c.sfc").write_bytes(b"an older file, left alone")
    r = sfcodec("compress", *photos, "-d", d, *SEED, "--skip-existing")
    assert r.exit_code == 0, r.stderr
    assert "2 skipped: their output exists" in lines(r)[-1] and "1 of 3 file(s) compressed" in lines(r)[-1]
    assert len(lines(r)) == 2 and "b.sfc" in lines(r)[0]
    assert (d / "a.sfc").stat().st_mtime_ns == kept["a.sfc"] and (d / "c.sfc").read_bytes().startswith(b"an older")
    back = tmp_path / "back"
    assert sfcodec("decompress", d / "a.sfc", "-d", back, "-q").exit_code == 0
    r = sfcodec("decompress", d / "a.sfc", d / "b.sfc", "-d", back, "--skip-existing", "-q")
    assert r.exit_code == 0 and r.stderr == "" and sorted(p.name for p in back.iterdir()) == ["a.png", "b.png"]
    r = sfcodec("decompress", d / "a.sfc", "-d", back, "--skip-existing")  # one file: still says so
    assert r.exit_code == 0 and "1 skipped" in r.stderr
    for args, words in ((["--skip-existing", "--force"], "contradict"), (["-o", tmp_path / "x.sfc", "--skip-existing"],
                                                                          "goes with -d")):
        r = sfcodec("compress", photos[0], *SEED, *(["-d", d] if "-o" not in args else []), *args)
        assert r.exit_code == EXIT["usage"] and len(lines(r)) == 1 and words in lines(r)[0], r.stderr


def test_info_of_several_files(photos, tmp_path):
    """info a.sfc b.sfc ...: each file's lines (a blank line between); one that cannot be read is an
    error line naming it, the others are still shown, exit code the first such file's; --json: a list."""
    d = tmp_path / "sfc"
    assert sfcodec("compress", *photos, "-d", d, *SEED, "-q").exit_code == 0
    bad = tmp_path / "bad.sfc"
    bad.write_bytes(b"not a .sfc file at all")
    one = sfcodec("info", d / "a.sfc")
    assert one.exit_code == 0
    r = sfcodec("info", bad, d / "a.sfc", tmp_path / "missing.sfc", d / "c.sfc")
    assert r.exit_code == EXIT["sfc"]
    errs = lines(r)
    assert len(errs) == 2 and "bad.sfc" in errs[0] and "missing.sfc: no such file" in errs[1]
    blocks = r.stdout.split("\n\n")  # a blank line between the files shown, none before the first
    assert len(blocks) == 2 and blocks[0] + "\n" == one.stdout and f"file:      {d / 'c.sfc'}" in blocks[1]
    r = sfcodec("info", d / "a.sfc", d / "b.sfc", "--json")
    listed = json.loads(r.stdout)
    assert r.exit_code == 0 and [x["file"] for x in listed] == [str(d / "a.sfc"), str(d / "b.sfc")]
    assert listed[0]["header"] == json.loads(sfcodec("info", d / "a.sfc", "--json").stdout)
    # a folder stands for its .sfc files (0.9.32; before: "is a directory"), -r its subfolders' too; --json a list
    (d / "sub").mkdir()
    (d / "a.sfc").rename(d / "sub" / "a.sfc")
    (d / ".hidden.sfc").write_bytes(b"junk")
    (d / "notes.txt").write_text("not a .sfc")
    r = sfcodec("info", d)
    assert r.exit_code == 0 and r.stdout.count("file:      ") == 2 and r.stdout.startswith(f"file:      {d / 'b.sfc'}")
    for args, names in (([d], ["b.sfc", "c.sfc"]), ([d, "-r"], ["b.sfc", "c.sfc", "sub/a.sfc"]),
                        ([d / "sub"], ["sub/a.sfc"])):
        r = sfcodec("info", *args, "--json")
        assert r.exit_code == 0 and [x["file"] for x in json.loads(r.stdout)] == [str(d / n) for n in names], r.output
    (tmp_path / "none").mkdir()
    r = sfcodec("info", tmp_path / "none")
    assert r.exit_code == EXIT["usage"] and lines(r) == [f"sfcodec: error: {tmp_path / 'none'}: no .sfc files in the "
                                                         "folder (-r: its subfolders too)"]


def test_a_16_bit_tiff_output_keeps_the_exif_and_xmp(tmp_path):
    """A 16-bit image with EXIF (its Exif directory too) and XMP decompressed to .tif (deep.encode_tiff)
    and to .png: both kept, no warning."""
    from scoreflow_codec import images

    exif = Image.Exif()
    exif[0x010F] = "Camera"
    exif.get_ifd(0x8769)[0x9003] = "2024:01:02 03:04:05"
    src = images.from_array(np.random.default_rng(3).integers(0, 65536, (9, 11, 3), dtype=np.uint16))
    src.metadata = {"exif": exif.tobytes()[6:], "xmp": b"<x:xmpmeta>deep</x:xmpmeta>"}
    p = tmp_path / "deep.png"
    p.write_bytes(images.encode_source(src, ".png"))
    s = tmp_path / "deep.sfc"
    assert sfcodec("compress", p, "-o", s, *SEED, "-q").exit_code == 0
    for suffix in (".tif", ".png"):
        r = sfcodec("decompress", s, "-o", tmp_path / f"back{suffix}")
        assert r.exit_code == 0 and "warning" not in r.stderr, r.stderr
        back = images.load_image(tmp_path / f"back{suffix}")
        assert back.metadata["xmp"] == src.metadata["xmp"]
        e = Image.Exif()
        e.load(b"Exif\0\0" + back.metadata["exif"])
        assert e[0x010F] == "Camera" and e.get_ifd(0x8769) == {0x9003: "2024:01:02 03:04:05"}
        assert np.array_equal(images.to_array(back), images.to_array(src))


def test_decompress_gives_each_image_back_in_its_inputs_format(tmp_path):
    """0.9.31: without --format, decompress -d (and -o DIR of a file of several images) writes each image in
    its input's format where that is lossless and holds it (TIFF, WebP, BMP, PPM, PNG: the suffix in lower
    case), else PNG (a JPEG's, a GIF's, an image from standard input); --format chooses one for all; a
    16-bit TIFF comes back as a TIFF; --skip-existing finds the outputs by those names."""
    from deep_files import tiff16_by_hand

    src = tmp_path / "in"
    src.mkdir()
    ins = [_image(src / "a.TIF", 1), _image(src / "b.webp", 2), _image(src / "c.bmp", 3), _image(src / "d.ppm", 4),
           _image(src / "e.png", 5, mode="LA"), _image(src / "f.jpg", 6), _image(src / "g.gif", 7, mode="P")]
    (src / "h.tif").write_bytes(tiff16_by_hand(np.random.default_rng(8).integers(0, 65536, (5, 6, 3), dtype=np.uint16)))
    sfc = tmp_path / "sfc"
    assert sfcodec("compress", src, "-d", sfc, *SEED, "-q").exit_code == 0
    back = tmp_path / "back"
    r = sfcodec("decompress", sfc, "-d", back, "-q")
    assert r.exit_code == 0, r.stderr
    names = ["a.tif", "b.webp", "c.bmp", "d.ppm", "e.png", "f.png", "g.png"]
    assert sorted(x.name for x in back.iterdir()) == names + ["h.tif"]
    for p, name, fmt in zip(ins, names, ("TIFF", "WEBP", "BMP", "PPM", "PNG", "PNG", "PNG")):
        with Image.open(back / name) as im:
            assert im.format == fmt, name
        assert same_pixels(p, back / name), name
    deep_back, deep_in = images.load_image(back / "h.tif"), images.load_image(src / "h.tif")
    assert deep_back.mode == "RGB;16" and np.array_equal(images.to_array(deep_back), images.to_array(deep_in))
    r = sfcodec("decompress", sfc, "-d", back, "--skip-existing")
    assert r.exit_code == 0 and "0 of 8 file(s) decompressed" in r.stderr and "(8 skipped" in r.stderr, r.stderr
    r = sfcodec("decompress", sfc / "a.sfc", sfc / "b.sfc", "-d", tmp_path / "png", "--format", "png", "-q")
    assert r.exit_code == 0 and sorted(x.name for x in (tmp_path / "png").iterdir()) == ["a.png", "b.png"]
    # a file of several images, into a directory: each its own format
    assert sfcodec("compress", ins[0], ins[5], ins[1], "-o", tmp_path / "set.sfc", *SEED, "-q").exit_code == 0
    assert sfcodec("decompress", tmp_path / "set.sfc", "-o", tmp_path / "set", "-q").exit_code == 0
    assert sorted(x.name for x in (tmp_path / "set").iterdir()) == ["a.tif", "b.webp", "f.png"]
    assert sfcodec("decompress", tmp_path / "set.sfc", "-d", tmp_path / "d2", "-q").exit_code == 0
    assert sorted(x.name for x in (tmp_path / "d2" / "set").iterdir()) == ["a.tif", "b.webp", "f.png"]
    assert sfcodec("decompress", tmp_path / "set.sfc", "-d", tmp_path / "d3", "--format", "bmp", "-q").exit_code == 0
    assert sorted(x.name for x in (tmp_path / "d3" / "set").iterdir()) == ["a.bmp", "b.bmp", "f.bmp"]


def test_same_format():
    """images.same_format: the input's suffix where its format is lossless and holds the mode, else .png."""
    same = images.same_format
    assert [same(n, "RGB") for n in ("x.TIF", "x.tiff", "x.webp", "x.bmp", "x.pgm", "x.png", "x.jpg", "x.gif", None,
                                     "noext", "x.tif.jpeg")] == [
        ".tif", ".tiff", ".webp", ".bmp", ".pgm", ".png", ".png", ".png", ".png", ".png", ".png"]
    assert same("x.webp", "L") == ".png" and same("x.webp", "RGBA") == ".webp" and same("x.bmp", "LA") == ".png"
    assert same("x.bmp", "RGBA") == ".png"  # 0.10.6: Pillow's BMP writer puts alpha where readers ignore it
    assert same("x.ppm", "P") == ".png" and same("x.tif", "PA") == ".tif"
    assert same("x.tif", "RGB;16") == ".tif" and same("x.tif", "LA;16") == ".png" and same("x.webp", "RGB;16") == ".png"


def test_verify_of_a_folder_checks_each_image_alone(photos, tmp_path):
    """0.9.33: verify FOLDER (-r: its subfolders too) or --each: each image coded alone, as compress -d codes
    it (the same bytes), and decoded in memory, in parallel processes: a line per image on standard output
    naming it, the total on standard error, nothing written; a file that fails is one error line and the
    others go on, exit code the first failure's; --json: a list, an object per image (a failure's with its
    error). Several files without --each are still one stream."""
    alone = {}
    for p in photos:
        out = tmp_path / f"{p.stem}.sfc"
        assert sfcodec("compress", p, "-o", out, *SEED, "-q").exit_code == 0
        alone[str(p)] = len(out.read_bytes())
    folder = photos[0].parent
    (folder / "notes.txt").write_text("not an image, not taken")
    before = sorted(tmp_path.rglob("*"))
    for jobs in ("1", "2"):
        r = sfcodec("verify", folder, *SEED, "--jobs", jobs)
        assert r.exit_code == 0, r.stderr
        out = [ln for ln in r.stdout.split("\n") if ln]  # in the order they end
        assert {ln.split(": OK: ")[0]: int(ln.split(" -> ")[1].split(" bytes")[0]) for ln in out} == alone
        assert len(out) == 3 and all("; pixels identical" in ln for ln in out)
        assert lines(r) == [lines(r)[0]] and f"3 of 3 file(s) verified: {sum(alone.values())} bytes" in lines(r)[0]
    r = sfcodec("verify", *photos[:2], *SEED, "--each", "--json")
    assert r.exit_code == 0 and r.stderr == ""
    got = json.loads(r.stdout)
    assert [(o["file"], o["bytes"], o["images"], o["identical"]) for o in got] == [
        (str(p), alone[str(p)], 1, True) for p in photos[:2]]
    one = json.loads(sfcodec("verify", *photos[:2], *SEED, "--json").stdout)  # one stream, as before
    assert one["images"] == 2 and "file" not in one
    sub = folder / "sub"
    sub.mkdir()
    deep = _image(sub / "d.png", 8)
    bad = _image(folder / "bad.png", 9)
    bad.write_bytes(bad.read_bytes()[:60])  # cut short
    r = sfcodec("verify", folder, "-r", *SEED, "--json", "--jobs", "2")
    assert r.exit_code == EXIT["image"]
    got = json.loads(r.stdout)
    assert [o["file"] for o in got] == sorted(str(p) for p in [*photos, bad, deep])
    failed = [o for o in got if not o["identical"]]
    assert len(failed) == 1 and failed[0]["file"] == str(bad) and failed[0]["exit_code"] == EXIT["image"]
    errs = [ln for ln in lines(r) if "error" in ln]
    assert len(errs) == 1 and str(bad) in errs[0] and errs[0] == failed[0]["error"] and "Traceback" not in r.output
    assert lines(r)[-1].startswith("sfcodec: 1 of 5 file(s) failed; the first,")
    bad.unlink()
    sub.joinpath("d.png").unlink()
    assert sorted(tmp_path.rglob("*")) == sorted(before + [sub])  # nothing written but the test's own
    empty = tmp_path / "empty"
    empty.mkdir()
    for args, words in (([empty], "no image files in the folder (-r"), ([folder, "-"], "- (an image on standard input)"),
                        (["-", "--each"], "goes alone")):
        r = sfcodec("verify", *args, *SEED)
        assert r.exit_code == EXIT["usage"] and len(lines(r)) == 1 and words in lines(r)[0], r.output


def test_verify_each_says_which_image_did_not_come_back(photos, monkeypatch):
    """A decode that differs, in verify's per-image mode: one error line naming the image (exit 7), the
    others still verified."""
    from scoreflow_codec import api

    real = api.decompress

    def flip(data, *a, **k):  # the second image's decode comes back with a pixel changed
        out = real(data, *a, **k)
        if out[0].size == (40, 9):
            out[0].color[0, 0, 0] ^= 1
        return out
    monkeypatch.setattr(api, "decompress", flip)
    r = sfcodec("verify", *photos, *SEED, "--each", "--jobs", "1")
    assert r.exit_code == 7
    errs = [ln for ln in lines(r) if "error" in ln]
    assert len(errs) == 1 and str(photos[1]) in errs[0] and "Traceback" not in r.output
    assert [ln.split(": OK: ")[0] for ln in r.stdout.split("\n") if ln] == [str(photos[0]), str(photos[2])]
