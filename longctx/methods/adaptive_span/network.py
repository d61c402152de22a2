"""The character-level sequential transformer of Adaptive Attention Span (Sukhbaatar et al. 2019, §2.1).

As in the released code (facebookresearch/adaptive-span, `TransformerSeq`): token embedding, optional
embedding dropout, post-LayerNorm blocks (attention, then a ReLU feed-forward with dropout after the
ReLU), one learned key position embedding (head_dim × S, N(0, 1) init) shared by all layers and
heads, an untied output projection. Each layer keeps a cache of the hidden states that entered it in
earlier blocks, so every token attends to its S previous tokens across block boundaries.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longctx.methods.adaptive_span.attention import SpanAttention, SpanKind, SpanTrim
from longctx.methods.adaptive_span.memory import SpanCache
from longctx.methods.attention_kernel import AttentionKernel
from longctx.methods.fifo import fifo_append


@dataclass
class SpanTransformerOutput:
    """logits (B, M, V); cache: the next block's `SpanCache`; penalty: Σ_layers (1/M)·Σ_heads z (None for
    fixed spans); spans: per layer the spans of its heads (H,) (mean over tokens for dynamic spans);
    attended: per layer the number of previous positions attended in this block."""

    logits: Tensor
    cache: SpanCache
    penalty: Tensor | None
    spans: list[Tensor]
    attended: list[int]


class FeedForward(nn.Module):
    """fc1 -> ReLU -> dropout -> fc2 (the code's `FeedForwardLayer`)."""

    def __init__(self, d_model: int, d_inner: int, dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_inner)
        self.fc2 = nn.Linear(d_inner, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, h: Tensor) -> Tensor:
        return self.fc2(self.dropout(F.relu(self.fc1(h))))


class SpanBlock(nn.Module):
    """Post-LN block (code: `TransformerSeqLayer`): h = LN(h + Attn(h, [h_cache, h])); h = LN(h + FF(h))."""

    def __init__(
        self, d_model: int, n_heads: int, d_inner: int, attn_span: int, dropout: float, **span_kwargs
    ) -> None:
        super().__init__()
        self.attn = SpanAttention(d_model, n_heads, attn_span, dropout, **span_kwargs)
        self.norm1 = nn.LayerNorm(d_model)
        self.ff = FeedForward(d_model, d_inner, dropout)
        self.norm2 = nn.LayerNorm(d_model)

    def forward(
        self, h: Tensor, h_cache: Tensor, key_pe: Tensor, span_cap: int | None = None
    ) -> tuple[Tensor, Tensor | None, int]:
        attn_out, z_t, L = self.attn(h, h_cache, key_pe, span_cap)
        h = self.norm1(h + attn_out)  # (B, M, d)
        return self.norm2(h + self.ff(h)), z_t, L


class SpanTransformer(nn.Module):
    """Sequential transformer LM with fixed, adaptive or dynamic attention spans.

    Args:
        vocab_size, d_model, n_layers, n_heads, d_inner: sizes (paper small: 12 layers, 512, 8, 2048).
        attn_span: S, the maximum span.
        dropout: on attention probabilities and after the feed-forward ReLU.
        emb_dropout: on the embedding output and before the output projection (code default 0).
        span: "adaptive" (§2.2), "dynamic" (§2.2, z_t = S·σ(vᵀx_t + b)) or "fixed" (no mask).
        span_ramp: R; span_init: initial z'; dynamic_bias_init: b at init (paper: -4).
        chunk_size: query chunk of the exact band attention (see `span_attention`).
        span_trim: "head" (each head attends its own trimmed span; exact) or "layer" (the released
            code: every head of a layer attends the layer's largest span; the reference).
        attention: "sdpa" (one fused kernel per chunk, default), "eager" (the code's ops) or "flex"
            (compiled, evaluation); equal up to the code's renormalisation epsilon (see `attention`).
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        n_layers: int,
        n_heads: int,
        d_inner: int,
        attn_span: int,
        dropout: float,
        emb_dropout: float = 0.0,
        span: SpanKind = "adaptive",
        span_ramp: int = 32,
        span_init: float = 0.0,
        dynamic_bias_init: float = -4.0,
        chunk_size: int = 64,
        span_trim: SpanTrim = "head",
        attention: AttentionKernel = "sdpa",
    ) -> None:
        super().__init__()
        self.d_model, self.span = d_model, span
        self.in_emb = nn.Embedding(vocab_size, d_model)
        self.out_emb = nn.Linear(d_model, vocab_size)
        self.emb_dropout = nn.Dropout(emb_dropout)
        self.key_pe = nn.Parameter(torch.randn(d_model // n_heads, attn_span))  # (Dh, S)
        span_kwargs = dict(
            span=span,
            span_ramp=span_ramp,
            span_init=span_init,
            dynamic_bias_init=dynamic_bias_init,
            chunk_size=chunk_size,
            span_trim=span_trim,
            attention=attention,
        )
        self.layers = nn.ModuleList(
            SpanBlock(d_model, n_heads, d_inner, attn_span, dropout, **span_kwargs) for _ in range(n_layers)
        )

    def cache_sizes(self) -> list[int]:
        """Per layer, how many previous hidden states the next block needs."""
        return [layer.attn.cache_size() for layer in self.layers]

    def init_cache(self, batch_size: int, device: torch.device | None = None) -> SpanCache:
        """Zero caches (B, C_l, d), as in the code (these zeros are attended, not masked)."""
        return SpanCache.zeros(batch_size, self.cache_sizes(), self.d_model, device=device)

    def clamp_spans_(self) -> None:
        """Keep every z' in [0, 1] (after each optimizer step)."""
        for layer in self.layers:
            if layer.attn.adaptive_mask is not None:
                layer.attn.adaptive_mask.clamp_()

    def forward(self, x: Tensor, cache: SpanCache, span_cap: int | None = None) -> SpanTransformerOutput:
        """x: (B, M) token ids; cache: per layer (B, C_l, d) hidden states of the previous blocks;
        span_cap: None, or the farthest distance attended (`SpanAttention.forward`)."""
        if len(cache.h_cache) != len(self.layers):
            raise ValueError(f"cache has {len(cache.h_cache)} layers, the model {len(self.layers)}")
        h = self.emb_dropout(self.in_emb(x))  # (B, M, d)
        new_cache, spans, attended, penalties = [], [], [], []
        for layer, h_cache in zip(self.layers, cache.h_cache):
            # Sized before the layer runs, as in the code: the cache the next block will read.
            C_next = layer.attn.cache_size()
            new_cache.append(fifo_append(h_cache, h, capacity=C_next).kept)
            h, z_t, L = layer(h, h_cache, self.key_pe, span_cap)
            attended.append(L)
            mask = layer.attn.adaptive_mask
            if mask is not None:
                spans.append(mask.z.detach())
                penalties.append(mask.penalty())
            elif z_t is not None:  # (B, H, M)
                spans.append(z_t.detach().mean(dim=(0, 2)))
                penalties.append(z_t.mean())
        logits = self.out_emb(self.emb_dropout(h))  # (B, M, V)
        penalty = torch.stack(penalties).sum() if penalties else None
        return SpanTransformerOutput(logits, SpanCache(tuple(new_cache)), penalty, spans, attended)
