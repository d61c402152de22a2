"""`RowMemory`: what `LMBase` asks of a method's carried memory.

A memory is a NamedTuple of tensors (lists of tensors, None) with one row per row of the batch
stream; as a pytree the base detaches it whatever its fields. Every memory type is made and cleared
the same way: `empty(batch_size, ...)` makes the memory of fresh rows (no document read yet), and
`reset_rows(rows)` returns the memory with the rows where a new document starts made fresh again. A
convention that decides what a fresh row holds (e.g. attended zero states, or masked slots) is
stored in the memory by `empty`, so the base resets every memory alike, without knowing its method.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, Self

import torch
from torch import Tensor


class RowMemory(Protocol):
    """A method's memory of a batch of B rows (see the module docstring)."""

    @classmethod
    def empty(
        cls,
        batch_size: int,
        *,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
        **sizes: Any,
    ) -> Self:
        """The memory of `batch_size` fresh rows, its tensors on `device` in `dtype` (as torch's
        factories: None is the default); `sizes`: what each row holds, keywords the memory type names
        (layers, width, slots)."""
        ...

    def reset_rows(self, rows: Tensor) -> Self:
        """This memory with the rows where `rows` (B,) bool is True fresh again, as `empty` makes them
        (a new document starts there): what they held is no longer read. The other rows are
        unchanged. No host sync: the base calls it at every training step."""
        ...


class CarriedState(NamedTuple):
    """A `RowMemory` of one state per row, which a window-mode method (batches (B, K, T)) carries from
    a batch's last window into the next batch's first, where it applies its resets window by window.

    state: (B, ...), what each row's next batch reads; None: no row has one yet (fresh rows).
    fresh: (B,) bool, the rows made fresh by `reset_rows`: the next batch reads them as starting a
    document at its first window (`window_resets`); None: no such row.
    """

    state: Tensor | None
    fresh: Tensor | None = None

    @classmethod
    def empty(
        cls, batch_size: int, *, device: torch.device | None = None, dtype: torch.dtype | None = None
    ) -> Self:
        """The memory of fresh rows: no state."""
        return cls(None)

    def reset_rows(self, rows: Tensor) -> Self:
        """The rows where `rows` (B,) is True fresh again: marked `fresh`, so that the next batch
        does not read their state (one tensor holds every row's)."""
        if self.state is None:
            return self
        rows = rows.to(self.state.device)
        return self._replace(fresh=rows if self.fresh is None else self.fresh | rows)

    def window_resets(self, reset: Tensor) -> Tensor:
        """A batch's resets (B, K) with the `fresh` rows also starting a document at the first window."""
        if self.fresh is None:
            return reset
        first = reset[:, :1] | self.fresh.to(reset.device)[:, None]  # (B, 1)
        return torch.cat([first, reset[:, 1:]], dim=1)
