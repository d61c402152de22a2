"""Where a non-finite training loss came from: the first module whose output, or the first weight
whose gradient, was not finite (what fairseq's `NanDetector` reports when a loss goes NaN).

`StopOnDivergence` keeps, by reference, each step's batch and the carried memory it started from
(no copy), and one flag per batch on the device: whether its loss is finite. It reads that flag
before the optimizer applies the step's gradient when the read costs no device sync (the flag is on
the CPU) or is due anyway (a step whose verdict is read, every `check_every_n_steps`); for the first
non-finite step found there it calls `origin` once, with the weights and memory that step used:

- weights already non-finite: an earlier update applied a non-finite gradient while its loss was
  still finite (a gradient-only NaN). The step's backward is replayed to learn the order in which it
  reaches the weights; the first non-finite one in that order is where the gradient went bad (its
  layer and everything before it got it; the layers after it did not). When every weight is
  non-finite (clipping by the global norm spreads one non-finite gradient to all), no weight can be
  named;
- otherwise the step's forward is replayed with a forward hook on every module: the first module
  whose forward returns a NaN or an infinity (hooks fire as forwards return, so an inner module
  comes before the one that called it) made it; if every output is finite, the loss computed from
  them is not.

A replay draws its own random numbers (dropout), so it may not reproduce a NaN that depended on them;
the line then says so. The training state is left as it was (the memory, the gradients), and no hook
stays registered: a healthy step pays for the references and one flag, nothing else. A step found
only after its update (a GPU between two reads) has every weight non-finite by then: `weights_note`
says so, and how to find the start (`--divergence.check_every_n_steps 1` reads each step before its
update, at a sync per step). Under DDP no step is replayed (its all-reduces would wait for the other
ranks): the weights are checked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn

# When every weight is non-finite, the state cannot tell where it started; this can.
ALL_BAD_FIX = (
    "to name the module or weight it started at, resume from the last checkpoint with "
    "--divergence.check_every_n_steps 1 (each step read before its update, a device sync per step)"
)


@dataclass
class StepRecord:
    """One training batch as its step saw it: the batch, its index, the carried memory it started
    from (references), and whether its loss was non-finite (a device tensor, set before backward)."""

    batch: Any
    batch_idx: int
    memory: Any
    nonfinite: Tensor | None = None


def memory_before(pl_module: pl.LightningModule) -> Any:
    """The training memory a step of an `LMBase` starts from (None for a module without one)."""
    memories = getattr(pl_module, "_memory", None)
    return memories.get("train") if isinstance(memories, dict) else None


def origin(
    trainer: pl.Trainer, pl_module: pl.LightningModule, record: StepRecord, step: int, at_start: list[str]
) -> str:
    """The line's account of where the non-finite loss of `step` came from, found before the step's
    update (see the module docstring); `at_start`: the weights that were non-finite as the fit started
    (initialised or loaded so)."""
    if trainer.world_size > 1:
        return weights_note(pl_module, step) or "no step is replayed under DDP to find its origin"
    bad, total = nonfinite_weights(pl_module), sum(1 for _ in pl_module.parameters())
    if started := [name for name in bad if name in at_start]:
        return (
            f"the weights were non-finite as the fit started: {started[0]} ({len(started)} of {total} "
            "tensors)"
        )
    if len(bad) == total:
        return (
            f"every weight tensor was already non-finite before step {step} (an update before it applied a "
            f"non-finite gradient): {ALL_BAD_FIX}"
        )
    if bad:
        order = _replay(trainer, pl_module, record, backward=True).backward_order
        first = next((name for name in order if name in bad), bad[0])
        return (
            f"the weights were already non-finite before step {step}: an update before it applied a "
            f"non-finite gradient while the loss was finite, first (in the backward's order) to {first} "
            f"({len(bad)} of {total} weight tensors non-finite)"
        )
    replay = _replay(trainer, pl_module, record, backward=False)
    if replay.first_output is not None:
        return f"the first non-finite output at step {step}: {replay.first_output}"
    if replay.loss_finite:
        return f"a replay of step {step} gave a finite loss (its random draws, e.g. dropout, differ)"
    return f"at step {step} every module's output was finite: the loss computed from them is not"


def weights_note(pl_module: pl.LightningModule, step: int) -> str | None:
    """The account when the step is found after its update: which weights are non-finite by now."""
    bad, total = nonfinite_weights(pl_module), sum(1 for _ in pl_module.parameters())
    if not bad:
        return None
    if len(bad) == total:
        return (
            f"every weight tensor is non-finite by the time it was read (the update of step {step} applied "
            f"the non-finite gradient): {ALL_BAD_FIX}"
        )
    return f"{len(bad)} of {total} weight tensors are non-finite by the time it was read, e.g. {bad[0]}"


def nonfinite_weights(pl_module: nn.Module) -> list[str]:
    """The names of the parameters holding a NaN or an infinity (a host read per parameter: once)."""
    return [name for name, p in pl_module.named_parameters() if not bool(torch.isfinite(p).all())]


@dataclass
class Replay:
    """first_output: `name (Class)` of the first module whose output was non-finite, or None;
    loss_finite: whether the replayed loss was; backward_order: parameter names in the order the
    replayed backward accumulated their gradients (empty without a backward)."""

    first_output: str | None
    loss_finite: bool
    backward_order: list[str]


def _replay(trainer: pl.Trainer, pl_module: pl.LightningModule, record: StepRecord, backward: bool) -> Replay:
    """Run the step's `training_step` again (and its backward) with hooks, then put every hook, the
    memory and the gradients back as they were."""
    first: list[str] = []
    order: list[str] = []

    def check(name: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if not first and _has_nonfinite(output):
                first.append(f"{name} ({type(module).__name__})")

        return hook

    params = {p: name for name, p in pl_module.named_parameters() if p.requires_grad}
    handles = [
        module.register_forward_hook(check(name)) for name, module in pl_module.named_modules() if name
    ]
    if backward:
        handles += [p.register_post_accumulate_grad_hook(lambda p: order.append(params[p])) for p in params]
    with _state_kept(pl_module, record, list(params)):
        try:
            with torch.enable_grad(), trainer.precision_plugin.train_step_context():
                output = pl_module.training_step(record.batch, record.batch_idx)
            loss = output["loss"] if isinstance(output, dict) else output
            if backward and isinstance(loss, Tensor) and loss.requires_grad:
                loss.backward()
        finally:
            for handle in handles:
                handle.remove()
    finite = isinstance(loss, Tensor) and bool(torch.isfinite(loss.detach()).all())
    return Replay(first[0] if first else None, finite, order)


@contextmanager
def _state_kept(
    pl_module: pl.LightningModule, record: StepRecord, params: list[nn.Parameter]
) -> Iterator[None]:
    """The step's starting memory in place and logging off for a replay; afterwards the memory and
    the gradients of the real step back, as the training goes on until its verdict is read."""
    memories = getattr(pl_module, "_memory", None)
    saved_memory = memories.get("train") if isinstance(memories, dict) else None
    saved_grads = [p.grad for p in params]
    if isinstance(memories, dict):
        memories["train"] = record.memory
    for p in params:
        p.grad = None
    pl_module.log = pl_module.log_dict = _no_log  # instance attributes shadowing the methods
    try:
        yield
    finally:
        del pl_module.log, pl_module.log_dict
        if isinstance(memories, dict):
            memories["train"] = saved_memory
        for p, grad in zip(params, saved_grads):
            p.grad = grad


def _no_log(*args: Any, **kwargs: Any) -> None:
    """A replay's metrics are not the run's."""


def _has_nonfinite(output: Any) -> bool:
    """Whether a module's output (a tensor, or tensors in tuples, lists, dicts or dataclasses) holds a
    NaN or an infinity."""
    if isinstance(output, Tensor):
        return output.is_floating_point() and not bool(torch.isfinite(output).all())
    if isinstance(output, tuple | list):
        return any(_has_nonfinite(item) for item in output)
    if isinstance(output, dict):
        return any(_has_nonfinite(item) for item in output.values())
    if dataclasses.is_dataclass(output) and not isinstance(output, type):
        return any(_has_nonfinite(getattr(output, field.name)) for field in dataclasses.fields(output))
    return False
