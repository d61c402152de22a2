"""Every network trains in train mode: Lightning 2.6 keeps each module's train/eval mode at `fit`
start (it only warns), and `from_pretrained` returns an eval-mode model, so a GPT-2 loaded from
`pretrained` would fine-tune with dropout off."""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import pytest
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from longctx.methods.recurrence.module import RecurrentGPT2LM
from tests.helpers.lm_fixtures import WindowData, cpu_trainer
from tests.helpers.methods import TINY

EVAL_MODE_WARNING = "module(s) in eval mode at the start of training"


class CountActiveDropout(pl.Callback):
    """Records, at every training step, how many Dropout modules are in training mode."""

    def __init__(self) -> None:
        self.active: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.active.append(sum(m.training for m in pl_module.modules() if isinstance(m, nn.Dropout)))


def fit_recording_warnings(model: pl.LightningModule, data: pl.LightningDataModule, tmp_path, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cpu_trainer(tmp_path, max_steps=2, limit_val_batches=0, **kwargs).fit(model, datamodule=data)
    return [str(w.message) for w in caught]


def test_a_gpt2_loaded_from_pretrained_fine_tunes_with_its_dropout_on(tmp_path):
    config = GPT2Config(n_layer=2, n_embd=16, n_head=2, n_positions=32, vocab_size=64, resid_pdrop=0.1)
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    model = RecurrentGPT2LM(
        vocab_size=64, pretrained=str(tmp_path / "gpt2"), window_recurrence={"insert_layer": 1}
    )
    dropouts = sum(isinstance(m, nn.Dropout) for m in model.lm.modules())
    assert dropouts == 1 + 2 * 3  # embeddings; per block: attention weights, attention output, MLP
    counter = CountActiveDropout()
    messages = fit_recording_warnings(model, WindowData(), tmp_path, callbacks=[counter])
    assert counter.active and all(n == dropouts for n in counter.active), counter.active
    assert not [m for m in messages if EVAL_MODE_WARNING in m], messages


@pytest.mark.parametrize("method", sorted(TINY))
def test_no_module_is_in_eval_mode_at_fit(method, tmp_path):
    make_model, data_class = TINY[method].build, TINY[method].data
    messages = fit_recording_warnings(make_model(), data_class(), tmp_path)
    assert not [m for m in messages if EVAL_MODE_WARNING in m], messages
