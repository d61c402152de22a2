"""`TokenNLLCollector`: the per-target NLL of one evaluation, kept beside the summed metrics.

`LMBase._eval_step` hands it each batch's NLL and the mask it scored with (the method's override
when there is one, e.g. the TRAMS protocol's), so the collected values are exactly the terms of the
logged total NLL. Each target is named by `batch["offset"]`, its index in the split's token sequence
(evaluation streams carry it; see `SegmentStream`), and, when the method says it
(`StepOutput.correct`), whether the target was the argmax of the predicted distribution. The values
stay on the device until `arrays()`; `longctx.callbacks.token_nll.TokenNLLWriter` attaches a
collector only when `--write_token_nll true`, so an evaluation without the flag pays nothing.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


class TokenNLLCollector:
    """NLL (float32, nats) and offset (int64) of every scored target of one rank's evaluation."""

    def __init__(self) -> None:
        self._nll: list[Tensor] = []
        self._offset: list[Tensor] = []
        self._correct: list[Tensor] | None = []  # None once a batch came without correctness

    def add(self, nll: Tensor, mask: Tensor, batch: dict[str, Tensor], correct: Tensor | None = None) -> None:
        """Keep the scored targets of one batch: `nll`, `mask` and `correct` (target = argmax, or None:
        the method does not say) have the shape of `batch["target"]`."""
        if "offset" not in batch:
            raise ValueError(
                "--write_token_nll needs evaluation batches with an `offset` key (each target's index "
                "in the split), which LMDataModule's streams carry; this data module's batches do not"
            )
        scored = mask.bool()
        self._nll.append(nll.detach()[scored].float())
        self._offset.append(batch["offset"][scored])
        if correct is None:
            self._correct = None
        elif self._correct is not None:
            self._correct.append(correct[scored].bool())

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(nll float32, offset int64, correct bool or None when a batch had none) on the host, in
        the order the batches came."""
        if not self._nll:
            return np.zeros(0, np.float32), np.zeros(0, np.int64), None
        nll = torch.cat(self._nll).cpu().numpy().astype(np.float32, copy=False)
        offset = torch.cat(self._offset).cpu().numpy().astype(np.int64, copy=False)
        correct = None if self._correct is None else torch.cat(self._correct).cpu().numpy()
        return nll, offset, correct
