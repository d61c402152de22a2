"""The `attention` knob shared by the methods: "eager" computes attention op by op, as the authors'
codes (score matrix, masks, softmax, probability matrix), "sdpa" in one fused kernel,
`torch.nn.functional.scaled_dot_product_attention`, with the method's position term and masks as its
additive float mask. Each method's fused path equals its eager one to float rounding
(tests/test_fused_attention.py), has a backward on every device, and applies attention dropout to the
normalised probabilities inside the kernel (the authors' distribution, another random stream)."""

from __future__ import annotations

from typing import Literal

AttentionKernel = Literal["eager", "sdpa"]
ATTENTION_KERNELS = ("eager", "sdpa")


def check_attention_kernel(attention: str) -> None:
    """One line naming a bad `attention` value and the choices."""
    if attention not in ATTENTION_KERNELS:
        raise ValueError(f"attention must be 'eager' or 'sdpa' (fused, the default), got {attention!r}")
