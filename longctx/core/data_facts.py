"""The facts about the data that `LMBase` reads from the trainer's data module, as one Protocol.

`LMBase` needs seven facts the network does not know: the batch layout (`mode`), the unit metric
(`metric`), the UTF-8 bytes of each token id (`token_bytes`, for bits per byte), the words of an
evaluation split (`word_count`, for perplexity per word), the evaluation overlap of windows
(`eval_overlap`), the marked targets of an evaluation split (`target_marks`, for recall
accuracy) and which word each id stands for (`vocabulary_digest`, checked against a checkpoint's).
`LMDataModule` provides them; a test's data module provides them too, or none
(loaders passed to `fit` directly: ppl, no bytes, no words, no layout check).

A data module with only some of them is refused at `setup` (`missing_facts`), so a typo'd fact
never silently turns into a default (a wrong number).
"""

from __future__ import annotations

import inspect
import logging
from typing import Literal, Protocol

from torch import Tensor

from longctx.core.recall import TargetMarks

BatchMode = Literal["segments", "windows"]
# The batch layouts (docs/architecture.md): segments `(B, L)` with reset `(B,)`; windows `(B, K, T)`
# with reset `(B, K)`.
LAYOUTS: dict[BatchMode, str] = {"segments": "(B, L)", "windows": "(B, K, T)"}


class LMDataFacts(Protocol):
    """What `LMBase` reads from its data module (`LMDataModule` is one)."""

    mode: BatchMode  # the batch layout its loaders yield
    metric: str  # "bpc" (byte/char tokens) or "ppl" (word/BPE tokens)
    eval_overlap: int  # overlap of consecutive evaluation windows (0 in segment mode)

    @property
    def token_bytes(self) -> Tensor | None:
        """(vocab_size,) UTF-8 bytes of the text of each token id, or None (no bits per byte)."""

    def word_count(self, split: str) -> int | None:
        """Words of the split ("valid" or "test"), or None (no perplexity per word)."""

    def target_marks(self, split: str) -> TargetMarks | None:
        """The marked targets of the split ("valid" or "test"), or None (no recall accuracy)."""

    @property
    def vocabulary_digest(self) -> str | None:
        """A digest of which word each id stands for, when the data decides it (a vocabulary built
        from the training text), else None (fixed vocabularies, random tokens)."""


FACTS = ("mode", "metric", "eval_overlap", "token_bytes", "word_count", "target_marks", "vocabulary_digest")
_ABSENT = object()


def missing_facts(datamodule: object) -> list[str]:
    """The facts of `LMDataFacts` that `datamodule` lacks (read statically: no property is run, so
    nothing is loaded)."""
    return [name for name in FACTS if inspect.getattr_static(datamodule, name, _ABSENT) is _ABSENT]


class DataMismatch(ValueError):
    """The data module does not fit the model (its batch layout, or facts it lacks): the config's
    to fix, reported as one line before any step."""


def check_data_facts(datamodule: object, model_name: str, batch_mode: BatchMode) -> None:
    """Raise `DataMismatch` unless `datamodule` provides every fact and yields `batch_mode` batches."""
    if missing := missing_facts(datamodule):
        raise DataMismatch(
            f"the data module {type(datamodule).__name__} lacks {', '.join(missing)}: "
            "give it every fact of longctx.core.data_facts.LMDataFacts (LMDataModule has them)"
        )
    if datamodule.mode != batch_mode:
        raise DataMismatch(
            f"{model_name} reads {batch_mode} batches {LAYOUTS[batch_mode]}, but the data module "
            f"yields {datamodule.mode}: set data.mode: {batch_mode}"
        )


VOCABULARY_KEY = "longctx_vocabulary"  # the checkpoint's entry: {"digest", "size"}


def check_vocabulary(saved: dict | None, datamodule: object) -> None:
    """Raise `DataMismatch` when a checkpoint's word vocabulary is not the data's: the same ids would
    stand for other words, and every number scored with them would be silently wrong (a vocabulary
    built from another training text orders its words by their counts there)."""
    digest = getattr(datamodule, "vocabulary_digest", None)
    if saved is None and digest is not None:
        logging.getLogger(__name__).warning(
            "longctx: the checkpoint records no word vocabulary (converted, or saved before checkpoints "
            "kept one): nothing checks that its ids mean this data's words; read the data with the "
            "vocabulary it was trained with (--data.vocab_file)"
        )
    if saved is None or digest is None or saved["digest"] == digest:
        return
    raise DataMismatch(
        f"the checkpoint's word vocabulary ({saved['size']:,} words, built from the text it was trained "
        f"on) is not this data's ({getattr(datamodule, 'vocab_size', 0):,} words, "
        f"{getattr(datamodule, 'vocabulary_source', 'from its train file')}): the "
        "same ids stand for other words; read the data with the vocabulary it was trained with: "
        "--data.vocab_file <its run directory>/vocabulary.txt (every fit writes it there), or its own "
        "train file"
    )
