"""The Recurrent Memory Transformer (Bulatov, Kuratov, Burtsev, "Recurrent Memory Transformer", NeurIPS
2022, arXiv 2207.06881) in its decoder-only form on a pretrained GPT-2 (Bulatov, Kuratov, Kapushev,
Burtsev, "Scaling Transformer to 1M tokens and beyond with RMT", arXiv 2304.11062) and with the
curriculum of BABILong (Kuratov et al. 2024, arXiv 2406.10149): m memory tokens are read before and
written after every segment of a long text, and the written ones become the next segment's memory.
The reference is the authors' code, booydar/recurrent-memory-transformer
(`modeling_rmt/language_modeling.py`: `MemoryCell`, `RecurrentWrapper`; the training scripts in
`scripts_exp/`); where it differs from the paper or fills what the paper leaves open, the row says
"code".

Notation (the paper's symbols and where they live; files of this folder; § = 2207.06881's section):

| symbol      | meaning                              | §    | longctx                                    |
|-------------|--------------------------------------|------|--------------------------------------------|
| T           | segment length (`data.tgt_len`)      | 3    | longctx/data/streams.py:SegmentStream      |
| K           | segments of a batch row,             | 3    | network.py:MemoryCell.forward              |
|             | backpropagated through               |      |                                            |
|             | (`data.windows_per_batch`; the       |      |                                            |
|             | code's max_n_segments, k2 = −1)      |      |                                            |
| m           | memory tokens (`num_mem_tokens`)     | 3    | network.py:MemoryCellConfig.num_mem_tokens |
| H_0^mem     | the learned initial memory (m, d),   | code | network.py:MemoryCell.memory               |
|             | drawn N(0, 1)·std(token embedding)   |      |                                            |
| H_τ^mem     | memory read by segment τ: the        | 3    | memory.py:MemoryTokens,                    |
|             | carried state, or H_0^mem at a       |      | memory.py:read_memory                      |
|             | document start                       |      |                                            |
| H̃_τ        | [H_τ^mem ; H_τ ; H_τ^mem]: read      | 3    | network.py:MemoryCell.segment              |
|             | tokens, segment, write tokens (the   |      |                                            |
|             | same inputs)                         |      |                                            |
| positions   | 0 … T + 2m − 1 over the whole        | code | network.py:MemoryCell.segment,             |
|             | sequence (T + 2m ≤ n_positions)      |      | network.py:HFBackbone.check_positions      |
| H̄_τ        | Transformer(H̃_τ): the GPT-2's       | 3    | network.py:HFBackbone.transform            |
|             | causal blocks, last hidden states    |      |                                            |
|             | after ln_f                           |      |                                            |
| H̄_τ (2022) | Transformer-XL's blocks without its  | code | xl_backbone.py:XLBackbone.forward          |
|             | memory (relative positions T + 2m −  |      |                                            |
|             | 1 … 0), the paper's backbone; LM-    |      |                                            |
|             | RMT's mask: each memory block sees   |      | xl_backbone.py:MemoryBlocksWindow          |
|             | all of itself                        |      |                                            |
| H_τ^out     | the segment's outputs → logits (read | code | network.py:HFBackbone.scores,              |
|             | and write positions cut)             |      | xl_backbone.py:XLBackbone.scores           |
| H_{τ+1}^mem | H_τ^write, the write tokens' last    | 3    | network.py:MemoryCell.segment              |
|             | hidden states                        |      |                                            |
| BPTT        | backprop through the K segments of a | 3    | network.py:MemoryCell.forward,             |
|             | batch; the memory carried across     |      | longctx/core/base.py:detach_memory         |
|             | batches detached                     |      |                                            |
| samples     | a batch's first segment reads the    | code | module.py:RecurrentMemoryLM.train_memory   |
|             | carried memory or, as the code's     |      |                                            |
|             | samples, H_0^mem (`train_memory:     |      |                                            |
|             | fresh`)                              |      |                                            |
| curriculum  | 1, 2, 4, … segments, each stage from | code | module.py:RecurrentMemoryLM.load_memory    |
|             | the previous stage's best checkpoint |      |                                            |
| FLOPs       | backbone over T + 2m positions, LM   | ours | flops.py:flops_per_token                   |
|             | head over T, per scored token        |      |                                            |

The memory cell runs any `network.py:Backbone`: a GPT-2 (`network.py:HFBackbone`), built, loaded and
pickled by the recurrent GPT-2's Hugging Face helpers (longctx/methods/recurrence/hf.py:build_lm), or
Transformer-XL's network (`xl_backbone.py:XLBackbone`, the module's `xl_config`; the 2022 paper's
RMT is Transformer-XL's code with memory tokens, booydar/LM-RMT). And the segment-by-segment backward of
the loop over segments and the segment-by-segment backward of `checkpoint_segments` are the shared
longctx/methods/bptt.py:unroll (with reverse_window_bptt).

The memory's knobs have one source, network.py:MemoryCellConfig (`MemoryCell.Config`,
`.build(embedding)`), the module's `memory_cell` group (`model.init_args.memory_cell.num_mem_tokens`);
the backbone is described apart (`pretrained`, `gpt2_config` or `xl_config`).

Files: `network.py` (the memory cell, the loop over segments and the GPT-2 backbone, pure PyTorch),
`xl_backbone.py` (Transformer-XL's network as the backbone), `memory.py`, `flops.py`, `module.py`
(the LightningModule).
"""
