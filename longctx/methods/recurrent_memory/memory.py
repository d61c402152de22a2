"""The memory the Recurrent Memory Transformer carries from segment to segment (Bulatov et al. 2022, §3).

Segment τ reads m memory tokens H_τ^mem at its start and writes H_{τ+1}^mem at its end
(`network.py`); across batches the last segment's written memory is carried. A row starts from the
learned initial memory (`MemoryCell.memory`) when it has no memory yet and wherever its document
restarts (`batch["reset"]`, window by window).
"""

from __future__ import annotations

import torch
from torch import Tensor

from longctx.core.memory import CarriedState


class MemoryTokens(CarriedState):
    """state: (B, m, d), the memory tokens each row's next segment reads: the last hidden states of
    the write tokens of its previous segment; None: no row has written any (fresh rows: their first
    segment reads the initial memory, `read_memory`). fresh: the rows `reset_rows` made fresh, which
    read the initial memory at the next batch's first segment (`CarriedState`)."""

    __slots__ = ()


def read_memory(state: Tensor | None, initial: Tensor, reset: Tensor) -> Tensor:
    """H_τ^mem (B, m, d) of the rows of one segment: the carried `state` (B, m, d), or the initial
    memory `initial` (m, d) where `reset` (B,) is True, and for every row when there is no state
    (None: the first segment).

    The initial memory always enters the graph (`torch.where`, no host sync to test whether any row
    resets), so it gets a gradient, zero when no row restarts: every parameter is used in every step,
    as DDP requires."""
    batch = reset.shape[0]
    fresh = initial.expand(batch, *initial.shape)  # (B, m, d)
    if state is None:
        return fresh
    return torch.where(reset.view(batch, 1, 1), fresh.to(state.dtype), state)
