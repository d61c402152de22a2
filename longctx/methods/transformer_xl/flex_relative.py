"""Transformer-XL's relative attention by `flex_attention` (`attention="flex"`, evaluation).

The content term is the kernel's q·k (with u folded into the query); the position term is read by
its `score_mod` from a table instead of being relative-shifted: `by_distance`, the (q + v)·r of each
query and distance (B, H, n, W), column c holding distance W − 1 − c (the sinusoid order, clamp
length included), so the pair (i, j) at distance d = W − n + i − j reads column j + n − 1 − i (what
`rel_shift` moves there); else the term per (query, key) pair (TRAMS's true positions, gathered).
The masks of `window_blocked` are applied in the same `score_mod` as −inf: causal, same_length,
and keys that do not exist (key_valid, per head under TRAMS). No score or probability matrix is
materialised.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import flex_attention

from longctx.methods.attention_kernel import compile_flex


@compile_flex
def relative_flex_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    position: Tensor,
    key_valid: Tensor,
    scale: float,
    same_length: int,
    by_distance: bool,
) -> Tensor:
    """softmax(q·k · scale + position, −inf where blocked) @ v: (B, H, n, Dh).

    q: (B, H, n, Dh) queries with u added; k, v: (B, H, W, Dh); position: (B, H, n, W) the scaled
    position term, per distance (`by_distance`) or per pair; key_valid: (B, H|1, W) bool;
    same_length: keys per query limit, −1 for none."""
    n, W = q.shape[2], k.shape[2]
    per_head = key_valid.shape[1] > 1

    def score_mod(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        dist = W - n + i - j
        column = torch.clamp(j + n - 1 - i, max=W - 1) if by_distance else j  # future keys: blocked
        blocked = (dist < 0) | ~key_valid[b, h if per_head else 0, j]
        if same_length >= 0:
            blocked = blocked | (dist >= same_length)
        return torch.where(blocked, float("-inf"), score + position[b, h, i, column])

    return flex_attention(q, k, v, score_mod=score_mod, scale=scale)
