"""`UpdateEveryAfter`: one optimizer update every `every` batches once `after` updates are done.

Rae et al. 2020 (arXiv 1911.05507v1, §5 and §5.5.1) lower the update frequency late in training
instead of decaying the learning rate further: parameter updates every 4 steps after 60,000
iterations (the defaults here). Lightning's `trainer.accumulate_grad_batches` is one number for the
run and its `GradientAccumulationScheduler` switches only at epoch starts (a paper run is one
epoch of a stream), so this callback sets `trainer.accumulate_grad_batches` to `every` at the first
training batch whose `trainer.global_step` (updates so far) is `after` or more. Opt in from the
command line:

    --trainer.callbacks+=longctx.callbacks.UpdateEveryAfter

Before the switch the trainer's own `accumulate_grad_batches` applies (1: a batch is an update, so
`after` counts batches, the paper's iterations, too). After it `global_step`, `trainer.max_steps` and
the step-based learning-rate schedules count updates of `every` batches each. Lightning closes an
accumulation window where the count of the epoch's batches is a multiple of `every`, so the first
window after the switch may be shorter. Nothing is stored in checkpoints: a resumed run past `after`
switches at its first batch.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from longctx.runtime.errors import ParseError


class UpdateEveryAfter(pl.Callback):
    """Accumulate gradients over `every` batches per update once `after` updates are done.

    Args:
        after: optimizer updates before the switch (>= 0; 0 switches at the first batch).
        every: batches per update after the switch (>= 1).
    """

    def __init__(self, after: int = 60_000, every: int = 4) -> None:
        self.after, self.every = after, every

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # Checked here, not in __init__: jsonargparse would bury an __init__ error of a callback in a
        # dump of every callback's settings; `python -m longctx` prints a ParseError as one line.
        if self.after < 0 or self.every < 1:
            raise ParseError(
                "trainer.callbacks: UpdateEveryAfter needs after >= 0 and every >= 1, "
                f"got after={self.after}, every={self.every}"
            )

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step >= self.after:
            trainer.accumulate_grad_batches = self.every
