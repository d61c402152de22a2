"""What the methods' knob tests share (issue 21: one source per knob): checkpoints as versions before
the knob groups saved them (flat `hyper_parameters`), to check that such files still load, and
equality of two modules' weights."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning
import torch

from longctx.core.base import LMBase


def save_with_hparams(model: LMBase, hparams: Mapping[str, Any], path: Path) -> Path:
    """`model`'s weights as a Lightning checkpoint at `path` whose `hyper_parameters` are `hparams`
    (e.g. the flat dict the code before the groups saved) instead of the model's own."""
    checkpoint = {
        "state_dict": model.state_dict(),
        "hyper_parameters": dict(hparams),
        "pytorch-lightning_version": lightning.__version__,
    }
    model.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, path)
    return path


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    """The same state-dict keys, in the same order, with equal tensors."""
    assert list(a.state_dict()) == list(b.state_dict())
    for name, tensor in a.state_dict().items():
        assert torch.equal(tensor, b.state_dict()[name]), name
