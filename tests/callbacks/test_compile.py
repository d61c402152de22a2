"""`CompileNetwork`: torch.compile of each method's network compiles during the first steps and the
first validation only, then never again as memories are carried (Adaptive Span's span cache,
Transformer-XL's memory, the recurrent GPT-2's h_prev), and computes what the eager network does."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from torch._dynamo.utils import counters

from longctx.callbacks import CompileNetwork
from tests.helpers.lm_fixtures import cpu_trainer
from tests.helpers.methods import TINY


class GraphCounter(pl.Callback):
    """Unique Dynamo graphs after each training batch."""

    def __init__(self) -> None:
        self.graphs: list[int] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.graphs.append(int(counters["stats"]["unique_graphs"]))


def _val_loss(model: pl.LightningModule, data: pl.LightningDataModule, tmp_path) -> float:
    trainer = cpu_trainer(tmp_path, limit_val_batches=4)
    return trainer.validate(model, datamodule=data, verbose=False)[0]["val/loss"]


@pytest.mark.slow
@pytest.mark.parametrize("method", list(TINY))
def test_compiles_during_warm_up_only_and_matches_eager(tmp_path, method):
    torch._dynamo.reset()
    counters.clear()
    build, data_class = TINY[method].build, TINY[method].data
    pl.seed_everything(0)
    lm = build()
    keys = set(lm.state_dict())
    graphs = GraphCounter()
    data = data_class(seq_len=16)
    trainer = cpu_trainer(
        tmp_path,
        max_steps=12,
        val_check_interval=4,
        limit_val_batches=2,
        callbacks=[CompileNetwork(), graphs],
    )
    trainer.fit(lm, datamodule=data)
    assert graphs.graphs[-1] > 0  # the network did run compiled
    # Warm-up: first segments (memory from empty/zero to carried) and the first validation (eval
    # graphs); then steps 6..12 and two more validations reuse the graphs.
    assert graphs.graphs[4] == graphs.graphs[-1], graphs.graphs
    assert set(lm.state_dict()) == keys  # checkpoints stay loadable without compile

    eager = build()
    eager.load_state_dict(lm.state_dict())
    assert _val_loss(lm, data, tmp_path) == pytest.approx(_val_loss(eager, data, tmp_path), rel=1e-5)
