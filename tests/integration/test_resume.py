"""Resume of every method: weights, optimizer, scheduler, span parameters and RNG come back exactly.

A run stopped after epoch 1 and resumed from `last` must end with bit-identical weights and optimizer
state to a run that trained both epochs at once. The memory starts empty at every epoch, so this
isolates what the checkpoint carries; dropout is on, so the RNG state must be restored too (the
mid-epoch position of the streams is tested in test_base.py and test_requeue.py).
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from longctx.optim.schedules import WarmupCosine
from tests.helpers.lm_fixtures import cpu_trainer
from tests.helpers.methods import TINY

pytestmark = pytest.mark.slow  # two fits per method (the slow tier)


def _schedule(optimizer: torch.optim.Optimizer) -> WarmupCosine:
    return WarmupCosine(optimizer, warmup_steps=3, max_steps=40, min_lr_ratio=0.1)


def _fit(method: str, run_dir: Path, max_epochs: int, ckpt_path: str | None = None) -> pl.LightningModule:
    build, data_class = TINY[method].build, TINY[method].data
    pl.seed_everything(0)
    model = build(lr_scheduler=_schedule)
    data = data_class(n_tokens=641, batch_size=4, seq_len=16)  # >= 10 training batches per epoch
    checkpoint = ModelCheckpoint(dirpath=run_dir, save_last=True)
    trainer = cpu_trainer(
        run_dir, max_epochs=max_epochs, limit_val_batches=0, callbacks=[checkpoint], enable_checkpointing=True
    )
    trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
    model.final_optimizer_state = trainer.optimizers[0].state_dict()
    model.final_lr = trainer.optimizers[0].param_groups[0]["lr"]
    return model


@pytest.mark.parametrize("method", list(TINY))
def test_resumed_run_ends_bit_identical_to_an_uninterrupted_one(tmp_path, method):
    straight = _fit(method, tmp_path / "straight", max_epochs=2)
    _fit(method, tmp_path / "resumed", max_epochs=1)
    resumed = _fit(method, tmp_path / "resumed", max_epochs=2, ckpt_path="last")

    assert resumed.global_step == straight.global_step >= 20  # two epochs of >= 10 batches
    assert resumed.final_lr == straight.final_lr
    for name, value in straight.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name
    for index, state in straight.final_optimizer_state["state"].items():
        for key, value in state.items():
            assert torch.equal(
                torch.as_tensor(resumed.final_optimizer_state["state"][index][key]), torch.as_tensor(value)
            )
