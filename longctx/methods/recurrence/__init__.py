"""Recurrence for pretrained transformers (Yoshida, Ettinger, Gimpel, "Adding Recurrence to Pretrained
Transformers for Improved Efficiency and Context Size", 2020, arXiv 2008.07027) on GPT-2: a pretrained
causal LM reads a long text as windows of T tokens, and a pooled summary of each window is read by the
next one at one layer, as one extra key and value. The authors released no code: the paper is the
reference, and where it leaves a choice open longctx names the knob and its default (§ "open").

Notation (the paper's symbols and where they live; files of this folder; § = the paper's section):

| symbol    | meaning                            | §    | longctx                                            |
|-----------|------------------------------------|------|----------------------------------------------------|
| T         | window length (`data.tgt_len`);    | 3    | longctx/data/streams.py:SegmentStream              |
|           | windows of a row are consecutive   |      |                                                    |
| K         | windows of a batch row,            | 3.2  | network.py:WindowRecurrence.forward                |
|           | backpropagated through             |      |                                                    |
|           | (`data.windows_per_batch`)         |      |                                                    |
| h_{i,t}^l | hidden states of window i, block l | 3    | network.py:WindowRecurrence.window                 |
|           | (HF's `hidden_states`)             |      |                                                    |
| w         | layer weights of the pooling,      | 3    | network.py:LayerPooling.weight_logits              |
|           | softmax(w) (eq. 1)                 |      |                                                    |
| z_i       | pooled summary: Σ_l softmax(w)_l · | 3    | network.py:LayerPooling.forward,                   |
|           | mean_t h_{i,t}^{(l)} over real     |      | network.py:valid_positions                         |
|           | positions                          |      |                                                    |
| pooling   | which states are pooled: blocks    | open | network.py:WindowRecurrence.pool_embeddings        |
|           | (default) or also the embeddings   |      |                                                    |
| FFN       | z_i -> h_prev: 3 hidden layers of  | 3    | network.py:RecurrenceFFN                           |
|           | 200                                |      |                                                    |
| h_prev    | FFN(z_i), what window i + 1 reads, | 3    | memory.py:RecurrenceMemory.h_prev,                 |
|           | carried across batches             |      | network.py:WindowRecurrence.slot_for               |
| ℓ_ins     | the block that reads h_prev as one | 3    | network.py:WindowRecurrence.insert_layer,          |
|           | extra key and value (0-based; 2)   |      | network.py:RecurrenceSlot.layer                    |
| slot      | h_prev's key and value from that   | 3    | network.py:project_slot, network.py:slot_mask,     |
|           | block's own projections; its mask  |      | network.py:with_slot                               |
|           | column                             |      |                                                    |
| ln_1      | h_prev enters block ℓ_ins through  | open | network.py:pre_attention_norm,                     |
|           | its LayerNorm (`slot_norm`)        |      | network.py:WindowRecurrence.slot_norm              |
| BPTT      | backprop through the K windows of  | 3.2  | network.py:WindowRecurrence.forward,               |
|           | a batch (h_prev detached between   |      | longctx/methods/bptt.py:unroll                     |
|           | batches)                           |      |                                                    |
| ckpt      | gradient checkpointing per window  | 3.2  | module.py:RecurrentGPT2LM.checkpoint_windows,      |
|           | (`checkpoint_windows`); one window |      | longctx/methods/bptt.py:reverse_window_bptt        |
|           | at a time backward                 |      |                                                    |
| o         | overlap of windows                 | 4.2  | overlaps.py:evaluate_overlaps,                     |
|           | (`data.overlap`,                   |      | overlap_record.py:save_overlaps                    |
|           | `data.eval_overlap`): stride T −   |      |                                                    |
|           | o, each target scored once         |      |                                                    |
| N         | non-embedding parameters (Kaplan   | 4.2  | flops.py:kaplan_non_embedding_params               |
|           | et al. 2020)                       |      |                                                    |
| FLOPs     | (2N + 2·n_layer·T·d)·T/(T − o) per | 4.2  | flops.py:flops_per_scored_token,                   |
|           | scored token                       |      | flops.py:hf_model_flops_per_scored_token           |
| PPL/word  | exp(NLL of the split / its words)  | 4    | longctx/core/base.py:LMBase,                       |
|           | (`{stage}/word_ppl`)               |      | longctx/core/data_facts.py:LMDataFacts.word_count  |
| baseline  | the same GPT-2 on the same         | 4    | network.py:window_scores                           |
|           | windows, no recurrence             |      |                                                    |
|           | (`recurrence: false`)              |      |                                                    |

`hf.py` holds everything longctx uses of Hugging Face `transformers`: building and saving the LM, and
registering the attention that reads the slot (hf.py:register_recurrence_attention). k indexes the
windows of a batch (0 … K − 1); L (the GPT-2's blocks, HF's `n_layer`) is `n_layers` in longctx.
`chunked_loss.py` (the LM head's loss without the whole logits) and `eval_h_prev`
(module.py:RecurrentGPT2LM.eval_h_prev: h_prev cut at evaluation, for `context`) are longctx's.

The recurrence's knobs (ℓ_ins, the FFN, pooling, slot_norm) have one source,
network.py:WindowRecurrenceConfig (`WindowRecurrence.Config`, `.build(d_model, n_layers)`), the
module's `window_recurrence` group (`model.init_args.window_recurrence.insert_layer`); the GPT-2 is
described apart (`pretrained` or `gpt2_config`), and `recurrence: false` switches the group off.

Files: `network.py` (the slot, pooling, FFN and the window the shared loop `longctx/methods/bptt.py`
runs), `memory.py`,
`chunked_loss.py`, `flops.py`, `overlaps.py` and `overlap_record.py` (the overlap sweep), `hf.py`,
`export.py` (a checkpoint's GPT-2 as a Hugging Face directory), `module.py` (the LightningModule).
"""
