"""Transformer-XL segment memory (Dai et al. 2019, §3.2; kimiyoung/transformer-xl `_update_mems`).

Each layer keeps the last `mem_len` of its inputs (the embedding output for layer 0), detached: after
a segment, memory_l = last mem_len of [memory_l, input_l]. The memory is an `XLMemory` (a NamedTuple,
a pytree that `LMBase` detaches and carries across batches).

`valid` marks slots that hold a real token. Transformer-XL's evaluation starts from an empty memory
(P = 0); TRAMS's starts from a zero-filled one (P = mem_len zero states that are attended, as the
released code's `init_mems`). A row that starts a new document gets its slots cleared: invalid
(masked) under the XL convention, zero and attended under the TRAMS convention.

At evaluation the weights do not change, so a layer's memory keys and values (W_K h, W_V h of the
stored inputs h) can be cached with the memory instead of being projected again every segment (the
released codes re-project them); that cache is exact and dropped whenever rows are reset. Under TRAMS
with a key-only metric ("code", "paper") each slot's selection score is cached with its key the same
way (`trams.py`): computed once, when the slot enters the pool, and dropped with the keys. The cached
memory's tensors are views of buffers that the next segment appends to in place (`slot_store.py`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from types import MappingProxyType
from typing import NamedTuple, TypeVar

import torch
from torch import Tensor

from longctx.methods.fifo import evicted_count, fifo_append, split_evicted
from longctx.methods.transformer_xl.slot_store import SlotAppender, SlotCursor, SlotLayout

Lengths = TypeVar("Lengths", bound="MemoryLengths")


@dataclass(frozen=True)
class MemoryLengths:
    """The lengths a memory network runs with (`TransformerXL.forward`): mem_len (the memory kept
    per layer), clamp_len (cap of relative positions, 0 = none), same_length (equal key count per
    query). A module holds two: `train_lengths` and `eval_lengths`, the latter from its `evaluation`
    group, where a field None is the training value (`over`), so a checkpoint can be evaluated with a
    longer memory. The Compressive Transformer's adds its compressed memory (`cmem_len`)."""

    mem_len: int | None = None
    clamp_len: int | None = None
    same_length: bool | None = None

    def over(self, training: Lengths) -> Lengths:
        """`training` with this group's fields where they are set (fields `training` lacks, e.g. the
        evaluation group's `cache_kv`, are not lengths)."""
        names = [f.name for f in dataclasses.fields(training)]
        given = {name: getattr(self, name) for name in names if getattr(self, name, None) is not None}
        return dataclasses.replace(training, **given)


def length_attributes(lengths: str, *names: str) -> tuple[property, ...]:
    """Properties reading and setting `self.<lengths>.<name>` for each name: the flat attributes a
    module had before its lengths were `MemoryLengths` (`model.eval_mem_len = 64` still works, and
    one value is stored)."""

    def attribute(name: str) -> property:
        def get(self: object) -> int | bool:
            return getattr(getattr(self, lengths), name)

        def set_(self: object, value: int | bool) -> None:
            setattr(self, lengths, dataclasses.replace(getattr(self, lengths), **{name: value}))

        return property(get, set_, doc=f"`{lengths}.{name}`")

    return tuple(attribute(name) for name in names)


class XLMemory(NamedTuple):
    """The memory of a batch of rows; P = slots held (at most mem_len, or the TRAMS pool M).

    hidden: per layer (B, P, d), the layer's last P inputs (layer 0: the embedding output).
    valid: (B, P) bool, the slot holds a real token (False: empty slot of a reset row, masked).
    kv: per layer (2, B, H, P, Dh), the keys W_K h ([0], `key`) and values W_V h ([1], `value`) of
        `hidden` (the evaluation key/value cache; one tensor, so that a TRAMS window gathers both
        with one copy), or None (the next segment projects `hidden` again).
    score: (L, B, H, P), per layer the TRAMS score of each cached key under the metric of the TRAMS
        settings that wrote it, −inf where `valid` is False (the score cache; only with `kv`), or
        None (scored again).
    score_matrix: (L, H, Dh, ·), per layer the `trams.score_matrix` that scores new keys (with
        `score`; it depends on the weights only, like the cached keys), or None.
    slots: with the key/value cache, where the tensors above lie in the buffers they view (the next
        segment appends after them in place, `slot_store.py`), else None.
    """

    hidden: list[Tensor]
    valid: Tensor
    kv: list[Tensor] | None = None
    score: Tensor | None = None
    score_matrix: Tensor | None = None
    slots: SlotCursor | None = None

    # The fields kept in slots and their slot dims: hidden (B, P, d), valid (B, P), keys and values
    # kv (2, B, H, P, Dh) and score (L, B, H, P), all layers' in one buffer. (Not annotated: a class
    # attribute, not a field.)
    SLOTS = SlotLayout(MappingProxyType({"hidden": 1, "valid": 1, "kv": 3, "score": 3}))

    @property
    def key(self) -> list[Tensor] | None:
        """Per layer the cached keys (B, H, P, Dh), or None."""
        return None if self.kv is None else [kv[0] for kv in self.kv]

    @property
    def value(self) -> list[Tensor] | None:
        """Per layer the cached values (B, H, P, Dh), or None."""
        return None if self.kv is None else [kv[1] for kv in self.kv]

    def slot_appender(self, n: int, keep: int) -> SlotAppender:
        """The appender that forms [memory, segment] of this memory's cached tensors (`slot_store.py`)."""
        return SlotAppender(self.SLOTS, self.slots, self.valid.shape[1], n, keep)


def empty_memory(
    n_layers: int, batch_size: int, d_model: int, device=None, dtype: torch.dtype | None = None
) -> XLMemory:
    """The memory of fresh rows under Transformer-XL's convention: nothing (P = 0)."""
    hidden = [torch.zeros(batch_size, 0, d_model, device=device, dtype=dtype) for _ in range(n_layers)]
    return XLMemory(hidden, torch.zeros(batch_size, 0, dtype=torch.bool, device=device))


def zero_memory(
    n_layers: int, batch_size: int, mem_len: int, d_model: int, device=None, dtype: torch.dtype | None = None
) -> XLMemory:
    """The memory of fresh rows under TRAMS's convention: mem_len zero states, attended."""
    hidden = [torch.zeros(batch_size, mem_len, d_model, device=device, dtype=dtype) for _ in range(n_layers)]
    return XLMemory(hidden, torch.ones(batch_size, mem_len, dtype=torch.bool, device=device))


@torch.no_grad()
def update_memory(
    memory: XLMemory,
    inputs: list[Tensor],
    mem_len: int,
    kv: list[Tensor] | None = None,
    score: Tensor | None = None,
    score_matrix: Tensor | None = None,
    appender: SlotAppender | None = None,
) -> XLMemory:
    """Append each layer's segment input (B, n, d) to its memory and keep the last mem_len slots
    (`longctx.methods.fifo`; the evicted states are dropped).

    kv: per layer the keys and values of [memory, segment] (2, B, H, P + n, Dh) to cache, or None;
    score, score_matrix: the TRAMS scores of [memory, segment] (L, B, H, P + n) and the layers'
    score matrices to cache (with kv), or None; appender: the `SlotAppender` that formed kv and
    scores (with kv): the hidden states and validity are appended in place with them, and the new
    memory views its store.
    """
    valid = memory.valid
    B, n = inputs[0].shape[:2]
    if appender is None:
        new_valid = fifo_append(valid, valid.new_ones(B, n), mem_len).kept
        hidden = [fifo_append(h.to(x.dtype), x.detach(), mem_len).kept for h, x in zip(memory.hidden, inputs)]
    else:
        join_valid = partial(appender.extend, "valid")
        new_valid = fifo_append(valid, valid.new_ones(B, n), mem_len, join=join_valid).kept
        hidden = [
            fifo_append(h, x.detach(), mem_len, join=partial(appender.extend, "hidden", layer=i)).kept
            for i, (h, x) in enumerate(zip(memory.hidden, inputs))
        ]
    if kv is None:
        return XLMemory(hidden, new_valid)
    evicted = evicted_count(valid.shape[1], n, mem_len)  # kv and score hold [memory, segment] already
    kv = [split_evicted(t, evicted, dim=-2).kept.detach() for t in kv]
    if score is not None:
        score = split_evicted(score, evicted, dim=-1).kept.detach()
    slots = appender.cursor() if appender is not None else None  # every field is appended by now
    return XLMemory(hidden, new_valid, kv, score, score_matrix, slots)


def reset_memory_rows(memory: XLMemory, reset: Tensor, zero_fill: bool = False) -> XLMemory:
    """Clear the rows where reset (B,) is True: zero states, masked (zero_fill=False) or attended.
    A key/value cache and its scores are dropped (the next segment projects and scores the memory
    again)."""
    reset = reset.to(memory.valid.device)
    hidden = [h.masked_fill(reset[:, None, None], 0.0) for h in memory.hidden]
    return XLMemory(hidden, memory.valid.masked_fill(reset[:, None], zero_fill))
