"""A fake `srun` for tests: runs SLURM_NTASKS copies of a command on this machine, as srun does on
one node, each with its SLURM_PROCID / SLURM_LOCALID, and logs each rank to $SRUN_LOG_DIR/rank<i>.log."""

from __future__ import annotations

import os
import shlex
import socket
import sys
from pathlib import Path

from tests.helpers.environment import REPO

FAKE_SRUN = """#!/usr/bin/env bash
# Starts SLURM_NTASKS copies of the command on this machine, as srun does on one node.
pids=()
for ((rank = 0; rank < SLURM_NTASKS; rank++)); do
    SLURM_PROCID=$rank SLURM_LOCALID=$rank SLURM_NODEID=0 "$@" > "$SRUN_LOG_DIR/rank$rank.log" 2>&1 &
    pids+=("$!")
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
exit "$status"
"""


def install_fake_srun(bin_dir: Path) -> Path:
    srun = bin_dir / "srun"
    srun.write_text(FAKE_SRUN)
    srun.chmod(0o755)
    return srun


def install_python(bin_dir: Path) -> Path:
    """A `python` that runs this test's interpreter: the sbatch scripts call `python`, and a
    stranger's PATH may name another one (without longctx), or none."""
    python = bin_dir / "python"
    python.write_text(f'#!/usr/bin/env bash\nexec {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(0o755)
    return python


def free_port() -> int:
    """A TCP port free right now, for MASTER_PORT."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slurm_node_env(tmp_path: Path, ntasks: int, **variables: str) -> dict[str, str]:
    """This process's environment as a job step of `ntasks` tasks on one node sees it: the fake
    `srun` and this test's `python` in `tmp_path/bin` (put other fake tools there too) first on PATH,
    rank logs in `tmp_path`, W&B off, a free MASTER_PORT, SLURM's variables; `variables` add or
    override any of them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    install_fake_srun(bin_dir)
    install_python(bin_dir)
    inherited = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "LONGCTX_RUN_NAME")
    }
    return {
        **inherited,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHONPATH": str(REPO),
        "SRUN_LOG_DIR": str(tmp_path),
        "WANDB_MODE": "disabled",
        "MASTER_PORT": str(free_port()),
        "SLURM_JOB_NAME": "longctx", "SLURM_NODELIST": "127.0.0.1", "SLURM_NNODES": "1",
        "SLURM_NTASKS": str(ntasks), "SLURM_NTASKS_PER_NODE": str(ntasks),
        **variables,
    }  # fmt: skip
