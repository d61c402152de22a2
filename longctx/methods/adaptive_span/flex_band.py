"""Adaptive span's band attention by `flex_attention` (`attention="flex"`, evaluation).

Query i (key index L + i) attends keys i .. i + L − 1 (distances L .. 1). Its logits are the content
q·k (the kernel's score) plus, per query and distance, the position logit q·p and the span mask as a
log-mask log(m + 1e-30), both read by the `score_mod` from one table (`band_table`): column
j − i + M − 1 for key j, padded with −inf columns for keys outside the band (at or after the query,
or beyond L). So all M queries run in one kernel over the L + M keys, with no chunks, no skew and
no score matrix materialised. softmax(s + log m) = m·e^s / Σ m·e^s: the authors' renormalisation
without its epsilon (they divide by Σ m·p + 1e-8, p the unmasked softmax), so flex, like "sdpa", is
larger than the code by the factor 1 + 1e-8 / Σ m·p (relative 1e-8 / Σ m·p; below 1e-7 while a
tenth of the probability lies inside the span).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import flex_attention

from longctx.methods.attention_kernel import compile_flex

LOG_MASK_FLOOR = 1e-30  # added to the span mask before its log (see `log_mask`)


def log_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """log(m + 1e-30) in `dtype`, formed in float32 at least (1e-30 is 0 in half precision).

    Not log m: a key with m = 0 keeps a probability 1e-30 times its unmasked one (eager: 0), and the
    gradient of m there stays eager's p·(…) (the ramp's clamp passes it at exactly 0) instead of
    0·∞ = NaN; for m > 0 it is log m in float32."""
    exact = mask.to(torch.promote_types(mask.dtype, torch.float32))
    return (exact + LOG_MASK_FLOOR).log().to(dtype)


def band_table(position: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """(B, H, M, L) position logits q·p (column t: distance L − t) and the mask (broadcastable) ->
    (B, H, M, L + 2M − 1): q·p · scale + log-mask in columns M − 1 .. M + L − 2, −inf elsewhere."""
    M = position.shape[2]
    table = position * scale
    if mask is not None:
        table = table + log_mask(mask, table.dtype)
    return F.pad(table, (M - 1, M), value=float("-inf"))


@compile_flex
def band_flex_attention(q: Tensor, k: Tensor, v: Tensor, table: Tensor, scale: float) -> Tensor:
    """softmax(q·k · scale + table[i, j − i + M − 1]) @ v: (B, H, M, Dh); q: (B, H, M, Dh), k, v:
    (B, H, L + M, Dh), table: `band_table`'s."""
    M = q.shape[2]

    def score_mod(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return score + table[b, h, i, j - i + M - 1]

    return flex_attention(q, k, v, score_mod=score_mod, scale=scale)
