"""SIGTERM during `fit`: save a checkpoint and exit non-zero.

Lightning turns SIGTERM into `SIGTERMException` at the next step boundary, a `SystemExit` with no
code: the process would exit 0 with nothing saved, and a wrapper (a sweep runner, a workflow engine,
`sbatch --dependency=afterok`) would take the run as finished. `CheckpointOnSigterm` saves the full
training state at that boundary as `last.ckpt` in the run's checkpoint directory, so
`--ckpt_path last` (or the printed path) resumes exactly, and exits with 143 (128 + SIGTERM, the
shell's code for a process ended by SIGTERM).

SLURM's own requeue path is unchanged: SIGUSR1 (`#SBATCH --signal=SIGUSR1@90`) still makes Lightning
save `hpc_ckpt_N.ckpt` and requeue, and a requeued job with no `--ckpt_path` resumes from it. The
SIGTERM that SLURM sends when it then ends the job also lands here and leaves a `last.ckpt` as well.
"""

from __future__ import annotations

import os
import signal
import sys

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

EXIT_CODE = 128 + signal.SIGTERM


class CheckpointOnSigterm(pl.Callback):
    """On SIGTERM during `fit`: `last.ckpt` in the checkpoint directory, then exit code 143."""

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != TrainerFn.FITTING:
            return
        path = sigterm_checkpoint_path(trainer)
        trainer.save_checkpoint(path)  # every rank takes part (barrier); rank 0 writes
        exception.code = EXIT_CODE
        if trainer.is_global_zero:
            print(
                f"longctx: SIGTERM at step {trainer.global_step}: saved {path}; resume with "
                f"--ckpt_path last (or {path}); exit code {EXIT_CODE}",
                file=sys.stderr,
                flush=True,
            )


def sigterm_checkpoint_path(trainer: pl.Trainer) -> str:
    """`last.ckpt` in the first ModelCheckpoint's directory (where `--ckpt_path last` looks), else in
    `<run dir>/checkpoints`."""
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath:
            return os.path.join(callback.dirpath, callback.CHECKPOINT_NAME_LAST + callback.FILE_EXTENSION)
    return os.path.join(trainer.default_root_dir, "checkpoints", "last.ckpt")
