"""Run records (`summary.json`, `metrics.jsonl`) and `python -m longctx report`, on real tiny runs.

Three run directories come from the real CLI, in-process: `full` (fit, then test in the same
directory), `fit_only` (no test metrics: the report must show dashes) and `failed` (an exception
at step 3: status "failed").
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import lightning.pytorch as pl
import pytest

from longctx.cli import main
from longctx.report import main as report_main
from tests.lm_fixtures import CarryLM

STEPS, BATCH, TGT_LEN = 4, 4, 32


class FailAtStep(pl.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == 3:  # after 3 complete steps
            raise RuntimeError("boom at step 3")


def _args(subcommand: str, run_name: str, *extra: str) -> list[str]:
    return [
        subcommand,
        "--model", "tests.lm_fixtures.CarryLM",
        "--data.corpus", "sample", "--data.batch_size", str(BATCH), "--data.tgt_len", str(TGT_LEN),
        "--data.cache_dir", "cache",
        "--trainer.accelerator", "cpu", "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false",
        "--trainer.max_steps", str(STEPS), "--trainer.val_check_interval", "2",
        "--trainer.check_val_every_n_epoch", "null",
        "--trainer.limit_val_batches", "2", "--trainer.limit_test_batches", "2",
        "--run_name", run_name,
        *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("report")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("WANDB_MODE", "disabled")
        for var in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "LONGCTX_RUN_NAME"):
            mp.delenv(var, raising=False)
        main(_args("fit", "full"))
        (checkpoint,) = (root / "runs" / "full" / "checkpoints").glob("*.ckpt")
        main(_args("test", "full", "--ckpt_path", str(checkpoint)))
        main(_args("fit", "fit_only"))
        with pytest.raises(RuntimeError, match="boom at step 3"):
            main(_args("fit", "failed", "--trainer.callbacks+=tests.test_report.FailAtStep"))
    return root / "runs"


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.slow
def test_each_run_writes_its_summary_and_validation_curve(runs):
    full, fit_only, failed = (_summary(runs / name) for name in ("full", "fit_only", "failed"))
    assert (full["status"], full["subcommand"]) == ("finished", "test")
    assert full["statuses"] == {"fit": "finished", "test": "finished"}
    assert (fit_only["status"], fit_only["subcommand"]) == ("finished", "fit")
    assert (failed["status"], failed["error"]) == ("failed", "RuntimeError: boom at step 3")
    assert full["method"] == "tests.lm_fixtures.CarryLM"
    assert full["parameters"] == sum(p.numel() for p in CarryLM(vocab_size=256).parameters())
    # Every training target of the sample text is scored: batch × tgt_len per step.
    assert full["train_tokens"] == fit_only["train_tokens"] == STEPS * BATCH * TGT_LEN
    assert failed["train_tokens"] == 3 * BATCH * TGT_LEN and failed["global_step"] == 3
    assert full["train_tokens_per_s"] > 0 and full["wall_time_s"] > 0 and full["peak_memory_bytes"] > 2**20
    assert full["peak_memory_kind"] == "peak_rss"
    # fit's validation metrics are kept when test adds its own; fit_only has no test metrics.
    assert {"val/loss", "val/bpc", "test/loss", "test/bpc"} <= set(full["metrics"])
    assert not any(name.startswith("test/") for name in fit_only["metrics"])
    curve = [json.loads(line) for line in (runs / "full" / "metrics.jsonl").read_text().splitlines()]
    assert [(p["step"], p["train_tokens"]) for p in curve] == [
        (2, 2 * BATCH * TGT_LEN),
        (4, STEPS * BATCH * TGT_LEN),
    ]
    assert curve[-1]["val/loss"] == pytest.approx(_summary(runs / "fit_only")["metrics"]["val/loss"])


@pytest.mark.slow
def test_report_table_figures_and_dashes(runs, tmp_path, capsys):
    names = ("full", "fit_only", "failed")
    report_main([*(str(runs / name) for name in names), "--out", str(tmp_path / "out")])
    rows = list(csv.DictReader((tmp_path / "out" / "report.csv").open()))
    assert [(r["run"], r["status"], r["method"], r["corpus"]) for r in rows] == [
        ("full", "finished", "CarryLM", "sample"),
        ("fit_only", "finished", "CarryLM", "sample"),
        ("failed", "failed", "CarryLM", "sample"),
    ]
    full = _summary(runs / "full")
    assert float(rows[0]["test"]) == full["metrics"]["test/bpc"] and rows[0]["metric"] == "bpc"
    assert int(rows[0]["params"]) == full["parameters"]
    assert float(rows[0]["tokens_seen"]) == STEPS * BATCH * TGT_LEN
    # Missing values are dashes, never numbers: fit_only has no test metrics, CarryLM no FLOPs/token.
    assert rows[1]["test"] == rows[1]["test_word_ppl"] == "-" and rows[1]["val"] != "-"
    assert {r["flops_per_token"] for r in rows} == {"-"}
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "| fit_only | CarryLM | - | sample | finished |" in markdown
    # No run logged FLOPs/token, so the FLOPs figure names all three as left out; failed for its status.
    assert (
        "- bits per byte vs FLOPs per token: left out (no value recorded): full, fit_only; "
        "left out (failed): failed" in markdown
    )
    without_bpb_curve = [
        n for n in names if not any("val/bpb" in line for line in (runs / n / "metrics.jsonl").open())
    ]
    curves_note = [line for line in markdown.splitlines() if line.startswith("- validation bits per byte")]
    assert curves_note == ([f"- validation bits per byte vs training tokens: left out (no value recorded): "
                            f"{', '.join(without_bpb_curve)}"] if without_bpb_curve else [])  # fmt: skip
    for name in ("bpb_vs_flops.png", "bpb_vs_memory.png", "val_curves.png"):
        assert (tmp_path / "out" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({name})" in markdown


def test_report_refuses_a_directory_without_a_summary(tmp_path, capsys):
    with pytest.raises(SystemExit, match=r"no run directory among .*: pass run directories"):
        report_main([str(tmp_path), "--out", str(tmp_path / "out")])
    assert f"{tmp_path}: skipped, not a run directory (no summary.json)" in capsys.readouterr().err


def test_report_logs_its_table_to_an_active_wandb_run(tmp_path, monkeypatch):
    """Inside a W&B run the same rows go to `report/table` as a wandb.Table, dashes as None."""
    import wandb

    run_dir = tmp_path / "runs" / "xl"
    run_dir.mkdir(parents=True)
    summary = {
        "status": "finished",
        "method": "longctx.methods.transformer_xl.module.TransformerXLLM",
        "parameters": 1234,
        "metrics": {"val/ppl": 50.0, "test/ppl": 52.5, "test/bpb": 1.25},
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))

    class FakeRun:
        def __init__(self) -> None:
            self.logged: dict = {}

        def log(self, data: dict) -> None:
            self.logged.update(data)

    run = FakeRun()
    monkeypatch.setattr(wandb, "run", run)
    report_main([str(run_dir), "--out", str(tmp_path / "out")])
    table = run.logged["report/table"]
    assert isinstance(table, wandb.Table)
    row = dict(zip(table.columns, table.data[0]))
    assert (row["run"], row["method"], row["params"], row["metric"]) == ("xl", "TransformerXLLM", 1234, "ppl")
    assert (row["val"], row["test"], row["test_bpb"], row["val_bpb"], row["corpus"]) == (
        50.0,
        52.5,
        1.25,
        None,
        None,
    )
    assert {"report/bpb_vs_flops", "report/bpb_vs_memory", "report/val_curves"} <= set(run.logged)
    assert "| xl | TransformerXLLM | - | - | finished | 1,234 |" in (tmp_path / "out" / "report.md").read_text()
