"""Checkpoints as earlier versions saved them: flat `hyper_parameters`, from before the knob groups
(issue 21), so that the methods' tests can check that such files still load."""

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
