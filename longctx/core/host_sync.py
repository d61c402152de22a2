"""The host syncs the networks need, listed in one place.

A host sync (`.item()`, `float(t)`, `bool(t)`, `.tolist()` on a device tensor) makes the CPU wait for
the accelerator to finish everything queued so far, so it stalls the pipeline of kernel launches.
The networks read device values on the host only where a value becomes a tensor *shape*; each of
those reads goes through `host_values`, and `tests/methods/test_meta_device.py` runs every network on the
`meta` device (no values at all), where any other sync raises.

The syncs, per forward:

1. Adaptive span, trimming per layer (`AdaptiveMask.attended_length`): the layer's largest z, which
   sets how many previous positions the layer attends, L (the released code's `get_trim_len` reads
   it the same way). One (H,) read per layer.
2. Adaptive span, trimming per head (`AdaptiveMask.head_attended_lengths`, `span_trim="head"`): every
   head's z, which sets the head groups and their lengths L_h. The same (H,) read per layer.
3. Dynamic span (`DynamicSpan.attended_length`): the block's largest z_t, which sets L.
4. Not ours: Hugging Face's GPT-2 checks on every forward without an attention mask whether its
   position ids are packed (`transformers.masking_utils.find_packed_sequence_indices`, an `.all()`).

On `meta` tensors `host_values` returns None and the callers use the largest value the shape can
take (S: no trimming), which is exact, since trimming skips only positions whose mask is 0.
Outside the forward, the training step itself holds no sync: the metrics stay tensors until Lightning
logs them.
"""

from __future__ import annotations

from torch import Tensor


def host_values(t: Tensor) -> list | None:
    """`t.tolist()` (the host sync), or None on the meta device, where no values exist."""
    if t.device.type == "meta":
        return None
    return t.detach().tolist()
