"""The `attention` knob shared by the methods: "eager" computes attention op by op, as the authors'
codes (score matrix, masks, softmax, probability matrix), "sdpa" in one fused kernel,
`torch.nn.functional.scaled_dot_product_attention`, with the method's position term and masks as its
additive float mask. Each method's fused path equals its eager one to float rounding
(tests/methods/test_fused_attention.py), has a backward on every device, and applies attention dropout to the
normalised probabilities inside the kernel (the authors' distribution, another random stream).

"flex" (Transformer-XL, RPE, TRAMS, the Compressive Transformer's layers, adaptive span with a
fixed or adaptive span) computes evaluation with `torch.nn.attention.flex_attention` compiled by
inductor (a C++ compiler at run time), the position term and masks as its `score_mod`. Its CPU
kernel has no backward (PyTorch raises NotImplementedError) and it has no attention dropout, so a
step that records a gradient (training) runs "sdpa" instead, said once in the log (`flex_or_sdpa`):
the numbers are the same to float rounding, only the kernel differs. Each shape of (queries, keys)
is compiled once, so evaluation compiles while the memory fills and then runs the same kernels for
every segment. Not the default: on this CPU it is not faster than "sdpa" (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Literal, TypeVar, get_args

import torch

AttentionKernel = Literal["eager", "sdpa", "flex"]
ATTENTION_KERNELS: tuple[str, ...] = get_args(AttentionKernel)
# One compiled graph per shape: the memory filling (mem_len / n + 1 shapes), short last segments,
# TRAMS windows; above Dynamo's default of 8 the kernel would silently run uncompiled.
FLEX_RECOMPILE_LIMIT = 64
# Inductor's CUDA flex kernel refuses smaller query/key/value embeddings ("NYI: embedding dimension ... must
# be at least 16", torch 2.11 on an H100); its CPU kernel takes any.
FLEX_CUDA_MIN_HEAD_DIM = 16

log = logging.getLogger(__name__)
Fn = TypeVar("Fn", bound=Callable[..., torch.Tensor])


def at_least_float32(t: torch.Tensor) -> torch.Tensor:
    """t in float32 at least (bf16 and fp16 under autocast are raised), float64 kept: the dtype the
    authors' codes compute softmax statistics (and TRAMS's QR factor) in."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """A projection's heads: (..., T, H·Dh) -> (..., H, T, Dh), head h the h-th block of Dh columns
    (a view of a contiguous `x`)."""
    return x.view(*x.shape[:-1], n_heads, -1).transpose(-3, -2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """The inverse of `split_heads`: (..., H, T, Dh) -> (..., T, H·Dh), the heads side by side."""
    return x.transpose(-3, -2).flatten(-2)


def check_attention_kernel(attention: str) -> None:
    """One line naming a bad `attention` value and the choices."""
    if attention not in ATTENTION_KERNELS:
        raise ValueError(
            "attention must be 'eager', 'sdpa' (fused, the default) or 'flex' (compiled, evaluation), "
            f"got {attention!r}"
        )


@functools.cache
def _say_flex_trains_with_sdpa() -> None:
    log.warning(
        "attention 'flex' computes evaluation only (flex_attention has no backward on CPU and no "
        "attention dropout): training steps run 'sdpa', equal to float rounding"
    )


def flex_or_sdpa(attention: AttentionKernel, records_gradient: bool) -> AttentionKernel:
    """The kernel a step runs: "flex" becomes "sdpa" when the step records a gradient (logged once)."""
    if attention == "flex" and records_gradient:
        _say_flex_trains_with_sdpa()
        return "sdpa"
    return attention


def compile_flex(fn: Fn) -> Fn:
    """`torch.compile` of a function that calls `flex_attention` (which runs fused only compiled):
    static shapes, one graph per shape (inductor's CPU flex kernel with a dynamic query length
    failed to compile in torch 2.13), up to FLEX_RECOMPILE_LIMIT shapes. The first argument is the
    query (B, H, M, Dh): on CUDA a head dimension below FLEX_CUDA_MIN_HEAD_DIM is refused in one line."""
    compiled = torch.compile(fn, dynamic=False, fullgraph=True)

    @functools.wraps(fn)
    def call(q: torch.Tensor, *args: object) -> torch.Tensor:
        if q.is_cuda and q.shape[-1] < FLEX_CUDA_MIN_HEAD_DIM:
            raise ValueError(
                f"attention 'flex' needs a head dimension of at least {FLEX_CUDA_MIN_HEAD_DIM} on CUDA "
                f"(this model's is {q.shape[-1]}): use attention 'sdpa', or fewer, wider heads"
            )
        with torch._dynamo.config.patch(recompile_limit=FLEX_RECOMPILE_LIMIT):
            return compiled(q, *args)

    return call  # type: ignore[return-value]
