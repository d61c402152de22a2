"""`AdaptiveSpanLM`: Adaptive Attention Span (Sukhbaatar et al. 2019) on the `LMBase` spine.

One module for the three variants of the paper: `span: adaptive` (§2.2, a learned span per head),
`span: dynamic` (§2.2, z_t = S·σ(vᵀx_t + b)) and `span: fixed` (the same network without the mask,
the paper's fixed-span comparison). The memory carried across batches is a `SpanCache`: per layer,
the hidden states that entered the layer in earlier blocks (the code's `h_cache`).

Training loss = mean NLL + λ·Σ_layers (1/H)·Σ_heads z_i (code: `adapt_span_loss · S · mean(z')` per
layer, summed over layers). z' is clamped to [0, 1] after every optimizer step.

The paper's symbols and where each lives in this folder: the package docstring (`__init__.py`).
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from longctx.core.base import LMBase, StepOutput
from longctx.methods.adaptive_span import flops as span_flops
from longctx.methods.adaptive_span.attention import SpanKind, SpanTrim
from longctx.methods.adaptive_span.figures import SpanFigure
from longctx.methods.adaptive_span.mask import reported_span
from longctx.methods.adaptive_span.memory import SpanCache
from longctx.methods.adaptive_span.network import SpanTransformer, SpanTransformerOutput
from longctx.methods.attention_kernel import AttentionKernel
from longctx.optim.adagrad import ClippedAdagrad


class AdaptiveSpanLM(LMBase):
    """Character-level sequential transformer with adaptive, dynamic or fixed attention spans.

    Args:
        d_model, n_layers, n_heads, d_inner: sizes (paper small: 512, 12, 8, 2048; large: 768, 24, 8, 4096).
        attn_span: S, the maximum span (paper: 8192).
        dropout: attention and feed-forward dropout (paper: 0.3 small, 0.4 large).
        emb_dropout: embedding dropout (code default 0).
        span: "adaptive", "dynamic" or "fixed".
        span_loss: λ of the l1 span penalty (paper: 2e-6; 0.5e-6 at S = 8192).
        span_ramp: R, the ramp length (paper: 32).
        span_init: initial z' (code: 0).
        dynamic_bias_init: b at init for dynamic spans (paper: -4).
        chunk_size: query chunk of the exact band attention (the cost is M·(L + chunk)).
        span_trim: "head": each head attends (and projects keys/values for) its own trimmed span, so
            the cost follows every head's span; "layer": the released code's per-layer trimming, where
            the longest head sets the cost of its layer. Equal outputs (the skipped mask is exactly 0).
        eval_span_cap: at validation/test only, the farthest distance any query attends (1..S; None: no
            cap, the paper's model). Each layer's attended length is trimmed to it, i.e. the span mask
            is multiplied by 1[x <= cap] and renormalised: what the model scores with at most `cap`
            previous tokens (`python -m longctx context` sweeps it). Training ignores it.
        attention: "sdpa" (the attention in one fused kernel per chunk, default), "eager" (the
            released code's ops) or "flex" (compiled flex_attention at evaluation, sdpa in training;
            not with the dynamic span); equal up to the code's renormalisation epsilon (see `attention`).
        vocab_size, optimizer, lr_scheduler: see `LMBase`. The default optimizer is the paper's
            `ClippedAdagrad` (lr 0.07, clip 0.03); the paper warms up linearly over 32k steps
            (`WarmupStepDecay`). A config that switches the optimizer class should give all its
            init_args: jsonargparse carries init_args whose names match over from the default class.
    """

    batch_mode = "segments"

    def __init__(
        self,
        vocab_size: int = 0,
        d_model: int = 512,
        n_layers: int = 12,
        n_heads: int = 8,
        d_inner: int = 2048,
        attn_span: int = 8192,
        dropout: float = 0.3,
        emb_dropout: float = 0.0,
        span: SpanKind = "adaptive",
        span_loss: float = 0.5e-6,
        span_ramp: int = 32,
        span_init: float = 0.0,
        dynamic_bias_init: float = -4.0,
        chunk_size: int = 64,
        span_trim: SpanTrim = "head",
        eval_span_cap: int | None = None,
        attention: AttentionKernel = "sdpa",
        optimizer: OptimizerCallable = ClippedAdagrad,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__(vocab_size=vocab_size, optimizer=optimizer, lr_scheduler=lr_scheduler)
        self.save_hyperparameters()
        if attn_span <= 0 or span_ramp < 0 or chunk_size <= 0:
            raise ValueError(
                f"attn_span ({attn_span}) and chunk_size ({chunk_size}) must be positive and span_ramp "
                f"({span_ramp}) >= 0"
            )
        if span_loss < 0:
            raise ValueError(f"span_loss (λ) must be >= 0, got {span_loss}")
        if eval_span_cap is not None and not 1 <= eval_span_cap <= attn_span:
            raise ValueError(f"eval_span_cap must be in [1, attn_span = {attn_span}], got {eval_span_cap}")
        self.net = SpanTransformer(
            vocab_size=vocab_size,
            d_model=d_model,
            n_layers=n_layers,
            n_heads=n_heads,
            d_inner=d_inner,
            attn_span=attn_span,
            dropout=dropout,
            emb_dropout=emb_dropout,
            span=span,
            span_ramp=span_ramp,
            span_init=span_init,
            dynamic_bias_init=dynamic_bias_init,
            chunk_size=chunk_size,
            span_trim=span_trim,
            attention=attention,
        )
        self.span_loss = span_loss
        self.eval_span_cap = eval_span_cap
        self._last_spans: list[Tensor] = []

    # ------------------------------------------------------------------ memory
    def init_memory(self, batch_size: int) -> SpanCache:
        return self.net.init_cache(batch_size, device=self.device)

    def reset_memory_rows(self, memory: SpanCache, reset: Tensor) -> SpanCache:
        return memory.reset_rows(reset)

    # ------------------------------------------------------------------ step
    def step(self, batch: dict[str, Tensor], memory: SpanCache) -> StepOutput:
        x = batch["input"]
        out = self.net(x, memory, span_cap=None if self.training else self.eval_span_cap)
        nll = F.cross_entropy(out.logits.float().transpose(1, 2), batch["target"], reduction="none")  # (B, M)
        extra_loss = None
        logs: dict[str, Tensor | float] = {}
        if out.spans:  # per layer (H,): kept on the device for `head_spans` (no sync per step)
            self._last_spans = [z.detach() for z in out.spans]
        if self.training:
            if out.penalty is not None:
                extra_loss = self.span_loss * out.penalty
            logs = self._span_logs(out)
        return StepOutput(nll=nll, memory=out.cache, extra_loss=extra_loss, logs=logs)

    def _span_logs(self, out: SpanTransformerOutput) -> dict[str, Tensor | float]:
        """The spans, two ways, plus the penalty and the attended length.

        - `span/avg`, `span/max`: as the released code reports them (`reported_span`): per layer
          ceil(z'·S) + R of the mean (resp. largest) z' of its heads, clipped to S; then the mean
          (resp. max) over layers. These count the ramp and round up, so they are what the papers'
          "average span" tables compare with.
        - `span/z_avg`, `span/z_max`, `span/z/layer{i}/head{j}`: the raw learned spans z = S·z'
          (dynamic spans: z_t averaged over the block's tokens).
        - `span/attended` (mean previous positions attended per layer, after trimming); the penalty
          λ·Σ_layers (1/H)·Σ_heads z is the step's `extra_loss`, logged by the base (`train/extra_loss`).
        All are logged every step: the logger writes them every `log_every_n_steps`, with the values
        of that step (kept on the device: no host sync per step).
        """
        logs: dict[str, Tensor | float] = {"span/attended": sum(out.attended) / len(out.attended)}
        if not out.spans:
            return logs
        z = torch.stack(out.spans).float()  # (n_layers, H)
        S, R = self.hparams.attn_span, self.hparams.span_ramp
        if self.hparams.span == "adaptive":  # the parameter z' itself, as the code reads it
            z_ratio = torch.stack([layer.attn.adaptive_mask.z_ratio.detach() for layer in self.net.layers])
        else:
            z_ratio = z / S
        logs["span/avg"] = reported_span(z_ratio.mean(-1), S, R).mean().float()
        logs["span/max"] = reported_span(z_ratio.amax(-1), S, R).max().float()
        logs["span/z_avg"] = z.mean()
        logs["span/z_max"] = z.max()
        for i, layer_spans in enumerate(z):
            for j, z_ij in enumerate(layer_spans):
                logs[f"span/z/layer{i}/head{j}"] = z_ij
        return logs

    # ------------------------------------------------------------------ span parameters
    def optimizer_step(self, *args, **kwargs) -> None:
        super().optimizer_step(*args, **kwargs)
        self.net.clamp_spans_()  # the code's clamp_param() after every update

    def head_spans(self) -> list[Tensor]:
        """Per layer the spans of its heads (H,): z for adaptive spans, the last block's mean z_t for
        dynamic spans, S for fixed spans."""
        if self.hparams.span == "adaptive":
            return [layer.attn.adaptive_mask.z.detach().float().cpu() for layer in self.net.layers]
        if self.hparams.span == "dynamic" and self._last_spans:
            return [z.float().cpu() for z in self._last_spans]
        n_heads = self.hparams.n_heads
        return [torch.full((n_heads,), float(self.hparams.attn_span)) for _ in self.net.layers]

    def flops_per_token(self, segment_length: int) -> float:
        """Forward FLOPs per token with each head over its own span (z + R, at most S; `flops.py`),
        counting the re-projection of the cached states every block of `segment_length` tokens (per
        layer or per head, as `span_trim` computes it)."""
        h = self.hparams
        spans = [z.tolist() for z in self.head_spans()]
        ramp = 0 if h.span == "fixed" else h.span_ramp
        return span_flops.flops_per_token(
            h.d_model, h.n_layers, h.d_inner, self.vocab_size, spans, ramp, h.attn_span,
            block=segment_length, trim=h.span_trim if h.span == "adaptive" else "layer",
        )  # fmt: skip

    def configure_callbacks(self) -> list[pl.Callback]:
        """The span figure (paper Figure 4) for every run with learned spans; see `figures.py`."""
        return [] if self.hparams.span == "fixed" else [SpanFigure()]
