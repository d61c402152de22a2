"""Per-token NLL under a full softmax, its statistics in float32 at least.

Under autocast the logits arrive in bf16 or fp16, whose short mantissas lose the log-sum-exp's small
terms; every method's loss upcasts before the softmax, as Hugging Face's and fairseq's losses do.
float64 stays float64 (numerical gradient checks run in it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def at_least_float32(x: Tensor) -> Tensor:
    """x in float32, or float64 if it is float64."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def full_softmax_nll(logits: Tensor, target: Tensor) -> Tensor:
    """NLL in nats of each target: logits (B, T, V), target (B, T) -> (B, T)."""
    return F.cross_entropy(at_least_float32(logits).transpose(1, 2), target, reduction="none")
