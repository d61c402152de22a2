"""Transformer-XL's relative attention by `flex_attention` (`attention="flex"`, evaluation).

The content term is the kernel's q·k (with u folded into the query); the position term is read by
its `score_mod` from a table instead of being relative-shifted. By distance: the table holds the
(q + v)·r of each query and distance, column c holding distance W − 1 − c (the sinusoid order, the
clamp length included), padded with n − 1 columns of negative distances, so the pair (i, j) at
distance d = W − n + i − j reads column j + n − 1 − i (what `rel_shift` moves to (i, j)). The
causal and same_length masks are distances too, so they are −inf columns of that table
(`distance_table`): the kernel's score_mod is one add of a gathered value, which inductor's CPU
kernel runs at the speed of plain attention (a clamped index or a second gather per pair made it
3-4× slower in a probe). Keys that do not exist (memory rows emptied by a document reset, TRAMS
windows with missing slots) are masked by a second read, only when some key is missing. Per pair
(TRAMS's true positions, gathered): the table is the term of each (query, key) with every mask
as −inf, as the SDPA path's additive mask. No score or probability matrix is materialised.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import flex_attention

from longctx.methods.attention_kernel import compile_flex


def distance_table(by_distance: Tensor, same_length: int | None) -> Tensor:
    """(B, H, n, W) position term per query and distance (column c: distance W − 1 − c) ->
    (B, H, n, W + n − 1): −inf in the n − 1 appended columns (keys after the query) and in the
    columns of distances >= same_length (keys beyond the same_length limit)."""
    n, W = by_distance.shape[-2:]
    table = F.pad(by_distance, (0, n - 1), value=float("-inf"))
    if same_length is not None:
        table[..., : max(W - same_length, 0)] = float("-inf")  # column c < W − s: distance >= s
    return table


@compile_flex
def relative_flex_attention(
    q: Tensor, k: Tensor, v: Tensor, table: Tensor, key_valid: Tensor | None, scale: float, by_distance: bool
) -> Tensor:
    """softmax(q·k · scale + table entry, −inf for missing keys) @ v: (B, H, n, Dh).

    q: (B, H, n, Dh) queries with u added; k, v: (B, H, W, Dh); table: `distance_table`'s
    (B, H, n, W + n − 1) when `by_distance`, else (B, H, n, W) per pair, the scaled position term
    with the masks as −inf; key_valid: (B, H|1, W) bool, or None when every key exists."""
    n = q.shape[2]
    shift = n - 1 if by_distance else 0
    per_head = key_valid is not None and key_valid.shape[1] > 1

    def score_mod(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        score = score + table[b, h, i, j + shift - i] if by_distance else score + table[b, h, i, j]
        if key_valid is None:
            return score
        return torch.where(key_valid[b, h if per_head else 0, j], score, float("-inf"))

    return flex_attention(q, k, v, score_mod=score_mod, scale=scale)
