"""`UpdateEveryAfter`: updates every batch up to `after` updates, then one update per `every` batches
(Rae et al. 2020's late-training schedule), with the accumulated gradient the windows' mean."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from longctx.callbacks import UpdateEveryAfter
from longctx.runtime.errors import ParseError
from tests.helpers.environment import REPO
from tests.helpers.lm_fixtures import cpu_trainer


class OneWeight(pl.LightningModule):
    """y = w·x under SGD (lr 1): each update moves w by minus the accumulated gradient, recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))
        self.weights: list[float] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return (self.w * batch).sum()  # d/dw = the batch's value

    def on_train_batch_end(self, outputs: object, batch: torch.Tensor, batch_idx: int) -> None:
        self.weights.append(float(self.w.detach()))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1.0)


def fit(tmp_path: Path, callbacks: list[pl.Callback], **trainer_args: object) -> tuple[int, list[float]]:
    """The number of updates of one epoch of 12 batches 1, 2, …, 12, and w after each batch."""
    module = OneWeight()
    trainer = cpu_trainer(tmp_path, max_epochs=1, callbacks=callbacks, **trainer_args)
    data = DataLoader([torch.tensor(float(i + 1)) for i in range(12)], batch_size=None)
    trainer.fit(module, data)
    return trainer.global_step, module.weights


def test_updates_every_batch_then_every_fourth_with_the_mean_gradient(tmp_path):
    updates, weights = fit(tmp_path, [UpdateEveryAfter(after=4, every=4)])
    assert updates == 4 + 8 // 4
    # Batches 1-4 update alone (w -= 1, 2, 3, 4), then batches 5-8 and 9-12 as one update each with
    # the mean of their gradients (6.5, 10.5): w is constant inside a window.
    expected = [-1, -3, -6, -10, -10, -10, -10, -16.5, -16.5, -16.5, -16.5, -27.0]
    assert weights == pytest.approx(expected)


def test_without_it_every_batch_updates(tmp_path):
    assert fit(tmp_path, [])[0] == 12


def test_bad_settings_stop_fit_with_a_parse_error_naming_them(tmp_path):
    with pytest.raises(ParseError, match=r"after >= 0 and every >= 1, got after=60000, every=0"):
        fit(tmp_path, [UpdateEveryAfter(every=0)])
    with pytest.raises(ParseError, match=r"got after=-1, every=4"):
        fit(tmp_path, [UpdateEveryAfter(after=-1)])


@pytest.mark.slow  # ~6 s: a `python -m longctx fit` process
def test_the_command_line_answers_a_bad_setting_in_one_line(tmp_path):
    """Through `python -m longctx` (the callback appended by flag): `error: ...`, exit status 1."""
    config = REPO / "configs" / "quickstart.yaml"
    flags = [
        "--trainer.callbacks+=longctx.callbacks.UpdateEveryAfter",
        "--trainer.callbacks.init_args.every=0",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "longctx", "fit", "--config", str(config), *flags, "--trainer.max_steps=1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "WANDB_MODE": "disabled"},
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "error: trainer.callbacks: UpdateEveryAfter needs after >= 0 and every >= 1, got after=60000, every=0"
    )
