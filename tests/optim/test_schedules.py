"""Learning-rate schedules: shapes, length from the trainer, and adaptive-span's warm-up convention."""

from __future__ import annotations

import math
from functools import partial

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

from longctx.optim.adagrad import ClippedAdagrad
from longctx.optim.schedules import WarmupConstant, WarmupCosine, WarmupStepDecay
from tests.helpers.lm_fixtures import CarryLM, SyntheticData, cpu_trainer


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
    lrs = _fit_lrs(tmp_path, partial(WarmupCosine, warmup_steps=4), max_steps=16)
    expected = [s / 4 if s < 4 else 0.5 * (1 + math.cos(math.pi * (s - 4) / 12)) for s in range(16)]
    assert lrs == pytest.approx(expected)
    # A length given to the schedule wins over the trainer's.
    lrs = _fit_lrs(tmp_path, partial(WarmupCosine, warmup_steps=4, max_steps=12), max_steps=16)
    assert lrs[8] == pytest.approx(0.5) and lrs[12:] == pytest.approx([0.0] * 4)


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


def test_adaptive_span_warmup_first_update_already_moves_the_weights():
    """adaptive-span steps its LambdaLR(min(1, ep / W)) before each update: update k uses lr·min(1, k/W)."""
    lrs = _lrs(WarmupStepDecay(_sgd(0.07), warmup_steps=4, milestones=[6], gamma=0.1), 8)
    assert lrs == pytest.approx([0.0175, 0.035, 0.0525, 0.07, 0.07, 0.07, 0.007, 0.007])
    assert _lrs(WarmupStepDecay(_sgd(0.07), warmup_steps=0), 2) == pytest.approx([0.07, 0.07])
    with pytest.raises(ValueError, match="must not fall inside the warm-up"):
        WarmupStepDecay(_sgd(0.07), warmup_steps=10, milestones=[5])


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
def test_adaptive_span_warmup_with_clipped_adagrad_matches_the_released_training_loop(tmp_path):
    """Weights and Adagrad sums after 6 updates equal the released loop's order of calls:
    `scheduler.step(); optimizer.step()` with `LambdaLR(lambda ep: min(1, ep / W))`."""
    W, lr, updates = 4, 0.07, 6
    torch.manual_seed(0)
    grads = [torch.randn(3, 5) * 0.1 for _ in range(updates)]
    start = torch.randn(3, 5)

    def run(ours: bool) -> tuple[torch.Tensor, torch.Tensor]:
        p = nn.Parameter(start.clone())
        opt = ClippedAdagrad([p], lr=lr, grad_clip=0.03)
        if ours:
            schedule = WarmupStepDecay(opt, warmup_steps=W)
        else:
            schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda ep: min(1, ep / W))
        for g in grads:
            p.grad = g.clone()
            if not ours:
                schedule.step()
            opt.step()
            if ours:
                schedule.step()
        return p.detach(), opt.state[p]["sum"]

    (ours_p, ours_sum), (ref_p, ref_sum) = run(True), run(False)
    torch.testing.assert_close(ours_p, ref_p, rtol=0, atol=0)
    torch.testing.assert_close(ref_sum, ours_sum, rtol=0, atol=0)
    # Every update's unclipped gradient enters the sums, the first one's included (addcmul may fuse).
    torch.testing.assert_close(ours_sum, sum(g * g for g in grads), rtol=1e-6, atol=0)

    # The same through Lightning's stepping (interval="step"): updates 1..5 use lr·k/4, then lr.
    lrs = _fit_lrs(tmp_path, partial(WarmupStepDecay, warmup_steps=W), max_steps=6)
    assert lrs == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])
