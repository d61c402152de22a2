"""TRAMS's memory type: the pool of M states per layer and the window each layer attends of it
(Yu et al. 2023, §3; lwaekfjlk/TRAMS `RelPartialLearnableMultiHeadAttn.trams`).

The pool is Transformer-XL's memory of the last M layer inputs (`XLSegment`, kept as XL keeps its
memory, whatever was selected); a layer attends [k selected of its older slots, the newest m − k,
the segment], per batch row and head, selected by the keys' metric (`trams.py`) or, for the oracle,
by the attention the segment's queries give the whole pool (`KeyWindow.select`). The window's keys
and values are one `index_select` of their rows (`trams.gather_rows`), at compact positions (the
code) or their true distances.

With the key/value cache and a key-only metric ("code", "paper") each slot is scored once, when it
enters the pool, and its score carried with its key (`XLMemory.score`, with the per-layer
`score_matrix` that scores new keys): the pool's scores are then known before the segment, so every
layer's window is selected at once, before the layers (`trams.select_windows`), and the segment's
keys of every layer are scored at once, after them (`trams.layer_scores`: a key is not selectable
in its own segment). Without the cache every segment scores the older slots again (the released
computation).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from longctx.methods.transformer_xl.memory import XLMemory, XLSegment
from longctx.methods.transformer_xl.relative_attention import KeyWindow, RelMultiHeadAttention
from longctx.methods.transformer_xl.trams import (
    TramsSelection,
    TramsSettings,
    gather_rows,
    layer_scores,
    oracle_scores,
    score_matrix,
    select_windows,
    trams_scores,
)


class TramsSegment(XLSegment):
    """TRAMS's pool over one segment: `XLSegment` with pool M = mem_len, each layer attending the
    window `settings` select (m attended, m − k kept, metric, positions); same_length limits each
    query to m memory keys."""

    def __init__(
        self,
        memory: XLMemory,
        n: int,
        mem_len: int,
        same_length: bool,
        cache_kv: bool,
        settings: TramsSettings,
    ):
        super().__init__(memory, n, mem_len, same_length, cache_kv)
        self.settings = settings
        self.window_same_length = settings.attended if same_length else None
        self.n_selectable = max(self.slots - settings.kept, 0)  # the older slots; then kept + segment
        self.cache_scores = cache_kv and settings.scores_cacheable
        # (L, B, H, P): the pool's carried scores, −inf on slots without a token (the score cache)
        self.pool_scores = memory.score if self.cache_scores and memory.kv is not None else None
        self.selections = None  # with carried scores: every layer's window, selected at once
        if self.pool_scores is not None and self.slots > 0:
            self.selections = select_windows(self.pool_scores, self.key_valid, settings, n)
        # Per layer, when the cache starts: the pool's scores and the matrix that scores new keys.
        self.new_pool_scores: list[Tensor] = []
        self.score_matrices: list[Tensor] = []

    def _window(self, layer: int, attn: RelMultiHeadAttention, kv: Tensor) -> KeyWindow:
        pool = super()._window(layer, attn, kv)  # [pool, segment], XL's positions
        score = self._pool_score(layer, attn, kv)
        if self.slots == 0:
            return pool
        if self.settings.metric == "oracle":
            return pool._replace(select=partial(self._selected_by_attention, kv))
        if self.selections is not None:
            return self._gathered(kv, TramsSelection(*(t[layer] for t in self.selections)))
        return self._gathered(
            kv, select_windows(self._metric(attn, kv, score), self.key_valid, self.settings, self.n)
        )

    def _pool_score(self, layer: int, attn: RelMultiHeadAttention, kv: Tensor) -> Tensor | None:
        """The scores of the pool's P slots (B, H, P), −inf on slots without a token: carried, or
        scored now when the score cache starts (with the matrix that will score new keys), else None."""
        if self.pool_scores is not None:
            return self.pool_scores[layer]
        if not self.cache_scores:
            return None
        w_q, metric = attn.query_weight(), self.settings.metric
        score = trams_scores(kv[0, :, :, : self.slots], w_q, metric)
        score = score.masked_fill(~self.key_valid[:, None, : self.slots], float("-inf"))
        self.new_pool_scores.append(score)
        self.score_matrices.append(score_matrix(w_q, metric))
        return score

    def _metric(self, attn: RelMultiHeadAttention, kv: Tensor, score: Tensor | None) -> Tensor:
        """The selectable slots' metric (B, H, P − kept), −inf on slots without a token (never
        preferred to real ones): from `score`, else scored now (the released computation)."""
        if score is not None:
            return score[..., : self.n_selectable]
        metric = trams_scores(kv[0, :, :, : self.n_selectable], attn.query_weight(), self.settings.metric)
        return metric.masked_fill(~self.key_valid[:, None, : self.n_selectable], float("-inf"))

    def _selected_by_attention(self, kv: Tensor, probs: Tensor) -> KeyWindow:
        """The oracle's window: the older slots of largest attention probability summed over the
        queries (probs (B, H, n, P + n): XL's attention over the pool)."""
        metric = oracle_scores(probs, self.n_selectable)
        metric = metric.masked_fill(~self.key_valid[:, None, : self.n_selectable], float("-inf"))
        return self._gathered(kv, select_windows(metric, self.key_valid, self.settings, self.n))

    def _gathered(self, kv: Tensor, selection: TramsSelection) -> KeyWindow:
        """The window [selected, kept, segment] of `selection`: keys and values (B, H, W, Dh) gathered
        with one `index_select` of their W rows each, from the cache's buffer or this segment's
        projection (on CPU faster than gathering the k selected rows and concatenating the kept block)."""
        _, rows, valid = selection  # rows: (B, H, W) the window's slots in [pool, segment]
        k, v = gather_rows(rows, kv)
        true_positions = self.settings.positions == "true"
        return KeyWindow(k, v, valid, self.window_same_length, rows, kv.shape[3], true_positions)

    def _kept_scores(self) -> tuple[Tensor | None, Tensor | None]:
        """With the score cache: the pool's scores joined with the segment's keys' of every layer,
        scored at once (`layer_scores`), evicted with the keys; and the score matrices."""
        if not self.cache_scores:
            return None, None
        carried = self.pool_scores is not None
        matrices = self.memory.score_matrix if carried else torch.stack(self.score_matrices)  # (L, H, Dh, ·)
        pool = self.pool_scores if carried else torch.stack(self.new_pool_scores)  # (L, B, H, P)
        new = layer_scores([kv[0, :, :, self.slots :] for kv in self.kv], matrices)  # (L, B, H, n)
        return self.fifo.split(self._join("score", pool, new), dim=3).kept.detach(), matrices
