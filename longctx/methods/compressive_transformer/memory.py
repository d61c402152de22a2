"""The Compressive Transformer's two memories (Rae et al. 2020, §3.1 and Algorithm 1).

Per layer a memory of the last n_m layer inputs (as Transformer-XL's, `transformer_xl/memory.py`) and a
compressed memory of n_cm slots. After a segment of n_s states, the oldest states of [memory, segment]
beyond n_m are evicted; the network compresses them with the layer's f_c at rate c (`compression.py`)
and appends the result to the compressed memory, whose oldest slots drop out beyond n_cm. Both are
first-in first-out and hold detached states.

Eviction works in whole groups of c: when the overflow is not a multiple of c (a partial memory, or
n_s and n_m not multiples of c), the memory keeps the remainder (at most c − 1 extra slots) until a
group is complete, so no state is dropped uncompressed. With n_cm = 0 nothing is compressed and the
memory is exactly Transformer-XL's.

A compressed slot is valid when every state it summarises is valid: a group that straddles a
document reset (zeros of the cleared row, then real states) is masked rather than mixed.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from longctx.methods import fifo


class CompressiveMemory(NamedTuple):
    """The memories of a batch of rows; P_m, P_cm = slots held (at most n_m (+ c − 1), n_cm).

    hidden: per layer (B, P_m, d), the layer's last inputs (layer 0: the embedding output).
    valid: (B, P_m) bool, the slot holds a real state (False: cleared by a document reset).
    compressed: per layer (B, P_cm, d), the compressed memory, oldest first.
    compressed_valid: (B, P_cm) bool.
    kv, compressed_kv: at evaluation with the key/value cache, per layer the keys and values
        (2, B, H, P_m, Dh) and (2, B, H, P_cm, Dh) the layer projected from those slots, so that they
        are not projected again every segment (exact: the weights do not change); None otherwise, and
        after a reset (the next segment projects every slot again and restarts the cache).
    """

    hidden: list[Tensor]
    valid: Tensor
    compressed: list[Tensor]
    compressed_valid: Tensor
    kv: list[Tensor] | None = None
    compressed_kv: list[Tensor] | None = None


class Eviction(NamedTuple):
    """The memory after a segment and what left it.

    hidden, valid: the new memory (detached); evicted: per layer (B, e, d), the states that left it,
    oldest first (detached; e is a multiple of c whenever they are to be compressed);
    evicted_valid: (B, e).
    """

    hidden: list[Tensor]
    valid: Tensor
    evicted: list[Tensor]
    evicted_valid: Tensor


def empty_compressive_memory(
    n_layers: int, batch_size: int, d_model: int, device=None, dtype: torch.dtype | None = None
) -> CompressiveMemory:
    """The memories of fresh rows: nothing held (P_m = P_cm = 0)."""

    def nothing() -> list[Tensor]:
        return [torch.zeros(batch_size, 0, d_model, device=device, dtype=dtype) for _ in range(n_layers)]

    no_slot = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)
    return CompressiveMemory(nothing(), no_slot, nothing(), no_slot.clone())


def evicted_count(held: int, segment: int, mem_len: int, rate: int, compressing: bool) -> int:
    """How many of the `held` + `segment` states leave a memory of `mem_len`: the overflow, rounded
    down to whole groups of `rate` when they are compressed."""
    return fifo.evicted_count(held, segment, mem_len, group=rate if compressing else 1)


@torch.no_grad()
def evict(
    memory: CompressiveMemory, inputs: list[Tensor], mem_len: int, rate: int, compressing: bool
) -> Eviction:
    """Append each layer's segment input (B, n, d) to its memory; return the memory and the states
    evicted from its old end (see `evicted_count`)."""
    B, n = inputs[0].shape[:2]
    group = rate if compressing else 1
    valid = fifo.fifo_append(memory.valid, memory.valid.new_ones(B, n), mem_len, group=group)
    states = [
        fifo.fifo_append(h.to(x.dtype), x.detach(), mem_len, group=group)
        for h, x in zip(memory.hidden, inputs)
    ]
    return Eviction([s.kept for s in states], valid.kept, [s.evicted for s in states], valid.evicted)


@torch.no_grad()
def append_compressed(
    memory: CompressiveMemory, new: list[Tensor], new_valid: Tensor, cmem_len: int
) -> tuple[list[Tensor], Tensor]:
    """Each layer's compressed memory with `new` (B, k, d) appended, the last `cmem_len` slots kept."""
    valid = fifo.fifo_append(memory.compressed_valid, new_valid, cmem_len).kept
    compressed = [
        fifo.fifo_append(cm.to(x.dtype), x.detach(), cmem_len).kept for cm, x in zip(memory.compressed, new)
    ]
    return compressed, valid


def reset_compressive_memory_rows(memory: CompressiveMemory, reset: Tensor) -> CompressiveMemory:
    """Clear both memories of the rows where reset (B,) is True: zero states, masked; the key/value
    caches are dropped (the next segment projects the memories again)."""
    reset = reset.to(memory.valid.device)
    return CompressiveMemory(
        [h.masked_fill(reset[:, None, None], 0.0) for h in memory.hidden],
        memory.valid.masked_fill(reset[:, None], False),
        [c.masked_fill(reset[:, None, None], 0.0) for c in memory.compressed],
        memory.compressed_valid.masked_fill(reset[:, None], False),
    )
