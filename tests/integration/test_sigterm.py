"""SIGTERM during `fit` (a scheduler's kill, `kill PID`): a checkpoint, exit code 143, exact resume;
Ctrl-C (SIGINT): the same checkpoint, exit code 130.

Each run is the real CLI in a subprocess whose stdout goes to a file, as on a cluster. A callback
sends the process SIGTERM after a given step, as an outside `kill` would between two steps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.environment import REPO


def _fit(tmp_path: Path, run_name: str, *extra: str) -> tuple[subprocess.CompletedProcess, str]:
    log = tmp_path / f"{run_name}.log"
    args = [
        sys.executable, "-m", "longctx", "fit",
        "--model", "tests.helpers.lm_fixtures.CarryLM",
        "--model.init_args.record_dir", str(tmp_path / run_name),
        "--data.corpus", "sample", "--data.batch_size", "4", "--data.tgt_len", "32",
        "--data.cache_dir", str(tmp_path / "cache"),
        "--trainer.default_root_dir", str(tmp_path / "runs"),
        "--trainer.max_steps", "12", "--trainer.limit_val_batches", "0",
        "--trainer.logger", "false", "--trainer.accelerator", "cpu",
        "--progress.every_n_steps", "2",
        "--trainer.callbacks+=RunCheckpoint", "--trainer.callbacks.save_last", "true",
        "--run_name", run_name,
        *extra,
    ]  # fmt: skip
    (tmp_path / run_name).mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    with log.open("w") as out:
        result = subprocess.run(
            args,
            env={**env, "WANDB_MODE": "disabled"},
            cwd=REPO,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            # Python turns Ctrl-C into KeyboardInterrupt only if SIGINT was not ignored at its start (it
            # is in a background job of a non-interactive shell, such as a CI runner's).
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    return result, log.read_text()


def _signal_after_step_5(
    tmp_path: Path, signum: signal.Signals
) -> tuple[subprocess.CompletedProcess, str, Path]:
    """A fit of run `run` that gets `signum` after step 5: (result, log, where last.ckpt must be);
    the exit code is 128 + the signal's number."""
    stopped, log = _fit(
        tmp_path,
        "run",
        "--trainer.callbacks+=tests.helpers.lm_fixtures.SignalAfterStep",
        "--trainer.callbacks.step=5",
        f"--trainer.callbacks.signal_name={signum.name}",
    )
    assert stopped.returncode == 128 + signum, stopped.stderr[-3000:]
    return stopped, log, tmp_path / "runs" / "run" / "checkpoints" / "last.ckpt"


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "rank0.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_exits_143_and_resumes_exactly(tmp_path):
    stopped, log, checkpoint = _signal_after_step_5(tmp_path, signal.SIGTERM)
    assert f"SIGTERM at step 5: saved {checkpoint}" in stopped.stderr
    assert torch.load(checkpoint, weights_only=False)["global_step"] == 5
    # The log file: progress lines up to the signal, then the closing summary.
    assert [line.split(" |")[0] for line in log.splitlines() if line.startswith("step ")] == [
        "step 2/12",
        "step 4/12",
    ]
    assert f"fit stopped (SIGTERMException) at step 5; saving last checkpoint {checkpoint}" in log, log
    assert "no checkpoint saved" not in log
    summary = json.loads((tmp_path / "runs" / "run" / "summary.json").read_text())
    assert (summary["status"], summary["global_step"]) == ("interrupted", 5)

    resumed, log = _fit(tmp_path, "run", "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "fit finished at step 12" in log, log
    # last.ckpt is the finished model: the callback took the SIGTERM checkpoint as its own last one
    # (it wrote the newer weights as last-v1.ckpt beside the stale step-5 file).
    assert torch.load(checkpoint, weights_only=False)["global_step"] == 12
    assert sorted(p.name for p in checkpoint.parent.glob("last*")) == ["last.ckpt"]
    summary = json.loads((tmp_path / "runs" / "run" / "summary.json").read_text())
    # Training tokens count on through the checkpoint: 12 steps of 4 rows × 32 targets.
    assert (summary["status"], summary["train_tokens"]) == ("finished", 12 * 4 * 32)

    straight, _ = _fit(tmp_path, "straight")
    assert straight.returncode == 0, straight.stderr[-3000:]
    # The same batches and random draws at every step (the carried memory restarts empty on resume,
    # as after any checkpoint: see LMBase, so the weights are compared at epoch ends in test_resume).
    assert _records(tmp_path / "run") == _records(tmp_path / "straight")
    assert [r["step"] for r in _records(tmp_path / "run")] == list(range(12))


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_at_a_step_boundary_and_exits_130(tmp_path):
    stopped, log, checkpoint = _signal_after_step_5(tmp_path, signal.SIGINT)
    assert "longctx: Ctrl-C: stopping after this step to save last.ckpt" in stopped.stderr
    assert f"Ctrl-C at step 5: saved {checkpoint}; resume with --ckpt_path last" in stopped.stderr
    assert "KeyboardInterrupt" not in stopped.stderr + log
    assert torch.load(checkpoint, weights_only=False)["global_step"] == 5
    summary = json.loads((tmp_path / "runs" / "run" / "summary.json").read_text())
    assert (summary["status"], summary["global_step"]) == ("interrupted", 5)
    resumed, log = _fit(tmp_path, "run", "--ckpt_path", "last", "--trainer.max_steps", "7")
    assert resumed.returncode == 0 and "fit finished at step 7" in log, resumed.stderr[-3000:]


def test_ctrl_c_is_taken_over_only_during_fit_and_never_where_it_was_ignored():
    from longctx.callbacks.sigterm import CheckpointOnSigterm

    callback = CheckpointOnSigterm()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # nohup, a script's background job
    try:
        callback.setup(None, None, "fit")
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.signal(signal.SIGINT, signal.default_int_handler)
        callback.setup(None, None, "validate")
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        callback.setup(None, None, "fit")
        assert signal.getsignal(signal.SIGINT) == callback._on_sigint
        with pytest.raises(KeyboardInterrupt):  # outside Lightning's run: Python's own Ctrl-C
            callback._on_sigint(signal.SIGINT, None)
        callback.teardown(None, None, "fit")
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
