"""Files that appear whole or not at all, readable as the umask allows.

Every file longctx writes for a person (run records, reports, converted checkpoints, token caches,
downloads) goes through `atomic_path`: the bytes are written to a temporary file in the destination's
own folder and renamed onto the final name only when the write succeeded (`os.replace` is atomic on
one filesystem), so a full disk, a crash or Ctrl-C never leaves a truncated file under a final name.
`tempfile.mkstemp` creates its file with mode 0600; the finished file gets the mode a plain `open`
would have given it (0666 less the umask), so teammates on a shared cluster can read what a run wrote.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def umask_mode(mode: int = 0o666) -> int:
    """`mode` less the process's umask (the mode `open(path, "w")` would give a new file)."""
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask


@contextmanager
def atomic_path(dest: Path | str) -> Iterator[Path]:
    """Yield a temporary path beside `dest`; rename it onto `dest` only if the block succeeds.

    The temporary file is removed whatever happens; the parent folder is created if missing.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, umask_mode())
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(dest: Path | str, text: str) -> None:
    """Write `text` (UTF-8) to `dest` whole or not at all."""
    with atomic_path(dest) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(dest: Path | str, data: Any) -> None:
    """Write `data` as indented, key-sorted JSON to `dest` whole or not at all."""
    write_text_atomic(dest, json.dumps(data, indent=2, sort_keys=True) + "\n")
