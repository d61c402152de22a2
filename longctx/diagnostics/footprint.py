"""What one evaluation step allocates at a context length, estimated before anything is allocated.

`python -m longctx context` evaluates at the lengths a user gives; a length whose tensors cannot
fit (`--lengths 100000000`: an 819 GB memory buffer for a tiny Transformer-XL) would fail deep in an
allocation, after every model was built and loaded, with a traceback. `evaluation_bytes` adds up the
tensors of one evaluation step that grow with the context, from the model's current settings (an
axis sets its length in place first) and the data module's evaluation batch; each method counts its
own (`LMBase.evaluation_elements`, with the shared terms below):

- Transformer-XL and the Compressive Transformer (M memory slots, n_m + n_cm for the latter; L the
  segment; B rows; H heads of Dh): each layer's carried states and cached keys and values, in
  buffers with room for twice [memory, segment] (`transformer_xl/slot_store.py`):
  n_layers · B · 2(M + L) · (d + 2·H·Dh); the attention scores of a layer (content, position and
  probabilities): 3 · B · H · L · (M + L); the relative positions: (M + L) · H · Dh;
- adaptive span (S the largest span, c the query chunk): each layer's cache and the block's keys and
  values, n_layers · B · (S + L) · 3d; a chunk's scores, 3 · B · H · c · (S + c);
- the window transformer and GPT-2 (a window of L): the scores, 3 · B · H · L²; keys and values,
  n_layers · B · L · 2d;
- every method: the logits and their log-softmax, 2 · B · L · V (V: the adaptive softmax's head), and
  a feed-forward activation, B · L · max(d_inner, 4d).

In elements of the model's floating dtype. The sum is an estimate (a kernel's workspace, the
allocator's rounding and activations freed in between are not counted): good to the order of
magnitude, which is what tells a length that fits from one that never will.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from longctx.core.base import LMBase
from longctx.data.datamodule import LMDataModule


def evaluation_bytes(model: LMBase, data: LMDataModule) -> int:
    """The bytes of the tensors one evaluation step of `model` on `data`'s evaluation batches holds
    at its current settings: the logits and their log-softmax, and what the method's own
    `evaluation_elements` counts (see the module docstring)."""
    B, L = data.eval_batch_size, data.eval_tgt_len
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    elements = B * L * vocabulary_head(model) * 2 + model.evaluation_elements(B, L)
    return elements * dtype.itemsize


def vocabulary_head(model: LMBase) -> int:
    """The logits one position gets: the vocabulary, or the adaptive softmax's head (its first cutoff
    and one column per tail cluster)."""
    cutoffs = getattr(getattr(getattr(model, "net", None), "config", None), "cutoffs", ())
    return cutoffs[0] + len(cutoffs) if cutoffs else model.vocab_size


def feed_forward_elements(B: int, L: int, d: int, d_inner: int | None) -> int:
    """One feed-forward activation of B x L positions (the wider of d_inner and 4d)."""
    return B * L * max(d_inner or 0, 4 * d)


def segment_memory_elements(B: int, L: int, M: int, n_layers: int, d: int, H: int, Dh: int) -> int:
    """Transformer-XL-style memories of M slots before a segment of L: each layer's carried states
    and cached keys and values in buffers with room for twice [memory, segment], a layer's scores
    (content, position, probabilities) and the relative positions."""
    return n_layers * B * 2 * (M + L) * (d + 2 * H * Dh) + 3 * B * H * L * (M + L) + (M + L) * H * Dh


def window_elements(B: int, L: int, n_layers: int, d: int, H: int) -> int:
    """A window of L read alone: a layer's scores and every layer's keys and values."""
    return 3 * B * H * L * L + n_layers * B * L * 2 * d


def available_bytes(device: torch.device) -> int | None:
    """The memory a new allocation can take on `device`: a GPU's free memory, else the machine's
    available memory within this process's cgroup limit (None when it cannot be read)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    candidates = [_meminfo_available(), _cgroup_room()]
    known = [value for value in candidates if value is not None]
    return min(known) if known else None


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


# A container's memory limit and use as its cgroup mount shows them (cgroup v2, then v1).
CGROUP_FILES = (
    ("memory.max", "memory.current"),
    ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"),
)
NO_LIMIT = 2**60  # v1 writes "no limit" as a number near 2**63


def _cgroup_room() -> int | None:
    """The memory left under the container's cgroup limit, or None (no limit, or none readable)."""
    root = Path("/sys/fs/cgroup")
    for limit_file, usage_file in CGROUP_FILES:
        try:
            limit = (root / limit_file).read_text().strip()
            used = int((root / usage_file).read_text())
        except (OSError, ValueError):
            continue
        if limit != "max" and int(limit) < NO_LIMIT:
            return int(limit) - used
        return None
    return None
