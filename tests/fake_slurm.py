"""A fake `srun` for tests: runs SLURM_NTASKS copies of a command on this machine, as srun does on
one node, each with its SLURM_PROCID / SLURM_LOCALID, and logs each rank to $SRUN_LOG_DIR/rank<i>.log."""

from __future__ import annotations

import socket
from pathlib import Path

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


def free_port() -> int:
    """A TCP port free right now, for MASTER_PORT."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
