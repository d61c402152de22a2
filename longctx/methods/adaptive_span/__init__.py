"""Adaptive Attention Span (Sukhbaatar, Grave, Bojanowski, Joulin, "Adaptive Attention Span in
Transformers", ACL 2019, arXiv 1905.07799): a character-level sequential transformer whose heads each
learn how far back they attend. Reference code: facebookresearch/adaptive-span. Where the code differs
from the paper, longctx follows the code (§ "code" below), so the authors' checkpoints convert exactly.

Notation (the paper's symbols and where they live; files of this folder; § = the paper's section):

| symbol      | meaning                                  | §     | longctx                                   |
|-------------|------------------------------------------|-------|-------------------------------------------|
| S           | maximum span (`attn_span`)               | 2.1   | mask.py:AdaptiveMask.S,                   |
|             |                                          |       | attention.py:SpanAttention.S              |
| s_tr        | x_tᵀW_qᵀ(W_k x_r + p_{t−r}), t−S ≤ r < t | 2.1   | attention.py:band_attention (`content`,   |
|             | (a query never attends to itself)        |       | `position`), attention.py:unskew          |
| W_q, W_k,   | query, key, value projections (no bias,  | 2.1   | attention.py:SpanAttention.proj_query,    |
| W_v         | as the code)                             |       | attention.py:SpanAttention.proj_key,      |
|             |                                          |       | attention.py:SpanAttention.proj_val       |
| p_{t−r}     | learned key position embedding (Dh × S)  | 2.1   | network.py:SpanTransformer.key_pe         |
| h_cache     | per layer, states of earlier blocks,     | 2.1   | memory.py:SpanCache.h_cache,              |
|             | attended across blocks (the caches)      |       | network.py:SpanTransformer.init_cache     |
| z, z'       | a head's span z = S·z', z' ∈ [0, 1]      | 2.2   | mask.py:AdaptiveMask.z,                   |
|             |                                          |       | mask.py:AdaptiveMask.z_ratio              |
| R           | ramp of the soft mask (`span_ramp`)      | 2.2   | mask.py:AdaptiveMask.R                    |
| m_z(x)      | soft mask clamp((R + z − x)/R, 0, 1);    | 2.2   | mask.py:ramp_mask,                        |
|             | the code's is taken at x − 1             | code  | mask.py:AdaptiveMask.mask                 |
| a_tr        | m_z(t−r)e^{s_tr} / Σ_q m_z(t−q)e^{s_tq}; | 2.2   | mask.py:renormalise (eager),              |
|             | the code renormalises softmax·m (+1e-8)  | code  | attention.py:_fused_band (sdpa: log m)    |
| λ/M·Σ_i z_i | l1 span loss, M heads a layer (H here),  | 2.2   | mask.py:AdaptiveMask.penalty,             |
|             | summed over layers                       |       | network.py:SpanTransformerOutput.penalty, |
|             |                                          |       | module.py:AdaptiveSpanLM.span_loss        |
| z' clamp    | z' kept in [0, 1] after every update     | code  | mask.py:AdaptiveMask.clamp_,              |
|             |                                          |       | module.py:AdaptiveSpanLM.optimizer_step   |
| z_t         | dynamic span S·σ(vᵀx_t + b), b₀ = −4     | 2.2   | mask.py:DynamicSpan.forward (v, b:        |
|             | (not in the released code)               |       | mask.py:DynamicSpan.proj)                 |
| L           | positions a layer attends: largest span  | code  | mask.py:attended_length,                  |
|             | + R, trimmed in steps of 64              |       | mask.py:TRIM_GRANULARITY                  |
| L_h         | per-head trimming (`span_trim: head`;    | ours  | attention.py:SpanAttention.head_groups,   |
|             | the code trims per layer)                |       | attention.py:SpanAttention._grouped_heads |
| C_l         | next block's cache: L + 64, ≤ S (S for   | code  | mask.py:AdaptiveMask.cache_size,          |
|             | fixed and dynamic spans)                 |       | mask.py:CACHE_MARGIN                      |
| #FLOPS      | forward cost per token                   | Tab 1 | flops.py:macs_per_token,                  |
|             |                                          |       | flops.py:flops_per_token                  |
| avg span    | span the code reports: ceil(z'·S) + R    | code  | mask.py:reported_span,                    |
|             |                                          |       | module.py:AdaptiveSpanLM._span_logs       |
| Figure 4    | learned span of every head, per layer    | Fig 4 | figures.py:span_figure                    |

The paper's M (heads, in the span loss) is H here, because M in shapes is the block length
(`data.tgt_len`), as in the released code. The released code's names: S `attn_span`, z' `current_val`,
R `adapt_span_ramp`, λ `adapt_span_loss`, H `nb_heads`, M `block_size`, L `attn_span − trim_len`, C_l
`get_cache_size()`. The `eval_span_cap` knob (module.py:AdaptiveSpanLM.eval_span_cap) caps the
attended distance at evaluation only; it is longctx's, not the paper's.

Knobs: the network's are one frozen dataclass, network.py:SpanTransformerConfig (=
`SpanTransformer.Config`, `model.init_args.network.*` in configs: sizes, S, dropout, span kind, R,
z' and b at init, chunk size, trimming, attention kernel); the module's own are λ (`span_loss`) and
`eval_span_cap`. `AdaptiveSpanLM(network={"d_model": ..., "attn_span": ...})` takes the group as the
Config or a dict of its fields; `SpanTransformer(V, config)`, or `config.build(V)`, the Config.

Files: `mask.py` (m_z, z, z_t, trimming), `attention.py` (the band attention), `network.py` (pure
PyTorch), `memory.py` (the caches), `flops.py`, `figures.py`, `convert.py` (the authors' checkpoints),
`module.py` (the LightningModule).
"""
