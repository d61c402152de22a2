"""One FLOPs convention for every method: FLOPs = 2 × multiply-accumulates (MACs).

A multiply-add is two floating-point operations, as in Kaplan et al. (2020, §2.1: a transformer's
forward pass costs C_forward ≈ 2N + 2·n_layer·n_ctx·d_attn FLOPs per token), the convention of the
recurrence paper's FLOPs table (Yoshida et al. 2020). The Adaptive Span paper's "#FLOPS" column
(Sukhbaatar et al. 2019, Tables 1-2) counts multiply-accumulates instead, i.e. half of this count
(`longctx.methods.adaptive_span.flops.macs_per_token` gives its number).

Every method's module implements `flops_per_token(segment_length)` (`LMBase` hook): the forward FLOPs
per *scored* token at evaluation, logged as `val/flops_per_token` and `test/flops_per_token`. The
methods count the matrix products (weights, attention scores, attention-weighted sums, the output
layer); element-wise work (softmax, LayerNorm, activations, biases, masks) is left out, as in both
papers. Each method's `flops.py` says what it counts beyond that.
"""

from __future__ import annotations

FLOPS_PER_MAC = 2


def flops_from_macs(macs: float) -> float:
    """FLOPs of `macs` multiply-accumulates (2 each)."""
    return FLOPS_PER_MAC * macs
