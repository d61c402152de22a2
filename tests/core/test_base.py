"""`LMBase`: token-weighted metrics, the memory lifecycle, DDP equality and exact mid-epoch resume."""

from __future__ import annotations

import json
import math
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from longctx.commands.cli import main
from longctx.core.base import StepOutput
from longctx.core.data_facts import FACTS, DataMismatch, missing_facts
from longctx.data.datamodule import LMDataModule
from tests.helpers.lm_fixtures import (
    CarryLM,
    CarrySum,
    SyntheticData,
    WindowData,
    cpu_trainer,
    reference_eval_loss,
)
from tests.helpers.methods import TINY


def test_validation_loss_is_token_weighted_over_the_whole_split(tmp_path):
    pl.seed_everything(0)
    model, data = CarryLM(), SyntheticData(n_tokens=1000, eval_batch_size=3, seq_len=16)
    # 999 targets in 3 rows of 333: the last segment of each row is short, so batch means differ
    # in weight; only the token-weighted mean equals the reference.
    result = cpu_trainer(tmp_path).validate(model, datamodule=data, verbose=False)[0]
    expected = reference_eval_loss(model, data)
    assert result["val/loss"] == pytest.approx(expected, rel=1e-5)
    assert result["val/bpc"] == pytest.approx(expected / math.log(2), rel=1e-5)
    assert result["val/tokens"] == 999


def test_training_memory_survives_mid_epoch_validation_and_resets_each_epoch(tmp_path):
    pl.seed_everything(0)
    seen: list[tuple[int, torch.Tensor | None]] = []

    class Recording(CarryLM):
        def step(self, batch, memory) -> StepOutput:
            if self.training:
                seen.append((self.current_epoch, memory.total.clone()))
            out = super().step(batch, memory)
            if self.training:
                self.last_train_memory = out.memory.total.detach().clone()
            return out

    model = Recording()
    data = SyntheticData(n_tokens=1000, batch_size=4, seq_len=25)  # 10 batches per epoch
    cpu_trainer(tmp_path, max_epochs=2, val_check_interval=3, num_sanity_val_steps=1).fit(
        model, datamodule=data
    )
    assert len(seen) == 20
    for i in range(1, len(seen)):
        epoch, memory = seen[i]
        if epoch != seen[i - 1][0]:
            assert torch.count_nonzero(memory) == 0  # fresh at every epoch start
        else:
            assert torch.count_nonzero(memory) > 0  # carried, validations in between or not
    assert model._memory["train"].total.requires_grad is False


def test_reset_rows_clear_only_their_memory():
    model = CarryLM()
    memory = torch.ones(3, 16)
    batch = {"input": torch.zeros(3, 4, dtype=torch.long), "reset": torch.tensor([False, True, False])}
    model._memory["train"] = CarrySum(memory)
    cleared = model._memory_for("train", batch).total
    assert cleared[1].abs().sum() == 0 and torch.equal(cleared[[0, 2]], memory[[0, 2]])


def test_extra_loss_is_added_to_the_training_loss(tmp_path):
    class Penalised(CarryLM):
        def step(self, batch, memory):
            out = super().step(batch, memory)
            out.extra_loss = torch.tensor(5.0)
            return out

    pl.seed_everything(0)
    model = Penalised()
    data = SyntheticData()
    t = cpu_trainer(tmp_path, max_steps=1)
    t.fit(model, datamodule=data)
    # train/loss logs the NLL alone; the optimised loss includes the penalty, which the base logs.
    assert float(t.callback_metrics["train/loss"]) < 5.0
    assert float(t.callback_metrics["train/extra_loss"]) == 5.0


def _fit(tmp_path: Path, record: Path, ckpt_path: str | None = None, **kwargs) -> CarryLM:
    pl.seed_everything(0)
    model = CarryLM(record_dir=str(record))
    data = SyntheticData(n_tokens=2000, batch_size=4, seq_len=10)  # 50 batches per epoch
    callback = ModelCheckpoint(
        dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=5, save_top_k=-1
    )
    t = cpu_trainer(tmp_path, callbacks=[callback], enable_checkpointing=True, **kwargs)
    t.fit(model, datamodule=data, ckpt_path=ckpt_path)
    return model


def _records(record: Path) -> dict[str, list[dict]]:
    return {
        p.name: [json.loads(line) for line in p.read_text().splitlines()] for p in sorted(record.iterdir())
    }


@pytest.mark.slow  # resume: three fits
@pytest.mark.parametrize(
    "devices,strategy", [(1, "auto"), pytest.param(2, "ddp_spawn", marks=pytest.mark.ddp)]
)
def test_fit_resumes_mid_epoch_at_the_exact_next_segment(tmp_path, devices, strategy):
    full_dir, part_dir = tmp_path / "full", tmp_path / "part"
    full_dir.mkdir()
    part_dir.mkdir()
    common = dict(devices=devices, strategy=strategy, max_epochs=2, limit_val_batches=0)
    _fit(tmp_path / "a", full_dir, **common)
    # Interrupted after 15 steps of epoch 1 (50 + 15 = 65 steps), then resumed from `last`.
    _fit(tmp_path / "b", part_dir, **{**common, "max_steps": 65})
    _fit(tmp_path / "b", part_dir, ckpt_path="last", **common)
    full, part = _records(full_dir), _records(part_dir)
    assert set(full) == {f"rank{r}.jsonl" for r in range(devices)}
    for rank_file, batches in full.items():
        assert len(batches) == 100
        assert part[rank_file] == batches  # same batch at the same step, nothing skipped or repeated


@pytest.mark.ddp
def test_two_process_validation_equals_one_process(tmp_path):
    """Each rank reads its own block of rows with its own memory; sums are synced, not averaged."""
    pl.seed_everything(0)
    model = CarryLM()
    data = SyntheticData(n_tokens=1003, eval_batch_size=4, seq_len=16)
    single = cpu_trainer(tmp_path).validate(model, datamodule=data, verbose=False)[0]
    ddp = cpu_trainer(tmp_path, devices=2, strategy="ddp_spawn").validate(
        model, datamodule=data, verbose=False
    )[0]
    assert single["val/loss"] == pytest.approx(reference_eval_loss(model, data), rel=1e-6)
    assert ddp["val/loss"] == pytest.approx(single["val/loss"], rel=1e-6)
    assert ddp["val/tokens"] == single["val/tokens"] == 1002


class WordCountedData(SyntheticData):
    """Synthetic data whose evaluation split claims 500 words (as WikiText raw does)."""

    def word_count(self, split: str) -> int:
        return 500


def test_word_perplexity_only_when_the_whole_split_was_scored(tmp_path):
    pl.seed_everything(0)
    model = CarryLM()
    data = WordCountedData(n_tokens=1003, eval_batch_size=4, seq_len=16)
    full = cpu_trainer(tmp_path).validate(model, datamodule=data, verbose=False)[0]
    nll_sum = full["val/loss"] * full["val/tokens"]
    assert full["val/word_ppl"] == pytest.approx(math.exp(nll_sum / 500), rel=1e-5)
    partial = cpu_trainer(tmp_path, limit_val_batches=2).validate(model, datamodule=data, verbose=False)[0]
    assert "val/word_ppl" not in partial and partial["val/tokens"] < full["val/tokens"]


# ------------------------------------------------------------------ the data contract
@pytest.mark.parametrize("method", sorted(TINY))
def test_a_data_module_in_the_other_mode_is_refused_before_any_step(tmp_path, method):
    model = TINY[method].build()
    wrong = SyntheticData if TINY[method].data is WindowData else WindowData
    steps = []
    model.step = lambda batch, memory: steps.append(batch)  # never reached
    name, mode = type(model).__name__, model.batch_mode
    message = (
        rf"^{name} reads {mode} batches \(B, .*\), but"
        rf" the data module yields \w+: set data\.mode: {mode}$"
    )
    with pytest.raises(DataMismatch, match=message):
        cpu_trainer(tmp_path, max_steps=1).fit(model, datamodule=wrong())
    assert steps == []


def test_every_method_declares_its_batch_mode():
    """Each module says it (not the base's default), and its tiny data is in that mode."""
    for method in TINY.values():
        model_class = type(method.build())
        assert "batch_mode" in vars(model_class), model_class
        assert model_class.batch_mode == method.data.mode


def test_the_data_module_has_every_fact_the_base_reads():
    data = LMDataModule(corpus="sample", batch_size=2, tgt_len=8)
    assert missing_facts(data) == []
    assert (data.mode, data.metric, data.eval_overlap) == ("segments", "bpc", 0)
    assert set(FACTS) == {
        *("mode", "metric", "eval_overlap", "token_bytes", "word_count", "target_marks", "vocabulary_digest")
    }


def test_a_data_module_without_a_fact_is_refused_naming_it(tmp_path):
    class Wordless(pl.LightningDataModule):  # no word_count
        mode, metric, eval_overlap, token_bytes, vocabulary_digest = "segments", "ppl", 0, None, None

        def target_marks(self, split):
            return None

        def train_dataloader(self):
            raise AssertionError("never reached")

    with pytest.raises(DataMismatch, match=r"^the data module Wordless lacks word_count: "):
        cpu_trainer(tmp_path, max_steps=1).fit(CarryLM(), datamodule=Wordless())


def test_the_cli_answers_a_mode_mismatch_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = [
        "fit", "--model", "tests.helpers.lm_fixtures.CarryLM", "--trainer.logger", "false",
        "--data.corpus", "sample", "--data.mode", "windows", "--data.tgt_len", "8",
        "--data.cache_dir", str(tmp_path / "cache"), "--trainer.max_steps", "1",
    ]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == (
        "error: CarryLM reads segments batches (B, L), but the data module yields windows: "
        "set data.mode: segments"
    )
