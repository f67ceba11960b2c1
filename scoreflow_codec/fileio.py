"""Writing files so that a failure never leaves a partial or half-replaced file behind."""
from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_unfinished: set[str] = set()  # the temporary files atomic_write is writing in this process


def is_special(path: str | os.PathLike) -> bool:
    """Whether path exists and is neither a regular file nor a directory (a device such as /dev/null, a
    FIFO, a socket), after symbolic links."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def is_block_device(path: str | os.PathLike) -> bool:
    """Whether path is a block device (a disk, a partition), after symbolic links: never written to."""
    try:
        return stat.S_ISBLK(os.stat(path).st_mode)
    except OSError:
        return False


def is_read_once(path: str | os.PathLike) -> bool:
    """Whether path is a pipe or a character device (a FIFO, /dev/fd/N from bash's `<(...)`, /dev/stdin),
    which can be read only once: sfcodec reads such an input whole, once. Not a block device (a disk, which
    is read like a file: read whole it would fill the memory)."""
    return is_special(path) and not is_block_device(path)


def remove_unfinished() -> None:
    """Remove the temporary files atomic_write is writing in this process: for a worker process told
    to stop (workers: SIGTERM), which then exits at once, without unwinding."""
    for tmp in list(_unfinished):
        try:
            os.unlink(tmp)
        except OSError:
            pass


def atomic_write(path: str | os.PathLike, data: bytes, mtime_ns: int | None = None) -> None:
    """Write `data` to a temporary file beside `path`, fsync, then rename it over `path`.

    The file gets the permissions a plain open() would give (0666 minus the umask), not
    mkstemp's private 0600; with mtime_ns, that modification (and access) time, set before the rename
    (sfcodec: the input's, as gzip, xz and zstd keep it; 0.9.30).

    A path that is a device or a pipe (/dev/null, a FIFO: is_special) is written into, as cp does, never
    replaced by a file (before 0.9.34, run as root, `-o /dev/null --force` replaced the device with a
    regular file); its dates are left alone. A block device (a disk) is refused: PermissionError.
    """
    path = Path(path)
    if is_block_device(path):  # a disk: neither written into nor replaced (sfcodec refuses it up front)
        raise PermissionError(errno.EPERM, "a block device (a disk or partition): not written to", str(path))
    if is_special(path):
        with open(path, "wb") as f:
            f.write(data)
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    _unfinished.add(tmp)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        if mtime_ns is not None:
            os.utime(tmp, ns=(mtime_ns, mtime_ns))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        _unfinished.discard(tmp)
