"""Adagrad with the per-tensor step clipping of the Adaptive Span code (Sukhbaatar et al. 2019, §4.1).

The paper trains with "Adagrad ... with a gradient clipping of 0.03". In the released code
(facebookresearch/adaptive-span, `adagrad_with_grad_clip.py`) the clipping is per parameter tensor and
only rescales that tensor's step: the accumulator sums the unclipped squared gradient,

    sum += g²;   lr_t = lr · (clip / (‖g‖₂ + 1e-10) if ‖g‖₂ > clip else 1);   p -= lr_t · g / (√sum + 1e-10).

We follow the code. Lightning's `gradient_clip_val` must stay unset with this optimizer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer


class ClippedAdagrad(Optimizer):
    """Adagrad whose per-tensor step is rescaled when that tensor's gradient norm exceeds `grad_clip`.

    Args:
        params: parameters or parameter groups.
        lr: learning rate (paper: 0.07).
        grad_clip: per-tensor gradient-norm threshold (paper: 0.03); 0 disables clipping.
        initial_accumulator_value: starting value of the squared-gradient sums.
        eps: added to √sum (the code's 1e-10).
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 0.07,
        grad_clip: float = 0.03,
        initial_accumulator_value: float = 0.0,
        eps: float = 1e-10,
    ) -> None:
        if lr < 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if grad_clip < 0:
            raise ValueError(f"grad_clip must be >= 0 (0 disables it), got {grad_clip}")
        if initial_accumulator_value < 0:
            raise ValueError(f"initial_accumulator_value must be >= 0, got {initial_accumulator_value}")
        defaults = dict(
            lr=lr, grad_clip=grad_clip, initial_accumulator_value=initial_accumulator_value, eps=eps
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("ClippedAdagrad does not support sparse gradients")
                grad = p.grad
                state = self.state[p]
                if not state:
                    state["sum"] = torch.full_like(p, group["initial_accumulator_value"])
                state["sum"].addcmul_(grad, grad)
                step_size = torch.full((), group["lr"], device=p.device, dtype=p.dtype)
                if group["grad_clip"] > 0:
                    # A tensor, not .item(): no host sync per parameter on GPUs.
                    norm = torch.linalg.vector_norm(grad)
                    scale = torch.where(norm > group["grad_clip"], group["grad_clip"] / (norm + 1e-10), 1.0)
                    step_size = step_size * scale
                p.addcdiv_(grad * -step_size, state["sum"].sqrt().add_(group["eps"]))
        return loss
