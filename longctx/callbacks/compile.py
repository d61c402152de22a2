"""`CompileNetwork`: `torch.compile` for any method, opted into from the config (`trainer.callbacks`).

It wraps a method's network (`net`, or the GPT-2's base model `backbone` for the recurrent GPT-2:
the module's `network_attribute`) in `torch.compile` once the module is on its device. Memories
change shape only at the first segments (empty -> full Transformer-XL memory, zero -> carried span
cache) or when a learned span crosses a 64-position trimming step (Adaptive Span): `dynamic=None`
lets Dynamo mark such a dimension dynamic after its first change, and the train/eval switch
compiles the eval graphs once, so a run recompiles a handful of times and then never again (check
with `TORCH_LOGS=recompiles`; tests/callbacks/test_compile.py asserts it for all three methods on CPU
inductor, with the compiled network's loss equal to the eager one). GPUs are untested here.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
import torch._functorch.config


def compile_network(network: torch.nn.Module, **options) -> None:
    """`network.compile(**options)` in place (parameters and state-dict keys stay the plain
    network's), with AOTAutograd regenerating the graph's aliased outputs by `as_strided` rather than
    by replaying their views. torch 2.13's view replay intermittently reads garbage sizes (`shape
    '[94691487277021, 9217851614632076422, 512]' is invalid for input of size 32768`, Transformer-XL
    training on CPU inductor, about one run in two of `benchmarks/compile.py`'s tiny line): a crash,
    or a wrong tensor where the garbage happens to fit."""
    torch._functorch.config.view_replay_for_aliased_outputs = False
    network.compile(**options)


class CompileNetwork(pl.Callback):
    """`torch.compile` the LightningModule's network at setup (in place: state-dict keys unchanged).

    Args:
        attribute: the module attribute holding the network; None: the module's `network_attribute`.
        mode: `torch.compile` mode (`default`, `reduce-overhead`, `max-autotune`).
        dynamic: None (automatic dynamic shapes), True or False, as in `torch.compile`.
        fullgraph: require a single graph (fails loudly on graph breaks).
    """

    def __init__(
        self,
        attribute: str | None = None,
        mode: str = "default",
        dynamic: bool | None = None,
        fullgraph: bool = False,
    ) -> None:
        self.attribute, self.mode, self.dynamic, self.fullgraph = attribute, mode, dynamic, fullgraph

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        attribute = self.attribute or getattr(pl_module, "network_attribute", "net")
        network = getattr(pl_module, attribute, None)
        if not isinstance(network, torch.nn.Module):
            raise ValueError(
                f"CompileNetwork: {type(pl_module).__name__} has no network attribute {attribute!r}; "
                "set trainer.callbacks' CompileNetwork attribute to the module that holds it"
            )
        if getattr(network, "_compiled_call_impl", None) is not None:
            return  # already compiled (a second fit/validate on the same module)
        compile_network(network, mode=self.mode, dynamic=self.dynamic, fullgraph=self.fullgraph)
