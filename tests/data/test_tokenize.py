"""Tokenizers on real text: GPT-2 BPE equals Hugging Face's, chunking changes nothing, the byte/char
paths and the enwik8/text8 90M/5M/5M split convention."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib

import numpy as np
import pytest

from longctx.data import cache, corpora
from longctx.data.cache import CorpusSpec, load_corpus, prepare_corpus
from longctx.data.corpora import Checksum
from longctx.data.tokenize import (
    ByteEncoder,
    WordVocab,
    bpe_token_bytes,
    count_words,
    encode_bpe,
    encode_text8,
    gpt2_tokenizer_from_files,
    text_chunks,
    unit_token_bytes,
)
from tests.helpers.environment import shared_dir, skip_without_shared

SHARED = shared_dir() / "data"
needs_shared = skip_without_shared("data")


@pytest.fixture(scope="module")
def gpt2():
    return gpt2_tokenizer_from_files(SHARED / "gpt2" / "encoder.json.gz", SHARED / "gpt2" / "vocab.bpe.gz")


@needs_shared
def test_gpt2_bpe_equals_hugging_face(gpt2, tmp_path):
    from transformers import GPT2Tokenizer

    (tmp_path / "vocab.json").write_bytes(gzip.decompress((SHARED / "gpt2" / "encoder.json.gz").read_bytes()))
    (tmp_path / "merges.txt").write_bytes(gzip.decompress((SHARED / "gpt2" / "vocab.bpe.gz").read_bytes()))
    reference = GPT2Tokenizer.from_pretrained(str(tmp_path))
    text = gzip.decompress((SHARED / "wikitext-raw" / "wiki.test.raw.gz").read_bytes()).decode()[:50_000]
    text += "<|endoftext|> don't  \n\n  spaces\t\ttabs"
    assert gpt2.get_vocab_size() == 50_257
    assert gpt2.encode(text).ids == reference(text)["input_ids"]


@needs_shared
@pytest.mark.parametrize("source", ["wikitext-raw/wiki.test.raw.gz", "pg19/gutenberg_source/10146.txt.gz"])
def test_chunked_bpe_equals_one_call_on_the_whole_text(gpt2, source):
    text = gzip.decompress((SHARED / source).read_bytes()).decode("utf-8-sig").replace("\r\n", "\n")
    whole = np.asarray(gpt2.encode(text).ids)
    chunks = list(text_chunks(text, 2_000))
    assert len(chunks) > 50 and "".join(chunks) == text
    np.testing.assert_array_equal(encode_bpe(gpt2, text, chunk_chars=2_000), whole)


@needs_shared
def test_wikitext_statistics():
    valid = SHARED / "wikitext-103" / "wiki.valid.tokens.gz"
    vocab = WordVocab.build([valid])
    ids = vocab.encode_file(valid)
    assert len(ids) == 217_646 and int((ids == 0).sum()) == 3_760  # one <eos> per line
    assert vocab.symbols[0] == "<eos>" and vocab.symbols[1] == "the"
    counts = np.bincount(ids, minlength=len(vocab))
    assert (np.diff(counts[1:]) <= 0).all()  # ordered by decreasing frequency
    raw = gzip.decompress((SHARED / "wikitext-raw" / "wiki.test.raw.gz").read_bytes()).decode()
    assert count_words(raw) == {
        "whitespace": 241_211,
        "whitespace_eos": 245_569,
    }


def test_text8_alphabet():
    np.testing.assert_array_equal(encode_text8(b" az b"), [0, 1, 26, 0, 2])
    with pytest.raises(ValueError, match=r"byte b'A' at offset 2 .*not the text8 file"):
        encode_text8(b"abAc")


@pytest.mark.parametrize("name", ["enwik8", "text8"])
def test_contiguous_split_convention(monkeypatch, tmp_path, name):
    """The last n_test units are test, the n_valid before them validation (here 50 + 50 of 1,000)."""
    rng = np.random.default_rng(0)
    data = bytes(rng.choice(np.frombuffer(b" abcdefghijklmnopqrstuvwxyz", np.uint8), 1_000))
    folder = tmp_path / "raw" / name
    folder.mkdir(parents=True)
    (folder / name).write_bytes(data)
    corpus = corpora.CORPORA[name]
    member = dataclasses.replace(
        corpus.archive.members[0], checksum=Checksum("md5", hashlib.md5(data).hexdigest())
    )
    archive = dataclasses.replace(corpus.archive, members=(member,))
    monkeypatch.setitem(corpora.CORPORA, name, dataclasses.replace(corpus, archive=archive))
    monkeypatch.setattr(cache, "CONTIGUOUS_SPLIT", {"valid": 50, "test": 50})
    spec = CorpusSpec(name, root=tmp_path / "raw", cache_dir=tmp_path / "cache", download=False)
    prepare_corpus(spec)
    splits = load_corpus(spec).splits
    assert [len(splits[s].tokens) for s in ("train", "valid", "test")] == [900, 50, 50]
    whole = encode_text8(data) if name == "text8" else np.frombuffer(data, np.uint8)
    np.testing.assert_array_equal(splits["valid"].tokens, whole[900:950])
    np.testing.assert_array_equal(splits["test"].tokens, whole[950:])
    assert splits["train"].tokens.dtype == np.uint8


# ---------------------------------------------------------------------------------- bytes per token
MULTIBYTE = " = Café Ærø = \n \n naïve 日本語 text — ünïcödé , 10 @,@ 000 € \n\n the end \n"


def test_byte_encoder_counts_every_utf8_byte():
    encoder = ByteEncoder()
    ids = encoder.encode(MULTIBYTE)
    assert encoder.token_bytes()[ids].sum() == len(MULTIBYTE.encode("utf-8")) > len(MULTIBYTE)


def test_text8_characters_are_one_byte_each():
    ids = encode_text8(b"the cat sat")
    assert unit_token_bytes(27)[ids].sum() == 11


def test_word_bytes_sum_to_the_normalised_text(tmp_path):
    """Each word + one space, each line ended by a newline: the file minus each line's opening space."""
    path = tmp_path / "wiki.tokens"
    path.write_text(MULTIBYTE, encoding="utf-8")
    vocab = WordVocab.build([path])
    ids = vocab.encode_file(path)
    normalised = "".join("".join(f"{w} " for w in line.split()) + "\n" for line in MULTIBYTE.splitlines())
    assert vocab.token_bytes()[ids].sum() == len(normalised.encode("utf-8"))
    assert (
        len(normalised.encode("utf-8")) == len(MULTIBYTE.encode("utf-8")) - 4
    )  # blank line "\n" had no space


@needs_shared
def test_wikitext_word_bytes_are_the_file_minus_one_space_per_line():
    valid = SHARED / "wikitext-103" / "wiki.valid.tokens.gz"
    raw = gzip.decompress(valid.read_bytes())
    vocab = WordVocab.build([valid])
    assert vocab.token_bytes()[vocab.encode_file(valid)].sum() == len(raw) - raw.count(b"\n")


@needs_shared
def test_bpe_bytes_are_the_exact_bytes_of_each_token(gpt2):
    text = gzip.decompress((SHARED / "wikitext-raw" / "wiki.test.raw.gz").read_bytes()).decode()
    text += MULTIBYTE + "<|endoftext|>"
    table = bpe_token_bytes(gpt2)
    ids = encode_bpe(gpt2, text)
    assert table[ids].sum() == len(text.encode("utf-8"))
    assert table[50256] == len(b"<|endoftext|>") and table.min() >= 1
    # Token by token: the byte-level decoder gives each token's text when its bytes are whole UTF-8.
    texts = gpt2.decode_batch([[i] for i in range(50256)])
    whole = [(i, t) for i, t in enumerate(texts) if "\ufffd" not in t]
    assert len(whole) > 49_000
    assert all(table[i] == len(t.encode("utf-8")) for i, t in whole)
