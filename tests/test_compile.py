"""`CompileNetwork`: torch.compile of a method's network compiles during the first steps only, then
never again as memories are carried (Adaptive Span's trimmed caches, Transformer-XL's memory)."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from torch._dynamo.utils import counters

from longctx.callbacks import CompileNetwork
from longctx.models.transformer_xl import TransformerXLLM
from tests.lm_fixtures import SyntheticData, cpu_trainer


class GraphCounter(pl.Callback):
    """Unique Dynamo graphs after each training batch."""

    def __init__(self) -> None:
        self.graphs: list[int] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.graphs.append(int(counters["stats"]["unique_graphs"]))


@pytest.mark.slow
def test_no_recompilation_once_memory_is_carried(tmp_path):
    """Transformer-XL: the memory grows from empty to mem_len once, then keeps its shape. (Adaptive
    Span compiles too, see `python -m longctx fit ... --trainer.callbacks+=longctx.callbacks.CompileNetwork`,
    but CPU inductor aborted natively on this tiny in-process configuration; GPU is untested here.)"""
    torch._dynamo.reset()
    counters.clear()
    pl.seed_everything(0)
    lm = TransformerXLLM(vocab_size=64, n_layers=2, d_model=16, n_heads=2, d_inner=32, mem_len=16)
    keys = set(lm.state_dict())
    graphs = GraphCounter()
    trainer = cpu_trainer(tmp_path, max_steps=8, limit_val_batches=0, callbacks=[CompileNetwork(), graphs])
    trainer.fit(lm, datamodule=SyntheticData(seq_len=16))
    assert graphs.graphs[-1] > 0  # the network did run compiled
    assert graphs.graphs[3] == graphs.graphs[-1], graphs.graphs  # steps 4..8 reuse the graphs
    assert set(lm.state_dict()) == keys  # checkpoints stay loadable without compile
