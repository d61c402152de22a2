"""`check_checkpoint_fits`: a checkpoint's class, keys and shapes against the configured model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from longctx.checkpoints.fit_check import CheckpointMismatch, check_checkpoint_fits


class Net(nn.Module):
    def __init__(self, width: int = 4, extra: bool = False) -> None:
        super().__init__()
        self.a = nn.Linear(3, width)
        if extra:
            self.b = nn.Linear(width, 2)


def save(tmp_path, model: nn.Module, class_path: str | None = None):
    path = tmp_path / "x.ckpt"
    hparams = {"width": 4} if class_path is None else {"_class_path": class_path, "width": 4}
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": hparams}, path)
    return path


def test_a_fitting_checkpoint_passes_and_a_moved_class_is_the_same_class(tmp_path):
    check_checkpoint_fits(save(tmp_path, Net()), Net())
    check_checkpoint_fits(save(tmp_path, Net(), "an.old.module.path.Net"), Net())


def test_another_class_is_named(tmp_path):
    path = save(tmp_path, Net(), "longctx.methods.other.module.OtherLM")
    with pytest.raises(CheckpointMismatch) as error:
        check_checkpoint_fits(path, Net())
    assert str(error.value) == (
        f"checkpoint {path} does not fit the configured model tests.checkpoints.test_checkpoint_fit.Net: "
        "it holds a longctx.methods.other.module.OtherLM; give the config it was trained with "
        "(evaluation settings may differ, the architecture may not)"
    )


def test_keys_count_only_under_strict_loading_and_shapes_always(tmp_path):
    path = save(tmp_path, Net(extra=True))
    with pytest.raises(CheckpointMismatch, match=r": 2 unexpected weights \(b.bias, b.weight\);"):
        check_checkpoint_fits(path, Net())
    check_checkpoint_fits(path, Net(), strict=False)
    with pytest.raises(
        CheckpointMismatch, match=r"2 shapes differ, checkpoint vs model \(a.bias: \(4,\) vs \(5,\);"
    ):
        check_checkpoint_fits(path, Net(width=5), strict=False)


def test_a_file_without_state_dict_is_not_a_lightning_checkpoint(tmp_path):
    torch.save({"model": Net().state_dict()}, tmp_path / "raw.pt")
    with pytest.raises(CheckpointMismatch, match="has no state_dict: it is not a Lightning checkpoint"):
        check_checkpoint_fits(tmp_path / "raw.pt", Net())
