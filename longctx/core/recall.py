"""Recall accuracy: is the model's most probable token the answer, on the marked targets of a split?

A synthetic task's sidecar marks the targets only a used memory can predict (`python -m longctx.data
synth`, docs/long_range.md). `LMBase` scores them at every validation and test whose split has marks:

- `{stage}/recall_acc`: the share of marked targets whose target is the argmax of the model's full
  predicted distribution (every scored marked target counts once, all ranks together);
- `{stage}/recall_acc_first`: the same on each episode's first query only, and `{stage}/recall_acc_q{i}`
  on its query i (marks with query indices: `synth mqar`). With K pairs each queried once, a model
  that copies a value of its episode not asked yet scores 1/K, 1/(K−1), ..., 1 by query order
  (25/48 ≈ 0.52 overall for K = 4) without matching a single key; the first query's chance is 1/K
  whatever the model eliminates, so recall is judged by it;
- `{stage}/recall_answers`: how many marked targets were scored.

A method's `step` returns `StepOutput.correct` (bool, target = argmax of its full log-probabilities)
when `LMBase.wants_correct` is set: only for evaluation steps with marks or a per-token writer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import Metric


@dataclass(frozen=True)
class TargetMarks:
    """The marked targets of an evaluation split.

    offset: (M,) int64, sorted and unique: each one's index in the split's token sequence (the
        `offset` of evaluation batches, `SegmentStream`).
    query: (M,) int64, its query's index within its episode (0 = the episode's first query), or None
        for marks without queries (copy and the byte-level recall: every marked byte alike).
    distance: (M,) int64, tokens back to the token it recalls (`synth` marks), or None.
    """

    offset: np.ndarray
    query: np.ndarray | None = None
    distance: np.ndarray | None = None

    def keep(self, where: np.ndarray) -> TargetMarks:
        """The marks at `where` (bool (M,))."""
        pick = lambda values: None if values is None else values[where]  # noqa: E731
        return TargetMarks(self.offset[where], pick(self.query), pick(self.distance))

    @property
    def n_queries(self) -> int:
        """Query indices kept apart (1 without queries)."""
        return 1 if self.query is None or not len(self.query) else int(self.query.max()) + 1

    def within_segment(self, segment_len: int) -> float | None:
        """The fraction of the marked targets whose recalled token lies in the target's own segment of
        `segment_len` tokens, in expectation over where the target falls in it: (L - distance) / L per
        target, 0 at distance >= L (None without distances, or without marks). On recall text it says
        how much a model without memory can learn: 0.50 on zoology's dense episodes at L = 32, 0 when
        every binding lies beyond the segment."""
        if self.distance is None or not len(self.distance):
            return None
        return float(np.clip(segment_len - self.distance, 0, None).mean() / segment_len)


def target_is_argmax(logits: Tensor, target: Tensor) -> Tensor:
    """(...) bool: `target` (...) is the argmax of the log-probabilities of `logits` (..., V) (the log-
    softmax in float32 at least, as the losses compute it; ties go to the lowest id, as `argmax`)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.log_softmax(logits, dim=-1).argmax(-1) == target


class RecallAccuracy(Metric):
    """Correct and scored marked targets per query index, summed over batches and DDP ranks."""

    full_state_update = False

    def __init__(self, n_queries: int) -> None:
        super().__init__()
        self.add_state("correct", torch.zeros(n_queries, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros(n_queries, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, correct: Tensor, count: Tensor) -> None:
        self.correct += correct
        self.count += count

    def compute(self) -> tuple[Tensor, Tensor]:
        return self.correct, self.count


class RecallScorer:
    """Scores one evaluation's marked targets: which targets of a batch are marked (a lookup from
    offset to query index, -1 when not marked, on the model's device) and the running sums."""

    def __init__(self, marks: TargetMarks, device: torch.device) -> None:
        size = int(marks.offset[-1]) + 1 if len(marks.offset) else 0
        lookup = torch.full((size,), -1, dtype=torch.int64)
        queries = np.zeros(len(marks.offset), np.int64) if marks.query is None else marks.query
        lookup[torch.from_numpy(marks.offset)] = torch.from_numpy(queries.astype(np.int64))
        self.lookup = lookup.to(device)
        self.has_queries = marks.query is not None
        self.n_queries = marks.n_queries
        self.metric = RecallAccuracy(self.n_queries).to(device)

    def update(self, correct: Tensor, mask: Tensor, offset: Tensor) -> None:
        """One batch: `correct`, `mask` (the targets scored) and `offset`, each the target's shape."""
        size = self.lookup.shape[0]
        if size == 0:
            return
        known = mask.bool() & (offset >= 0) & (offset < size)
        query = torch.where(known, self.lookup[offset.clamp(0, size - 1)], -1)
        marked = query >= 0
        query = query[marked]
        hits = correct[marked].to(torch.float64)
        n = self.n_queries
        self.metric.update(
            torch.bincount(query, weights=hits, minlength=n), torch.bincount(query, minlength=n).double()
        )

    def results(self, stage: str) -> dict[str, float]:
        """The stage's recall metrics (all ranks), then reset; empty when no marked target was scored."""
        correct, count = (x.double().cpu() for x in self.metric.compute())
        self.metric.reset()
        total = float(count.sum())
        if total == 0:
            return {}
        results = {f"{stage}/recall_acc": float(correct.sum()) / total, f"{stage}/recall_answers": total}
        if self.has_queries:
            for i in range(self.n_queries):
                if count[i] > 0:
                    results[f"{stage}/recall_acc_q{i}"] = float(correct[i] / count[i])
            if count[0] > 0:
                results[f"{stage}/recall_acc_first"] = float(correct[0] / count[0])
        return results
