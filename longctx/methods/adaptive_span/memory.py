"""The memory Adaptive Span carries from one block to the next (Sukhbaatar et al. 2019, §2.1).

Each layer attends to the S previous positions of its input, across block boundaries, so it keeps
the hidden states that entered it in earlier blocks (the released code's `h_cache`). The cache of a
layer holds C_l states: its attended length + 64, at most S (`SpanAttention.cache_size`: an adaptive
layer trims it with its largest span), S for fixed and dynamic spans. Fresh rows start from zeros,
which are attended (not masked), as in the code. `SpanCache` is a `longctx.core.memory.RowMemory`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class SpanCache(NamedTuple):
    """h_cache: per layer (B, C_l, d), the last C_l hidden states that entered the layer, oldest first."""

    h_cache: tuple[Tensor, ...]

    @classmethod
    def empty(
        cls,
        batch_size: int,
        *,
        sizes: list[int],
        d_model: int,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> SpanCache:
        """The caches of fresh rows: zeros (B, C_l, d) of the per-layer sizes C_l `sizes`, attended."""
        return cls(tuple(torch.zeros(batch_size, C, d_model, device=device, dtype=dtype) for C in sizes))

    def reset_rows(self, rows: Tensor) -> SpanCache:
        """Zero the rows where `rows` (B,) is True: they continue as fresh rows."""
        return SpanCache(tuple(h.masked_fill(rows.to(h.device)[:, None, None], 0.0) for h in self.h_cache))
