"""`WindowTransformerLM`: the no-memory baseline (`network.WindowTransformer`) on the `LMBase` spine.

It reads segment batches (`data.mode: segments`): every segment of L tokens is an independent window,
nothing is carried from one batch to the next (memory None), so the first target of a segment is
predicted from one token and the last from L. This is the cost/quality floor the memory methods
(Transformer-XL, TRAMS, adaptive span, recurrence) are compared with.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from longctx.core.base import LMBase, StepOutput
from longctx.methods.window_transformer.flops import flops_per_token
from longctx.methods.window_transformer.network import WindowTransformer


class WindowTransformerLM(LMBase):
    """A GPT-2-style causal transformer over independent windows.

    Args:
        d_model, n_layers, n_heads, d_inner: sizes.
        max_len: learned positions, at least the longest segment (data.tgt_len and data.eval_tgt_len).
        dropout: embedding, attention and residual dropout.
        vocab_size, optimizer, lr_scheduler: see `LMBase`.
    """

    batch_mode = "segments"

    def __init__(
        self,
        vocab_size: int = 0,
        d_model: int = 128,
        n_layers: int = 4,
        n_heads: int = 4,
        d_inner: int = 512,
        max_len: int = 512,
        dropout: float = 0.1,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__(vocab_size=vocab_size, optimizer=optimizer, lr_scheduler=lr_scheduler)
        self.save_hyperparameters()
        self.net = WindowTransformer(vocab_size, d_model, n_layers, n_heads, d_inner, max_len, dropout)

    def step(self, batch: dict[str, Tensor], memory: None) -> StepOutput:
        x = batch["input"]  # (B, L)
        logits = self.net(x)  # (B, L, V)
        nll = F.cross_entropy(logits.float().transpose(1, 2), batch["target"], reduction="none")  # (B, L)
        return StepOutput(nll=nll, memory=None)

    def flops_per_token(self, segment_length: int) -> float:
        """Forward FLOPs per scored token on segments of `segment_length` tokens (2 × multiply-accumulates);
        `LMBase` logs it as `{val,test}/flops_per_token`."""
        h = self.hparams
        return flops_per_token(h.d_model, h.n_layers, h.d_inner, self.vocab_size, segment_length)
