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

from longctx.core.knob_groups import check_probabilities, check_sizes
from longctx.methods.adaptive_span.attention import SpanAttention, SpanKind, SpanTrim, check_span_knobs
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


@dataclass(frozen=True)
class SpanTransformerConfig:
    """The span network's knobs, their one source (`SpanTransformer.Config`).

    d_model, n_layers, n_heads, d_inner: sizes (paper small: 512, 12, 8, 2048; large: 768, 24, 8, 4096).
    attn_span: S, the maximum span (paper: 8192).
    dropout: on attention probabilities and after the feed-forward ReLU (paper: 0.3 small, 0.4 large).
    emb_dropout: on the embedding output and before the output projection (code default 0).
    span_kind: "adaptive" (§2.2, a learned span per head), "dynamic" (§2.2, z_t = S·σ(vᵀx_t + b)) or
        "fixed" (no mask, the paper's fixed-span comparison).
    span_ramp: R, the ramp length (paper: 32); span_init: initial z' (code: 0); dynamic_bias_init: b
        at init for dynamic spans (paper: -4).
    chunk_size: query chunk of the exact band attention (the cost is M·(L + chunk); `attention`).
    span_trim: "head": each head attends (and projects keys/values for) its own trimmed span, so the
        cost follows every head's span; "layer": the released code's per-layer trimming, where the
        longest head sets the cost of its layer. Equal outputs (the skipped mask is exactly 0).
    attention: "sdpa" (one fused kernel per chunk, default), "eager" (the released code's ops) or
        "flex" (compiled flex_attention at evaluation, sdpa in training; not with the dynamic span);
        equal up to the code's renormalisation epsilon (see `attention`).
    """

    d_model: int = 512
    n_layers: int = 12
    n_heads: int = 8
    d_inner: int = 2048
    attn_span: int = 8192
    dropout: float = 0.3
    emb_dropout: float = 0.0
    span_kind: SpanKind = "adaptive"
    span_ramp: int = 32
    span_init: float = 0.0
    dynamic_bias_init: float = -4.0
    chunk_size: int = 64
    span_trim: SpanTrim = "head"
    attention: AttentionKernel = "sdpa"

    def __post_init__(self) -> None:
        check_sizes(self, "d_model", "n_layers", "n_heads", "d_inner")
        check_probabilities(self, "dropout", "emb_dropout")
        if self.attn_span <= 0 or self.span_ramp < 0 or self.chunk_size <= 0:
            raise ValueError(
                f"attn_span ({self.attn_span}) and chunk_size ({self.chunk_size}) must be positive and "
                f"span_ramp ({self.span_ramp}) >= 0"
            )
        check_span_knobs(self.d_model, self.n_heads, self.span_kind, self.span_trim, self.attention)

    def build(self, vocab_size: int) -> SpanTransformer:
        return SpanTransformer(vocab_size, self)


class SpanBlock(nn.Module):
    """Post-LN block (code: `TransformerSeqLayer`): h = LN(h + Attn(h, [h_cache, h])); h = LN(h + FF(h))."""

    def __init__(self, config: SpanTransformerConfig) -> None:
        super().__init__()
        c = config
        self.attn = SpanAttention(c)
        self.norm1 = nn.LayerNorm(c.d_model)
        self.ff = FeedForward(c.d_model, c.d_inner, c.dropout)
        self.norm2 = nn.LayerNorm(c.d_model)

    def forward(
        self, h: Tensor, h_cache: Tensor, key_pe: Tensor, span_cap: int | None = None
    ) -> tuple[Tensor, Tensor | None, int]:
        attn_out, z_t, L = self.attn(h, h_cache, key_pe, span_cap)
        h = self.norm1(h + attn_out)  # (B, M, d)
        return self.norm2(h + self.ff(h)), z_t, L


class SpanTransformer(nn.Module):
    """Sequential transformer LM with fixed, adaptive or dynamic attention spans.

    `SpanTransformer(vocab_size, config)` with a `SpanTransformer.Config` (its fields document the
    knobs; or `config.build(vocab_size)`).
    """

    Config = SpanTransformerConfig

    def __init__(self, vocab_size: int, config: SpanTransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.d_model = config.d_model
        self.in_emb = nn.Embedding(vocab_size, config.d_model)
        self.out_emb = nn.Linear(config.d_model, vocab_size)
        self.emb_dropout = nn.Dropout(config.emb_dropout)
        self.key_pe = nn.Parameter(torch.randn(config.d_model // config.n_heads, config.attn_span))  # (Dh, S)
        self.layers = nn.ModuleList(SpanBlock(config) for _ in range(config.n_layers))

    def cache_sizes(self) -> list[int]:
        """Per layer, how many previous hidden states the next block needs."""
        return [layer.attn.cache_size() for layer in self.layers]

    def init_cache(self, batch_size: int, device: torch.device | None = None) -> SpanCache:
        """Zero caches (B, C_l, d), as in the code (these zeros are attended, not masked)."""
        return SpanCache.empty(batch_size, sizes=self.cache_sizes(), d_model=self.d_model, device=device)

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
