"""The method registry: one entry per method, naming its LightningModule, its tiny recipe, its tests'
smallest model, and what it adds to the shared commands.

Adding a method means one folder (`longctx/methods/<method>/`), its configs and one entry here
(docs/architecture.md, "Adding a method"). Shared code reaches a method only through this table:
`longctx.commands` adds its trainer commands, `longctx.commands.convert` its checkpoint formats,
`report` and `context` ask its module class (`LMBase.describe_run`, `LMBase.context_axes`), and
every cross-method test (`tests/helpers/methods.py`: resume, DDP, precision, compile, train mode, meta device,
per-token losses, golden numbers) and the compile benchmark run every method listed here.
`tests/test_layout.py` checks that every method folder has its entry and that shared code imports no
method.

Modules are named by import path, not imported: reading the registry loads no method (nor
transformers).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple


class TrainerCommand(NamedTuple):
    """A LightningCLI subcommand a method adds: target, "module:function(trainer, model, datamodule,
    ckpt_path, ...)" (its other parameters are the subcommand's options); summary, its line in
    `longctx --help`."""

    target: str
    summary: str


@dataclass(frozen=True)
class Method:
    """module: import path of the method's `LMBase` subclass; tiny_config: its smallest recipe, a path
    relative to the repository root (trains on CPU in minutes).

    tiny_knobs: the tests' smallest model (`tests/helpers/methods.py`: vocabulary 64, 2 layers, width 16), as
    arguments of the module besides `vocab_size`, each knob group as a dict of its fields
    (`network: {...}`); golden: the evaluations `tests/golden/` keeps, name → arguments on top of
    `tiny_knobs` (a group's dict overrides the fields it names; default: one, under the method's
    name); kernel_knob: where the knob choosing the attention kernel ("eager" or "sdpa") is, an
    argument or `group.field`, None where the method has only the fused one; bench_knobs: its
    arguments in `benchmarks/compile.py`'s small network (4 layers, d 256: the benchmark sets the
    sizes), e.g. its memory lengths at that scale.
    trainer_commands: the LightningCLI subcommands it adds (`longctx.commands`); checkpoint_formats:
    format → module converting the authors' released checkpoints (`longctx.commands.convert`).
    """

    module: str
    tiny_config: str
    tiny_knobs: Mapping[str, Any] = field(default_factory=dict)
    golden: Mapping[str, Mapping[str, Any]] | None = None
    kernel_knob: str | None = "network.attention"
    bench_knobs: Mapping[str, Any] = field(default_factory=dict)
    trainer_commands: Mapping[str, TrainerCommand] = field(default_factory=dict)
    checkpoint_formats: Mapping[str, str] = field(default_factory=dict)

    def module_class(self) -> type:
        """The LightningModule class (imports the method)."""
        package, name = self.module.rsplit(".", 1)
        return getattr(importlib.import_module(package), name)


# The sizes the tests' smallest networks share (a GPT-2 spells them n_layer, n_embd, n_head).
TINY_SIZES: dict[str, Any] = {"n_layers": 2, "d_model": 16, "n_heads": 2, "d_inner": 32}
TINY_GPT2: dict[str, Any] = {"n_layer": 3, "n_embd": 16, "n_head": 2, "n_positions": 32}

# Keyed by the method's folder name under longctx/methods/.
METHODS: dict[str, Method] = {
    "adaptive_span": Method(
        "longctx.methods.adaptive_span.module.AdaptiveSpanLM",
        "configs/adaptive_span_tiny.yaml",
        tiny_knobs={"network": {**TINY_SIZES, "attn_span": 32}},
        golden={"adaptive_span": {}, "fixed_span": {"network": {"span_kind": "fixed"}}},
        bench_knobs={"network": {"attn_span": 512, "span_init": 0.1}},
        checkpoint_formats={"adaptive-span": "longctx.methods.adaptive_span.convert"},
    ),
    "compressive_transformer": Method(
        "longctx.methods.compressive_transformer.module.CompressiveTransformerLM",
        "configs/compressive_transformer_tiny.yaml",
        # c = 2: with c = 3 the memory's length cycles and torch.compile recompiles every step.
        tiny_knobs={
            "network": {**TINY_SIZES, "dropout": 0.0, "compression_rate": 2},
            "mem_len": 8,
            "cmem_len": 4,
        },
        # c = 2 divides the segment and n_m: both memories keep one shape once full.
        bench_knobs={"network": {"compression_rate": 2}, "mem_len": 64, "cmem_len": 64},
    ),
    "recurrence": Method(
        "longctx.methods.recurrence.module.RecurrentGPT2LM",
        "configs/recurrent_gpt2_tiny.yaml",
        tiny_knobs={"gpt2_config": TINY_GPT2, "window_recurrence": {"insert_layer": 1}},
        # ffn_width 32: the paper's 200 would make the stored weights 400 kB.
        golden={
            "recurrent_gpt2": {"window_recurrence": {"ffn_width": 32}},
            "gpt2_window": {"recurrence": False},
        },
        kernel_knob="attn_implementation",
        trainer_commands={
            "evaluate_overlaps": TrainerCommand(
                "longctx.methods.recurrence.overlaps:evaluate_overlaps",
                "evaluate a windowed GPT-2 checkpoint at several overlaps",
            )
        },
    ),
    "recurrent_memory": Method(
        "longctx.methods.recurrent_memory.module.RecurrentMemoryLM",
        "configs/recurrent_memory_tiny.yaml",
        # m = 2: TINY_GPT2's 32 positions hold the tests' 16-token windows and the 4 memory tokens.
        tiny_knobs={"gpt2_config": TINY_GPT2, "memory_cell": {"num_mem_tokens": 2}},
        kernel_knob="attn_implementation",
        # T + 2m positions: the benchmark's 128-token windows and 16 memory tokens read and written.
        bench_knobs={"gpt2_config": {"n_layer": 4, "n_embd": 256, "n_head": 4, "n_positions": 160}},
    ),
    "transformer_xl": Method(
        "longctx.methods.transformer_xl.module.TransformerXLLM",
        "configs/transformer_xl_tiny.yaml",
        tiny_knobs={"network": TINY_SIZES, "mem_len": 16},
        bench_knobs={"mem_len": 128},
        golden={
            "transformer_xl": {},
            "trams": {"protocol": "trams", "trams": {"attended": 8, "kept": 4}},
            "rpe": {"mem_len": 0},
        },
        checkpoint_formats={
            "transfo-xl-hf": "longctx.methods.transformer_xl.convert",
            "transfo-xl": "longctx.methods.transformer_xl.convert",
        },
    ),
    "window_transformer": Method(
        "longctx.methods.window_transformer.module.WindowTransformerLM",
        "configs/window_transformer_tiny.yaml",
        tiny_knobs={"network": {**TINY_SIZES, "max_len": 16}},  # max_len = the tests' segment length
        kernel_knob=None,  # SDPA only
    ),
}


def trainer_commands() -> dict[str, TrainerCommand]:
    """Every method's trainer commands, in registry order."""
    return {name: command for method in METHODS.values() for name, command in method.trainer_commands.items()}


def checkpoint_formats() -> dict[str, str]:
    """Every method's checkpoint formats (format → converter module), in registry order."""
    return {fmt: module for method in METHODS.values() for fmt, module in method.checkpoint_formats.items()}


def method_class_named(class_name: str) -> type | None:
    """The registered module class called `class_name` (a run recorded under another import path),
    None if no method has one."""
    for method in METHODS.values():
        if method.module.rsplit(".", 1)[-1] == class_name:
            return method.module_class()
    return None
