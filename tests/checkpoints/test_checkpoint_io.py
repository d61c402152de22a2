"""Checkpoints are written in their own folder and renamed into place; a full disk is one line, the
run is marked failed, and nothing is left under the checkpoint's name."""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path

import pytest
import torch

from longctx.checkpoints.saving import AtomicCheckpointIO, DiskFullError
from tests.helpers.environment import REPO


def fill_disk_after(monkeypatch: pytest.MonkeyPatch, limit: int) -> None:
    """Writes to checkpoint files (`*.ckpt*` opened with `Path.open`) stop with ENOSPC after `limit`
    bytes, as on a full disk: the bytes before that reach the file."""
    real_open = Path.open

    class FullDisk:
        def __init__(self, file) -> None:
            self.file, self.written = file, 0

        def write(self, data) -> int:
            room = max(limit - self.written, 0)
            self.written += self.file.write(bytes(data)[:room])
            if room < len(data):
                raise OSError(errno.ENOSPC, "No space left on device")
            return len(data)

        def __getattr__(self, name):
            return getattr(self.file, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self.file.close()

    def open_full(path, mode="r", *args, **kwargs):
        file = real_open(path, mode, *args, **kwargs)
        return FullDisk(file) if "w" in mode and ".ckpt" in Path(path).name else file

    monkeypatch.setattr(Path, "open", open_full)


def test_a_checkpoint_is_written_beside_its_name_and_renamed_into_place(tmp_path, monkeypatch):
    renames = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: renames.append((src, dst)) or real_replace(src, dst))
    path = tmp_path / "run" / "checkpoints" / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"w": torch.arange(4)}, path)
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.arange(4))
    assert [Path(src).parent for src, dst in renames] == [path.parent]  # never the system temp folder
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]


def test_a_full_disk_keeps_the_previous_checkpoint_whole_and_says_what_it_needs(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"w": torch.zeros(10)}, path)
    previous = path.read_bytes()
    fill_disk_after(monkeypatch, 1000)  # part of the ~1 MB checkpoint fits
    with pytest.raises(DiskFullError) as full:
        AtomicCheckpointIO().save_checkpoint({"w": torch.zeros(250_000)}, path)
    message = str(full.value)
    assert message.startswith(f"disk full writing checkpoint {path}: it needs 1.0 MB, ")
    assert re.search(r"it needs 1\.0 MB, [\d,.]+ (GB|MB|kB|bytes) free there ", message)
    assert "--trainer.default_root_dir" in message and "\n" not in message
    assert path.read_bytes() == previous  # the old checkpoint, whole; no partial file beside it
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]


@pytest.mark.slow  # a tiny fit in-process (~10 s)
def test_disk_full_during_a_fit_is_one_line_and_the_run_is_marked_failed(tmp_path, monkeypatch, capsys):
    from longctx.commands.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    fill_disk_after(monkeypatch, 1000)
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "fit", "--config", str(REPO / "configs" / "quickstart.yaml"),
                "--data.cache_dir", str(tmp_path / "cache"), "--trainer.max_steps", "2",
                "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1",
                "--trainer.enable_progress_bar", "false", "--trainer.logger", "false", "--run_name", "full",
            ]
        )  # fmt: skip
    run_dir = Path("runs/full")
    message = str(exit_info.value.code)
    assert message.startswith("error: disk full writing checkpoint ")
    assert str(run_dir / "checkpoints") in message
    assert "\n" not in message and "Traceback" not in capsys.readouterr().err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"].startswith("DiskFullError: disk full writing")
    assert summary["commands"]["fit"][:2] == ["fit", "--config"]  # what the sweep runner compares
    assert not list((run_dir / "checkpoints").glob("*"))  # no partial checkpoint, no temporary file
