"""First-in first-out memories: append a segment's slots, keep the last N, return what was evicted.

Every memory a method carries from one segment to the next is one: Transformer-XL's memory and
TRAMS's pool (`transformer_xl/memory.py`: the last mem_len, or M, layer inputs), adaptive span's
cache (`adaptive_span/network.py`: the last C_l hidden states) and the Compressive Transformer's two
memories (`compressive_transformer/memory.py`), which compresses what its memory evicts instead of
discarding it. Shared by the methods, so it imports none of them.

Slots lie along one dim (`dim`), oldest first. The evicted slots are the oldest ones of [old, new];
the kept and evicted tensors are views of [old, new] (no copy beyond forming it). The split depends
only on the slot counts: a memory that holds several tensors over the same slots (per layer states,
their validity, keys and values) decides it once per segment (`fifo_step`) and applies it to each.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor


class FifoUpdate(NamedTuple):
    """kept: the memory after the append (the newest slots of [old, new]); evicted: the slots that
    left it, oldest first (empty when nothing overflowed)."""

    kept: Tensor
    evicted: Tensor


def evicted_count(held: int, incoming: int, capacity: int, group: int = 1) -> int:
    """How many of `held` + `incoming` slots leave a memory of `capacity` slots: the overflow, rounded
    down to whole groups of `group` (the Compressive Transformer evicts whole groups of its rate c;
    the memory keeps the remainder, at most group − 1 slots beyond capacity, until a group is whole)."""
    if capacity < 0 or group < 1:
        raise ValueError(f"need capacity >= 0 and group >= 1, got {capacity} and {group}")
    overflow = max(held + incoming - capacity, 0)
    return overflow - overflow % group


def split_evicted(joined: Tensor, evicted: int, dim: int = 1) -> FifoUpdate:
    """[old, new] already joined along `dim`, split into its newest slots and its `evicted` oldest."""
    slots = joined.shape[dim]
    return FifoUpdate(joined.narrow(dim, evicted, slots - evicted), joined.narrow(dim, 0, evicted))


class FifoStep(NamedTuple):
    """One segment's append to a first-in first-out memory, decided once from the slot counts
    (`fifo_step`) and applied to every tensor over the same slots (per layer states, validity, keys
    and values): `evicted` oldest slots of [old, new] leave."""

    evicted: int

    def split(self, joined: Tensor, dim: int = 1) -> FifoUpdate:
        """[old, new] already joined along `dim`: its kept and evicted slots."""
        return split_evicted(joined, self.evicted, dim)

    def append(
        self, old: Tensor, new: Tensor, dim: int = 1, join: Callable[[Tensor, Tensor], Tensor] | None = None
    ) -> FifoUpdate:
        """[old, new] (formed by `join`, default `torch.cat` along `dim`) split into kept and evicted."""
        return self.split(torch.cat([old, new], dim=dim) if join is None else join(old, new), dim)


def fifo_step(held: int, incoming: int, capacity: int, group: int = 1) -> FifoStep:
    """The append of `incoming` slots to a memory holding `held` of `capacity` (see `evicted_count`)."""
    return FifoStep(evicted_count(held, incoming, capacity, group))


def fifo_append(
    old: Tensor,
    new: Tensor,
    capacity: int,
    dim: int = 1,
    group: int = 1,
    join: Callable[[Tensor, Tensor], Tensor] | None = None,
) -> FifoUpdate:
    """Append `new` after `old` along `dim`, keep the last `capacity` slots (see `evicted_count` for
    `group`) and return them with the evicted ones.

    join: how [old, new] is formed; default `torch.cat` along `dim` (a new tensor, dtypes promoted as
    `torch.cat` does: a caller that wants the memory in the new slots' dtype casts `old` first).
    Transformer-XL's evaluation cache passes its `SlotAppender.extend`, which appends in place into
    preallocated buffers. A memory with several tensors over the same slots decides the step once
    (`fifo_step`) and applies it to each.
    """
    return fifo_step(old.shape[dim], new.shape[dim], capacity, group).append(old, new, dim, join)
