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
needs one, i.e. in training). It equals
`"eager"` (the code's op-by-op form) to float rounding (~1e-7 in float32; tests/test_fused_attention.py).
The kernel applies attention dropout to the normalised probabilities, as the code's `dropatt` after
the softmax: the same distribution, a different random stream. Calls that need the probabilities
(`need_mass`, `need_weights`), windows where a query has no key (same_length 0: eager's NaN is
kept rather than the kernel's zeros) and code compiled by torch.compile run the eager path.

`attention="flex"` computes evaluation with compiled `flex_attention` (`flex_relative`): the position
term read per distance from the unshifted (q + v)·r table, the masks formed in its `score_mod`; the
same fallbacks as "sdpa", and a step that records a gradient runs "sdpa" (`attention_kernel`).

A layer can also attend to a TRAMS-selected window of its memory (`longctx.methods.transformer_xl.trams`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longctx.methods.attention_kernel import AttentionKernel, check_attention_kernel, flex_or_sdpa
from longctx.methods.transformer_xl.flex_relative import distance_table, relative_flex_attention
from longctx.methods.transformer_xl.memory import XLMemory
from longctx.methods.transformer_xl.trams import (
    TramsSelection,
    TramsSettings,
    gather_rows,
    oracle_scores,
    select_windows,
    trams_scores,
    window_index,
)


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
    """The keys a segment's n queries attend: [memory (or its TRAMS-selected window), segment].

    k, v: (B, H, W, Dh); valid: (B, H|1, W) whether each key holds a token; r: (H, W, Dh) the
    projected relative positions W−1 … 0 (the position term is rel_shift((q + v)·r)), or None when
    bd is given; bd: (B, H, n, W) the position term itself (TRAMS's true positions), else None;
    same_length: the keys-per-query limit of `window_blocked`, or None.
    """

    k: Tensor
    v: Tensor
    valid: Tensor
    r: Tensor | None
    bd: Tensor | None
    same_length: int | None

    def blocked(self, n: int) -> Tensor:
        """The (query, key) pairs that may not attend: (B, H|1, n, W)."""
        return window_blocked(self.valid, n, self.same_length)


@dataclass
class AttentionOutput:
    """out: (B, n, d) layer output; mem_mass: mean over (B, H, n) of the probability on the attended
    memory keys (None unless asked); selected: (B, H, k) TRAMS-selected pool indices or None; pool,
    kept: the pool's slots P and kept block under TRAMS (for `window`); probs: (B, H, n, W) and
    heads: (B, H, n, Dh) per-head attention vectors (only with `need_weights`); kv: keys [0] and
    values [1] of [memory, segment] (2, B, H, P + n, Dh) before any selection (for a key/value
    cache); score: TRAMS scores of the memory's P slots (B, H, P) when `need_score` scored them (to
    start the score cache)."""

    out: Tensor
    mem_mass: Tensor | None = None
    selected: Tensor | None = None
    pool: int = 0
    kept: int = 0
    probs: Tensor | None = None
    heads: Tensor | None = None
    kv: Tensor | None = None
    score: Tensor | None = None

    @property
    def window(self) -> Tensor | None:
        """(B, H, W) the attended positions in [pool, segment] under TRAMS, else None (computed on
        demand: the forward needs only the selected slots)."""
        if self.selected is None:
            return None
        return window_index(self.selected, self.pool, self.kept, self.out.shape[1])


class RelMultiHeadAttention(nn.Module):
    """One XL attention sub-layer, with its residual and LayerNorm (the code's `dec_attn`).

    attention: "sdpa" (fused, default), "eager" (op by op, as the code) or "flex" (compiled, evaluation);
    see the module docstring.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_head: int,
        dropout: float,
        dropatt: float = 0.0,
        pre_lnorm: bool = False,
        layer_norm_eps: float = 1e-5,
        attention: AttentionKernel = "sdpa",
    ) -> None:
        super().__init__()
        check_attention_kernel(attention)
        self.attention = attention
        self.n_heads, self.d_head, self.pre_lnorm = n_heads, d_head, pre_lnorm
        self.qkv_net = nn.Linear(d_model, 3 * n_heads * d_head, bias=False)
        self.r_net = nn.Linear(d_model, n_heads * d_head, bias=False)
        self.o_net = nn.Linear(n_heads * d_head, d_model, bias=False)
        self.layer_norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.drop = nn.Dropout(dropout)
        self.dropatt = nn.Dropout(dropatt)
        self.scale = 1.0 / math.sqrt(d_head)

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

    def _heads(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, Dh)

    def project_kv(self, states: Tensor) -> Tensor:
        """Keys and values (2, B, H, T, Dh) of layer inputs `states` (B, T, d), as this layer projects
        its memory and segment (LayerNorm first under pre-LN): what a key/value cache holds for them."""
        states_in = self.layer_norm(states) if self.pre_lnorm else states
        return self._kv_heads(F.linear(states_in, self.qkv_net.weight[self.n_heads * self.d_head :]))

    def _kv_heads(self, x: Tensor) -> Tensor:
        """Projected keys and values (B, T, 2·H·Dh) -> (2, B, H, T, Dh), a view."""
        B, T, _ = x.shape
        return x.view(B, T, 2, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)

    def _positions(self, pos_emb: Tensor, W: int) -> Tensor:
        """Projected relative positions W−1 … 0: (H, W, Dh) (pos_emb holds positions klen−1 … 0)."""
        r = self.r_net(pos_emb[pos_emb.shape[0] - W :])
        return r.view(W, self.n_heads, self.d_head).transpose(0, 1)

    def _scores(self, q: Tensor, window: KeyWindow, u: Tensor, vb: Tensor) -> Tensor:
        """(q + u)·k + rel_shift((q + v)·r), or + bd when the position term is given: (B, H, n, W)."""
        ac = (q + u[:, None, :]) @ window.k.transpose(-1, -2)
        bd = window.bd
        if bd is None:
            bd = rel_shift((q + vb[:, None, :]) @ window.r.transpose(-1, -2))
        return (ac + bd) * self.scale

    def _fused(self, q: Tensor, window: KeyWindow, u: Tensor, vb: Tensor) -> Tensor:
        """softmax([(q + u)·k + bd] / √Dh, −inf where blocked) @ v by one fused kernel: (B, H, n, Dh).

        bd: the window's position term (B, H, n, W), else rel_shift((q + v)·r) (its garbage above the
        diagonal is blocked, as in eager); it enters as the kernel's additive mask, scaled, −inf where
        blocked.
        """
        if window.bd is None:  # the scale folded into the (B, H, n, Dh) queries rather than the scores
            bias = rel_shift(((q + vb[:, None, :]) * self.scale) @ window.r.transpose(-1, -2))
        else:
            bias = window.bd * self.scale
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

    def _flex(self, q: Tensor, window: KeyWindow, u: Tensor, vb: Tensor) -> Tensor:
        """The attention of `_fused` by compiled `flex_attention` (evaluation): (B, H, n, Dh).

        The position term enters unshifted, as the table ((q + v) / √Dh)·r of each query and
        distance that the kernel reads per pair, the causal and same_length masks as its −inf
        columns (`distance_table`), or bd / √Dh when given (TRAMS's true positions) with every mask
        as −inf; missing keys are masked by the kernel."""
        if window.bd is None:  # the scale folded into the (B, H, n, Dh) queries, as in `_fused`
            position = ((q + vb[:, None, :]) * self.scale) @ window.r.transpose(-1, -2)
            table = distance_table(position, window.same_length)
            # A key missing (after a document reset): checked by the kernel (one more graph).
            checked = None if window.valid.all() else window.valid
        else:
            table = (window.bd * self.scale).masked_fill(window.blocked(q.shape[2]), float("-inf"))
            checked = None
        return relative_flex_attention(
            q + u[:, None, :], window.k, window.v, table.to(q.dtype), checked, self.scale, window.bd is None
        )

    @staticmethod
    def _softmax(scores: Tensor, blocked: Tensor) -> Tensor:
        scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
        return torch.softmax(scores.masked_fill(blocked, float("-inf")), dim=-1)

    def forward(
        self,
        x: Tensor,
        mem: Tensor,
        mem_valid: Tensor,
        pos_emb: Tensor,
        r_w_bias: Tensor,
        r_r_bias: Tensor,
        same_length: int | None = None,
        trams: TramsSettings | None = None,
        need_mass: bool = False,
        need_weights: bool = False,
        mem_kv: Tensor | None = None,
        mem_score: Tensor | None = None,
        need_score: bool = False,
        extend: Callable[[str, Tensor, Tensor], Tensor] | None = None,
        selection: TramsSelection | None = None,
    ) -> AttentionOutput:
        """x: (B, n, d) segment; mem: (B, P, d) memory (P may be 0); mem_valid: (B, P) bool;
        pos_emb: (klen >= P + n, d) sinusoid of positions klen−1 … 0; r_w_bias, r_r_bias: (H, Dh);
        same_length: keys per query limit (see `window_blocked`); trams: attend to a TRAMS window of
        the memory (at most `trams.attended` keys) instead of all of it; mem_kv: the memory's keys
        and values (2, B, H, P, Dh) when cached (evaluation), else they are projected from mem;
        mem_score: the TRAMS scores (B, H, P) of the cached keys `mem_kv[0]` (the score cache), else
        the selectable slots are scored now; need_score: without `mem_score`, score all P memory
        slots and return them (`AttentionOutput.score`, to start the score cache; the segment's keys
        are scored by the network, all layers at once); extend: how the cached memory's keys and
        values are joined with the segment's, extend(field, memory's, segment's) (the network's
        `SlotAppender`, in place), else `XLMemory.SLOTS.cat`; selection: this layer's TRAMS window when the
        network selected every layer's from the score cache (`trams.select_windows`), else it is
        selected here."""
        B, n, _ = x.shape
        P = mem.shape[1]
        HD = self.n_heads * self.d_head
        w_q, w_kv = self.qkv_net.weight[:HD], self.qkv_net.weight[HD:]
        x_in = self.layer_norm(x) if self.pre_lnorm else x
        q = self._heads(F.linear(x_in, w_q))  # (B, H, n, Dh); the code also projects the memory's queries
        join = extend or XLMemory.SLOTS.cat
        if mem_kv is not None:
            kv = join("kv", mem_kv, self._kv_heads(F.linear(x_in, w_kv)))
        else:
            kv = self.project_kv(torch.cat([mem, x], dim=1) if P else x)  # of (B, P + n, d)
        key_valid = torch.cat([mem_valid, mem_valid.new_ones(B, n)], dim=1)[:, None, :]  # (B, 1, P + n)
        score = mem_score  # (B, H, P): each slot scored once, when it enters the pool (the score cache)
        if need_score and mem_score is None:
            if trams is None or not trams.scores_cacheable:
                raise ValueError("need_score needs TRAMS with the 'code' or 'paper' metric")
            # Slots without a token score −inf: never preferred to real ones.
            score = trams_scores(kv[0, :, :, :P], self.query_weight(), trams.metric)
            score = score.masked_fill(~key_valid[..., :P], float("-inf"))
        selected = None
        # kv[0], kv[1]: (B, H, P + n, Dh) each; kv is what a key/value cache keeps
        window = KeyWindow(kv[0], kv[1], key_valid, None, None, same_length)
        if trams is not None and P > 0:
            selected, window = self._trams_window(
                q, kv, key_valid, pos_emb, r_w_bias, r_r_bias, trams, same_length, score, selection
            )
        W = window.k.shape[2]
        if window.bd is None:
            window = window._replace(r=self._positions(pos_emb, W))
        probs = mem_mass = None
        # Under torch.compile the eager ops are compiled (inductor fuses them): compiling the fused
        # path's training graph did not finish in 20 min on the 2-core CPU (eager's: about 2 min).
        fused = self.attention != "eager" and not torch.compiler.is_compiling()
        kernel = "eager"
        if fused and not (need_mass or need_weights) and window.same_length != 0:
            kernel = flex_or_sdpa(self.attention, torch.is_grad_enabled() and q.requires_grad)
        if kernel == "flex":
            attn = self._flex(q, window, r_w_bias, r_r_bias)  # (B, H, n, Dh)
        elif kernel == "sdpa":
            attn = self._fused(q, window, r_w_bias, r_r_bias)  # (B, H, n, Dh)
        else:
            scores = self._scores(q, window, r_w_bias, r_r_bias)  # (B, H, n, W)
            probs = self._softmax(scores, window.blocked(n))  # (B, H, n, W)
            mem_mass = probs[..., : W - n].sum(-1).mean() if need_mass else None
            attn = self.dropatt(probs).to(window.v.dtype) @ window.v  # (B, H, n, Dh)
        out = self.drop(self.o_net(attn.transpose(1, 2).reshape(B, n, -1)))
        out = x + out if self.pre_lnorm else self.layer_norm(x + out)
        return AttentionOutput(
            out=out,
            mem_mass=mem_mass,
            selected=selected,
            pool=P,
            kept=min(trams.kept, P) if trams is not None else 0,
            probs=probs if need_weights else None,
            heads=attn if need_weights else None,
            kv=kv,
            score=score if need_score and mem_score is None else None,
        )

    def _trams_window(
        self,
        q: Tensor,
        kv: Tensor,
        key_valid: Tensor,
        pos_emb: Tensor,
        u: Tensor,
        vb: Tensor,
        trams: TramsSettings,
        same_length: int | None,
        score: Tensor | None = None,
        selection: TramsSelection | None = None,
    ) -> tuple[Tensor, KeyWindow]:
        """Select the attended window [selected, kept, segment] of the pool (per batch row and head).

        score: the slots' TRAMS scores (B, H, >= P − kept), −inf where a slot holds no token, when
        known (the score cache), else the selectable slots are scored here; selection: the window
        already selected (from the score cache, by the network). Returns the selected pool
        indices (B, H, k) and the `KeyWindow`: keys, values (B, H, W, Dh), key validity (B, H, W),
        for true positions the position term bd (B, H, n, W) (None for compact positions: the caller
        projects the last W sinusoid rows as r), and same_length m (the attended keys) if set. The
        window's keys and values are one `index_select` of their W rows each (`gather_rows`), from
        the cache's buffer or this segment's projection: on CPU faster than gathering the k selected
        rows and concatenating the kept block.
        """
        n = q.shape[2]
        k = kv[0]  # (B, H, P + n, Dh)
        P = k.shape[2] - n
        n_selectable = max(P - trams.kept, 0)  # the older slots; [n_selectable:] = kept + segment
        full_bd = None
        if trams.positions == "true" or trams.metric == "oracle":
            r_full = self._positions(pos_emb, P + n)
            full_bd = rel_shift((q + vb[:, None, :]) @ r_full.transpose(-1, -2))  # (B, H, n, P + n)
        if selection is None:
            if trams.metric == "oracle":
                pool = KeyWindow(k, kv[1], key_valid, None, full_bd, same_length)
                probs = self._softmax(self._scores(q, pool, u, vb), pool.blocked(n))
                metric = oracle_scores(probs, n_selectable)
            elif score is not None:  # cached: already −inf where a slot holds no token
                metric = score[..., :n_selectable]
            else:
                metric = trams_scores(k[:, :, :n_selectable], self.query_weight(), trams.metric)
            if score is None:  # missing slots (empty memory of a reset row) are never preferred
                metric = metric.masked_fill(~key_valid[..., :n_selectable], float("-inf"))
            selection = select_windows(metric, key_valid[:, 0], trams, n)
        selected, rows, valid_w = selection  # rows: (B, H, W) the window's positions in [pool, segment]
        k_w, v_w = gather_rows(rows, kv)  # one index_select for both, the kept block included
        bd = None
        if trams.positions == "true":
            bd = full_bd.gather(3, rows[:, :, None, :].expand(-1, -1, n, -1))
        window_same_length = trams.attended if same_length is not None else None
        return selected, KeyWindow(k_w, v_w, valid_w, None, bd, window_same_length)
