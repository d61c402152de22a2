"""TRAMS: training-free memory selection (Yu et al. 2023, arXiv 2310.15494, §3).

At evaluation, a Transformer-XL layer keeps a pool of the last M hidden states (its ordinary memory)
but attends to only m of them: the newest m − k pool slots are always kept and k are selected from
the older slots, per layer, head and batch row. What the released code (lwaekfjlk/TRAMS,
`utils/modeling_transfo_xl.py`, `RelPartialLearnableMultiHeadAttn.trams`) does, and so what we do:

- The score of a pooled token uses its reformulated key K′ = W_Q⁽ʰ⁾ᵀ k (d_model-sized, so that
  q·k = x·K′ with x the layer input): the code ranks by ‖K′‖·|ΣK′| on content keys only (no position
  term, no u bias, no query). The paper (§3.2) writes cos⟨K′, 1⟩·‖K′‖, which equals ΣK′/√d_model
  (signed); it is the option `metric="paper"`.
- Both are computed without materialising K′ (d_model-sized per head and token, the code's cost):
  ‖K′‖² = kᵀ G k with G = W_Q⁽ʰ⁾ W_Q⁽ʰ⁾ᵀ (d_head × d_head) and ΣK′ = (W_Q⁽ʰ⁾ 1)·k.
- The k selected tokens are put back in time order in front of the kept block. The code then slices
  the last m + n relative position embeddings, i.e. treats the selected tokens as if they sat right
  before the kept block (`positions="compact"`, the default); `positions="true"` keeps their real
  distances instead.
- A slot's "code" or "paper" score depends only on its key, and the released code recomputes it
  for every old pool slot at every segment. With the evaluation key/value cache we score a slot once,
  when it enters the pool, and carry the score with its key and value (`XLMemory.score`), with the
  per-layer `score_matrix` [G | s] that scores new keys (`XLMemory.score_matrix`, computed once); the
  selection is the same, the cost is H·(Dh² + 2·Dh) per new token instead of per pool slot. Without
  the key/value cache the keys are projected again every segment, and so scored again (the released
  computation; the projection dominates that path anyway).
- Only the k selected slots are gathered: the kept block and the segment stay one slice of the keys.
- `metric="oracle"` (not in the released code, for analysis): the k older slots with the largest
  attention probability summed over the segment's n queries, where the probabilities are those of
  ordinary XL attention (true relative positions) over the whole pool plus the segment, computed per
  layer, head and batch row at the layer's actual input. It depends on the segment's queries, so it
  cannot be cached: every segment computes it over the whole pool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

Metric = Literal["code", "paper", "oracle"]
Positions = Literal["compact", "true"]


@dataclass(frozen=True)
class TramsSettings:
    """attended: m, the memory tokens attended per query; kept: m − k, the newest pool slots always
    attended (the code's `remain_mem_num`; k is its `topk_num`); metric and positions: see the module
    docstring. The pool size M is the memory length (the caller's `mem_len`)."""

    attended: int
    kept: int
    metric: Metric = "code"
    positions: Positions = "compact"

    def __post_init__(self) -> None:
        if not 0 <= self.kept <= self.attended:
            raise ValueError(f"need 0 <= kept ({self.kept}) <= attended ({self.attended})")
        if self.metric not in ("code", "paper", "oracle"):
            raise ValueError(f"metric must be 'code', 'paper' or 'oracle', got {self.metric!r}")
        if self.positions not in ("compact", "true"):
            raise ValueError(f"positions must be 'compact' or 'true', got {self.positions!r}")

    @property
    def selected(self) -> int:
        """k, the number of tokens selected from the older pool slots."""
        return self.attended - self.kept

    @property
    def scores_cacheable(self) -> bool:
        """Whether a slot's score depends on its key only ("code", "paper"), so that it can be computed
        once and carried with the key (`XLMemory.score`); the oracle's depends on the queries."""
        return self.metric != "oracle"


def query_gram(w_q: Tensor) -> tuple[Tensor, Tensor]:
    """w_q: (H, Dh, D), each head's query projection. Returns G = W_Q W_Qᵀ (H, Dh, Dh) and
    s = W_Q 1 (H, Dh), so that ‖W_Qᵀk‖² = kᵀGk and Σ(W_Qᵀk) = s·k."""
    return w_q @ w_q.transpose(-1, -2), w_q.sum(-1)


def score_matrix(w_q: Tensor, metric: Literal["code", "paper"] = "code") -> Tensor:
    """The per-head matrix S with which one product k @ S scores keys (`scores_from_matrix`).

    w_q: (H, Dh, D). "code": S = [G | s] (H, Dh, Dh + 1), so that k @ S = [Gk | s·k] with
    ‖K′‖² = kᵀGk and ΣK′ = s·k; "paper": S = s/√D (H, Dh, 1). S depends on the weights only: the
    score cache computes it once per memory and carries it (`XLMemory.score_matrix`).
    """
    if metric not in ("code", "paper"):
        raise ValueError(f"TRAMS scores are cached for 'code' or 'paper', got {metric!r}")
    if metric == "paper":
        return w_q.sum(-1)[..., None] / math.sqrt(w_q.shape[-1])
    G, s = query_gram(w_q)
    return torch.cat([G, s[..., None]], dim=-1)


def scores_from_matrix(k: Tensor, S: Tensor) -> Tensor:
    """Scores (B, H, P) of keys k (B, H, P, Dh) with a `score_matrix` S: ‖K′‖·|ΣK′| = √(kᵀGk)·|s·k|
    ("code", Dh + 1 columns) or ΣK′/√D ("paper", 1 column)."""
    y = k @ S.to(k.dtype)  # (B, H, P, Dh + 1) or (B, H, P, 1)
    if S.shape[-1] == 1:
        return y[..., 0]
    norm2 = torch.linalg.vecdot(y[..., :-1], k).clamp_min(0.0)  # kᵀGk = ‖K′‖²
    return norm2.sqrt() * y[..., -1].abs()


def trams_scores(k: Tensor, w_q: Tensor, metric: Literal["code", "paper"] = "code") -> Tensor:
    """Score of every pooled key, cheaply (no d_model-sized K′).

    k: (B, H, P, Dh) content keys; w_q: (H, Dh, D). Returns (B, H, P):
    "code": ‖K′‖·|ΣK′|; "paper": cos⟨K′, 1⟩·‖K′‖ = ΣK′/√D.
    """
    return scores_from_matrix(k, score_matrix(w_q.to(k.dtype), metric))


def oracle_scores(probs: Tensor, n_selectable: int) -> Tensor:
    """probs: (B, H, n, W) attention probabilities over the full window (pool first); returns the
    probability mass each of the first `n_selectable` keys receives, summed over queries (B, H, S)."""
    return probs[..., :n_selectable].sum(-2)


def select_memory(scores: Tensor, k: int) -> Tensor:
    """Indices of the k best scores along the last dim, in time order: (B, H, S) -> (B, H, k)."""
    k = min(k, scores.shape[-1])
    return scores.topk(k, dim=-1).indices.sort(dim=-1).values


def gather_slots(index: Tensor, *tensors: Tensor) -> list[Tensor]:
    """The rows t[b, h, index[b, h]] of each t (B, H, T, Dh): index (B, H, k) -> (B, H, k, Dh) each.

    A contiguous t (the key/value cache) is read with `index_select` on its flattened rows, which
    copies whole Dh-sized rows (several times faster on CPU than `gather` with an index expanded over
    Dh); any other layout (keys projected this segment) falls back to `gather`.
    """
    B, H, T, _ = tensors[0].shape
    rows = (torch.arange(B * H, device=index.device).view(B, H, 1) * T + index).flatten()  # (B·H·k,)
    return [
        t.view(B * H * T, -1).index_select(0, rows).view(B, H, -1, t.shape[-1])
        if t.is_contiguous()
        else t.gather(2, index[..., None].expand(-1, -1, -1, t.shape[-1]))
        for t in tensors
    ]


def window_index(selected: Tensor, pool: int, kept: int, n: int) -> Tensor:
    """Positions in [pool, segment] of the attended window [selected, kept, segment].

    selected: (B, H, k) indices into the older pool slots; pool: P; kept: m − k newest slots (capped
    at P); n: segment length. Returns (B, H, k + min(kept, P) + n).
    """
    kept = min(kept, pool)
    tail = torch.arange(pool - kept, pool + n, device=selected.device)
    return torch.cat([selected, tail.expand(*selected.shape[:2], -1)], dim=-1)
