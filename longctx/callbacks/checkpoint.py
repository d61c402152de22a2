"""Lightning's `ModelCheckpoint` whose `last.ckpt` is always the newest model.

Lightning 2.6 writes `last.ckpt` only at a step where it also wrote a top-k checkpoint
(`ModelCheckpoint.on_validation_end`: "Only save last checkpoint if a checkpoint was actually saved
in this step"), and at the end of `fit` only if no last checkpoint was ever written. So once the
monitored metric stops improving, `last.ckpt` stays at the best step while training goes on: a
`test --ckpt_path .../last.ckpt` then scores an older model, and `--ckpt_path last` resumes from the
past, both silently. It happens whenever `val/loss` rises: overfitting, or a loss on some targets only
(`data.train_targets: marked`, where the validation loss counts every target). This subclass writes
`last.ckpt` at every validation and at the end of `fit` when the step has not been saved yet; the
top-k checkpoints are Lightning's own.
"""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint as LightningModelCheckpoint


class RunCheckpoint(LightningModelCheckpoint):
    """`lightning.pytorch.callbacks.ModelCheckpoint` with `last.ckpt` written at every validation
    and at the end of `fit` (see the module doc); every argument is Lightning's."""

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_behind(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        self._save_last_if_behind(trainer)

    def _save_last_if_behind(self, trainer: pl.Trainer) -> None:
        """`last.ckpt` at this step unless this step was saved already (or it is no fit's step)."""
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
