"""FLOPs per predicted token of the sequential transformer (Sukhbaatar et al. 2019, Tables 1-2).

The paper's "#FLOPS" column counts the cost of one step prediction in multiply-accumulates: a model
whose cost is dominated by its weight matrices has about as many FLOPS as parameters (the small
model: 38M parameters, 42M FLOPS). We count, per token and per layer,

    projections  4·d²           (Q, K, V, O; bias-free)
    feed-forward 2·d·d_inner
    attention    3·d·span       (content q·k, position q·p and the weighted sum of values, each
                                 head_dim multiply-adds per attended position and head; summed over
                                 heads this is 3·d·mean head span)

plus the output projection d·V. The span of a layer is the number of previous positions it attends:
S for a fixed span, the learned span z (+ ramp R where the mask is non-zero) for an adaptive span. With
`attended="trimmed"` the span is what the implementation really computes: the layer's largest span
plus the ramp rounded up to a multiple of 64 (`attended_length`), shared by all heads of the layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from longctx.methods.adaptive_span.mask import attended_length


def flops_per_token(
    d_model: int,
    n_layers: int,
    d_inner: int,
    vocab_size: int,
    spans: float | Sequence[float] | Sequence[Sequence[float]],
    span_ramp: int = 0,
    attn_span: int | None = None,
    attended: Literal["mask", "trimmed"] = "mask",
) -> float:
    """Multiply-accumulates to predict one token (forward pass), the paper's #FLOPS.

    Args:
        d_model, n_layers, d_inner, vocab_size: model sizes.
        spans: one span for every head of every layer (a number), one per layer, or one list of head
            spans per layer.
        span_ramp: R; `attended="mask"` adds it to each span (positions where the mask is non-zero),
            capped at `attn_span`.
        attn_span: S, the cap of every span (required for `attended="trimmed"`).
        attended: "mask" counts the positions with a non-zero mask per head; "trimmed" counts what the
            implementation computes (largest span of the layer + R, rounded up to 64, for all heads).
    """
    per_layer = _per_layer_spans(spans, n_layers)
    if attended == "trimmed" and attn_span is None:
        raise ValueError("attended='trimmed' needs attn_span (S)")
    total = 0.0
    for heads in per_layer:
        if attended == "trimmed":
            span = attended_length(max(heads), attn_span, span_ramp)
        else:
            spans_with_ramp = [h + span_ramp for h in heads]
            if attn_span is not None:
                spans_with_ramp = [min(s, attn_span) for s in spans_with_ramp]
            span = sum(spans_with_ramp) / len(spans_with_ramp)
        total += 4 * d_model**2 + 2 * d_model * d_inner + 3 * d_model * span
    return total + d_model * vocab_size


def parameter_count(
    d_model: int, n_layers: int, d_inner: int, vocab_size: int, attn_span: int, n_heads: int
) -> int:
    """Parameters of `SpanTransformer` (adaptive span: + one z' per head)."""
    per_layer = 4 * d_model**2 + 2 * d_model * d_inner + d_inner + d_model + 4 * d_model + n_heads
    embeddings = 2 * vocab_size * d_model + vocab_size + (d_model // n_heads) * attn_span
    return n_layers * per_layer + embeddings


def _per_layer_spans(
    spans: float | Sequence[float] | Sequence[Sequence[float]], n_layers: int
) -> list[list[float]]:
    if isinstance(spans, (int, float)):
        return [[float(spans)] for _ in range(n_layers)]
    spans = list(spans)
    if len(spans) != n_layers:
        raise ValueError(f"got spans for {len(spans)} layers, the model has {n_layers}")
    return [[float(s)] if isinstance(s, (int, float)) else [float(h) for h in s] for s in spans]
