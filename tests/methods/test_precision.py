"""bf16-mixed (Lightning's autocast) for every method, checked on CPU where autocast also runs in
bfloat16: the linear layers really compute in bf16, the losses, softmax statistics and metric sums
stay in float32/float64, so the evaluation loss matches full precision closely and training runs."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

from tests.helpers.lm_fixtures import cpu_trainer
from tests.helpers.methods import TINY


@pytest.mark.parametrize("method", list(TINY))
def test_bf16_mixed_computes_in_bf16_and_matches_full_precision(tmp_path, method):
    build, data_class = TINY[method].build, TINY[method].data
    pl.seed_everything(0)
    lm = build()
    data = data_class(seq_len=16)
    linear_dtypes: set[torch.dtype] = set()
    for module in lm.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(lambda mod, args, out: linear_dtypes.add(out.dtype))

    def val_loss(precision: str) -> float:
        trainer = cpu_trainer(tmp_path, precision=precision, limit_val_batches=4)
        return trainer.validate(lm, datamodule=data, verbose=False)[0]["val/loss"]

    full = val_loss("32-true")
    assert linear_dtypes == {torch.float32}
    mixed = val_loss("bf16-mixed")
    assert torch.bfloat16 in linear_dtypes
    assert mixed == pytest.approx(full, rel=1e-3)

    trainer = cpu_trainer(tmp_path, precision="bf16-mixed", max_steps=3, limit_val_batches=0)
    trainer.fit(lm, datamodule=data)
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    assert all(p.dtype == torch.float32 for p in lm.parameters())  # master weights stay float32
