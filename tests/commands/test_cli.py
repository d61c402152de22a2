"""The CLI: every config parses, a tiny fit end to end, run directories, W&B offline, bad input.

LightningCLI builds its parser by introspection (seconds), so these tests are few and in-process.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import warnings
from pathlib import Path

import pytest
import torch
import wandb
import yaml

from longctx.commands.cli import (
    WANDB_FOLDERS,
    LoggedConfigCallback,
    LongCtxCLI,
    ensure_wandb_mode,
    keep_wandb_in,
    main,
    run_name_from_env,
)
from longctx.methods.adaptive_span.network import SpanTransformerConfig
from longctx.runtime.errors import ParseError
from tests.helpers.environment import REPO
from tests.helpers.lm_fixtures import run_cli_in

CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path, monkeypatch):
    run_cli_in(tmp_path, monkeypatch)
    monkeypatch.setenv("LONGCTX_DATA", str(tmp_path / "data"))


@pytest.mark.slow  # the parser on every config; the fast tier resolves one per base (test_configs.py)
def test_every_config_parses():
    """Each YAML in configs/ is a valid fit config: classes resolve, no unknown keys."""
    assert len(CONFIGS) >= 10
    failures = {}
    for config in CONFIGS:
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
                main(["fit", "--config", str(config), "--print_config"])
            assert exit_info.value.code in (0, None)
            resolved = yaml.safe_load(out.getvalue())
            assert resolved["model"]["class_path"].startswith("longctx.methods.")
        except BaseException as err:
            failures[config.name] = repr(err)[:500]
    assert not failures, failures


def quick_args(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "fit",
        "--config", str(REPO / "configs" / "quickstart.yaml"),
        "--data.cache_dir", str(tmp_path / "cache"),
        "--trainer.max_steps", "3",
        "--trainer.val_check_interval", "3",
        "--trainer.limit_val_batches", "2",
        "--trainer.enable_progress_bar", "false",
        "--run_name", "quick",
        *extra,
    ]  # fmt: skip


@pytest.mark.slow  # ~10-30 s on 2 CPU cores: the fast tier stays within 3 minutes
def test_quickstart_fits_and_writes_one_run_directory(tmp_path):
    cli = main(quick_args(tmp_path))
    run_dir = tmp_path / "runs" / "quick"
    assert Path(cli.trainer.default_root_dir) == Path("runs/quick")
    assert (run_dir / "config.yaml").is_file()
    ckpts = sorted(p.relative_to(run_dir / "checkpoints") for p in (run_dir / "checkpoints").rglob("*.ckpt"))
    assert ckpts and all(len(p.parts) == 1 for p in ckpts), ckpts  # no sub-folders from `val/...`
    assert cli.model.vocab_size == cli.datamodule.vocab_size == 256  # linked from the data module
    assert "val/bpc" in cli.trainer.callback_metrics
    # The same run name again is another run in its folder: refused. Continuing it is not.
    with pytest.raises(
        SystemExit, match=r"^error: run directory runs/quick holds a run \(fit finished, step 3, "
    ):
        main(quick_args(tmp_path, "--trainer.max_steps", "1"))
    cli = main(quick_args(tmp_path, "--ckpt_path", "last", "--trainer.max_steps", "4"))
    assert cli.trainer.global_step == 4


def test_config_typo_is_reported(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(quick_args(tmp_path, "--model.init_args.d_modle", "8"))
    # One line, with the fix, and no usage dump (tests/commands/test_user_errors.py has the other typos).
    message = "error: model: AdaptiveSpanLM has no option 'd_modle' (did you mean network.d_model?)"
    assert exit_info.value.code == message
    assert "usage" not in capsys.readouterr().err


def test_wandb_goes_offline_without_credentials(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    ensure_wandb_mode()
    assert os.environ["WANDB_MODE"] == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    ensure_wandb_mode()
    assert os.environ["WANDB_MODE"] == "disabled"  # an explicit mode is never overridden
    monkeypatch.delenv("WANDB_MODE")
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password secret\n")
    (tmp_path / ".netrc").chmod(0o600)
    ensure_wandb_mode()
    assert "WANDB_MODE" not in os.environ


def test_run_names_are_stable_per_slurm_task(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "99")
    assert run_name_from_env() == "slurm-99"
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "90")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "4")
    assert run_name_from_env() == "slurm-90_4"
    monkeypatch.setenv("LONGCTX_RUN_NAME", "mine")
    assert run_name_from_env() == "mine"


def test_wandb_logger_gets_run_dir_id_and_group(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "123")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "7")
    cli = LongCtxCLI(
        args=quick_args(tmp_path, "--run_name", "sweep/task 7", "--trainer.max_steps", "0")[1:],
        run=False,
        parser_kwargs={"parser_mode": "yaml"},
    )
    logger = cli.trainer.logger
    assert logger.save_dir == str(Path("runs") / "sweep/task 7")
    assert logger._wandb_init["id"] == "sweep-task-7" and logger._wandb_init["group"] == "123"
    assert logger._wandb_init["resume"] == "allow"


def test_an_unwritable_run_directory_is_one_line_before_anything_runs(tmp_path, capsys):
    """W&B would fall back to the system temp folder; Lightning would fail at its first write."""
    (tmp_path / "a-file").write_text("")
    with pytest.raises(SystemExit, match=r"^error: run directory .*a-file/runs/quick cannot be written \("):
        main(quick_args(tmp_path, "--trainer.default_root_dir", "a-file/runs"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_wandb_folders_go_into_the_run_directory_unless_the_user_set_them(tmp_path, monkeypatch):
    for variable in WANDB_FOLDERS:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "mine"))
    keep_wandb_in(Path("runs/a"))
    assert os.environ["WANDB_CACHE_DIR"] == str(tmp_path / "runs" / "a" / "wandb" / "cache")
    assert os.environ["WANDB_DATA_DIR"] == str(tmp_path / "mine")
    keep_wandb_in(Path("runs/b"))  # a second run in the same process moves what the first set
    assert os.environ["WANDB_ARTIFACT_DIR"] == str(tmp_path / "runs" / "b" / "wandb" / "artifacts")


@pytest.mark.slow  # ~3.5 s: the trainer is built
def test_saved_config_records_the_precision_that_ran(tmp_path):
    """Lightning runs `16-mixed` as `bf16-mixed` on CPU: config.yaml says bf16-mixed."""
    with pytest.warns(UserWarning, match="16-mixed"):
        cli = LongCtxCLI(args=quick_args(tmp_path, "--trainer.precision", "16-mixed")[1:], run=False)
    (callback,) = [c for c in cli.trainer.callbacks if isinstance(c, LoggedConfigCallback)]
    callback.setup(cli.trainer, cli.model, "fit")
    assert not (tmp_path / "runs" / "quick" / "config.yaml").exists()  # written when training starts
    callback.on_train_start(cli.trainer, cli.model)
    saved = yaml.safe_load((tmp_path / "runs" / "quick" / "config.yaml").read_text())
    assert cli.trainer.precision == saved["trainer"]["precision"] == "bf16-mixed"
    # The run's name, not the folders and W&B id derived from it (the trainer has those).
    assert saved["run_name"] == "quick" and saved["trainer"]["default_root_dir"] is None
    assert cli.trainer.default_root_dir == str(Path("runs") / "quick")
    assert [c["init_args"]["dirpath"] for c in saved["trainer"]["callbacks"]] == [None]
    assert saved["trainer"]["logger"]["init_args"]["id"] is None


@pytest.mark.slow  # three tiny fits (~30 s on 2 CPU cores)
def test_a_saved_config_read_back_names_its_run_and_writes_into_no_other(tmp_path):
    """`fit --config runs/quick/config.yaml --ckpt_path last` continues runs/quick (it wrote its
    metrics into runs/quick/quick while its checkpoints went to runs/quick, when config.yaml held
    the folders derived from the name); under another --run_name it leaves runs/quick as it was."""
    main(quick_args(tmp_path))
    saved = tmp_path / "runs" / "quick" / "config.yaml"
    last = tmp_path / "runs" / "quick" / "checkpoints" / "last.ckpt"
    cli = main(["fit", "--config", str(saved), "--ckpt_path", "last", "--trainer.max_steps", "4"])
    assert cli.trainer.global_step == 4 and Path(cli.trainer.default_root_dir) == Path("runs/quick")
    assert torch.load(last, weights_only=False)["global_step"] == 4
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["quick"]
    before = last.read_bytes()
    cli = main(["fit", "--config", str(saved), "--run_name", "other", "--trainer.max_steps", "2"])
    assert Path(cli.trainer.default_root_dir) == Path("runs/other") and last.read_bytes() == before
    assert (tmp_path / "runs" / "other" / "checkpoints" / "last.ckpt").is_file()
    assert cli.trainer.logger._wandb_init["id"] == "other"


def test_a_config_naming_its_runs_folders_is_refused_or_cleaned(tmp_path):
    """config.yaml files saved before runs recorded their root name the run's folder as the root,
    its checkpoints/ as the callbacks' dirpath and its W&B id: the first two would put a fit's files
    into that run's folder (one line says how to fix it), the id is dropped so the run gets its own."""
    (tmp_path / "runs" / "quick" / "checkpoints").mkdir(parents=True)
    (tmp_path / "runs" / "quick" / "summary.json").write_text(json.dumps({"subcommand": "fit"}))
    message = (
        r"^error: trainer.default_root_dir runs/quick is the folder of the run quick itself, .* add "
        r"--trainer.default_root_dir runs$"
    )
    with pytest.raises(SystemExit, match=message):
        main(quick_args(tmp_path, "--trainer.default_root_dir", "runs/quick"))
    dirpath = ["--trainer.callbacks.init_args.dirpath", "runs/quick/checkpoints"]
    message = (
        r"^error: trainer.callbacks: checkpoints would go into runs/quick/checkpoints, the folder of "
        r"another run \(runs/quick\), .*set the callback's dirpath to null$"
    )
    with pytest.raises(SystemExit, match=message):
        main(quick_args(tmp_path, "--run_name", "other", *dirpath))
    stale = ["--trainer.logger.init_args.name", "quick", "--trainer.logger.init_args.id", "quick"]
    cli = LongCtxCLI(args=quick_args(tmp_path, "--run_name", "other", *stale)[1:], run=False)
    assert (
        cli.trainer.logger._wandb_init["id"] == "other" and cli.trainer.logger._wandb_init["name"] == "other"
    )
    mine = ["--trainer.logger.init_args.name", "mine", "--trainer.logger.init_args.id", "abc123"]
    cli = LongCtxCLI(args=quick_args(tmp_path, "--run_name", "other2", *mine)[1:], run=False)
    assert cli.trainer.logger._wandb_init["id"] == "abc123"  # the user's own id is kept


def test_checkpoint_names_with_metric_slashes_are_refused(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "trainer": {
                    "callbacks": [
                        {
                            "class_path": "longctx.callbacks.RunCheckpoint",
                            "init_args": {
                                "filename": "{val/bpc:.3f}",
                                "monitor": "val/bpc",
                                "auto_insert_metric_name": True,
                            },
                        }
                    ]
                }
            }
        )
    )
    with pytest.raises(SystemExit) as exit_info:  # one line, not a traceback
        main(quick_args(tmp_path, "--config", str(bad)))
    message = str(exit_info.value.code)
    assert message.startswith("error: ModelCheckpoint filename '{val/bpc:.3f}' gives ")
    assert "set auto_insert_metric_name: false" in message


@pytest.mark.slow  # an offline W&B run of a fit (~10 s CPU)
def test_wandb_run_gets_config_git_revision_stable_metric_names_and_min_summaries(tmp_path, monkeypatch):
    """What a dashboard reads, from the local W&B run of a tiny offline fit."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    wandb.finish()  # earlier tests' disabled run and settings would be reused
    wandb.teardown()
    args = quick_args(tmp_path, "--trainer.max_steps", "6", "--trainer.log_every_n_steps", "1")
    cli = LongCtxCLI(args=args, parser_kwargs={"parser_mode": "yaml"})
    run = cli.trainer.logger.experiment
    assert run.settings.mode == "offline"
    try:
        config, summary = dict(run.config), run.summary._as_dict()
    finally:
        wandb.finish()
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert config["git_revision"].startswith(head.stdout.strip())
    resolved = json.loads(config["cli"])  # the full resolved config, overrides included
    assert (
        resolved["model"]["class_path"].endswith("AdaptiveSpanLM") and resolved["trainer"]["max_steps"] == 6
    )
    metrics = {
        name for name in summary if not name.startswith("_") and name not in ("epoch", "trainer/global_step")
    }
    prefixes = ("train/", "val/", "test/", "span/", "trams/", "throughput/")
    assert metrics and all(name.startswith(prefixes) for name in metrics), sorted(metrics)
    assert {
        "train/loss",
        "train/bpc",
        "val/loss",
        "val/bpc",
        "span/avg",
        "throughput/train_tokens_per_s",
    } <= metrics
    assert set(summary["val/bpc"]) == {"min"} and set(summary["val/loss"]) == {"min"}  # best, not last


def test_float32_matmul_precision_is_set_from_the_config(tmp_path, capsys):
    """TF32 for float32 matmuls on GPUs ('high', the default) or exact float32 ('highest')."""
    previous = torch.get_float32_matmul_precision()
    try:
        LongCtxCLI(args=quick_args(tmp_path)[1:], run=False)
        assert torch.get_float32_matmul_precision() == "high"
        LongCtxCLI(args=quick_args(tmp_path, "--float32_matmul_precision", "highest")[1:], run=False)
        assert torch.get_float32_matmul_precision() == "highest"
        with pytest.raises(ParseError, match=r"^float32_matmul_precision: expected Literal\['highest'"):
            LongCtxCLI(args=quick_args(tmp_path, "--float32_matmul_precision", "tf32")[1:], run=False)
    finally:
        torch.set_float32_matmul_precision(previous)


def test_a_models_init_error_is_one_line(tmp_path):
    """Not jsonargparse's "Does not validate against any of the Union subtypes" and a settings dump."""
    with pytest.raises(SystemExit) as exit_info:
        main(quick_args(tmp_path, "--model.init_args.span_loss", "-1"))
    assert exit_info.value.code == "error: model: AdaptiveSpanLM: span_loss (λ) must be >= 0, got -1.0"
    # A knob group's check, built before the module: its message; `main` prefixes it with the group's
    # place and class (test_user_errors.py::test_a_value_a_knob_group_refuses_names_the_group_s_place_...).
    with pytest.raises(ValueError) as error:
        SpanTransformerConfig(attn_span=256, span_ramp=-1)
    assert str(error.value) == "attn_span (256) and chunk_size (64) must be positive and span_ramp (-1) >= 0"
    with pytest.raises(SystemExit) as exit_info:
        main(quick_args(tmp_path, "--data.batch_size", "0"))
    message = str(exit_info.value.code)
    assert (
        message.startswith("error: data: LMDataModule: ") and "batch_size" in message and "\n" not in message
    )


def test_missing_checkpoint_file_is_an_error(tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(quick_args(tmp_path, "--ckpt_path", "runs/old/last.ckpt"))
    assert exit_info.value.code == "error: --ckpt_path runs/old/last.ckpt: no such checkpoint file"


@pytest.mark.slow
def test_ckpt_path_last_without_checkpoint_starts_fresh_in_fit_and_fails_in_evaluation(tmp_path, capsys):
    """The requeue workflow passes `--ckpt_path last` from the first run on."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # Lightning's own multi-line warning is not shown
        warnings.filterwarnings("ignore", ".*(num_workers|LightningCLI's args|dirpath)")
        cli = main(quick_args(tmp_path, "--ckpt_path", "last", "--trainer.max_steps", "1"))
    assert cli.trainer.global_step == 1
    where = Path("runs/quick/checkpoints")
    expected = f"longctx: --ckpt_path last: no checkpoint in {where} yet; the run starts fresh\n"
    assert expected in capsys.readouterr().err
    # A SLURM requeue checkpoint (Lightning's `last` alone would ignore it) is newer than any last.ckpt.
    cli.trainer.save_checkpoint(Path("runs/quick/hpc_ckpt_1.ckpt"))
    cli = main(quick_args(tmp_path, "--ckpt_path", "last", "--trainer.max_steps", "2"))
    assert cli.trainer.global_step == 2
    assert (
        f"longctx: --ckpt_path last: resuming from {Path('runs/quick/hpc_ckpt_1.ckpt')}\n"
        in capsys.readouterr().err
    )
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", *quick_args(tmp_path, "--ckpt_path", "last", "--run_name", "other")[1:]])
    assert exit_info.value.code == (
        f"error: --ckpt_path last: no checkpoint in {Path('runs/other/checkpoints')}, so nothing to evaluate"
    )


def test_predict_is_not_offered(tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["predict", *quick_args(tmp_path)[1:]])
    assert str(exit_info.value.code).startswith("error: predict is not offered: ")
    assert "predict" not in LongCtxCLI.subcommands()


def test_a_second_live_run_with_the_same_name_is_refused_in_one_line(tmp_path):
    """Another live command in runs/quick (here: this process holds its lock) leaves it untouched."""
    from longctx.runtime.run_lock import run_directory_lock

    with run_directory_lock(Path("runs/quick")), pytest.raises(SystemExit) as exit_info:
        main(quick_args(tmp_path))
    message = str(exit_info.value.code)
    assert message.startswith(
        f"error: run directory {Path('runs/quick')} is in use by another live run (pid {os.getpid()} on "
    )
    assert "give this run another --run_name" in message and "\n" not in message
    assert sorted(p.name for p in Path("runs/quick").iterdir()) == [".lock"]  # no summary, no config


def test_ckpt_path_last_without_a_stable_run_name_says_why_it_cannot_resume(tmp_path):
    """No --run_name, no LONGCTX_RUN_NAME, no SLURM ids: a timestamped folder, never one to resume."""
    args = quick_args(tmp_path, "--ckpt_path", "last")
    del args[args.index("--run_name") : args.index("--run_name") + 2]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == (
        "error: --ckpt_path last resumes the run of the same name, but this command names none (no "
        "--run_name, no $LONGCTX_RUN_NAME, no SLURM job id), so it would get a new timestamped folder "
        "with nothing to resume: add --run_name NAME, the run to resume (runs/NAME)"
    )
    assert not Path("runs").exists()
