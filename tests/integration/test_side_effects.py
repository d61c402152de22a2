"""Side effects only where the user said: every file a run writes is readable as the umask allows,
W&B writes only into the run directory, token caches go to the cache folder, and `config.yaml` records
the precision that ran (issue 20, item 7)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from longctx.methods.recurrence.export import copy_tokenizer, save_lm
from tests.commands.test_convert import ADAPTIVE_CONFIG
from tests.helpers.environment import REPO, shared_dir, skip_without_shared

ADAPTIVE = shared_dir() / "fixtures" / "authors_checkpoints" / "adaptive_span"
# What a user may have set that would send W&B or caches elsewhere: the test decides all of it.
FOLDER_VARIABLES = (
    "XDG_CACHE_HOME",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "WANDB_DIR",
    "WANDB_CACHE_DIR",
    "WANDB_DATA_DIR",
    "WANDB_ARTIFACT_DIR",
    "WANDB_CONFIG_DIR",
    "WANDB_API_KEY",
    "LONGCTX_RUN_NAME",
)


def modes_unlike(folder: Path, umask: int) -> dict[str, str]:
    """Files and folders under `folder` whose mode is not what a plain open / mkdir gives under `umask`.

    W&B's artifact staging copies (`wandb/data/artifacts/staging/`, the table and images `report
    --wandb` logs) are read-only by W&B's design and removed once synced: not checked.
    """
    wrong = {}
    for path in folder.rglob("*"):
        if path.is_symlink() or "staging" in path.relative_to(folder).parts[:-1]:
            continue
        expected = (0o777 if path.is_dir() else 0o666) & ~umask
        if (mode := stat.S_IMODE(path.stat().st_mode)) != expected:
            wrong[str(path.relative_to(folder))] = oct(mode)
    return wrong


@pytest.mark.slow  # three subprocesses (fit ~20 s, report, convert) per umask on 2 CPU cores
@pytest.mark.parametrize("umask", [0o022, 0o027], ids=["umask022", "umask027"])
def test_fit_report_and_convert_write_only_where_told_with_the_umask_mode(tmp_path, umask):
    home, tmp, work, inputs = (tmp_path / name for name in ("home", "tmp", "work", "inputs"))
    for folder in (home, tmp, work, inputs):
        folder.mkdir()
    env = {name: value for name, value in os.environ.items() if name not in FOLDER_VARIABLES}
    # A W&B service that an earlier test started in this process is named in WANDB_SERVICE: the
    # commands must start their own ("run ID ... is in use" and records elsewhere otherwise).
    env.pop("WANDB_SERVICE", None)
    env.update(
        HOME=str(home),
        TMPDIR=str(tmp),
        WANDB_MODE="offline",
        LONGCTX_CACHE=str(work / "cache"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )

    def longctx(*args: str) -> None:
        result = subprocess.run(
            [sys.executable, "-m", "longctx", *args],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            preexec_fn=lambda: os.umask(umask),
        )
        assert result.returncode == 0, result.stderr[-3000:]

    longctx(
        "fit", "--config", str(REPO / "configs" / "quickstart.yaml"), "--run_name", "quick",
        "--trainer.max_steps", "3", "--trainer.val_check_interval", "3", "--trainer.limit_val_batches", "2",
        "--trainer.enable_progress_bar", "false", "--trainer.precision", "16-mixed",
    )  # fmt: skip
    longctx("report", "runs/quick", "--out", "report", "--wandb")
    expected = {"runs", "report", "cache"}
    if ADAPTIVE.is_dir():
        (inputs / "adaptive.yaml").write_text(ADAPTIVE_CONFIG)
        longctx(
            "convert", "--from", "adaptive-span", "--config", str(inputs / "adaptive.yaml"),
            "--vocab", str(ADAPTIVE / "data"), str(ADAPTIVE / "checkpoint.pt"), "converted/adaptive.ckpt",
        )  # fmt: skip
        expected.add("converted")
        assert (work / "converted" / "adaptive.ckpt").is_file()

    run_dir = work / "runs" / "quick"
    assert sorted(p.name for p in work.iterdir()) == sorted(expected)
    assert list((run_dir / "checkpoints").glob("*.ckpt")) and list(
        (work / "cache").glob("sample-*/meta.json")
    )
    assert modes_unlike(work, umask) == {}  # no 0600 (mkstemp, safetensors) and no 0700 (mkdtemp)
    # W&B wrote its runs, logs and caches in the run directory and the report's folder, nowhere else
    # (not HOME, not TMPDIR, not the working directory).
    for folder in (run_dir, work / "report"):
        assert list((folder / "wandb").glob("offline-run-*/run-*.wandb"))
        assert list((folder / "wandb").rglob("core-debug-*.log"))
    elsewhere = [p for root in (home, tmp, work) for p in root.rglob("*") if "wandb" in p.name.lower()]
    assert [p for p in elsewhere if not {run_dir, work / "report"} & set(p.parents)] == []
    # config.yaml says what ran: Lightning turned 16-mixed into bf16-mixed on CPU, and max_epochs: null
    # with max_steps into no epoch limit.
    trainer = yaml.safe_load((run_dir / "config.yaml").read_text())["trainer"]
    assert trainer["precision"] == "bf16-mixed" and trainer["max_epochs"] == -1


@skip_without_shared("data", "gpt2")  # the tokenizer files the export copies
def test_export_files_have_the_umask_mode(tmp_path):
    """safetensors writes its weights 0600; the export gives every file the umask's mode."""
    from transformers import GPT2Config, GPT2LMHeadModel

    lm = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=64, n_positions=16))
    umask = os.umask(0o027)
    try:
        out = save_lm(lm, tmp_path / "hf")
        copy_tokenizer(shared_dir() / "data" / "gpt2", out)
    finally:
        os.umask(umask)
    assert {"model.safetensors", "config.json", "vocab.json", "merges.txt"} <= {p.name for p in out.iterdir()}
    assert modes_unlike(tmp_path, 0o027) == {}


def test_a_failed_export_leaves_no_folder(tmp_path):
    class Broken:
        def set_attn_implementation(self, name: str) -> None:
            pass

        def save_pretrained(self, folder: Path) -> None:
            (Path(folder) / "model.safetensors").write_bytes(b"half")
            raise OSError("No space left on device")

    with pytest.raises(OSError, match="No space left"):
        save_lm(Broken(), tmp_path / "out" / "hf")
    assert list(tmp_path.iterdir()) == []
