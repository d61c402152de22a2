"""The Compressive Transformer (Rae, Potapenko, Jayakumar, Hillier, Lillicrap, "Compressive Transformers
for Long-Range Sequence Modelling", ICLR 2020, arXiv 1911.05507): Transformer-XL whose evicted memories
are compressed into a second, coarser memory instead of being discarded. No official code was
released; the paper is the reference: §3.1 and Algorithm 1 (the model, its two memories), §3.2 (the
compression functions and losses, Algorithm 2 the attention-reconstruction loss), §5 (the training
recipe and the experiments: §5.1 PG-19, §5.2 enwik8, §5.3 WikiText-103; Appendix B the model sizes).

Notation (the paper's symbols and where they live; files of this folder):

| symbol     | meaning                              | longctx                                            |
|------------|--------------------------------------|----------------------------------------------------|
| n_s        | segment (window) length              | `data.tgt_len`, `data.eval_tgt_len`                |
| n_m        | memory slots per layer               | module.py `mem_len`, `evaluation.mem_len`          |
| n_cm       | compressed memory slots per layer    | module.py `cmem_len`, `evaluation.cmem_len`        |
| c          | compression rate                     | network.py `CompressiveTransformerConfig`          |
|            |                                      | `.compression_rate` (`network.compression_rate`)   |
| f_c        | compression function, one per layer | compression.py:build_compression,                  |
|            |                                      | network.py:CompressiveTransformer.compressors      |
| mem, cmem  | memory, compressed memory            | memory.py:CompressiveMemory (hidden, compressed)   |
| concat(cmem, mem) | the keys a layer attends      | memory.py:CompressiveSegment.window                |
| old_mem    | states evicted from the memory       | memory.py:CompressiveSegment.eviction              |
|            |                                      | (Eviction.evicted)                                 |
| new_cm     | f_c(old_mem)                         | network.py:CompressiveTransformer.forward (`new`)  |
| attn(h, m) | content-based attention of a layer   | network.py:content_attention                       |
| L^attn     | attention-reconstruction loss        | network.py:attention_reconstruction,               |
|            |                                      | module.py `reconstruction_weight`                  |
| L^ae       | auto-encoding loss (the option)      | network.py:masked_mse, compression.py:Decoder      |

Files: `network.py` (pure PyTorch), `compression.py` (f_c), `memory.py` (the two FIFO memories),
`flops.py` (FLOPs per token), `module.py` (the LightningModule).
"""
