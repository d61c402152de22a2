"""The no-memory baseline: a plain causal transformer over independent windows, the "vanilla" model
that Transformer-XL (Dai et al. 2019, §3.1) compares with, built from GPT-2's blocks (Radford et al.
2019, "Language Models are Unsupervised Multitask Learners", §2.3). It is the minimal method of
docs/architecture.md, "Adding a method", and the cost/quality floor of the memory methods.

Notation (files of this folder; § = X: Transformer-XL's section, G: GPT-2's):

| symbol | meaning                                         | §     | longctx                                 |
|--------|-------------------------------------------------|-------|-----------------------------------------|
| L      | window (segment) length (`data.tgt_len`): every | X 3.1 | network.py:WindowTransformer.forward,   |
|        | window read on its own, the first token with no |       | network.py:WindowTransformer.max_len    |
|        | context                                         |       |                                         |
| mask   | causal: position t attends positions 0 … t of   | G 2.3 | network.py:CausalSelfAttention.forward  |
|        | its window                                      |       |                                         |
| p_t    | learned absolute positions                      | G 2.3 | network.py:WindowTransformer.pos_emb    |
| block  | pre-LN: x + Attn(LN(x)), then x + FFN(LN(x)),   | G 2.3 | network.py:Block                        |
|        | FFN = W₂·GELU(W₁·)                              |       |                                         |
| W_e    | output layer tied to the token embedding        | G 2.3 | network.py:WindowTransformer.head,      |
|        |                                                 |       | network.py:WindowTransformer.token_emb  |
| memory | none: nothing is carried from one batch to the  | X 3.1 | module.py:WindowTransformerLM.step      |
|        | next                                            |       |                                         |
| FLOPs  | forward cost per token, (L + 1)/2 keys per      | ours  | flops.py:flops_per_token                |
|        | query on average                                |       |                                         |

The network's knobs have one source, network.py:WindowTransformerConfig (`WindowTransformer.Config`,
`.build(vocab_size)`), the module's `network` group (`model.init_args.network.d_model`).

Files: `network.py` (pure PyTorch), `flops.py`, `module.py` (the LightningModule).
"""
