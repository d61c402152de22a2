"""Divergence is an error: a run whose loss blew up stops, says so, and is never reported as fine.

A model whose weights went NaN keeps "training" to the last step at full cost, and every number it
produces afterwards is meaningless. `StopOnDivergence` stops `fit` with `DivergenceError` (one line:
the first bad step, its value, what to try; `summary.json` status `diverged`, exit status 1) when

- the training loss of a step (all ranks' tokens, the loss the optimizer minimises) is NaN or
  infinite, or exceeds the divergence bound `max_loss_factor × log(vocab_size)`;
- a validation during `fit` gives a non-finite (or out-of-bound) `val/loss`, or a non-finite value
  of a metric a `ModelCheckpoint` monitors.

Why a multiple of log(V): log(V) is the loss of the uniform prediction, where a fresh model starts; a
model that learns goes below it, and even a badly initialised or confidently wrong one stays within a
few times it. At the default factor 10 the bound is 55 nats for bytes (V 256) and 108 for GPT-2's
50,257 tokens, far above any healthy run and far below the 1e7 nats of an optimizer that exploded
(Adagrad at lr 1e6: loss 1.5e7 at step 2, still "finished" before this callback). `max_loss_factor:
null` keeps only the non-finite check, which cannot be switched off.

No host sync per step: each step's verdict stays on the device (the first bad step and its value),
and the host reads it every `check_every_n_steps` steps, before every validation, before every
checkpoint is written and when training ends. So the fit stops at most `check_every_n_steps` steps
after the first bad one, and always before anything is computed or saved from a diverged model: no
checkpoint is written from it (a non-finite metric never becomes the "best" one; the check also runs
before the checkpoint callbacks, which Lightning puts last), and the run directory keeps the
checkpoints of its last validation with finite metrics (`last.ckpt` included), from which
`fit --ckpt_path last` with a lower learning rate can go on. Under DDP the training loss is averaged
over the ranks (an all-reduce on the device) before the verdict, so every rank stops at the same step
(one rank stopping alone would leave the others waiting in the next collective).

The line of a non-finite training loss also says where it came from: the first module whose output,
or the first weight whose gradient, was not finite (`nan_origin`: the step is replayed once, with
hooks, before its update when that costs no extra sync; a healthy step keeps references only).
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
import torch
from jsonargparse.typing import PositiveFloat, PositiveInt
from lightning.pytorch.trainer.states import TrainerFn

from longctx.callbacks.nan_origin import StepRecord, memory_before, nonfinite_weights, origin, weights_note
from longctx.runtime.errors import one_line


class DivergenceError(RuntimeError):
    """The run diverged; the message is the one line the user reads."""


class StopOnDivergence(pl.Callback):
    """Stops `fit` when the loss is non-finite or above `max_loss_factor × log(vocab_size)`.

    Args:
        max_loss_factor: the divergence bound as a multiple of log(vocab_size), the uniform
            prediction's loss (default 10); None: stop only on NaN or infinite values.
        check_every_n_steps: optimizer steps between two reads of the verdict on the host (a sync);
            it is also read before every validation and checkpoint and at the end of training.
    """

    def __init__(
        self, max_loss_factor: PositiveFloat | None = 10.0, check_every_n_steps: PositiveInt = 50
    ) -> None:
        if max_loss_factor is not None and max_loss_factor <= 0:
            raise ValueError(f"divergence.max_loss_factor must be positive or null, got {max_loss_factor}")
        if check_every_n_steps <= 0:
            raise ValueError(f"divergence.check_every_n_steps must be positive, got {check_every_n_steps}")
        self.max_loss_factor = max_loss_factor
        self.check_every_n_steps = check_every_n_steps
        self._first_bad: tuple[torch.Tensor, torch.Tensor] | None = None  # (step, loss) on the device
        self._micro_batches: list[StepRecord] = []  # this optimizer step's batches, by reference
        self._origin: str | None = None  # where the first non-finite loss came from, once found
        self._nonfinite_at_start: list[str] = []

    def max_loss(self, pl_module: pl.LightningModule) -> float | None:
        """The bound in nats, or None (no factor, or a module without a vocabulary size)."""
        vocab_size = getattr(pl_module, "vocab_size", None)
        if self.max_loss_factor is None or not vocab_size or vocab_size < 2:
            return None
        return self.max_loss_factor * math.log(vocab_size)

    # ------------------------------------------------------------------ training loss
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._first_bad = None
        self._micro_batches, self._origin = [], None
        self._nonfinite_at_start = nonfinite_weights(pl_module)  # initialised or loaded so (one read)

    # ------------------------------------------------------------------ where a non-finite loss came from
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        kept = (
            self._micro_batches[-trainer.accumulate_grad_batches + 1 :]
            if trainer.accumulate_grad_batches > 1
            else []
        )
        self._micro_batches = [*kept, StepRecord(batch, batch_idx, memory_before(pl_module))]

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor
    ) -> None:
        if self._micro_batches:
            self._micro_batches[-1].nonfinite = ~torch.isfinite(loss.detach())  # on the device

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """Before the update: find where the step's non-finite loss came from, if reading its flag costs
        no sync (on the CPU) or the verdict is read at this step anyway."""
        records, self._micro_batches = self._micro_batches, []
        flagged = [record for record in records if record.nonfinite is not None]
        step = trainer.global_step + 1  # the step being taken, as the verdict counts it
        free = all(self._free_to_read(record.nonfinite) for record in flagged)
        if self._origin is not None or not flagged or not (free or step % self.check_every_n_steps == 0):
            return
        if (bad := next((record for record in flagged if bool(record.nonfinite)), None)) is not None:
            at_start = self._nonfinite_at_start
            self._origin = self._found(lambda: origin(trainer, pl_module, bad, step, at_start))

    @staticmethod
    def _free_to_read(flag: torch.Tensor) -> bool:
        """Whether reading `flag` on the host costs no device sync (a CPU tensor)."""
        return flag.device.type == "cpu"

    @staticmethod
    def _found(search: Any) -> str:
        try:
            return search()
        except Exception as err:  # the search must never hide the divergence itself
            return f"its origin could not be found ({type(err).__name__}: {one_line(err)[:100]})"

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):  # None: a skipped step
            self._record(trainer, pl_module, loss)
        if trainer.global_step % self.check_every_n_steps == 0:
            self._stop_if_diverged(trainer, pl_module)

    def _record(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        """Keep the first bad step and its loss, on the device."""
        # Lightning divides the loss by the accumulation; the mean over ranks adds up each rank's share
        # of the global token-weighted loss, so every rank holds the same verdict.
        loss = loss.detach().float() * trainer.accumulate_grad_batches
        loss = trainer.strategy.reduce(loss, reduce_op="mean")
        bad = ~torch.isfinite(loss)
        if (bound := self.max_loss(pl_module)) is not None:
            bad |= loss > bound
        if self._first_bad is None:
            no_step = torch.full((), -1, dtype=torch.long, device=loss.device)
            self._first_bad = (no_step, torch.zeros_like(loss))
        step, value = self._first_bad
        new = bad & (step < 0)
        self._first_bad = (torch.where(new, trainer.global_step, step), torch.where(new, loss, value))

    def _stop_if_diverged(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._first_bad is None:
            return
        step, value = int(self._first_bad[0]), float(self._first_bad[1])  # the host sync
        if step >= 0:
            message = self._message(trainer, pl_module, "training loss", value, step)
            if self._origin is None and not math.isfinite(value):  # found after its update
                self._origin = self._found(lambda: weights_note(pl_module, step))
            raise DivergenceError(message + (f"; {self._origin}" if self._origin else ""))

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING:
            self._stop_if_diverged(trainer, pl_module)

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._stop_if_diverged(trainer, pl_module)  # before the file is written, on every rank

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop_if_diverged(trainer, pl_module)

    # ------------------------------------------------------------------ validation metrics
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn != TrainerFn.FITTING:
            return  # `validate`/`test` report what they measured (NaN included); only a fit stops
        metrics = trainer.callback_metrics
        monitors = sorted({cb.monitor for cb in trainer.checkpoint_callbacks if cb.monitor} - {"val/loss"})
        message = None
        for name in ("val/loss", *monitors):
            if name in metrics and message is None:
                value = float(metrics[name])
                bad = not math.isfinite(value)
                bound = self.max_loss(pl_module) if name == "val/loss" and trains_on_all(trainer) else None
                if bad or (bound is not None and value > bound):
                    what = "validation loss" if name == "val/loss" else name
                    message = self._message(trainer, pl_module, what, value, trainer.global_step)
        # Synced metrics agree on every rank; a metric logged without sync might not.
        if trainer.strategy.reduce_boolean_decision(message is not None, all=False):
            raise DivergenceError(
                message
                or f"diverged: another rank saw a non-finite validation metric at step "
                f"{trainer.global_step}; {advice(trainer)}"
            )

    def _message(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, what: str, value: float, step: int
    ) -> str:
        """The one line: what diverged, where, and what to try."""
        if math.isfinite(value):
            cause = (
                f"{what} {value:.4g} at step {step} exceeds the divergence bound "
                f"{self.max_loss(pl_module):.4g} (divergence.max_loss_factor {self.max_loss_factor:g} × "
                f"log(vocab_size {pl_module.vocab_size}))"
            )
        else:
            cause = f"{what} is {value} at step {step}"
        return f"diverged: {cause}; {advice(trainer)}"


def advice(trainer: pl.Trainer) -> str:
    """What to try, for this trainer's settings."""
    tips = ["lower the learning rate (model.init_args.optimizer.init_args.lr)"]
    if not trainer.gradient_clip_val:
        tips.append("clip gradients (--trainer.gradient_clip_val 1.0)")
    if str(trainer.precision).startswith("16"):
        tips.append("train in bf16-mixed instead of 16-mixed, whose range overflows")
    return f"try: {', '.join(tips)}; checkpoints saved before it are kept (--ckpt_path last resumes)"


def trains_on_all(trainer: pl.Trainer) -> bool:
    """Whether the training loss counts every target, as `val/loss` does. With `data.train_targets:
    marked` (the loss on MQAR's answers alone) the model is never trained on the other targets, and
    its validation loss over them legitimately lies far above log(vocab_size): no bound then (a
    non-finite value still stops the fit)."""
    return getattr(trainer.datamodule, "train_targets", "all") == "all"
