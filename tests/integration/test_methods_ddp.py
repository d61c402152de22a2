"""Every method under 2-process CPU DDP (gloo): each rank reads its own block of rows and carries its
own memory, and the token-weighted validation equals the single-process one on the same weights."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest

from tests.helpers.lm_fixtures import cpu_trainer
from tests.helpers.methods import TINY


def validate(model: pl.LightningModule, data: pl.LightningDataModule, tmp_path, **kwargs) -> dict[str, float]:
    return cpu_trainer(tmp_path, **kwargs).validate(model, datamodule=data, verbose=False)[0]


@pytest.mark.ddp
@pytest.mark.parametrize("method", list(TINY))
def test_two_process_validation_equals_one_process(tmp_path, method):
    build, data_class = TINY[method].build, TINY[method].data
    pl.seed_everything(0)
    model = build()
    data = data_class(n_tokens=1003, eval_batch_size=4, seq_len=16)
    single = validate(model, data, tmp_path)
    ddp = validate(model, data, tmp_path, devices=2, strategy="ddp_spawn")
    assert ddp["val/tokens"] == single["val/tokens"] == 1002  # every target once, no padded duplicate
    assert ddp["val/loss"] == pytest.approx(single["val/loss"], rel=1e-5)
