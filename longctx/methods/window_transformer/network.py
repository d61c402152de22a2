"""A plain causal transformer over fixed windows, with no memory: the no-memory baseline.

Every window (segment) of L tokens is read on its own, as the "vanilla" character transformer of
Al-Rfou et al. (2019) that Transformer-XL (Dai et al. 2019, §3.1) compares against: the first token
of a window has no context, the last has L − 1 tokens. The blocks are GPT-2's (Radford et al. 2019,
§2.3): pre-LayerNorm (LN before attention and before the feed-forward, a final LN after the last
block), learned absolute positions, GELU feed-forward, output layer tied to the token embedding,
N(0, 0.02) init with the residual projections scaled by 1/√(2·n_layers).

Pure PyTorch: no Lightning here (the module in `module.py` wires it to `LMBase`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longctx.core.knob_groups import check_probabilities, check_sizes


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: softmax(QKᵀ/√d_head + causal mask)·V, fused by SDPA."""

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.dropout = dropout
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        B, L, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)  # each (B, L, d)
        q, k, v = (t.view(B, L, self.n_heads, d // self.n_heads).transpose(1, 2) for t in (q, k, v))
        # (B, H, L, d_head): position t attends positions 0..t of its window.
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).reshape(B, L, d)  # heads concatenated again
        return self.resid_dropout(self.out(y))


class Block(nn.Module):
    """Pre-LN block: x + Attn(LN(x)), then x + FFN(LN(x)), FFN = W₂·GELU(W₁·)."""

    def __init__(self, d_model: int, n_heads: int, d_inner: int, dropout: float) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, dropout)
        self.ln_ff = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(
            nn.Linear(d_model, d_inner), nn.GELU(), nn.Linear(d_inner, d_model), nn.Dropout(dropout)
        )

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_attn(x))
        return x + self.ff(self.ln_ff(x))


@dataclass(frozen=True)
class WindowTransformerConfig:
    """The no-memory baseline's network knobs, their one source (`WindowTransformer.Config`).

    d_model, n_layers, n_heads, d_inner: sizes (d_model divisible by n_heads).
    max_len: number of learned positions, the longest window it can read (at least data.tgt_len and
        data.eval_tgt_len).
    dropout: on the embeddings, attention probabilities and residual branches.
    """

    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    d_inner: int = 512
    max_len: int = 512
    dropout: float = 0.1

    def __post_init__(self) -> None:
        check_sizes(self, "d_model", "n_layers", "n_heads", "d_inner", "max_len")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        check_probabilities(self, "dropout")

    def build(self, vocab_size: int) -> WindowTransformer:
        return WindowTransformer(vocab_size, self)


class WindowTransformer(nn.Module):
    """Token ids (B, L) → next-token logits (B, L, V), each row of L tokens read independently.

    `WindowTransformer(vocab_size, config)` with a `WindowTransformer.Config` (or
    `config.build(vocab_size)`).
    """

    Config = WindowTransformerConfig

    def __init__(self, vocab_size: int, config: WindowTransformerConfig) -> None:
        super().__init__()
        self.config = config
        d_model, n_layers = config.d_model, config.n_layers
        self.max_len = config.max_len
        self.token_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(config.max_len, d_model)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(
            Block(d_model, config.n_heads, config.d_inner, config.dropout) for _ in range(n_layers)
        )
        self.ln_final = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.head.weight = self.token_emb.weight  # tied (GPT-2)
        self.apply(self._init_weights)
        for block in self.blocks:  # GPT-2: residual projections scaled by 1/√(2·n_layers)
            for proj in (block.attn.out, block.ff[2]):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, x: Tensor) -> Tensor:
        L = x.shape[1]
        if self.max_len < L:
            raise ValueError(
                f"window of {L} tokens is longer than max_len={self.max_len} learned positions: raise "
                "model.init_args.network.max_len or lower data.tgt_len / data.eval_tgt_len"
            )
        positions = torch.arange(L, device=x.device)
        h = self.drop(self.token_emb(x) + self.pos_emb(positions))  # (B, L, d)
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_final(h))  # (B, L, V)
