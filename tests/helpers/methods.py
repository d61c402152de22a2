"""The tests' method table: every method of `longctx.methods.registry` at its smallest.

Every cross-method test (resume, DDP, precision, compile, train mode, meta device, per-token losses)
parametrizes over `TINY`, built from the registry: a method's entry (`tiny_knobs`, `kernel_knob`) puts
it in all of them, with no line here.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from longctx.core.base import LMBase
from longctx.core.knob_groups import override_groups
from longctx.methods import registry
from tests.helpers.lm_fixtures import SyntheticData, WindowData

VOCAB = 64  # the synthetic data's symbols
GPT2_SIZES = registry.TINY_GPT2  # the tiny GPT-2's sizes (n_layer, n_embd, n_head, n_positions)
DATA = {"segments": SyntheticData, "windows": WindowData}  # the synthetic data in each batch mode


@dataclass(frozen=True)
class TinyMethod:
    """build: the module at its smallest (keyword arguments override its arguments, `tiny`); data: the
    synthetic data module class in the method's batch mode (its tokens are below VOCAB); kernel_knob:
    where the knob choosing its attention kernel ("eager" or "sdpa") is (an argument or
    `group.field`, `knob_groups.at_path`), None where it has only the fused one."""

    build: Callable[..., LMBase]
    data: type[SyntheticData]
    kernel_knob: str | None = "network.attention"


def tiny(method: str, **arguments) -> LMBase:
    """The registered `method`'s module at its smallest (its entry's `tiny_knobs` on VOCAB symbols);
    keyword arguments override its arguments, a knob group's dict only the fields it names
    (`tiny("transformer_xl", network={"dropout": 0.0}, mem_len=8)`)."""
    entry = registry.METHODS[method]
    tiny_knobs = copy.deepcopy(dict(entry.tiny_knobs))
    return entry.module_class()(**override_groups({"vocab_size": VOCAB, **tiny_knobs}, arguments))


# Keyed like `longctx.methods.registry.METHODS` (the method folders).
TINY: dict[str, TinyMethod] = {
    name: TinyMethod(partial(tiny, name), DATA[method.module_class().batch_mode], method.kernel_knob)
    for name, method in registry.METHODS.items()
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
