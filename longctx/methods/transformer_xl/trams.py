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
- `metric="oracle"` (not in the released code, for analysis): the k older slots with the largest
  attention probability summed over the segment's n queries, where the probabilities are those of
  ordinary XL attention (true relative positions) over the whole pool plus the segment, computed per
  layer, head and batch row at the layer's actual input.
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


def query_gram(w_q: Tensor) -> tuple[Tensor, Tensor]:
    """w_q: (H, Dh, D), each head's query projection. Returns G = W_Q W_Qᵀ (H, Dh, Dh) and
    s = W_Q 1 (H, Dh), so that ‖W_Qᵀk‖² = kᵀGk and Σ(W_Qᵀk) = s·k."""
    return w_q @ w_q.transpose(-1, -2), w_q.sum(-1)


def trams_scores(k: Tensor, w_q: Tensor, metric: Literal["code", "paper"] = "code") -> Tensor:
    """Score of every pooled key, cheaply (no d_model-sized K′).

    k: (B, H, P, Dh) content keys; w_q: (H, Dh, D). Returns (B, H, P):
    "code": ‖K′‖·|ΣK′|; "paper": cos⟨K′, 1⟩·‖K′‖ = ΣK′/√D.
    """
    G, s = query_gram(w_q.to(k.dtype))
    total = (k @ s[:, :, None]).squeeze(-1)  # (B, H, P): ΣK′
    if metric == "paper":
        return total / math.sqrt(w_q.shape[-1])
    if metric != "code":
        raise ValueError(f"trams_scores computes 'code' or 'paper', got {metric!r}")
    norm2 = ((k @ G) * k).sum(-1).clamp_min(0.0)  # (B, H, P): kᵀGk = ‖K′‖²
    return norm2.sqrt() * total.abs()


def oracle_scores(probs: Tensor, n_selectable: int) -> Tensor:
    """probs: (B, H, n, W) attention probabilities over the full window (pool first); returns the
    probability mass each of the first `n_selectable` keys receives, summed over queries (B, H, S)."""
    return probs[..., :n_selectable].sum(-2)


def select_memory(scores: Tensor, k: int) -> Tensor:
    """Indices of the k best scores along the last dim, in time order: (B, H, S) -> (B, H, k)."""
    k = min(k, scores.shape[-1])
    return scores.topk(k, dim=-1).indices.sort(dim=-1).values


def window_index(selected: Tensor, pool: int, kept: int, n: int) -> Tensor:
    """Positions in [pool, segment] of the attended window [selected, kept, segment].

    selected: (B, H, k) indices into the older pool slots; pool: P; kept: m − k newest slots (capped
    at P); n: segment length. Returns (B, H, k + min(kept, P) + n).
    """
    kept = min(kept, pool)
    tail = torch.arange(pool - kept, pool + n, device=selected.device)
    return torch.cat([selected, tail.expand(*selected.shape[:2], -1)], dim=-1)
