"""Files that appear whole or not at all, readable as the umask allows.

Every file longctx writes for a person (run records, reports, converted checkpoints, token caches,
downloads) goes through `atomic_path`: the bytes are written to a temporary file in the destination's
own folder and renamed onto the final name only when the write succeeded (`os.replace` is atomic on
one filesystem), so a full disk, a crash or Ctrl-C never leaves a truncated file under a final name.
`tempfile.mkstemp` creates its file with mode 0600; the finished file gets the mode a plain `open`
would have given it (0666 less the umask), so teammates on a shared cluster can read what a run wrote.
Folders are created only for work that succeeds (`created_dirs`): a failed write leaves no empty folder.
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


def unwritable_ancestor(folder: Path | str) -> Path | None:
    """None when `folder` is a folder this process can write in, or can be created in one; else the
    path that stops it: `folder` or the nearest existing path above it, a file or a folder without
    write permission."""
    folder = Path(folder)
    existing = next(path for path in (folder, *folder.parents) if path.exists())
    return None if existing.is_dir() and os.access(existing, os.W_OK | os.X_OK) else existing


@contextmanager
def created_dirs(folder: Path | str) -> Iterator[Path]:
    """Create `folder` and its missing parents for the block; if the block fails, remove the ones
    created here again (those still empty), so failed work leaves no folder behind."""
    folder = Path(folder)
    missing = [path for path in (folder, *folder.parents) if not path.exists()]  # deepest first
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield folder
    except BaseException:
        for path in missing:
            try:
                path.rmdir()
            except OSError:  # not empty (another process wrote there too) or already gone
                break
        raise


@contextmanager
def atomic_path(dest: Path | str) -> Iterator[Path]:
    """Yield a temporary path beside `dest`; rename it onto `dest` only if the block succeeds.

    The temporary file is removed whatever happens; the parent folder is created if missing (and
    removed again if the write fails).
    """
    dest = Path(dest)
    with created_dirs(dest.parent):
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
