"""`LMDataModule` on the bundled sample and on the real WikiText pieces in ../shared/data."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import re
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from longctx.commands.data import main as prepare_main
from longctx.data import cache, corpora
from longctx.data.datamodule import LMDataModule
from longctx.data.download import DataError
from tests.helpers.environment import REPO, shared_dir, skip_without_shared
from tests.helpers.lm_fixtures import CarryLM, cpu_trainer

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
        ({"train_wrap": "random_offset", "windows_per_batch": 3}, "serves one segment per batch"),
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


def test_missing_data_root_names_the_prepare_command_and_creates_nothing(tmp_path):
    """What a user without ../shared/data sees running a CPU recipe: the folder and the fixes; neither
    the data root nor the cache folder is created."""
    missing = tmp_path / "shared" / "data"
    data = LMDataModule("wikitext2", root=str(missing), cache_dir=str(tmp_path / "cache"), download=False)
    with pytest.raises(
        DataError,
        match=rf"^data\.root {missing} does not exist: point --data\.root at the folder that holds the "
        r"wikitext2 files, or download them into it \(--data\.download true, or `python -m longctx\.data "
        r"prepare --config <your config>` where there is network access\)$",
    ):
        data.prepare_data()
    assert list(tmp_path.iterdir()) == []


def test_prepare_command_answers_a_missing_root_in_one_line_and_creates_nothing(tmp_path):
    missing = tmp_path / "data"
    args = [
        "prepare",
        "wikitext2",
        "--root",
        str(missing),
        "--no-download",
        "--cache_dir",
        str(tmp_path / "c"),
    ]
    with pytest.raises(
        SystemExit, match=rf"^error: data\.root {missing} does not exist: .*--data\.download true"
    ):
        prepare_main(args)
    assert list(tmp_path.iterdir()) == []


@needs_shared
def test_prepare_from_a_config_reads_its_data_settings(tmp_path, capsys):
    """`prepare --config` resolves the config's `data:` as the CLI does (nested configs, split sources)
    and writes the very cache the run reads."""
    config = REPO / "configs" / "transformer_xl_tiny.yaml"
    cache_dir = tmp_path / "cache"
    prepare_main(["prepare", "--config", str(config), "--root", str(SHARED), "--cache_dir", str(cache_dir)])
    (folder,) = cache_dir.iterdir()
    assert folder.name.startswith("wikitext2-")
    out = capsys.readouterr().out
    assert re.search(r"train +217,646 tokens", out)  # train is the valid split (the config's split_sources)
    run = LMDataModule(
        "wikitext2",
        root=str(SHARED),
        cache_dir=str(cache_dir),
        download=False,
        split_sources={"train": "valid", "valid": "test", "test": "test"},
    )
    assert run.spec.path == folder


def test_missing_files_offline_name_the_corpus_and_the_files(tmp_path):
    (tmp_path / "empty").mkdir()
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


# ---------------------------------------------------------------------------------- bits per byte
def scored_bytes(data: LMDataModule, loader) -> int:
    table = data.token_bytes
    return sum(int(table[b["target"][b["mask"]]].sum()) for b in loader)


@needs_shared
@pytest.mark.parametrize(
    "corpus,tokenizer,source",
    [
        ("wikitext103_raw", "bytes", "wikitext-raw/wiki.test.raw.gz"),
        ("wikitext103_raw", "gpt2", "wikitext-raw/wiki.test.raw.gz"),
        ("wikitext2", "gpt2", "wikitext-2/wiki.test.tokens.gz"),
    ],
)
def test_scored_target_bytes_are_the_split_bytes_but_the_first_token(tmp_path, corpus, tokenizer, source):
    """Every target is scored once: their bytes are the text's bytes minus those of the first token
    (which is never a target). Word level counts the normalised text (one opening space less per line)."""
    data = LMDataModule(
        corpus,
        root=str(SHARED),
        cache_dir=str(tmp_path),
        download=False,
        split_sources={"train": "test", "valid": "test", "test": "test"},
        tokenizer=str(SHARED / "gpt2") if tokenizer == "gpt2" else tokenizer,
        eval_batch_size=16,
        eval_tgt_len=2048,
    )
    data.prepare_data()
    data.setup()
    raw = gzip.decompress((SHARED / source).read_bytes())
    text_bytes = len(raw) - raw.count(b"\n") if corpus == "wikitext2" else len(raw)
    assert len(raw.decode("utf-8")) < len(raw)  # the text has multi-byte characters
    tokens = data.corpus.split("test").tokens
    first = int(data.token_bytes[int(tokens[0])])
    assert int(data.token_bytes[torch.from_numpy(tokens.astype("int64"))].sum()) == text_bytes
    assert scored_bytes(data, data.test_dataloader()) == text_bytes - first
    assert data.metric == ("bpc" if tokenizer == "bytes" else "ppl")
    if tokenizer == "bytes":
        assert data.vocab_size == 256 and data.word_count("test") == 245_569


def test_text8_characters_are_one_byte_each_through_the_stream(monkeypatch, tmp_path):
    text = bytes(
        np.random.default_rng(0).choice(np.frombuffer(b" abcdefghijklmnopqrstuvwxyz", np.uint8), 3_000)
    )
    (tmp_path / "raw" / "text8").mkdir(parents=True)
    (tmp_path / "raw" / "text8" / "text8").write_bytes(text)
    corpus = corpora.CORPORA["text8"]
    member = dataclasses.replace(corpus.archive.members[0], checksum=None)
    archive = dataclasses.replace(corpus.archive, members=(member,))
    monkeypatch.setitem(corpora.CORPORA, "text8", dataclasses.replace(corpus, archive=archive))
    monkeypatch.setattr(cache, "CONTIGUOUS_SPLIT", {"valid": 500, "test": 500})
    data = LMDataModule(
        "text8",
        root=str(tmp_path / "raw"),
        cache_dir=str(tmp_path / "cache"),
        download=False,
        eval_batch_size=3,
    )
    data.prepare_data()
    data.setup()
    assert scored_bytes(data, data.val_dataloader()) == 500 - 1


def small_corpus(monkeypatch, tmp_path: Path, name: str, text: str) -> Path:
    """`name` with `text` as every split, under `<tmp>/raw` (member checksums off): a real text piece
    small enough for a tiny model to score whole."""
    corpus = corpora.CORPORA[name]
    members = tuple(dataclasses.replace(m, checksum=None) for m in corpus.archive.members)
    archive = dataclasses.replace(corpus.archive, members=members)
    monkeypatch.setitem(corpora.CORPORA, name, dataclasses.replace(corpus, archive=archive, vocab_size=None))
    folder = tmp_path / "raw" / corpus.dirname
    folder.mkdir(parents=True)
    for member in members:
        (folder / member.name).write_text(text, encoding="utf-8")
    return tmp_path / "raw"


@needs_shared
@pytest.mark.parametrize(
    "corpus,source,n_lines",
    [
        ("wikitext2", "wikitext-2/wiki.valid.tokens.gz", 40),
        ("wikitext103_raw", "wikitext-raw/wiki.test.raw.gz", 10),
    ],
)
def test_bits_per_byte_of_a_tiny_model_equals_a_direct_count(monkeypatch, tmp_path, corpus, source, n_lines):
    """val/bpb = total NLL in bits / bytes of the scored text, the bytes counted from the text itself."""
    lines = gzip.decompress((SHARED / source).read_bytes()).decode("utf-8").splitlines(keepends=True)
    text = "".join(lines[:n_lines])
    root = small_corpus(monkeypatch, tmp_path, corpus, text)
    data = LMDataModule(
        corpus,
        root=str(root),
        cache_dir=str(tmp_path / "cache"),
        download=False,
        tokenizer=str(SHARED / "gpt2"),
        batch_size=2,
        tgt_len=32,
        eval_batch_size=4,
        eval_tgt_len=128,
    )
    pl.seed_everything(0)
    model = CarryLM(vocab_size=data.vocab_size)
    trainer = cpu_trainer(tmp_path, max_steps=2, limit_val_batches=0)
    trainer.fit(model, datamodule=data)
    result = cpu_trainer(tmp_path).validate(model, datamodule=data, verbose=False)[0]
    raw = text.encode("utf-8")
    assert len(text) < len(raw)  # multi-byte characters in the piece
    text_bytes = len(raw) - raw.count(b"\n") if corpus == "wikitext2" else len(raw)
    first = int(data.token_bytes[int(data.corpus.split("valid").tokens[0])])
    nll_bits = result["val/loss"] * result["val/tokens"] / math.log(2)
    assert result["val/bpb"] == pytest.approx(nll_bits / (text_bytes - first), rel=1e-5)
    assert result["val/tokens"] < text_bytes - first  # several bytes per token: bpb is not bpc
    # train/bpb of the last step (batch 1) = its NLL in bits / its targets' bytes, so
    # train/bpb / train/loss = tokens / (ln 2 * bytes) of that batch.
    batch = list(data.train_dataloader())[1]
    n_bytes = int(data.token_bytes[batch["target"]][batch["mask"]].sum())
    ratio = float(trainer.callback_metrics["train/bpb"] / trainer.callback_metrics["train/loss"])
    assert ratio == pytest.approx(int(batch["mask"].sum()) / math.log(2) / n_bytes, rel=1e-5)


def _fit_sample(root: Path, record: Path, cache_dir: Path, max_steps: int = -1, ckpt_path: str | None = None):
    """CarryLM for 3 epochs on the sample text with adaptive-span's wrap-around (4 batches per epoch);
    every step records the first input token of each row."""
    pl.seed_everything(0)
    data = LMDataModule(
        "sample", cache_dir=str(cache_dir), batch_size=64, tgt_len=1024, train_wrap="random_offset", seed=3
    )
    model = CarryLM(vocab_size=256, record_dir=str(record))
    checkpoints = ModelCheckpoint(dirpath=root / "ckpt", save_last=True, every_n_train_steps=1)
    trainer = cpu_trainer(
        root,
        callbacks=[checkpoints],
        enable_checkpointing=True,
        max_epochs=3,
        max_steps=max_steps,
        limit_val_batches=0,
    )
    trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
    return data


@pytest.mark.slow  # three short fits (~45 s on a busy 2-core machine)
def test_random_offset_wrap_resumes_mid_epoch_exactly_under_lightning(tmp_path):
    """Interrupted in epoch 1 (which starts at a drawn offset) and resumed from `last`: every step
    reads the batch the uninterrupted run read."""
    full, part = tmp_path / "full", tmp_path / "part"
    full.mkdir(), part.mkdir()
    data = _fit_sample(tmp_path / "a", full, tmp_path / "cache")
    _fit_sample(tmp_path / "b", part, tmp_path / "cache", max_steps=6)  # epoch 0, then 2 steps of epoch 1
    _fit_sample(tmp_path / "b", part, tmp_path / "cache", ckpt_path="last")
    expected = [json.loads(line)["first"] for line in (full / "rank0.jsonl").read_text().splitlines()]
    got = [json.loads(line)["first"] for line in (part / "rank0.jsonl").read_text().splitlines()]
    assert got == expected
    tokens = data.corpus.split("train").tokens
    stream = data.train_dataloader()
    offsets = [stream.epoch_offset(epoch) for epoch in range(3)]
    assert offsets[0] == 0 and offsets[1] != offsets[2]
    per_row = (len(tokens) - 1) // 64
    lengths = [(per_row - offset) // 1024 for offset in offsets]  # whole blocks only: 4, then 3 or 4
    assert len(expected) == sum(lengths)
    for epoch in range(3):  # each epoch's first batch: row 0 starts at that epoch's offset
        assert expected[sum(lengths[:epoch])][0] == tokens[offsets[epoch]]
