"""A converted checkpoint: what a method's converter returns (`Converted`, or `ConvertError` naming
what does not fit), loading it into the configured model (every tensor filled, none unknown, tied
tensors equal) and the Lightning checkpoint it becomes. The command that drives a converter is
`python -m longctx convert` (`longctx.commands.convert`); each method's converter is its own
`methods/<method>/convert.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import lightning
import torch
from torch import Tensor

from longctx.core.base import LMBase


class ConvertError(ValueError):
    """A checkpoint that cannot be converted into the configured model (message says why and how)."""


@dataclass
class Converted:
    """What a format converter returns.

    state_dict: tensors under the model's own names (tied names may be given once, or several
        times with equal values).
    notes: lines printed after conversion (e.g. evaluation settings the checkpoint was released with).
    """

    state_dict: dict[str, Tensor]
    notes: list[str] = field(default_factory=list)


def _tied_groups(model: torch.nn.Module) -> dict[str, list[str]]:
    """For every state_dict key, all keys naming the same tensor (tied weights)."""
    by_tensor: dict[int, list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        by_tensor.setdefault(id(tensor), []).append(name)
    return {name: names for names in by_tensor.values() for name in names}


def load_converted(model: LMBase, state: dict[str, Tensor], source: str) -> None:
    """Copy `state` into `model`, refusing missing, unknown or mis-shaped tensors with both names."""
    expected = model.state_dict()
    groups = _tied_groups(model)
    unknown = sorted(set(state) - set(expected))
    if unknown:
        raise ConvertError(f"{source}: converted tensors {unknown} have no place in {type(model).__name__}")
    shapes = [
        f"{name} has shape {tuple(tensor.shape)}, the config's model {tuple(expected[name].shape)}"
        for name, tensor in state.items()
        if tuple(tensor.shape) != tuple(expected[name].shape)
    ]
    if shapes:
        raise ConvertError(
            f"{source}: {len(shapes)} tensors do not fit: tensor for {'; '.join(shapes)}: the config does "
            "not describe this checkpoint (check the model sizes and the corpus/vocabulary in the config)"
        )
    missing = sorted(name for name in expected if not any(alias in state for alias in groups[name]))
    if missing:
        raise ConvertError(f"{source}: nothing in the checkpoint fills {missing}")
    for name in expected:
        given = [alias for alias in groups[name] if alias in state]
        if any(not torch.equal(state[given[0]], state[alias]) for alias in given[1:]):
            raise ConvertError(
                f"{source}: the config ties {given}, but the checkpoint holds different tensors for them "
                "(check model.init_args.network.tie_weight / tie_projs)"
            )
    full = {name: state[next(a for a in groups[name] if a in state)] for name in expected}
    model.load_state_dict(full, strict=True)


def lightning_checkpoint(model: LMBase, arch_keys: Sequence[str], origin: dict[str, str]) -> dict[str, Any]:
    """What `trainer.test(ckpt_path=...)` and `load_from_checkpoint` read: the state dict, the Lightning
    version and the architecture hyperparameters (`arch_keys`, flat names, each saved where the
    module's groups put it, `network: {d_model: ...}`; with `_class_path`, as LightningCLI saves them)."""
    cls = type(model)
    hparams: dict[str, Any] = {"vocab_size": model.hparams["vocab_size"]}
    for key in arch_keys:
        *groups, field = cls.knob_path(key).split(".")
        saved, kept = model.hparams, hparams
        for group in groups:
            saved, kept = saved[group], kept.setdefault(group, {})
        kept[field] = saved[field]
    return {
        "state_dict": model.state_dict(),
        "hyper_parameters": {"_class_path": f"{cls.__module__}.{cls.__qualname__}", **hparams},
        "pytorch-lightning_version": lightning.__version__,
        "epoch": 0,
        "global_step": 0,
        "converted_from": origin,
    }
