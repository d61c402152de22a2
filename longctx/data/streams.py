"""Memory-carrying streams: ordered segments (or windows) of token rows, sharded across ranks.

Transformer-XL's ordered iterator (`LMOrderedIterator` in their `data_utils.py`) cuts a split into
`B` contiguous rows and serves batch `i` as columns `[i*L, i*L + L)` with the targets shifted by
one, so consecutive batches continue the same text and a model carries its memory across them.
`SegmentStream` generalises it to the three layouts longctx needs:

- contiguous text (enwik8, text8, WikiText): one piece of the split per row;
- documents (PG-19): each row reads whole documents one after another; a row starting a document
  gets `reset=True` so the model clears that row's memory;
- windows with overlap (recurrence on GPT-2, Yoshida et al. 2020 §4.2): windows of `T` tokens with
  stride `T - o`; the first window of a piece scores all its targets, later windows only their last
  `T - o`, so every target is scored exactly once.

A *piece* `(start, end)` is a run of tokens whose inputs are `tokens[start:end-1]` and targets
`tokens[start+1:end]` (targets are the next tokens of the stream, so no window loses its first
prediction). A *unit* is one segment / window of a piece. Segment mode is window mode with `o = 0`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from longctx.runtime.errors import BadInput

Batch = dict[str, Tensor]
Wrap = Literal["restart", "random_offset"]
# Version of `SegmentStream.state_dict`; 2 added the layout fields checked on resume.
STATE_VERSION = 2


def units_in_piece(n_targets: int, seq_len: int, overlap: int) -> int:
    """Number of windows of `seq_len` with stride `seq_len - overlap` that score `n_targets` targets."""
    if n_targets <= 0:
        return 0
    if n_targets <= seq_len:
        return 1
    return 1 + math.ceil((n_targets - seq_len) / (seq_len - overlap))


def targets_per_row(n_tokens: int, n_rows: int, pad: bool) -> int:
    """The targets of each of `n_rows` contiguous rows cut from `n_tokens` tokens (`contiguous_rows`):
    the remainder dropped (training) or kept in the last rows (`pad`, evaluation)."""
    n_targets = n_tokens - 1
    return n_targets // n_rows if not pad else math.ceil(n_targets / n_rows)


def contiguous_rows(n_tokens: int, n_rows: int, pad: bool) -> list[list[tuple[int, int]]]:
    """Cut `n_tokens` tokens into `n_rows` contiguous pieces, one per row.

    Consecutive rows share one token (the last target of row b is the first input of row b+1), so
    every token but the very first is a target of exactly one row. `pad=False` (training) gives
    every row the same number of targets and drops the remainder, as Transformer-XL does;
    `pad=True` (evaluation) keeps every target, the last rows running short.
    """
    n_targets = n_tokens - 1
    per_row = targets_per_row(n_tokens, n_rows, pad)
    if per_row <= 0:
        raise ValueError(f"a split of {n_tokens} tokens cannot fill {n_rows} rows; use a smaller batch size")
    rows = []
    for row in range(n_rows):
        start = row * per_row
        end = min(start + per_row, n_targets) + 1
        rows.append([(start, end)] if end - start > 1 else [])
    return rows


def evaluation_row_start(offset: np.ndarray, n_tokens: int, n_rows: int) -> np.ndarray:
    """(M,) for each target `offset` of a contiguous split read as `n_rows` evaluation rows
    (`contiguous_rows`, pad=True), the first token of the row that scores it: where that row's memory
    begins. A target recalls a token before it through no memory at all: the row starts empty."""
    per_row = targets_per_row(n_tokens, n_rows, pad=True)
    return (np.asarray(offset, dtype=np.int64) - 1) // per_row * per_row


def evaluation_segment(offset: np.ndarray, row_start: np.ndarray, segment_len: int) -> np.ndarray:
    """(M,) for each target `offset`, the index within its evaluation row (which begins at
    `row_start`, `evaluation_row_start`) of the segment that scores it, the row read `segment_len`
    targets per step with no overlap. Segment s reads tokens row_start + s·T ... row_start + (s+1)·T − 1."""
    return (np.asarray(offset, dtype=np.int64) - 1 - row_start) // segment_len


def sample_start(offset: np.ndarray, row_start: np.ndarray, segment_len: int, every: int) -> np.ndarray:
    """(M,) the first token of the sample of `every` segments of its row (samples from the row's
    start) that scores each target `offset`: where an evaluation that restarts the memory every
    `every` segments last restarted it (`LMBase.evaluation_memory_start`)."""
    segment = evaluation_segment(offset, row_start, segment_len)
    return row_start + segment // every * every * segment_len


def document_rows(
    doc_offsets: np.ndarray, n_rows: int, seq_len: int, overlap: int, order: Sequence[int]
) -> list[list[tuple[int, int]]]:
    """Deal documents (in `order`) to rows: each goes to the row that has the fewest units so far.

    Deterministic (ties go to the lowest row), so every rank computes the same global layout.
    """
    rows: list[list[tuple[int, int]]] = [[] for _ in range(n_rows)]
    heap = [(0, row) for row in range(n_rows)]
    for doc in order:
        start, end = int(doc_offsets[doc]), int(doc_offsets[doc + 1])
        units = units_in_piece(end - start - 1, seq_len, overlap)
        if units == 0:
            continue
        load, row = heapq.heappop(heap)
        rows[row].append((start, end))
        heapq.heappush(heap, (load + units, row))
    return rows


@dataclass(frozen=True)
class _Row:
    """One row's pieces and the cumulative number of units before each piece."""

    pieces: list[tuple[int, int]]
    cum_units: np.ndarray  # (n_pieces + 1,)

    @property
    def n_units(self) -> int:
        return int(self.cum_units[-1])


class StreamMismatch(BadInput):
    """A checkpoint's stream state of another layout than this run's (`SegmentStream.load_state_dict`)."""


# Each field of a stream's layout state, as the data module's setting that decides it; the sizes of
# the split, as the settings that choose the text.
LAYOUT_SETTINGS = {
    "batch_size": "data.batch_size",
    "seq_len": "data.tgt_len",
    "overlap": "data.overlap",
    "windows_per_batch": "data.windows_per_batch",
    "shuffle_documents": "data.shuffle_documents",
    "seed": "data.seed",
    "wrap": "data.train_wrap",
}
SPLIT_SIZES = {
    "n_tokens": ("tokens", "data.corpus, data.split_sources, data.files, data.tokenizer"),
    "documents": ("documents", "data.corpus, data.split_sources, data.files"),
}


def _count(value: int | None) -> str:
    return "no" if value is None else f"{value:,}"


def _flag_value(value: Any) -> str:
    """A saved layout value as a command-line value (`true`, not `True`)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


class SegmentStream:
    """Stateful iterable over batches of consecutive segments (or windows) of token rows.

    Args:
        tokens: 1-D token ids of one split (a memory map; never copied whole).
        batch_size: global number of rows B; this rank serves rows
            `[rank * B / world_size, (rank + 1) * B / world_size)`.
        seq_len: segment length L (segment mode) or window length T (window mode).
        doc_offsets: (n_docs + 1,) document boundaries for document-aware streams, else None.
        overlap: o, tokens shared by consecutive windows (window mode only).
        windows_per_batch: K consecutive windows of each row per batch; None = segment mode, which
            yields (B, L) tensors instead of (B, K, T).
        pad: keep every target (evaluation) instead of dropping the uneven remainder (training).
        shuffle_documents: deal documents in a seeded random order that changes every epoch.
        wrap: how a training stream starts its epochs. `restart`: every epoch at offset 0, the last
            short segment of each row trained too. `random_offset`: the adaptive-span trainer's
            wrap-around (facebookresearch/adaptive-span `trainer.py`, `train_iteration`): epoch 0
            starts at offset 0, every later epoch at an offset drawn uniformly from [0, L) (the same
            for all rows, a function of `seed` and the epoch, so every rank draws alike), and only
            full segments are served. The memory is zeroed at each epoch start (`LMBase`), as their
            `h_cache` is at the wrap. Contiguous text in segment mode only.
        scored: (len(tokens),) bool, which targets count (by their index in `tokens`): `mask` is
            False elsewhere (zoology's loss on the recall answers only); None: every target.
        settings: the data setting each layout field comes from, named when a resumed state of
            another layout is refused (`LAYOUT_SETTINGS`, or where another setting decided a field).

    Yields dicts `input`, `target`, `mask` (B, L) or (B, K, T) and `reset` (B,) or (B, K), plus
    `offset` (the shape of `target`: each target's index in `tokens`, -1 on padding) when `pad`
    (evaluation); see docs/architecture.md. Every rank yields the same number of batches.
    `state_dict()` records the epoch and the next batch, so a resumed run continues at the exact
    next segment.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        batch_size: int,
        seq_len: int,
        *,
        doc_offsets: np.ndarray | None = None,
        overlap: int = 0,
        windows_per_batch: int | None = None,
        pad: bool = False,
        rank: int = 0,
        world_size: int = 1,
        shuffle_documents: bool = False,
        seed: int = 0,
        wrap: Wrap = "restart",
        scored: np.ndarray | None = None,
        settings: Mapping[str, str] = LAYOUT_SETTINGS,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch size must be positive, got {batch_size}")
        if batch_size % world_size != 0:
            raise ValueError(
                f"batch size {batch_size} is not divisible by the world size {world_size}: the global "
                "batch is split into equal blocks of rows per rank; choose a multiple of the number "
                "of devices"
            )
        if seq_len <= 0:
            raise ValueError(f"segment length must be positive, got {seq_len}")
        if not 0 <= overlap < seq_len:
            raise ValueError(
                f"overlap ({overlap}) must satisfy 0 <= overlap < window ({seq_len}): the stride "
                "window - overlap must be positive"
            )
        if overlap and windows_per_batch is None:
            raise ValueError("overlap needs window mode (windows_per_batch >= 1)")
        if windows_per_batch is not None and windows_per_batch < 1:
            raise ValueError(f"windows_per_batch must be >= 1, got {windows_per_batch}")
        if wrap not in ("restart", "random_offset"):
            raise ValueError(f"wrap must be 'restart' or 'random_offset', got {wrap!r}")
        if wrap == "random_offset" and (doc_offsets is not None or windows_per_batch is not None or pad):
            raise ValueError(
                "wrap: random_offset (adaptive-span's wrap-around) applies to training on contiguous "
                "text in segment mode; use wrap: restart for documents, windows or evaluation"
            )
        if doc_offsets is None and len(tokens) - 1 < seq_len:
            raise ValueError(
                f"the split has {len(tokens)} tokens, fewer than one segment of {seq_len} + 1; "
                "use a shorter segment length"
            )
        self.tokens = tokens
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.doc_offsets = doc_offsets
        self.overlap = overlap
        self.windows_per_batch = windows_per_batch
        self.pad = pad
        self.rank = rank
        self.world_size = world_size
        self.shuffle_documents = shuffle_documents
        self.seed = seed
        self.wrap = wrap
        if scored is not None and scored.shape != tokens.shape:
            raise ValueError(f"scored has shape {scored.shape}; it names the split's {len(tokens)} tokens")
        self.scored = scored
        self.settings = settings
        self.local_rows = range(rank * batch_size // world_size, (rank + 1) * batch_size // world_size)
        self.epoch = 0
        self.offset = 0  # where each row starts this epoch (wrap: random_offset)
        self._next_batch = 0
        self._resume_pending = False
        self._iterated = False
        self._build_layout()

    # ------------------------------------------------------------------ layout
    def epoch_offset(self, epoch: int) -> int:
        """The start offset of `epoch` under `wrap: random_offset` (0 for epoch 0, as the released
        trainer starts at `train_pos = 0`): a pure function of (seed, epoch), equal on every rank."""
        if self.wrap != "random_offset" or epoch == 0:
            return 0
        return int(np.random.default_rng([self.seed, epoch]).integers(self.seq_len))

    def _build_layout(self) -> None:
        if self.doc_offsets is None:
            pieces = contiguous_rows(len(self.tokens), self.batch_size, self.pad)
            if self.wrap == "random_offset":
                # Each row skips `offset` tokens and keeps only whole segments (their trainer wraps
                # once the next block would pass the end: `train_pos >= size - block_size`).
                n_targets = pieces[0][0][1] - pieces[0][0][0] - 1  # every training row has as many
                full = (n_targets - self.offset) // self.seq_len
                if full < 1:
                    raise ValueError(
                        f"rows of {n_targets} targets hold no whole segment of {self.seq_len} after an "
                        f"offset of {self.offset}; use a smaller batch size or segment length"
                    )
                starts = [row[0][0] + self.offset for row in pieces]
                pieces = [[(start, start + full * self.seq_len + 1)] for start in starts]
        else:
            order = np.arange(len(self.doc_offsets) - 1)
            if self.shuffle_documents:
                order = np.random.default_rng([self.seed, self.epoch]).permutation(order)
            pieces = document_rows(self.doc_offsets, self.batch_size, self.seq_len, self.overlap, order)
        rows = []
        for row_pieces in pieces:
            counts = [
                units_in_piece(end - start - 1, self.seq_len, self.overlap) for start, end in row_pieces
            ]
            rows.append(_Row(row_pieces, np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])))
        max_units = max(row.n_units for row in rows)
        if max_units == 0:
            raise ValueError("the split has no tokens to predict")
        per_batch = self.windows_per_batch or 1
        self._rows = [rows[r] for r in self.local_rows]
        self._n_batches = math.ceil(max_units / per_batch)

    def __len__(self) -> int:
        return self._n_batches

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[Batch]:
        if self._resume_pending:
            self._resume_pending = False
        else:
            if self._iterated:
                self.epoch += 1
                self._start_epoch()
            self._next_batch = 0
        self._iterated = True
        while self._next_batch < self._n_batches:
            batch = self.batch(self._next_batch)
            self._next_batch += 1
            yield batch

    def batch(self, index: int) -> Batch:
        """Batch `index` of the current epoch (pure function of the layout)."""
        n_windows = self.windows_per_batch or 1
        shape = (len(self._rows), n_windows, self.seq_len)
        inputs = np.zeros(shape, dtype=np.int64)
        targets = np.zeros(shape, dtype=np.int64)
        mask = np.zeros(shape, dtype=bool)
        reset = np.zeros(shape[:2], dtype=bool)
        # Evaluation batches say where each target sits in the split (per-token output); -1 on padding.
        offsets = np.full(shape, -1, dtype=np.int64) if self.pad else None
        for i, row in enumerate(self._rows):
            for k in range(n_windows):
                unit = index * n_windows + k
                if unit < row.n_units:
                    row_offsets = None if offsets is None else offsets[i, k]
                    reset[i, k] = self._fill_unit(
                        row, unit, inputs[i, k], targets[i, k], mask[i, k], row_offsets
                    )
        out = {
            "input": torch.from_numpy(inputs),
            "target": torch.from_numpy(targets),
            "mask": torch.from_numpy(mask),
            "reset": torch.from_numpy(reset),
        }
        if offsets is not None:
            out["offset"] = torch.from_numpy(offsets)
        if self.windows_per_batch is None:
            out = {key: value.squeeze(1) for key, value in out.items()}
        return out

    def _fill_unit(
        self,
        row: _Row,
        unit: int,
        inputs: np.ndarray,
        targets: np.ndarray,
        mask: np.ndarray,
        offsets: np.ndarray | None = None,
    ) -> bool:
        """Write unit `unit` of `row` into the given (T,) buffers (`offsets`: each target's index in
        the split's tokens, when given); return whether the unit starts a piece."""
        piece = int(np.searchsorted(row.cum_units, unit, side="right")) - 1
        j = unit - int(row.cum_units[piece])
        start, end = row.pieces[piece]
        offset = start + j * (self.seq_len - self.overlap)
        length = min(self.seq_len, end - 1 - offset)
        inputs[:length] = self.tokens[offset : offset + length]
        targets[:length] = self.tokens[offset + 1 : offset + 1 + length]
        first_scored = 0 if j == 0 else self.overlap
        mask[first_scored:length] = True
        if self.scored is not None:  # only the chosen targets count (their index in the split)
            mask[first_scored:length] &= self.scored[offset + 1 + first_scored : offset + 1 + length]
        if offsets is not None:
            offsets[:length] = np.arange(offset + 1, offset + 1 + length)
        return j == 0

    def _start_epoch(self) -> None:
        """Rebuild the layout when it changes with the epoch (document order, start offset)."""
        if self.shuffle_documents or self.wrap == "random_offset":
            self.offset = self.epoch_offset(self.epoch)
            self._build_layout()

    # ------------------------------------------------------------------ state
    def _layout_state(self) -> dict[str, Any]:
        """What decides which tokens batch i holds: a resumed stream must agree on all of it."""
        return {
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "overlap": self.overlap,
            "windows_per_batch": self.windows_per_batch,
            "n_tokens": len(self.tokens),
            "documents": None if self.doc_offsets is None else len(self.doc_offsets) - 1,
            "shuffle_documents": self.shuffle_documents,
            "seed": self.seed,
            "wrap": self.wrap,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "next_batch": self._next_batch,
            "offset": self.offset,
            **self._layout_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the saved epoch, offset and batch; refuse a state of another layout (it would
        silently skip or repeat tokens), naming the data setting that differs and the ways out."""
        fresh = "or start a fresh run (another --run_name, no --ckpt_path)"
        if state.get("version") != STATE_VERSION:
            raise StreamMismatch(
                f"the checkpoint's data stream state has format version {state.get('version', 1)}, this "
                f"longctx reads {STATE_VERSION}: it cannot tell where the stream stopped; resume with the "
                f"longctx version that wrote it, {fresh}"
            )
        for key, value in self._layout_state().items():
            if state[key] == value:
                continue
            if key in SPLIT_SIZES:  # another corpus, split or tokenizer: no one flag sets it back
                unit, settings = SPLIT_SIZES[key]
                raise StreamMismatch(
                    f"the checkpoint's training stream holds {_count(state[key])} {unit}, this run's "
                    f"{_count(value)}: the run was trained on other data ({settings}); resume with the data "
                    f"it was trained on, {fresh}"
                )
            setting = self.settings[key]
            raise StreamMismatch(
                f"the checkpoint's training stream was cut with {setting} {_flag_value(state[key])}, this "
                f"run has {_flag_value(value)}: the stream cannot resume where it stopped with another "
                f"layout; resume with --{setting} {_flag_value(state[key])}, {fresh}"
            )
        self.epoch = state["epoch"]
        self.offset = state["offset"]
        if self.offset or self.shuffle_documents:
            self._build_layout()
        self._next_batch = state["next_batch"]
        # A state saved after the epoch's last batch resumes at the start of the next epoch.
        self._resume_pending = self._next_batch < self._n_batches
        self._iterated = True
