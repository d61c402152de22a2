"""Cross-entropy of a linear LM head, `chunk` tokens at a time: the (N, V) logits never exist at once.

With GPT-2's 50,257-token vocabulary the logits are a training step's largest activations: at the
paper's window (T = 300) one window's float32 logits take 58 MiB, and the log-softmax that
`F.cross_entropy` saves and the logits' gradient take as much again each, more than one block's
activations. `linear_cross_entropy` makes the logits of `chunk` tokens at a time:

- forward: per chunk, z = h Wᵀ and its log-partition lse = log Σ_v exp z_v; it keeps only h, the
  targets and lse (N floats), and returns nll = lse − z_target;
- backward: per chunk, z again, then ∂nll/∂z = softmax(z) − onehot(target) (times the incoming
  gradient), the chunk's ∂h = (∂z) W, and ∂W += (∂z)ᵀ h added in place (`addmm_`) into one (V, d)
  buffer, so the head's backward holds its weight gradient and one chunk of logits.

The cost is the head's logits computed twice (the head is a third of GPT-2 small's forward matmuls).
The numbers are those of `F.cross_entropy(F.linear(h, W), target)` up to the order of floating-point
sums (tests: ≤ 1e-6). Under autocast the logits are made in the autocast dtype, as `F.linear` would,
and upcast to float32 for the softmax, as the stock path does (`logits.float()`; float64 stays
float64, so the gradient can be checked numerically); the weight gradient
is accumulated in float32 from the same low-precision factors. The same idea is Liger-Kernel's fused
linear cross-entropy and torchtune's chunked output loss.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE_INDEX = -100  # F.cross_entropy's default: such targets get nll 0 and no gradient


class _LinearCrossEntropy(torch.autograd.Function):
    """nll (N,) of targets (N,) under logits h Wᵀ, h (N, d), W (V, d), made `chunk` rows at a time."""

    @staticmethod
    def forward(ctx: Any, h: Tensor, weight: Tensor, target: Tensor, chunk: int) -> Tensor:
        logits_dtype = F.linear(h[:0], weight).dtype  # autocast's dtype under autocast (a 0-row product)
        loss_dtype = torch.promote_types(logits_dtype, torch.float32)
        nll = torch.empty(h.shape[0], dtype=loss_dtype, device=h.device)
        lse = torch.empty_like(nll)
        for rows in _chunks(h.shape[0], chunk):
            z = F.linear(h[rows], weight).to(loss_dtype)  # (n, V), made in logits_dtype
            lse[rows] = torch.logsumexp(z, dim=-1)
            z_target = z.gather(1, target[rows].clamp_min(0)[:, None])[:, 0]
            nll[rows] = lse[rows] - z_target
        nll.masked_fill_(target == IGNORE_INDEX, 0.0)
        ctx.save_for_backward(h, weight, target, lse)
        ctx.chunk, ctx.logits_dtype = chunk, logits_dtype
        return nll

    @staticmethod
    def backward(ctx: Any, grad_nll: Tensor) -> tuple[Tensor | None, ...]:
        h, weight, target, lse = ctx.saved_tensors
        dtype = ctx.logits_dtype
        w_low = weight.to(dtype)  # what autocast multiplies with (the weight itself without autocast)
        need_h, need_w = ctx.needs_input_grad[:2]
        grad_h = torch.empty_like(h) if need_h else None
        grad_w = torch.zeros_like(weight) if need_w else None
        scale = grad_nll.to(lse.dtype) * (target != IGNORE_INDEX)  # (N,)
        for rows in _chunks(h.shape[0], ctx.chunk):
            h_low = h[rows].to(dtype)
            dz = F.linear(h_low, w_low).to(lse.dtype)  # (n, V): z of the chunk, recomputed
            dz.sub_(lse[rows, None]).exp_()  # softmax(z)
            dz.scatter_add_(1, target[rows].clamp_min(0)[:, None], dz.new_full((dz.shape[0], 1), -1.0))
            dz.mul_(scale[rows, None])  # ∂loss/∂z, float32 (or float64)
            dz_low = dz.to(dtype)  # the gradient reaching F.linear's output (`.float()` casts it back)
            if grad_h is not None:
                grad_h[rows] = (dz_low @ w_low).to(h.dtype)
            if grad_w is not None:
                grad_w.addmm_(dz_low.t().to(grad_w.dtype), h_low.to(grad_w.dtype))
        return grad_h, grad_w, None, None


def _chunks(n: int, chunk: int) -> list[slice]:
    return [slice(start, min(start + chunk, n)) for start in range(0, n, chunk)]


def linear_cross_entropy(hidden: Tensor, weight: Tensor, target: Tensor, chunk: int) -> Tensor:
    """Per-token NLL (...) of `target` (...) under the logits `hidden` (..., d) Wᵀ, W (V, d), in chunks
    of `chunk` tokens; float32 like `F.cross_entropy(logits.float(), target, reduction="none")` (float64
    for float64 inputs)."""
    if chunk <= 0:
        raise ValueError(f"chunk must be a positive number of tokens, got {chunk}")
    if hidden.shape[:-1] != target.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and target {tuple(target.shape)} disagree")
    nll = _LinearCrossEntropy.apply(hidden.reshape(-1, hidden.shape[-1]), weight, target.reshape(-1), chunk)
    return nll.view(target.shape)
