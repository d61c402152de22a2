"""Random-number-generator state, saved in checkpoints so a resumed run draws the same dropout masks
as the run it continues.

Lightning checkpoints do not carry RNG state, and `seed_everything` at start-up would replay the
first steps' masks after a resume. Under DDP every rank is seeded alike (`seed_everything` in each
process) and draws alike (same network, same batch shapes), so the state rank 0 writes is every
rank's, and every rank restores it: no collective is needed at save time (which also runs inside
SLURM's SIGUSR1 handler). Nothing else draws from the global generators between two training steps
here (the streams are deterministic and are not wrapped in a `DataLoader`, whose iterators would
draw a seed), so restoring at load time is exact.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

RngState = dict[str, Any]


def collect() -> RngState:
    """This process's generators: torch CPU, the current CUDA device (if in use), numpy, python."""
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    # Tensors and plain Python values only, so `torch.load(weights_only=True)` accepts the checkpoint.
    numpy_state = (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss)
    return {"torch": torch.get_rng_state(), "cuda": cuda, "numpy": numpy_state, "python": random.getstate()}


def restore(state: RngState) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate(state["python"])
