"""`TokenNLLWriter`: the per-token output of `validate`/`test --write_token_nll true`.

It writes `<run dir>/token_nll.npz` (numpy's zip of arrays) after each evaluation:

- `nll` (float32, nats): the loss of every scored target, so `nll.sum()` is the logged total NLL
  (`{stage}/loss × {stage}/tokens`) to float precision;
- `offset` (int64, sorted, unique): each target's index in the split's token sequence (with
  `data.tokenizer: bytes` on a text file, the byte of the file it predicts);
- `document` (int64, only where the corpus has documents, e.g. PG-19): the document it belongs to;
- `row_start` (int64, where the split is contiguous text of `LMDataModule`): the first token of the
  evaluation row that scored it, where that row's memory began (a target can recall nothing before
  it: `report` leaves out the answers bound earlier, as the logged recall accuracy does);
- `segment_len` (int64 scalar) and `memory_start` (int64), with `row_start` when evaluation reads
  segments without overlap: the row's segments of T targets (target o is scored by segment
  (o − 1 − row_start) // T), and the first token of the segment from which the evaluation last
  restarted the memory (`LMBase.evaluation_memory_start`: the row's start, or the start of the
  Recurrent Memory Transformer's sample of K segments): `report`'s recall by segments back;
- `correct` (bool, when the method returns it: every longctx method does): the target is the argmax
  of the model's full predicted distribution (recall accuracy by distance: `python -m longctx report`).

Only scored targets appear: padding never, the overlap of a window never (each target is scored
once), and under the TRAMS protocol not the first token of each segment. Under DDP every rank's
targets are gathered to rank 0 and sorted by offset, so the file is the same for any number of
ranks. `evaluate_overlaps` names one file per overlap, `token_nll_overlap{o}.npz`
(`set_token_nll_name`).

The writer attaches a `TokenNLLCollector` to the module for the evaluation epoch only; without the
writer no per-token value is kept. The CLI adds it to `validate`, `test` and `evaluate_overlaps`
only; a writer put in `trainer.callbacks` of a `fit` skips the sanity check and rewrites the file at
every validation.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch

from longctx.core.base import LMBase
from longctx.core.token_nll import TokenNLLCollector
from longctx.data.datamodule import LMDataModule
from longctx.runtime.atomic import atomic_path
from longctx.runtime.run_layout import TOKEN_NLL

TOKEN_NLL_FILE = TOKEN_NLL  # the run directory's name for it (`longctx.runtime.run_layout`)


class TokenNLLWriter(pl.Callback):
    """Collects every scored target's NLL during validation/test and writes `filename` in the run
    directory (`trainer.default_root_dir`) at the end of the epoch (rank 0, atomically)."""

    def __init__(self, filename: str = TOKEN_NLL_FILE) -> None:
        self.filename = filename

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._attach(trainer, pl_module)

    def on_test_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._attach(trainer, pl_module)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._write(trainer, pl_module, "valid")

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._write(trainer, pl_module, "test")

    def _attach(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not isinstance(pl_module, LMBase):
            raise ValueError(f"--write_token_nll needs an LMBase model, got {type(pl_module).__name__}")
        # The sanity check scores a few batches only: it must not leave a partial file.
        pl_module.token_nll_collector = None if trainer.sanity_checking else TokenNLLCollector()

    def _write(self, trainer: pl.Trainer, pl_module: pl.LightningModule, split: str) -> None:
        collector = getattr(pl_module, "token_nll_collector", None)
        if collector is None:
            return
        pl_module.token_nll_collector = None
        nll, offset, correct = collector.arrays()
        # Every rank must take part in the gather: one without correctness makes the file go without.
        has_correct = np.array([correct is not None])
        correct = np.zeros(len(nll), bool) if correct is None else correct
        nll, offset, correct, has_correct = gather_ranks(nll, offset, correct, has_correct)
        order = np.argsort(offset, kind="stable")
        nll, offset, correct = nll[order], offset[order], correct[order]
        if offset.size and (offset[0] < 0 or (np.diff(offset) == 0).any()):
            # A padded or twice-scored target: the per-token file would not add up to the metric.
            raise RuntimeError("per-token output: a target was scored twice or is padding; this is a bug")
        if not trainer.is_global_zero:
            return
        arrays = {"nll": nll, "offset": offset}
        if has_correct.all():
            arrays["correct"] = correct
        if (doc_offsets := split_documents(trainer, split)) is not None:
            arrays["document"] = np.searchsorted(doc_offsets, offset, side="right").astype(np.int64) - 1
        elif isinstance(datamodule := trainer.datamodule, LMDataModule):
            arrays["row_start"] = row_start = datamodule.row_start(split, offset)
            if datamodule.eval_overlap == 0:  # segments of T targets: recall by segments back
                segment_len = datamodule.eval_tgt_len
                arrays["segment_len"] = np.int64(segment_len)
                arrays["memory_start"] = pl_module.evaluation_memory_start(row_start, offset, segment_len)
        path = Path(trainer.default_root_dir) / self.filename
        with atomic_path(path) as tmp, tmp.open("wb") as f:
            np.savez(f, **arrays)
        print(f"longctx: per-token NLL of {nll.size} targets in {path}", file=sys.stderr, flush=True)


def gather_ranks(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """Every rank's arrays concatenated, rank by rank, on every rank (unchanged without DDP)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return arrays
    parts: list[tuple[np.ndarray, ...] | None] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(parts, arrays)
    return tuple(np.concatenate([part[i] for part in parts]) for i in range(len(arrays)))


def split_documents(trainer: pl.Trainer, split: str) -> np.ndarray | None:
    """(n_docs + 1,) document boundaries of the evaluated split, or None (no documents)."""
    datamodule = getattr(trainer, "datamodule", None)
    if not isinstance(datamodule, LMDataModule):
        return None
    return datamodule.corpus.split(split).doc_offsets


def set_token_nll_name(trainer: pl.Trainer, filename: str) -> None:
    """Name the file the trainer's `TokenNLLWriter` (if any) writes next, e.g. one per overlap."""
    for callback in trainer.callbacks:
        if isinstance(callback, TokenNLLWriter):
            callback.filename = filename
