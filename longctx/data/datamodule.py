"""`LMDataModule`: one data module for every corpus and every method.

`prepare_data` downloads, verifies and tokenizes once (Lightning calls it on local rank 0 only);
`setup` memory-maps the token cache on every rank; the loaders are `SegmentStream`s, iterables that
Lightning never wraps in a `DistributedSampler`, so rows stay contiguous and each rank reads its own
block of rows.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import lightning.pytorch as pl
import numpy as np
import platformdirs
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from longctx.core.recall import TargetMarks
from longctx.data.cache import (
    BYTES_TOKENIZER,
    SPLITS,
    WORDS_TOKENIZER,
    CorpusSpec,
    TokenizedCorpus,
    load_corpus,
    prepare_corpus,
    source_digest,
    vocab_size_of,
)
from longctx.data.corpora import get_corpus
from longctx.data.induction import induction_marks
from longctx.data.layout import FAR_TEXT_LAYOUT_SETTINGS, FarTextLayout
from longctx.data.streams import LAYOUT_SETTINGS, SegmentStream, Wrap, evaluation_row_start
from longctx.data.synth import load_marks, marks_path
from longctx.data.text_files import TextFileError, check_split_tokens, check_text_files
from longctx.data.tokenize import EOS, WordVocab

log = logging.getLogger(__name__)


def default_root() -> Path:
    """Where raw corpus files live: `$LONGCTX_DATA`, else `~/.cache/longctx`."""
    return Path(os.environ.get("LONGCTX_DATA", Path.home() / ".cache" / "longctx")).expanduser()


class LMDataModule(pl.LightningDataModule):
    """Memory-carrying streams over one corpus.

    Args:
        corpus: enwik8, text8, wikitext103, wikitext2, wikitext103_raw, wikitext103_text, pg19, sample
            or text_files (your own files, `files`) (docs/data.md).
        files: text_files only: the UTF-8 text file of each split, `{train: a.txt, valid: b.txt,
            test: b.txt}` (one file may feed several splits; checked here, see `text_files.py`).
        root: directory of the raw files (downloaded there if missing and `download`); may be
            read-only. Default: `$LONGCTX_DATA` or `~/.cache/longctx`.
        cache_dir: the folder token caches are written to (one sub-folder per corpus, data root and
            tokenizer; never inside `root`). Default: `$LONGCTX_CACHE`, else `longctx/tokens` in the
            user's cache folder (`$XDG_CACHE_HOME` or `~/.cache` on Linux).
        download: allow network downloads; False fails with a message naming the expected files.
        split_sources: which corpus split feeds each split, e.g. `{train: valid, valid: test,
            test: test}` for smoke runs on a folder that has no train split.
        batch_size: global number of rows B in training (divided across ranks).
        tgt_len: training segment length L (segment mode) or window length T (window mode).
        eval_batch_size / eval_tgt_len: the same for validation and test (default: training's).
        mode: "segments" (Transformer-XL, Adaptive Span) or "windows" (recurrence on GPT-2).
        overlap / eval_overlap: window overlap o in training / evaluation (window mode).
        windows_per_batch: K windows of each row per training batch (backprop through K windows); in
            segment mode, K consecutive segments (B, K, L) for truncated backpropagation through K
            segments (the model's `tbptt_segments`); 1: one segment (B, L).
        far_text_layout: another training layout (rows, segments per row) for text whose answers are
            bound beyond their segment (`FarTextLayout`: fewer than `max_within` of the training
            answers bound within it, measured at `setup`; needs `train_targets` marked or
            induction); None: `batch_size` x `windows_per_batch` on any text.
        tokenizer: how the text corpora (wikitext103_raw, wikitext103_text, pg19, text_files) are
            tokenized: `gpt2` (GPT-2 BPE), a local directory or hub id of a byte-level BPE, or `bytes`
            (byte level: what Transformer-XL and Adaptive Span read to compare with GPT-2 on the same
            text); text_files also takes `words` (whitespace-separated words, `<eos>` per line, the
            vocabulary from the train file, other words scored as `<unk>` and counted).
        max_train_documents / max_eval_document_tokens: PG-19 subset (paper: 1,250 and 15,000).
        shuffle_documents: deal training documents in a new seeded order every epoch.
        seed: seed of that order and of the `train_wrap` offsets.
        train_wrap: where the training stream starts each epoch: `restart` (offset 0, the short last
            segment trained too; Transformer-XL) or `random_offset` (adaptive-span's trainer: every
            epoch after the first starts at a seeded random offset in [0, tgt_len) and only whole
            segments are trained). See `SegmentStream`.
        word_convention: how words are counted for `*/word_ppl`: whitespace tokens plus one per
            line (`whitespace_eos`, the Transformer-XL token count) or whitespace tokens only.
        mirror: base URL of a mirror serving the corpus files under their own names (docs/data.md).
        vocab_file: word corpora: tokenize with this vocabulary (one symbol per line, id = line
            number) instead of building one, e.g. the `.vocab.txt` that `python -m longctx convert`
            writes next to a released checkpoint, so the text gets the checkpoint's ids.
        train_targets: which training targets the loss counts. `all` (language modelling); `marked`:
            only those the train file's marks sidecar names (`python -m longctx.data synth`), e.g.
            MQAR's answers, as zoology trains associative recall (Arora et al. 2023, §3: the loss on
            the query answers alone; every other token is unpredictable filler or a fresh key). The
            evaluation still scores every target (`val/loss`); recall is read from `*/recall_acc*`.
            `induction`: only the targets that complete a pair of words seen at most
            `induction_window` tokens before (`longctx.data.induction`): the answers of any
            associative-recall text, read off the text itself, so a text another generator wrote
            (no sidecar) trains as `marked` does; its evaluation splits are marked by the same rule
            where they have no sidecar. `tokenizer: words` only.
        induction_window: `train_targets: induction`'s reach, in tokens (answer minus bound value).
    """

    def __init__(
        self,
        corpus: str = "sample",
        root: str | None = None,
        cache_dir: str | None = None,
        download: bool = True,
        split_sources: Mapping[str, str] | None = None,
        batch_size: int = 16,
        tgt_len: int = 128,
        eval_batch_size: int | None = None,
        eval_tgt_len: int | None = None,
        mode: Literal["segments", "windows"] = "segments",
        overlap: int = 0,
        eval_overlap: int | None = None,
        windows_per_batch: int = 1,
        far_text_layout: FarTextLayout | None = None,
        tokenizer: str = "gpt2",
        max_train_documents: int | None = None,
        max_eval_document_tokens: int | None = None,
        shuffle_documents: bool = False,
        seed: int = 0,
        train_wrap: Wrap = "restart",
        word_convention: Literal["whitespace_eos", "whitespace"] = "whitespace_eos",
        mirror: str | None = None,
        vocab_file: str | None = None,
        files: Mapping[str, str] | None = None,
        train_targets: Literal["all", "marked", "induction"] = "all",
        induction_window: int = 256,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.info = get_corpus(corpus)
        reads_words = self.info.unit == "word" or (self.info.user_files and tokenizer == WORDS_TOKENIZER)
        if vocab_file is not None and not reads_words:
            raise ValueError(
                f"data.vocab_file is a word vocabulary, but corpus {corpus} is not read as words (a word "
                "corpus, or text_files with data.tokenizer: words)"
            )
        check_positive(batch_size=batch_size, tgt_len=tgt_len, windows_per_batch=windows_per_batch)
        check_positive(eval_batch_size=eval_batch_size, eval_tgt_len=eval_tgt_len)
        if tokenizer == BYTES_TOKENIZER and self.info.unit != "bpe":
            raise ValueError(
                "data.tokenizer: bytes applies to the text corpora (wikitext103_raw, wikitext103_text, "
                f"pg19, text_files); {corpus} has fixed {self.info.unit} tokens: drop the option"
            )
        if tokenizer == WORDS_TOKENIZER and not self.info.user_files:
            raise ValueError(
                "data.tokenizer: words reads your own files (corpus text_files) as whitespace-separated "
                f"words; {corpus} has its own tokenizer: drop the option (word level: corpus wikitext103)"
            )
        if train_targets not in ("all", "marked", "induction"):
            raise ValueError(f"data.train_targets must be all, marked or induction, got {train_targets!r}")
        if train_targets == "induction" and not (self.info.user_files and tokenizer == WORDS_TOKENIZER):
            raise ValueError(
                "data.train_targets: induction marks repeated pairs of words: it reads corpus text_files "
                f"with data.tokenizer: words (got corpus {corpus}, tokenizer {tokenizer})"
            )
        check_positive(induction_window=induction_window)
        if train_targets == "marked" and not self.info.user_files:
            raise ValueError(
                "data.train_targets: marked trains on the targets a marks sidecar names (corpus text_files "
                f"written by `python -m longctx.data synth`); {corpus} has no marks: drop the option"
            )
        if files is not None and not self.info.user_files:
            raise ValueError(f"data.files applies to corpus text_files; {corpus} reads its own files")
        if self.info.user_files and split_sources is not None:
            # A config written for another corpus (e.g. the tiny recipes' {train: valid, ...}) must
            # still run on the user's files: their mapping is data.files.
            log.warning("data.split_sources is ignored by corpus text_files: data.files maps splits to files")
            split_sources = None
        if train_wrap == "random_offset" and (mode != "segments" or self.info.documents):
            raise ValueError(
                "data.train_wrap: random_offset (adaptive-span's wrap-around) needs mode: segments on a "
                f"contiguous corpus; {corpus} in mode {mode} takes train_wrap: restart"
            )
        if far_text_layout is not None and train_targets == "all":
            raise ValueError(
                "data.far_text_layout decides from the share of the training answers bound within their "
                "segment: it needs data.train_targets marked or induction (got all)"
            )
        most_rows = max(batch_size, far_text_layout.batch_size if far_text_layout else 0)
        most_windows = max(windows_per_batch, far_text_layout.windows_per_batch if far_text_layout else 0)
        if train_wrap == "random_offset" and most_windows > 1:
            raise ValueError(
                "data.train_wrap: random_offset (adaptive-span's wrap-around) serves one segment per "
                f"batch; with {most_windows} windows per batch use train_wrap: restart"
            )
        if split_sources is not None and (unknown := set(split_sources) - set(SPLITS)):
            raise ValueError(f"split_sources has unknown splits {sorted(unknown)}; use {list(SPLITS)}")
        if mode == "segments" and (overlap or eval_overlap):
            raise ValueError("overlap applies to mode: windows only; set data.mode: windows")
        check_overlap("overlap", overlap, tgt_len)
        if eval_overlap is not None:
            check_overlap("eval_overlap", eval_overlap, tgt_len if eval_tgt_len is None else eval_tgt_len)
        root_path = Path(root).expanduser() if root else default_root()
        user_files = None
        if self.info.user_files:
            eval_shape = (eval_batch_size or batch_size, eval_tgt_len or tgt_len)
            user_files = check_text_files(files, batch_tokens((most_rows, tgt_len), eval_shape))
        self.spec = CorpusSpec(
            name=corpus,
            root=root_path,
            cache_dir=Path(cache_dir).expanduser() if cache_dir else default_cache_dir(),
            download=download,
            split_sources=dict(split_sources) if split_sources else None,
            tokenizer=tokenizer,
            max_train_documents=max_train_documents,
            max_eval_document_tokens=max_eval_document_tokens,
            mirror=mirror,
            vocab_file=Path(vocab_file).expanduser() if vocab_file else None,
            files=user_files,
        )
        self.batch_size = batch_size
        self.tgt_len = tgt_len
        self.eval_batch_size = batch_size if eval_batch_size is None else eval_batch_size
        self.eval_tgt_len = tgt_len if eval_tgt_len is None else eval_tgt_len
        self.mode = mode
        self.overlap = overlap
        self.eval_overlap = overlap if eval_overlap is None else eval_overlap
        self.windows_per_batch = windows_per_batch
        self.far_text_layout = far_text_layout
        self._most_train_rows = most_rows  # what the token checks size the train file for, either layout
        self.word_convention = word_convention
        self._corpus: TokenizedCorpus | None = None
        self.train_targets = train_targets
        self._marks: dict[str, TargetMarks | None] = {}
        self._train_scored: np.ndarray | None = None
        self._train_within: float | None = None
        self._vocab_size: int | None = None
        self._token_bytes: torch.Tensor | None = None

    # ------------------------------------------------------------------ facts linked to the model
    @property
    def vocab_size(self) -> int:
        """Vocabulary size, known before `setup` so the CLI can link it into the model."""
        if self._vocab_size is None:
            self._vocab_size = vocab_size_of(self.spec)
        return self._vocab_size

    @property
    def metric(self) -> str:
        """`bpc` for byte/char tokens, `ppl` for word/BPE tokens."""
        return "bpc" if self.spec.unit in ("byte", "char") else "ppl"

    @property
    def token_bytes(self) -> torch.Tensor:
        """(vocab_size,) UTF-8 bytes of the text each token id stands for (int64), for bits per byte:
        the bytes of scored targets are `token_bytes[target][mask].sum()` (see `tokenize.py`)."""
        if self._token_bytes is None:
            self._token_bytes = torch.from_numpy(self.corpus.token_bytes.astype("int64"))
        return self._token_bytes

    @property
    def vocabulary_digest(self) -> str | None:
        """Which word each id stands for, as a digest (`TokenizedCorpus.vocabulary_digest`): None for
        fixed vocabularies, and before `setup`."""
        return None if self._corpus is None else self._corpus.vocabulary_digest

    @property
    def vocabulary_file(self) -> Path | None:
        """The token cache's `vocab.txt` where the ids are the data's own (`vocabulary_digest` is not
        None): what a fit keeps in its run directory (`longctx.callbacks.vocabulary`)."""
        return None if self.vocabulary_digest is None else self.corpus.path / "vocab.txt"

    @property
    def vocabulary_source(self) -> str:
        """Where the word vocabulary comes from, in words (a vocabulary mismatch's line names it)."""
        return (
            f"from data.vocab_file {self.spec.vocab_file}" if self.spec.vocab_file else "from its train file"
        )

    def word_count(self, split: str) -> int | None:
        """Words of a split (for perplexity per word of a BPE model), or None."""
        if self._corpus is None:
            return None
        n_words = self._corpus.split(split).n_words
        if n_words is None:
            return None
        return n_words.get(self.word_convention) if isinstance(n_words, Mapping) else int(n_words)

    def set_eval_overlap(self, overlap: int) -> None:
        """Change the evaluation overlap (window mode) between evaluations of one checkpoint."""
        check_overlap("eval_overlap", overlap, self.eval_tgt_len)
        self.eval_overlap = overlap

    # ------------------------------------------------------------------ lifecycle
    def prepare_data(self) -> None:
        prepare_corpus(self.spec)

    def setup(self, stage: str | None = None) -> None:
        if self._corpus is None:
            corpus = load_corpus(self.spec)
            if self.info.user_files:
                eval_shape = (self.eval_batch_size, self.eval_tgt_len)
                needs = batch_tokens((self._most_train_rows, self.tgt_len), eval_shape)
                for split, file in self.spec.user_files().items():
                    check_split_tokens(split, file, len(corpus.split(split).tokens), needs[split])
            self._corpus = corpus
            if self.info.user_files:
                self._marks = {split: self._reachable_marks(split) for split in ("valid", "test")}
            if self.train_targets != "all":
                train_marks = self._training_marks()
                self._train_scored = np.zeros(len(corpus.split("train").tokens), dtype=bool)
                self._train_scored[train_marks.offset] = True
                self._train_within = train_marks.within_segment(self.tgt_len)
                self._say_far_text_layout()
            for split, rate in self.out_of_vocabulary().items():
                if rate["oov_tokens"]:
                    rank_zero_info(
                        f"longctx: {self.info.name} {split} split: {rate['oov_tokens']:,} of "
                        f"{rate['tokens']:,} tokens ({rate['oov_fraction']:.2%}) are words the vocabulary "
                        "lacks, scored as <unk>"
                    )

    @property
    def train_layout(self) -> tuple[int, int]:
        """(rows, windows or segments per row) of the training batches: `far_text_layout`'s on far
        text (known after `setup`), else `batch_size` x `windows_per_batch`."""
        far = self._far_text_layout_in_use
        return (far.batch_size, far.windows_per_batch) if far else (self.batch_size, self.windows_per_batch)

    @property
    def _far_text_layout_in_use(self) -> FarTextLayout | None:
        """`far_text_layout` when the training text is far text (`FarTextLayout.applies`), else None."""
        far = self.far_text_layout
        return far if far is not None and far.applies(self._train_within) else None

    def _say_far_text_layout(self) -> None:
        """One line when the training text is far text and trains in `far_text_layout`'s layout."""
        if (far := self._far_text_layout_in_use) is not None:
            rank_zero_info(
                f"longctx: {self._train_within:.1%} of the training answers are bound within their segment "
                f"(under data.far_text_layout.max_within {far.max_within:.0%}): training batches of "
                f"{far.batch_size} rows x {far.windows_per_batch} segments (data.far_text_layout), not "
                f"{self.batch_size} x {self.windows_per_batch}"
            )

    def target_marks(self, split: str) -> TargetMarks | None:
        """The marked targets of an evaluation split ("valid" or "test"): `text_files` whose file has a
        marks sidecar (`<stem>.marks.npz` beside it, `python -m longctx.data synth`) in this run's token
        unit, or with `data.train_targets: induction` its answers by that rule; else None. Read and checked
        at `setup`."""
        return self._marks.get(split)

    @property
    def train_answers_within_segment(self) -> float | None:
        """The fraction of the training answers (`data.train_targets`) bound within their own training
        segment of `tgt_len` tokens (`TargetMarks.within_segment`), or None (every target trains, or
        marks without distances). Known after `setup`: a memory warm-up reads it (nothing to learn
        without the memory when every binding lies beyond the segment)."""
        return self._train_within

    def _training_marks(self) -> TargetMarks:
        """The training split's marked targets (`data.train_targets`: the sidecar's with `marked`, the
        rule's with `induction`), refused in one line when there are none."""
        split = "train"
        marks = self._induction_marks(split) if self.train_targets == "induction" else self._load_marks(split)
        file = self.spec.user_files()[split]
        if self.train_targets == "induction" and not marks.offset.size:
            raise TextFileError(
                f"data.train_targets: induction found no target of {file} that completes a pair of words "
                f"seen at most {self.hparams.induction_window} tokens before: it holds no recall to train "
                "on; raise data.induction_window, or set data.train_targets: all"
            )
        if marks is None or not marks.offset.size:
            raise TextFileError(
                f"data.train_targets: marked needs marks for {file} in tokenizer {self.spec.tokenizer} "
                f"({marks_path(file).name} beside it, written by `python -m longctx.data synth`); write "
                "the text with synth, or set data.train_targets: all"
            )
        return marks

    def _load_marks(self, split: str) -> TargetMarks | None:
        """The sidecar of the split's file, checked against the file: the digest it records (marks of
        another text are an error, not a wrong number) and the split's token count."""
        file = self.spec.user_files()[split]
        path = marks_path(file)
        if not path.is_file():
            return self._induction_marks(split) if self.train_targets == "induction" else None
        marks = load_marks(path.parent, file.stem)
        unit = str(marks.get("tokenizer", BYTES_TOKENIZER))  # sidecars without the key are bytes
        if unit != self.spec.tokenizer:
            rank_zero_info(
                f"longctx: {path} marks {unit} offsets and this run reads data.tokenizer "
                f"{self.spec.tokenizer}: no recall accuracy on the {split} split"
            )
            return None
        if "text_blake2b" in marks and str(marks["text_blake2b"]) != source_digest(file):
            raise TextFileError(
                f"{path} marks another text than {file} (its text_blake2b differs from the file's): write "
                "both again with `python -m longctx.data synth`, or remove the sidecar"
            )
        offset, n_tokens = marks["offset"].astype(np.int64), len(self.corpus.split(split).tokens)
        if offset.size and (offset.min() < 0 or offset.max() >= n_tokens):
            raise TextFileError(
                f"{path} marks offset {offset.max():,} but {file} has {n_tokens:,} tokens: the marks belong "
                "to another file; write both again with `python -m longctx.data synth`, or remove the sidecar"
            )
        query, distance = marks.get("query"), marks.get("distance")
        order = np.argsort(offset, kind="stable")
        in_order = lambda values: None if values is None else values.astype(np.int64)[order]  # noqa: E731
        return TargetMarks(offset[order], in_order(query), in_order(distance))

    def _induction_marks(self, split: str) -> TargetMarks:
        """The split's answers by `longctx.data.induction`'s rule, with one line saying how many."""
        tokens = self.corpus.split(split).tokens
        marks = induction_marks(np.asarray(tokens), self.hparams.induction_window, self._eos_id())
        rank_zero_info(
            f"longctx: {self.info.name} {split} split: {len(marks.offset):,} of {len(tokens):,} targets "
            f"complete a pair of words seen at most {self.hparams.induction_window} tokens before "
            "(data.train_targets: induction)"
        )
        return marks

    def _eos_id(self) -> int | None:
        """The id of `<eos>` (the line end the `words` tokenizer appends) in this run's vocabulary."""
        vocabulary = self.vocabulary_file
        return None if vocabulary is None else WordVocab.load(vocabulary).index.get(EOS)

    def _reachable_marks(self, split: str) -> TargetMarks | None:
        """The split's marks an evaluation can count as recall: an answer bound before the first token
        of the evaluation row that scores it (`evaluation_row_start`: every row starts mid-text, with
        an empty memory) is out of every model's reach, and counting it would lower every recall
        accuracy by the share of such answers (9.7% of the far-recall test's at 128 rows). Left out,
        with one line saying how many."""
        marks = self._load_marks(split)
        if marks is None or marks.distance is None:
            return marks
        if (row_start := self.row_start(split, marks.offset)) is None:  # documents, not contiguous rows
            return marks
        reachable = marks.offset - marks.distance >= row_start
        if not reachable.all():
            rank_zero_info(
                f"longctx: {self.info.name} {split} split: {int((~reachable).sum()):,} of {reachable.size:,} "
                f"answers are bound before the first token of their evaluation row ({self.eval_batch_size} "
                "rows, each starting with an empty memory): recall accuracy counts the "
                f"{int(reachable.sum()):,} others"
            )
        return marks.keep(reachable)

    def row_start(self, split: str, offset: np.ndarray) -> np.ndarray | None:
        """(M,) the first token of the evaluation row that scores each target `offset` of a contiguous
        split (`longctx.data.streams.evaluation_row_start`); None for a split of documents."""
        data = self.corpus.split(split)
        if data.doc_offsets is not None:
            return None
        return evaluation_row_start(offset, len(data.tokens), self.eval_batch_size)

    def out_of_vocabulary(self) -> dict[str, dict[str, float]]:
        """Per split of a word corpus: `tokens`, `oov_tokens` (words not in the vocabulary, so mapped
        to `<unk>`; e.g. a released checkpoint's vocabulary on other text) and `oov_fraction`. Empty
        before `setup`, for other corpora, and for caches written before the count was kept."""
        if self._corpus is None:
            return {}
        rates = {}
        for split, data in self._corpus.splits.items():
            if data.oov_tokens is not None:
                n = len(data.tokens)
                rates[split] = {
                    "tokens": n,
                    "oov_tokens": data.oov_tokens,
                    "oov_fraction": data.oov_tokens / max(n, 1),
                }
        return rates

    @property
    def corpus(self) -> TokenizedCorpus:
        if self._corpus is None:
            raise RuntimeError("LMDataModule.setup() has not run yet")
        return self._corpus

    def stream(self, split: str, *, train: bool) -> SegmentStream:
        """The stream of one split for this rank."""
        data = self.corpus.split(split)
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        windows = self.mode == "windows"
        batch_size = self.train_layout[0] if train else self.eval_batch_size
        seq_len = self.tgt_len if train else self.eval_tgt_len
        far_layout = train and self._far_text_layout_in_use is not None
        settings = LAYOUT_SETTINGS | FAR_TEXT_LAYOUT_SETTINGS if far_layout else LAYOUT_SETTINGS
        try:
            return SegmentStream(
                data.tokens,
                batch_size,
                seq_len,
                doc_offsets=data.doc_offsets,
                overlap=(self.overlap if train else self.eval_overlap) if windows else 0,
                windows_per_batch=self._windows_per_batch(train),
                pad=not train,
                rank=rank,
                world_size=world,
                shuffle_documents=train and self.hparams.shuffle_documents,
                seed=self.hparams.seed,
                wrap=self.hparams.train_wrap if train else "restart",
                scored=self._train_scored if train else None,
                settings=settings,
            )
        except ValueError as err:
            raise ValueError(f"{self.info.name} {split} split: {err}") from err

    def _windows_per_batch(self, train: bool) -> int | None:
        """The stream's K: window mode's, 1 at evaluation; segment mode's training K when above 1
        (truncated BPTT over K segments), else None: one segment per batch, (B, L)."""
        windows = self.train_layout[1]
        if self.mode == "windows":
            return windows if train else 1
        return windows if train and windows > 1 else None

    def train_dataloader(self) -> SegmentStream:
        stream = self.stream("train", train=True)
        self.warn_if_budget_repeats(stream)
        return stream

    def warn_if_budget_repeats(self, stream: SegmentStream) -> None:
        """A synthetic text with marks (`python -m longctx.data synth`) is written large enough for
        the budget, so that no episode is trained twice: say so when the trainer's `max_steps` reads
        the train file more than once."""
        trainer = self.trainer
        if trainer is None or not self.info.user_files or trainer.max_steps is None or trainer.max_steps < 0:
            return
        train_file = self.spec.user_files()["train"]
        if not marks_path(train_file).is_file() or len(stream) == 0:
            return
        batches = trainer.max_steps * trainer.accumulate_grad_batches
        if batches > len(stream):
            rank_zero_warn(
                f"longctx: trainer.max_steps {trainer.max_steps} reads the train file {train_file} "
                f"{batches / len(stream):.2f} times ({len(stream):,} batches per pass): its episodes repeat; "
                "write a larger one (`python -m longctx.data synth ... --train_tokens N`, N >= max_steps "
                "x batch_size x tgt_len)"
            )

    def val_dataloader(self) -> SegmentStream:
        return self.stream("valid", train=False)

    def test_dataloader(self) -> SegmentStream:
        return self.stream("test", train=False)


def check_positive(**options: int | None) -> None:
    """Each given option (None: unset, takes its default) must be a positive integer."""
    for name, value in options.items():
        if value is not None and value <= 0:
            raise ValueError(f"data.{name} must be a positive integer, got {value}")


def check_overlap(name: str, overlap: int, window: int) -> None:
    if not 0 <= overlap < window:
        raise ValueError(
            f"data.{name} ({overlap}) must satisfy 0 <= {name} < window ({window}): the stride "
            "window - overlap must be positive"
        )


def default_cache_dir() -> Path:
    """Where token caches go unless `data.cache_dir` says: `$LONGCTX_CACHE`, else `longctx/tokens` in
    the user's cache folder (platformdirs: `$XDG_CACHE_HOME` or `~/.cache` on Linux). Never the data
    root: it may be a read-only or shared mount, and a run writes only where its user said."""
    if cache := os.environ.get("LONGCTX_CACHE"):
        return Path(cache).expanduser()
    return platformdirs.user_cache_path("longctx") / "tokens"


def batch_tokens(train: tuple[int, int], evaluation: tuple[int, int]) -> dict[str, int]:
    """Tokens one batch of each split reads, from (rows, segment or window length) of training and
    evaluation: rows x length + 1 (the last target)."""
    n_eval = evaluation[0] * evaluation[1] + 1
    return {"train": train[0] * train[1] + 1, "valid": n_eval, "test": n_eval}
