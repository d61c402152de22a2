"""`AdaptiveSpanLM`: Adaptive Attention Span (Sukhbaatar et al. 2019) on the `LMBase` spine.

One module for the three variants of the paper, chosen by the network group's `span_kind`
(`model.init_args.network.span_kind`): `adaptive` (§2.2, a learned span per head), `dynamic` (§2.2,
z_t = S·σ(vᵀx_t + b)) and `fixed` (the same network without the mask, the paper's fixed-span
comparison). The memory carried across batches is a `SpanCache`: per layer,
the hidden states that entered the layer in earlier blocks (the code's `h_cache`).

Training loss = mean NLL + λ·Σ_layers (1/H)·Σ_heads z_i (code: `adapt_span_loss · S · mean(z')` per
layer, summed over layers). z' is clamped to [0, 1] after every optimizer step.

The paper's symbols and where each lives in this folder: the package docstring (`__init__.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from longctx.core.base import LMBase, StepOutput, check_tbptt_segments
from longctx.core.memory_warmup import MemoryWarmup
from longctx.core.recall import target_is_argmax
from longctx.diagnostics.axes import Axis
from longctx.diagnostics.footprint import feed_forward_elements
from longctx.methods.adaptive_span import flops as span_flops
from longctx.methods.adaptive_span.figures import SpanFigure
from longctx.methods.adaptive_span.mask import reported_span
from longctx.methods.adaptive_span.memory import SpanCache
from longctx.methods.adaptive_span.network import SpanTransformer, SpanTransformerOutput
from longctx.methods.softmax_nll import full_softmax_nll
from longctx.optim.adagrad import ClippedAdagrad

# The span cap as a context axis (`longctx.diagnostics.axes`): the farthest distance any head attends.
SPAN_CAP = Axis(
    "span_cap",
    applies=lambda model, data: True,
    why_not="it caps the attended distance of adaptive-span models (eval_span_cap)",
    limits=lambda model, data: (1, model.net.config.attn_span),
    default_max=lambda model, data: model.net.config.attn_span,
    set=lambda model, data, length: setattr(model, "eval_span_cap", length),
    flags=lambda model, data, length: ["--model.init_args.eval_span_cap", str(length)],
)


class AdaptiveSpanLM(MemoryWarmup, LMBase):
    """Character-level sequential transformer with adaptive, dynamic or fixed attention spans.

    Args:
        network: the network's knobs, a `SpanTransformer.Config` (sizes, S, dropout, span kind, R,
            z' at init, b at init, chunk size, span trimming, attention kernel; its docstring says
            each), default the paper's small model (12 layers, d 512, 8 heads, inner 2048, S 8192,
            dropout 0.3). In a config: `model.init_args.network.attn_span: 1024`.
        span_loss: λ of the l1 span penalty (paper: 2e-6; 0.5e-6 at S = 8192).
        eval_span_cap: at validation/test only, the farthest distance any query attends (1..S; None: no
            cap, the paper's model). Each layer's attended length is trimmed to it, i.e. the span mask
            is multiplied by 1[x <= cap] and renormalised: what the model scores with at most `cap`
            previous tokens (`python -m longctx context` sweeps it). Training ignores it.
        tbptt_segments: k, the segments of each row a training batch holds (`data.windows_per_batch:
            k`, with `data.train_wrap: restart`), read in order with the cache carried with its
            gradient and detached at the batch's end (truncated BPTT over k segments, `LMBase`; the
            penalty is the mean over the k segments); 1: the cache detached after every segment, as
            the code's `h_cache`; None: as many as each training batch holds (the data module's
            layout, which its `far_text_layout` may choose from the text).
        mem_warmup_steps: for the first N optimizer steps every head attends at most R (`span_ramp`)
            back, what an adaptive span attends at its start (z' = 0: the ramp alone), then its span:
            a span curriculum, not in the paper, that gives fixed spans (all S from the first step)
            the short start adaptive spans have (docs/long_range.md "Recall, tiny": fixed span S =
            160 learned nothing in 2,000 steps without it). 0: off.
        mem_warmup_min_within: the warm-up runs only on training text with at least this share of
            its answers bound within their segment (`longctx/core/memory_warmup.py`, as
            Transformer-XL's).
        vocab_size, optimizer, lr_scheduler: see `LMBase`. The default optimizer is the paper's
            `ClippedAdagrad` (lr 0.07, clip 0.03); the paper warms up linearly over 32k steps
            (`WarmupStepDecay`). A config that switches the optimizer class should give all its
            init_args: jsonargparse carries init_args whose names match over from the default class.
    """

    batch_mode = "segments"

    context_axes = (SPAN_CAP,)  # `context`: eval_span_cap
    renamed_knobs: ClassVar[dict[str, str]] = {"network.span": "network.span_kind"}

    def __init__(
        self,
        vocab_size: int = 0,
        network: SpanTransformer.Config = SpanTransformer.Config(),  # noqa: B008 (frozen: immutable)
        span_loss: float = 0.5e-6,
        eval_span_cap: int | None = None,
        tbptt_segments: int | None = 1,
        mem_warmup_steps: int = 0,
        mem_warmup_min_within: float = 0.0,
        optimizer: OptimizerCallable = ClippedAdagrad,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        groups = self.read_groups(dict(network=network))
        network = groups["network"]
        super().__init__(vocab_size=vocab_size, optimizer=optimizer, lr_scheduler=lr_scheduler)
        self.save_hyperparameters()
        if span_loss < 0:
            raise ValueError(f"span_loss (λ) must be >= 0, got {span_loss}")
        check_tbptt_segments(tbptt_segments)
        self.init_memory_warmup(mem_warmup_steps, mem_warmup_min_within)
        if mem_warmup_steps and network.span_ramp < 1:
            raise ValueError(
                "mem_warmup_steps caps the spans at the ramp R (network.span_ramp), which is 0: set "
                "network.span_ramp >= 1 or mem_warmup_steps: 0"
            )
        if eval_span_cap is not None and not 1 <= eval_span_cap <= network.attn_span:
            raise ValueError(
                f"eval_span_cap must be in [1, attn_span = {network.attn_span}], got {eval_span_cap}"
            )
        self.net = network.build(vocab_size)
        self.span_loss = span_loss
        self.eval_span_cap = eval_span_cap
        self.tbptt_segments = tbptt_segments
        self._last_spans: list[Tensor] = []

    # ------------------------------------------------------------------ memory
    def init_memory(self, batch_size: int) -> SpanCache:
        return self.net.init_cache(batch_size, device=self.device)

    # ------------------------------------------------------------------ step
    def step(self, batch: dict[str, Tensor], memory: SpanCache) -> StepOutput:
        x = batch["input"]
        out = self.net(x, memory, span_cap=self.span_cap())
        nll = full_softmax_nll(out.logits, batch["target"])  # (B, M)
        correct = target_is_argmax(out.logits, batch["target"]) if self.wants_correct else None
        extra_loss = None
        logs: dict[str, Tensor | float] = {}
        if out.spans:  # per layer (H,): kept on the device for `head_spans` (no sync per step)
            self._last_spans = [z.detach() for z in out.spans]
        if self.training:
            if out.penalty is not None:
                extra_loss = self.span_loss * out.penalty
            logs = self._span_logs(out)
        return StepOutput(nll=nll, memory=out.cache, extra_loss=extra_loss, logs=logs, correct=correct)

    def span_cap(self) -> int | None:
        """The farthest distance a query attends in this step: `eval_span_cap` at evaluation, R during
        the training warm-up (`mem_warmup_steps`), else none (each head's own span)."""
        if not self.training:
            return self.eval_span_cap
        return self.net.config.span_ramp if self.warming_up else None

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
        config = self.net.config
        S, R = config.attn_span, config.span_ramp
        if config.span_kind == "adaptive":  # the parameter z' itself, as the code reads it
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
        config = self.net.config
        if config.span_kind == "adaptive":
            return [layer.attn.adaptive_mask.z.detach().float().cpu() for layer in self.net.layers]
        if config.span_kind == "dynamic" and self._last_spans:
            return [z.float().cpu() for z in self._last_spans]
        return [torch.full((config.n_heads,), float(config.attn_span)) for _ in self.net.layers]

    @classmethod
    def describe_run(cls, model: Mapping[str, Any], data: Mapping[str, Any]) -> str:
        """The span kind and the maximum span S."""
        return f"{model.get('span_kind')} span S={model.get('attn_span')}"

    def state_size(self) -> int:
        """cap·d numbers per layer: the cached states the farthest query may attend at evaluation
        (`eval_span_cap`, else the maximum span S). Learned spans may use fewer; the cache holds S."""
        config = self.net.config
        return (self.eval_span_cap or config.attn_span) * config.d_model

    def evaluation_elements(self, batch_size: int, length: int) -> int:
        """Each layer's cache and the block's keys and values over the largest span S (or the cap),
        and a query chunk's scores (`footprint`)."""
        c, B = self.net.config, batch_size
        S, chunk = self.eval_span_cap or c.attn_span, min(c.chunk_size, length)
        cache = c.n_layers * B * (S + length) * 3 * c.d_model + 3 * B * c.n_heads * chunk * (S + chunk)
        return cache + feed_forward_elements(B, length, c.d_model, c.d_inner)

    def flops_per_token(self, segment_length: int) -> float:
        """Forward FLOPs per token with each head over its own span (z + R, at most S; `flops.py`),
        counting the re-projection of the cached states every block of `segment_length` tokens (per
        layer or per head, as `span_trim` computes it)."""
        spans = [z.tolist() for z in self.head_spans()]
        return span_flops.network_flops_per_token(self.net.config, self.vocab_size, spans, segment_length)

    def configure_callbacks(self) -> list[pl.Callback]:
        """The span figure (paper Figure 4) for every run with learned spans; see `figures.py`."""
        return [] if self.net.config.span_kind == "fixed" else [SpanFigure()]
