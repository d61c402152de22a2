"""Memory slots appended in place: the storage behind Transformer-XL's evaluation key/value cache.

Every segment, a layer's memory becomes the last `mem_len` slots of [memory, segment] (`memory.py`).
Written as `torch.cat` then a slice, that copies the whole memory every segment, into freshly
allocated tensors: for TRAMS's pool of M slots (keys, values, scores, hidden states), twice the
attended memory m, those copies made TRAMS slower than Transformer-XL at m. Here the
memory's tensors are views of larger buffers (a `SlotStore`, allocated once per evaluation stream)
with room after the newest slot: [memory, segment] is formed by writing the segment's n slots after
the memory's, in place, and viewing the P + n slots. When the room runs out, the memory's P slots are
copied to the front of the same buffers (a "compaction"), about once every (P + n) / n segments, so
no memory-sized copy is made per segment and no buffer is allocated after the first.

Only without autograd (evaluation under `torch.no_grad` or `inference_mode`): with gradients on,
the cache joins with `cat_slots` as before, so no buffer carries a graph from segment to segment.

In place means a memory's tensors are overwritten by later segments, as a static key/value cache's:
a forward may continue only the newest memory of its store in place; continuing an older one (a
second forward from the same memory) copies it into a new store, which is exact as long as its slots
have not been overwritten yet (`SlotCursor.intact`), and an error otherwise. Only the evaluation
cache uses this (`TransformerXL.forward` with `cache_kv`); training keeps `torch.cat`, whose result
the gradient flows through.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass(frozen=True)
class SlotLayout:
    """The fields a memory type keeps in slots, and each one's slot dim (the memory type declares it,
    e.g. `XLMemory.SLOTS`); `cat` joins a field's [old, new] as a new tensor, what
    `SlotAppender.extend` forms in place."""

    dims: Mapping[str, int]

    def cat(self, name: str, old: Tensor, new: Tensor) -> Tensor:
        """[old, new] along the field's slot dim, a new tensor."""
        return torch.cat([old.to(new.dtype), new], dim=self.dims[name])


@dataclass(eq=False)
class SlotStore:
    """Buffers of one stream of memories, per (field, layer), all `capacity` slots long.

    end: where the newest memory's slots end; generation: compactions so far (each rewrote slots
    [0, the compacted memory's P + n) of every buffer)."""

    capacity: int
    end: int
    generation: int = 0
    buffers: dict[tuple[str, int], Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class SlotCursor:
    """Where one memory's P slots lie in its store: [end − P, end), as of compaction `generation`."""

    store: SlotStore
    end: int
    generation: int

    def newest(self) -> bool:
        return self.store.end == self.end and self.store.generation == self.generation

    def intact(self, P: int) -> bool:
        """Whether the memory's slots still hold what they held when it was made: no compaction
        since, or one that wrote only below them."""
        store = self.store
        return store.generation == self.generation or (
            store.generation == self.generation + 1 and store.end <= self.end - P
        )


class SlotAppender:
    """Forms [memory, segment] of each cached tensor of one memory for one forward of n new slots.

    layout: the memory type's fields and their slot dims; cursor: where the memory's slots lie (None:
    the memory has no store yet); P: the memory's slots; keep: slots the next memory keeps (mem_len,
    or the TRAMS pool M).
    """

    def __init__(self, layout: SlotLayout, cursor: SlotCursor | None, P: int, n: int, keep: int) -> None:
        self.layout = layout
        self.P, self.n = P, n
        self.source = None  # where the memory's slots are copied from when compacting in place
        newest = cursor is not None and cursor.newest()
        if newest and cursor.end + n <= cursor.store.capacity:
            self.store, self.base = cursor.store, cursor.end  # append after the memory, in place
        elif newest and cursor.end - P >= P + n:
            self.store, self.base, self.source = cursor.store, P, cursor.end - P  # compact in place
            self.store.generation += 1
        else:
            if cursor is not None and not cursor.intact(P):
                raise ValueError(
                    "this Transformer-XL memory's key/value cache was overwritten by later segments "
                    "(its tensors are views of buffers that later segments write in place): continue "
                    "an evaluation from its newest memory, or pass cache_kv=False"
                )
            # A new store, with room for about as many slots again as [memory, segment].
            self.store, self.base = SlotStore(capacity=2 * (max(P, keep) + n), end=P), P

    def cursor(self) -> SlotCursor:
        """Where the new memory's slots end; marks it the store's newest (call once every field of
        the new memory is extended)."""
        self.store.end = self.base + self.n
        return SlotCursor(self.store, self.store.end, self.store.generation)

    # Not traced by torch.compile: it reads buffer addresses and keys buffers by (field, layer), so dynamo
    # compiled it again for each and hit its recompile limit (8) (benchmarks/compile.py on an H100).
    @torch.compiler.disable
    def extend(self, name: str, old: Tensor, new: Tensor, layer: int = 0) -> Tensor:
        """[old, new] along the field's slot dim (P + n slots), a view of the store's buffer.

        old: the memory's P slots of field `name` (e.g. kv (2, B, H, P, Dh)); new: the segment's n.
        """
        dim = self.layout.dims[name]
        dtype = old.dtype if old.dtype == new.dtype else torch.promote_types(old.dtype, new.dtype)
        buf = self.store.buffers.get((name, layer))
        start = self.base - self.P  # where [old, new] starts in the buffer
        if buf is not None and buf.dtype == dtype and self._holds(buf, old, dim):
            if self.source is not None:  # compaction: no overlap, as source >= P + n
                buf.narrow(dim, start, self.P).copy_(buf.narrow(dim, self.source, self.P))
        else:  # the memory's slots are not (or no longer) this buffer's: a fresh buffer
            shape = list(new.shape)
            shape[dim] = self.store.capacity
            buf = new.new_empty(shape, dtype=dtype)
            buf.narrow(dim, start, self.P).copy_(old)
            self.store.buffers[(name, layer)] = buf
        buf.narrow(dim, self.base, self.n).copy_(new)
        return buf.narrow(dim, start, self.P + self.n)

    def _holds(self, buf: Tensor, old: Tensor, dim: int) -> bool:
        """Whether old is the buffer's view of the memory's slots (so they need not be written)."""
        first = self.source if self.source is not None else self.base - self.P
        first_ptr = buf.data_ptr() + first * buf.stride(dim) * buf.element_size()
        return (
            buf.device == old.device
            and old.shape[dim] == self.P
            and old.shape[:dim] == buf.shape[:dim]
            and old.shape[dim + 1 :] == buf.shape[dim + 1 :]
            and old.stride() == buf.stride()
            and (self.P == 0 or old.data_ptr() == first_ptr)
        )
