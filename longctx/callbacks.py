"""Callbacks that any method can opt into from its config (`trainer.callbacks`).

`CompileNetwork` wraps a method's network (`pl_module.net`) in `torch.compile` once the module is on
its device. Memories change shape only at the first segment (empty -> full Transformer-XL memory)
or when a learned span crosses a 64-position trimming step (Adaptive Span): `dynamic=None` lets
Dynamo mark such a dimension dynamic after its first change, so a run recompiles a handful of times
and then never again (check with `TORCH_LOGS=recompiles`). Tested on CPU for Transformer-XL
(tests/test_compile.py); Adaptive Span's compiled backward failed on CPU inductor in a tiny
configuration ("Cannot access data pointer of Storage that is invalid"), and GPUs are untested.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch


class CompileNetwork(pl.Callback):
    """`torch.compile` the LightningModule's `net` attribute at setup.

    Args:
        attribute: the module attribute holding the network (all longctx models use `net`).
        mode: `torch.compile` mode (`default`, `reduce-overhead`, `max-autotune`).
        dynamic: None (automatic dynamic shapes), True or False, as in `torch.compile`.
        fullgraph: require a single graph (fails loudly on graph breaks).
    """

    def __init__(
        self,
        attribute: str = "net",
        mode: str = "default",
        dynamic: bool | None = None,
        fullgraph: bool = False,
    ) -> None:
        self.attribute, self.mode, self.dynamic, self.fullgraph = attribute, mode, dynamic, fullgraph

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        network = getattr(pl_module, self.attribute, None)
        if not isinstance(network, torch.nn.Module):
            raise ValueError(
                f"CompileNetwork: {type(pl_module).__name__} has no network attribute {self.attribute!r}"
            )
        if getattr(network, "_compiled_call_impl", None) is not None:
            return  # already compiled (a second fit/validate on the same module)
        # `Module.compile` compiles in place: parameters and state-dict keys stay the plain network's.
        network.compile(mode=self.mode, dynamic=self.dynamic, fullgraph=self.fullgraph)
