"""Forward FLOPs per scored token of windowed evaluation (Yoshida et al. 2020, §4.2 and their table).

Kaplan et al. (2020, Table 1) count a transformer's forward pass as C ≈ 2N + 2·n_layer·n_ctx·d_attn
FLOPs per token, with N the non-embedding parameter count N ≈ 2·d_model·n_layer·(2·d_attn + d_ff)
(weights only: no biases, LayerNorms or embeddings). Windows of T tokens with overlap o score only
T − o new tokens per window after the first, so the cost per scored token is

    (2N + 2·n_layer·T·d) · T / (T − o).

With GPT-2 small (n_layer 12, d 768, d_ff 3072: N = 84,934,656) this gives 1.754e8 at T = 300, o = 0,
1.949e8 at o = 30 and 5.262e8 at o = 200, the paper's 1.75e8, 1.94e8 and 5.25e8 within 0.5% (the
paper's entries are its rounded 1.75e8 times T / (T − o)). Counting every non-embedding parameter
(85,056,000 with biases and LayerNorms) misses the o = 30 entry by 0.6%, so the paper used Kaplan's N.
Kaplan's n_layer is the argument `n_layers` below (one name per knob across longctx).

This is the count `RecurrentGPT2LM.flops_per_token` logs, for the baseline and the recurrent model
alike (as in the paper's table): Kaplan's N leaves out the embeddings and the output layer, and the
recurrence's pooling, FFN and one extra key/value (O(d·200 + n_layer·d) per window) are not added.
"""

from __future__ import annotations

from torch import nn

from longctx.core.flops import FLOPS_PER_MAC


def kaplan_non_embedding_params(
    n_layers: int, d_model: int, d_ff: int | None = None, d_attn: int | None = None
) -> int:
    """N = 2·d_model·n_layer·(2·d_attn + d_ff) (Kaplan et al. 2020); d_ff = 4·d_model, d_attn = d_model."""
    d_ff = 4 * d_model if d_ff is None else d_ff
    d_attn = d_model if d_attn is None else d_attn
    return 2 * d_model * n_layers * (2 * d_attn + d_ff)


def forward_flops_per_token(n_params: int, n_layers: int, n_ctx: int, d_attn: int) -> int:
    """C_forward = 2N + 2·n_layer·n_ctx·d_attn (Kaplan et al. 2020, Table 1): N + n_layer·n_ctx·d_attn
    multiply-accumulates, 2 FLOPs each (`longctx.core.flops`)."""
    return FLOPS_PER_MAC * (n_params + n_layers * n_ctx * d_attn)


def flops_per_scored_token(
    n_params: int, n_layers: int, window: int, d_model: int, overlap: int = 0
) -> float:
    """(2N + 2·n_layer·T·d)·T/(T − o): forward FLOPs per scored token with window T and overlap o."""
    if not 0 <= overlap < window:
        raise ValueError(f"overlap must satisfy 0 <= o < T, got o={overlap}, T={window}")
    return forward_flops_per_token(n_params, n_layers, window, d_model) * window / (window - overlap)


def hf_model_flops_per_scored_token(
    lm: nn.Module, window: int, overlap: int = 0, output_layer: bool = False
) -> float:
    """The formula for a Hugging Face GPT-2-style model, N from its config (Kaplan's count).

    `output_layer=False` is the paper's table (Kaplan's N leaves the LM head out); True adds the
    LM head's d·V multiply-accumulates per computed position, as the other methods' counts include
    their output layer (`longctx.core.flops`), so head-to-head numbers compare like with like.
    """
    config = lm.config
    d_model = int(config.hidden_size)
    n_layers = int(config.num_hidden_layers)
    d_ff = getattr(config, "n_inner", None) or getattr(config, "intermediate_size", None) or 4 * d_model
    n_params = kaplan_non_embedding_params(n_layers, d_model, int(d_ff))
    if output_layer:
        n_params += d_model * int(config.vocab_size)
    return flops_per_scored_token(n_params, n_layers, window, d_model, overlap)
