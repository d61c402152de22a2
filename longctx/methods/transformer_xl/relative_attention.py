"""Transformer-XL relative multi-head attention (Dai et al. 2019, §3.3; kimiyoung/transformer-xl
`pytorch/mem_transformer.py`, `RelPartialLearnableMultiHeadAttn`).

score(i, j) = [(q_i + u)·k_j + (q_i + v)·r_{i−j}] / √d_head, where r = W_R · sinusoid(i − j) and u, v
(the code's `r_w_bias`, `r_r_bias`) are shared by all layers. The position term is computed for all
query/position pairs at once and aligned with the keys by the "relative shift". As in the code: the
q/k/v/r/o projections have no bias; the sinusoid is [sin | cos] over positions klen−1 … 0 capped at
`clamp_len`; masked scores are −inf and the softmax runs in float32; post-LayerNorm by default, pre-LN
(LayerNorm on [memory, segment] before the projections, no LayerNorm after) as an option.

`attention="sdpa"` (the default) computes the same attention with one fused kernel,
`F.scaled_dot_product_attention`: the u term is folded into the query (q + u), and the position term
(the relative-shifted (q + v)·r, or TRAMS's gathered one), scaled and −inf on the blocked pairs, is
its additive float mask; no score or probability matrix is materialised besides that mask (on CPU,
where the kernel has no gradient for its mask, PyTorch runs SDPA's unfused math path when the mask
needs one, i.e. in training). It equals `"eager"` (the code's op-by-op form) to float rounding
(~1e-7 in float32; tests/methods/test_fused_attention.py).
The kernel applies attention dropout to the normalised probabilities, as the code's `dropatt` after
the softmax: the same distribution, a different random stream. Calls that need the probabilities
(`need_mass`, `need_weights`), windows where a query has no key (same_length 0: eager's NaN is
kept rather than the kernel's zeros) and code compiled by torch.compile run the eager path.

`attention="flex"` computes evaluation with compiled `flex_attention` (`flex_relative`): the position
term read per distance from the unshifted (q + v)·r table, the masks formed in its `score_mod`; the
same fallbacks as "sdpa", and a step that records a gradient runs "sdpa" (`attention_kernel`).

What a layer attends is its memory's answer, a `KeyWindow` (keys, values, their validity and
positions): Transformer-XL's [memory, segment] (`memory.py:XLSegment`), a TRAMS window of the pool
(`trams_pool.py:TramsSegment`), the Compressive Transformer's [compressed memory, memory, segment];
the attention knows nothing of where the keys came from.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longctx.methods.attention_kernel import (
    AttentionKernel,
    at_least_float32,
    check_attention_kernel,
    flex_or_sdpa,
    merge_heads,
    split_heads,
)
from longctx.methods.transformer_xl.flex_relative import distance_table, relative_flex_attention


def sinusoid_positions(
    klen: int,
    d_model: int,
    clamp_len: int = 0,
    device: torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """Sinusoid embeddings of positions klen−1, …, 0 (capped at clamp_len if > 0): (klen, d_model),
    sin block then cos block, inverse frequencies 1/10000^(2i/d) (the code's `PositionalEmbedding`)."""
    pos = torch.arange(klen - 1, -1, -1.0, device=device, dtype=torch.float32)
    if clamp_len > 0:
        pos = pos.clamp(max=clamp_len)
    inv_freq = 1.0 / (10000 ** (torch.arange(0.0, d_model, 2.0, device=device) / d_model))
    angles = pos[:, None] * inv_freq[None, :]  # (klen, d_model / 2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1).to(dtype or torch.get_default_dtype())


def rel_shift(x: Tensor) -> Tensor:
    """(..., n, W) -> (..., n, W): row i is shifted left by n − 1 − i.

    With column c of the input holding relative position W − 1 − c (the sinusoid order), entry (i, j)
    of the output is input (i, j + n − 1 − i): the score of query i (at window position W − n + i) and
    key j at distance W − n + i − j. Correct for j <= W − n + i (causal keys); the entries above are
    garbage that only the mask removes (as in the code).
    """
    *lead, n, W = x.shape
    x = F.pad(x, (1, 0))  # (..., n, W + 1)
    x = x.reshape(*lead, W + 1, n)[..., 1:, :]
    return x.reshape(*lead, n, W)


def window_blocked(key_valid: Tensor, n: int, same_length: int | None = None) -> Tensor:
    """(query, key) pairs of a window [memory (W − n), segment (n)] that may NOT attend: (B, H|1, n, W).

    key_valid: (B, H|1, W) whether a key exists (empty memory rows after a document reset are False);
    causal: key j <= W − n + i; same_length: additionally distance W − n + i − j < same_length, so
    every query sees the same number of keys, min(same_length, memory + i + 1) (the code's
    `same_length` mask with same_length = mem_len). Formed as the blocked pairs directly, what the
    attention masks with: one pass over the n × W pairs fewer than negating the allowed ones.
    """
    W = key_valid.shape[-1]
    i = torch.arange(n, device=key_valid.device)[:, None]
    j = torch.arange(W, device=key_valid.device)[None, :]
    dist = W - n + i - j  # (n, W)
    blocked = dist < 0
    if same_length is not None:
        blocked = blocked | (dist >= same_length)
    return ~key_valid[:, :, None, :] | blocked


class KeyWindow(NamedTuple):
    """The keys one layer's n queries attend, as its memory answers them: the seam between a memory
    type (`memory.py:SegmentMemory`) and the attention.

    k, v: (B, H, W, Dh) keys and values, the segment's n last; valid: (B, H|1, W) whether each key
    holds a token; same_length: the keys-per-query limit of `window_blocked`, or None.
    slots: None when the window is [memory, segment] itself, else (B, H, W) the slot of
    [memory, segment] (n_slots of them) each key comes from (a TRAMS window).
    true_positions: the position term at each key's own distance, n_slots − n + i − slots_j (TRAMS's
    "true" positions), else at the window's compact distances W − n + i − j.
    select: None, or the window to attend instead, chosen from this window's attention probabilities
    (B, H, n, W): a choice that depends on the queries (TRAMS's oracle).
    """

    k: Tensor
    v: Tensor
    valid: Tensor
    same_length: int | None = None
    slots: Tensor | None = None
    n_slots: int = 0
    true_positions: bool = False
    select: Callable[[Tensor], KeyWindow] | None = None

    def blocked(self, n: int) -> Tensor:
        """The (query, key) pairs that may not attend: (B, H|1, n, W)."""
        return window_blocked(self.valid, n, self.same_length)


@dataclass
class AttentionOutput:
    """out: (B, n, d) layer output; window: the `KeyWindow` attended; mem_mass: mean over (B, H, n) of
    the probability on the keys before the segment's (None unless asked); probs: (B, H, n, W) and
    heads: (B, H, n, Dh) per-head attention vectors (only with `need_weights`)."""

    out: Tensor
    window: KeyWindow
    mem_mass: Tensor | None = None
    probs: Tensor | None = None
    heads: Tensor | None = None


class AttentionConfig(Protocol):
    """What the attention reads of its network's Config (`TransformerXL.Config`, which this file cannot
    import: the network imports it)."""

    d_model: int
    n_heads: int
    dropout: float
    dropatt: float
    pre_lnorm: bool
    layer_norm_eps: float
    attention: AttentionKernel

    @property
    def head_dim(self) -> int: ...


class RelMultiHeadAttention(nn.Module):
    """One XL attention sub-layer, with its residual and LayerNorm (the code's `dec_attn`).

    config: the network's Config; its `attention`: "sdpa" (fused, default), "eager" (op by op, as the
    code) or "flex" (compiled, evaluation), see the module docstring.
    """

    def __init__(self, config: AttentionConfig) -> None:
        super().__init__()
        check_attention_kernel(config.attention)
        self.attention = config.attention
        d_model, self.n_heads, self.d_head = config.d_model, config.n_heads, config.head_dim
        self.pre_lnorm = config.pre_lnorm
        self.qkv_net = nn.Linear(d_model, 3 * self.n_heads * self.d_head, bias=False)
        self.r_net = nn.Linear(d_model, self.n_heads * self.d_head, bias=False)
        self.o_net = nn.Linear(self.n_heads * self.d_head, d_model, bias=False)
        self.layer_norm = nn.LayerNorm(d_model, eps=config.layer_norm_eps)
        self.drop = nn.Dropout(config.dropout)
        self.dropatt = nn.Dropout(config.dropatt)
        self.scale = 1.0 / math.sqrt(self.d_head)

    def query_weight(self) -> Tensor:
        """Each head's query projection W_Q⁽ʰ⁾: (H, Dh, D)."""
        return self._projection_weight(0)

    def key_weight(self) -> Tensor:
        """Each head's key projection W_K⁽ʰ⁾: (H, Dh, D) (k = W_K⁽ʰ⁾ h of a layer input h)."""
        return self._projection_weight(1)

    def value_weight(self) -> Tensor:
        """Each head's value projection W_V⁽ʰ⁾: (H, Dh, D)."""
        return self._projection_weight(2)

    def _projection_weight(self, block: int) -> Tensor:
        """Block `block` of `qkv_net`'s [W_Q; W_K; W_V] rows (the code's layout), per head: (H, Dh, D),
        a view (gradients reach `qkv_net.weight`)."""
        HD = self.n_heads * self.d_head
        return self.qkv_net.weight[block * HD : (block + 1) * HD].view(self.n_heads, self.d_head, -1)

    def project_kv(self, states: Tensor) -> Tensor:
        """Keys and values (2, B, H, T, Dh) of layer inputs `states` (B, T, d), as this layer projects
        its memory and segment (LayerNorm first under pre-LN): what a memory attends and caches."""
        B, T, _ = states.shape
        states_in = self.layer_norm(states) if self.pre_lnorm else states
        kv = F.linear(states_in, self.qkv_net.weight[self.n_heads * self.d_head :])  # (B, T, 2·H·Dh)
        return kv.view(B, T, 2, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)

    def _positions(self, pos_emb: Tensor, W: int) -> Tensor:
        """Projected relative positions W−1 … 0: (H, W, Dh) (pos_emb holds positions klen−1 … 0)."""
        return split_heads(self.r_net(pos_emb[pos_emb.shape[0] - W :]), self.n_heads)

    def _by_distance(self, qv: Tensor, window: KeyWindow, pos_emb: Tensor) -> Tensor:
        """qv·r of every query and distance W−1 … 0 of a compact window, unshifted: (B, H, n, W)
        (qv: the queries plus v, (B, H, n, Dh))."""
        return qv @ self._positions(pos_emb, window.k.shape[2]).transpose(-1, -2)

    def _position_term(self, qv: Tensor, window: KeyWindow, pos_emb: Tensor) -> Tensor:
        """(b) + (d): qv·r of every query and key (B, H, n, W), the relative shift of `_by_distance`,
        or at the keys' true distances (gathered from the shifted term over all n_slots slots)."""
        if not window.true_positions:
            return rel_shift(self._by_distance(qv, window, pos_emb))
        r = self._positions(pos_emb, window.n_slots)
        by_slot = rel_shift(qv @ r.transpose(-1, -2))  # (B, H, n, P + n)
        return by_slot.gather(3, window.slots[:, :, None, :].expand(-1, -1, qv.shape[2], -1))

    def _scores(self, q: Tensor, window: KeyWindow, pos_emb: Tensor, u: Tensor, v: Tensor) -> Tensor:
        """A^rel / √Dh = [(q + u)·k + (q + v)·r] / √Dh, the code's op order: (B, H, n, W)."""
        ac = (q + u[:, None, :]) @ window.k.transpose(-1, -2)
        return (ac + self._position_term(q + v[:, None, :], window, pos_emb)) * self.scale

    def _softmax(self, q: Tensor, window: KeyWindow, pos_emb: Tensor, u: Tensor, v: Tensor) -> Tensor:
        """softmax over the keys of the scores, −inf where blocked, in at least float32: (B, H, n, W)."""
        scores = at_least_float32(self._scores(q, window, pos_emb, u, v))
        return torch.softmax(scores.masked_fill(window.blocked(q.shape[2]), float("-inf")), dim=-1)

    def _fused(self, q: Tensor, window: KeyWindow, pos_emb: Tensor, u: Tensor, v: Tensor) -> Tensor:
        """softmax([(q + u)·k + (q + v)·r] / √Dh, −inf where blocked) @ v by one fused kernel:
        (B, H, n, Dh). The position term enters as the kernel's additive mask, the scale folded into
        the (B, H, n, Dh) queries, −inf where blocked (the relative shift's garbage above the diagonal
        included, as in eager)."""
        bias = self._position_term((q + v[:, None, :]) * self.scale, window, pos_emb)
        bias.masked_fill_(window.blocked(q.shape[2]), float("-inf"))  # a fresh tensor: filled in place
        dropout_p = self.dropatt.p if self.training else 0.0
        return F.scaled_dot_product_attention(
            q + u[:, None, :],
            window.k,
            window.v,
            attn_mask=bias.to(q.dtype),
            dropout_p=dropout_p,
            scale=self.scale,
        )

    def _flex(self, q: Tensor, window: KeyWindow, pos_emb: Tensor, u: Tensor, v: Tensor) -> Tensor:
        """The attention of `_fused` by compiled `flex_attention` (evaluation): (B, H, n, Dh).

        The position term of a compact window enters unshifted, as the table ((q + v) / √Dh)·r of
        each query and distance that the kernel reads per pair, the causal and same_length masks as
        its −inf columns (`distance_table`); at true positions as the term of each (query, key) with
        every mask as −inf; missing keys are masked by the kernel."""
        qv = (q + v[:, None, :]) * self.scale  # the scale folded into the queries, as in `_fused`
        if not window.true_positions:
            table = distance_table(self._by_distance(qv, window, pos_emb), window.same_length)
            # A key missing (after a document reset): checked by the kernel (one more graph).
            checked = None if window.valid.all() else window.valid
        else:
            table = self._position_term(qv, window, pos_emb).masked_fill(
                window.blocked(q.shape[2]), float("-inf")
            )
            checked = None
        by_distance = not window.true_positions
        return relative_flex_attention(
            q + u[:, None, :], window.k, window.v, table.to(q.dtype), checked, self.scale, by_distance
        )

    def _kernel(self, q: Tensor, window: KeyWindow, need_probs: bool) -> AttentionKernel:
        """The kernel this call runs: eager when the probabilities are asked for, when a query has no
        key (same_length 0: eager's NaN kept) and under torch.compile (compiling the fused path's
        training graph did not finish in 20 min on the 2-core CPU; eager's: about 2 min)."""
        if (
            self.attention == "eager"
            or need_probs
            or window.same_length == 0
            or torch.compiler.is_compiling()
        ):
            return "eager"
        return flex_or_sdpa(self.attention, torch.is_grad_enabled() and q.requires_grad)

    def forward(
        self,
        x: Tensor,
        window: KeyWindow,
        pos_emb: Tensor,
        u: Tensor,
        v: Tensor,
        need_mass: bool = False,
        need_weights: bool = False,
    ) -> AttentionOutput:
        """x: (B, n, d) the segment; window: the keys it attends (its memory's answer, see `KeyWindow`);
        pos_emb: (klen, d) sinusoid of positions klen−1 … 0 (klen >= W, and >= the window's n_slots);
        u, v: (H, Dh) the content and position biases (the code's r_w_bias, r_r_bias); need_mass: the
        mean probability on the keys before the segment's; need_weights: the probabilities and the
        per-head vectors (both run the eager ops)."""
        n = x.shape[1]
        x_in = self.layer_norm(x) if self.pre_lnorm else x
        q = split_heads(F.linear(x_in, self.qkv_net.weight[: self.n_heads * self.d_head]), self.n_heads)
        if window.select is not None:  # the window its queries' attention chooses
            window = window.select(self._softmax(q, window, pos_emb, u, v))
        kernel, probs = self._kernel(q, window, need_mass or need_weights), None
        if kernel == "flex":
            attn = self._flex(q, window, pos_emb, u, v)  # (B, H, n, Dh)
        elif kernel == "sdpa":
            attn = self._fused(q, window, pos_emb, u, v)  # (B, H, n, Dh)
        else:
            probs = self._softmax(q, window, pos_emb, u, v)  # (B, H, n, W)
            attn = self.dropatt(probs).to(window.v.dtype) @ window.v  # (B, H, n, Dh)
        out = self.drop(self.o_net(merge_heads(attn)))  # (B, n, d)
        out = x + out if self.pre_lnorm else self.layer_norm(x + out)
        mem_mass = probs[..., : window.k.shape[2] - n].sum(-1).mean() if need_mass else None
        weights = (probs, attn) if need_weights else (None, None)
        return AttentionOutput(out, window, mem_mass, *weights)
