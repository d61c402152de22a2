"""Sweep files: every line of every `slurm/sweeps/*.txt` parses with the CLI's parser, and the local
runner (`python -m longctx.sweep run`) runs lines in turn, names unnamed runs stably and skips the
finished ones."""

from __future__ import annotations

import importlib
import json
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from longctx.data.corpora import get_corpus
from longctx.sweep import SUBCOMMANDS, line_name, main, parse_sweeps, run_lines, run_sweep, task_arguments

REPO = Path(__file__).resolve().parents[1]
SWEEPS = sorted((REPO / "slurm" / "sweeps").glob("*.txt"))


def test_the_sweep_subcommands_are_the_clis():
    from longctx.cli import LongCtxCLI

    assert set(SUBCOMMANDS) == set(LongCtxCLI.subcommands())


@pytest.mark.parametrize("sweep", SWEEPS, ids=lambda p: p.name)
def test_every_sweep_line_names_a_subcommand_and_existing_configs(sweep):
    runs = run_lines(sweep)
    assert runs
    for index, args in enumerate(runs):
        assert task_arguments(sweep, index) == args  # known subcommand
        configs = [args[i + 1] for i, arg in enumerate(args) if arg == "--config"]
        assert configs and all((REPO / c).is_file() for c in configs), args


def model_shapes(config) -> dict[str, tuple[int, ...]]:
    """State-dict shapes of the model a parsed run config builds (on the meta device: no memory)."""
    model = config.model
    module, _, name = model.class_path.rpartition(".")
    init = {k: v for k, v in model.init_args.as_dict().items() if k not in ("optimizer", "lr_scheduler")}
    init["vocab_size"] = get_corpus(config.data.corpus).vocab_size
    with torch.device("meta"):
        built = getattr(importlib.import_module(module), name)(**init)
    return {key: tuple(value.shape) for key, value in built.state_dict().items()}


@pytest.mark.slow
def test_every_sweep_line_parses_and_evaluations_fit_the_checkpoints_they_read(tmp_path, monkeypatch):
    """The whole command line of every run, through the CLI's own parser (configs read, classes and
    settings type-checked, nothing run): what a SLURM array task would start with. And an evaluation
    of a checkpoint that a sweep's `fit` writes (`--ckpt_path runs/<run_name>/...`) builds a model of
    the same shapes as that fit (the CLI would refuse the checkpoint otherwise); models loaded from
    `pretrained` (hub weights, none offline) are left out."""
    monkeypatch.chdir(REPO)  # the lines' paths are relative to the repository root
    bad = tmp_path / "bad.txt"
    bad.write_text(
        "test --config configs/quickstart.yaml --model.init_args.d_modle 8\n"
        "evaluate_overlaps --config configs/gpt2_window_tiny.yaml --overlaps '[0, 5]'\n"
    )
    parsed = parse_sweeps([*SWEEPS, bad])
    errors = {where: result for where, result in parsed.items() if isinstance(result, str)}
    assert list(errors) == [f"{bad}:run 0"], errors  # every real line parses; the typo is caught
    assert "d_modle" in errors[f"{bad}:run 0"]

    subcommands = {f"{sweep}:run {i}": args[0] for sweep in SWEEPS for i, args in enumerate(run_lines(sweep))}
    fits = {
        parsed[where].run_name: parsed[where] for where, command in subcommands.items() if command == "fit"
    }
    pairs = []  # (evaluation line, its config, the config of the fit that writes its checkpoint)
    for where, config in parsed.items():
        ckpt = Path(config.get("ckpt_path") or ".") if not isinstance(config, str) else Path()
        trained = fits.get(str(Path(*ckpt.parts[1:-2]))) if ckpt.parts[:1] == ("runs",) else None
        if trained and not (
            config.model.init_args.get("pretrained") or trained.model.init_args.get("pretrained")
        ):
            pairs.append((where, config, trained))
    assert len(pairs) >= 5, [where for where, *_ in pairs]
    for where, evaluation, trained in pairs:
        assert model_shapes(evaluation) == model_shapes(trained), where


FAKE_LONGCTX = """
import json, pathlib, sys
args = sys.argv[1:]
with open("calls.jsonl", "a") as f:
    f.write(json.dumps(args) + "\\n")
if "--fail" in args:
    sys.exit(3)
run_dir = pathlib.Path("runs") / args[args.index("--run_name") + 1]
run_dir.mkdir(parents=True, exist_ok=True)
path = run_dir / "summary.json"
summary = json.loads(path.read_text()) if path.exists() else {}
summary.update(status="finished", subcommand=args[0])
summary.setdefault("statuses", {})[args[0]] = "finished"
summary.setdefault("commands", {})[args[0]] = args
path.write_text(json.dumps(summary))
"""


def record(run_dir: Path, status: str, command: str | None) -> None:
    """Add a subcommand's run to `run_dir/summary.json` as the CLI's RunRecord does (`command` None:
    a summary written before commands were recorded)."""
    args = shlex.split(command) if command else None
    subcommand = args[0] if args else "fit"
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text()) if path.exists() else {}
    summary.update(status=status, subcommand=subcommand)
    summary.setdefault("statuses", {})[subcommand] = status
    if args:
        summary.setdefault("commands", {})[subcommand] = args
    run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary))


def calls_of(tmp_path: Path) -> list[list[str]]:
    calls = tmp_path / "calls.jsonl"
    lines = calls.read_text().splitlines() if calls.exists() else []
    calls.unlink(missing_ok=True)
    return [json.loads(line) for line in lines]


@pytest.fixture
def launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A stand-in for `python -m longctx` (FAKE_LONGCTX), run from `tmp_path`."""
    monkeypatch.chdir(tmp_path)
    fake = tmp_path / "fake_longctx.py"
    fake.write_text(FAKE_LONGCTX)
    return [sys.executable, str(fake)]


def test_runner_skips_finished_runs_names_unnamed_ones_and_retries_failures(tmp_path, launcher, capsys):
    sweep = tmp_path / "grid.txt"
    sweep.write_text(
        textwrap.dedent(
            """\
            # finished earlier: skipped
            fit --config a.yaml --run_name done
            # unnamed: runs under a name made from its content
            fit --config a.yaml --model.init_args.lr 0.1
            test --config a.yaml --run_name=broken --fail
            # fit finished in this directory, but this line is a test: it runs
            test --config a.yaml --run_name done_fit
            # a test ran in this directory after the fit finished: the fit line is skipped
            fit --config a.yaml --run_name fit_then_test
            # failed earlier: runs again
            validate --config a.yaml --run_name retry --trainer.default_root_dir runs
            """
        )
    )
    record(tmp_path / "runs/done", "finished", "fit --config a.yaml --run_name done")
    record(tmp_path / "runs/done_fit", "finished", "fit --config a.yaml --run_name done_fit")
    record(
        tmp_path / "runs/retry",
        "failed",
        "validate --config a.yaml --run_name retry --trainer.default_root_dir runs",
    )
    record(tmp_path / "runs/fit_then_test", "finished", "fit --config a.yaml --run_name fit_then_test")
    record(tmp_path / "runs/fit_then_test", "finished", "test --config a.yaml --run_name fit_then_test")

    assert run_sweep(sweep, launcher) == 1  # the --fail line
    unnamed = line_name(sweep, ["fit", "--config", "a.yaml", "--model.init_args.lr", "0.1"])
    assert unnamed.startswith("grid/fit-") and len(unnamed) == len("grid/fit-") + 8
    assert calls_of(tmp_path) == [
        ["fit", "--config", "a.yaml", "--model.init_args.lr", "0.1", "--run_name", unnamed],
        ["test", "--config", "a.yaml", "--run_name=broken", "--fail"],
        ["test", "--config", "a.yaml", "--run_name", "done_fit"],
        ["validate", "--config", "a.yaml", "--run_name", "retry", "--trainer.default_root_dir", "runs"],
    ]
    out = capsys.readouterr().out
    assert f"[1/6] {Path('runs/done')}: finished earlier, skipped" in out
    assert f"[3/6] {Path('runs/broken')}: FAILED (exit 3)" in out
    assert f"[5/6] {Path('runs/fit_then_test')}: finished earlier, skipped" in out
    assert "sweep" in out and "5 of 6 runs finished; failed: lines 2" in out

    assert run_sweep(sweep, launcher) == 1  # restarted: only the failed line runs again
    assert calls_of(tmp_path) == [["test", "--config", "a.yaml", "--run_name=broken", "--fail"]]


def test_a_retried_fit_line_continues_its_unfinished_run(tmp_path, launcher, capsys):
    """A fit line that failed, was interrupted or killed before it wrote a record runs again with
    `--ckpt_path last` (a second fit in its folder would be refused); once it finishes, the line is
    found finished (its recorded command is the line plus that flag)."""
    sweep = tmp_path / "retry.txt"
    sweep.write_text("fit --config a.yaml --run_name failed\nfit --config a.yaml --run_name killed\n")
    record(tmp_path / "runs/failed", "interrupted", "fit --config a.yaml --run_name failed")
    (tmp_path / "runs/killed/checkpoints").mkdir(parents=True)  # `kill -9`: a checkpoint, no record
    (tmp_path / "runs/killed/checkpoints/last.ckpt").write_bytes(b"weights")
    assert run_sweep(sweep, launcher) == 0
    assert calls_of(tmp_path) == [
        ["fit", "--config", "a.yaml", "--run_name", "failed", "--ckpt_path", "last"],
        ["fit", "--config", "a.yaml", "--run_name", "killed", "--ckpt_path", "last"],
    ]
    out = capsys.readouterr().out
    assert (
        f"[1/2] {Path('runs/failed')}: python -m longctx fit --config a.yaml --run_name failed --ckpt_path"
        in out
    )
    assert run_sweep(sweep, launcher) == 0 and calls_of(tmp_path) == []
    assert capsys.readouterr().out.count("finished earlier, skipped") == 2


def test_runner_finds_lines_by_content_not_position(tmp_path, launcher, capsys):
    """Inserting, moving or editing lines never makes a line skip with another command's results."""
    sweep = tmp_path / "lr.txt"
    sweep.write_text("fit --config a.yaml --lr 0.07\nfit --config a.yaml --lr 0.03\n")
    assert run_sweep(sweep, launcher) == 0 and len(calls_of(tmp_path)) == 2

    # A line inserted first, the others moved down, one edited: the new and the edited lines run (in
    # folders of their own), the moved one is found and skipped.
    sweep.write_text(
        "fit --config a.yaml --lr 0.01\n"
        "fit --config a.yaml  --lr 0.07  # moved\n"
        "fit --config a.yaml --lr 0.3\n"
    )
    assert run_sweep(sweep, launcher) == 0
    calls = calls_of(tmp_path)
    assert [call[:4] for call in calls] == [["fit", "--config", "a.yaml", "--lr"]] * 2
    assert [call[4] for call in calls] == ["0.01", "0.3"]
    folders = sorted(p.parent.name for p in (tmp_path / "runs/lr").glob("*/summary.json"))
    assert len(folders) == 4  # 0.07, 0.03 (kept, whole), 0.01, 0.3
    for folder in folders:  # every folder holds the one command named after it
        summary = json.loads((tmp_path / "runs/lr" / folder / "summary.json").read_text())
        assert f"lr/{folder}" == summary["commands"]["fit"][-1]
    assert "[2/3] " in capsys.readouterr().out


def test_a_named_line_whose_folder_holds_another_command_is_refused(tmp_path, launcher, capsys):
    sweep = tmp_path / "named.txt"
    sweep.write_text(
        "fit --config a.yaml --lr 0.01 --run_name edited\n"
        "fit --config a.yaml --run_name old\n"
        "test --config a.yaml --run_name edited\n"
    )
    record(tmp_path / "runs/edited", "finished", "fit --config a.yaml --lr 0.07 --run_name edited")
    record(tmp_path / "runs/old", "finished", None)  # written before commands were recorded
    assert run_sweep(sweep, launcher) == 2
    assert calls_of(tmp_path) == [["test", "--config", "a.yaml", "--run_name", "edited"]]
    out = capsys.readouterr().out
    edited = Path("runs/edited")
    assert (
        f"[1/3] {edited}: not run: {edited} holds the fit of another command (fit --config a.yaml --lr 0.07 "
        f"--run_name edited); give this line its own --run_name, or remove {edited} to run it there"
    ) in out
    assert f"{Path('runs/old')} holds the fit of another command (a command it did not record)" in out
    assert "1 of 3 runs finished; not run: lines 0, 1 (see above)" in out


def test_a_slurm_task_whose_line_changed_since_it_ran_is_refused(tmp_path, monkeypatch, capsys):
    """A requeued array task re-reads its line: an edited line must not resume another command's
    checkpoint in that task's folder; the same line (plus sweep.sbatch's resource flags) goes on."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "500")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    monkeypatch.delenv("LONGCTX_RUN_NAME", raising=False)
    sweep = tmp_path / "s.txt"
    sweep.write_text("fit --config a.yaml --lr 0.1\n")
    record(
        tmp_path / "runs/slurm-500_0",
        "interrupted",
        "fit --config a.yaml --lr 0.1 --trainer.devices 4 --trainer.num_nodes 1",
    )
    main([str(sweep), "0"])
    assert capsys.readouterr().out.split("\0") == ["fit", "--config", "a.yaml", "--lr", "0.1", ""]
    sweep.write_text("fit --config a.yaml --lr 0.2\n")
    with pytest.raises(SystemExit) as exit_info:
        main([str(sweep), "0"])
    assert str(exit_info.value.code).startswith(
        f"error: task 0: {Path('runs/slurm-500_0')} holds the fit of another command "
        "(fit --config a.yaml --lr 0.1 "
    )


@pytest.mark.slow
def test_runner_runs_a_real_sweep_and_skips_it_when_restarted(tmp_path):
    """`python -m longctx.sweep run FILE` end to end: a real tiny fit writes its summary.json, so the
    same command again runs nothing."""
    sweep = tmp_path / "tiny.txt"
    quick = (
        f"--config {REPO / 'configs/quickstart.yaml'} --data.cache_dir {tmp_path / 'cache'} "
        "--trainer.max_steps 2 --trainer.limit_val_batches 1 --trainer.val_check_interval 2 "
        "--trainer.logger false --trainer.enable_progress_bar false"
    )
    sweep.write_text(f"fit {quick} --run_name earlier\nfit {quick}\n")
    record(tmp_path / "runs/earlier", "finished", f"fit {quick} --run_name earlier")
    env = {"WANDB_MODE": "disabled", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    command = [sys.executable, "-m", "longctx.sweep", "run", str(sweep)]
    first = subprocess.run(
        command, cwd=tmp_path, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True
    )
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    summary = json.loads(
        (tmp_path / "runs" / line_name(sweep, shlex.split(f"fit {quick}")) / "summary.json").read_text()
    )
    assert summary["status"] == "finished" and summary["global_step"] == 2
    again = subprocess.run(
        command, cwd=tmp_path, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True
    )
    assert again.returncode == 0 and again.stdout.count("finished earlier, skipped") == 2, again.stdout
