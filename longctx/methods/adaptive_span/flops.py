"""Forward cost per predicted token of the sequential transformer (Sukhbaatar et al. 2019, Tables 1-2).

The paper's "#FLOPS" column counts the cost of one step prediction in multiply-accumulates (MACs): a
model whose cost is dominated by its weight matrices has about as many FLOPS as parameters (the small
model: 38M parameters, 42M FLOPS). `macs_per_token` is that count; `flops_per_token` is the project's
convention (`longctx.core.flops`: FLOPs = 2 × MACs), what the module logs as `{val,test}/flops_per_token`.
Per token and per layer:

    projections  4·d²                (Q, K, V, O; bias-free)
    feed-forward 2·d·d_inner
    attention    3·Dh·Σ_h span_h     (content q·k, position q·p and the weighted sum of values: Dh
                                      multiply-adds per attended position, for each head h over its
                                      own span; = 3·d·mean head span)

plus the output projection d·V. Per head, the span is the number of previous positions with a
non-zero mask: z + R (at most S) for a learned span, S for a fixed span. With `attended="trimmed"` it
is what the per-layer trimming computes: the layer's largest span plus R rounded up to a multiple of
64 (`attended_length`), shared by all heads of the layer.

`block` (the block length M) adds what the released code and longctx also compute: every block
projects the keys and values of the L cached states again (2·d²·L/M per token, L the layer's
trimmed attended length). The paper's count leaves it out (`block=None`).

`trim="head"` counts what `span_trim="head"` computes: each head over its own trimmed length L_h (its
span + R rounded up to 64, `attended="trimmed"`), and each head re-projects only its L_h cached
states (2·d·Dh·Σ_h L_h / M per token with `block`).

`network_flops_per_token` takes the network's Config and reads the ramp, the cap and the trimming
from it (what the module logs and the benchmark counts); `macs_per_token` is the count from sizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from longctx.core.flops import flops_from_macs
from longctx.methods.adaptive_span.mask import attended_length

if TYPE_CHECKING:
    from longctx.methods.adaptive_span.network import SpanTransformerConfig

Spans = float | Sequence[float] | Sequence[Sequence[float]]


def macs_per_token(
    d_model: int,
    n_layers: int,
    d_inner: int,
    vocab_size: int,
    spans: Spans,
    span_ramp: int = 0,
    attn_span: int | None = None,
    attended: Literal["mask", "trimmed"] = "mask",
    block: int | None = None,
    trim: Literal["layer", "head"] = "layer",
) -> float:
    """Multiply-accumulates to predict one token (forward pass), the paper's #FLOPS.

    Args:
        d_model, n_layers, d_inner, vocab_size: model sizes.
        spans: one span for every head of every layer (a number), one per layer, or one list of head
            spans per layer (the learned z, or S for a fixed span).
        span_ramp: R; `attended="mask"` adds it to each span (positions where the mask is non-zero),
            capped at `attn_span`.
        attn_span: S, the cap of every span (required for `attended="trimmed"`).
        attended: "mask" counts each head's positions with a non-zero mask; "trimmed" counts what the
            per-layer trimming computes (largest span of the layer + R, rounded up to 64, all heads).
        block: the block length M, to count the re-projection of the cached keys and values every
            block; None: the paper's count, without it.
        trim: "layer" (the released code: every head of a layer over the layer's trimmed length) or
            "head" (each head over its own): what `attended="trimmed"` and `block` count.
    """
    per_layer = _per_layer_spans(spans, n_layers)
    if attended == "trimmed" and attn_span is None:
        raise ValueError("attended='trimmed' needs attn_span (S)")
    total = 0.0
    if trim == "head" and attn_span is None:
        raise ValueError("trim='head' needs attn_span (S)")
    for heads in per_layer:
        trimmed = [attended_length(max(heads), attn_span, span_ramp)] * len(heads) if attn_span else []
        if trim == "head":
            trimmed = [attended_length(h, attn_span, span_ramp) for h in heads]
        if attended == "trimmed":
            head_spans = trimmed
        else:
            head_spans = [h + span_ramp for h in heads]
            if attn_span is not None:
                head_spans = [min(s, attn_span) for s in head_spans]
        # Σ_h Dh·span_h with Dh = d / H: d times the mean head span.
        total += 4 * d_model**2 + 2 * d_model * d_inner + 3 * d_model * sum(head_spans) / len(head_spans)
        if block is not None:  # the cached states are projected again: L = the trimmed length
            L = sum(trimmed) / len(trimmed) if trimmed else max(head_spans)  # mean over heads
            total += 2 * d_model**2 * L / block
    return total + d_model * vocab_size


def flops_per_token(*args, **kwargs) -> float:
    """`macs_per_token` in the project's convention: FLOPs = 2 × MACs (same arguments)."""
    return flops_from_macs(macs_per_token(*args, **kwargs))


def network_flops_per_token(
    config: SpanTransformerConfig,
    vocab_size: int,
    spans: Spans,
    block: int | None = None,
    attended: Literal["mask", "trimmed"] = "mask",
) -> float:
    """FLOPs per token of the network `config` builds (`SpanTransformer.Config`), with `spans` (per
    layer, per head: the learned z, or S for a fixed span): each head over z + R positions (a fixed
    span: S, no ramp), trimmed as the network trims (`span_trim` for adaptive spans, per layer for
    the dynamic span), the cached states re-projected every `block` tokens (`flops_per_token`)."""
    c = config
    ramp = 0 if c.span_kind == "fixed" else c.span_ramp
    trim = c.span_trim if c.span_kind == "adaptive" else "layer"
    return flops_per_token(
        c.d_model, c.n_layers, c.d_inner, vocab_size, spans,
        span_ramp=ramp, attn_span=c.attn_span, attended=attended, block=block, trim=trim,
    )  # fmt: skip


def parameter_count(
    d_model: int, n_layers: int, d_inner: int, vocab_size: int, attn_span: int, n_heads: int
) -> int:
    """Parameters of `SpanTransformer` (adaptive span: + one z' per head)."""
    per_layer = 4 * d_model**2 + 2 * d_model * d_inner + d_inner + d_model + 4 * d_model + n_heads
    embeddings = 2 * vocab_size * d_model + vocab_size + (d_model // n_heads) * attn_span
    return n_layers * per_layer + embeddings


def _per_layer_spans(spans: Spans, n_layers: int) -> list[list[float]]:
    if isinstance(spans, (int, float)):
        return [[float(spans)] for _ in range(n_layers)]
    spans = list(spans)
    if len(spans) != n_layers:
        raise ValueError(f"got spans for {len(spans)} layers, the model has {n_layers}")
    return [[float(s)] if isinstance(s, (int, float)) else [float(h) for h in s] for s in spans]
