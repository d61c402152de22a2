"""The method registry: one line per method, naming its LightningModule and its tiny recipe.

Adding a method means one folder (`longctx/methods/<method>/`), one config (`configs/<...>_tiny.yaml`)
and one line here (docs/architecture.md, "Adding a method"). `tests/test_layout.py` checks that every
method folder has its line, and every cross-method test (resume, DDP, precision, compile, train mode,
meta device, per-token losses) runs every method listed here through `tests/methods.py`.

Modules are named by import path, not imported: reading the registry loads no method (nor
transformers).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    """module: import path of the method's `LMBase` subclass; tiny_config: its smallest recipe, a
    path relative to the repository root (trains on CPU in minutes)."""

    module: str
    tiny_config: str

    def module_class(self) -> type:
        """The LightningModule class (imports the method)."""
        package, name = self.module.rsplit(".", 1)
        return getattr(importlib.import_module(package), name)


# Keyed by the method's folder name under longctx/methods/.
METHODS: dict[str, Method] = {
    "adaptive_span": Method(
        "longctx.methods.adaptive_span.module.AdaptiveSpanLM", "configs/adaptive_span_tiny.yaml"
    ),
    "compressive_transformer": Method(
        "longctx.methods.compressive_transformer.module.CompressiveTransformerLM",
        "configs/compressive_transformer_tiny.yaml",
    ),
    "recurrence": Method(
        "longctx.methods.recurrence.module.RecurrentGPT2LM", "configs/recurrent_gpt2_tiny.yaml"
    ),
    "recurrent_memory": Method(
        "longctx.methods.recurrent_memory.module.RecurrentMemoryLM", "configs/recurrent_memory_tiny.yaml"
    ),
    "transformer_xl": Method(
        "longctx.methods.transformer_xl.module.TransformerXLLM", "configs/transformer_xl_tiny.yaml"
    ),
    "window_transformer": Method(
        "longctx.methods.window_transformer.module.WindowTransformerLM",
        "configs/window_transformer_tiny.yaml",
    ),
}
