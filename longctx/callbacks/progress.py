"""What a person reads in a log file: a plain progress line every N steps and a closing summary.

A tqdm bar redraws itself with carriage returns; in a file (a SLURM log, `> run.log`) every redraw
becomes text, thousands of lines of it. So when stdout is not a terminal, `ProgressLog` switches the
bar off and prints instead, on rank 0, one line every `every_n_steps` optimizer steps:

    step 400/1500 | 5,210 tok/s | loss 1.9412 | lr 7.00e-02 | ETA 0:03:31

and, at the end of `fit` (also when it stops early or is interrupted), one summary line: the step
reached, the best checkpoint and its metric, the last checkpoint and the run directory. On a terminal
the bar stays and only the summary is printed. The CLI registers it for every run (the `progress:`
section of a config: `every_n_steps`, `enabled`).
"""

from __future__ import annotations

import datetime
import math
import os
import sys
import time
from typing import Any

import lightning.pytorch as pl
import torch
from jsonargparse.typing import PositiveInt
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from longctx.callbacks.sigterm import CheckpointOnSigterm, sigterm_checkpoint_path


def scored_tokens(batch: Any) -> torch.Tensor | None:
    """Scored target tokens of this rank's batch (a device scalar: no host sync), or None."""
    if isinstance(batch, dict) and "mask" in batch:
        return batch["mask"].sum()
    return None


class ProgressLog(pl.Callback):
    """Plain progress lines instead of the bar when stdout is not a terminal, and a closing summary.

    Args:
        every_n_steps: optimizer steps between two progress lines.
        enabled: print progress lines (and switch the bar off): True always, False never, None
            (default) when stdout is not a terminal.
    """

    def __init__(self, every_n_steps: PositiveInt = 50, enabled: bool | None = None) -> None:
        if every_n_steps <= 0:
            raise ValueError(f"progress.every_n_steps must be positive, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self.enabled = enabled
        self._active = False
        self._training = False  # training began: a stop gets the closing line

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._active = self.enabled if self.enabled is not None else not sys.stdout.isatty()
        self._training = False
        if self._active and stage == "fit" and trainer.progress_bar_callback is not None:
            trainer.progress_bar_callback.disable()  # its redraws would flood the file

    # ------------------------------------------------------------------ progress lines
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._training = True
        now = time.perf_counter()
        self._start_time, self._start_step = now, trainer.global_step
        self._window_time, self._window_tokens, self._paused = now, None, 0.0
        self._printed_step = trainer.global_step

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self._active:
            return
        tokens = scored_tokens(batch)
        if tokens is not None:
            self._window_tokens = tokens if self._window_tokens is None else self._window_tokens + tokens
        step = trainer.global_step
        if step % self.every_n_steps or step == self._printed_step:
            return  # not a print step, or gradient accumulation: the same optimizer step again
        now = time.perf_counter()
        window = now - self._window_time - self._paused
        if trainer.is_global_zero:
            print(self._line(trainer, step, now, window), flush=True)
        self._window_time, self._window_tokens, self._paused = now, None, 0.0
        self._printed_step = step

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._validation_start = time.perf_counter()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            # tokens/s is the training rate: validation time is left out of the window (not the ETA)
            self._paused += time.perf_counter() - self._validation_start

    def _line(self, trainer: pl.Trainer, step: int, now: float, window: float) -> str:
        total = _total_steps(trainer)
        parts = [f"step {step}/{total}" if total else f"step {step}"]
        if self._window_tokens is not None and window > 0:
            rate = float(self._window_tokens) * trainer.world_size / window
            parts.append(f"{rate:,.0f} tok/s")
        if (loss := trainer.callback_metrics.get("train/loss")) is not None:
            parts.append(f"loss {float(loss):.4f}")
        if trainer.optimizers:
            parts.append(f"lr {trainer.optimizers[0].param_groups[0]['lr']:.2e}")
        done = step - self._start_step
        if total and done > 0:
            remaining = (now - self._start_time) / done * (total - step)
            parts.append(f"ETA {datetime.timedelta(seconds=round(remaining))}")
        return " | ".join(parts)

    # ------------------------------------------------------------------ closing summary
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            print(closing_summary(trainer, "fit finished"), flush=True)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        # A fit refused before training began says so in its one error line, and leaves no run
        # directory for this line to name (`longctx.runtime.run_folder.undone_if_refused`).
        if trainer.is_global_zero and trainer.state.fn == TrainerFn.FITTING and self._training:
            # A signal's checkpoint is written after this hook (CheckpointOnSigterm comes later in
            # the callbacks): name the file it is writing, not "no checkpoint saved".
            signal_save = isinstance(exception, SIGTERMException) and any(
                isinstance(callback, CheckpointOnSigterm) for callback in trainer.callbacks
            )
            saving = sigterm_checkpoint_path(trainer) if signal_save else None
            headline = f"fit stopped ({type(exception).__name__})"
            print(closing_summary(trainer, headline, saving=saving), flush=True)


def _total_steps(trainer: pl.Trainer) -> int | None:
    """The run's length in optimizer steps, when it is known."""
    if trainer.max_steps > 0:
        return trainer.max_steps
    estimate = trainer.estimated_stepping_batches
    return int(estimate) if math.isfinite(estimate) else None


def closing_summary(trainer: pl.Trainer, headline: str, saving: str | None = None) -> str:
    """One line: where the run ended, its best and last checkpoints (or `saving`, the last checkpoint
    being written as the run stops), and where its files are."""
    parts = [f"{headline} at step {trainer.global_step}"]
    checkpoint = trainer.checkpoint_callback
    # Only files that exist: a save that failed (a full disk) leaves its name in the callback.
    if isinstance(checkpoint, ModelCheckpoint) and os.path.isfile(checkpoint.best_model_path):
        score, monitor = checkpoint.best_model_score, checkpoint.monitor
        metric = f" ({monitor} {float(score):.4f})" if monitor and score is not None else ""
        parts.append(f"best checkpoint {checkpoint.best_model_path}{metric}")
    if saving is not None:
        parts.append(f"saving last checkpoint {saving}")
    elif isinstance(checkpoint, ModelCheckpoint) and os.path.isfile(checkpoint.last_model_path):
        parts.append(f"last checkpoint {checkpoint.last_model_path}")
    if len(parts) == 1:
        parts.append("no checkpoint saved")
    parts.append(f"run directory {trainer.default_root_dir}")
    return "; ".join(parts)
