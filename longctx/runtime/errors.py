"""One line for every user error: `error: <the problem and the fix>` on stderr, exit status 1.

Every entry point (`python -m longctx ...`, `python -m longctx.sweep`, `python -m longctx.data`,
`python -m longctx.methods.recurrence.export`) reports bad input this way: no usage dump (only
`--help` prints the usage) and no traceback. `LONGCTX_DEBUG=1` in the environment keeps the traceback (and
jsonargparse's full message) for the cases where the line is not enough.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

DEBUG_ENV = "LONGCTX_DEBUG"
# The exit status of a command stopped by Ctrl-C (as a shell reports a process killed by SIGINT).
SIGINT_EXIT_CODE = 128 + signal.SIGINT


def debug_enabled() -> bool:
    """Whether `LONGCTX_DEBUG` asks for tracebacks instead of one-line errors."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def one_line(message: object) -> str:
    """The message with its line breaks and runs of spaces folded into single spaces."""
    return " ".join(str(message).split())


class BadInput(ValueError):
    """A setting, file or command line the user gave that cannot work, found after parsing (e.g. by a
    data stream or an evaluation command); every entry point prints it as its one line."""


class ParseError(ValueError):
    """A command line or config the parser refuses (the message is one line): raised by the CLI's
    parser (`longctx.commands.parse_errors`) and by a class it builds from a config."""


class NotText(BadInput):
    """A file that should be UTF-8 text is not (the message names it, the line and the byte)."""


def read_utf8(path: Path | str, holds: str) -> str:
    """The text of `path`; a file that is not UTF-8 (a binary, a latin-1 file) raises `NotText` naming
    the file, the line and the first bad byte, then what the file should hold (`holds`)."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        bad = data[err.start : err.start + 1]
        raise NotText(
            f"{path} is not UTF-8 text (line {line}: byte {err.start:,} is {bad!r}); {holds}"
        ) from None


def exit_with_error(message: object) -> NoReturn:
    """Exit with status 1 and `error: <message>` as one line on stderr."""
    sys.exit(f"error: {one_line(message)}")


@contextmanager
def reported_as_one_line(*errors: type[BaseException]) -> Iterator[None]:
    """Bad input raised as one of `errors` ends the program with its one line (the traceback only
    with `LONGCTX_DEBUG=1`); any other exception is a bug and keeps its traceback."""
    try:
        yield
    except errors as err:
        if debug_enabled():
            raise
        exit_with_error(err)


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse without the usage dump on bad arguments: one `error:` line naming `--help`."""

    def error(self, message: str) -> NoReturn:
        if debug_enabled():
            super().error(message)
        exit_with_error(f"{message} (`{self.prog} --help` shows the usage)")
