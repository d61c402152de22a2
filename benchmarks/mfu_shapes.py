"""The methods `benchmarks/mfu.py` measures, each at its paper's shape, and the model FLOPs of a step.

One entry of `BENCHES` per method: the module, the knobs of the paper's model (`paper`) and of a
tiny one that runs the same code on a CPU in seconds (`tiny`), one training and one evaluation step
(rows, tokens per row, the evaluation knobs), and where the shape comes from. Adding a method is one
entry (its module must implement `LMBase.flops_per_token`).

Model FLOPs per token are the method's own count, `LMBase.flops_per_token` (its `flops.py`: the
number `report` shows as `val/flops_per_token`), taken from the module built with the knobs under
which that count describes the measured step (`Step.flops_knobs`): for training, the evaluation
memory set to the training memory and the key/value cache off (training projects the memory again
every segment). One correction, from the method's own `flops.py`: the adaptive softmax (Transformer-XL
on WikiText-103) computes the head for every target and a tail cluster only for the targets in it; a
module that has scored no target yet counts every cluster (all 267,735 words), so the output layer is
counted for the step's own targets (`adaptive_softmax_macs`).

FLOPs = 2 × multiply-accumulates (`longctx.core.flops`).
"""

from __future__ import annotations

import importlib
import itertools
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from longctx.core.base import LMBase
from longctx.core.knob_groups import override_groups
from longctx.methods.transformer_xl import flops as xl_flops

Mode = Literal["train", "eval"]
MODES: tuple[Mode, ...] = ("train", "eval")


@dataclass(frozen=True)
class Step:
    """One measured step: `batch` rows of `length` tokens (segments), or of `windows` windows of
    `length` tokens each (window mode); `knobs`: this mode's own module knobs (the evaluation
    memory); `fill`: steps until every memory is full (untimed); `flops_knobs`: knobs under which
    the module's `flops_per_token` counts this step (see the module docstring)."""

    batch: int
    length: int
    windows: int = 0
    knobs: dict = field(default_factory=dict)
    fill: int = 1
    flops_knobs: dict = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        """Tokens per step, every one scored."""
        return self.batch * self.length * max(self.windows, 1)


@dataclass(frozen=True)
class Scale:
    """A model size: vocabulary, the module's arguments (its knob groups as dicts: `network: {...}`)
    and its steps."""

    vocab: int
    knobs: dict
    train: Step | None
    eval: Step | None

    def step(self, mode: Mode) -> Step | None:
        return self.train if mode == "train" else self.eval


@dataclass(frozen=True)
class Bench:
    """A method: `module` (import path of its `LMBase` class), `paper` and `tiny` scales, `shape`
    (the paper's shape in words and what differs on one GPU), `config` (the config of that model),
    `kernel_knob` (where the knob choosing eager or sdpa attention is, an argument or `group.field`;
    None: fused only), `flex` (accepts "flex" at evaluation), `cache_knob` (where the evaluation
    key/value cache's knob is; None: none)."""

    module: str
    paper: Scale
    tiny: Scale
    shape: str
    config: str
    kernel_knob: str | None = "network.attention"
    flex: bool = True
    cache_knob: str | None = None

    def scale(self, tiny: bool) -> Scale:
        return self.tiny if tiny else self.paper

    def module_class(self) -> type[LMBase]:
        package, name = self.module.rsplit(".", 1)
        return getattr(importlib.import_module(package), name)

    def build(self, scale: Scale, mode: Mode, device: torch.device | str, **knobs) -> LMBase:
        """The module at `scale` with `mode`'s knobs and `knobs` (each over the one before; a group's
        dict over the fields it names), its parameters created on `device`."""
        knobs = override_groups(override_groups(scale.knobs, scale.step(mode).knobs), knobs)
        with torch.device(device):
            lm = self.module_class()(vocab_size=scale.vocab, **knobs)
        return lm.to(device)


# ------------------------------------------------------------------ FLOPs per token


def adaptive_softmax_macs(lm: LMBase, targets: Tensor) -> float:
    """Mean multiply-accumulates per target of the XL family's output layer as its NLL computes it
    for `targets` (`ProjectedAdaptiveLogSoftmax.forward`): every target the head, a target in tail
    cluster i also that cluster (`transformer_xl.flops.output_macs`)."""
    c = lm.net.config
    ends = [0, *c.cutoffs, lm.vocab_size]
    targets = targets.flatten().to("cpu")
    tails = [
        ((targets >= lo) & (targets < hi)).float().mean().item() for lo, hi in itertools.pairwise(ends[1:])
    ]
    return xl_flops.output_macs(c.d_model, lm.vocab_size, c.cutoffs, c.d_embed, c.div_val, [1.0, *tails])


def output_layer_correction(lm: LMBase, targets: Tensor) -> float:
    """FLOPs per token to add to an XL-family count for the output layer as computed for `targets`
    instead of the targets the module scored so far (none: every cluster); 0 for a full softmax and
    for the other methods."""
    c = getattr(getattr(lm, "net", None), "config", None)
    if not getattr(c, "cutoffs", None):
        return 0.0
    counted = xl_flops.output_macs(
        c.d_model, lm.vocab_size, c.cutoffs, c.d_embed, c.div_val, lm.net.crit.rows_per_token()
    )
    return 2 * (adaptive_softmax_macs(lm, targets) - counted)


def counting_module(bench: Bench, scale: Scale, mode: Mode, lm: LMBase) -> LMBase:
    """The module whose `flops_per_token` counts `mode`'s step: the measured `lm`, or where the step
    has `flops_knobs` a twin built with them on the meta device (no memory, no values)."""
    knobs = scale.step(mode).flops_knobs
    return bench.build(scale, mode, "meta", **knobs) if knobs else lm


def forward_flops(bench: Bench, scale: Scale, mode: Mode, lm: LMBase, targets: Tensor) -> float:
    """Model FLOPs per token of one forward pass of `mode`'s step (training counts it 3 times):
    the counting module's `flops_per_token` with the correction above (`targets`: the step's)."""
    step = scale.step(mode)
    counted = counting_module(bench, scale, mode, lm)
    return counted.flops_per_token(step.length) + output_layer_correction(counted, targets)


# ------------------------------------------------------------------ the methods

# configs/transformer_xl_wt103.yaml: the WikiText-103 base model with its adaptive input and softmax.
XL_WT103 = dict(
    network=dict(
        n_layers=16, d_model=410, n_heads=10, d_head=41, d_inner=2100, cutoffs=[20000, 40000, 200000],
        div_val=1, tie_projs=[False, True, True, True],
    ),
    mem_len=150,
)  # fmt: skip
XL_TINY = dict(network=dict(n_layers=2, d_model=32, n_heads=2, d_inner=64, cutoffs=[100, 200]), mem_len=16)
# Evaluation at TRAMS's setting (Yu et al. 2023, configs/trams_wt103.yaml): n = 64, XL's memory
# m = 200, no same_length, no clamp; TRAMS attends m = 200 (150 kept + 50 selected) of a pool M = 400.
XL_EVAL = dict(evaluation=dict(mem_len=200, same_length=False, clamp_len=0))
TRAMS_EVAL = dict(trams=dict(pool=400, attended=200, kept=150))
TRAMS_TINY = dict(trams=dict(pool=24, attended=16, kept=8))
CACHED = {"evaluation": {"cache_kv": True}}  # the count of the minimal computation, whatever the variant runs
# configs/adaptive_span.yaml (enwik8 small), every head z = 213, so that z + R = 245, the small enwik8
# model's average span (benchmarks/RESULTS.md, "FLOPs per token against the paper": 42.4M MACs).
SPAN_SMALL = dict(
    network=dict(
        d_model=512, n_layers=12, n_heads=8, d_inner=2048, attn_span=8192, dropout=0.3, span_ramp=32,
        span_init=213 / 8192,
    )
)  # fmt: skip
SPAN_TINY = dict(
    network=dict(d_model=32, n_layers=2, n_heads=2, d_inner=64, attn_span=64, span_ramp=8, span_init=0.25)
)
# configs/compressive_transformer_pg19.yaml: Rae et al. 2020's PG-19 model (§5.1).
CT_PG19 = dict(
    network=dict(
        n_layers=36, d_model=1024, n_heads=8, d_head=128, d_inner=4096, cutoffs=[], compression="conv",
        compression_rate=2,
    ),
    mem_len=512,
    cmem_len=512,
)  # fmt: skip
CT_TINY = dict(
    network=dict(n_layers=2, d_model=32, n_heads=2, d_inner=64, compression_rate=2), mem_len=16, cmem_len=8
)
GPT2_SMALL = dict(gpt2_config={"n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024})
GPT2_TINY = dict(
    gpt2_config={"n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 64},
    window_recurrence={"insert_layer": 1},
)
# configs/base/recurrent_memory.yaml: m = 16 memory tokens on GPT-2 small, every block checkpointed.
RMT_GPT2_SMALL = dict(**GPT2_SMALL, memory_cell={"num_mem_tokens": 16}, checkpoint_blocks=True)
RMT_TINY = dict(
    gpt2_config={"n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 64},
    memory_cell={"num_mem_tokens": 2},
)
XL = "longctx.methods.transformer_xl.module.TransformerXLLM"
UNCACHED = {"evaluation": {"cache_kv": False}}  # training's count: the memory projected again every segment

BENCHES: dict[str, Bench] = {
    "transformer_xl": Bench(
        XL,
        paper=Scale(
            267_735,
            XL_WT103,
            train=Step(60, 150, flops_knobs={"evaluation": {"mem_len": 150, "cache_kv": False}}),
            eval=Step(60, 64, knobs=XL_EVAL, fill=4, flops_knobs=CACHED),
        ),
        tiny=Scale(
            300,
            XL_TINY,
            train=Step(2, 16, flops_knobs={"evaluation": {"mem_len": 16, "cache_kv": False}}),
            eval=Step(
                2,
                8,
                knobs=override_groups(XL_EVAL, {"evaluation": {"mem_len": 16}}),
                fill=2,
                flops_knobs=CACHED,
            ),
        ),
        shape="WikiText-103 base (Dai et al. 2019): 16 layers, d 410, 10 heads of 41, inner 2100, "
        "adaptive input and softmax (cutoffs 20k/40k/200k); training n 150, memory 150, batch 60 (the "
        "config's); evaluation at TRAMS's m = 200, n = 64, batch 60",
        config="configs/transformer_xl_wt103.yaml",
        cache_knob="evaluation.cache_kv",
    ),
    "trams": Bench(
        XL,
        paper=Scale(
            267_735, XL_WT103, None, Step(60, 64, knobs={**XL_EVAL, **TRAMS_EVAL}, fill=7, flops_knobs=CACHED)
        ),
        tiny=Scale(
            300, XL_TINY, None, Step(2, 8, knobs={**XL_EVAL, **TRAMS_TINY}, fill=3, flops_knobs=CACHED)
        ),
        shape="the same model evaluated with TRAMS (Yu et al. 2023): pool M = 400, m = 200 = 150 kept "
        "+ 50 selected, n = 64, batch 60",
        config="configs/trams_wt103.yaml",
        cache_knob="evaluation.cache_kv",
    ),
    "adaptive_span": Bench(
        "longctx.methods.adaptive_span.module.AdaptiveSpanLM",
        paper=Scale(256, SPAN_SMALL, train=Step(64, 512), eval=Step(64, 512)),
        tiny=Scale(64, SPAN_TINY, train=Step(2, 16), eval=Step(2, 16)),
        shape="enwik8 small (Sukhbaatar et al. 2019): 12 layers, d 512, 8 heads, inner 2048, S 8192, "
        "block 512, every head's span z + R = 245 (the paper's average), batch 64 (the paper's "
        "global batch, on one GPU)",
        config="configs/adaptive_span.yaml",
    ),
    "compressive_transformer": Bench(
        "longctx.methods.compressive_transformer.module.CompressiveTransformerLM",
        paper=Scale(
            50_257,
            CT_PG19,
            Step(8, 512, fill=3, flops_knobs=UNCACHED),
            Step(8, 512, fill=3, flops_knobs=CACHED),
        ),
        tiny=Scale(
            64, CT_TINY, Step(2, 16, fill=2, flops_knobs=UNCACHED), Step(2, 16, fill=2, flops_knobs=CACHED)
        ),
        shape="PG-19 (Rae et al. 2020, §5.1): 36 layers, d 1024, 8 heads of 128, inner 4096, "
        "n_s = n_m = n_cm = 512, c 2, conv f_c, full softmax over GPT-2's 50,257 ids; scaled to one "
        "GPU: batch 512 -> 8 rows (the model is the paper's)",
        config="configs/compressive_transformer_pg19.yaml",
        cache_knob="evaluation.cache_kv",
    ),
    "recurrence": Bench(
        "longctx.methods.recurrence.module.RecurrentGPT2LM",
        paper=Scale(50_257, GPT2_SMALL, Step(16, 300, windows=20), Step(16, 300, windows=20)),
        tiny=Scale(64, GPT2_TINY, Step(2, 16, windows=2), Step(2, 16, windows=2)),
        shape="GPT-2 small with recurrence (Yoshida et al. 2020), random weights (no hub): T = 300, "
        "K = 20 windows, backprop through them window by window with checkpointing; 16 rows (the "
        "paper trains 1: one GPU is filled with rows)",
        config="configs/recurrent_gpt2_wt103.yaml",
        kernel_knob="attn_implementation",
        flex=False,
    ),
    "recurrent_memory": Bench(
        "longctx.methods.recurrent_memory.module.RecurrentMemoryLM",
        paper=Scale(50_257, RMT_GPT2_SMALL, Step(16, 512, windows=2), Step(16, 512, windows=2)),
        tiny=Scale(64, RMT_TINY, Step(2, 16, windows=2), Step(2, 16, windows=2)),
        shape="the Recurrent Memory Transformer (Bulatov et al. 2022) on GPT-2 small, random weights (no "
        "hub): T = 512, m = 16 memory tokens read and written, K = 2 segments backpropagated through, "
        "every block checkpointed (the authors' scripts); 16 rows (the scripts' global batch is 64)",
        config="configs/recurrent_memory_gpt2_wt103.yaml",
        kernel_knob="attn_implementation",
        flex=False,
    ),
}
