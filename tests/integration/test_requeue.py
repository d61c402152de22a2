"""SLURM requeue without a cluster: SIGUSR1 -> hpc checkpoint + `scontrol requeue` -> exact resume.

The job is the real CLI (`python -m longctx fit`) with SLURM's environment variables and a fake
`scontrol` on PATH, as one process or as two DDP ranks started by a fake `srun`. A callback sends
every rank SIGUSR1 after a given step (as SLURM does 90 s before the time limit) and then stops, as
the job would be killed. The second run is the requeued job: same environment, no `--ckpt_path`; it
must continue at the next step, the next segment of every stream of every rank, and the same random
draws, which the model records batch by batch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.environment import REPO
from tests.helpers.fake_slurm import free_port, slurm_node_env


def _run(tmp_path: Path, env: dict[str, str], ntasks: int, *extra: str, code: int = 0) -> str:
    """Run the job; its stderr (the launching process's)."""
    launcher = ["srun"] if ntasks > 1 else []
    args = [
        *launcher, sys.executable, "-m", "longctx", "fit",
        "--model", "tests.helpers.lm_fixtures.CarryLM",
        "--model.init_args.record_dir", str(tmp_path / "record"),
        "--data.corpus", "sample", "--data.batch_size", "4", "--data.tgt_len", "64",
        "--data.cache_dir", str(tmp_path / "cache"),
        "--trainer.default_root_dir", str(tmp_path / "runs"),
        "--trainer.max_steps", "24", "--trainer.limit_val_batches", "0",
        "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
        "--trainer.accelerator", "cpu", "--trainer.devices", str(ntasks),
        "--trainer.strategy", "ddp" if ntasks > 1 else "auto",
        *extra,
    ]  # fmt: skip
    env = {**env, "MASTER_PORT": str(free_port())}
    result = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    logs = "".join(p.read_text()[-3000:] for p in sorted(tmp_path.glob("rank*.log")))
    assert result.returncode == code, result.stderr[-3000:] + logs
    return result.stderr


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("ntasks", [1, pytest.param(2, marks=pytest.mark.ddp)])
def test_sigusr1_checkpoints_requeues_and_resumes_exactly(tmp_path, ntasks):
    env = slurm_node_env(
        tmp_path,
        ntasks,
        SLURM_JOB_ID="4242", SLURM_ARRAY_JOB_ID="4240", SLURM_ARRAY_TASK_ID="2",
        SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0",  # one task without srun
    )  # fmt: skip
    (tmp_path / "record").mkdir()
    requeued = tmp_path / "requeued"
    scontrol = tmp_path / "bin" / "scontrol"
    scontrol.write_text(f'#!/usr/bin/env bash\necho "$@" >> {requeued}\n')
    scontrol.chmod(0o755)
    _run(
        tmp_path,
        env,
        ntasks,
        "--trainer.callbacks+=tests.helpers.lm_fixtures.SignalAfterStep",
        "--trainer.callbacks.step=10",
        "--trainer.callbacks.stop=true",  # SIGUSR1, then the job is killed
    )
    run_dir = tmp_path / "runs" / "slurm-4240_2"
    assert requeued.read_text().split() == ["requeue", "4240_2"]
    assert (run_dir / "hpc_ckpt_1.ckpt").exists()
    _run(tmp_path, env, ntasks)  # the requeued job: same task id, no --ckpt_path

    # Reference: the same 24 steps without interruption, in another run directory.
    (tmp_path / "record").rename(tmp_path / "interrupted")
    (tmp_path / "record").mkdir()
    _run(tmp_path, {**env, "SLURM_ARRAY_TASK_ID": "3"}, ntasks)
    for rank in range(ntasks):
        interrupted, reference = (
            _records(tmp_path / d / f"rank{rank}.jsonl") for d in ("interrupted", "record")
        )
        assert interrupted == reference
        assert [r["step"] for r in interrupted] == list(range(24))


@pytest.mark.slow
def test_a_requeue_after_sigterm_resumes_the_newest_checkpoint_and_keeps_last_ckpt_newest(tmp_path):
    """SIGUSR1 saves the requeue checkpoint at step 10; training goes on until SLURM's SIGTERM, which
    saves last.ckpt at step 12. The requeued job resumes from the newer (step 12), not Lightning's
    requeue checkpoint, and its last checkpoint replaces last.ckpt (never a last-v1.ckpt beside it)."""
    env = slurm_node_env(
        tmp_path,
        1,
        SLURM_JOB_ID="4242", SLURM_ARRAY_JOB_ID="4240", SLURM_ARRAY_TASK_ID="2",
        SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0",
    )  # fmt: skip
    (tmp_path / "record").mkdir()
    scontrol = tmp_path / "bin" / "scontrol"
    scontrol.write_text("#!/usr/bin/env bash\n")
    scontrol.chmod(0o755)
    save_last = ("--trainer.callbacks+=RunCheckpoint", "--trainer.callbacks.save_last=true")
    signals = (
        "--trainer.callbacks+=tests.helpers.lm_fixtures.SignalAfterStep", "--trainer.callbacks.step=10",
        "--trainer.callbacks+=tests.helpers.lm_fixtures.SignalAfterStep", "--trainer.callbacks.step=12",
        "--trainer.callbacks.signal_name=SIGTERM",
    )  # fmt: skip
    _run(tmp_path, env, 1, *save_last, *signals, code=143)
    run_dir = tmp_path / "runs" / "slurm-4240_2"
    last = run_dir / "checkpoints" / "last.ckpt"
    assert torch.load(run_dir / "hpc_ckpt_1.ckpt", weights_only=False)["global_step"] == 10
    assert torch.load(last, weights_only=False)["global_step"] == 12
    stderr = _run(tmp_path, env, 1, *save_last)  # the requeued job: no --ckpt_path
    assert f"longctx: SLURM requeue: resuming from {last}" in stderr
    assert torch.load(last, weights_only=False)["global_step"] == 24
    assert sorted(p.name for p in last.parent.glob("last*")) == ["last.ckpt"]

    (tmp_path / "record").rename(tmp_path / "interrupted")
    (tmp_path / "record").mkdir()
    _run(tmp_path, {**env, "SLURM_ARRAY_TASK_ID": "3"}, 1, *save_last)
    interrupted, reference = (_records(tmp_path / d / "rank0.jsonl") for d in ("interrupted", "record"))
    assert interrupted == reference  # from step 12 on, not again from the requeue checkpoint's 10
    assert [r["step"] for r in interrupted] == list(range(24))
