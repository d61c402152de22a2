"""Forward FLOPs per token of `WindowTransformer`, in `longctx.core.flops`'s convention (2 × MACs).

Multiply-accumulates per token and per layer, counting every matrix product:

    Q, K, V, O projections   4·d²
    feed-forward             2·d·d_inner
    attention                2·d·(L + 1)/2   (q·k and the weighted sum of values over the keys a
                                             causal query attends: t + 1 at position t, (L + 1)/2
                                             on average over a window of L)

plus the output layer d·V. Embedding look-ups, biases, LayerNorm, softmax and GELU are not counted.
Every token of a window is scored, so this is also the cost per scored token.
"""

from __future__ import annotations

from longctx.core.flops import flops_from_macs


def flops_per_token(d_model: int, n_layers: int, d_inner: int, vocab_size: int, window: int) -> float:
    """Forward FLOPs to predict one token of a window of `window` tokens."""
    attended = (window + 1) / 2  # mean keys per causal query
    per_layer = 4 * d_model**2 + 2 * d_model * d_inner + 2 * d_model * attended
    return flops_from_macs(n_layers * per_layer + d_model * vocab_size)
