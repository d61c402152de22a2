"""Learning-rate schedules used by the paper configs.

All are `LambdaLR`s stepped once per optimizer step (the base module registers them with
`interval="step"`), so a resumed run continues the schedule exactly from the checkpoint.
"""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


class WarmupCosine(LambdaLR):
    """Linear warm-up from 0 over `warmup_steps`, then cosine decay to `min_lr_ratio` at `max_steps`.

    `max_steps=None` keeps the learning rate constant after the warm-up (adaptive-span's schedule:
    linear warm-up from 0, then constant). `warmup_steps=0` is Transformer-XL's cosine schedule
    without warm-up (their `--scheduler cosine --warmup_step 0`; `eta_min` = `min_lr_ratio * lr`).
    """

    def __init__(
        self,
        optimizer: Optimizer,
        warmup_steps: int = 0,
        max_steps: int | None = None,
        min_lr_ratio: float = 0.0,
    ) -> None:
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        if max_steps is not None and max_steps <= warmup_steps:
            raise ValueError(
                f"max_steps ({max_steps}) must exceed warmup_steps ({warmup_steps}); "
                "set max_steps: null for a constant rate after warm-up"
            )
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
        self.warmup_steps = warmup_steps
        self.max_steps = max_steps
        self.min_lr_ratio = min_lr_ratio
        super().__init__(optimizer, self.factor)

    def factor(self, step: int) -> float:
        """Multiplier of the base learning rate after `step` optimizer steps."""
        if step < self.warmup_steps:
            return step / self.warmup_steps
        if self.max_steps is None:
            return 1.0
        progress = min(1.0, (step - self.warmup_steps) / (self.max_steps - self.warmup_steps))
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine


class WarmupStepDecay(LambdaLR):
    """Linear warm-up from 0 over `warmup_steps`, then constant, times `gamma` at each milestone.

    Adaptive Span's schedule (facebookresearch/adaptive-span: `--lr-warmup 32000`, a `LambdaLR` of
    min(1, step / warmup)); its large models are then fine-tuned for 20k more steps at a 10× smaller
    rate (`experiments/enwik8_large.sh`: 150k steps at 0.07, then 20k at 0.007), which is
    `milestones=[150000], gamma=0.1` here. The code steps its scheduler before the optimizer, so its
    first update already uses 1/warmup of the rate; here the first update uses 0 (one step later).
    """

    def __init__(
        self,
        optimizer: Optimizer,
        warmup_steps: int = 0,
        milestones: list[int] | None = None,
        gamma: float = 0.1,
    ) -> None:
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
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
        """Multiplier of the base learning rate after `step` optimizer steps."""
        warmup = step / self.warmup_steps if step < self.warmup_steps else 1.0
        return warmup * self.gamma ** sum(step >= m for m in self.milestones)
