"""Backpropagation through the K segments (windows) of a batch, shared by the recurrent methods.

A recurrent method reads a batch's K segments in order, each from the state the previous one left
(the recurrent GPT-2's h_prev (B, d), the Recurrent Memory Transformer's memory tokens (B, m, d)),
and backpropagates through all K: `unroll` runs that loop, either as a plain loop (one autograd graph
over the K segments) or, with `reverse_modules`, with the backward one segment at a time in reverse
(`reverse_window_bptt`), the same gradients at the activations of one segment. It names no method:
a method hands it its segment as a function of (k, state).

The reverse backward: backprop through K windows at the memory of one window.

Yoshida et al. 2020 §3.2 keep the memory of training on K windows near that of one window with
gradient checkpointing per window. `torch.utils.checkpoint` does recompute each window, but all K
windows still sit in one autograd graph: the engine sums each parameter's K gradient contributions
in a buffer of the parameter's size before `.grad` sees them, so during the backward of windows
K-1..1 a whole extra copy of the model's gradients (at GPT-2 scale mostly the tied 50,257 × 768
embedding) lives next to the recomputed activations.

`reverse_window_bptt` instead runs the forward of the K windows one at a time, dropping each window's
graph as soon as its outputs exist, keeping only the state entering each window (h_prev,k (B, d)) and
its RNG state, and returns the per-window NLLs and the last h_prev as outputs of one
`torch.autograd.Function`. Its backward walks the windows in
reverse: it recomputes window k from h_prev,k (same dropout masks, same autocast), backpropagates the
window's loss gradient plus the gradient arriving at its output state h_prev,k+1, and hands the
gradient at h_prev,k to window k-1. So at any time one window's activations exist.

Why an autograd Function and not manual optimization: the module keeps `LMBase`'s contract (the
training step returns the loss, Lightning calls `backward`), so gradient clipping, gradient
accumulation, the precision plugins (loss scaling, autocast) and DDP work unchanged. The inner
per-window backwards accumulate into *aliases* of the parameters (`p.detach()`: same storage, own
`.grad`, added in place per parameter as soon as it is ready, so no second whole-model buffer), and
the Function returns those sums as the gradients of the real parameters, which are its inputs. The
real parameters therefore see exactly one gradient per step, through autograd's own accumulation:
DDP's reducer hooks fire once per parameter (a reentrant backward into the real `.grad` would fire
them K times and DDP refuses that), and the gradient sync happens once, after the last window.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.utils.checkpoint import get_device_states, set_device_states

# window(k, h_prev) -> (nll_k (B, T), h_prev for window k + 1 (B, d))
WindowFn = Callable[[int, Tensor | None], tuple[Tensor, Tensor]]
# segment(k, state) -> (nll_k (B, T), the state leaving segment k, correct_k (B, T) bool or None)
SegmentFn = Callable[[int, Tensor | None], tuple[Tensor, Tensor, Tensor | None]]
N_ARGS = 6  # arguments of _ReverseWindows.forward before the parameters


class _RngState:
    """The CPU and device RNG states before a window, so its recomputation draws the same dropout."""

    def __init__(self, device: torch.device) -> None:
        self.cpu = torch.get_rng_state()
        on_device = [] if device.type in ("cpu", "meta") else [torch.empty(0, device=device)]
        self.devices, self.device_states = get_device_states(*on_device)

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        set_device_states(self.devices, self.device_states)


class _ReverseWindows(torch.autograd.Function):
    """Outputs: nll (B, K, T), h_prev after window K (B, d). Inputs: h_prev (or None), the parameters."""

    @staticmethod
    def forward(
        ctx: Any,
        unit: WindowUnit,
        n_windows: int,
        device: torch.device,
        autocast: dict[str, Any] | None,
        names: list[str],
        h_prev: Tensor | None,
        *params: Tensor,
    ) -> tuple[Tensor, Tensor]:
        states: list[Tensor | None] = []  # h_prev entering window k
        rng: list[_RngState] = []
        nlls = []
        for k in range(n_windows):
            states.append(h_prev)
            rng.append(_RngState(device))
            # With the graph on, as in the recomputation: without it dropout on a bfloat16 input that
            # needs no gradient draws its mask another way (a different `dropout` kernel).
            with torch.enable_grad():
                nll, h_prev = unit(k, h_prev)
            nll, h_prev = nll.detach(), h_prev.detach()  # the window's graph is freed here
            nlls.append(nll)
        ctx.unit, ctx.names, ctx.states, ctx.rng = unit, names, states, rng
        ctx.device_type, ctx.autocast = device.type, autocast
        ctx.set_materialize_grads(False)
        return torch.stack(nlls, 1), h_prev

    @staticmethod
    def backward(ctx: Any, grad_nll: Tensor | None, grad_h: Tensor | None) -> tuple[Tensor | None, ...]:
        # One alias per *use* of a parameter (a tied embedding is read as `wte` and as `lm_head`).
        # The first window takes its gradients as autograd forms them (freed activations make room);
        # after it, all uses of a parameter share one `.grad`, so each later contribution is added in
        # place as soon as it is ready instead of waiting in a buffer for the parameter's other use.
        params = dict(ctx.unit.named_parameters())
        needed = {
            id(params[n]) for n, grad in zip(ctx.names, ctx.needs_input_grad[N_ARGS:], strict=True) if grad
        }
        uses: dict[int, list[Tensor]] = {}
        aliases = {}
        for path, param in ctx.unit.named_parameters(remove_duplicate=False):
            if id(param) in needed:
                aliases[path] = param.detach().requires_grad_()
                uses.setdefault(id(param), []).append(aliases[path])
        first_needs_grad = ctx.needs_input_grad[N_ARGS - 1]
        devices = ctx.rng[0].devices
        autocast = torch.autocast(ctx.device_type, **ctx.autocast) if ctx.autocast else nullcontext()
        with (
            torch.random.fork_rng(devices=devices, device_type=ctx.device_type),
            torch.enable_grad(),
            autocast,
        ):
            for k in reversed(range(len(ctx.states))):
                state = ctx.states[k]
                if state is not None and (k > 0 or first_needs_grad):
                    state = state.detach().requires_grad_()
                ctx.rng[k].restore()
                nll, h_next = functional_call(
                    ctx.unit, aliases, (k, state), strict=False, tie_weights=False
                )  # the window on the aliases: the real parameters stay out of this graph
                # The window's loss gradient plus the gradient arriving at its output state.
                pairs = [(nll, None if grad_nll is None else grad_nll[:, k]), (h_next, grad_h)]
                pairs = [(out, grad) for out, grad in pairs if grad is not None]
                if pairs:
                    torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])
                grad_h = state.grad if state is not None and state.requires_grad else None
                ctx.states[k] = None  # each boundary state is freed as soon as its window is done
                _share_grads(uses)
        sums = {key: group[0].grad for key, group in uses.items()}
        for alias in aliases.values():
            alias.grad = None  # the returned tensors are the only references: `.grad` can take them
        del aliases, uses
        param_grads = [sums.pop(id(params[name]), None) for name in ctx.names]
        return (None,) * (N_ARGS - 1) + (grad_h if first_needs_grad else None, *param_grads)


def _share_grads(uses: dict[int, list[Tensor]]) -> None:
    """Give all aliases of one parameter one `.grad` (the sum of theirs), added to in place after."""
    for group in uses.values():
        grads = [alias.grad for alias in group if alias.grad is not None]
        if len(group) == 1 or not grads or all(g is grads[0] for g in grads):
            continue
        total = grads[0]
        for grad in grads[1:]:
            if grad is not total:
                total += grad
        for alias in group:
            alias.grad = total


class WindowUnit(nn.Module):
    """The modules one window runs, under one root so `functional_call` can swap all their parameters.

    forward(k, h_prev) calls `window(k, h_prev)`, which must read the parameters through `modules`.
    """

    def __init__(self, modules: dict[str, nn.Module], window: WindowFn) -> None:
        super().__init__()
        self.parts = nn.ModuleDict(modules)
        self.window = window

    def forward(self, k: int, h_prev: Tensor | None) -> tuple[Tensor, Tensor]:
        return self.window(k, h_prev)


def reverse_window_bptt(
    modules: dict[str, nn.Module],
    window: WindowFn,
    n_windows: int,
    h_prev: Tensor | None,
    device: torch.device,
) -> tuple[Tensor, Tensor]:
    """Run `window` over K windows, carrying h_prev, with the backward window by window in reverse.

    modules: every module whose parameters `window` uses (they get gradients).
    Returns nll (B, K, T) and the h_prev after the last window (B, d), as `window` in a loop would.
    """
    unit = WindowUnit(modules, window)
    named = [(name, p) for name, p in unit.named_parameters() if p.requires_grad]
    names, params = [name for name, _ in named], [p for _, p in named]
    device_type = device.type
    autocast = None  # the recomputation runs under the autocast state of the forward
    if device_type != "meta" and torch.is_autocast_enabled(device_type):
        autocast = {
            "dtype": torch.get_autocast_dtype(device_type),
            "cache_enabled": torch.is_autocast_cache_enabled(),
        }
    return _ReverseWindows.apply(unit, n_windows, device, autocast, names, h_prev, *params)


class Unrolled(NamedTuple):
    """What `unroll` returns for K segments: nll (B, K, T); state, what the last segment left;
    correct (B, K, T) bool (the target is the model's argmax), None when `segment` gave none."""

    nll: Tensor
    state: Tensor
    correct: Tensor | None = None


def unroll(
    segment: SegmentFn,
    n_segments: int,
    state: Tensor | None,
    device: torch.device,
    reverse_modules: dict[str, nn.Module] | None = None,
) -> Unrolled:
    """Run `segment` over K = `n_segments` segments in order, carrying `state` (None: the first reads
    none), with the gradient through all K.

    reverse_modules: every module whose parameters `segment` uses: while the graph is on, the backward
    runs one segment at a time in reverse (`reverse_window_bptt`: the same gradients, no correctness
    returned); None: a plain loop.
    """
    if reverse_modules is not None and torch.is_grad_enabled():
        nll, state = reverse_window_bptt(
            reverse_modules, lambda k, state: segment(k, state)[:2], n_segments, state, device
        )
        return Unrolled(nll, state)
    nlls, corrects = [], []
    for k in range(n_segments):
        nll, state, correct = segment(k, state)
        nlls.append(nll)
        corrects.append(correct)
    correct = None if corrects[0] is None else torch.stack(corrects, 1)
    return Unrolled(torch.stack(nlls, 1), state, correct)
