"""The memory the recurrence carries from one batch to the next (Yoshida et al. 2020, §3).

Within a batch, window i+1 of a row reads h_prev, the FFN of window i's pooled hidden states
(`network.py`); across batches the last window's h_prev is carried. Fresh rows have none: the empty
memory holds no h_prev, and a row whose document restarts inside a batch drops its h_prev window by
window (`WindowRecurrence.forward`).
"""

from __future__ import annotations

from torch import Tensor

from longctx.core.memory import CarriedState


class RecurrenceMemory(CarriedState):
    """state: h_prev (B, d), the state window i+1 of each row reads at layer ℓ_ins as one extra
    key/value, or None (fresh rows); fresh: the rows `reset_rows` made fresh (`CarriedState`)."""

    __slots__ = ()

    @property
    def h_prev(self) -> Tensor | None:
        """The paper's name of `state`."""
        return self.state
