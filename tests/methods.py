"""The tests' method table: every method of `longctx.methods.registry` at its smallest.

Every cross-method test (resume, DDP, precision, compile, train mode, meta device, per-token losses)
parametrizes over `TINY`, so a method added to the registry is in all of them once it has its line
here (`tests/test_layout.py` checks both tables name the same methods).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from longctx.core.base import LMBase
from longctx.methods.adaptive_span.module import AdaptiveSpanLM
from longctx.methods.compressive_transformer.module import CompressiveTransformerLM
from longctx.methods.recurrence.module import RecurrentGPT2LM
from longctx.methods.recurrent_memory.module import RecurrentMemoryLM
from longctx.methods.transformer_xl.module import TransformerXLLM
from longctx.methods.window_transformer.module import WindowTransformerLM
from tests.lm_fixtures import SyntheticData, WindowData

VOCAB = 64  # the synthetic data's symbols
# The sizes every tiny network shares (GPT-2 spells them n_layer, n_embd, n_head).
SIZES = dict(vocab_size=VOCAB, n_layers=2, d_model=16, n_heads=2, d_inner=32)
GPT2_SIZES = {"n_layer": 3, "n_embd": 16, "n_head": 2, "n_positions": 32}


@dataclass(frozen=True)
class TinyMethod:
    """build: the module at its smallest (keyword arguments override its knobs); data: the synthetic
    data module class in the method's batch mode (its tokens are below VOCAB); kernel_knob: the
    knob choosing its attention kernel ("eager" or "sdpa"), None where it has only the fused one."""

    build: Callable[..., LMBase]
    data: type[SyntheticData]
    kernel_knob: str | None = "attention"


def tiny_adaptive_span(**knobs) -> AdaptiveSpanLM:
    return AdaptiveSpanLM(**{**SIZES, "attn_span": 32, **knobs})


def tiny_transformer_xl(**knobs) -> TransformerXLLM:
    return TransformerXLLM(**{**SIZES, "mem_len": 16, **knobs})


def tiny_compressive_transformer(**knobs) -> CompressiveTransformerLM:
    """c = 2: with c = 3 the memory's length cycles and torch.compile recompiles every step."""
    return CompressiveTransformerLM(
        **{**SIZES, "dropout": 0.0, "mem_len": 8, "cmem_len": 4, "compression_rate": 2, **knobs}
    )


def tiny_window_transformer(**knobs) -> WindowTransformerLM:
    return WindowTransformerLM(**{**SIZES, "max_len": 16, **knobs})  # = SyntheticData's seq_len


def tiny_recurrence(**knobs) -> RecurrentGPT2LM:
    return RecurrentGPT2LM(**{"vocab_size": VOCAB, "gpt2_config": GPT2_SIZES, "insert_layer": 1, **knobs})


def tiny_recurrent_memory(**knobs) -> RecurrentMemoryLM:
    """m = 2: GPT2_SIZES' 32 positions hold WindowData's 16-token windows and the 4 memory tokens."""
    return RecurrentMemoryLM(**{"vocab_size": VOCAB, "gpt2_config": GPT2_SIZES, "num_mem_tokens": 2, **knobs})


# Keyed like `longctx.methods.registry.METHODS` (the method folders).
TINY: dict[str, TinyMethod] = {
    "adaptive_span": TinyMethod(tiny_adaptive_span, SyntheticData),
    "compressive_transformer": TinyMethod(tiny_compressive_transformer, SyntheticData),
    "recurrence": TinyMethod(tiny_recurrence, WindowData, "attn_implementation"),
    "recurrent_memory": TinyMethod(tiny_recurrent_memory, WindowData, "attn_implementation"),
    "transformer_xl": TinyMethod(tiny_transformer_xl, SyntheticData),
    "window_transformer": TinyMethod(tiny_window_transformer, SyntheticData, None),  # SDPA only
}


def config_init_args(model_class: type, knobs: dict) -> dict:
    """Flat knob names (`d_model`, `eval_mem_len`) as a config's `model.init_args`: each in its knob group
    (`network: {d_model: ...}`, `evaluation: {mem_len: ...}`), where `LMBase.knob_path` puts it."""
    init_args: dict = {}
    for knob, value in knobs.items():
        *groups, field = model_class.knob_path(knob).split(".")
        target = init_args
        for group in groups:
            target = target.setdefault(group, {})
        target[field] = value
    return init_args
