"""Transformer-XL segment memory (Dai et al. 2019, §3.2; kimiyoung/transformer-xl `_update_mems`).

Each layer keeps the last `mem_len` of its inputs (the embedding output for layer 0), detached: after
a segment, memory_l = last mem_len of [memory_l, input_l]. The memory is an `XLMemory` (a NamedTuple,
a pytree that `LMBase` detaches and carries across batches).

A memory type meets the layers through one seam, `SegmentMemory` (the model: Hugging Face's
`cache.update(k, v, layer_idx)`): over one segment it answers, per layer, which keys and values the
layer attends at which positions with which validity (a `KeyWindow`), and, after the segment, what
is kept. Transformer-XL's is `XLSegment`; TRAMS's pool (`trams_pool.py`) and the Compressive
Transformer's two memories (`compressive_transformer/memory.py`) are others; the one layer loop
(`TransformerXL.attend`) serves them all.

`valid` marks slots that hold a real token. Transformer-XL's evaluation starts from an empty memory
(P = 0); TRAMS's starts from a zero-filled one (P = mem_len zero states that are attended, as the
released code's `init_mems`). A row that starts a new document gets its slots cleared: invalid
(masked) under the XL convention, zero and attended under the TRAMS convention. The memory carries
its convention (`XLMemory.zero_attended`, set by `XLMemory.empty`), so its `reset_rows` (the
`longctx.core.memory.RowMemory` protocol) needs no module to say which.

At evaluation the weights do not change, so a layer's memory keys and values (W_K h, W_V h of the
stored inputs h) can be cached with the memory instead of being projected again every segment (the
released codes re-project them); that cache is exact and dropped whenever rows are reset. Under TRAMS
with a key-only metric ("code", "paper") each slot's selection score is cached with its key the same
way (`trams_pool.py`): computed once, when the slot enters the pool, and dropped with the keys. The cached
memory's tensors are views of buffers that the next segment appends to in place (`slot_store.py`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import MappingProxyType
from typing import NamedTuple, Protocol, TypeVar

import torch
from torch import Tensor

from longctx.methods.fifo import fifo_step
from longctx.methods.transformer_xl.relative_attention import (
    AttentionOutput,
    KeyWindow,
    RelMultiHeadAttention,
)
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


class XLMemory(NamedTuple):
    """The memory of a batch of rows; P = slots held (at most mem_len, or the TRAMS pool M).

    hidden: per layer (B, P, d), the layer's last P inputs (layer 0: the embedding output).
    valid: (B, P) bool, the slot holds a real token (False: empty slot of a reset row, masked).
    kv: per layer (2, B, H, P, Dh), the keys W_K h ([0], `key`) and values W_V h ([1]) of
        `hidden` (the evaluation key/value cache; one tensor, so that a TRAMS window gathers both
        with one copy), or None (the next segment projects `hidden` again).
    score: (L, B, H, P), per layer the TRAMS score of each cached key under the metric of the TRAMS
        settings that wrote it, −inf where `valid` is False (the score cache; only with `kv`), or
        None (scored again).
    score_matrix: (L, H, Dh, ·), per layer the `trams.score_matrix` that scores new keys (with
        `score`; it depends on the weights only, like the cached keys), or None.
    slots: with the key/value cache, where the tensors above lie in the buffers they view (the next
        segment appends after them in place, `slot_store.py`), else None.
    zero_attended: the convention of fresh rows, kept from segment to segment: TRAMS's (True: zero
        states that are attended, so a reset row's slots become attended zeros) or Transformer-XL's
        (False: nothing, so a reset row's slots are masked).
    """

    hidden: list[Tensor]
    valid: Tensor
    kv: list[Tensor] | None = None
    score: Tensor | None = None
    score_matrix: Tensor | None = None
    slots: SlotCursor | None = None
    zero_attended: bool = False

    # The fields kept in slots and their slot dims: hidden (B, P, d), valid (B, P), keys and values
    # kv (2, B, H, P, Dh) and score (L, B, H, P), all layers' in one buffer. (Not annotated: a class
    # attribute, not a field.)
    SLOTS = SlotLayout(MappingProxyType({"hidden": 1, "valid": 1, "kv": 3, "score": 3}))

    @classmethod
    def empty(
        cls,
        batch_size: int,
        *,
        n_layers: int,
        d_model: int,
        zeros: int | None = None,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> XLMemory:
        """The memory of fresh rows for `n_layers` layers of width `d_model`. zeros None:
        Transformer-XL's convention, nothing held (P = 0); zeros = M: TRAMS's (the released code's
        `init_mems`), M zero states that are attended (`zero_attended`)."""
        P = zeros or 0
        hidden = [torch.zeros(batch_size, P, d_model, device=device, dtype=dtype) for _ in range(n_layers)]
        valid = torch.full((batch_size, P), zeros is not None, dtype=torch.bool, device=device)
        return cls(hidden, valid, zero_attended=zeros is not None)

    def reset_rows(self, rows: Tensor) -> XLMemory:
        """The rows where `rows` (B,) is True cleared: zero states, masked (Transformer-XL's
        convention) or attended (TRAMS's, `zero_attended`). A key/value cache and its scores are
        dropped (the next segment projects and scores the memory again)."""
        rows = rows.to(self.valid.device)
        hidden = [h.masked_fill(rows[:, None, None], 0.0) for h in self.hidden]
        valid = self.valid.masked_fill(rows[:, None], self.zero_attended)
        return XLMemory(hidden, valid, zero_attended=self.zero_attended)

    @property
    def key(self) -> list[Tensor] | None:
        """Per layer the cached keys (B, H, P, Dh), or None."""
        return None if self.kv is None else [kv[0] for kv in self.kv]

    def slot_appender(self, n: int, keep: int) -> SlotAppender:
        """The appender that forms [memory, segment] of this memory's cached tensors (`slot_store.py`)."""
        return SlotAppender(self.SLOTS, self.slots, self.valid.shape[1], n, keep)


class SegmentMemory(Protocol):
    """A memory type over one segment: what the layer loop (`TransformerXL.attend`) asks of it.

    n_layers: the per-layer memories it holds; slots: the memory slots before the segment (P: the
    position embeddings cover distances up to P + n − 1); needs_weights: its layers must return
    their attention probabilities (read by `attended`). After the segment, the memory type's own
    `kept(...)` gives the memory carried to the next one, its eviction decided once per segment.
    """

    n_layers: int
    slots: int
    needs_weights: bool

    def window(self, layer: int, attn: RelMultiHeadAttention, h: Tensor) -> KeyWindow:
        """The keys layer `layer` attends for its input h (B, n, d), projected by its attention `attn`
        (`project_kv`); records what the kept memory needs of h."""
        ...

    def attended(self, layer: int, out: AttentionOutput) -> None:
        """What layer `layer`'s attention gave (its probabilities when `needs_weights`)."""
        ...


class XLSegment:
    """Transformer-XL's memory over one segment (§3.2): layer l attends h~ = [SG(memory_l), h_l], its
    memory then its input, at relative positions P + n − 1 … 0, and keeps the last mem_len of it.

    memory: what the previous segment kept; n: the segment's length; mem_len: the slots kept for the
    next segment (the TRAMS pool M); same_length: every query sees at most mem_len keys
    (`window_blocked`); cache_kv: carry the memory's keys and values with it (evaluation: exact while
    the weights do not change; no gradient reaches W_K, W_V through cached keys), appended in place
    without autograd (`slot_store.py`), else concatenated.
    """

    def __init__(
        self, memory: XLMemory, n: int, mem_len: int, same_length: bool = False, cache_kv: bool = False
    ):
        B, P = memory.valid.shape
        self.memory, self.n, self.cache_kv = memory, n, cache_kv
        self.n_layers, self.slots, self.needs_weights = len(memory.hidden), P, False
        self.same_length = mem_len if same_length else None
        self.fifo = fifo_step(P, n, mem_len)  # the slots evicted after the segment, from every tensor
        self.appender = memory.slot_appender(n, mem_len) if cache_kv and not torch.is_grad_enabled() else None
        self.key_valid = torch.cat([memory.valid, memory.valid.new_ones(B, n)], dim=1)  # (B, P + n)
        self.inputs: list[Tensor] = []  # per layer its input h_l (B, n, d)
        self.kv: list[Tensor] = []  # per layer, with the cache, the keys and values (2, B, H, P + n, Dh)

    def window(self, layer: int, attn: RelMultiHeadAttention, h: Tensor) -> KeyWindow:
        self.inputs.append(h)
        kv = self._keys_and_values(layer, attn, h)  # (2, B, H, P + n, Dh)
        if self.cache_kv:
            self.kv.append(kv)
        return self._window(layer, attn, kv)

    def attended(self, layer: int, out: AttentionOutput) -> None:
        pass

    def _keys_and_values(self, layer: int, attn: RelMultiHeadAttention, h: Tensor) -> Tensor:
        """Keys and values of [memory, segment] (2, B, H, P + n, Dh): the cached memory's joined with
        the segment's, else all projected (as the released codes do every segment)."""
        if self.cache_kv and self.memory.kv is not None:
            return self._join("kv", self.memory.kv[layer], attn.project_kv(h), layer)
        mem = self.memory.hidden[layer]
        return attn.project_kv(torch.cat([mem.to(h.dtype), h], dim=1) if self.slots else h)

    def _window(self, layer: int, attn: RelMultiHeadAttention, kv: Tensor) -> KeyWindow:
        """The window of layer `layer` from its keys and values of [memory, segment]: all of them."""
        return KeyWindow(kv[0], kv[1], self.key_valid[:, None, :], self.same_length)

    def _join(self, field: str, old: Tensor, new: Tensor, layer: int = 0) -> Tensor:
        """[old, new] of one of `XLMemory.SLOTS`' fields: in place in the slot store, else a new tensor."""
        if self.appender is None:
            return XLMemory.SLOTS.cat(field, old, new)
        return self.appender.extend(field, old, new, layer)

    def kept(self, carry_gradient: bool = False) -> XLMemory:
        """The memory after the segment: each layer's last mem_len of [memory, input], detached (SG),
        with the cache their keys and values (and TRAMS's scores, `_kept_scores`).

        carry_gradient: keep the memory's graph instead (truncated backpropagation through several
        segments, the module's `tbptt_segments`: `LMBase` detaches it at the end of a training batch).
        """
        if carry_gradient:
            return self._kept(lambda h: h)
        with torch.no_grad():
            return self._kept(Tensor.detach)

    def _kept(self, stop_gradient: Callable[[Tensor], Tensor]) -> XLMemory:
        valid = self.memory.valid
        ones = valid.new_ones(valid.shape[0], self.n)
        new_valid = self.fifo.append(valid, ones, join=partial(self._join, "valid")).kept
        hidden = [
            self.fifo.append(mem, stop_gradient(h), join=partial(self._join, "hidden", layer=i)).kept
            for i, (mem, h) in enumerate(zip(self.memory.hidden, self.inputs))
        ]
        zero_attended = self.memory.zero_attended
        if not self.cache_kv:
            return XLMemory(hidden, new_valid, zero_attended=zero_attended)
        kv = [self.fifo.split(t, dim=3).kept.detach() for t in self.kv]
        score, score_matrix = self._kept_scores()
        slots = self.appender.cursor() if self.appender is not None else None  # every field is appended
        return XLMemory(hidden, new_valid, kv, score, score_matrix, slots, zero_attended)

    def _kept_scores(self) -> tuple[Tensor | None, Tensor | None]:
        """The score cache kept with the keys (TRAMS, `XLMemory.score`, `score_matrix`): none here."""
        return None, None
