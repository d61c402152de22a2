"""Sequential multi-head attention over the S previous tokens (Sukhbaatar et al. 2019, §2.1 and §2.2).

Each query attends to the L most recent previous positions (never to itself, as in the released code
facebookresearch/adaptive-span), taken from the cache of earlier blocks' hidden states followed by the
current block. Logits are content q·k plus a learned key position embedding q·p_x (head_dim × S,
shared by all layers and heads). With a span mask (`AdaptiveMask`, `DynamicSpan`) L is trimmed to the
largest span of the layer plus the ramp, so the cost falls with the spans.

Trimming per head (`span_trim="head"`, adaptive spans): the released code trims per layer, so one long
head makes all heads of its layer attend (and project keys and values for) its span. Here heads with
the same trimmed length L_h (their own span + R, rounded up to 64 as in the code) form a group that
projects keys/values for, and attends to, its L_h previous positions only. The positions skipped have
mask exactly 0, so outputs and gradients equal the per-layer trimming up to the renormalisation's
1e-8 (and dropout, which draws its mask per group). The layer's cache is unchanged (largest span).

The band of L keys per query is computed exactly, block by block: queries are cut into chunks of c
positions, each chunk reads the L + c keys that cover its band, and the code's "skew" turns those
c × (L + c) content logits into the c × L band. c = M is the released code's formulation (cost
M·(M + L)); c = min(M, max(chunk_size, L)) costs M·(L + c), which is what makes small spans cheap.

`attention="sdpa"` (the default) runs each chunk's attention in one fused kernel
(`F.scaled_dot_product_attention` over the chunk's L + c keys): the position term q·p, the span mask as
an additive log-mask (log(m + 1e-30), see `_fused_band`) and −inf outside the band form its float
mask (skewed like the probabilities). softmax(s + log m) = m·e^s / Σ m·e^s is the code's masked, renormalised
softmax except for its epsilon: the code divides by Σ m·p + 1e-8 (p = the unmasked softmax), so it is
smaller by the factor 1 / (1 + 1e-8 / Σ m·p), a relative 1e-8 / Σ m·p (below 1e-7 while a tenth of the
probability falls inside the span; distance 1 always has m = 1). Attention dropout is applied by the
kernel to the normalised probabilities, as the code's dropout after the renormalisation: the same
distribution, another random stream. `"eager"` is the code's op-by-op computation.

`attention="flex"` (fixed and adaptive spans, evaluation) runs all M queries of a head group in one
compiled `flex_attention` over its L + M keys, the position logits and log-mask read per query and
distance from one table (`flex_band`); the same epsilon as "sdpa". A step that records a gradient
runs "sdpa" (said once in the log); the dynamic span, whose attended length changes every block,
refuses it.
"""

from __future__ import annotations

import math
from typing import Literal, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longctx.methods.adaptive_span.flex_band import band_flex_attention, band_table, log_mask
from longctx.methods.adaptive_span.mask import AdaptiveMask, DynamicSpan, renormalise
from longctx.methods.attention_kernel import AttentionKernel, check_attention_kernel, flex_or_sdpa

SpanKind = Literal["fixed", "adaptive", "dynamic"]
SpanTrim = Literal["layer", "head"]


def unskew(x: Tensor) -> Tensor:
    """(..., c, L + c) -> (..., c, L): row r keeps columns r .. r + L - 1 (its band)."""
    c, width = x.shape[-2:]
    L = width - c
    x = F.pad(x.flatten(-2), (0, c))  # (..., c·(L + c + 1))
    return x.view(*x.shape[:-1], c, L + c + 1)[..., :L]


def skew(x: Tensor, outside: float = 0.0) -> Tensor:
    """(..., c, L) -> (..., c, L + c): the inverse of `unskew`, `outside` outside the band."""
    c, L = x.shape[-2:]
    x = F.pad(x, (0, c + 1), value=outside).flatten(-2)  # (..., c·(L + c + 1))
    return x[..., : c * (L + c)].view(*x.shape[:-1], c, L + c)


def key_windows(x: Tensor, L: int, c: int) -> Tensor:
    """(B, H, L + n·c, Dh) -> (B, H, n, L + c, Dh): window j holds rows j·c .. j·c + L + c - 1.

    `x.unfold(2, L + c, c).transpose(-1, -2)`, built from views and one `cat` instead: inductor's backward
    of `unfold` with overlapping windows writes out of bounds on CPU (torch 2.13, heap corruption;
    pytorch/pytorch#171370), and this form is also a little faster in eager. With several chunks
    c >= L (see `band_attention`), so window j is block j followed by the first L rows of block j + 1.
    """
    n = (x.shape[2] - L) // c
    if n == 1:
        return x[:, :, None]
    if c < L:
        raise ValueError(f"several chunks need c >= L, got c={c}, L={L}")
    blocks = F.pad(x, (0, 0, 0, c - L)).view(*x.shape[:2], n + 1, c, x.shape[-1])  # (B, H, n + 1, c, Dh)
    return torch.cat([blocks[:, :, :n], blocks[:, :, 1:, :L]], dim=3)


def band_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_pe: Tensor,
    mask: Tensor | None,
    dropout: nn.Dropout,
    chunk_size: int,
    fused: bool = False,
) -> Tensor:
    """Attention of each query over its L previous keys, with position logits and a span mask.

    q: (B, H, M, Dh); k, v: (B, H, L + M, Dh), where query i sits at key index L + i and attends to
    keys i .. i + L - 1 (distances L .. 1); key_pe: (Dh, L), column t for distance L - t;
    mask: None, or broadcastable to (B, H, M, L) with dims (B|1, H, M|1, L); fused: one
    `scaled_dot_product_attention` per call with the log-mask (module docstring), else the code's
    ops. Returns (B, H, M, Dh).
    """
    B, H, M, Dh = q.shape
    L = k.shape[2] - M
    c = min(M, max(chunk_size, L))
    n = math.ceil(M / c)
    pad = n * c - M
    if pad:  # padded queries see only real keys before them and are dropped at the end
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    q = q.view(B, H, n, c, Dh)
    k = key_windows(k, L, c)  # (B, H, n, L + c, Dh): chunk j reads keys j·c .. j·c + L + c - 1
    v = key_windows(v, L, c)  # (B, H, n, L + c, Dh)
    position = q @ key_pe  # (B, H, n, c, L)
    if mask is not None:
        if mask.shape[2] > 1:
            mask = F.pad(mask, (0, 0, 0, pad)).reshape(mask.shape[0], H, n, c, L)
        else:
            mask = mask[:, :, None]  # (B|1, H, 1, 1, L)
    if fused:  # the log-mask of `flex_band.log_mask`
        out = _fused_band(q, k, v, position, mask, dropout)  # (B, H, n, c, Dh), the kernel's strides
        # reshape, not view: CUDA's fused kernels lay the output out as (B, c, H·n, Dh) in memory
        return out.reshape(B, H, n * c, Dh)[:, :, :M]
    content = unskew(q @ k.transpose(-1, -2))  # (B, H, n, c, L)
    logits = content + position  # (B, H, n, c, L); the softmax runs in float32 at least (bf16 autocast)
    probs = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)) / math.sqrt(Dh), dim=-1)
    if mask is not None:
        probs = renormalise(probs, mask)
    probs = dropout(probs).to(v.dtype)
    out = skew(probs) @ v  # (B, H, n, c, Dh)
    return out.view(B, H, n * c, Dh)[:, :, :M]


def cap_length(length: int, span_cap: int | None) -> int:
    """An attended length trimmed to the evaluation cap on the attended distance (None: no cap)."""
    return length if span_cap is None else min(length, span_cap)


def _fused_band(
    q: Tensor, k: Tensor, v: Tensor, position: Tensor, mask: Tensor | None, dropout: nn.Dropout
) -> Tensor:
    """The band attention of `band_attention`'s chunks in one fused kernel: (B, H, n, c, Dh).

    q: (B, H, n, c, Dh); k, v: (B, H, n, L + c, Dh) each chunk's keys; position: (B, H, n, c, L) the
    position logits q·p; mask: None or (B|1, H, n|1, c|1, L). The kernel's additive mask is
    position / √Dh + log m in the band, −inf outside it.
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    bias = position * scale
    if mask is not None:
        bias = bias + log_mask(mask, bias.dtype)
    dropout_p = dropout.p if dropout.training else 0.0
    # Chunks folded into the head dim: with 5-d inputs the kernel falls back to its unfused math path.
    B, H, n, c, Dh = q.shape
    q, k, v, bias = (t.reshape(B, H * n, *t.shape[-2:]) for t in (q, k, v, skew(bias, float("-inf"))))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=scale)
    return out.view(B, H, n, c, Dh)


def check_span_knobs(d_model: int, n_heads: int, span_kind: str, span_trim: str, attention: str) -> None:
    """One line naming a bad choice of a span layer's knobs (`SpanTransformer.Config` checks them, so a
    bad config fails before anything is built)."""
    check_attention_kernel(attention)
    if attention == "flex" and span_kind == "dynamic":
        raise ValueError(
            "attention 'flex' needs a fixed or adaptive span (the dynamic span's attended length "
            "changes every block, a compilation each): use 'sdpa' (fused) or 'eager'"
        )
    if d_model % n_heads:
        raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
    if span_kind not in ("fixed", "adaptive", "dynamic"):
        raise ValueError(f"span_kind must be 'fixed', 'adaptive' or 'dynamic', got {span_kind!r}")
    if span_trim not in ("layer", "head"):
        raise ValueError(f"span_trim must be 'layer' (the released code) or 'head', got {span_trim!r}")


class SpanAttentionConfig(Protocol):
    """What the attention reads of its network's Config (`SpanTransformer.Config`, which this file
    cannot import: the network imports it)."""

    d_model: int
    n_heads: int
    attn_span: int
    dropout: float
    span_kind: SpanKind
    span_ramp: int
    span_init: float
    dynamic_bias_init: float
    chunk_size: int
    span_trim: SpanTrim
    attention: AttentionKernel


class SpanAttention(nn.Module):
    """Multi-head attention over the previous S positions with a fixed, adaptive or dynamic span.

    Bias-free Q/K/V/O projections (as in the code). The knobs are the network's
    (`SpanTransformer.Config`: d_model, n_heads, attn_span S, dropout, span_kind, span_ramp R,
    span_init, dynamic_bias_init, chunk_size, span_trim, attention: "sdpa" fused, "eager" the code's
    ops or "flex" compiled at evaluation; see the module docstring). The caller passes the layer's
    cache of previous hidden states and the shared key position embedding.
    """

    def __init__(self, config: SpanAttentionConfig) -> None:
        super().__init__()
        c = config
        d_model, n_heads, attn_span = c.d_model, c.n_heads, c.attn_span
        self.attention = c.attention
        self.n_heads, self.head_dim, self.S = n_heads, d_model // n_heads, attn_span
        self.chunk_size, self.span_trim = c.chunk_size, c.span_trim
        self.proj_query = nn.Linear(d_model, d_model, bias=False)
        self.proj_key = nn.Linear(d_model, d_model, bias=False)
        self.proj_val = nn.Linear(d_model, d_model, bias=False)
        self.proj_out = nn.Linear(d_model, d_model, bias=False)
        self.dropout = nn.Dropout(c.dropout)
        self.adaptive_mask = (
            AdaptiveMask(n_heads, attn_span, c.span_ramp, c.span_init) if c.span_kind == "adaptive" else None
        )
        self.dynamic_span = (
            DynamicSpan(d_model, n_heads, attn_span, c.span_ramp, c.dynamic_bias_init)
            if c.span_kind == "dynamic"
            else None
        )

    def cache_size(self) -> int:
        """Previous hidden states to keep for the next block (trimmed only for adaptive spans)."""
        return self.adaptive_mask.cache_size() if self.adaptive_mask is not None else self.S

    def attended_length(self) -> int:
        """Previous positions attended now by an adaptive layer, S otherwise (dynamic: per block)."""
        return self.adaptive_mask.attended_length() if self.adaptive_mask is not None else self.S

    def _heads(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def head_groups(self, span_cap: int | None = None) -> list[tuple[int, list[int]]]:
        """Heads of an adaptive layer grouped by their own trimmed length L_h (at most `span_cap`):
        (L_h, heads), longest first."""
        groups: dict[int, list[int]] = {}
        for head, length in enumerate(self.adaptive_mask.head_attended_lengths()):
            groups.setdefault(cap_length(length, span_cap), []).append(head)
        return sorted(groups.items(), reverse=True)

    def forward(
        self, h: Tensor, h_cache: Tensor, key_pe: Tensor, span_cap: int | None = None
    ) -> tuple[Tensor, Tensor | None, int]:
        """h: (B, M, d) block; h_cache: (B, C, d) previous hidden states; key_pe: (Dh, S).

        span_cap: None, or the farthest distance any query may attend (an evaluation knob, see
        `AdaptiveSpanLM.eval_span_cap`): the attended length is trimmed to it, so the span mask is
        evaluated on distances 1..span_cap only (the mask times 1[x <= span_cap], then renormalised).
        Returns the output (B, M, d), the dynamic spans z_t (B, H, M) or None, and the attended length L
        (the layer's, i.e. its longest head's).
        """
        B, M, d = h.shape
        z_t = self.dynamic_span(h) if self.dynamic_span is not None else None
        L = self.dynamic_span.attended_length(z_t) if z_t is not None else self.attended_length()
        L = cap_length(L, span_cap)
        per_head = self.adaptive_mask is not None and self.span_trim == "head"
        groups = self.head_groups(span_cap) if per_head else []  # every L_h <= L
        C = h_cache.shape[1]
        # A cache shorter than the span is left-padded with zeros, as in the code (zero states give
        # zero keys and values: the projections have no bias).
        h_prev = h_cache[:, C - L :] if C >= L else F.pad(h_cache, (0, 0, L - C, 0))  # (B, L, d)
        h_all = torch.cat([h_prev, h], dim=1)  # (B, L + M, d)
        if len(groups) > 1:
            out = self._grouped_heads(h, h_all, key_pe, groups)  # (B, H, M, Dh)
            return self.proj_out(out.transpose(1, 2).reshape(B, M, d)), z_t, L
        q = self._heads(self.proj_query(h))
        k = self._heads(self.proj_key(h_all))
        v = self._heads(self.proj_val(h_all))
        if self.adaptive_mask is not None:
            mask = self.adaptive_mask.mask(L)[None, :, None, :]  # (1, H, 1, L)
        elif z_t is not None:
            mask = self.dynamic_span.mask(z_t, L)  # (B, H, M, L)
        else:
            mask = None
        out = self._band(q, k, v, key_pe[:, self.S - L :], mask)
        out = out.transpose(1, 2).reshape(B, M, d)
        return self.proj_out(out), z_t, L

    def _band(self, q: Tensor, k: Tensor, v: Tensor, key_pe: Tensor, mask: Tensor | None) -> Tensor:
        """`band_attention` on the layer's kernel; "flex" (compiled flex_attention over all M queries
        at once, `flex_band`) where the step records no gradient, else "sdpa" (logged once); inside
        a network compiled by torch.compile (`CompileNetwork`) "sdpa", which compiles."""
        kernel = flex_or_sdpa(self.attention, torch.is_grad_enabled() and q.requires_grad)
        if kernel == "flex" and not torch.compiler.is_compiling():
            scale = 1.0 / math.sqrt(q.shape[-1])
            table = band_table(q @ key_pe, mask, scale)
            return band_flex_attention(q, k, v, table.to(q.dtype), scale)
        return band_attention(q, k, v, key_pe, mask, self.dropout, self.chunk_size, kernel != "eager")

    def _grouped_heads(
        self, h: Tensor, h_all: Tensor, key_pe: Tensor, groups: list[tuple[int, list[int]]]
    ) -> Tensor:
        """Attention per group of heads over the group's own L_h previous positions: (B, H, M, Dh).

        h: (B, M, d); h_all: (B, L + M, d), L = the longest group's L_h; key_pe: (Dh, S).
        """
        B, M, _ = h.shape
        L, Dh, device = h_all.shape[1] - M, self.head_dim, h.device
        q_all = self.proj_query(h).view(B, M, self.n_heads, Dh)  # (B, M, H, Dh)
        w_key = self.proj_key.weight.view(self.n_heads, Dh, -1)  # (H, Dh, d): head h's output rows
        w_val = self.proj_val.weight.view(self.n_heads, Dh, -1)
        outs, order = [], []
        for L_h, heads in groups:
            idx = torch.tensor(heads, device=device)  # (Hg,)
            x = h_all[:, L - L_h :]  # (B, L_h + M, d): only the positions this group attends
            k = F.linear(x, w_key.index_select(0, idx).flatten(0, 1))  # (B, L_h + M, Hg·Dh)
            v = F.linear(x, w_val.index_select(0, idx).flatten(0, 1))
            k, v = (t.view(B, L_h + M, len(heads), Dh).transpose(1, 2) for t in (k, v))  # (B, Hg, ., Dh)
            q = q_all.index_select(2, idx).transpose(1, 2)  # (B, Hg, M, Dh)
            mask = self.adaptive_mask.mask(L_h).index_select(0, idx)[None, :, None, :]  # (1, Hg, 1, L_h)
            pe = key_pe[:, self.S - L_h :]  # (Dh, L_h)
            out = self._band(q, k, v, pe, mask)  # (B, Hg, M, Dh)
            outs.append(out)
            order += heads
        inverse = torch.argsort(torch.tensor(order, device=device))  # grouped order -> head order
        return torch.cat(outs, dim=1).index_select(1, inverse)  # (B, H, M, Dh)
