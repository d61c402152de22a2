"""Divergence is an error: a run whose loss blew up stops at once, says so, and is never reported as fine.

A model whose weights went NaN keeps "training" to the last step at full cost, and every number it
produces afterwards is meaningless. `StopOnDivergence` stops `fit` with `DivergenceError` (one line:
the step, the value, what to try; `summary.json` status `diverged`, exit status 1) when

- the training loss of a step (all ranks' tokens, the loss the optimizer minimises) is NaN or
  infinite, or exceeds the divergence bound `max_loss_factor × log(vocab_size)`;
- a validation during `fit` gives a non-finite (or out-of-bound) `val/loss`, or a non-finite value
  of a metric a `ModelCheckpoint` monitors.

Why a multiple of log(V): log(V) is the loss of the uniform prediction, where a fresh model starts; a
model that learns goes below it, and even a badly initialised or confidently wrong one stays within a
few times it. At the default factor 10 the bound is 55 nats for bytes (V 256) and 108 for GPT-2's
50,257 tokens, far above any healthy run and far below the 1e7 nats of an optimizer that exploded
(Adagrad at lr 1e6: loss 1.7e7 at step 5, still "finished" before this callback). `max_loss_factor:
null` keeps only the non-finite check, which cannot be switched off.

It runs before the checkpoint callbacks (Lightning puts `ModelCheckpoint` last), so no checkpoint
is written from a diverged state: a non-finite metric never becomes the "best" one, and the run
directory keeps the checkpoints of its last validation with finite metrics (`last.ckpt` included),
from which `fit --ckpt_path last` with a lower learning rate can go on. Under DDP the training loss
is averaged over the ranks before the decision, so every rank stops at the same step (one rank
stopping alone would leave the others waiting in the next collective).
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.trainer.states import TrainerFn


class DivergenceError(RuntimeError):
    """The run diverged; the message is the one line the user reads."""


class StopOnDivergence(pl.Callback):
    """Stops `fit` when the loss is non-finite or above `max_loss_factor × log(vocab_size)`.

    Args:
        max_loss_factor: the divergence bound as a multiple of log(vocab_size), the uniform
            prediction's loss (default 10); None: stop only on NaN or infinite values.
    """

    def __init__(self, max_loss_factor: float | None = 10.0) -> None:
        if max_loss_factor is not None and max_loss_factor <= 0:
            raise ValueError(f"divergence.max_loss_factor must be positive or null, got {max_loss_factor}")
        self.max_loss_factor = max_loss_factor

    def max_loss(self, pl_module: pl.LightningModule) -> float | None:
        """The bound in nats, or None (no factor, or a module without a vocabulary size)."""
        vocab_size = getattr(pl_module, "vocab_size", None)
        if self.max_loss_factor is None or not vocab_size or vocab_size < 2:
            return None
        return self.max_loss_factor * math.log(vocab_size)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if not isinstance(loss, torch.Tensor):
            return  # a skipped step (training_step returned None)
        # Lightning divides the loss by the accumulation; the mean over ranks adds up each rank's share
        # of the global token-weighted loss, so every rank decides on the same value.
        loss = loss.detach().float() * trainer.accumulate_grad_batches
        loss = trainer.strategy.reduce(loss, reduce_op="mean")
        if message := self._divergence(trainer, pl_module, "training loss", float(loss)):
            raise DivergenceError(message)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn != TrainerFn.FITTING:
            return  # `validate`/`test` report what they measured (NaN included); only a fit stops
        metrics = trainer.callback_metrics
        monitors = sorted({cb.monitor for cb in trainer.checkpoint_callbacks if cb.monitor} - {"val/loss"})
        message = None
        for name in ("val/loss", *monitors):
            if name in metrics and message is None:
                what, bounded = ("validation loss", True) if name == "val/loss" else (name, False)
                message = self._divergence(trainer, pl_module, what, float(metrics[name]), bounded)
        # Synced metrics agree on every rank; a metric logged without sync might not.
        if trainer.strategy.reduce_boolean_decision(message is not None, all=False):
            raise DivergenceError(
                message
                or f"diverged: another rank saw a non-finite validation metric at "
                f"step {trainer.global_step}; {advice(trainer)}"
            )

    def _divergence(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        what: str,
        value: float,
        bounded: bool = True,
    ) -> str | None:
        """The one line saying that `value` diverged, or None when it did not."""
        step = trainer.global_step
        if not math.isfinite(value):
            return f"diverged: {what} is {value} at step {step}; {advice(trainer)}"
        bound = self.max_loss(pl_module) if bounded else None
        if bound is None or value <= bound:
            return None
        return (
            f"diverged: {what} {value:.4g} at step {step} exceeds the divergence bound {bound:.4g} "
            f"(divergence.max_loss_factor {self.max_loss_factor:g} × log(vocab_size {pl_module.vocab_size}));"
            f" {advice(trainer)}"
        )


def advice(trainer: pl.Trainer) -> str:
    """What to try, for this trainer's settings."""
    tips = ["lower the learning rate (model.init_args.optimizer.init_args.lr)"]
    if not trainer.gradient_clip_val:
        tips.append("clip gradients (--trainer.gradient_clip_val 1.0)")
    if str(trainer.precision).startswith("16"):
        tips.append("train in bf16-mixed instead of 16-mixed, whose range overflows")
    return f"try: {', '.join(tips)}; checkpoints saved before it are kept (--ckpt_path last resumes)"
