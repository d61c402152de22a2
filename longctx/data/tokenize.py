"""Tokenizers: bytes and text8 characters (pure numpy), Transformer-XL words, GPT-2 BPE.

- enwik8 / sample: every byte is a token (ids 0..255), `np.frombuffer`, no copy.
- text8: 27 symbols (space, a-z) through a 256-entry lookup table: one numpy gather.
- WikiText (word level), exactly as Transformer-XL's `Vocab` (kimiyoung/transformer-xl,
  `pytorch/utils/vocabulary.py`): each line stripped, split on whitespace, `<eos>` appended; the
  vocabulary is `<eos>` then every other symbol by decreasing count (ties in order of first
  appearance, as `Counter.most_common`).
- GPT-2 BPE through `tokenizers` (Rust), from OpenAI's `encoder.json`/`vocab.bpe` or Hugging Face's
  `vocab.json`/`merges.txt` (plain or gzipped). Long texts are encoded in chunks cut only where the
  GPT-2 pre-tokenizer cannot merge across the cut, so the ids equal those of one call on the whole
  text (tested) while memory stays bounded.
- Raw-text corpora (WikiText-103 raw, PG-19) can also be read at byte level (`ByteEncoder`), so
  byte-level methods train on the very text a BPE model reads.

Bits per byte: every tokenizer gives a per-id table of the UTF-8 bytes a token stands for, so the
bytes of any scored targets are `table[targets].sum()`:

- bytes: 1 per id; text8 characters: 1 per id (a-z and space are ASCII);
- words: the UTF-8 bytes of the word plus 1 for the space after it; `<eos>` stands for the newline
  (1 byte). A split's total is the bytes of its *normalised text*: every word followed by one space,
  every line ended by a newline (a WikiText `.tokens` file is exactly that plus the one space that
  opens each of its lines);
- GPT-2 BPE: the exact bytes of each token (byte-level BPE maps every byte to one symbol of its
  256-symbol alphabet; special tokens count the bytes of their text), so a split's total is the
  bytes of the raw file.
"""

from __future__ import annotations

import io
import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from itertools import repeat
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from longctx.data.download import existing, open_maybe_gz

EOS = "<eos>"
BYTES_DTYPE = np.uint32  # dtype of the bytes-per-id tables (a WikiText "word" may be long)
UNK = "<unk>"
TEXT8_ALPHABET = b" abcdefghijklmnopqrstuvwxyz"
GPT2_EOT = "<|endoftext|>"


def smallest_uint(max_value: int) -> np.dtype:
    """The smallest unsigned dtype holding ids 0..max_value."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if max_value <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.uint64)


# ---------------------------------------------------------------------------------- bytes, chars
def encode_bytes(data: bytes) -> np.ndarray:
    """Byte-level ids (uint8), a zero-copy view of `data`."""
    return np.frombuffer(data, dtype=np.uint8)


_TEXT8_TABLE = np.full(256, 255, dtype=np.uint8)
_TEXT8_TABLE[np.frombuffer(TEXT8_ALPHABET, dtype=np.uint8)] = np.arange(len(TEXT8_ALPHABET))


def encode_text8(data: bytes) -> np.ndarray:
    """text8 character ids (uint8): space = 0, a..z = 1..26."""
    ids = _TEXT8_TABLE[np.frombuffer(data, dtype=np.uint8)]
    bad = np.flatnonzero(ids == 255)
    if bad.size:
        raise ValueError(
            f"text8 holds only space and a-z; byte {bytes([data[bad[0]]])!r} at offset {bad[0]:,} is "
            "neither: this is not the text8 file"
        )
    return ids


def unit_token_bytes(vocab_size: int) -> np.ndarray:
    """Bytes per id when every id is one byte (bytes, text8 characters): (vocab_size,) ones."""
    return np.ones(vocab_size, dtype=BYTES_DTYPE)


class ByteEncoder:
    """Raw text at byte level (ids 0..255 = the UTF-8 bytes): what byte-level methods read."""

    vocab_size = 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)

    def token_bytes(self) -> np.ndarray:
        return unit_token_bytes(self.vocab_size)


# ---------------------------------------------------------------------------------- words
def read_lines(path: Path) -> Iterator[str]:
    """Lines as Python's text mode yields them (universal newlines), as the reference code reads."""
    with open_maybe_gz(path) as raw:
        yield from io.TextIOWrapper(raw, encoding="utf-8")


def line_symbols(line: str) -> list[str]:
    """Transformer-XL's `tokenize(line, add_eos=True)`: strip, split on whitespace, append <eos>."""
    return [*line.strip().split(), EOS]


def line_blocks(lines: Iterable[str], size: int = 4096) -> Iterator[list[str]]:
    """`lines` in lists of `size` (the last one shorter)."""
    block: list[str] = []
    for line in lines:
        block.append(line)
        if len(block) == size:
            yield block
            block = []
    if block:
        yield block


def text_lines(text: str) -> Iterator[str]:
    """The lines of a text as `read_lines` yields those of a file (universal newlines)."""
    return iter(io.StringIO(text, newline=None))


class WordVocab:
    """Word vocabulary in Transformer-XL order: `<eos>`, then symbols by decreasing count."""

    def __init__(self, symbols: list[str]) -> None:
        self.symbols = symbols
        self.index = {s: i for i, s in enumerate(symbols)}

    @classmethod
    def build(cls, files: Iterable[Path]) -> WordVocab:
        return cls.from_lines(line for path in files for line in read_lines(path))

    @classmethod
    def from_lines(cls, lines: Iterable[str]) -> WordVocab:
        """`<eos>`, then every other symbol of `lines` by decreasing count (ties in order of first
        appearance, as `Counter.most_common`)."""
        counter: Counter[str] = Counter()
        for line in lines:
            counter.update(line_symbols(line))
        symbols = [EOS] + [s for s, _ in counter.most_common() if s != EOS]
        return cls(symbols)

    def with_unk(self) -> WordVocab:
        """This vocabulary with `<unk>` appended when it lacks one, so words of other text map to it
        (the ids of its own symbols unchanged)."""
        return self if UNK in self.index else WordVocab([*self.symbols, UNK])

    def __len__(self) -> int:
        return len(self.symbols)

    def encode_file(self, path: Path) -> np.ndarray:
        """Ids of every symbol of the file; words not in the vocabulary become `<unk>`."""
        return self.encode_file_counting_unknown(path)[0]

    def encode_file_counting_unknown(self, path: Path) -> tuple[np.ndarray, int]:
        """`encode_file`'s ids and how many symbols were not in the vocabulary (mapped to `<unk>`:
        the out-of-vocabulary count; a `<unk>` written in the text is a symbol of the vocabulary)."""
        return self.encode_lines(read_lines(path), str(path))

    def encode_lines(self, lines: Iterable[str], source: str) -> tuple[np.ndarray, int]:
        """Ids of every symbol of `lines` (`line_symbols`: each line's words, then `<eos>`; `source`
        names the text in errors) and the number of symbols not in the vocabulary (mapped to `<unk>`).
        Lines are encoded in blocks into arrays of the smallest dtype, so a long text never becomes
        one list of Python objects (20M tokens: about 10 s here)."""
        index, unk = self.index, self.index.get(UNK)
        dtype = smallest_uint(len(self) - 1)
        chunks: list[np.ndarray] = []
        unknown = 0
        for block in line_blocks(lines):
            symbols = f" {EOS} ".join(block).split()  # each line's words, <eos> between lines
            symbols.append(EOS)
            ids = np.fromiter(map(index.get, symbols, repeat(-1)), np.int64, len(symbols))
            if (missing := np.flatnonzero(ids < 0)).size:
                if unk is None:
                    raise ValueError(
                        f"{source}: word {symbols[missing[0]]!r} is not in the vocabulary and the vocabulary "
                        f"has no {UNK}; build the vocabulary from a split that covers this one"
                    )
                ids[missing] = unk
                unknown += missing.size
            chunks.append(ids.astype(dtype))
        return (np.concatenate(chunks) if chunks else np.zeros(0, dtype)), unknown

    def save(self, path: Path) -> None:
        path.write_text("\n".join(self.symbols) + "\n", encoding="utf-8")

    def token_bytes(self) -> np.ndarray:
        """(V,) bytes of each symbol in the normalised text: UTF-8 bytes + 1 separator; `<eos>` = 1."""
        table = np.fromiter((len(s.encode("utf-8")) + 1 for s in self.symbols), BYTES_DTYPE, len(self))
        if EOS in self.index:
            table[self.index[EOS]] = 1  # the newline
        return table

    @classmethod
    def load(cls, path: Path) -> WordVocab:
        return cls(path.read_text(encoding="utf-8").split("\n")[:-1])


def count_words(text: str) -> dict[str, int]:
    """Words of a raw text under both conventions: whitespace tokens, and those plus one per line
    (the count Transformer-XL's word-level files give, used for perplexity per word). Lines are
    split as `read_lines` splits them (universal newlines)."""
    words = lines = 0
    for line in io.StringIO(text, newline=None):
        words += len(line.split())
        lines += 1
    return {"whitespace": words, "whitespace_eos": words + lines}


# ---------------------------------------------------------------------------------- GPT-2 BPE
VOCAB_NAMES = ("vocab.json", "encoder.json")
MERGES_NAMES = ("merges.txt", "vocab.bpe")


def gpt2_files(folder: Path) -> tuple[Path, Path] | None:
    """The vocabulary and merges files of a GPT-2 tokenizer folder (plain or gzipped), if present."""
    vocab = next((p for n in VOCAB_NAMES if (p := existing(folder, n))), None)
    merges = next((p for n in MERGES_NAMES if (p := existing(folder, n))), None)
    return (vocab, merges) if vocab and merges else None


def gpt2_tokenizer_from_files(vocab_path: Path, merges_path: Path) -> Tokenizer:
    """GPT-2's byte-level BPE (no prefix space, `<|endoftext|>` special) from its two files."""
    with open_maybe_gz(vocab_path) as f:
        vocab = json.load(f)
    with open_maybe_gz(merges_path) as f:
        lines = f.read().decode("utf-8").split("\n")
    merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([GPT2_EOT])
    return tokenizer


# A cut before a line is safe when the GPT-2 pre-tokenizer splits there anyway: the next line starts
# with one space then a non-space (the whitespace before it is its own pre-token whatever follows), or
# it starts with a non-space and the text before ends in exactly one whitespace character.
_SAFE_NEXT_SPACE = re.compile(r" \S")
_SAFE_NEXT_WORD = re.compile(r"\S")


def _safe_cut(before: str, after: str) -> bool:
    if not before or not after or not before[-1].isspace():
        return False
    if _SAFE_NEXT_SPACE.match(after):
        return True
    return bool(_SAFE_NEXT_WORD.match(after)) and len(before) >= 2 and not before[-2].isspace()


def text_chunks(text: str, chunk_chars: int) -> Iterator[str]:
    """Pieces of about `chunk_chars` characters, cut only at safe line boundaries."""
    start, cursor = 0, 0
    while cursor < len(text):
        newline = text.find("\n", cursor)
        if newline < 0:
            break
        cursor = newline + 1
        if cursor - start >= chunk_chars and _safe_cut(text[start:cursor], text[cursor : cursor + 2]):
            yield text[start:cursor]
            start = cursor
    if start < len(text):
        yield text[start:]


def bpe_token_bytes(tokenizer: Tokenizer) -> np.ndarray:
    """(V,) bytes each id of a byte-level BPE stands for: one per symbol of its token string (each
    symbol of the byte-level alphabet is one byte); added tokens count the UTF-8 bytes of their text."""
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    table = np.zeros(tokenizer.get_vocab_size(), dtype=BYTES_DTYPE)
    added = tokenizer.get_added_tokens_decoder()
    for token, i in tokenizer.get_vocab(with_added_tokens=True).items():
        if i in added:
            table[i] = len(added[i].content.encode("utf-8"))
        elif set(token) <= alphabet:
            table[i] = len(token)
        else:
            raise ValueError(
                f"token {token!r} (id {i}) is not byte-level BPE: bits per byte needs a byte-level "
                "tokenizer such as GPT-2's; point data.tokenizer at one"
            )
    return table


class BPEEncoder:
    """GPT-2 BPE on raw text (see `encode_bpe`)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()

    def encode(self, text: str) -> np.ndarray:
        return encode_bpe(self.tokenizer, text)

    def token_bytes(self) -> np.ndarray:
        return bpe_token_bytes(self.tokenizer)


def encode_bpe(tokenizer: Tokenizer, text: str, chunk_chars: int = 1 << 13) -> np.ndarray:
    """GPT-2 ids (uint16) of a text, encoded in safe chunks (equal to encoding it whole)."""
    chunks = list(text_chunks(text, chunk_chars))
    parts = [
        np.asarray(e.ids, dtype=np.uint16) for e in tokenizer.encode_batch(chunks, add_special_tokens=False)
    ]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)
