"""One run per run folder: a `fit` into a folder that holds a run is refused or moves it aside, every
file is listed with the command that wrote it, an evaluation replaces its own earlier files, and a
command refused before its work starts leaves nothing behind (`longctx.runtime.run_folder`).

The folder functions are tested on plain files; the CLI's use of them in-process, on a tiny model
(`CarryLM`, the `sample` corpus, a few steps), as `tests/commands/test_report.py` runs it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from longctx.commands.cli import main
from longctx.runtime.run_folder import (
    Ledger,
    held_run,
    move_aside,
    read_summary,
    record_command,
    undone_if_refused,
)
from tests.helpers.lm_fixtures import carry_lm_cli, run_cli_in


def _write(path: Path, text: str = "x", mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def _tree(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `folder` with its bytes and modification time: what "untouched" compares (the
    lock file left out: it names the last command that held it)."""
    return {
        str(path.relative_to(folder)): (path.read_bytes(), path.stat().st_mtime_ns)
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != ".lock"
    }


# ---------------------------------------------------------------------- the folder, on plain files
def test_a_folder_holds_a_run_when_it_records_a_command_or_has_checkpoints_or_a_curve(tmp_path):
    run_dir = tmp_path / "run"
    assert held_run(run_dir) is None  # not there
    _write(run_dir / ".lock", "")
    _write(run_dir / "config.yaml", mtime=1_600_000_000)
    assert held_run(run_dir) is None  # a config alone: no run
    _write(run_dir / "checkpoints" / "last.ckpt", mtime=1_700_000_000)
    held = held_run(run_dir)
    assert held is not None and held.has_fit
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(1_700_000_000))
    assert held.description == f"1 checkpoint, last written {stamp}"
    summary = {"status": "finished", "subcommand": "test", "global_step": 7,
               "statuses": {"fit": "interrupted", "test": "finished"}}  # fmt: skip
    _write(run_dir / "summary.json", json.dumps(summary), mtime=1_700_000_100)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(1_700_000_100))
    assert held_run(run_dir).description == (
        f"fit interrupted, test finished, step 7, 1 checkpoint, last written {stamp}"
    )
    tested = tmp_path / "tested"  # an evaluation's folder: a run, but no fit to continue
    _write(tested / "summary.json", json.dumps({"status": "finished", "subcommand": "test"}))
    assert held_run(tested) is not None and not held_run(tested).has_fit


def test_moving_a_run_aside_keeps_its_files_whole_and_the_lock_in_place(tmp_path):
    run_dir = tmp_path / "runs" / "quick"
    _write(run_dir / ".lock", "held")
    _write(run_dir / "summary.json", "{}", mtime=1_700_000_000)
    _write(run_dir / "checkpoints" / "last.ckpt", "weights", mtime=1_700_000_000)
    before = _tree(run_dir)
    moved = move_aside(run_dir)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(1_700_000_000))
    assert moved == tmp_path / "runs" / f"quick.old-{stamp}"
    assert _tree(moved) == before
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]
    _write(run_dir / "summary.json", "{}", mtime=1_700_000_000)  # a run of the same time: its own folder
    assert move_aside(run_dir) == tmp_path / "runs" / f"quick.old-{stamp}-2"


def test_the_ledger_lists_every_file_and_an_evaluation_replaces_its_own_earlier_files(tmp_path):
    run_dir = tmp_path / "run"
    fit = ["fit", "--config", "c.yaml"]
    ledger = Ledger(run_dir)
    for name in ("checkpoints/last.ckpt", "metrics.jsonl", "config.yaml", "wandb/offline-run-1/run.wandb"):
        _write(run_dir / name)
    _write(run_dir / "notes.txt", mtime=1_700_000_000)  # put there by hand before the fit started
    ledger.before["notes.txt"] = (run_dir / "notes.txt").stat().st_mtime_ns
    record_command(run_dir, "fit", fit, "finished", ledger)
    artifacts = read_summary(run_dir)["artifacts"]
    assert sorted(artifacts) == [
        "checkpoints/last.ckpt", "config.yaml", "metrics.jsonl", "notes.txt", "wandb/offline-run-1"
    ]  # fmt: skip
    assert {name: entry["subcommand"] for name, entry in artifacts.items()} == {
        "checkpoints/last.ckpt": "fit", "config.yaml": "fit", "metrics.jsonl": "fit",
        "notes.txt": None, "wandb/offline-run-1": "fit",
    }  # fmt: skip
    assert artifacts["metrics.jsonl"]["command"] == fit

    first_test = ["test", "--ckpt_path", "last.ckpt", "--write_token_nll", "true"]
    ledger = Ledger(run_dir)
    _write(run_dir / "token_nll.npz")
    _write(run_dir / "config.yaml")
    _write(run_dir / "wandb" / "offline-run-2" / "run.wandb")
    record_command(run_dir, "test", first_test, "finished", ledger)
    assert read_summary(run_dir)["artifacts"]["token_nll.npz"]["command"] == first_test

    second_test = ["test", "--ckpt_path", "last.ckpt"]  # no per-token file this time
    ledger = Ledger(run_dir)
    time.sleep(0.01)
    _write(run_dir / "config.yaml")
    record_command(run_dir, "test", second_test, "finished", ledger)
    artifacts = read_summary(run_dir)["artifacts"]
    assert not (run_dir / "token_nll.npz").exists()  # the first test's, not this one's: removed
    assert "token_nll.npz" not in artifacts
    assert artifacts["config.yaml"]["command"] == second_test
    assert artifacts["checkpoints/last.ckpt"]["command"] == fit  # another subcommand's: kept, its own
    assert artifacts["wandb/offline-run-2"]["subcommand"] == "test"  # W&B's runs are never removed
    assert read_summary(run_dir)["commands"] == {"fit": fit, "test": second_test}

    ledger = Ledger(run_dir)  # a fit continuing its run keeps its earlier files
    _write(run_dir / "checkpoints" / "step=9.ckpt")
    record_command(run_dir, "fit", [*fit, "--ckpt_path", "last"], "finished", ledger)
    artifacts = read_summary(run_dir)["artifacts"]
    assert artifacts["checkpoints/last.ckpt"]["command"] == fit
    assert artifacts["checkpoints/step=9.ckpt"]["command"] == [*fit, "--ckpt_path", "last"]


def test_an_evaluation_keeps_the_earlier_files_it_declares_still_valid(tmp_path):
    run_dir = tmp_path / "run"
    ledger = Ledger(run_dir)
    for overlap in (0, 8):
        _write(run_dir / f"token_nll_overlap{overlap}.npz")
    record_command(run_dir, "evaluate_overlaps", ["evaluate_overlaps"], "interrupted", ledger)
    ledger = Ledger(run_dir)
    ledger.keep("token_nll_overlap0.npz")  # overlap 0 finished earlier for this checkpoint: not redone
    record_command(run_dir, "evaluate_overlaps", ["evaluate_overlaps"], "finished", ledger)
    assert sorted(p.name for p in run_dir.glob("token_nll*")) == ["token_nll_overlap0.npz"]


def test_a_command_refused_before_its_work_starts_removes_only_what_it_created(tmp_path):
    fresh = tmp_path / "runs" / "sweep" / "fit-1a2b3c4d"
    with pytest.raises(ValueError), undone_if_refused(fresh, lambda: False):
        _write(fresh / ".lock", "")
        _write(fresh / "wandb" / "debug.log")
        raise ValueError("bad checkpoint")
    assert not (tmp_path / "runs").exists()  # the folder and the parents it created: gone

    held = tmp_path / "held"
    _write(held / "summary.json", "{}")
    _write(held / "checkpoints" / "last.ckpt")
    before = _tree(held)
    with pytest.raises(ValueError), undone_if_refused(held, lambda: False):
        _write(held / "config.yaml")
        _write(held / "checkpoints" / "new.ckpt")
        raise ValueError("bad corpus file")
    assert _tree(held) == before

    with pytest.raises(ValueError), undone_if_refused(fresh, lambda: True):  # its work had started
        _write(fresh / "metrics.jsonl")
        raise ValueError("a bug at step 3")
    assert (fresh / "metrics.jsonl").exists()


# ---------------------------------------------------------------------- the CLI
_args = carry_lm_cli  # 4 steps, validated every 2


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    run_cli_in(tmp_path, monkeypatch)
    return tmp_path


def test_a_fit_in_a_folder_that_holds_a_run_is_refused_before_any_step(in_tmp):
    """A second `fit` with an existing --run_name, started after the first ended, shared its folder:
    `summary.json` and `config.yaml` described only the second, both runs' checkpoints side by side."""
    run_dir = Path("runs/quick")
    summary = {"status": "finished", "subcommand": "fit", "statuses": {"fit": "finished"}, "global_step": 4}
    _write(run_dir / "summary.json", json.dumps(summary), mtime=1_700_000_000)
    _write(run_dir / "checkpoints" / "last.ckpt", mtime=1_700_000_000)
    before = _tree(run_dir)
    with pytest.raises(SystemExit) as refused:
        main(_args("fit", "quick"))
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(1_700_000_000))
    assert refused.value.code == (
        f"error: run directory {run_dir} holds a run (fit finished, step 4, 1 checkpoint, last written "
        f"{stamp}): continue it with --ckpt_path last, give this run another --run_name, or start over "
        f"there with --overwrite_run true (the old run's files move to {run_dir}.old-<time it last wrote>)"
    )
    assert _tree(run_dir) == before  # nothing written, nothing removed: not even a record of it


def test_a_command_refused_before_its_first_step_leaves_no_folder(in_tmp):
    """16 timestamped `failed` folders piled up in runs/ from commands refused before any step."""
    Path("noise.ckpt").write_bytes(os.urandom(2000))
    with pytest.raises(SystemExit, match=r"noise\.ckpt is not a readable PyTorch checkpoint"):
        main(_args("test", "refused", "--ckpt_path", "noise.ckpt"))  # refused before `test` runs
    assert not Path("runs").exists()
    Path("latin1.txt").write_bytes("café au lait\n".encode("latin-1") * 400)
    files = "{train: latin1.txt, valid: latin1.txt, test: latin1.txt}"
    text = ("--data.corpus", "text_files", "--data.files", files, "--data.tokenizer", "bytes")
    with pytest.raises(SystemExit, match=r"latin1\.txt is not UTF-8 text"):  # refused inside `fit`'s setup
        main(_args("fit", "refused", *text))
    assert not Path("runs").exists()


@pytest.mark.slow  # three fits and a test, in-process (~20 s)
def test_overwrite_run_moves_the_old_run_aside_whole(in_tmp, capsys):
    main(_args("fit", "quick"))
    run_dir = Path("runs/quick")
    before, summary = _tree(run_dir), read_summary(run_dir)
    with pytest.raises(
        SystemExit, match=r"^error: run directory runs/quick holds a run \(fit finished, step 4, "
    ):
        main(_args("fit", "quick", "--trainer.max_steps", "6"))
    assert _tree(run_dir) == before
    capsys.readouterr()
    main(_args("fit", "quick", "--trainer.max_steps", "6", "--overwrite_run", "true"))
    (old,) = Path("runs").glob("quick.old-*")
    assert (
        f"longctx: --overwrite_run: the run that was in {run_dir} (fit finished, step 4, 1 checkpoint, "
        in capsys.readouterr().err
    )
    assert _tree(old) == before and read_summary(old) == summary
    new = read_summary(run_dir)
    assert (new["global_step"], list(new["commands"])) == (6, ["fit"])
    assert sorted(new["artifacts"]) == sorted(name for name in _tree(run_dir) if name != "summary.json")
    assert all(entry["subcommand"] == "fit" for entry in new["artifacts"].values())
    with pytest.raises(SystemExit, match=r"^error: --overwrite_run applies to fit"):
        main(_args("test", "quick", "--overwrite_run", "true"))


@pytest.mark.slow  # a fit and three tests, in-process (~20 s)
def test_a_second_test_replaces_the_first_tests_per_token_file(in_tmp):
    """A second `test` without `--write_token_nll` removes the first one's `token_nll.npz`, so the check of
    docs/evaluation.md (`nll.sum() / nll.size == test/loss`) never reads another command's file. A test
    refused before its first step leaves the fit's folder as it was."""
    main(_args("fit", "run"))
    (checkpoint,) = Path("runs/run/checkpoints").glob("*.ckpt")
    main(_args("test", "run", "--ckpt_path", str(checkpoint), "--write_token_nll", "true"))
    summary = read_summary("runs/run")
    with np.load("runs/run/token_nll.npz") as f:
        assert f["nll"].sum() / f["nll"].size == pytest.approx(summary["metrics"]["test/loss"], rel=1e-5)
    assert summary["artifacts"]["token_nll.npz"]["command"][-2:] == ["--write_token_nll", "true"]
    main(_args("test", "run", "--ckpt_path", str(checkpoint), "--trainer.limit_test_batches", "1"))
    summary = read_summary("runs/run")
    assert not Path("runs/run/token_nll.npz").exists()
    assert set(summary["artifacts"]) == set(_tree(Path("runs/run"))) - {"summary.json"}
    assert summary["artifacts"][str(checkpoint.relative_to("runs/run"))]["subcommand"] == "fit"
    assert summary["artifacts"]["config.yaml"]["subcommand"] == "test"

    Path("noise.ckpt").write_bytes(os.urandom(2000))
    before = _tree(Path("runs/run"))
    with pytest.raises(SystemExit, match=r"noise\.ckpt is not a readable PyTorch checkpoint"):
        main(_args("test", "run", "--ckpt_path", "noise.ckpt"))
    assert _tree(Path("runs/run")) == before  # its config.yaml and summary.json too
