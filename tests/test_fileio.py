"""No data loss: atomic_write leaves either the old file or the complete new one, never a part."""
import os
import stat
from pathlib import Path

import pytest

from scoreflow_codec import fileio
from scoreflow_codec.fileio import atomic_write


def _names(d):
    return sorted(p.name for p in d.iterdir())


def test_writes_and_replaces(tmp_path):
    p = tmp_path / "out.sfc"
    atomic_write(p, b"one")
    atomic_write(p, b"two")
    assert p.read_bytes() == b"two" and _names(tmp_path) == ["out.sfc"]
    mask = os.umask(0o022)
    os.umask(mask)
    assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~mask  # not mkstemp's 0600


@pytest.mark.parametrize("where", ["write", "fsync", "replace", "interrupt"])
def test_a_failure_leaves_the_old_file_and_no_temp(tmp_path, monkeypatch, where):
    p = tmp_path / "out.png"
    p.write_bytes(b"precious")
    data = b"new contents"
    if where == "write":
        data = object()  # the write itself raises (TypeError) after the temp file exists
    elif where == "fsync":
        monkeypatch.setattr(fileio.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(28, "No space left")))
    elif where == "replace":
        monkeypatch.setattr(fileio.os, "replace", lambda a, b: (_ for _ in ()).throw(PermissionError(13, "denied")))
    else:
        monkeypatch.setattr(fileio.os, "fsync", lambda fd: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises((OSError, TypeError, KeyboardInterrupt)):
        atomic_write(p, data)  # type: ignore[arg-type]
    assert p.read_bytes() == b"precious"
    assert _names(tmp_path) == ["out.png"]


def test_a_failure_with_no_old_file_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(fileio.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(5, "I/O error")))
    with pytest.raises(OSError):
        atomic_write(tmp_path / "new.sfc", b"x" * 100_000)
    assert _names(tmp_path) == []


def test_missing_directory_is_an_error_not_a_partial_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        atomic_write(tmp_path / "no" / "out.sfc", b"x")
    assert _names(tmp_path) == []


def test_the_modification_time_given_is_the_files_from_the_start(tmp_path, monkeypatch):
    """mtime_ns: set on the temporary file before the rename, so the file never appears with another."""
    t = 981_173_106_123_456_789  # 2001-02-03
    seen = []
    real = os.replace

    def replace(src, dst):
        seen.append(os.stat(src).st_mtime_ns)
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    atomic_write(tmp_path / "f", b"x", mtime_ns=t)
    assert seen == [t] and (tmp_path / "f").stat().st_mtime_ns == t and (tmp_path / "f").read_bytes() == b"x"
    atomic_write(tmp_path / "g", b"y")
    assert abs((tmp_path / "g").stat().st_mtime_ns - seen[-1]) < 10**9 and seen[-1] != t  # now


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes (POSIX)")
def test_a_pipe_is_written_into_not_replaced(tmp_path):
    """is_special: a FIFO (or a device such as /dev/null) is, a file, a folder, a missing path are not;
    atomic_write writes into a FIFO and leaves it a FIFO, with no temporary file beside it."""
    import threading

    fifo, plain = tmp_path / "pipe", tmp_path / "plain"
    os.mkfifo(fifo)
    plain.write_bytes(b"")
    assert fileio.is_special(fifo) and fileio.is_special(os.devnull)
    assert not any(map(fileio.is_special, (plain, tmp_path, tmp_path / "missing")))
    got = []
    t = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    t.start()
    atomic_write(fifo, b"through the pipe", mtime_ns=10**18)
    t.join(5)
    assert got == [b"through the pipe"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and _names(tmp_path) == ["pipe", "plain"]


def test_a_block_device_is_refused(tmp_path, monkeypatch):
    """A disk or partition (is_block_device) is neither written into nor replaced: PermissionError, the
    path untouched. A plain file stands in for the device here (writing to a real one is what is refused)."""
    p = tmp_path / "disk"
    p.write_bytes(b"partition table")
    assert not fileio.is_block_device(p) and not fileio.is_block_device(os.devnull)
    monkeypatch.setattr(fileio, "is_block_device", lambda path: Path(path) == p)
    with pytest.raises(PermissionError, match="block device"):
        atomic_write(p, b"x")
    assert p.read_bytes() == b"partition table" and _names(tmp_path) == ["disk"]
