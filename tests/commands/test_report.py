"""Run records (`summary.json`, `metrics.jsonl`) and `python -m longctx report`, on real tiny runs.

Three run directories come from the real CLI, in-process: `full` (fit, then test in the same
directory), `fit_only` (no test metrics: the report must show dashes) and `failed` (an exception
at step 3: status "failed").
"""

from __future__ import annotations

import csv
import importlib
import inspect
import json
import math
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import yaml

from longctx.commands.cli import main
from longctx.commands.report import main as report_main
from tests.helpers.lm_fixtures import CarryLM, carry_lm_cli
from tests.helpers.methods import config_init_args

STEPS, BATCH, TGT_LEN = 4, 4, 32


class FailAtStep(pl.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == 3:  # after 3 complete steps
            raise RuntimeError("boom at step 3")


_args = carry_lm_cli  # STEPS steps of BATCH rows × TGT_LEN tokens


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
            main(_args("fit", "failed", "--trainer.callbacks+=tests.commands.test_report.FailAtStep"))
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
    assert full["method"] == "tests.helpers.lm_fixtures.CarryLM"
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
    assert (
        "| xl | TransformerXLLM | - | - | finished | 1,234 |" in (tmp_path / "out" / "report.md").read_text()
    )


def _write_run(
    root: Path, name: str, summary: dict, config: dict | None = None, curve: list | None = None
) -> Path:
    run_dir = root / name
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps(summary))
    if config is not None:
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    if curve is not None:
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(point) + "\n" for point in curve))
    return run_dir


def _finished(bpb: float, **metrics: float) -> dict:
    return {"status": "finished", "peak_memory_bytes": 2**30, "metrics": {"test/bpb": bpb, **metrics}}


def test_diverged_and_failed_runs_show_their_status_and_come_last(tmp_path):
    """The NaN model of issue 20 scored bpb 0.0 and ranked first; a diverged run's numbers are not
    results, and a NaN result from a finished `validate` is shown as nan, after every finished run."""
    _write_run(tmp_path, "diverged", {"status": "diverged", "statuses": {"fit": "diverged"},
                                      "metrics": {"val/bpc": 0.0, "val/bpb": 0.0}})  # fmt: skip
    _write_run(tmp_path, "good_b", _finished(2.0, **{"val/bpc": 2.1, "val/bpb": 2.1}))
    _write_run(tmp_path, "failed", {"status": "failed", "metrics": {"val/bpb": 3.0}})
    # fit diverged, then `test` of its checkpoint finished: still a diverged run
    _write_run(tmp_path, "tested", {"status": "finished", "statuses": {"fit": "diverged", "test": "finished"},
                                    "metrics": {"test/bpb": 0.5}})  # fmt: skip
    _write_run(
        tmp_path,
        "nan_validate",
        {"status": "finished", "metrics": {"val/bpc": math.nan, "val/bpb": math.nan}},
    )
    _write_run(tmp_path, "good_a", _finished(3.0))
    names = ["diverged", "good_b", "failed", "tested", "nan_validate", "good_a"]
    report_main([*(str(tmp_path / n) for n in names), "--out", str(tmp_path / "out")])
    rows = list(csv.DictReader((tmp_path / "out" / "report.csv").open()))
    shown = [(r["run"], r["status"], r["val"], r["val_bpb"], r["test_bpb"]) for r in rows]
    assert shown == [
        ("good_b", "finished", "2.1", "2.1", "2.0"),
        ("good_a", "finished", "-", "-", "3.0"),
        ("diverged", "diverged", "diverged", "diverged", "diverged"),
        ("failed", "failed", "failed", "failed", "failed"),
        ("tested", "diverged", "diverged", "diverged", "diverged"),
        ("nan_validate", "finished", "nan", "nan", "-"),
    ]
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "| diverged | - | - | - | diverged | - | - | - | - | - | bpc | diverged | diverged |" in markdown
    assert (
        "- bits per byte vs peak memory: left out (diverged): diverged, tested; left out (failed): failed; "
        "left out (no value recorded): nan_validate" in markdown
    )


XL = "longctx.methods.transformer_xl.module.TransformerXLLM"
GPT2 = "longctx.methods.recurrence.module.RecurrentGPT2LM"
SPAN = "longctx.methods.adaptive_span.module.AdaptiveSpanLM"
WINDOW = "longctx.methods.window_transformer.module.WindowTransformerLM"
CT = "longctx.methods.compressive_transformer.module.CompressiveTransformerLM"
RMT = "longctx.methods.recurrent_memory.module.RecurrentMemoryLM"
CT_ARGS = {"mem_len": 32, "cmem_len": 16, "compression": "conv", "compression_rate": 2,
           "eval_mem_len": None, "eval_cmem_len": None}  # fmt: skip
XL_ARGS = {"mem_len": 32, "eval_mem_len": 64, "protocol": "xl", "trams_attended": None, "trams_pool": None,
           "trams_kept": None, "trams_metric": "code"}  # fmt: skip
DATA = {"corpus": "wikitext2", "tgt_len": 64, "eval_tgt_len": None, "overlap": 0, "eval_overlap": None}
VARIANT_CONFIGS = {
    "xl": (XL, XL_ARGS, DATA),
    "trams": (XL, {**XL_ARGS, "trams_attended": 32, "trams_pool": 64, "trams_kept": 24}, DATA),
    "trams_protocol": (XL, {**XL_ARGS, "protocol": "trams"}, DATA),
    "rpe": (XL, {**XL_ARGS, "mem_len": 0, "eval_mem_len": 0}, DATA),
    "xl_no_memory": (XL, {**XL_ARGS, "eval_mem_len": 0}, DATA),
    "gpt2_window": (GPT2, {"recurrence": False, "insert_layer": 2}, {**DATA, "eval_overlap": 32}),
    "recurrent_gpt2": (GPT2, {"recurrence": True, "insert_layer": 2}, DATA),
    "recurrent_gpt2_reset": (GPT2, {"recurrence": True, "insert_layer": 2, "eval_h_prev": "reset"}, DATA),
    "adaptive_span": (SPAN, {"span": "adaptive", "attn_span": 512}, DATA),
    "fixed_span": (SPAN, {"span_kind": "fixed", "attn_span": 512}, DATA),  # adaptive_span: its old name
    "window": (WINDOW, {}, {**DATA, "eval_tgt_len": 128}),
    "compressive": (CT, CT_ARGS, DATA),
    "compressive_longer": (CT, {**CT_ARGS, "eval_cmem_len": 64, "compression_rate": 3}, DATA),
    "rmt": (RMT, {"num_mem_tokens": 16, "eval_memory": "carried"}, DATA),
    "rmt_reset": (RMT, {"num_mem_tokens": 16, "eval_memory": "reset"}, {**DATA, "eval_tgt_len": 128}),
    "rmt_samples": (RMT, {"num_mem_tokens": 16, "eval_memory": "carried", "eval_restart_every": 2}, DATA),
}
EXPECTED_VARIANTS = {
    "xl": "XL memory 64 (trained with 32), protocol xl",
    "trams": "TRAMS m=32 M=64 kept=24 metric=code, protocol xl",
    "trams_protocol": "XL memory 64 (trained with 32), protocol trams",
    "rpe": "no memory (RPE), protocol xl",
    "xl_no_memory": "no memory (trained with 32), protocol xl",
    "gpt2_window": "recurrence off, window 64 overlap 32",
    "recurrent_gpt2": "recurrence on (layer 2), window 64 overlap 0",
    "recurrent_gpt2_reset": "recurrence on (layer 2), h_prev reset every window, window 64 overlap 0",
    "adaptive_span": "adaptive span S=512",
    "fixed_span": "fixed span S=512",
    "window": "no memory, window 128",
    "compressive": "memory 32 + compressed 16 (conv, c=2), reaches 64",
    "compressive_longer": "memory 32 + compressed 64 (conv, c=3), reaches 224 (trained with 32 + 16)",
    "rmt": "m=16 memory tokens, window 64",
    "rmt_reset": "m=16 memory tokens, reset every window, window 128",
    "rmt_samples": "m=16 memory tokens, restarted every 2 windows, window 64",
}


def test_rows_say_which_variant_ran(tmp_path):
    """Plain XL, TRAMS, RPE and no-memory evaluations of one class, GPT-2 with and without recurrence:
    told apart by the run's resolved config.yaml (the keys are the modules' real init arguments)."""
    for form in ("flat", "grouped"):  # runs from before the knob groups, and after
        for name, (class_path, model_args, data_args) in VARIANT_CONFIGS.items():
            module, cls_name = class_path.rsplit(".", 1)
            cls = getattr(importlib.import_module(module), cls_name)
            if form == "grouped":
                model_args = config_init_args(cls, model_args)
                assert set(model_args) <= set(inspect.signature(cls).parameters), name
            config = {"model": {"class_path": class_path, "init_args": model_args}, "data": data_args}
            run = {"status": "finished", "method": class_path, "metrics": {}}
            _write_run(tmp_path / form, name, run, config)
        out = tmp_path / form / "out"
        report_main([*(str(tmp_path / form / n) for n in VARIANT_CONFIGS), "--out", str(out)])
        rows = list(csv.DictReader((out / "report.csv").open()))
        assert {r["run"]: r["variant"] for r in rows} == EXPECTED_VARIANTS, form


def test_report_skips_a_folder_that_is_not_a_run(tmp_path, capsys):
    """`report runs/*` with a sweep's folder (its runs one level down), a stray file and a run record
    that does not parse inside."""
    _write_run(tmp_path / "runs", "a", _finished(2.0))
    _write_run(tmp_path / "runs" / "compare_tiny", "xl", _finished(2.5))
    (tmp_path / "runs" / "notes.txt").write_text("not a run")
    (tmp_path / "runs" / "broken").mkdir()
    (tmp_path / "runs" / "broken" / "summary.json").write_text('{"status": ')
    paths = [*sorted((tmp_path / "runs").iterdir()), tmp_path / "runs" / "typo"]
    report_main([*map(str, paths), "--out", str(tmp_path / "out")])
    assert [r["run"] for r in csv.DictReader((tmp_path / "out" / "report.csv").open())] == ["a"]
    sweep, notes = tmp_path / "runs" / "compare_tiny", tmp_path / "runs" / "notes.txt"
    expected = [
        f"{tmp_path / 'runs' / 'broken'}: skipped, unreadable run record (JSONDecodeError: Expecting "
        "value: line 1 column 12 (char 11))",
        f"{sweep}: skipped, not a run directory (no summary.json) "
        f"(run directories inside it: pass {sweep}/*)",
        f"{notes}: skipped, not a run directory (no summary.json)",
        f"{tmp_path / 'runs' / 'typo'}: skipped, no such file or directory",
    ]
    assert [
        line.removeprefix("longctx report: ") for line in capsys.readouterr().err.splitlines()
    ] == expected
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert all(f"- {note}" in markdown for note in expected)


def test_figures_plot_validation_bpb_of_runs_that_were_not_tested(tmp_path):
    """Runs fitted and validated but never tested (the tiny recipes of docs/training.md) are plotted by their
    validation bits per byte."""
    from longctx.commands.report import read_runs, scatter, table

    _write_run(tmp_path, "tested", _finished(2.0, **{"test/flops_per_token": 1e6}))
    _write_run(tmp_path, "fit_only", {"status": "finished", "peak_memory_bytes": 2**30,
                                      "metrics": {"val/bpb": 2.5, "val/flops_per_token": 2e6}})  # fmt: skip
    runs, skipped = read_runs([tmp_path / "tested", tmp_path / "fit_only"])
    figure, left_out = scatter(table(runs), "flops_per_token", "FLOPs per token")
    assert left_out == [] and skipped == []
    (ax,) = figure.axes
    points = [tuple(c.get_offsets()[0]) for c in ax.collections]
    assert points == [(1e6, 2.0), (2e6, 2.5)]
    assert [t.get_text() for t in ax.texts] == ["1", "2"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["tested", "fit_only (val)"]
    assert ax.get_ylabel() == "bits per byte (filled: test, hollow: validation)"


def test_each_run_directory_is_one_row_however_it_is_named(tmp_path, capsys):
    """`report runs/a runs/a runs/a/` wrote three identical rows "for 3 runs"; a symbolic link to a
    run is that run too."""
    _write_run(tmp_path / "runs", "a", _finished(2.0))
    _write_run(tmp_path / "runs", "b", _finished(2.5))
    (tmp_path / "link").symlink_to(tmp_path / "runs" / "a")
    a = str(tmp_path / "runs" / "a")
    report_main(
        [a, a, a + "/", str(tmp_path / "link"), str(tmp_path / "runs" / "b"), "--out", str(tmp_path / "out")]
    )
    assert [r["run"] for r in csv.DictReader((tmp_path / "out" / "report.csv").open())] == ["a", "b"]
    out = capsys.readouterr()
    assert "for 2 runs" in out.out
    repeated = [
        f"{path}: skipped, the same run directory as {a} (each run is one row)"
        for path in (a, a, tmp_path / "link")
    ]  # fmt: skip (`a/` is given to Python as `a`)
    assert [line.removeprefix("longctx report: ") for line in out.err.splitlines()] == repeated


def test_a_context_folder_is_not_a_run(tmp_path, capsys):
    """`context` records its command and files in its folder's summary.json; `report runs/*` does not
    take that folder for a run (its recl.csv feeds the RECL columns of the runs beside it)."""
    _write_run(tmp_path, "a", _finished(2.0))
    _write_run(tmp_path, "context", {"status": "finished", "subcommand": "context",
                                     "statuses": {"context": "finished"}})  # fmt: skip
    report_main([str(tmp_path / "a"), str(tmp_path / "context"), "--out", str(tmp_path / "out")])
    assert [r["run"] for r in csv.DictReader((tmp_path / "out" / "report.csv").open())] == ["a"]
    note = f"{tmp_path / 'context'}: skipped, a context diagnostics folder, not a run"
    assert note in capsys.readouterr().err


def test_the_numbers_of_nearby_points_never_overlap_and_name_their_runs(tmp_path):
    """Four XL-family runs at one spot printed their names over one another: each point now carries
    its row's number, placed apart from every other number and point inside the axes, and the legend
    names the run of each number."""
    from longctx.commands.report import number_box, scatter

    rows = []
    for i, name in enumerate(["xl", "rpe", "trams", "xl_no_memory", "compressive", "span", "window"]):
        crowd = i < 5  # five at (almost) one spot, the others apart
        rows.append({"run": name, "status": "finished", "val_bpb": None,
                     "test_bpb": 2.0 + (0.0001 * i if crowd else 0.4 * i),
                     "flops_per_token": 1e6 * (1 + (0.0001 * i if crowd else 0.5 * i))})  # fmt: skip
    figure, left_out = scatter(rows, "flops_per_token", "FLOPs per token")
    assert left_out == []
    (ax,) = figure.axes
    renderer = figure.canvas.get_renderer()
    numbers = ax.texts
    assert [t.get_text() for t in numbers] == [str(i) for i in range(1, len(rows) + 1)]
    for number, row in zip(numbers, rows):  # each number points at its run's point
        assert number.xy == (row["flops_per_token"], row["test_bpb"])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [row["run"] for row in rows]
    boxes = [number_box(t, renderer, pad=0) for t in numbers]
    inside = ax.get_window_extent(renderer)
    assert all(
        inside.x0 <= b.x0 and b.x1 <= inside.x1 and inside.y0 <= b.y0 and b.y1 <= inside.y1 for b in boxes
    )
    overlapping = [
        (i + 1, j + 1) for i, a in enumerate(boxes) for j, b in enumerate(boxes) if i < j and a.overlaps(b)
    ]
    assert overlapping == []
    markers = [ax.transData.transform((row["flops_per_token"], row["test_bpb"])) for row in rows]
    on_a_point = [(i + 1, j + 1) for i, b in enumerate(boxes) for j, (x, y) in enumerate(markers)
                  if b.contains(x, y)]  # fmt: skip
    assert on_a_point == []


def test_long_range_columns_read_the_marked_positions_and_the_context_runs_recl(tmp_path):
    """long_range_loss / near_loss: the mean token NLL on the sidecar's marked / near offsets of the
    text file that config.yaml's data.files names for the scored split; recl_*: the sibling context
    run's recl.csv row named after the run. A BPE run's byte marks do not apply: a dash."""
    from longctx.data.synth import SynthSettings, generate, load_marks

    data = tmp_path / "copy"
    generate(SynthSettings(task="copy", gap=36, passage_words=2, train_bytes=3000, eval_bytes=3000), data)
    marks = load_marks(data, "test")
    size = (data / "test.txt").stat().st_size
    offset = np.arange(1, size)
    nll = np.full(offset.shape, 3.0, np.float32)
    nll[np.isin(offset, marks["offset"])] = 1.0
    nll[np.isin(offset, marks["near_offset"])] = 2.0
    files = {split: str(data / f"{split}.txt") for split in ("train", "valid", "test")}
    for name, tokenizer in (("xl", "bytes"), ("gpt2", "gpt2")):
        run_dir = tmp_path / "runs" / name
        run_dir.mkdir(parents=True)
        summary = {"status": "finished", "subcommand": "test", "metrics": {"test/loss": 2.0}}
        (run_dir / "summary.json").write_text(json.dumps(summary))
        config = {"data": {"corpus": "text_files", "files": files, "tokenizer": tokenizer}}
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
        np.savez(run_dir / "token_nll.npz", nll=nll, offset=offset)
    context = tmp_path / "runs" / "context"
    context.mkdir()
    (context / "recl.csv").write_text(
        "model,axis,r,recl,reached_end\nxl,memory,0.1,32,False\nxl,memory,0.01,48,True\n"
    )
    report_main(
        [str(tmp_path / "runs" / "xl"), str(tmp_path / "runs" / "gpt2"), "--out", str(tmp_path / "out")]
    )
    with (tmp_path / "out" / "report.csv").open() as f:
        rows = {row["run"]: row for row in csv.DictReader(f)}
    assert float(rows["xl"]["long_range_loss"]) == 1.0
    assert float(rows["xl"]["near_loss"]) == 2.0
    assert rows["xl"]["recl_r0.1"] == "32 (memory)"
    assert rows["xl"]["recl_r0.01"] == "48+ (memory)"
    assert [rows["gpt2"][c] for c in ("long_range_loss", "near_loss", "recl_r0.1")] == ["-", "-", "-"]


def small_mqar(folder: Path) -> tuple[dict, np.ndarray, dict]:
    """A small `synth mqar` text in `folder` (3 pairs, answers 6-20 back, 3,000 tokens per split): the
    test split's marks, the offsets a per-token file of its test split holds (every token but the first,
    `<eos>` counted), and the `data.files` of a run on it."""
    from longctx.data.mqar import MQARSettings, generate
    from longctx.data.synth import load_marks

    generate(MQARSettings(pairs=3, keys=40, values=40, filler_vocab=30, min_distance=6, max_distance=20,
                          train_tokens=3000, eval_tokens=3000), folder)  # fmt: skip
    text = (folder / "test.txt").read_text()
    offset = np.arange(1, len(text.split()) + text.count("\n"))
    files = {split: str(folder / f"{split}.txt") for split in ("train", "valid", "test")}
    return load_marks(folder, "test"), offset, files


def test_recall_columns_table_by_distance_and_figures(tmp_path):
    """On mqar text: the accuracy columns from summary.json, steps to the threshold (">N" when not
    reached), the state size; recall by distance from token_nll.npz `correct` at the marks, in the
    same bins for every run; the state-size figure takes the runs and a sibling context run."""
    from longctx.diagnostics import recall

    marks, offset, files = small_mqar(tmp_path / "mqar")
    near = marks["offset"][marks["distance"] < 12]  # the runs get exactly these answers right
    runs = {
        "xl": ({"reached_step": 3250, "global_step": 3250}, 0.8, 12800.0),
        "rpe": ({"reached_step": None, "global_step": 20000}, 0.3, 0.0),
    }
    for name, (stop, first, state_size) in runs.items():
        run_dir = tmp_path / "runs" / name
        run_dir.mkdir(parents=True)
        metrics = {"test/loss": 2.0, "test/recall_acc": 0.5, "test/recall_acc_first": first,
                   "val/recall_acc_first": first, "test/state_size": state_size}  # fmt: skip
        summary = {"status": "finished", "subcommand": "test", "metrics": metrics, "recall_stop": stop}
        (run_dir / "summary.json").write_text(json.dumps(summary))
        config = {"data": {"corpus": "text_files", "files": files, "tokenizer": "words"}}
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
        np.savez(run_dir / "token_nll.npz", nll=np.ones(offset.shape, np.float32), offset=offset,
                 correct=np.isin(offset, near))  # fmt: skip
    context = tmp_path / "runs" / "context"
    context.mkdir()
    (context / "context.csv").write_text(
        "model,axis,context_length,state_size,recall_acc,recall_acc_first\n"
        "xl,memory,0,0,0.4,0.33\nxl,memory,64,8192,0.9,0.85\n"
    )
    out = tmp_path / "out"
    report_main([str(tmp_path / "runs" / "xl"), str(tmp_path / "runs" / "rpe"), "--out", str(out)])
    with (out / "report.csv").open() as f:
        rows = {row["run"]: row for row in csv.DictReader(f)}
    assert [rows["xl"][c] for c in ("test_recall_acc", "test_recall_acc_first", "steps_to_acc")] == [
        "0.5", "0.8", "3250"
    ]  # fmt: skip
    assert rows["rpe"]["steps_to_acc"] == ">20000" and float(rows["rpe"]["state_size"]) == 0.0
    with (out / "recall_by_distance.csv").open() as f:
        table = list(csv.DictReader(f))
    assert {row["run"] for row in table} == {"xl", "rpe"}
    for row in table:
        low, high = int(row["distance_from"]), int(row["distance_to"])
        in_bin = (marks["distance"] >= low) & (marks["distance"] <= high)
        assert int(row["answers"]) == in_bin.sum()
        assert int(row["first_answers"]) == (in_bin & (marks["query"] == 0)).sum()
        assert float(row["recall_acc"]) == (
            1.0 if high < 12 else 0.0
        )  # 12 is a bin edge: no bin straddles it
    assert [int(row["distance_from"]) for row in table[:8]] == [6, 8, 10, 12, 14, 15, 17, 19]
    answers = [recall.run_answers(n, tmp_path / "runs" / n, config, "test") for n in ("xl", "rpe")]
    context_points = recall.context_points([tmp_path / "runs" / "xl"])
    assert [(p["state_size"], p["recall"]) for p in context_points] == [(0.0, 0.33), (8192.0, 0.85)]
    run_point = {"run": "xl", "state_size": 12800.0, "recall": 0.8}
    (ax,) = recall.state_size_figure([run_point], context_points).axes
    assert [tuple(line.get_xydata()[:, 1]) for line in ax.lines] == [(0.33, 0.85)]  # the context model
    (ax,) = recall.distance_figure(recall.by_distance(answers, recall.distance_edges(answers)), answers).axes
    assert len(ax.lines) == 2 * 2 + 1  # all answers and first queries per run, and chance 1/3
    for name in ("recall_vs_distance.png", "recall_vs_state_size.png", "recall_by_distance.md"):
        assert (out / name).stat().st_size > 0


def test_recall_by_distance_leaves_out_answers_bound_before_their_evaluation_row(tmp_path):
    """token_nll.npz's `row_start` says where each target's evaluation row (and its memory) began: an
    answer bound before it is out of every model's reach, left out and counted, as the logged
    accuracy leaves it out."""
    from longctx.diagnostics import recall

    marks, offset, files = small_mqar(tmp_path / "mqar")
    row_start = (offset - 1) // 500 * 500  # rows of 500 targets
    np.savez(tmp_path / "token_nll.npz", nll=np.ones(offset.shape, np.float32), offset=offset,
             correct=np.ones(offset.shape, bool), row_start=row_start)  # fmt: skip
    config = {"data": {"corpus": "text_files", "files": files, "tokenizer": "words"}}
    answers = recall.run_answers("xl", tmp_path, config, "test")
    bound_before = marks["offset"] - marks["distance"] < (marks["offset"] - 1) // 500 * 500
    assert 0 < bound_before.sum() == answers.out_of_reach
    np.testing.assert_array_equal(answers.distance, marks["distance"][~bound_before])


def test_recall_by_segments_back_counts_the_segments_and_the_memory_restarts_between(tmp_path):
    """token_nll.npz `segment_len` and `memory_start`: each answer's segments back (the answer scored
    by segment (o − 1 − row_start) // T, its binding read by (b − row_start) // T) and whether the
    memory restarted in between (here samples of 2 segments, as RMT's `eval_restart_every: 2`);
    report writes the table."""
    from longctx.diagnostics import recall

    marks, offset, files = small_mqar(tmp_path / "mqar")
    T, K = 10, 2
    row_start = (offset - 1) // 500 * 500
    memory_start = row_start + (offset - 1 - row_start) // (K * T) * (K * T)
    bound = marks["offset"] - marks["distance"]
    at = np.searchsorted(offset, marks["offset"])
    restarted = bound < memory_start[at]
    correct = np.ones(offset.shape, bool)
    correct[at[restarted]] = False  # what the restarted memory forgot
    run_dir = tmp_path / "runs" / "rmt"
    run_dir.mkdir(parents=True)
    np.savez(run_dir / "token_nll.npz",
             nll=np.ones(offset.shape, np.float32), offset=offset, correct=correct, row_start=row_start,
             segment_len=np.int64(T), memory_start=memory_start)  # fmt: skip
    config = {"data": {"corpus": "text_files", "files": files, "tokenizer": "words"}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    summary = {"status": "finished", "subcommand": "test", "metrics": {"test/loss": 2.0}}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    answers = recall.run_answers("rmt", run_dir, config, "test")
    in_row = bound >= row_start[at]
    back = (marks["offset"] - 1) // T - bound // T  # rows of 500 = 50 segments: the same from 0
    rows = recall.by_segment([answers])
    assert sorted({row["segments_back"] for row in rows}) == sorted(set(back[in_row].tolist())) == [0, 1, 2]
    for row in rows:
        here = in_row & (back == row["segments_back"]) & (restarted == (row["memory_restarted"] == "yes"))
        assert row["answers"] == here.sum() > 0
        assert row["first_answers"] == (here & (marks["query"] == 0)).sum()
        assert row["recall_acc"] == (0.0 if row["memory_restarted"] == "yes" else 1.0)
    assert {(row["segments_back"], row["memory_restarted"]) for row in rows} >= {
        (0, "no"),
        (1, "no"),
        (1, "yes"),
    }
    report_main([str(run_dir), "--out", str(tmp_path / "out")])
    with (tmp_path / "out" / "recall_by_segment.csv").open() as f:
        written = list(csv.DictReader(f))
    assert [(int(r["segments_back"]), r["memory_restarted"], int(r["answers"])) for r in written] == [
        (row["segments_back"], row["memory_restarted"], row["answers"]) for row in rows
    ]


def test_seeds_of_one_recipe_are_one_row_of_medians_and_ranges(tmp_path):
    """Runs named `xl`, `xl_seed2`, `xl_seed3` with one config but the seed and their own naming: one
    row, the median and range of the finished ones (a diverged seed is counted, not averaged); runs
    whose configs differ beyond the seed, or that share a seed, are not merged and a note says why."""

    def config(name: str, seed: int, lr: float = 0.01) -> dict:
        return {"seed_everything": seed, "run_name": f"sweep/{name}", "ckpt_path": f"runs/{name}/last.ckpt",
                "trainer": {"default_root_dir": f"runs/sweep/{name}", "logger": {"id": f"sweep-{name}"}},
                "model": {"lr": lr}}  # fmt: skip

    bpbs = {"xl": 1.5, "xl_seed2": 1.2, "xl_seed3": 1.4}
    reached = {"xl": 1250, "xl_seed2": None, "xl_seed3": 750}  # the seed 2 fit ran its 8,000 steps
    for seed, (name, bpb) in enumerate(bpbs.items(), start=1):
        stop = {"reached_step": reached[name], "global_step": reached[name] or 8000}
        _write_run(tmp_path, name, _finished(bpb) | {"recall_stop": stop}, config(name, seed))
    _write_run(
        tmp_path, "xl_seed4", {"status": "diverged", "metrics": {"test/bpb": 0.1}}, config("xl_seed4", 4)
    )
    _write_run(tmp_path, "rpe", _finished(2.0), config("rpe", 1))
    _write_run(tmp_path, "rpe_seed2", _finished(2.2), config("rpe_seed2", 2, lr=0.003))
    _write_run(tmp_path, "gpt2", _finished(2.0), config("gpt2", 1))
    _write_run(tmp_path, "gpt2_seed1", _finished(2.1), config("gpt2_seed1", 1))
    names = [*bpbs, "xl_seed4", "rpe", "rpe_seed2", "gpt2", "gpt2_seed1"]
    report_main([*(str(tmp_path / n) for n in names), "--out", str(tmp_path / "out")])
    with (tmp_path / "out" / "seeds.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    assert (row["group"], row["seeds"], row["finished"]) == ("xl", "4", "3")
    assert [float(row[k]) for k in ("test_bpb", "test_bpb_min", "test_bpb_max")] == [1.4, 1.2, 1.5]
    assert row["steps_to_acc"] == "1250, >8000, 750, -"  # each seed's, in order: not a median of a bound
    text = (tmp_path / "out" / "report.md").read_text()
    assert "| xl | 4 | 3 | 1250, >8000, 750, - | 1.4 (1.2-1.5) |" in text
    assert "not merged (rpe, rpe_seed2): their configs differ beyond the seed" in text
    assert "not merged (gpt2, gpt2_seed1): two runs share a seed" in text
