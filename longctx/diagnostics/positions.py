"""Loss by position within the segment (window) and by distance to the document start.

Both start from a per-token NLL file (`token_nll.npz`: `nll`, `offset`, optionally `document`):

- position within the segment/window: the column a target sits in, read from the evaluation stream's
  own layout (`window_positions`), so rows that start mid-split, document starts (PG-19) and window
  overlaps are all counted right. With one row per batch on a contiguous split it is
  (offset − 1) mod the segment length;
- distance to the document start: offset − the offset of its document's first token (a contiguous
  split is one document, so it is the offset), grouped in bins that double ([1, 2), [2, 4), ...).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch


def window_positions(batches: Iterable[dict[str, torch.Tensor]], n_offsets: int) -> np.ndarray:
    """(n_offsets,) the column (0-based position within its segment or window) at which each target
    offset is scored by the evaluation stream `batches`; -1 where none is scored."""
    position = np.full(n_offsets, -1, dtype=np.int64)
    for batch in batches:
        scored = batch["mask"].bool()
        columns = torch.arange(scored.shape[-1]).expand_as(scored)
        position[batch["offset"][scored].numpy()] = columns[scored].numpy()
    return position


def mean_by(keys: np.ndarray, nll: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(distinct keys, mean NLL per key, targets per key) over the NLL values grouped by `keys`."""
    distinct, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=nll.astype(np.float64), minlength=distinct.size)
    return distinct, sums / counts, counts


def loss_by_position(nll: np.ndarray, offset: np.ndarray, position_of: np.ndarray) -> list[dict]:
    """Rows {position, loss, tokens}: mean NLL (nats) of the targets at each position of a segment."""
    positions = position_of[offset]
    if (positions < 0).any():
        raise ValueError("a scored target is missing from the evaluation stream's layout; this is a bug")
    keys, loss, tokens = mean_by(positions, nll)
    return [{"position": int(k), "loss": float(v), "tokens": int(n)} for k, v, n in zip(keys, loss, tokens)]


def document_distance(offset: np.ndarray, doc_offsets: np.ndarray | None) -> np.ndarray:
    """Each target's distance (tokens) to the first token of its document (of the split, if none)."""
    if doc_offsets is None:
        return offset.copy()
    document = np.searchsorted(doc_offsets, offset, side="right") - 1
    return offset - doc_offsets[document]


def loss_by_document_distance(
    nll: np.ndarray, offset: np.ndarray, doc_offsets: np.ndarray | None
) -> list[dict]:
    """Rows {distance_from, distance_to, loss, tokens}: mean NLL of the targets whose distance d to their
    document's start is in [distance_from, distance_to), bins [1, 2), [2, 4), [4, 8), ..."""
    distance = document_distance(offset, doc_offsets)
    bins = np.floor(np.log2(np.maximum(distance, 1))).astype(np.int64)
    keys, loss, tokens = mean_by(bins, nll)
    return [
        {"distance_from": 2 ** int(k), "distance_to": 2 ** (int(k) + 1), "loss": float(v), "tokens": int(n)}
        for k, v, n in zip(keys, loss, tokens)
    ]
