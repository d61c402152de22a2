"""One live command per run directory: an OS lock on `<run dir>/.lock`.

Two commands with the same run name (a resubmitted job, a duplicated sweep line, a second terminal)
would share one folder without a word: `summary.json` from one, `config.yaml` from the other,
interleaved metrics, `last.ckpt` beside `last-v1.ckpt`. The command that runs takes an exclusive
`fcntl.flock` on `<run dir>/.lock` for as long as it runs and writes who it is into the file (pid,
host, command, start time); a second one is refused in one line naming the first.

The kernel drops the lock when its process ends, however it ends (also `kill -9` or a node's
SLURM job being requeued), so there are no stale locks: a requeued job takes it again. The file
itself stays (removing a lock file races with a process about to lock it); its text only names the
last holder. Under DDP only the launching process takes the lock (`holds_run_locks`): the ranks that
Lightning or `srun` start re-run the same command line in the same directory.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shlex
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

from longctx.runtime.run_layout import LOCK

# Lightning's own rule for a process's global rank (lightning.fabric.utilities.rank_zero._get_rank).
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")
# A multi-node launch whose node is not the first: its local rank 0 is not the run's rank 0.
NODE_VARIABLES = ("NODE_RANK", "GROUP_RANK")


class RunDirectoryBusy(RuntimeError):
    """Another live process holds the run directory."""


def holds_run_locks(environ: dict[str, str] | os._Environ = os.environ) -> bool:
    """Whether this process is the one that locks run directories: global rank 0 of its launch (or
    no launcher at all), by the environment variables Lightning reads to rank a process."""
    rank = next((environ[name] for name in RANK_VARIABLES if name in environ), "0")
    return int(rank) == 0 and all(int(environ.get(name, "0")) == 0 for name in NODE_VARIABLES)


def holder_text() -> str:
    """Who holds the lock, as written into the lock file."""
    return json.dumps(
        {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": shlex.join(sys.argv),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
    )


def describe_holder(text: str) -> str:
    """The holder named in a lock file, for the refusal line."""
    try:
        who = json.loads(text)
        return f"pid {who['pid']} on {who['host']}, started {who['started']}: {who['command']}"
    except (ValueError, KeyError, TypeError):
        return "a process that has not written its name yet"


@contextmanager
def run_directory_lock(run_dir: Path | str) -> Iterator[None]:
    """Hold `<run_dir>/.lock` for the block (created with the folder); `RunDirectoryBusy` at once
    when another live process holds it. On a filesystem without locks (e.g. Lustre mounted with
    `noflock`), the block runs unlocked after one line saying so."""
    path = Path(run_dir) / LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = describe_holder(path.read_text(encoding="utf-8", errors="replace"))
            raise RunDirectoryBusy(
                f"run directory {path.parent} is in use by another live run ({holder}); wait for it to "
                "end, or give this run another --run_name"
            ) from None
        except OSError as err:
            if err.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            print(
                f"longctx: cannot lock {path} ({err.strerror}): nothing stops a second run with this "
                "name from writing into the same folder",
                file=sys.stderr,
                flush=True,
            )
        else:
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder_text().encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def lock_if_launching(run_dir: Path | str) -> AbstractContextManager[None]:
    """`run_directory_lock(run_dir)` in the process that locks run directories, else nothing (the
    other ranks of a DDP launch run inside the launching process's lock)."""
    return run_directory_lock(run_dir) if holds_run_locks() else nullcontext()
