"""One live command per run directory: a second one is refused naming the first; a dead holder
(kill -9, a requeued job) leaves no stale lock; only the launching rank of a DDP run locks."""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import subprocess
import sys

import pytest

from longctx.runtime.run_lock import RunDirectoryBusy, holds_run_locks, run_directory_lock
from tests.helpers.environment import REPO

HOLDER = """
import sys, time
from longctx.runtime.run_lock import run_directory_lock
with run_directory_lock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(60)
"""


def test_a_second_live_run_is_refused_naming_the_first_and_a_killed_one_leaves_no_lock(tmp_path):
    run_dir = tmp_path / "runs" / "same_name"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run_dir), "--lr", "0.1"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(RunDirectoryBusy) as refused, run_directory_lock(run_dir):
            pass
        message = str(refused.value)
        assert message.startswith(f"run directory {run_dir} is in use by another live run (pid {holder.pid} ")
        assert f"-c {run_dir} --lr 0.1)" in message and "another --run_name" in message
        assert "\n" not in message
    finally:
        holder.send_signal(signal.SIGKILL)  # as a crash, a scancel or a requeue would end it
        holder.wait()
    with run_directory_lock(run_dir):  # the kernel dropped the dead process's lock
        assert (run_dir / ".lock").read_text().startswith(f'{{"pid": {os.getpid()},')


def test_a_lock_held_in_this_process_is_refused_and_released_after_the_block(tmp_path):
    with (
        run_directory_lock(tmp_path),
        pytest.raises(RunDirectoryBusy, match=f"pid {os.getpid()} on "),
        run_directory_lock(tmp_path),
    ):
        pass
    with run_directory_lock(tmp_path):
        pass


@pytest.mark.parametrize(
    ("environ", "locks"),
    [
        ({}, True),  # a plain process
        ({"SLURM_PROCID": "0", "SLURM_JOB_ID": "7"}, True),  # sbatch, or srun's first task
        ({"SLURM_PROCID": "1"}, False),  # srun's second task of a DDP run
        ({"LOCAL_RANK": "1", "NODE_RANK": "0"}, False),  # a rank Lightning's DDP launcher re-ran
        ({"LOCAL_RANK": "0", "SLURM_PROCID": "3"}, True),  # LOCAL_RANK first, as Lightning reads it
        ({"LOCAL_RANK": "0", "NODE_RANK": "1"}, False),  # the first rank of the second node
        ({"RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0"}, True),  # torchrun's rank 0
        ({"RANK": "2", "LOCAL_RANK": "0"}, False),
    ],
)
def test_only_the_launching_rank_locks_the_run_directory(environ, locks):
    assert holds_run_locks(environ) is locks


def test_a_filesystem_without_locks_says_so_in_one_line_and_runs(tmp_path, monkeypatch, capsys):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with run_directory_lock(tmp_path / "run"):
        ran = True
    assert ran
    assert capsys.readouterr().err == (
        f"longctx: cannot lock {tmp_path / 'run' / '.lock'} (No locks available): nothing stops a second "
        "run with this name from writing into the same folder\n"
    )
