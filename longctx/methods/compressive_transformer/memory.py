"""The Compressive Transformer's two memories (Rae et al. 2020, §3.1 and Algorithm 1).

Per layer a memory of the last n_m layer inputs (as Transformer-XL's, `transformer_xl/memory.py`) and a
compressed memory of n_cm slots. After a segment of n_s states, the oldest states of [memory, segment]
beyond n_m are evicted; the network compresses them with the layer's f_c at rate c (`compression.py`)
and appends the result to the compressed memory, whose oldest slots drop out beyond n_cm. Both are
first-in first-out and hold detached states (the memory keeps its graph within a training batch
under truncated BPTT, `CompressiveSegment.eviction`).

Eviction works in whole groups of c: when the overflow is not a multiple of c (a partial memory, or
n_s and n_m not multiples of c), the memory keeps the remainder (at most c − 1 extra slots) until a
group is complete, so no state is dropped uncompressed. With n_cm = 0 nothing is compressed and the
memory is exactly Transformer-XL's.

A compressed slot is valid when every state it summarises is valid: a group that straddles a
document reset (zeros of the cleared row, then real states) is masked rather than mixed.
`CompressiveMemory` is a `longctx.core.memory.RowMemory` (`empty`, `reset_rows`).

Over one segment the two memories are a memory type of Transformer-XL's layer loop
(`CompressiveSegment`, a `transformer_xl/memory.py:SegmentMemory`): each layer attends [cm ; m ;
segment], and after the segment the memory's eviction (decided once) and the network's compression
of what it evicted give the memories kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from longctx.methods import fifo
from longctx.methods.transformer_xl.memory import MemoryLengths, XLMemory
from longctx.methods.transformer_xl.relative_attention import (
    AttentionOutput,
    KeyWindow,
    RelMultiHeadAttention,
)


@dataclass(frozen=True)
class CompressiveLengths(MemoryLengths):
    """Transformer-XL's lengths (mem_len n_m, clamp_len, same_length) and the compressed memory's,
    cmem_len (n_cm): what `CompressiveTransformer.forward` runs with, the module's `train_lengths`
    and `eval_lengths` (the latter from the `evaluation` group, `CompressiveEvaluationMemory`, where a
    field None is the training value: `MemoryLengths.over`)."""

    cmem_len: int | None = None


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

    @classmethod
    def empty(cls, batch_size: int, **sizes: Any) -> CompressiveMemory:
        """The memories of fresh rows: nothing held (P_m = P_cm = 0), each an empty Transformer-XL
        memory; `sizes`: `XLMemory.empty`'s (n_layers, d_model, device, dtype)."""
        memory, compressed = (XLMemory.empty(batch_size, **sizes) for _ in range(2))
        return cls(memory.hidden, memory.valid, compressed.hidden, compressed.valid)

    def reset_rows(self, rows: Tensor) -> CompressiveMemory:
        """Both memories of the rows where `rows` (B,) is True cleared: zero states, masked; the
        key/value caches are dropped (the next segment projects the memories again)."""
        rows = rows.to(self.valid.device)
        return CompressiveMemory(
            [h.masked_fill(rows[:, None, None], 0.0) for h in self.hidden],
            self.valid.masked_fill(rows[:, None], False),
            [c.masked_fill(rows[:, None, None], 0.0) for c in self.compressed],
            self.compressed_valid.masked_fill(rows[:, None], False),
        )


class Eviction(NamedTuple):
    """The memory after a segment and what left it.

    hidden, valid: the new memory (detached, unless its graph is carried); evicted: per layer
    (B, e, d), the states that left it, oldest first (detached; e is a multiple of c whenever they
    are to be compressed); evicted_valid: (B, e).
    """

    hidden: list[Tensor]
    valid: Tensor
    evicted: list[Tensor]
    evicted_valid: Tensor


def evicted_count(held: int, segment: int, mem_len: int, rate: int, compressing: bool) -> int:
    """How many of the `held` + `segment` states leave a memory of `mem_len`: the overflow, rounded
    down to whole groups of `rate` when they are compressed."""
    return fifo.evicted_count(held, segment, mem_len, group=rate if compressing else 1)


class CompressiveSegment:
    """The two memories over one segment (Algorithm 1): layer l attends [cm_l ; m_l ; h_l] with
    Transformer-XL's relative positions through both memories (mem ← concat(cmem, mem)); after the
    segment [m_l ; h_l] keeps its last n_m states (`eviction`), and the compression of what left
    joins cm_l, which keeps its last n_cm (`kept`).

    memory: what the previous segment kept; n: n_s; mem_len, cmem_len: n_m and n_cm (0: nothing is
    compressed, Transformer-XL's memory); same_length: every query sees at most n_m + n_cm memory
    keys; cache_kv: carry both memories' keys and values (evaluation, exact), each slot projected
    once, when it enters its memory; rate: c; need_usage: read the attention each state to be evicted
    receives (most-used compression); need_compressed_mass: read the attention on the compressed
    memory (`compressed_mass`).
    """

    def __init__(
        self,
        memory: CompressiveMemory,
        n: int,
        mem_len: int,
        cmem_len: int,
        same_length: bool,
        cache_kv: bool,
        rate: int,
        need_usage: bool = False,
        need_compressed_mass: bool = False,
    ):
        B, P_m = memory.valid.shape
        self.memory, self.n, self.cmem_len, self.cache_kv = memory, n, cmem_len, cache_kv
        self.n_cm = memory.compressed_valid.shape[1]
        self.n_layers, self.slots = len(memory.hidden), self.n_cm + P_m
        self.need_usage, self.need_compressed_mass = need_usage, need_compressed_mass
        self.needs_weights = need_usage or need_compressed_mass
        self.same_length = mem_len + cmem_len if same_length else None
        # The states evicted from the memory after the segment, whole groups of c when compressing.
        self.fifo = fifo.FifoStep(evicted_count(P_m, n, mem_len, rate, cmem_len > 0))
        self.cached = cache_kv and memory.kv is not None and memory.compressed_kv is not None
        ones = memory.valid.new_ones(B, n)
        self.key_valid = torch.cat([memory.compressed_valid, memory.valid, ones], dim=1)[:, None, :]
        self.inputs: list[Tensor] = []  # per layer its input h_l (B, n, d)
        self.kv: list[Tensor] = []  # per layer, with the cache, keys and values (2, B, H, P_cm + P_m + n, Dh)
        self.usage: list[Tensor] = []  # per layer (B, e): attention on each state to be evicted
        self.compressed_mass: list[Tensor] = []  # per layer (): attention on the compressed memory

    def window(self, layer: int, attn: RelMultiHeadAttention, h: Tensor) -> KeyWindow:
        """[cm ; m ; segment] of layer `layer`: keys and values as cached, else projected."""
        self.inputs.append(h)
        m = self.memory
        if self.cached:
            new = attn.project_kv(h)
            kv = torch.cat([m.compressed_kv[layer].to(new.dtype), m.kv[layer].to(new.dtype), new], dim=3)
        else:
            states = torch.cat([m.compressed[layer].to(h.dtype), m.hidden[layer].to(h.dtype), h], dim=1)
            kv = attn.project_kv(states)
        if self.cache_kv:
            self.kv.append(kv)
        return KeyWindow(kv[0], kv[1], self.key_valid, self.same_length)

    def attended(self, layer: int, out: AttentionOutput) -> None:
        """Read from the attention weights (B, H, n, W), layer by layer: [cm (n_cm) ; m ; segment]."""
        if self.need_usage:  # what each state to be evicted received, averaged over heads and queries
            evicted = slice(self.n_cm, self.n_cm + self.fifo.evicted)
            self.usage.append(out.probs[..., evicted].mean(dim=(1, 2)).detach())
        if self.need_compressed_mass:
            self.compressed_mass.append(out.probs[..., : self.n_cm].sum(-1).mean().detach())

    def eviction(self, carry_gradient: bool = False) -> Eviction:
        """Each layer's memory with its segment input appended, and the states evicted from its old end.

        carry_gradient: keep the memory's graph (truncated backpropagation through the segments of a
        training batch, the module's `tbptt_segments`; not in the paper, as Transformer-XL's). What
        leaves the memory is detached either way: f_c learns from its reconstruction loss alone and the
        compressed memory stays a stop-gradient (§3.2)."""
        if not carry_gradient:
            return self._detached_eviction()
        valid, states = self._appended(keep_graph=True)
        evicted = [s.evicted.detach() for s in states]
        return Eviction([s.kept for s in states], valid.kept, evicted, valid.evicted)

    @torch.no_grad()
    def _detached_eviction(self) -> Eviction:
        valid, states = self._appended(keep_graph=False)
        return Eviction([s.kept for s in states], valid.kept, [s.evicted for s in states], valid.evicted)

    def _appended(self, keep_graph: bool) -> tuple[fifo.FifoUpdate, list[fifo.FifoUpdate]]:
        """[valid, ones] and per layer [memory, segment input] (detached unless `keep_graph`), each
        split at the eviction."""
        valid = self.fifo.append(
            self.memory.valid, self.memory.valid.new_ones(self.memory.valid.shape[0], self.n)
        )
        states = [
            self.fifo.append(m.to(h.dtype), h if keep_graph else h.detach())
            for m, h in zip(self.memory.hidden, self.inputs)
        ]
        return valid, states

    @torch.no_grad()
    def kept(
        self,
        eviction: Eviction,
        new: list[Tensor] | None,
        new_valid: Tensor | None,
        new_kv: list[Tensor] | None,
    ) -> CompressiveMemory:
        """The memories after the segment: `eviction`'s memory, and each layer's compressed memory with
        `new` (B, k, d) appended (f_c's compression of the evicted states, valid `new_valid` (B, k);
        None: nothing compressed) and its last n_cm slots kept; with the cache, the memory's keys and
        values cut as its states, the compressed memory's with `new_kv` (each layer's projection of
        `new`) appended. Appended even when nothing is new, so a smaller n_cm than the held slots
        applies at once."""
        m = self.memory
        if new is None:
            new, new_valid = [cm[:, :0] for cm in m.compressed], m.compressed_valid[:, :0]
        step = fifo.fifo_step(self.n_cm, new_valid.shape[1], self.cmem_len)  # the compressed memory's
        compressed_valid = step.append(m.compressed_valid, new_valid).kept
        compressed = [step.append(cm.to(x.dtype), x.detach()).kept for cm, x in zip(m.compressed, new)]
        kv = compressed_kv = None
        if self.cache_kv:
            kv = [self.fifo.split(t[:, :, :, self.n_cm :], dim=3).kept.clone() for t in self.kv]
            held = [t[:, :, :, : self.n_cm] for t in self.kv]
            added = new_kv or [t[:, :, :, :0] for t in held]
            compressed_kv = [step.append(t, a.to(t.dtype), dim=3).kept for t, a in zip(held, added)]
        return CompressiveMemory(
            eviction.hidden, eviction.valid, compressed, compressed_valid, kv, compressed_kv
        )
