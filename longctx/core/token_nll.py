"""`TokenNLLCollector`: the per-target NLL of one evaluation, kept beside the summed metrics.

`LMBase._eval_step` hands it each batch's NLL and the mask it scored with (the method's override
when there is one, e.g. the TRAMS protocol's), so the collected values are exactly the terms of the
logged total NLL. Each target is named by `batch["offset"]`, its index in the split's token sequence
(evaluation streams carry it; see `SegmentStream`). The values stay on the device until `arrays()`;
`longctx.callbacks.token_nll.TokenNLLWriter` attaches a collector only when `--write_token_nll true`,
so an evaluation without the flag pays nothing.
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

    def add(self, nll: Tensor, mask: Tensor, batch: dict[str, Tensor]) -> None:
        """Keep the scored targets of one batch: `nll` and `mask` have the shape of `batch["target"]`."""
        if "offset" not in batch:
            raise ValueError(
                "--write_token_nll needs evaluation batches with an `offset` key (each target's index "
                "in the split), which LMDataModule's streams carry; this data module's batches do not"
            )
        scored = mask.bool()
        self._nll.append(nll.detach()[scored].float())
        self._offset.append(batch["offset"][scored])

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(nll float32, offset int64) on the host, in the order the batches came."""
        if not self._nll:
            return np.zeros(0, np.float32), np.zeros(0, np.int64)
        nll = torch.cat(self._nll).cpu().numpy().astype(np.float32, copy=False)
        offset = torch.cat(self._offset).cpu().numpy().astype(np.int64, copy=False)
        return nll, offset
