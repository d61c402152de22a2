"""Transformer-XL (Dai, Yang, Yang, Carbonell, Le, Salakhutdinov, "Transformer-XL: Attentive Language
Models Beyond a Fixed-Length Context", ACL 2019, arXiv 1901.02860), the Transformer+RPE baseline (the
same network without memory) and TRAMS (Yu, Wang, Zhang, Bi, "TRAMS: Training-free Memory Selection
for Long-range Language Modeling", Findings of EMNLP 2023, arXiv 2310.15494): at evaluation, each
query attends to m memory slots chosen from a pool of M without looking at the query. Reference code:
kimiyoung/transformer-xl (`pytorch/mem_transformer.py`) and lwaekfjlk/TRAMS
(`utils/modeling_transfo_xl.py`); where the code differs from a paper, longctx follows the code
(§ "code"), so the authors' checkpoints give the authors' numbers.

Notation (the papers' symbols and where they live; files of this folder; § = XL's or TRAMS's section):

| symbol    | meaning                        | §     | longctx                                               |
|-----------|--------------------------------|-------|-------------------------------------------------------|
| h_τ^{n−1} | memory: the inputs of layer n  | X 3.2 | memory.py:XLMemory.hidden                             |
|           | in segment τ                   |       |                                                       |
| M (XL)    | memory kept per layer          | X 3.2 | module.py:TransformerXLLM.train_lengths,              |
|           | (`mem_len`; longer at          |       | module.py:TransformerXLLM.eval_lengths                |
|           | evaluation)                    |       |                                                       |
| SG(·)     | stop-gradient: the memory is   | X 3.2 | memory.py:XLSegment.kept                              |
|           | kept detached                  |       |                                                       |
| h~_{τ+1}  | [SG(h_τ^{n−1}) ∘               | X 3.2 | memory.py:XLSegment.window,                           |
|           | h_{τ+1}^{n−1}]: memory, then   |       | relative_attention.py:KeyWindow,                      |
|           | the segment                    |       | network.py:TransformerXL.attend                       |
| q, k, v   | h W_qᵀ, h~ W_{k,E}ᵀ, h~ W_vᵀ   | X 3.2 | relative_attention.py:RelMultiHeadAttention.qkv_net   |
|           | (one bias-free matrix, as the  |       |                                                       |
|           | code)                          |       |                                                       |
| R_{i−j}   | sinusoid of the distance i − j | X 3.3 | relative_attention.py:sinusoid_positions              |
|           | (not learned)                  |       |                                                       |
| W_{k,R}   | projection of R into position  | X 3.3 | relative_attention.py:RelMultiHeadAttention.r_net     |
|           | keys                           |       |                                                       |
| u, v      | content and position biases,   | X 3.3 | network.py:TransformerXL.r_w_bias,                    |
|           | shared by all layers           |       | network.py:TransformerXL.r_r_bias                     |
|           | (`untie_r`: one pair per       |       |                                                       |
|           | layer)                         |       |                                                       |
| (a) + (c) | content terms                  | X 3.3 | relative_attention.py:RelMultiHeadAttention._scores   |
|           | (q_i+u)ᵀW_{k,E}E_{x_j}         |       |                                                       |
| (b) + (d) | position terms                 | X 3.3 | relative_attention.py:RelMultiHeadAttention._scores   |
|           | (q_i+v)ᵀW_{k,R}R_{i−j}         |       |                                                       |
| shift     | (b) + (d) of every (i, j) from | X B   | relative_attention.py:rel_shift                       |
|           | one product, shifted per row   |       |                                                       |
| A^rel     | softmax(A^rel/√Dh) over the    | X 3.3 | relative_attention.py:RelMultiHeadAttention._softmax, |
|           | keys; `sdpa`: one fused kernel |       | relative_attention.py:RelMultiHeadAttention._fused    |
| mask      | causal; `same_length`: every   | code  | relative_attention.py:window_blocked                  |
|           | query sees as many keys        |       |                                                       |
| clamp_len | distances in R capped          | code  | relative_attention.py:sinusoid_positions,             |
|           | (evaluation: `eval_clamp_len`) |       | module.py:TransformerXLLM.eval_lengths                |
| softmax   | adaptive input and softmax     | X 4.1 | adaptive_softmax.py:AdaptiveEmbedding,                |
|           | (Baevski & Auli 2019; Grave et |       | adaptive_softmax.py:ProjectedAdaptiveLogSoftmax       |
|           | al. 2017)                      |       |                                                       |
| RPE       | Transformer+RPE: the same      | T 4   | module.py:TransformerXLLM.train_lengths               |
|           | network, no memory (`mem_len:  |       |                                                       |
|           | 0`)                            |       |                                                       |
| k/v cache | evaluation: the memory's keys  | ours  | memory.py:XLMemory.kv, slot_store.py:SlotAppender     |
|           | and values kept, not projected |       |                                                       |
|           | again                          |       |                                                       |
| M         | TRAMS pool: the last M states  | T 3   | module.py:TransformerXLLM.eval_lengths                |
|           | per layer (`trams_pool`)       |       |                                                       |
| m         | memory slots each query        | T 3   | trams.py:TramsSettings.attended                       |
|           | attends (`trams_attended`)     |       |                                                       |
| k         | slots selected from the older  | T 3   | trams.py:TramsSettings.selected                       |
|           | pool slots                     |       |                                                       |
| m − k     | newest slots, always attended  | code  | trams.py:TramsSettings.kept                           |
|           | (`trams_kept`; code            |       |                                                       |
|           | `remain_mem_num`)              |       |                                                       |
| K′        | reformulated key W_Q⁽ʰ⁾ᵀk      | T 3.2 | trams.py:query_factor, trams.py:score_matrix          |
|           | (never formed: ‖K′‖ = ‖Rk‖,    |       |                                                       |
|           | ΣK′ = s·k)                     |       |                                                       |
| score     | each key's metric: the code's  | T 3.2 | trams.py:trams_scores, trams.py:layer_scores          |
|           | ‖K′‖·abs(ΣK′), the paper's     | code  |                                                       |
|           | cos⟨K′, 1⟩·‖K′‖                |       |                                                       |
|           | (`trams_metric`)               |       |                                                       |
| top-k     | the k best older slots, in     | T 3   | trams.py:select_memory, trams.py:select_windows       |
|           | time order                     |       |                                                       |
| window    | [selected, kept, segment];     | code  | trams_pool.py:TramsSegment, trams.py:window_index,    |
|           | positions `compact` (code) or  |       | trams.py:TramsSettings.positions,                     |
|           | `true`                         |       | relative_attention.py:KeyWindow.true_positions        |
| oracle    | the slots of largest attention | ours  | trams.py:oracle_scores,                               |
|           | (analysis, not TRAMS)          |       | relative_attention.py:KeyWindow.select                |
| cache     | each slot scored once, carried | ours  | memory.py:XLMemory.score,                             |
|           | with its key                   |       | memory.py:XLMemory.score_matrix                       |
| protocol  | TRAMS's evaluation: zero       | code  | memory.py:XLMemory.empty, module.py:drop_last_scored  |
|           | memory, a segment's first      |       |                                                       |
|           | token unscored                 |       |                                                       |
| mass      | attention probability on the   | ours  | relative_attention.py:AttentionOutput.mem_mass        |
|           | memory (`trams/mem_mass`)      |       |                                                       |
| FLOPs     | forward cost per scored token, | ours  | flops.py:macs_per_token, flops.py:flops_per_token     |
|           | XL and TRAMS                   |       |                                                       |

§: X = Transformer-XL's section (X B: its Appendix B), T = TRAMS's, "code" = the released code's
choice, "ours" = longctx's (exact, or an option that defaults to the code). n is the segment length
(`data.tgt_len`, `data.eval_tgt_len`; XL's L), P the memory slots held now (the code's `mlen`,
memory.py:XLMemory.valid columns), H and Dh the heads and their size (`n_head`, `d_head`). Where more
code sits: each head's W_Q⁽ʰ⁾ relative_attention.py:RelMultiHeadAttention.query_weight, the position
keys W_{k,R}R relative_attention.py:RelMultiHeadAttention._positions, the TRAMS window attended by a
layer trams_pool.py:TramsSegment._gathered. The released codes' names: u, v
`r_w_bias`, `r_r_bias`; m − k `remain_mem_num`, k `topk_num`; K′ `QKk`. The Transformer-XL paper's M
(memory length) is `mem_len` here; M alone means TRAMS's pool.

Files: `network.py` (pure PyTorch, the one layer loop), `relative_attention.py` (A^rel over a
`KeyWindow`), `memory.py` and `slot_store.py` (the memory, its per-segment `XLSegment` and its
evaluation cache), `trams.py` (TRAMS's metric and selection) and `trams_pool.py` (its memory type),
`adaptive_softmax.py`, `flops.py`, `convert.py` (the authors' checkpoints), `module.py` (the
LightningModule).
"""
