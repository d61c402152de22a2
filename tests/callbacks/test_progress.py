"""What a log file shows: plain progress lines instead of tqdm's redraws, and one closing summary."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from longctx.commands.cli import main
from tests.helpers.lm_fixtures import run_cli_in


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path, monkeypatch):
    run_cli_in(tmp_path, monkeypatch)


def tiny_fit_args(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "fit",
        "--model", "tests.helpers.lm_fixtures.CarryLM",
        "--data.corpus", "sample", "--data.batch_size", "4", "--data.tgt_len", "32",
        "--data.cache_dir", str(tmp_path / "cache"),
        "--trainer.accelerator", "cpu", "--trainer.logger", "false",
        "--trainer.max_steps", "6", "--trainer.val_check_interval", "3",
        "--trainer.limit_val_batches", "2", "--trainer.check_val_every_n_epoch", "null",
        "--trainer.callbacks+=longctx.callbacks.RunCheckpoint",
        "--trainer.callbacks.monitor", "val/loss", "--trainer.callbacks.save_last", "true",
        "--run_name", "tiny",
        *extra,
    ]  # fmt: skip


@pytest.mark.slow
def test_a_fit_into_a_file_prints_progress_lines_and_a_closing_summary(tmp_path, capsys):
    # capsys's stdout is not a terminal, as a SLURM log is not; the bar is on in the config.
    main(tiny_fit_args(tmp_path, "--progress.every_n_steps", "2", "--trainer.enable_progress_bar", "true"))
    out = capsys.readouterr().out
    progress = re.findall(
        r"^step (\d+)/6 \| [\d,]+ tok/s \| loss \d+\.\d{4} \| lr \S+ \| ETA \d+:\d\d:\d\d$", out, re.M
    )
    assert progress == ["2", "4", "6"], out
    assert "it/s" not in out and "Epoch 0" not in out, out  # no tqdm bar in the file
    summary = [line for line in out.splitlines() if line.startswith("fit finished")]
    assert len(summary) == 1, out
    run_dir = (Path("runs") / "tiny").resolve()
    best = re.fullmatch(
        r"fit finished at step 6; best checkpoint (\S+) \(val/loss (\d+\.\d{4})\); last checkpoint (\S+); "
        r"run directory (\S+)",
        summary[0],
    )
    assert best is not None, summary[0]
    assert Path(best[1]).is_file() and Path(best[1]).resolve().parent == run_dir / "checkpoints"
    assert Path(best[3]).resolve() == run_dir / "checkpoints" / "last.ckpt"
    assert Path(best[4]).resolve() == run_dir


@pytest.mark.slow
def test_progress_lines_can_be_switched_off(tmp_path, capsys):
    main(tiny_fit_args(tmp_path, "--progress.enabled", "false", "--trainer.enable_progress_bar", "false"))
    out = capsys.readouterr().out
    assert not re.search(r"^step \d", out, re.M) and "fit finished at step 6" in out, out
