"""Every method under 2-process CPU DDP (gloo): each rank reads its own block of rows and carries its
own memory, and the token-weighted validation equals the single-process one on the same weights."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest

from longctx.data.streams import SegmentStream
from longctx.models.adaptive_span import AdaptiveSpanLM
from longctx.models.recurrent_gpt2 import RecurrentGPT2LM
from longctx.models.transformer_xl import TransformerXLLM
from tests.lm_fixtures import SyntheticData, cpu_trainer


class WindowData(SyntheticData):
    """The same synthetic tokens in window mode (T = 16, overlap 4, one window per batch)."""

    def _stream(self, batch_size: int, pad: bool) -> SegmentStream:
        rank, world = self.trainer.global_rank, self.trainer.world_size
        return SegmentStream(
            self.tokens,
            batch_size,
            self.seq_len,
            overlap=4,
            windows_per_batch=1,
            pad=pad,
            rank=rank,
            world_size=world,
        )


METHODS = {
    "adaptive_span": (
        lambda: AdaptiveSpanLM(vocab_size=64, d_model=16, n_layers=2, n_heads=2, d_inner=32, attn_span=32),
        SyntheticData,
    ),
    "transformer_xl": (
        lambda: TransformerXLLM(vocab_size=64, n_layers=2, d_model=16, n_heads=2, d_inner=32, mem_len=16),
        SyntheticData,
    ),
    "recurrent_gpt2": (
        lambda: RecurrentGPT2LM(
            vocab_size=64,
            gpt2_config={"n_layer": 3, "n_embd": 16, "n_head": 2, "n_positions": 32},
            insert_layer=1,
        ),
        WindowData,
    ),
}


def validate(model: pl.LightningModule, data: pl.LightningDataModule, tmp_path, **kwargs) -> dict[str, float]:
    return cpu_trainer(tmp_path, **kwargs).validate(model, datamodule=data, verbose=False)[0]


@pytest.mark.ddp
@pytest.mark.parametrize("method", list(METHODS))
def test_two_process_validation_equals_one_process(tmp_path, method):
    build, data_class = METHODS[method]
    pl.seed_everything(0)
    model = build()
    data = data_class(n_tokens=1003, eval_batch_size=4, seq_len=16)
    single = validate(model, data, tmp_path)
    ddp = validate(model, data, tmp_path, devices=2, strategy="ddp_spawn")
    assert ddp["val/tokens"] == single["val/tokens"] == 1002  # every target once, no padded duplicate
    assert ddp["val/loss"] == pytest.approx(single["val/loss"], rel=1e-5)
