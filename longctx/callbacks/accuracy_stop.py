"""Training until it learns: stop `fit` once validation recall reaches a threshold, under the step budget.

Recall on synthetic tasks is a phase change: accuracy sits on a plateau for thousands of steps and
then jumps (zoology's MQAR cell on this CPU: 0.24 for ~1,900 steps, 0.96 by 3,130, 0.99 by 5,947;
field notes). A fixed budget set before the jump reads as "nothing learned", one set far past it
wastes the time of every run that learned early. zoology stops at 0.99 validation accuracy; so does
`--recall_stop.min_acc 0.99` (the CLI's `recall_stop:` section; off by default):

- after every validation during `fit` (not the sanity check), the monitored metric (default
  `val/recall_acc_first`: each episode's first query, which elimination cannot fake; see
  `longctx.core.recall`; answers without a query order are watched all together, `val/recall_acc`)
  is read; the first time it is >= `min_acc`, the step is recorded and the
  fit stops (`trainer.max_steps` stays the budget: a run that never reaches it ends there);
- `summary.json` gets `recall_stop`: `monitor`, `min_acc`, `reached_step` (the global step of the
  first validation at or above the threshold, null if none within the budget), `reached_value`,
  `global_step` (where the fit ended); `python -m longctx report` shows `steps_to_acc`.

Lightning's `EarlyStopping(stopping_threshold=...)` stops at a threshold too, but it does not record
when, and its patience (stop after N validations without improvement) would end a run on the very
plateau this rule must wait out; so this is a callback of its own. The recorded step is kept in
checkpoints (a resumed fit reports the first crossing). Under DDP the metric is already synced
across ranks, so every rank stops at the same validation.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from longctx.core.base import EVAL_SPLITS
from longctx.core.data_facts import DataMismatch


class StopAtAccuracy(pl.Callback):
    """Stops `fit` at the first validation whose `monitor` is >= `min_acc` and records that step.

    Args:
        min_acc: the threshold (zoology: 0.99); None: never stop, record nothing.
        monitor: a logged validation metric, `val/recall_acc_first` (default) or `val/recall_acc`.
    """

    def __init__(self, min_acc: float | None = None, monitor: str = "val/recall_acc_first") -> None:
        if min_acc is not None and not 0.0 < min_acc <= 1.0:
            raise ValueError(f"recall_stop.min_acc is an accuracy in (0, 1], got {min_acc}")
        if not monitor.startswith("val/"):
            raise ValueError(f"recall_stop.monitor must be a validation metric (val/...), got {monitor!r}")
        self.min_acc = min_acc
        self.monitor = monitor
        self.reached_step: int | None = None
        self.reached_value: float | None = None
        self._fitted_to: int | None = None  # the global step where this process's fit ended

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Refuse, before any step, a threshold on a metric the validation split cannot give (one line
        from the CLI: `DataMismatch`)."""
        if self.min_acc is None:
            return
        datamodule = getattr(trainer, "datamodule", None)
        marks = None if datamodule is None else datamodule.target_marks(EVAL_SPLITS["val"])
        if marks is None:
            raise DataMismatch(
                f"recall_stop.min_acc {self.min_acc} watches {self.monitor}, but the validation split has "
                "no marks: validate on a file with its .marks.npz beside it (python -m longctx.data synth "
                "mqar), or train with data.train_targets: induction, or drop recall_stop.min_acc"
            )
        if self.monitor == "val/recall_acc_first" and marks.query is None:
            # Answers not ordered into episodes (the copy task; a recall text not written one episode
            # per line): every answer counts, a stricter rule at 0.99 than the first queries'.
            self.monitor = "val/recall_acc"
            rank_zero_info(
                "longctx: the validation split's answers have no query order (no episodes): "
                f"recall_stop watches val/recall_acc (every answer) >= {self.min_acc}"
            )

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.min_acc is None or trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        value = trainer.callback_metrics.get(self.monitor)
        if value is None:
            raise DataMismatch(
                f"recall_stop.monitor {self.monitor} was not logged by the validation at step "
                f"{trainer.global_step}; log it, or set recall_stop.monitor to a recall metric"
            )
        value = float(value)
        if value < self.min_acc:
            return
        if self.reached_step is None:
            self.reached_step, self.reached_value = trainer.global_step, value
            rank_zero_info(
                f"longctx: {self.monitor} {value:.4f} >= {self.min_acc} at step {trainer.global_step}: "
                "the fit stops (recall_stop.min_acc)"
            )
        trainer.should_stop = True

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._fitted_to = trainer.global_step

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        if trainer.state.fn == TrainerFn.FITTING:
            self._fitted_to = trainer.global_step

    def summary_fields(self) -> dict[str, Any]:
        """What `summary.json` records (`RunRecord`), only for a fit this process ran with a threshold:
        a later `test` in the same run directory keeps the fit's record."""
        if self.min_acc is None or self._fitted_to is None:
            return {}
        return {
            "recall_stop": {
                "monitor": self.monitor,
                "min_acc": self.min_acc,
                "reached_step": self.reached_step,
                "reached_value": self.reached_value,
                "global_step": self._fitted_to,
            }
        }

    def state_dict(self) -> dict[str, Any]:
        return {"reached_step": self.reached_step, "reached_value": self.reached_value}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.reached_step = state_dict.get("reached_step")
        self.reached_value = state_dict.get("reached_value")
