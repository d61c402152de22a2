"""Checkpoints written whole or not at all, in their own folder; a full disk is one line.

Lightning's `TorchCheckpointIO` writes a local checkpoint through an fsspec transaction: the bytes go
to a file in the system temp folder, then `shutil.move` puts it in place. When the temp folder and
the checkpoint folder are on different filesystems (the usual case on a cluster: /tmp is local, runs
are on shared storage) the move is a copy onto the final name, so a full disk leaves a truncated
checkpoint under its final name, which `ModelCheckpoint` then announces as the best one.

`AtomicCheckpointIO` (the CLI gives it to every run's strategy) serializes the checkpoint in memory
as Lightning does, writes it to a temporary file in the checkpoint's own folder, syncs it, and
renames it onto the final name (`longctx.runtime.atomic.atomic_path`): a reader sees the old file or the new
one, never part of one. Out of space (ENOSPC, or EDQUOT for a quota) the temporary file is removed
and `DiskFullError` says which file, how much it needs and how much is free. Remote paths
(`s3://...`) keep Lightning's own writer. The run's config (`config.yaml`, the CLI's first file in the
run directory) is written the same way (`write_whole`).
"""

from __future__ import annotations

import errno
import io
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.strategies import Strategy

from longctx.runtime.atomic import atomic_path

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(OSError):
    """A checkpoint did not fit on its disk; nothing was left under its name."""

    def __str__(self) -> str:
        return str(self.strerror)  # the line itself, without OSError's "[Errno 28] "


def readable_size(size: int) -> str:
    """`size` bytes in TB, GB, MB or kB (one decimal), or in bytes."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:,.1f} {unit}"
    return f"{size} bytes"


CHECKPOINT_FIX = (
    "Free some space, or put the run on a larger disk (--trainer.default_root_dir, or the "
    "ModelCheckpoint's dirpath)"
)
RUN_FILE_FIX = "Free some space, or put the run on a larger disk (--trainer.default_root_dir)"


def disk_full(path: Path, size: int, what: str = "checkpoint", fix: str = CHECKPOINT_FIX) -> DiskFullError:
    """The one line for `what` (a checkpoint, the run's config) of `size` bytes that did not fit at
    `path`, with `fix`."""
    folder = next(parent for parent in path.parents if parent.exists())
    free = shutil.disk_usage(folder).free
    return DiskFullError(
        errno.ENOSPC,
        f"disk full writing {what} {path}: it needs {readable_size(size)}, {readable_size(free)} free "
        f"there (or a quota is reached); nothing was written under that name. {fix}",
    )


def write_whole(path: Path, data: bytes | memoryview, what: str, fix: str) -> None:
    """Write `data` to `path` whole or not at all (synced, then renamed into place); out of space, the
    temporary file is removed and `DiskFullError` names `what`, its size, the space free and `fix`."""
    try:
        with atomic_path(path) as tmp, tmp.open("wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())  # the bytes are on disk before the name points at them
    except OSError as err:
        if err.errno in DISK_FULL:
            raise disk_full(path, len(data), what, fix) from None
        raise


class AtomicCheckpointIO(TorchCheckpointIO):
    """`TorchCheckpointIO` whose local files are renamed into place once complete."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None or "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        path = Path(path)
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        write_whole(path, buffer.getbuffer(), "checkpoint", CHECKPOINT_FIX)


def use_atomic_checkpoints(strategy: Strategy) -> None:
    """Give the strategy `AtomicCheckpointIO` unless it was given a checkpoint writer of its own (a
    configured plugin other than Lightning's default `TorchCheckpointIO`)."""
    if type(strategy.checkpoint_io) is TorchCheckpointIO:
        strategy.checkpoint_io = AtomicCheckpointIO()
