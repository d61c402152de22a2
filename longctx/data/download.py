"""Fetch and verify raw files: never leave a file that a later run would wrongly trust.

Every download streams into `<dest>.part-<pid>` with a progress bar, is checked (size, then digest)
and only then renamed onto `dest` (`os.replace` is atomic on one filesystem). An interrupted,
truncated or corrupted download leaves at most a `.part` file, which nothing reads.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import urllib.error
import urllib.request
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from tqdm.auto import tqdm

from longctx.data.corpora import Archive, Checksum, Member
from longctx.runtime.atomic import created_dirs, umask_mode

CHUNK = 1 << 20
TIMEOUT_S = 60


class DataError(RuntimeError):
    """A corpus file is missing, cannot be fetched, or fails its checksum."""


class ChecksumError(DataError):
    """A file's digest or size differs from the pinned one."""


def digest(path: Path, algorithm: str) -> str:
    """Hex digest of a file (of its decompressed content for `*.gz`)."""
    h = hashlib.new(algorithm)
    with open_maybe_gz(path) as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def verify(path: Path, checksum: Checksum | None, *, size: int | None = None, what: str = "") -> None:
    """Raise `ChecksumError` naming the file and the fix when `path` does not match."""
    what = what or path.name
    if size is not None and (actual := path.stat().st_size) != size:
        raise ChecksumError(
            f"{what}: {path} has {actual:,} bytes, expected {size:,} (truncated or wrong file); "
            "delete it and download again"
        )
    if checksum is not None and (actual_hex := digest(path, checksum.algorithm)) != checksum.hexdigest:
        raise ChecksumError(
            f"{what}: {path} has {checksum.algorithm} {actual_hex}, expected {checksum.hexdigest}; "
            "the file is corrupt or not the published one: delete it and download again"
        )


@contextmanager
def atomic_path(dest: Path):
    """Yield a temporary path next to `dest`; rename it onto `dest` only if the block succeeds (a
    parent folder created for it is removed again if it fails)."""
    with created_dirs(dest.parent):
        tmp = dest.with_name(f"{dest.name}.part-{os.getpid()}")
        try:
            yield tmp
            os.chmod(tmp, umask_mode())  # the mode a plain open() gives, not a temporary file's
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)


def fetch(
    url: str,
    dest: Path,
    *,
    checksum: Checksum | None = None,
    size: int | None = None,
    what: str = "",
    quiet: bool = False,
) -> Path:
    """Download `url` to `dest` (progress bar unless `quiet`), verify it, rename it into place."""
    what = what or dest.name
    with atomic_path(dest) as tmp:
        try:
            with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response, open(tmp, "wb") as out:
                total = int(response.headers.get("Content-Length") or 0) or size
                with tqdm(
                    total=total, unit="B", unit_scale=True, desc=f"download {what}", disable=quiet
                ) as bar:
                    while block := response.read(CHUNK):
                        out.write(block)
                        bar.update(len(block))
        except (urllib.error.URLError, OSError) as err:
            raise DataError(
                f"{what}: cannot download {url} ({err}). Without network access, fetch the file "
                f"elsewhere and place it at {dest}"
            ) from err
        verify(tmp, checksum, size=size, what=what)
    return dest


def fetch_json(url: str, what: str) -> dict:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            return json.load(response)
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise DataError(f"{what}: cannot read {url} ({err})") from err


def extract_members(archive: Archive, zip_path: Path, folder: Path, what: str) -> None:
    """Extract the archive's members into `folder` (each verified, written atomically)."""
    with zipfile.ZipFile(zip_path) as zf:
        for member in archive.members:
            dest = folder / member.name
            if dest.exists():
                continue
            with atomic_path(dest) as tmp:
                with zf.open(member.archive_path) as src, open(tmp, "wb") as out:
                    shutil.copyfileobj(src, out, CHUNK)
                verify(tmp, member.checksum, what=f"{what} {member.name}")


def existing(folder: Path, name: str) -> Path | None:
    """`folder/name` or its gzipped twin `folder/name.gz`, whichever exists."""
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def open_maybe_gz(path: Path) -> IO[bytes]:
    """Open for binary reading, transparently decompressing `*.gz`."""
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def verify_member(path: Path, member: Member | None, what: str) -> None:
    if member is not None:
        verify(path, member.checksum, what=f"{what} {member.name}")
