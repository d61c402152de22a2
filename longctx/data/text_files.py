"""`data.corpus: text_files`: the user's own UTF-8 text files as a corpus, checked before anything runs.

`data.files` maps each split to a file (`{train: a.txt, valid: b.txt, test: b.txt}`; one file may feed
several splits; relative paths are relative to the working directory). Everything a user can get
wrong about the files is found in the data module's `__init__`, where the CLI turns it into one line:
a split without a file, a file that is missing, unreadable or empty, or one with fewer bytes than one
batch needs tokens (a token is at least one byte for every tokenizer). The exact token count of a BPE
split is known only once it is tokenized; `LMDataModule.setup` checks it with `check_split_tokens`.
Tokenizing, caching and noticing edited files is `cache.py`'s job (`_tokenize_text_files`, `source_digest`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from longctx.data.cache import SPLITS
from longctx.data.download import DataError


class TextFileError(DataError, ValueError):
    """A `data.files` entry is missing, unreadable, empty or too short (a ValueError too, so the CLI
    reports it in one line when the data module's `__init__` raises it)."""


def check_text_files(files: Mapping[str, str] | None, needs: Mapping[str, int]) -> dict[str, Path]:
    """The file of each split, each one readable and holding at least `needs[split]` bytes.

    needs: the tokens one batch of each split reads (rows x segment + 1): a file with fewer bytes
    cannot hold that many tokens.
    """
    if not files:
        raise TextFileError(
            "corpus text_files needs data.files, one UTF-8 text file per split: "
            "--data.files '{train: train.txt, valid: valid.txt, test: test.txt}'"
        )
    if unknown := sorted(set(files) - set(SPLITS)):
        raise TextFileError(f"data.files has unknown splits {unknown}; use {list(SPLITS)}")
    if missing := [split for split in SPLITS if split not in files]:
        raise TextFileError(
            f"data.files has no file for {missing}: give all of {list(SPLITS)} (one file may serve several "
            "splits, e.g. {train: a.txt, valid: b.txt, test: b.txt})"
        )
    paths = {split: Path(files[split]).expanduser() for split in SPLITS}
    for split, path in paths.items():
        size = _readable_size(split, path)
        if size == 0:
            raise TextFileError(f"data.files {split}: {path} is empty; give a file with text in it")
        if size < needs[split]:
            raise TextFileError(too_short(split, path, f"{size:,} bytes", needs[split]))
    return paths


def check_split_tokens(split: str, path: Path, n_tokens: int, need: int) -> None:
    """A tokenized split must fill one batch (BPE tokens are known only after tokenizing)."""
    if n_tokens < need:
        raise TextFileError(too_short(split, path, f"{n_tokens:,} tokens", need))


def too_short(split: str, path: Path, has: str, need: int) -> str:
    loader = "batch_size x tgt_len" if split == "train" else "eval_batch_size x eval_tgt_len"
    return (
        f"data.files {split}: {path} has {has}, fewer than the {need:,} tokens of one batch ({loader} + 1); "
        f"give a longer file or lower data.{loader.replace(' x ', ' or data.')}"
    )


def _readable_size(split: str, path: Path) -> int:
    """The file's size, after reading its first byte (a permission problem shows here, not mid-run)."""
    if not path.exists():
        raise TextFileError(f"data.files {split}: {path} does not exist (relative to {Path.cwd()})")
    if not path.is_file():
        raise TextFileError(f"data.files {split}: {path} is not a regular file; give a UTF-8 text file")
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as err:
        raise TextFileError(f"data.files {split}: cannot read {path} ({err.strerror or err})") from err
    return path.stat().st_size
