"""`WindowTransformerLM`: the no-memory baseline (`network.WindowTransformer`) on the `LMBase` spine.

It reads segment batches (`data.mode: segments`): every segment of L tokens is an independent window,
nothing is carried from one batch to the next (memory None), so the first target of a segment is
predicted from one token and the last from L. This is the cost/quality floor the memory methods
(Transformer-XL, TRAMS, adaptive span, recurrence) are compared with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from longctx.core.base import LMBase, StepOutput
from longctx.core.recall import target_is_argmax
from longctx.core.run_settings import eval_window
from longctx.diagnostics.footprint import feed_forward_elements, window_elements
from longctx.methods.softmax_nll import full_softmax_nll
from longctx.methods.window_transformer.flops import flops_per_token
from longctx.methods.window_transformer.network import WindowTransformer


class WindowTransformerLM(LMBase):
    """A GPT-2-style causal transformer over independent windows.

    Args:
        network: the network's knobs (`WindowTransformer.Config`: d_model, n_layers, n_heads,
            d_inner, max_len, dropout); in configs `model.init_args.network.d_model`.
        vocab_size, optimizer, lr_scheduler: see `LMBase`.
    """

    batch_mode = "segments"

    def __init__(
        self,
        vocab_size: int = 0,
        network: WindowTransformer.Config = WindowTransformer.Config(),  # noqa: B008 (frozen)
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        network = self.read_groups(dict(network=network))["network"]
        super().__init__(vocab_size=vocab_size, optimizer=optimizer, lr_scheduler=lr_scheduler)
        self.save_hyperparameters()
        self.net = network.build(vocab_size)

    def step(self, batch: dict[str, Tensor], memory: None) -> StepOutput:
        x = batch["input"]  # (B, L)
        logits = self.net(x)  # (B, L, V)
        nll = full_softmax_nll(logits, batch["target"])  # (B, L)
        correct = target_is_argmax(logits, batch["target"]) if self.wants_correct else None
        return StepOutput(nll=nll, memory=None, correct=correct)

    @classmethod
    def describe_run(cls, model: Mapping[str, Any], data: Mapping[str, Any]) -> str:
        """The evaluation window (no memory)."""
        return f"no memory, window {eval_window(data)}"

    def longest_window(self) -> int:
        """Its learned positions: `max_len`."""
        return self.net.config.max_len

    def state_size(self) -> int:
        """0: nothing is carried from one window to the next."""
        return 0

    def evaluation_elements(self, batch_size: int, length: int) -> int:
        """A window read alone (`footprint`)."""
        c = self.net.config
        return window_elements(batch_size, length, c.n_layers, c.d_model, c.n_heads) + feed_forward_elements(
            batch_size, length, c.d_model, c.d_inner
        )

    def flops_per_token(self, segment_length: int) -> float:
        """Forward FLOPs per scored token on segments of `segment_length` tokens (2 × multiply-accumulates);
        `LMBase` logs it as `{val,test}/flops_per_token`."""
        c = self.net.config
        return flops_per_token(c.d_model, c.n_layers, c.d_inner, self.vocab_size, segment_length)
