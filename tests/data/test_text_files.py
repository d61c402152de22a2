"""`data.corpus: text_files`: the user's own files, every raw-text tokenizer, never stale, one-line errors."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import ByteLevelBPETokenizer

from longctx.callbacks.vocabulary import RunVocabulary
from longctx.commands.cli import main as cli_main
from longctx.commands.data import main as data_main
from longctx.core.data_facts import VOCABULARY_KEY, DataMismatch
from longctx.data import cache
from longctx.data.datamodule import LMDataModule
from longctx.data.download import DataError
from longctx.data.text_files import TextFileError
from longctx.data.tokenize import encode_bpe, gpt2_files, gpt2_tokenizer_from_files
from tests.helpers.environment import shared_dir, skip_without_shared
from tests.helpers.lm_fixtures import cpu_trainer
from tests.helpers.methods import tiny

GPT2 = shared_dir() / "data" / "gpt2"
TEXT = "Grüße aus Köln — naïve café, 東京 and ✓ emoji 🙂.\nSecond line: plain ASCII words here.\n" * 8


def text_files(tmp_path, files, **kwargs) -> LMDataModule:
    """A prepared data module over `files` ({split: name in tmp_path})."""
    options = {"cache_dir": str(tmp_path / "cache"), "batch_size": 2, "tgt_len": 8, **kwargs}
    data = LMDataModule("text_files", files={s: str(tmp_path / f) for s, f in files.items()}, **options)
    data.prepare_data()
    data.setup()
    return data


def test_bytes_token_i_is_byte_i_of_its_file_and_one_file_feeds_two_splits(tmp_path):
    (tmp_path / "a.txt").write_text(TEXT, encoding="utf-8")
    (tmp_path / "b.txt").write_text(TEXT[::-1], encoding="utf-8")
    data = text_files(tmp_path, {"train": "a.txt", "valid": "b.txt", "test": "b.txt"}, tokenizer="bytes")
    assert (data.vocab_size, data.metric) == (256, "bpc")
    for split, name in (("train", "a.txt"), ("valid", "b.txt"), ("test", "b.txt")):
        raw = (tmp_path / name).read_bytes()
        tokens = data.corpus.split(split).tokens
        assert tokens.dtype == np.uint8 and bytes(tokens) == raw  # token i = byte i, non-ASCII too
        assert int(data.corpus.token_bytes[tokens].sum()) == len(raw)
    assert data.word_count("train") == len(TEXT.split()) + TEXT.count("\n")


def test_vocabulary_size_is_known_before_prepare(tmp_path):
    """LightningCLI links data.vocab_size right after __init__: no cache may be needed for it."""
    (tmp_path / "a.txt").write_text(TEXT, encoding="utf-8")
    files = {s: str(tmp_path / "a.txt") for s in ("train", "valid", "test")}
    data = LMDataModule(
        "text_files",
        files=files,
        cache_dir=str(tmp_path / "cache"),
        tokenizer="bytes",
        batch_size=4,
        tgt_len=16,
    )
    assert data.vocab_size == 256 and not (tmp_path / "cache").exists()


def test_a_local_byte_level_bpe_reads_the_files_with_exact_bytes_per_token(tmp_path):
    (tmp_path / "a.txt").write_text(TEXT, encoding="utf-8")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([TEXT], vocab_size=300, min_frequency=1, show_progress=False)
    (tmp_path / "bpe").mkdir()
    bpe.save_model(str(tmp_path / "bpe"))  # vocab.json + merges.txt
    files = {"train": "a.txt", "valid": "a.txt", "test": "a.txt"}
    data = text_files(tmp_path, files, tokenizer=str(tmp_path / "bpe"))
    tokenizer = gpt2_tokenizer_from_files(tmp_path / "bpe" / "vocab.json", tmp_path / "bpe" / "merges.txt")
    tokens = data.corpus.split("train").tokens
    assert data.vocab_size == tokenizer.get_vocab_size() == len(data.corpus.token_bytes)
    assert data.metric == "ppl" and len(tokens) < len(TEXT.encode())
    assert tokenizer.decode(tokens.tolist()) == TEXT
    assert int(data.corpus.token_bytes[tokens].sum()) == len(TEXT.encode())


@skip_without_shared("data", "gpt2")
def test_gpt2_bpe_ids_and_bytes_per_token(tmp_path):
    (tmp_path / "a.txt").write_text(TEXT, encoding="utf-8")
    data = text_files(tmp_path, {"train": "a.txt", "valid": "a.txt", "test": "a.txt"}, tokenizer=str(GPT2))
    assert data.vocab_size == 50_257
    tokenizer = gpt2_tokenizer_from_files(*gpt2_files(GPT2))
    tokens = data.corpus.split("test").tokens
    assert np.array_equal(tokens, encode_bpe(tokenizer, TEXT))
    assert int(data.corpus.token_bytes[tokens].sum()) == len(TEXT.encode())


def test_an_edited_file_is_tokenized_again_even_with_its_old_size_and_mtime(tmp_path, monkeypatch):
    """The cache is keyed by the content digest: a same-size edit with the mtime put back (`cp -p`,
    `touch -r`) in a later run gets new ids, never the old cache."""
    path = tmp_path / "a.txt"
    path.write_text("x" * 64, encoding="utf-8")
    files = {"train": "a.txt", "valid": "a.txt", "test": "a.txt"}
    before = text_files(tmp_path, files, tokenizer="bytes")
    stat = path.stat()
    path.write_text("y" * 64, encoding="utf-8")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    monkeypatch.setattr(cache, "_SOURCE_DIGESTS", {})  # a new run: a new process
    after = text_files(tmp_path, files, tokenizer="bytes")
    assert after.corpus.path != before.corpus.path
    assert bytes(after.corpus.split("train").tokens) == b"y" * 64


def test_an_unchanged_file_reuses_its_cache(tmp_path, monkeypatch):
    (tmp_path / "a.txt").write_text(TEXT, encoding="utf-8")
    files = {"train": "a.txt", "valid": "a.txt", "test": "a.txt"}
    first = text_files(tmp_path, files, tokenizer="bytes")
    monkeypatch.setattr(cache, "_tokenize_text_files", lambda spec, path: pytest.fail("tokenized again"))
    assert text_files(tmp_path, files, tokenizer="bytes").corpus.path == first.corpus.path


@pytest.mark.parametrize(
    "files,message",
    [
        (None, r"^corpus text_files needs data\.files, one UTF-8 text file per split: "),
        ({"train": "a.txt", "valid": "a.txt"}, r"^data\.files has no file for \['test'\]: give all of"),
        ({"train": "a.txt", "valid": "a.txt", "test": "a.txt", "dev": "a.txt"}, r"unknown splits \['dev'\]"),
        (
            {"train": "a.txt", "valid": "a.txt", "test": "nope.txt"},
            r"^data\.files test: .*nope\.txt does not",
        ),
        ({"train": "dir", "valid": "a.txt", "test": "a.txt"}, r"^data\.files train: .*dir is not a regular"),
        (
            {"train": "a.txt", "valid": "empty.txt", "test": "a.txt"},
            r"^data\.files valid: .*empty\.txt is empty",
        ),
        (
            {"train": "short.txt", "valid": "a.txt", "test": "a.txt"},
            r"^data\.files train: .*short\.txt has 16 bytes, fewer than the 17 tokens of one batch "
            r"\(batch_size x tgt_len \+ 1\); give a longer file or lower data\.batch_size or data\.tgt_len$",
        ),
    ],
)
def test_bad_files_are_one_line_errors_at_init(tmp_path, files, message):
    (tmp_path / "a.txt").write_text(TEXT, encoding="utf-8")
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "short.txt").write_bytes(b"s" * 16)
    (tmp_path / "dir").mkdir()
    files = None if files is None else {s: str(tmp_path / f) for s, f in files.items()}
    with pytest.raises(TextFileError, match=message) as error:
        LMDataModule(
            "text_files", files=files, cache_dir=str(tmp_path), tokenizer="bytes", batch_size=2, tgt_len=8
        )
    assert "\n" not in str(error.value) and isinstance(error.value, ValueError)


@pytest.mark.skipif(sys.platform == "win32" or os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_is_a_one_line_error(tmp_path):
    (tmp_path / "a.txt").write_text(TEXT, encoding="utf-8")
    (tmp_path / "a.txt").chmod(0)
    files = {s: str(tmp_path / "a.txt") for s in ("train", "valid", "test")}
    with pytest.raises(
        TextFileError, match=r"^data\.files train: cannot read .*a\.txt \(Permission denied\)$"
    ):
        LMDataModule("text_files", files=files, cache_dir=str(tmp_path))


def test_files_belong_to_text_files_only(tmp_path):
    with pytest.raises(ValueError, match=r"^data\.files applies to corpus text_files; sample reads its own"):
        LMDataModule("sample", files={"train": "a.txt"}, cache_dir=str(tmp_path))


def test_a_file_that_is_not_utf8_names_the_byte(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"caf\xe9 au lait " * 4)
    with pytest.raises(DataError, match=r"a\.txt is not UTF-8 text \(byte 3 is b'\\xe9'\); convert it"):
        text_files(tmp_path, {"train": "a.txt", "valid": "a.txt", "test": "a.txt"}, tokenizer="bytes")


def test_a_bpe_split_with_fewer_tokens_than_one_batch_fails_at_setup(tmp_path):
    """Enough bytes for one batch, but the BPE merges them into fewer tokens than one batch reads."""
    text = "aaaa " * 40
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([text], vocab_size=270, min_frequency=1, show_progress=False)
    (tmp_path / "bpe").mkdir()
    bpe.save_model(str(tmp_path / "bpe"))
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    files = {"train": "a.txt", "valid": "a.txt", "test": "a.txt"}
    with pytest.raises(
        TextFileError, match=r"^data\.files train: .*a\.txt has \d\d tokens, fewer than the 161 "
    ):
        text_files(
            tmp_path, files, tokenizer=str(tmp_path / "bpe"), batch_size=4, tgt_len=40, eval_batch_size=1
        )


def test_the_cli_reports_a_missing_file_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    files = "{train: missing.txt, valid: missing.txt, test: missing.txt}"
    args = ["fit", "--data.corpus", "text_files", "--data.files", files, "--data.tokenizer", "bytes"]
    with pytest.raises(SystemExit) as exit_info:
        cli_main([*args, "--model", "longctx.methods.window_transformer.module.WindowTransformerLM"])
    assert exit_info.value.code == (
        f"error: data: LMDataModule: data.files train: missing.txt does not exist (relative to {tmp_path})"
    )


def test_prepare_builds_the_cache_of_text_files(tmp_path, capsys):
    (tmp_path / "a.txt").write_text(TEXT, encoding="utf-8")
    files = f"{{train: {tmp_path / 'a.txt'}, valid: {tmp_path / 'a.txt'}, test: {tmp_path / 'a.txt'}}}"
    cache_dir = tmp_path / "cache"
    data_main(
        ["prepare", "text_files", "--files", files, "--tokenizer", "bytes", "--cache_dir", str(cache_dir)]
    )
    printed = capsys.readouterr().out
    assert f"text_files: vocabulary 256, cache {cache_dir}/text_files-" in printed
    assert f"  test  {len(TEXT.encode()):>14,d} tokens (uint8)" in printed


def test_a_file_edited_between_naming_the_cache_and_reading_it_is_refused(tmp_path, monkeypatch):
    """The cache folder is named by the content digest before the file is read: ids of newer content
    must never be stored under the older content's name."""
    path = tmp_path / "a.txt"
    path.write_text("x" * 64, encoding="utf-8")
    files = {"train": "a.txt", "valid": "a.txt", "test": "a.txt"}
    read_bytes = Path.read_bytes

    def edited_just_before_reading(self: Path) -> bytes:
        if self == path:
            path.write_text("y" * 80, encoding="utf-8")
        return read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", edited_just_before_reading)
    with pytest.raises(
        DataError, match=r"^data\.files train: .*a\.txt changed while it was being read; run again$"
    ):
        text_files(tmp_path, files, tokenizer="bytes")


def test_a_recipes_split_sources_do_not_reroute_the_files(tmp_path, caplog):
    """The tiny recipes set split_sources for their own corpus ({train: valid, ...}); on text_files
    each split must still read its own file."""
    (tmp_path / "a.txt").write_text(TEXT, encoding="utf-8")
    (tmp_path / "b.txt").write_text(TEXT[::-1], encoding="utf-8")
    sources = {"train": "valid", "valid": "test", "test": "test"}
    files = {"train": "a.txt", "valid": "b.txt", "test": "b.txt"}
    data = text_files(tmp_path, files, tokenizer="bytes", split_sources=sources)
    assert bytes(data.corpus.split("train").tokens) == TEXT.encode()
    assert "data.split_sources is ignored by corpus text_files" in caplog.text


def test_the_data_root_plays_no_part_for_text_files(tmp_path):
    """Offline, with a data root that does not exist (`$LONGCTX_DATA` unset on a fresh machine): the
    user's files are read, nothing is created at the root, and the cache does not depend on it."""
    (tmp_path / "a.txt").write_text(TEXT, encoding="utf-8")
    files = {"train": "a.txt", "valid": "a.txt", "test": "a.txt"}
    caches = set()
    for root in ("nowhere", "elsewhere"):
        data = text_files(tmp_path, files, tokenizer="bytes", root=str(tmp_path / root), download=False)
        assert bytes(data.corpus.split("train").tokens) == TEXT.encode()
        assert not (tmp_path / root).exists()
        caches.add(data.corpus.path)
    assert len(caches) == 1


# ------------------------------------------------------------------ tokenizer: words
WORD_TRAIN = "k1 v7 k2 v3 f0 k1 v7\nf0 f0 k2 v3\n\nk9  v7\tf0\r\n"
WORD_EVAL = "k1 v8 f0 zz\nk2 v3\n"


def word_ids_by_hand(text: str, vocabulary: list[str]) -> list[int]:
    """Whitespace tokens of every line plus `<eos>` at its end, looked up (`<unk>` when absent)."""
    index = {word: i for i, word in enumerate(vocabulary)}
    lines = text.replace("\r\n", "\n").split("\n")[:-1]  # every line above ends with a newline
    return [index.get(word, index["<unk>"]) for line in lines for word in [*line.split(), "<eos>"]]


def test_words_vocabulary_comes_from_train_and_other_words_are_unk_and_counted(tmp_path):
    (tmp_path / "train.txt").write_text(WORD_TRAIN, encoding="utf-8")
    (tmp_path / "eval.txt").write_text(WORD_EVAL, encoding="utf-8")
    files = {"train": "train.txt", "valid": "eval.txt", "test": "eval.txt"}
    data = text_files(tmp_path, files, tokenizer="words", batch_size=1, tgt_len=4)
    # <eos> first, then by decreasing count in train, ties in order of first appearance; <unk> last.
    vocabulary = ["<eos>", "f0", "v7", "k1", "k2", "v3", "k9", "<unk>"]
    assert (data.corpus.path / "vocab.txt").read_text().split("\n")[:-1] == vocabulary
    assert (data.vocab_size, data.metric) == (len(vocabulary), "ppl")
    for split, text in (("train", WORD_TRAIN), ("valid", WORD_EVAL), ("test", WORD_EVAL)):
        assert data.corpus.split(split).tokens.tolist() == word_ids_by_hand(text, vocabulary)
    assert data.out_of_vocabulary()["valid"] == {"tokens": 8, "oov_tokens": 2, "oov_fraction": 2 / 8}
    assert data.out_of_vocabulary()["train"]["oov_tokens"] == 0
    # Bits per byte count the normalised text: each word and one space, a newline per line.
    train = data.corpus.split("train").tokens
    normalised = sum(sum(len(word) + 1 for word in line.split()) + 1 for line in WORD_TRAIN.splitlines())
    assert int(data.corpus.token_bytes[train].sum()) == normalised


def test_words_vocabulary_size_is_read_at_init_and_an_edited_file_is_tokenized_again(tmp_path, monkeypatch):
    """The CLI links data.vocab_size after __init__: the words vocabulary is built then; an edit that
    keeps the size changes the cache (it is keyed by content)."""
    path = tmp_path / "a.txt"
    path.write_text("a b c\nb c\n", encoding="utf-8")
    files = {s: str(path) for s in ("train", "valid", "test")}
    options = {"cache_dir": str(tmp_path / "cache"), "tokenizer": "words", "batch_size": 1, "tgt_len": 2}
    before = LMDataModule("text_files", files=files, **options)
    assert before.vocab_size == 5  # <eos> b c a <unk>
    before_cache = before.spec.path
    path.write_text("a b d\nd d\n", encoding="utf-8")
    monkeypatch.setattr(cache, "_SOURCE_DIGESTS", {})  # a new run: a new process
    after = LMDataModule("text_files", files=files, **options)
    after.prepare_data()
    after.setup()
    assert after.vocab_size == 5 and after.corpus.path != before_cache
    assert (after.corpus.path / "vocab.txt").read_text().split() == ["<eos>", "d", "a", "b", "<unk>"]


def test_a_words_split_with_fewer_tokens_than_one_batch_fails_at_setup(tmp_path):
    (tmp_path / "a.txt").write_text("longword " * 10, encoding="utf-8")  # 90 bytes, 11 tokens
    message = r"^data\.files train: .*a\.txt has 11 tokens, fewer than the 33 "
    with pytest.raises(TextFileError, match=message):
        text_files(tmp_path, {s: "a.txt" for s in ("train", "valid", "test")}, tokenizer="words", tgt_len=16)


def test_the_words_tokenizer_belongs_to_text_files(tmp_path):
    message = r"^data\.tokenizer: words reads your own files \(corpus text_files\)"
    with pytest.raises(ValueError, match=message):
        LMDataModule("wikitext103_raw", tokenizer="words", cache_dir=str(tmp_path))


def test_a_checkpoint_read_with_another_word_vocabulary_is_refused(tmp_path, caplog):
    """A words vocabulary orders its words by their counts in the train file: another train file of
    the same words gives the same ids to other words, so a checkpoint scored on it would be silently
    wrong; the checkpoint keeps its vocabulary's digest and such a read is refused."""
    (tmp_path / "a.txt").write_text("k1 v7 k1 v7 k2\n" * 40, encoding="utf-8")
    (tmp_path / "b.txt").write_text("k2 v7 k2 v7 k1\n" * 40, encoding="utf-8")
    options = dict(tokenizer="words", batch_size=2, tgt_len=4)
    only_a, only_b = ({split: name for split in ("train", "valid", "test")} for name in ("a.txt", "b.txt"))
    a, b = text_files(tmp_path, only_a, **options), text_files(tmp_path, only_b, **options)
    assert a.vocab_size == b.vocab_size and a.vocabulary_digest != b.vocabulary_digest
    assert text_files(tmp_path, only_a, tokenizer="bytes").vocabulary_digest is None  # fixed ids

    model = tiny("transformer_xl", vocab_size=a.vocab_size)
    run_dir = tmp_path / "run_a"
    fit = cpu_trainer(run_dir, max_steps=1, limit_val_batches=0, callbacks=[RunVocabulary()])
    fit.fit(model, datamodule=a)
    checkpoint = tmp_path / "a.ckpt"
    model.trainer.save_checkpoint(checkpoint)
    assert torch.load(checkpoint, weights_only=True)[VOCABULARY_KEY]["digest"] == a.vocabulary_digest

    def test_on(data: LMDataModule) -> None:
        trainer = cpu_trainer(tmp_path, limit_test_batches=1)
        trainer.test(model, datamodule=data, ckpt_path=checkpoint, verbose=False)

    test_on(a)  # its own vocabulary
    refusal = r"^the checkpoint.s word vocabulary \(5 words, .* --data\.vocab_file <its run directory>/vocab"
    with pytest.raises(DataMismatch, match=refusal):
        test_on(b)
    b_vocabulary = b.corpus.path / "vocab.txt"
    imported = rf"is not this data.s \(5 words, from data\.vocab_file {b_vocabulary}\): the same ids"
    with pytest.raises(DataMismatch, match=imported):
        test_on(text_files(tmp_path, only_b, vocab_file=str(b_vocabulary), **options))
    # The way out the line names: b read with the vocabulary the checkpoint was trained with, which
    # the fit kept in its run directory.
    a_vocabulary = run_dir / "vocabulary.txt"
    assert a_vocabulary.read_bytes() == (a.corpus.path / "vocab.txt").read_bytes()
    b_as_a = text_files(tmp_path, only_b, vocab_file=str(a_vocabulary), **options)
    assert b_as_a.vocabulary_digest == a.vocabulary_digest
    ids_by_hand = word_ids_by_hand((tmp_path / "b.txt").read_text(), a_vocabulary.read_text().split())
    assert b_as_a.corpus.split("test").tokens.tolist() == ids_by_hand
    test_on(b_as_a)
    # A checkpoint that records no vocabulary (converted, or saved before they kept one) cannot be
    # checked: said once, not refused.
    unrecorded = torch.load(checkpoint, weights_only=True)
    del unrecorded[VOCABULARY_KEY]
    checkpoint = tmp_path / "unrecorded.ckpt"
    torch.save(unrecorded, checkpoint)
    with caplog.at_level(logging.INFO):
        test_on(b)
    assert "longctx: the checkpoint records no word vocabulary (converted, or saved before" in caplog.text
