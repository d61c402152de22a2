"""The 2022 paper's own backbone: Transformer-XL's network without its memory (Bulatov, Kuratov,
Burtsev, NeurIPS 2022). The authors' code for that paper, booydar/LM-RMT, "is based on the
Transformer-XL repository ... All LM and algorithmic experiments from our paper were conducted using
this repository" (its README): `pytorch/mem_transformer.py`, `MemTransformerLM` with
`num_mem_tokens` and `mem_len` 0.

The segment [read; tokens; write] runs through Transformer-XL's blocks with relative positions
(T + 2m − 1 … 0 over the whole sequence, so no position limit) and u, v; as in LM-RMT:
- the memory tokens join the token embeddings after their √d scaling (`word_emb` scales the tokens
  alone), and both go through the embedding dropout;
- attention is causal except that the read tokens see one another and the write tokens see one
  another (`dec_attn_mask[:m, :m] = 0`, `dec_attn_mask[-m:, -m:] = 0`; the Hugging Face RMT's GPT-2
  keeps the plain causal mask);
- the new memory is the write tokens' last-layer output after the final dropout (`hidden[-m:]`;
  the network has no final LayerNorm, as Transformer-XL's code);
- the initial memory is drawn at the scale of the embeddings the blocks read (× √d).

Why a second backbone: at the recall recipe's scale a GPT-2 from scratch (learned absolute
positions) does not learn the key match even within its window, where Transformer-XL's network does
(docs/recurrent_memory.md, "The backbone"). Pure PyTorch.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from longctx.methods.recurrent_memory.network import BackboneScores
from longctx.methods.transformer_xl.network import TransformerXL
from longctx.methods.transformer_xl.relative_attention import KeyWindow, sinusoid_positions


def memory_blocks_blocked(n: int, num_mem_tokens: int, device: torch.device) -> Tensor:
    """LM-RMT's mask over [read (m); segment; write (m)], as the pairs that may NOT attend: (1, 1, n, n),
    key after query, except within the read block and within the write block."""
    m = num_mem_tokens
    i = torch.arange(n, device=device)
    blocked = i[None, :] > i[:, None]
    if m:
        blocked[:m, :m] = False
        blocked[-m:, -m:] = False
    return blocked[None, None]


class MemoryBlocksWindow(KeyWindow):
    """A window whose blocked pairs are given (`memory_blocks_blocked`, formed once per segment and
    shared by its layers) instead of Transformer-XL's causal mask."""

    def __new__(cls, k: Tensor, v: Tensor, valid: Tensor, blocked_pairs: Tensor) -> MemoryBlocksWindow:
        window = super().__new__(cls, k, v, valid)
        window.blocked_pairs = blocked_pairs  # (1, 1, n, n)
        return window

    def blocked(self, n: int) -> Tensor:
        return self.blocked_pairs


class XLBackbone(nn.Module):
    """Transformer-XL's network as the Recurrent Memory Transformer's backbone (no XL memory).

    `XLBackbone(vocab_size, config)` with a `TransformerXL.Config`; the attention kernel "flex"
    forms its masks itself and is refused (the mask here is not Transformer-XL's).
    """

    def __init__(self, vocab_size: int, config: TransformerXL.Config) -> None:
        super().__init__()
        if config.attention == "flex":
            raise ValueError(
                "xl_config.attention 'flex' forms Transformer-XL's own masks; the Recurrent Memory "
                "Transformer's memory blocks need 'sdpa' or 'eager'"
            )
        self.net = config.build(vocab_size)
        self.config, self.vocab_size = config, vocab_size

    @property
    def module(self) -> nn.Module:
        return self

    def scaled_embedding(self) -> Tensor:
        """The token embedding as the blocks read it (V, d): the scale of the initial memory."""
        emb = self.net.word_emb
        return emb.emb_layers[0].weight * emb.emb_scale

    def embed(self, input_ids: Tensor) -> Tensor:
        """(B, T) ids -> (B, T, d) scaled token embeddings (before the embedding dropout)."""
        return self.net.word_emb(input_ids)

    def transform(self, sequence: Tensor, num_mem_tokens: int) -> Tensor:
        """[read; segment; write] (B, n, d) -> the last layer's outputs (B, n, d) after dropout
        (`forward`, so that compiling this module compiles the blocks)."""
        return self(sequence, num_mem_tokens)

    def forward(self, sequence: Tensor, num_mem_tokens: int) -> Tensor:
        net = self.net
        n = sequence.shape[1]
        h = net.drop(sequence)
        pos_emb = net.drop(sinusoid_positions(n, net.d_model, 0, h.device, h.dtype))  # n − 1 … 0
        valid = torch.ones(1, 1, n, dtype=torch.bool, device=h.device)
        blocked = memory_blocks_blocked(n, num_mem_tokens, h.device)
        for i, layer in enumerate(net.layers):
            k, v = layer.attn.project_kv(h)  # (B, H, n, Dh) each
            window = MemoryBlocksWindow(k, v, valid, blocked)
            u, r = (net.r_w_bias[i], net.r_r_bias[i]) if net.untie_r else (net.r_w_bias, net.r_r_bias)
            h, _ = layer(h, window, pos_emb, u, r)
        return net.drop(h)

    def scores(self, hidden: Tensor, target: Tensor, need_correct: bool = False) -> BackboneScores:
        """Per-target NLL (B, T) and, if asked, whether each target is the argmax (B, T)."""
        nll = self.net.nll(hidden, target)
        correct = self.net.crit.target_is_argmax(hidden, target) if need_correct else None
        return BackboneScores(nll, correct)

    def check_positions(self, segment_length: int, num_mem_tokens: int) -> None:
        """Relative positions: any T + 2m."""


def check_xl_memory_stays_bounded(config: TransformerXL.Config, carried_over_the_stream: bool) -> None:
    """Refuse a pre-LN network whose memory is carried over the stream. Transformer-XL's pre-LN blocks
    have no final LayerNorm, so a write token's output is its input, the memory it read, plus the
    segment's updates: carried from segment to segment the memory's norm grows with every one
    (measured on the recall recipe: 9 after one segment, 214 after 10, 1,199 after 35), and each new
    segment's update drowns in it. Post-LN blocks (LM-RMT's scripts, Transformer-XL's default) end
    every layer with a LayerNorm; samples of a few segments from the initial memory stay bounded."""
    if config.pre_lnorm and carried_over_the_stream:
        raise ValueError(
            "xl_config.pre_lnorm with the memory carried over the stream: a pre-LN Transformer-XL has no "
            "final LayerNorm, so the memory grows with every segment; give xl_config.pre_lnorm false "
            "(post-LN, as LM-RMT), or train_memory fresh with eval_restart_every K (samples of K segments)"
        )


def check_xl_backbone_sources(
    pretrained: str | None, gpt2_config: dict[str, object] | None, checkpoint_blocks: bool
) -> None:
    """One line for knobs that do not go with the Transformer-XL backbone: a GPT-2 to build or load,
    Hugging Face's block checkpointing."""
    if gpt2_config is not None:
        raise ValueError("give one backbone: xl_config (Transformer-XL's network) or gpt2_config, not both")
    if pretrained is not None and not pretrained.endswith(".ckpt"):
        raise ValueError(
            f"with xl_config, pretrained must be a .ckpt of a run on the same backbone or of a "
            f"Transformer-XL run, got {pretrained!r} (a Hugging Face model needs no xl_config)"
        )
    if checkpoint_blocks:
        raise ValueError(
            "checkpoint_blocks is Hugging Face's block checkpointing, a GPT-2's; with xl_config use "
            "checkpoint_segments"
        )
