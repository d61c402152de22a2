"""Learning-rate schedules used by the paper configs.

All are `LambdaLR`s stepped once per optimizer step (the base module registers them with
`interval="step"`), so `factor(step)` is the multiplier of update `step + 1`, and a resumed run
continues the schedule exactly from the checkpoint. The config decides the schedule's shape: a
checkpoint restores only the position in it (`last_epoch`), not the settings (warm-up, length,
milestones), so a resume with a longer `trainer.max_steps` stretches the schedule as configured.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


class _ConfiguredLambdaLR(LambdaLR):
    """A `LambdaLR` whose settings (`SETTINGS`) come from the config, never from a checkpoint."""

    SETTINGS: ClassVar[tuple[str, ...]] = ()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict({k: v for k, v in state_dict.items() if k not in self.SETTINGS})


def _check_warmup(warmup_steps: int) -> None:
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")


class WarmupCosine(_ConfiguredLambdaLR):
    """Linear warm-up from 0 over `warmup_steps`, then cosine decay to `min_lr_ratio` at `max_steps`.

    `max_steps=None` (the default) decays over the trainer's `max_steps`, read when the module's
    `configure_optimizers` runs (`LMBase` calls `follow_trainer`), so `--trainer.max_steps` alone sets
    the run's length. `warmup_steps=0` is Transformer-XL's cosine schedule without warm-up (their
    `--scheduler cosine --warmup_step 0`; `eta_min` = `min_lr_ratio * lr`).
    """

    SETTINGS = ("warmup_steps", "max_steps", "min_lr_ratio")

    def __init__(
        self,
        optimizer: Optimizer,
        warmup_steps: int = 0,
        max_steps: int | None = None,
        min_lr_ratio: float = 0.0,
    ) -> None:
        _check_warmup(warmup_steps)
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
        self.warmup_steps = warmup_steps
        self.min_lr_ratio = min_lr_ratio
        if max_steps is not None and max_steps <= warmup_steps:
            raise ValueError(
                f"WarmupCosine: max_steps ({max_steps}) must exceed warmup_steps ({warmup_steps})"
            )
        self.max_steps = max_steps
        super().__init__(optimizer, self.factor)

    def follow_trainer(self, trainer_max_steps: int | None) -> None:
        """Take the trainer's `max_steps` (-1 or None: unset) as the length unless one was configured.

        A trainer run shorter than the warm-up (a smoke test) just never reaches the decay.
        """
        if self.max_steps is not None:
            return
        if trainer_max_steps is None or trainer_max_steps < 0:
            raise ValueError(
                "WarmupCosine needs the schedule's length: set trainer.max_steps, or the scheduler's "
                "max_steps (for a constant rate after the warm-up use longctx.optim.schedules.WarmupConstant)"
            )
        self.max_steps = trainer_max_steps

    def factor(self, step: int) -> float:
        """Multiplier of the base learning rate after `step` optimizer steps."""
        if step < self.warmup_steps:
            return step / self.warmup_steps
        if step == self.warmup_steps:
            return 1.0  # the top of the cosine: known before the length is (LambdaLR's init calls this)
        if self.max_steps is None:
            raise RuntimeError(
                "WarmupCosine.max_steps is unset: call follow_trainer(trainer.max_steps) first "
                "(LMBase.configure_optimizers does) or set max_steps"
            )
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.max_steps - self.warmup_steps))
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine


class WarmupConstant(_ConfiguredLambdaLR):
    """Linear warm-up from 0 over `warmup_steps`, then constant (the first update has rate 0).

    The usual fine-tuning warm-up (e.g. transformers' `get_constant_schedule_with_warmup`), used by
    the GPT-2 configs, which train for a number of epochs rather than steps.
    """

    SETTINGS = ("warmup_steps",)

    def __init__(self, optimizer: Optimizer, warmup_steps: int = 0) -> None:
        _check_warmup(warmup_steps)
        self.warmup_steps = warmup_steps
        super().__init__(optimizer, self.factor)

    def factor(self, step: int) -> float:
        """Multiplier of the base learning rate after `step` optimizer steps."""
        return step / self.warmup_steps if step < self.warmup_steps else 1.0


class WarmupStepDecay(_ConfiguredLambdaLR):
    """Adaptive Span's schedule: update k (1-based) uses lr · min(1, k / warmup_steps), times `gamma`
    for each milestone m < k.

    facebookresearch/adaptive-span (`utils._get_scheduler`: `LambdaLR(lambda ep: min(1, ep / lr_warmup))`;
    `trainer._train_batch` calls `scheduler.step()` *before* `optimizer.step()`), so its first update
    already moves the weights with lr / warmup; Lightning steps a scheduler after the update, hence
    the `step + 1` below. With any warm-up the Adagrad accumulator sums every update's gradient,
    the first included. The large models are then fine-tuned for 20k more steps at a 10× smaller
    rate by resuming with `--lr 0.007` (`experiments/enwik8_large.sh`: 150k steps at 0.07, then 20k):
    `milestones=[150000], gamma=0.1` here, whose update 150001 is the first at the smaller rate.
    """

    SETTINGS = ("warmup_steps", "milestones", "gamma")

    def __init__(
        self,
        optimizer: Optimizer,
        warmup_steps: int = 0,
        milestones: list[int] | None = None,
        gamma: float = 0.1,
    ) -> None:
        _check_warmup(warmup_steps)
        milestones = sorted(milestones or [])
        if milestones and milestones[0] < warmup_steps:
            raise ValueError(f"milestones {milestones} must not fall inside the warm-up ({warmup_steps})")
        if gamma <= 0:
            raise ValueError(f"gamma must be positive, got {gamma}")
        self.warmup_steps = warmup_steps
        self.milestones = milestones
        self.gamma = gamma
        super().__init__(optimizer, self.factor)

    def factor(self, step: int) -> float:
        """Multiplier of the base learning rate of update `step + 1` (after `step` optimizer steps)."""
        update = step + 1
        warmup = min(1.0, update / self.warmup_steps) if self.warmup_steps else 1.0
        return warmup * self.gamma ** sum(step >= m for m in self.milestones)
