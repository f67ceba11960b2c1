"""No data loss: atomic_write leaves either the old file or the complete new one, never a part."""
import os
import stat

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
