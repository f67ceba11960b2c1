"""Errors a user can cause, one type per failure, each with the exit code the CLI uses.

The CLI turns any of these into a one-line message and ``exit_code``; anything else is a bug.
"""
from __future__ import annotations


class SfcError(Exception):
    """Base class of every error a user can cause. Its message is one line whatever it quotes (a .sfc
    header's text, a file name): control characters are shown escaped, a newline as \\n (0.9.32)."""

    exit_code = 1

    def __init__(self, *args):
        super().__init__(*(one_line(a) if isinstance(a, str) else a for a in args))


def one_line(text: str) -> str:
    """text with its control characters (newlines, tabs, escape sequences ...) written as Python escapes."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class UsageError(SfcError):
    """A command line that asks for something the codec cannot do (e.g. a lossy output format)."""

    exit_code = 2


class BadImageError(SfcError):
    """The input is not an image we can read (not an image, truncated, animated...)."""

    exit_code = 3


class UnsupportedImageError(BadImageError):
    """A readable image in a mode or bit depth this codec does not code losslessly."""


class BadFileError(SfcError):
    """A .sfc file that is truncated, corrupt, or not a .sfc file at all."""

    exit_code = 4


class UnsupportedVersionError(BadFileError):
    """A .sfc file written by a newer (or unknown) format version."""


class ModelError(SfcError):
    """A model that cannot be found or loaded."""

    exit_code = 5


class ModelMismatchError(ModelError):
    """A .sfc file made with another model (sha256 differs) or a setup we can't reproduce."""


class OutputExistsError(SfcError):
    """The output path exists and --force was not given (OutputPresentError), or is a directory, an
    input, or in a folder that does not exist."""

    exit_code = 6


class OutputPresentError(OutputExistsError):
    """The output file exists and --force was not given: what `sfcodec -d --skip-existing` skips."""


class WriteError(SfcError):
    """An output that could not be written (a full disk, no permission, a read-only file system): the
    system's reason in one line, exit code 1, and no partial file left (fileio.atomic_write)."""

    exit_code = 1


class DecodeMismatchError(SfcError):
    """Decoding did not reproduce the encoder's pixels (CRC mismatch): nothing is written."""

    exit_code = 7
