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
  ‖K′‖ = ‖R k‖ with R (d_head × d_head) the triangular factor of W_Q⁽ʰ⁾ᵀ = QR (Q orthonormal
  columns, so ‖Q y‖ = ‖y‖), and ΣK′ = (W_Q⁽ʰ⁾ 1)·k.
- The k selected tokens are put back in time order in front of the kept block. The code then slices
  the last m + n relative position embeddings, i.e. treats the selected tokens as if they sat right
  before the kept block (`positions="compact"`, the default); `positions="true"` keeps their real
  distances instead.
- A slot's "code" or "paper" score depends only on its key, and the released code recomputes it
  for every old pool slot at every segment. With the evaluation key/value cache we score a slot once,
  when it enters the pool, and carry the score with its key and value (`XLMemory.score`), with the
  per-layer `score_matrix` [Rᵀ | s] that scores new keys (`XLMemory.score_matrix`, computed once); the
  selection is the same, the cost is H·(Dh² + 2·Dh) per new token instead of per pool slot. Without
  the key/value cache the keys are projected again every segment, and so scored again (the released
  computation; the projection dominates that path anyway).
- The segment's keys are never selectable in their own segment (the selectable slots are the pool's
  older ones), so with the score cache TRAMS's memory type (`trams_pool.py`) scores every layer's new
  keys at once, after the layers, in one batched product (`layer_scores`), and selects every layer's
  window at once, before the layers, from the cached scores of the pools (`select_windows`).
- The window [selected, kept, segment] is gathered with one `index_select` of whole rows for keys
  and values together (`gather_rows`), from the cache's buffers, which the segment's keys and values
  are appended to in place (`slot_store.py`): no pool-sized copy per segment.
- `metric="oracle"` (not in the released code, for analysis): the k older slots with the largest
  attention probability summed over the segment's n queries, where the probabilities are those of
  ordinary XL attention (true relative positions) over the whole pool plus the segment, computed per
  layer, head and batch row at the layer's actual input. It depends on the segment's queries, so it
  cannot be cached: every segment computes it over the whole pool.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from longctx.methods.attention_kernel import at_least_float32

Metric = Literal["code", "paper", "oracle"]
Positions = Literal["compact", "true"]


@dataclass(frozen=True)
class TramsSettings:
    """TRAMS's knobs (the `trams` group of `TransformerXLLM`; None there = TRAMS off).

    attended: m, the memory tokens attended per query; kept: m − k, the newest pool slots always
    attended (the code's `remain_mem_num`; k is its `topk_num`); metric and positions: see the module
    docstring; pool: M, the pool of the last M states per layer (None: the evaluation memory
    length). The network reads M as its memory length (the caller's `mem_len`). Paper and code:
    attended 200, kept 150, pool 400.
    """

    attended: int
    kept: int | None = None  # required with attended (None only to say so in one line)
    metric: Metric = "code"
    positions: Positions = "compact"
    pool: int | None = None

    def __post_init__(self) -> None:
        if self.kept is None:
            raise ValueError(
                "TRAMS's kept (trams_kept: m − k, the newest pool slots always attended) must be set with "
                "its attended (m); paper: attended 200, kept 150, pool 400"
            )
        if not 0 <= self.kept <= self.attended:
            raise ValueError(f"need 0 <= kept ({self.kept}) <= attended ({self.attended})")
        if self.metric not in ("code", "paper", "oracle"):
            raise ValueError(f"metric must be 'code', 'paper' or 'oracle', got {self.metric!r}")
        if self.positions not in ("compact", "true"):
            raise ValueError(f"positions must be 'compact' or 'true', got {self.positions!r}")
        if self.pool is not None and self.pool < self.attended:
            raise ValueError(f"TRAMS attended ({self.attended}) cannot exceed the pool ({self.pool})")

    @property
    def selected(self) -> int:
        """k, the number of tokens selected from the older pool slots."""
        return self.attended - self.kept

    @property
    def scores_cacheable(self) -> bool:
        """Whether a slot's score depends on its key only ("code", "paper"), so that it can be computed
        once and carried with the key (`XLMemory.score`); the oracle's depends on the queries."""
        return self.metric != "oracle"


def query_factor(w_q: Tensor) -> tuple[Tensor, Tensor]:
    """w_q: (H, Dh, D), each head's query projection. Returns R (H, Dh, Dh), the triangular factor of
    W_Qᵀ = QR (Q with orthonormal columns), and s = W_Q 1 (H, Dh), so that ‖W_Qᵀk‖ = ‖Rk‖ and
    Σ(W_Qᵀk) = s·k: the reformulated key's norm and sum from d_head-sized products."""
    R = torch.linalg.qr(at_least_float32(w_q).transpose(-1, -2)).R.to(w_q.dtype)  # no half-precision QR
    return R, w_q.sum(-1)


def score_matrix(w_q: Tensor, metric: Literal["code", "paper"] = "code") -> Tensor:
    """The per-head matrix S with which one product k @ S scores keys (`layer_scores`).

    w_q: (H, Dh, D). "code": S = [Rᵀ | s] (H, Dh, Dh + 1), so that k @ S = [Rk | s·k] with
    ‖K′‖ = ‖Rk‖ and ΣK′ = s·k; "paper": S = s/√D (H, Dh, 1). S depends on the weights only: the
    score cache computes it once per memory and carries it (`XLMemory.score_matrix`).
    """
    if metric not in ("code", "paper"):
        raise ValueError(f"TRAMS scores are cached for 'code' or 'paper', got {metric!r}")
    if metric == "paper":
        return w_q.sum(-1)[..., None] / math.sqrt(w_q.shape[-1])
    R, s = query_factor(w_q)
    return torch.cat([R.transpose(-1, -2), s[..., None]], dim=-1)


def layer_scores(keys: Sequence[Tensor], matrices: Tensor) -> Tensor:
    """Scores (L, B, H, n) of every layer's keys keys[l] (B, H, n, Dh) with its `score_matrix`
    matrices[l] (matrices: (L, H, Dh, ·)): ‖K′‖·|ΣK′| = ‖Rk‖·|s·k| ("code", Dh + 1 columns) or
    ΣK′/√D ("paper", 1).

    One batched product for all layers and heads, (B·n × Dh) @ (Dh × ·) each: with the score cache
    only the segment's n keys per layer are scored, once, after the layers (a key entering the pool
    is not selectable in its own segment), so a handful of small operations serve every layer.
    """
    L, H, Dh, columns = matrices.shape
    B, _, n, _ = keys[0].shape
    matrices = matrices if matrices.dtype == keys[0].dtype else matrices.to(keys[0].dtype)
    rows = torch.stack([k.transpose(0, 1) for k in keys]).view(L * H, B * n, Dh)  # one copy
    y = torch.bmm(rows, matrices.view(L * H, Dh, columns))  # (L·H, B·n, Dh + 1) or (L·H, B·n, 1)
    score = y[..., 0] if columns == 1 else _norm_times_abs_sum(y)
    return score.view(L, H, B, n).transpose(1, 2)


def _norm_times_abs_sum(y: Tensor) -> Tensor:
    """‖Rk‖·|s·k| from y = [Rk | s·k] (..., Dh + 1)."""
    return torch.linalg.vector_norm(y[..., :-1], dim=-1) * y[..., -1].abs()


def trams_scores(k: Tensor, w_q: Tensor, metric: Literal["code", "paper"] = "code") -> Tensor:
    """Score of every pooled key, cheaply (no d_model-sized K′).

    k: (B, H, P, Dh) content keys; w_q: (H, Dh, D). Returns (B, H, P):
    "code": ‖K′‖·|ΣK′|; "paper": cos⟨K′, 1⟩·‖K′‖ = ΣK′/√D.
    """
    return layer_scores([k], score_matrix(w_q.to(k.dtype), metric)[None])[0]


def oracle_scores(probs: Tensor, n_selectable: int) -> Tensor:
    """probs: (B, H, n, W) attention probabilities over the full window (pool first); returns the
    probability mass each of the first `n_selectable` keys receives, summed over queries
    (B, H, n_selectable)."""
    return probs[..., :n_selectable].sum(-2)


def select_memory(scores: Tensor, k: int) -> Tensor:
    """Indices of the k best scores along the last dim, in time order: (B, H, N) -> (B, H, k)."""
    k = min(k, scores.shape[-1])
    return scores.topk(k, dim=-1, sorted=False).indices.sort(dim=-1).values


def gather_rows(index: Tensor, t: Tensor) -> Tensor:
    """The rows t[..., b, h, index[b, h], :] of t (..., B, H, T, Dh): index (B, H, W) -> (..., B, H, W, Dh).

    When t's Dh-sized rows are contiguous and its strides are whole rows (the cache, a view of its
    `SlotStore` buffer; keys and values projected this segment, (B, T, 2, H, Dh) permuted), the rows
    are read with one `index_select` over t's storage viewed as rows, which copies whole rows
    (several times faster on CPU than `gather` with an index expanded over Dh); any other layout
    falls back to `gather`. The leading dims (e.g. keys and values) share the index.
    """
    *blocks, _, Dh = t.shape
    *block_strides, s_t, s_d = t.stride()
    offset = t.storage_offset()
    if s_d != 1 or 0 in block_strides or any(x % Dh for x in (*block_strides, s_t, offset)):
        return t.gather(-2, index[..., None].expand(*blocks, -1, Dh))
    rows = _storage_rows(index, blocks, [x // Dh for x in block_strides], s_t // Dh, offset // Dh)
    storage_rows = t.as_strided((t.untyped_storage().nbytes() // (t.element_size() * Dh), Dh), (Dh, 1), 0)
    return storage_rows.index_select(0, rows).view(*blocks, -1, Dh)


def _storage_rows(index: Tensor, blocks: list[int], strides: list[int], s_t: int, offset: int) -> Tensor:
    """The storage rows (in units of Dh) of t[..., b, h, index[b, h]], flattened, for t's block
    shape (..., B, H), block strides and slot stride in rows, and storage offset in rows."""
    device = index.device
    if all(strides[i] == strides[i + 1] * blocks[i + 1] for i in range(len(blocks) - 1)):
        # Evenly spaced blocks (the cache's buffers): one arange.
        first = torch.arange(offset, offset + blocks[0] * strides[0], strides[-1], device=device)
        first = first.view(*blocks, 1)
    else:
        first = torch.full([1] * (len(blocks) + 1), offset, device=device)
        for dim, (size, stride) in enumerate(zip(blocks, strides)):
            shape = [1] * (len(blocks) + 1)
            shape[dim] = size
            first = first + torch.arange(0, size * stride, stride, device=device).view(shape)
    return (first + (index if s_t == 1 else index * s_t)).flatten()  # first: the row of t[..., 0, :]


def window_index(selected: Tensor, pool: int, kept: int, n: int) -> Tensor:
    """Positions in [pool, segment] of the attended window [selected, kept, segment].

    selected: (..., B, H, k) indices into the older pool slots; pool: P; kept: m − k newest slots
    (capped at P); n: segment length. Returns (..., B, H, k + min(kept, P) + n).
    """
    kept = min(kept, pool)
    tail = torch.arange(pool - kept, pool + n, device=selected.device)
    return torch.cat([selected, tail.expand(*selected.shape[:-1], -1)], dim=-1)


class TramsSelection(NamedTuple):
    """A layer's attended window (leading dims (L,) for all layers at once): selected (B, H, k) pool
    indices in time order, window (B, H, W) positions in [pool, segment] (`window_index`), and valid
    (B, H, W) whether each window position holds a token."""

    selected: Tensor
    window: Tensor
    valid: Tensor


def select_windows(score: Tensor, key_valid: Tensor, settings: TramsSettings, n: int) -> TramsSelection:
    """The attended windows from the pool's scores: one layer's, or every layer's at once.

    score: (..., B, H, >= P − kept) the scores of the pool's slots, −inf on slots without a token
    (only the older P − kept are selectable); key_valid: (B, P + n) whether each slot of [pool,
    segment] holds a token. With the score cache every layer's pool scores are known before the
    segment (score (L, B, H, P)): one top-k, one sort and one gather then serve every layer.
    """
    P = key_valid.shape[-1] - n
    selected = select_memory(score[..., : max(P - settings.kept, 0)], settings.selected)  # (L, B, H, k)
    window = window_index(selected, P, settings.kept, n)  # (L, B, H, W)
    valid = key_valid[:, None, :].expand(*window.shape[:-1], -1).gather(-1, window)
    return TramsSelection(selected, window, valid)
