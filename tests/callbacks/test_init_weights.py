"""`fit --init_weights PATH` (`InitWeights`): a fresh fit starts from another checkpoint's weights
with a fresh step count; a resumed fit takes its own checkpoint; bad input is one line."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

from longctx.callbacks.init_weights import InitWeights
from longctx.commands.cli import main
from tests.helpers.lm_fixtures import SyntheticData, carry_lm_cli, cpu_trainer
from tests.helpers.methods import tiny


class FirstWeights(pl.Callback):
    """The module's weights and the step as training starts."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.step = trainer.global_step
        self.weights = {k: v.clone() for k, v in pl_module.state_dict().items()}


def trained_checkpoint(tmp_path, name: str, seed: int) -> tuple[str, dict]:
    pl.seed_everything(seed)
    model = tiny("transformer_xl")
    trainer = cpu_trainer(tmp_path / name, max_steps=2, limit_val_batches=0)
    trainer.fit(model, datamodule=SyntheticData(seq_len=16))
    path = str(tmp_path / f"{name}.ckpt")
    trainer.save_checkpoint(path)
    return path, {k: v.clone() for k, v in model.state_dict().items()}


def test_a_fresh_fit_starts_from_the_weights_and_step_zero(tmp_path):
    source, source_weights = trained_checkpoint(tmp_path, "source", seed=1)
    pl.seed_everything(2)
    model, first = tiny("transformer_xl"), FirstWeights()
    embedding = "net.word_emb.emb_layers.0.weight"
    assert not torch.equal(model.state_dict()[embedding], source_weights[embedding])
    callbacks = [InitWeights(source), first]
    trainer = cpu_trainer(tmp_path / "stage2", max_steps=1, limit_val_batches=0, callbacks=callbacks)
    trainer.fit(model, datamodule=SyntheticData(seq_len=16))
    assert first.step == 0
    assert first.weights.keys() == source_weights.keys()
    assert all(torch.equal(first.weights[k], source_weights[k]) for k in source_weights)


def test_a_resumed_fit_takes_its_own_checkpoint(tmp_path):
    source, _ = trained_checkpoint(tmp_path, "source", seed=1)
    own, own_weights = trained_checkpoint(tmp_path, "own", seed=2)
    model, first = tiny("transformer_xl"), FirstWeights()
    trainer = cpu_trainer(
        tmp_path / "resumed", max_steps=3, limit_val_batches=0, callbacks=[InitWeights(source), first]
    )
    trainer.fit(model, datamodule=SyntheticData(seq_len=16), ckpt_path=own)
    assert first.step == 2
    assert all(torch.equal(first.weights[k], own_weights[k]) for k in own_weights)


@pytest.mark.parametrize(
    "subcommand, path, message",
    [
        ("fit", "missing.ckpt", "error: --init_weights: missing.ckpt: no such file"),
        ("test", "missing.ckpt", "error: --init_weights applies to fit (a fresh run starting from another"),
    ],
)
def test_bad_init_weights_are_one_line(tmp_path, monkeypatch, subcommand, path, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    with pytest.raises(SystemExit) as info:
        main(carry_lm_cli(subcommand, "bad", "--init_weights", path))
    assert str(info.value.code).startswith(message)
