"""`longctx.callbacks.RunCheckpoint`: `last.ckpt` is the newest model even when the
monitored metric stops improving (Lightning 2.6 keeps it at the best step then)."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint as LightningModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from longctx.callbacks import RunCheckpoint


class Worsening(pl.LightningModule):
    """Trains a scalar; its logged `val/loss` grows with every validation, as an overfitting run's."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))

    def training_step(self, batch, batch_idx):
        return (self.w - 1.0) ** 2

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", float(self.global_step))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.zeros(100, 1)))

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.zeros(1, 1)))


def fit(tmp_path, callback_class, max_steps: int) -> int:
    """The global step stored in the `last.ckpt` a fit of `max_steps` (validation every 2) leaves."""
    callback = callback_class(dirpath=tmp_path, monitor="val/loss", save_last=True)
    trainer = pl.Trainer(
        max_steps=max_steps, val_check_interval=2, num_sanity_val_steps=0, logger=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
    )  # fmt: skip
    trainer.fit(Worsening())
    return torch.load(tmp_path / "last.ckpt", weights_only=False)["global_step"]


@pytest.mark.slow  # four short fits
@pytest.mark.parametrize("max_steps", [6, 7])  # 7: the fit ends between two validations
def test_last_checkpoint_is_the_newest_model_when_the_metric_worsens(tmp_path, max_steps):
    assert fit(tmp_path / "longctx", RunCheckpoint, max_steps) == max_steps
    # Lightning's own class keeps last.ckpt at the best (first) validation: what this one fixes.
    assert fit(tmp_path / "lightning", LightningModelCheckpoint, max_steps) == 2
