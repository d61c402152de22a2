"""What a method's `evaluation_memory_start` claims, checked on its own loss.

token_nll.npz `memory_start` (`LMBase.evaluation_memory_start`) says, for each target, the first token
of the segment from which the evaluation last restarted the memory; `report`'s recall by segments back
counts an answer bound before it as forgotten by design. The claim is checked where it is made: the
target's loss depends on no input token before that start, and does depend on the windows between it
and the target's own window (the memory carries them).
"""

from __future__ import annotations

import numpy as np
import torch

from longctx.core.base import LMBase


def window_memory_starts(model: LMBase, batch: dict[str, torch.Tensor]) -> list[int]:
    """The window where each window's memory began, by the model's `evaluation_memory_start` for a
    row that reads `batch`'s K windows of T tokens from token 0 (window w scores targets w·T + 1 ...
    (w + 1)·T); every target of a window must share it."""
    n_windows, T = batch["input"].shape[1:]
    offset = np.arange(1, n_windows * T + 1)
    start = model.evaluation_memory_start(np.zeros_like(offset), offset, T)
    begins = [int(start[w * T]) // T for w in range(n_windows)]
    for w, s in enumerate(begins):
        assert (start[w * T : (w + 1) * T] == s * T).all(), f"window {w}'s targets disagree on their start"
    return begins


def assert_losses_depend_on_windows_from_their_memory_start(
    model: LMBase, batch: dict[str, torch.Tensor], vocab_size: int
) -> list[int]:
    """For each window w whose memory began at window s: changing the input tokens of windows < s
    leaves w's loss exactly as it was, changing those of windows s ... w − 1 changes it. Returns the
    starts (`window_memory_starts`)."""
    begins = window_memory_starts(model, batch)

    def nll_with_changed(windows: slice) -> torch.Tensor:
        changed = dict(batch, input=batch["input"].clone())
        changed["input"][:, windows] = (changed["input"][:, windows] + 1) % vocab_size
        return model.step(changed, None).nll

    with torch.no_grad():
        unchanged = model.step(batch, None).nll
        for w, s in enumerate(begins):
            if s > 0:
                assert torch.equal(nll_with_changed(slice(0, s))[:, w], unchanged[:, w]), (w, s)
            if s < w:
                assert not torch.equal(nll_with_changed(slice(s, w))[:, w], unchanged[:, w]), (w, s)
    return begins
