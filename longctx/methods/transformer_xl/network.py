"""The Transformer-XL network (Dai et al. 2019; kimiyoung/transformer-xl `pytorch/mem_transformer.py`,
`MemTransformerLM` with `attn_type=0`).

Adaptive input -> dropout -> n_layers × [relative attention over (memory, segment), position-wise
feed-forward] -> dropout -> (adaptive) softmax. As in the code: u and v (`r_w_bias`, `r_r_bias`) are
shared by all layers (one pair per layer with `untie_r`, as Hugging Face's transfo-xl-wt103); the
sinusoid position embeddings go through the same dropout as the
embeddings; each layer's memory holds its inputs (`memory.py`); post-LN blocks (pre-LN an
option); initialisation N(0, init_std) for weights, embeddings, cluster weights and u, v,
N(0, proj_init_std) for adaptive projections, N(1, init_std) for LayerNorm weights, zero biases.

`mem_len` = 0 is the Transformer+RPE baseline of TRAMS (the same network without memory).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longctx.core.knob_groups import check_probabilities, check_sizes
from longctx.methods.attention_kernel import AttentionKernel, check_attention_kernel
from longctx.methods.transformer_xl.adaptive_softmax import (
    AdaptiveEmbedding,
    ProjectedAdaptiveLogSoftmax,
    cutoffs_within,
)
from longctx.methods.transformer_xl.memory import SegmentMemory, XLMemory, XLSegment
from longctx.methods.transformer_xl.relative_attention import (
    AttentionOutput,
    KeyWindow,
    RelMultiHeadAttention,
    sinusoid_positions,
)
from longctx.methods.transformer_xl.trams import TramsSettings
from longctx.methods.transformer_xl.trams_pool import TramsSegment


@dataclass(frozen=True)
class TransformerXLConfig:
    """Transformer-XL's network knobs, their one source (`TransformerXL.Config`).

    n_layers, d_model, n_heads, d_inner: sizes (wt103 base: 16, 410, 10, 2100; enwik8 base: 12, 512,
        8, 2048).
    d_head: per-head size (None: d_model // n_heads; the code's `d_head`).
    d_embed: embedding size before the adaptive projection (None: d_model).
    dropout, dropatt: residual/embedding/feed-forward dropout (0.1) and attention dropout (0.0).
    pre_lnorm: LayerNorm before the sub-layers instead of after (the code's scripts all use post-LN).
    cutoffs, div_val: adaptive input/softmax (wt103: [20000, 40000, 200000], div_val 1); no cutoffs =
        a full softmax (enwik8).
    tie_weight: share output word vectors with the input embedding.
    tie_projs: per cluster, share the output projection with the input one (wt103 code:
        [False, True, True, True]); None: all but the head.
    init_std, proj_init_std: initialisation (code: 0.02, 0.01).
    layer_norm_eps: LayerNorm epsilon (1e-5).
    untie_r: one pair u, v per layer (Hugging Face's `untie_r`, as transfo-xl-wt103 and the TF code's
        `untie_r`) instead of kimiyoung's PyTorch pair shared by all layers.
    attention: "sdpa" (one fused kernel, default), "eager" (op by op, as the code) or "flex"
        (compiled flex_attention at evaluation, sdpa in training); equal to float rounding
        (`relative_attention`).
    """

    n_layers: int = 16
    d_model: int = 410
    n_heads: int = 10
    d_inner: int = 2100
    d_head: int | None = None
    d_embed: int | None = None
    dropout: float = 0.1
    dropatt: float = 0.0
    pre_lnorm: bool = False
    cutoffs: tuple[int, ...] = ()
    div_val: int = 1
    tie_weight: bool = True
    tie_projs: tuple[bool, ...] | None = None
    init_std: float = 0.02
    proj_init_std: float = 0.01
    layer_norm_eps: float = 1e-5
    untie_r: bool = False
    attention: AttentionKernel = "sdpa"

    def __post_init__(self) -> None:
        check_attention_kernel(self.attention)
        check_sizes(self, "n_layers", "d_model", "n_heads", "d_inner", "d_head", "d_embed", "div_val")
        if self.head_dim < 1:
            raise ValueError(
                f"n_heads ({self.n_heads}) exceeds d_model ({self.d_model}): each head gets d_model // "
                "n_heads dimensions; give fewer heads, or d_head"
            )
        check_probabilities(self, "dropout", "dropatt")
        if self.init_std < 0 or self.proj_init_std < 0 or self.layer_norm_eps <= 0:
            raise ValueError(
                f"init_std ({self.init_std}) and proj_init_std ({self.proj_init_std}) must be >= 0 and "
                f"layer_norm_eps ({self.layer_norm_eps}) > 0"
            )
        if self.d_model % 2:
            raise ValueError(f"d_model ({self.d_model}) must be even (sin and cos halves of the sinusoid)")
        object.__setattr__(self, "cutoffs", tuple(self.cutoffs or ()))  # lists from Python callers
        if self.tie_projs is not None:
            object.__setattr__(self, "tie_projs", tuple(self.tie_projs))

    @property
    def head_dim(self) -> int:
        return self.d_head or self.d_model // self.n_heads

    def build(self, vocab_size: int) -> TransformerXL:
        return TransformerXL(vocab_size, self)

    def build_within(self, vocab_size: int, say: Callable[[str], object]) -> TransformerXL:
        """The network over `vocab_size` with only the cutoffs inside it (`cutoffs_within`: a
        word-level recipe read at byte level keeps a full softmax), saying so with `say` when some
        are dropped (the modules pass Lightning's `rank_zero_info`: one line, rank zero)."""
        kept = tuple(cutoffs_within(vocab_size, self.cutoffs))
        if kept == self.cutoffs:
            return self.build(vocab_size)
        say(
            f"longctx: cutoffs {list(self.cutoffs)} reach past the vocabulary ({vocab_size}): "
            f"adaptive softmax cutoffs {list(kept) or 'none (a full softmax)'}"
        )
        return replace(self, cutoffs=kept).build(vocab_size)


class PositionwiseFF(nn.Module):
    """fc1 -> ReLU -> dropout -> fc2 -> dropout, with residual and LayerNorm (the code's `CoreNet`)."""

    def __init__(self, config: TransformerXLConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, config.d_inner)
        self.fc2 = nn.Linear(config.d_inner, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.pre_lnorm = config.pre_lnorm

    def forward(self, x: Tensor) -> Tensor:
        if self.pre_lnorm:
            return x + self.drop(self.fc2(self.drop(F.relu(self.fc1(self.layer_norm(x))))))
        return self.layer_norm(x + self.drop(self.fc2(self.drop(F.relu(self.fc1(x))))))


class XLBlock(nn.Module):
    """Relative attention then feed-forward (the code's `RelPartialLearnableDecoderLayer`)."""

    def __init__(self, config: TransformerXLConfig) -> None:
        super().__init__()
        self.attn = RelMultiHeadAttention(config)
        self.ff = PositionwiseFF(config)

    def forward(
        self,
        x: Tensor,
        window: KeyWindow,
        pos_emb: Tensor,
        u: Tensor,
        v: Tensor,
        need_mass: bool = False,
        need_weights: bool = False,
    ) -> tuple[Tensor, AttentionOutput]:
        """x: (B, n, d) -> (B, n, d), and the attention's output (arguments: `RelMultiHeadAttention`)."""
        attn = self.attn(x, window, pos_emb, u, v, need_mass, need_weights)
        return self.ff(attn.out), attn


@dataclass
class XLOutput:
    """hidden: (B, n, d) last-layer output (after dropout); memory: the updated memory; attn: per layer
    the attention sub-layer's `AttentionOutput` (the window attended: a TRAMS window's slots; memory
    mass and weights if asked)."""

    hidden: Tensor
    memory: XLMemory
    attn: list[AttentionOutput]


class TransformerXL(nn.Module):
    """Transformer-XL language model (network only; the losses come from `nll`).

    `TransformerXL(vocab_size, config)` with a `TransformerXL.Config` (or `config.build(vocab_size)`).
    """

    Config = TransformerXLConfig

    def __init__(self, vocab_size: int, config: TransformerXLConfig) -> None:
        super().__init__()
        self.config = config
        self.attention = config.attention
        d_model, n_heads, n_layers = config.d_model, config.n_heads, config.n_layers
        d_head = config.head_dim
        d_embed = config.d_embed or d_model
        self.n_layers, self.d_model, self.n_heads, self.d_head = n_layers, d_model, n_heads, d_head
        cutoffs, div_val = config.cutoffs, config.div_val
        self.word_emb = AdaptiveEmbedding(vocab_size, d_embed, d_model, cutoffs, div_val)
        self.crit = ProjectedAdaptiveLogSoftmax(vocab_size, d_embed, d_model, cutoffs, div_val)
        self.drop = nn.Dropout(config.dropout)
        self.untie_r = config.untie_r
        bias_shape = (n_layers, n_heads, d_head) if self.untie_r else (n_heads, d_head)
        self.r_w_bias = nn.Parameter(torch.empty(bias_shape))  # u (per layer with untie_r)
        self.r_r_bias = nn.Parameter(torch.empty(bias_shape))  # v
        self.layers = nn.ModuleList(XLBlock(config) for _ in range(n_layers))
        self._init_weights(config.init_std, config.proj_init_std)
        tie_projs = config.tie_projs if config.tie_projs is not None else [False] + [True] * len(cutoffs)
        self.crit.tie_to(self.word_emb, config.tie_weight, list(tie_projs))

    @torch.no_grad()
    def _init_weights(self, std: float, proj_std: float) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, 0.0, std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.normal_(module.weight, 1.0, std)
                nn.init.zeros_(module.bias)
        for proj in [*self.word_emb.emb_projs, *self.crit.out_projs]:
            nn.init.normal_(proj, 0.0, proj_std)
        if self.crit.n_clusters:
            nn.init.normal_(self.crit.cluster_weight, 0.0, std)
            nn.init.zeros_(self.crit.cluster_bias)
        nn.init.normal_(self.r_w_bias, 0.0, std)
        nn.init.normal_(self.r_r_bias, 0.0, std)

    def empty_memory(self, batch_size: int) -> XLMemory:
        """The memory of fresh rows under Transformer-XL's convention: nothing (`XLMemory.empty`)."""
        return self._memory(batch_size, zeros=None)

    def zero_memory(self, batch_size: int, mem_len: int) -> XLMemory:
        """The memory of fresh rows under TRAMS's convention: mem_len zero states, attended."""
        return self._memory(batch_size, zeros=mem_len)

    def _memory(self, batch_size: int, zeros: int | None) -> XLMemory:
        p = self.r_w_bias
        sizes = dict(n_layers=self.n_layers, d_model=self.d_model, zeros=zeros)
        return XLMemory.empty(batch_size, **sizes, device=p.device, dtype=p.dtype)

    def forward(
        self,
        x: Tensor,
        memory: XLMemory,
        mem_len: int,
        clamp_len: int = 0,
        same_length: bool = False,
        trams: TramsSettings | None = None,
        need_mass: bool = False,
        need_weights: bool = False,
        cache_kv: bool = False,
        carry_gradient: bool = False,
    ) -> XLOutput:
        """x: (B, n) token ids; memory: `XLMemory` (hidden per layer (B, P, d), valid (B, P)); mem_len: kept
        for the next segment (the TRAMS pool M under TRAMS); clamp_len: cap of relative positions
        (0 = none); same_length: every query sees min(mem_len, ·) memory keys (m under TRAMS);
        cache_kv: keep the memory's keys and values with it (evaluation only: exact while the weights
        do not change; no gradient reaches W_K, W_V through cached memory keys), and under TRAMS with
        the "code" or "paper" metric each key's score (scored once, when it enters the pool; without
        cache_kv every segment projects and scores the pool again, as the released code);
        carry_gradient: the memory kept with its graph, not detached (truncated BPTT over several
        segments, in training)."""
        segment = self.segment_memory(memory, x.shape[1], mem_len, same_length, trams, cache_kv)
        hidden, attns = self.attend(x, segment, clamp_len, need_mass, need_weights)
        return XLOutput(hidden, segment.kept(carry_gradient), attns)

    @staticmethod
    def segment_memory(
        memory: XLMemory, n: int, mem_len: int, same_length: bool, trams: TramsSettings | None, cache_kv: bool
    ) -> XLSegment:
        """The memory type over a segment of n tokens: TRAMS's pool (`trams_pool.py`) with `trams`,
        else Transformer-XL's memory (`memory.py`)."""
        if trams is None:
            return XLSegment(memory, n, mem_len, same_length, cache_kv)
        return TramsSegment(memory, n, mem_len, same_length, cache_kv, trams)

    def attend(
        self,
        x: Tensor,
        memory: SegmentMemory,
        clamp_len: int,
        need_mass: bool = False,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[AttentionOutput]]:
        """The layer loop of the XL family: x (B, n) token ids through the embedding and every layer,
        each attending the keys its memory answers (`SegmentMemory.window`) at relative positions from
        P + n − 1 (P = memory.slots) down to 0, capped at clamp_len (0 = none). Returns the last
        layer's output after dropout (B, n, d) and per layer its `AttentionOutput` (the probabilities
        only with need_weights: a memory type that reads them gets each layer's in turn)."""
        if memory.n_layers != self.n_layers:
            raise ValueError(f"memory has {memory.n_layers} layers, the model {self.n_layers}")
        h = self.drop(self.word_emb(x))  # (B, n, d)
        pos_emb = self.drop(
            sinusoid_positions(memory.slots + x.shape[1], self.d_model, clamp_len, h.device, h.dtype)
        )
        attns = []
        for i, layer in enumerate(self.layers):
            window = memory.window(i, layer.attn, h)
            u, v = (self.r_w_bias[i], self.r_r_bias[i]) if self.untie_r else (self.r_w_bias, self.r_r_bias)
            h, attn = layer(h, window, pos_emb, u, v, need_mass, need_weights or memory.needs_weights)
            memory.attended(i, attn)
            if not need_weights:
                attn.probs = attn.heads = None  # one layer's weights at a time
            attns.append(attn)
        return self.drop(h), attns

    def nll(self, hidden: Tensor, target: Tensor) -> Tensor:
        """Per-token NLL in nats: hidden (B, n, d), target (B, n) -> (B, n)."""
        return self.crit(hidden.reshape(-1, hidden.shape[-1]), target.reshape(-1)).view(target.shape)
