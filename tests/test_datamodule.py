"""`LMDataModule` on the bundled sample and on the real WikiText pieces in ../shared/data."""

from __future__ import annotations

import pytest
import torch

from longctx.data.datamodule import LMDataModule
from tests.conftest import shared_dir, skip_without_shared

SHARED = shared_dir() / "data"
needs_shared = skip_without_shared("data")


def test_sample_corpus_needs_no_network(tmp_path):
    data = LMDataModule("sample", cache_dir=str(tmp_path), download=False, batch_size=4, tgt_len=32)
    assert data.vocab_size == 256 and data.metric == "bpc"
    data.prepare_data()
    data.setup()
    sizes = {split: len(data.corpus.split(split).tokens) for split in ("train", "valid", "test")}
    total = sum(sizes.values())
    assert sizes["valid"] == sizes["test"] == pytest.approx(0.05 * total, abs=2)
    batch = next(iter(data.train_dataloader()))
    assert batch["input"].shape == (4, 32) and batch["input"].dtype == torch.int64
    torch.testing.assert_close(batch["target"][:, :-1], batch["input"][:, 1:])
    assert data.word_count("valid") is None


@needs_shared
@pytest.mark.parametrize("corpus", ["wikitext103", "wikitext2"])
def test_wikitext_smoke_splits_from_shared_data(tmp_path, corpus):
    data = LMDataModule(
        corpus,
        root=str(SHARED),
        cache_dir=str(tmp_path),
        download=False,
        split_sources={"train": "valid", "valid": "test", "test": "test"},
        batch_size=4,
        tgt_len=64,
    )
    data.prepare_data()
    data.setup()
    assert len(data.corpus.split("train").tokens) == 217_646
    assert len(data.corpus.split("valid").tokens) == 245_569
    assert data.metric == "ppl"
    val = data.val_dataloader()
    scored = sum(int(batch["mask"].sum()) for batch in val)
    assert scored == 245_569 - 1  # every token but the first is a target exactly once


@needs_shared
def test_bpe_windows_and_word_counts(tmp_path):
    data = LMDataModule(
        "wikitext103_raw",
        root=str(SHARED),
        cache_dir=str(tmp_path),
        download=False,
        split_sources={"train": "test", "valid": "test", "test": "test"},
        tokenizer=str(SHARED / "gpt2"),
        mode="windows",
        batch_size=2,
        tgt_len=50,
        overlap=10,
        windows_per_batch=3,
        eval_batch_size=1,
    )
    assert data.vocab_size == 50257
    data.prepare_data()
    data.setup()
    assert data.word_count("test") == 245_569
    batch = next(iter(data.train_dataloader()))
    assert batch["input"].shape == (2, 3, 50) and batch["reset"].shape == (2, 3)
    assert not batch["mask"][:, 1, :10].any() and batch["mask"][:, 1, 10:].all()
    data.set_eval_overlap(30)
    val = data.val_dataloader()
    assert sum(int(b["mask"].sum()) for b in val) == len(data.corpus.split("valid").tokens) - 1


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"corpus": "enwik9"}, "enwik8"),
        ({"mode": "windows", "tgt_len": 10, "overlap": 10}, "overlap"),
        ({"mode": "segments", "overlap": 3}, "mode: windows"),
        ({"split_sources": {"training": "valid"}}, "unknown splits"),
        ({"batch_size": 0}, r"^data\.batch_size must be a positive integer, got 0$"),
        ({"eval_batch_size": 0}, r"^data\.eval_batch_size must be a positive integer, got 0$"),
        ({"tgt_len": 0}, r"^data\.tgt_len must be a positive integer, got 0$"),
        ({"tgt_len": -5}, r"^data\.tgt_len must be a positive integer, got -5$"),
        ({"eval_tgt_len": 0}, r"^data\.eval_tgt_len must be a positive integer, got 0$"),
        ({"mode": "windows", "windows_per_batch": 0}, r"^data\.windows_per_batch must be a positive"),
        ({"mode": "windows", "train_wrap": "random_offset"}, "train_wrap: random_offset"),
        ({"corpus": "pg19", "train_wrap": "random_offset"}, "train_wrap: random_offset"),
    ],
)
def test_bad_options_are_clear_errors(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        LMDataModule(**{"corpus": "sample", "cache_dir": str(tmp_path), **kwargs})


def test_segment_longer_than_the_split_is_a_clear_error(tmp_path):
    data = LMDataModule("sample", cache_dir=str(tmp_path), eval_batch_size=1, eval_tgt_len=10**8)
    data.prepare_data()
    data.setup()
    with pytest.raises(ValueError, match=r"sample valid split: .*use a shorter segment length"):
        data.val_dataloader()


def test_missing_files_offline_name_the_corpus_and_the_files(tmp_path):
    data = LMDataModule("wikitext2", root=str(tmp_path / "empty"), cache_dir=str(tmp_path), download=False)
    with pytest.raises(Exception, match=r"(?s)wikitext2.*wiki\.train\.tokens"):
        data.prepare_data()


def test_train_wrap_reaches_the_training_stream_only(tmp_path):
    data = LMDataModule(
        "sample", cache_dir=str(tmp_path), batch_size=4, tgt_len=32, train_wrap="random_offset", seed=7
    )
    data.prepare_data()
    data.setup()
    train, val = data.train_dataloader(), data.val_dataloader()
    assert (train.wrap, train.seed, val.wrap) == ("random_offset", 7, "restart")
