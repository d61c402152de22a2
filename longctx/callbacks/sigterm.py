"""SIGTERM or Ctrl-C (SIGINT) during `fit`: save a checkpoint and exit non-zero.

Lightning turns SIGTERM into `SIGTERMException` at the next step boundary, a `SystemExit` with no
code: the process would exit 0 with nothing saved, and a wrapper (a sweep runner, a workflow engine,
`sbatch --dependency=afterok`) would take the run as finished. `CheckpointOnSigterm` saves the full
training state at that boundary as `last.ckpt` in the run's checkpoint directory, so
`--ckpt_path last` (or the printed path) resumes exactly, and exits with 143 (128 + SIGTERM, the
shell's code for a process ended by SIGTERM).

Ctrl-C (SIGINT) does the same and exits with 130 (128 + SIGINT): Lightning would turn it into a
`KeyboardInterrupt` in the middle of whatever ran (an optimizer step half applied), save nothing and
exit 1. During `fit` its first Ctrl-C is handed to Lightning's SIGTERM handler instead, so the fit
stops at the next step boundary with a consistent state, as for SIGTERM (under DDP every rank stops
there: Lightning forwards the signal to the ranks it launched). A process that started with SIGINT
ignored (`nohup`, a background job of a script) keeps ignoring it.

SLURM's own requeue path is unchanged: SIGUSR1 (`#SBATCH --signal=SIGUSR1@90`) still makes Lightning
save `hpc_ckpt_N.ckpt` and requeue, and a requeued job with no `--ckpt_path` resumes (from the newer
of it and `last.ckpt`: `longctx.commands.cli`). The SIGTERM that SLURM sends when it then ends the job also
lands here and leaves a `last.ckpt` as well.

`last.ckpt` stays the newest model. A `ModelCheckpoint(save_last=True)` writes its last checkpoint
under a new name (`last-v1.ckpt`) when a file of that name exists that it does not know as its own
(`last_model_path`, kept in its checkpointed state), and it never knows the `last.ckpt` saved here or
before a requeue: a run resumed from that file would write its newer weights as `last-v1.ckpt`
beside the stale `last.ckpt`. So a resumed fit's checkpoint callbacks take the `last.ckpt` of their
folder as their own (`adopt_last_checkpoints`): a run folder holds one run (`longctx.runtime.run_folder`),
so the file is this run's, and their next save replaces it. Their top-k checkpoints keep Lightning's
names.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from longctx.runtime.errors import SIGINT_EXIT_CODE
from longctx.runtime.run_layout import LAST_CHECKPOINT, checkpoint_dir

EXIT_CODE = 128 + signal.SIGTERM


class CheckpointOnSigterm(pl.Callback):
    """On SIGTERM or Ctrl-C during `fit`: `last.ckpt` in the checkpoint directory, then exit code 143
    (SIGTERM) or 130 (Ctrl-C)."""

    def __init__(self) -> None:
        self.ctrl_c = False  # whether the stop came from Ctrl-C
        self._previous_sigint: Any = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.ctrl_c = False
        previous = signal.getsignal(signal.SIGINT)
        in_main_thread = threading.current_thread() is threading.main_thread()  # signal.signal's rule
        if stage == "fit" and previous is not signal.SIG_IGN and in_main_thread:
            self._previous_sigint = previous
            signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        """Ctrl-C: stop at the next step boundary through Lightning's SIGTERM handler (installed
        while `fit` runs), which also forwards the signal to the ranks Lightning launched."""
        stop = signal.getsignal(signal.SIGTERM)
        if not callable(stop):  # outside Lightning's run (its handlers are not installed)
            signal.default_int_handler(signum, frame)  # Python's own Ctrl-C: KeyboardInterrupt
        if not self.ctrl_c:
            os.write(2, b"longctx: Ctrl-C: stopping after this step to save last.ckpt\n")
        self.ctrl_c = True
        stop(signum, frame)

    def _restore_sigint(self) -> None:
        if self._previous_sigint is not None:
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.ckpt_path is not None:  # resumed: its checkpoint callbacks' state is restored
            adopt_last_checkpoints(trainer)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore_sigint()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._restore_sigint()  # Lightning calls no teardown hook after an exception
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != TrainerFn.FITTING:
            return
        path = sigterm_checkpoint_path(trainer)
        trainer.save_checkpoint(path)  # every rank takes part (barrier); rank 0 writes
        cause, exception.code = ("Ctrl-C", SIGINT_EXIT_CODE) if self.ctrl_c else ("SIGTERM", EXIT_CODE)
        if trainer.is_global_zero:
            print(
                f"longctx: {cause} at step {trainer.global_step}: saved {path}; resume with "
                f"--ckpt_path last (or {path}); exit code {exception.code}",
                file=sys.stderr,
                flush=True,
            )


def sigterm_checkpoint_path(trainer: pl.Trainer) -> str:
    """`last.ckpt` in the first ModelCheckpoint's directory (where `--ckpt_path last` looks), else in
    `<run dir>/checkpoints`."""
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath:
            return os.path.join(callback.dirpath, callback.CHECKPOINT_NAME_LAST + callback.FILE_EXTENSION)
    return str(checkpoint_dir(trainer.default_root_dir) / LAST_CHECKPOINT)


def adopt_last_checkpoints(trainer: pl.Trainer) -> None:
    """Each `ModelCheckpoint(save_last=...)` whose folder has a file under its last checkpoint's name
    takes that file as its last checkpoint, so its next save replaces it (no `last-v1.ckpt`)."""
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.save_last and callback.dirpath:
            path = callback.format_checkpoint_name({}, callback.CHECKPOINT_NAME_LAST)
            if path != callback.last_model_path and callback.file_exists(path, trainer):  # rank 0 decides
                callback.last_model_path = path


@contextmanager
def ctrl_c_exit_code() -> Iterator[None]:
    """Exit with 130 (128 + SIGINT, a shell's code for Ctrl-C) where Lightning ends a loop stopped by
    Ctrl-C with `sys.exit(1)` (validate, test, evaluate_overlaps, or a `fit` that ignores SIGINT's
    first handler)."""
    try:
        yield
    except SystemExit as stop:
        if stop.code == 1 and isinstance(stop.__context__, KeyboardInterrupt):
            raise SystemExit(SIGINT_EXIT_CODE) from stop.__context__
        raise
