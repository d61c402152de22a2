"""Learning-rate schedules: shapes and length from the trainer."""

from __future__ import annotations

import math
from functools import partial

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

from longctx.optim.schedules import WarmupConstant, WarmupCosine
from tests.lm_fixtures import CarryLM, SyntheticData, cpu_trainer


def _lrs(schedule: torch.optim.lr_scheduler.LambdaLR, updates: int) -> list[float]:
    """The rate each of the first `updates` updates uses, stepping as Lightning does (after the update)."""
    optimizer, lrs = schedule.optimizer, []
    for _ in range(updates):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return lrs


def _sgd(lr: float) -> torch.optim.SGD:
    return torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=lr)


def test_warmup_cosine_schedule():
    lrs = _lrs(WarmupCosine(_sgd(2.0), warmup_steps=4, max_steps=12, min_lr_ratio=0.1), 14)
    assert lrs[:5] == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0])
    assert lrs[8] == pytest.approx(0.2 + 1.8 * 0.5)  # half-way through the cosine
    assert lrs[12:] == pytest.approx([0.2, 0.2])
    with pytest.raises(ValueError, match=r"max_steps \(5\) must exceed warmup_steps \(10\)"):
        WarmupCosine(_sgd(1.0), warmup_steps=10, max_steps=5)


def test_warmup_constant_schedule():
    assert _lrs(WarmupConstant(_sgd(1.0), warmup_steps=2), 5) == [0.0, 0.5, 1.0, 1.0, 1.0]
    assert _lrs(WarmupConstant(_sgd(1.0), warmup_steps=0), 2) == [1.0, 1.0]


class _RecordLR(pl.Callback):
    """The learning rate of every update, read just before the optimizer steps."""

    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.lrs.append(optimizer.param_groups[0]["lr"])


def _fit_lrs(tmp_path, schedule, **trainer_kwargs) -> list[float]:
    pl.seed_everything(0)
    model = CarryLM(optimizer=partial(torch.optim.SGD, lr=1.0), lr_scheduler=schedule)
    record = _RecordLR()
    trainer = cpu_trainer(tmp_path, limit_val_batches=0, callbacks=[record], **trainer_kwargs)
    trainer.fit(model, datamodule=SyntheticData(n_tokens=4001, batch_size=4, seq_len=16))
    return record.lrs


def test_cosine_without_max_steps_decays_over_the_trainers_max_steps(tmp_path):
    lrs = _fit_lrs(tmp_path, partial(WarmupCosine, warmup_steps=4), max_steps=40)
    expected = [s / 4 if s < 4 else 0.5 * (1 + math.cos(math.pi * (s - 4) / 36)) for s in range(40)]
    assert lrs == pytest.approx(expected)
    # A length given to the schedule wins over the trainer's.
    lrs = _fit_lrs(tmp_path, partial(WarmupCosine, warmup_steps=4, max_steps=20), max_steps=30)
    assert lrs[12] == pytest.approx(0.5) and lrs[20:] == pytest.approx([0.0] * 10)


def test_cosine_without_any_length_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"WarmupCosine needs the schedule's length: set trainer\.max_steps"):
        _fit_lrs(tmp_path, partial(WarmupCosine, warmup_steps=4), max_epochs=1)
    # A smoke run shorter than the warm-up is no error: it only warms up.
    assert _fit_lrs(tmp_path, partial(WarmupCosine, warmup_steps=4), max_steps=3) == [0.0, 0.25, 0.5]


def test_a_checkpoint_restores_the_position_not_the_settings():
    saved = WarmupCosine(_sgd(1.0), warmup_steps=2, max_steps=10)
    _lrs(saved, 6)
    resumed = WarmupCosine(_sgd(1.0), warmup_steps=2, max_steps=20)  # the config now says 20 steps
    resumed.load_state_dict(saved.state_dict())
    assert (resumed.last_epoch, resumed.max_steps) == (6, 20)
