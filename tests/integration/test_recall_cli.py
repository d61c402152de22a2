"""End to end, as a user runs it: `synth mqar`, `fit` with the words tokenizer and the stop rule,
`test --write_token_nll true`; every recall number in summary.json is recomputed from the files."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from longctx.commands.cli import main
from longctx.commands.context import main as context_main
from longctx.commands.data import main as data_main
from longctx.data.synth import load_marks
from tests.helpers.environment import REPO

SPLITS = ("train", "valid", "test")


@pytest.mark.slow
def test_fit_and_test_on_mqar_text_record_recall_that_the_files_give(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    data_main(
        ["synth", "mqar", "--out", "mqar", "--pairs", "3", "--keys", "30", "--values", "30",
         "--filler_vocab", "20", "--min_distance", "10", "--max_distance", "30",
         "--train_tokens", "6000", "--eval_tokens", "1500"]
    )  # fmt: skip
    files = "{" + ", ".join(f"{split}: mqar/{split}.txt" for split in SPLITS) + "}"
    common = [
        "--config", str(REPO / "configs" / "long_range" / "xl.yaml"),
        "--data.files", files, "--data.tokenizer", "words", "--data.tgt_len", "16",
        "--data.eval_tgt_len", "16", "--data.batch_size", "4", "--data.eval_batch_size", "4",
        "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
        "--trainer.limit_val_batches", "null", "--run_name", "mqar_xl",
    ]  # fmt: skip
    main(["fit", *common, "--trainer.max_steps", "6", "--trainer.val_check_interval", "2",
          "--recall_stop.min_acc", "0.2", "--recall_stop.monitor", "val/recall_acc"])  # fmt: skip
    run = tmp_path / "runs" / "mqar_xl"
    curve = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run / "summary.json").read_text())
    reached = next((line["step"] for line in curve if line["val/recall_acc"] >= 0.2), None)
    assert summary["recall_stop"]["reached_step"] == reached
    assert summary["recall_stop"]["global_step"] == (reached or 6) == summary["global_step"]
    assert all(0 <= line["val/recall_acc_first"] <= 1 for line in curve)

    main(["test", *common, "--ckpt_path", "last", "--write_token_nll", "true"])
    summary = json.loads((run / "summary.json").read_text())
    metrics = summary["metrics"]
    with np.load(run / "token_nll.npz") as per_token:
        nll, offset, correct = per_token["nll"], per_token["offset"], per_token["correct"]
        row_start = per_token["row_start"]
    assert nll.astype(np.float64).sum() == pytest.approx(
        metrics["test/loss"] * metrics["test/tokens"], rel=1e-5
    )
    text = (tmp_path / "mqar" / "test.txt").read_text()
    n_tokens = len(text.split()) + text.count("\n")  # the words and one <eos> per line
    np.testing.assert_array_equal(offset, np.arange(1, n_tokens))  # offsets count tokens
    # Recall counts the answers within reach: bound at or after the first token of their evaluation
    # row (each row starts with an empty memory), read from the row starts the file records.
    marks = load_marks(tmp_path / "mqar", "test")
    at = np.searchsorted(offset, marks["offset"])
    reachable = marks["offset"] - marks["distance"] >= row_start[at]
    assert 0 < (~reachable).sum() < len(reachable)  # 4 rows of 16-token segments: some lie out of reach
    marked = np.isin(offset, marks["offset"][reachable])
    assert marked.sum() == reachable.sum() == metrics["test/recall_answers"]
    assert metrics["test/recall_acc"] == pytest.approx(correct[marked].mean())
    first = np.isin(offset, marks["offset"][reachable & (marks["query"] == 0)])
    assert metrics["test/recall_acc_first"] == pytest.approx(correct[first].mean())
    assert "recall_stop" in summary  # the fit's record survives the test

    # `context` on the checkpoint: recall and state size per memory length; at the configured memory
    # (48) the point is the fit's last validation (the checkpoint was saved there).
    context_main(["--config", str(REPO / "configs" / "long_range" / "xl.yaml"), "--ckpt_path",
                  str(run / "checkpoints" / "last.ckpt"), "--name", "xl", "--lengths", "0", "48",
                  "--run_name", "ctx", *common[2:-2]])  # fmt: skip
    points = {
        int(row["context_length"]): row
        for row in csv.DictReader((tmp_path / "runs" / "ctx" / "context.csv").open())
    }
    assert float(points[0]["state_size"]) == 0 and float(points[48]["state_size"]) == 48 * 128
    assert float(points[48]["recall_acc"]) == pytest.approx(curve[-1]["val/recall_acc"])
    assert float(points[48]["recall_acc_first"]) == pytest.approx(curve[-1]["val/recall_acc_first"])
