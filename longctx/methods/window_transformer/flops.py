"""Forward FLOPs per token of `WindowTransformer` (FLOPs = 2 × multiply-accumulates).

Per token and per layer, counting every matrix product:

    Q, K, V, O projections   2·4·d²
    feed-forward             2·2·d·d_inner
    attention                2·2·d·(L + 1)/2   (q·k and the weighted sum of values over the keys a
                                               causal query attends: t + 1 at position t, (L + 1)/2
                                               on average over a window of L)

plus the output layer 2·d·V. Embedding look-ups, biases, LayerNorm, softmax and GELU are not
counted. Every token of a window is scored, so this is also the cost per scored token.
"""

from __future__ import annotations


def flops_per_token(d_model: int, n_layers: int, d_inner: int, vocab_size: int, window: int) -> float:
    """Forward FLOPs to predict one token of a window of `window` tokens (2 × multiply-accumulates)."""
    attended = (window + 1) / 2  # mean keys per causal query
    per_layer = 4 * d_model**2 + 2 * d_model * d_inner + 2 * d_model * attended
    return 2 * (n_layers * per_layer + d_model * vocab_size)
