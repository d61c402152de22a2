"""Context diagnostics (`python -m longctx context`): RECL as Dai et al. (2019) define it, loss by
position and document distance, the evaluation knobs it sweeps, and its numbers against `validate`."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import lightning
import numpy as np
import pytest
import torch

from longctx.commands import context
from longctx.commands.cli import LongCtxCLI, main
from longctx.commands.context import ContextError, log_to_wandb, save_figure
from longctx.commands.context import main as context_main
from longctx.data.datamodule import LMDataModule
from longctx.data.streams import SegmentStream
from longctx.diagnostics import positions
from longctx.diagnostics.axes import AxisError, axis_named
from longctx.diagnostics.figures import context_figure
from longctx.diagnostics.footprint import evaluation_bytes
from longctx.diagnostics.recl import Gain, Recl, relative_effective_context_length, relative_gain
from longctx.methods.adaptive_span.module import AdaptiveSpanLM
from longctx.methods.transformer_xl.module import TransformerXLLM
from tests.helpers.environment import REPO
from tests.helpers.methods import tiny

# ------------------------------------------------------------------ RECL (hand-computed)
# Two models, four tokens, context lengths 0, 10, 20: l_i(c, t).
LOSSES = {
    "A": {
        0: np.array([2.0, 1.2, 3.0, 0.5]),
        10: np.array([2.0, 0.2, 0.9, 0.5]),
        20: np.array([2.0, 0.2, 0.895, 0.5]),
    },
    "B": {
        0: np.array([1.0, 2.0, 4.0, 0.5]),
        10: np.array([1.0, 2.0, 3.0, 0.5]),
        20: np.array([0.5, 2.0, 3.0, 0.5]),
    },
}


def test_relative_gain_uses_the_groups_best_short_context_loss_on_the_hardest_positions():
    """c = 0, c' = 10, r = 0.5: b(0, t) = [1, 1.2, 3, 0.5], T = {t2, t1} (the two largest b),
    f(0, 0) = (3 + 1.2)/2 = 2.1; A: f = (min(3, 0.9) + min(1.2, 0.2))/2 = 0.55; B: f = (3 + 1.2)/2."""
    gains = relative_gain(LOSSES, 0, 10, r=0.5)
    assert gains["A"] == pytest.approx(1 - math.exp(0.55 - 2.1))
    assert gains["B"] == pytest.approx(0.0)
    # c = 10, c' = 20: b(10, t) = [1, 0.2, 0.9, 0.5], T = {t0, t2}, f(10, 10) = 0.95;
    # A: (min(1, 2) + min(0.9, 0.895))/2 = 0.9475; B: (min(1, 0.5) + min(0.9, 3))/2 = 0.7.
    gains = relative_gain(LOSSES, 10, 20, r=0.5)
    assert gains["A"] == pytest.approx(1 - math.exp(0.9475 - 0.95))
    assert gains["B"] == pytest.approx(1 - math.exp(0.7 - 0.95))


def test_recl_is_the_first_context_whose_gain_falls_below_the_threshold():
    recls, gains = relative_effective_context_length(LOSSES, rs=[0.5, 1.0])
    # B gains nothing from 0 to 10 (its later gain does not count); A gains 79% then 0.25% (r = 0.5),
    # 54% then 0.125% (r = 1: f(10, 10) = 2.6/4, A's f(10, 20) = 2.595/4).
    assert recls == [Recl("A", 0.5, 10, False), Recl("B", 0.5, 0, False), Recl("A", 1.0, 10, False),
                     Recl("B", 1.0, 0, False)]  # fmt: skip
    assert Gain("A", 1.0, 10, 20, pytest.approx(1 - math.exp(-0.005 / 4))) in gains
    assert Gain("A", 1.0, 0, 10, pytest.approx(1 - math.exp(2.6 / 4 - 5.7 / 4))) in gains
    # Below a threshold of 0.1%, A's gain never falls: its RECL is the sweep's end, flagged.
    recls, _ = relative_effective_context_length(LOSSES, rs=[1.0], gain_threshold=0.001)
    assert recls[0] == Recl("A", 1.0, 20, True)


def test_recl_needs_the_same_context_lengths_for_every_model():
    uneven = {"A": LOSSES["A"], "B": {0: LOSSES["B"][0], 10: LOSSES["B"][10]}}
    with pytest.raises(ValueError, match="same context lengths"):
        relative_effective_context_length(uneven)


# ------------------------------------------------------------------ positions
def test_window_positions_follow_the_streams_rows_and_documents():
    tokens = np.arange(200, dtype=np.uint32)
    stream = SegmentStream(tokens, 3, 16, pad=True)
    where = positions.window_positions(stream, 200)
    per_row = math.ceil(199 / 3)  # evaluation rows: contiguous pieces of 67 targets
    expected = [((t - 1) % per_row) % 16 for t in range(1, 200)]
    np.testing.assert_array_equal(where[1:], expected)
    docs = np.array([0, 40, 41, 90, 200])
    where = positions.window_positions(SegmentStream(tokens, 3, 16, pad=True, doc_offsets=docs), 200)
    assert where[42] == 0 and where[91 + 16] == 0  # each document's first target opens a segment
    assert where[41] == -1  # a one-token document has no target


def test_loss_by_position_and_by_document_distance():
    offset = np.arange(1, 200)
    where = np.full(200, -1)
    where[1:] = (offset - 1) % 16
    rows = positions.loss_by_position(where[offset].astype(np.float32), offset, where)
    assert [row["loss"] for row in rows] == list(range(16))
    assert sum(row["tokens"] for row in rows) == 199
    docs = np.array([0, 40, 41, 90, 200])
    targets = np.array([t for t in range(1, 200) if t not in docs])  # a document's first token is no target
    rows = positions.loss_by_document_distance(np.ones(targets.size, np.float32), targets, docs)
    # distances: 1..39 (document 0), 1..48 (document 2), 1..109 (document 3); bins double from 1
    assert [row["distance_from"] for row in rows] == [1, 2, 4, 8, 16, 32, 64]
    assert [row["tokens"] for row in rows[:2]] == [3, 6]  # d = 1 in three documents; d in [2, 4)
    assert rows[-1]["tokens"] == 109 - 63  # d in [64, 128): document 3 only
    assert all(row["loss"] == 1.0 for row in rows)


# ------------------------------------------------------------------ the knobs
def block_logits(model: AdaptiveSpanLM, blocks: torch.Tensor, span_cap: int | None = None) -> torch.Tensor:
    """Logits of consecutive blocks (B, n·M, V), the cache carried from block to block."""
    cache, logits = model.net.init_cache(blocks.shape[0]), []
    with torch.no_grad():
        for x in blocks.split(8, dim=1):
            out = model.net(x, cache, span_cap=span_cap)
            cache, logits = out.cache, [*logits, out.logits]
    return torch.cat(logits, 1)


def test_a_span_cap_of_c_reads_what_a_span_of_c_reads():
    """A fixed-span model (S = 16) capped at 8 equals the same weights with S = 8 (key_pe's last 8
    columns); with no cap it differs."""
    torch.manual_seed(0)
    wide = tiny("adaptive_span", network={"span_kind": "fixed", "attn_span": 16, "dropout": 0.0}).eval()
    narrow = tiny("adaptive_span", network={"span_kind": "fixed", "attn_span": 8, "dropout": 0.0}).eval()
    state = wide.state_dict()
    state["net.key_pe"] = state["net.key_pe"][:, -8:]
    narrow.load_state_dict(state)
    blocks = torch.randint(0, 64, (2, 32))
    torch.testing.assert_close(block_logits(wide, blocks, span_cap=8), block_logits(narrow, blocks))
    assert not torch.allclose(block_logits(wide, blocks), block_logits(narrow, blocks), atol=1e-4)


def test_the_span_cap_is_an_evaluation_knob_of_adaptive_spans():
    torch.manual_seed(0)
    model = tiny("adaptive_span", network={"span_init": 1.0, "span_ramp": 4, "dropout": 0.0}).eval()
    blocks = torch.randint(0, 64, (2, 32))
    torch.testing.assert_close(block_logits(model, blocks, span_cap=32), block_logits(model, blocks))
    assert not torch.allclose(block_logits(model, blocks, span_cap=4), block_logits(model, blocks), atol=1e-4)
    batch = {"input": blocks[:, :8], "target": blocks[:, 1:9]}
    with torch.no_grad():
        free = model.step(batch, model.init_memory(2)).nll
        model.eval_span_cap = 4
        capped = model.step(batch, model.init_memory(2)).nll
        trained = model.train().step(batch, model.init_memory(2)).nll  # dropout 0: only the cap differs
    assert not torch.allclose(capped, free, atol=1e-4)
    torch.testing.assert_close(trained, free)  # training ignores the evaluation cap
    with pytest.raises(ValueError, match=r"eval_span_cap must be in \[1, attn_span = 32\]"):
        tiny("adaptive_span", eval_span_cap=33)


def test_h_prev_reset_scores_every_window_as_if_it_were_alone():
    torch.manual_seed(0)
    model = tiny("recurrence").eval()
    x, target = torch.randint(0, 64, (2, 2, 8)), torch.randint(0, 64, (2, 2, 8))
    batch = {"input": x, "target": target, "mask": torch.ones(2, 2, 8, dtype=torch.bool),
             "reset": torch.zeros(2, 2, dtype=torch.bool)}  # fmt: skip
    second = {key: value[:, 1:] for key, value in batch.items()}
    with torch.no_grad():
        alone = model.step(second, None).nll[:, 0]
        carried = model.step(batch, None).nll[:, 1]
        model.eval_h_prev = "reset"
        reset = model.step(batch, None).nll[:, 1]
    torch.testing.assert_close(reset, alone)
    assert not torch.allclose(carried, alone, atol=1e-5)


# ------------------------------------------------------------------ the command
def tiny_xl_flags(tmp_path: Path) -> list[str]:
    """A one-layer XL on the bundled byte-level sample text, weights large enough to use its memory."""
    return [
        "--config", str(REPO / "configs" / "transformer_xl_tiny.yaml"),
        "--data.corpus", "sample", "--data.split_sources", "null",
        "--data.cache_dir", str(tmp_path / "cache"),
        "--data.eval_batch_size", "2", "--data.eval_tgt_len", "16",
        "--model.init_args.network.n_layers", "1", "--model.init_args.network.d_model", "16",
        "--model.init_args.network.n_heads", "2", "--model.init_args.network.d_inner", "32",
        "--model.init_args.network.cutoffs", "[]", "--model.init_args.mem_len", "16",
        "--model.init_args.network.init_std", "0.5", "--model.init_args.network.proj_init_std", "0.5",
        "--trainer.limit_val_batches", "3", "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false",
    ]  # fmt: skip


def save_checkpoint(flags: list[str], path: Path) -> None:
    """The configured model's initial weights as a Lightning checkpoint."""
    torch.manual_seed(0)
    model = LongCtxCLI(args=flags, run=False).model
    torch.save({"state_dict": model.state_dict(), "pytorch-lightning_version": lightning.__version__}, path)


@pytest.fixture
def xl_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """In tmp_path: `xl.ckpt`, the tiny XL's initial weights; returns its flags (`tiny_xl_flags`)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    flags = tiny_xl_flags(tmp_path)
    save_checkpoint(flags, tmp_path / "xl.ckpt")
    return flags


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_a_context_point_equals_the_validate_run_with_its_flags(tmp_path, xl_checkpoint):
    flags = xl_checkpoint
    context_main(["--config", flags[1], "--ckpt_path", "xl.ckpt", "--name", "xl", "--lengths", "0", "16",
                  "--run_name", "ctx", *flags[2:]])  # fmt: skip
    run_dir = tmp_path / "runs" / "ctx"
    rows = read_csv(run_dir / "context.csv")
    assert [(row["model"], row["axis"], row["context_length"]) for row in rows] == [
        ("xl", "memory", "0"), ("xl", "memory", "16")
    ]  # fmt: skip
    assert rows[1]["flags"] == "--model.init_args.evaluation.mem_len 16"
    assert float(rows[0]["loss"]) != float(rows[1]["loss"])  # the memory is read
    cli = main(["validate", *flags, "--model.init_args.evaluation.mem_len", "16", "--ckpt_path", "xl.ckpt",
                "--run_name", "validate"])  # fmt: skip
    metrics = cli.trainer.callback_metrics
    assert float(rows[1]["loss"]) == float(metrics["val/loss"])  # exactly
    assert float(rows[1]["bpb"]) == float(metrics["val/bpb"])
    assert int(rows[1]["tokens"]) == int(metrics["val/tokens"])
    assert [float(row["state_size"]) for row in rows] == [0.0, 16 * 16]  # memory m x d_model
    assert float(rows[1]["state_size"]) == float(metrics["val/state_size"])
    assert rows[1]["recall_acc"] == rows[1]["recall_acc_first"] == ""  # the sample text has no marks
    recl_rows = read_csv(run_dir / "recl.csv")
    assert [row["r"] for row in recl_rows] == ["0.1", "0.5", "1.0"]
    assert all(row["recl"] in ("0", "16") for row in recl_rows)
    positions_rows = read_csv(run_dir / "context_positions.csv")
    assert {row["position"] for row in positions_rows} == {str(p) for p in range(16)}
    for name in ("context.png", "context_positions.png", "context_document_distance.png"):
        assert (run_dir / name).stat().st_size > 0
    with np.load(run_dir / "xl" / "token_nll_memory16.npz") as arrays:
        assert arrays["nll"].astype(np.float64).sum() == pytest.approx(
            float(metrics["val/loss"]) * float(metrics["val/tokens"]), rel=1e-6
        )
    summary = json.loads((run_dir / "summary.json").read_text())  # the command and every file it wrote
    assert (summary["status"], summary["commands"]["context"][:2]) == ("finished", ["context", "--config"])
    files = {str(path.relative_to(run_dir)) for path in run_dir.rglob("*") if path.is_file()}
    assert set(summary["artifacts"]) == files - {".lock", "summary.json"}
    assert {"context.csv", "xl/config.yaml", "xl/token_nll_memory16.npz"} <= set(summary["artifacts"])
    assert {entry["subcommand"] for entry in summary["artifacts"].values()} == {"context"}


def test_bad_input_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=r"^error: --ckpt_path missing.ckpt: no such checkpoint file$"):
        context_main(["--config", "c.yaml", "--ckpt_path", "missing.ckpt"])
    known = "span_cap, compressed, memory, attended, window, overlap"  # the registry's methods', the data's
    with pytest.raises(
        SystemExit, match=rf"^error: --axis depth: unknown context axis; choose one of {known}$"
    ):
        context_main(["--config", "c.yaml", "--ckpt_path", "missing.ckpt", "--axis", "depth"])
    with pytest.raises(SystemExit, match=r"^error: 2 --config but 1 --ckpt_path: give one checkpoint per"):
        context_main(["--config", "a.yaml", "--config", "b.yaml", "--ckpt_path", "a.ckpt"])
    assert not (tmp_path / "runs").exists()  # refused before any evaluation: no folder left behind


@pytest.mark.slow
def test_an_axis_or_length_the_model_cannot_take_is_one_line(xl_checkpoint):
    flags = xl_checkpoint
    command = ["--config", flags[1], "--ckpt_path", "xl.ckpt", *flags[2:]]
    with pytest.raises(
        SystemExit, match=r"^error: --axis span_cap does not apply to TransformerXLLM: it caps"
    ):
        context_main([*command, "--axis", "span_cap"])
    with pytest.raises(SystemExit, match=r"^error: --lengths -1: TransformerXLLM takes memory lengths >= 0$"):
        context_main([*command, "--lengths", "-1", "16"])
    with pytest.raises(SystemExit, match=r"the trainer runs 2 processes; context evaluates in one \(add"):
        context_main([*command, "--trainer.devices", "2", "--trainer.strategy", "ddp"])
    too_long = r"^error: --lengths 100000000: TransformerXLLM at memory length 100,000,000 needs about "
    with pytest.raises(SystemExit, match=too_long + r"[\d.,]+ [GT]B for one evaluation step .* up to about"):
        context_main([*command, "--lengths", "0", "100000000"])  # was a 96-line traceback at 819 GB
    with pytest.raises(SystemExit, match=r"^error: data.batch_size: expected int, got x$"):
        context_main([*command, "--", "--data.batch_size", "x"])  # was a ParseError traceback


TINY = {
    "window": lambda: tiny("window_transformer", network={"n_layers": 1}),  # window 16
    "span": lambda: tiny("adaptive_span"),  # S = 32
    "trams": lambda: tiny("transformer_xl", trams={"attended": 8, "kept": 4}),  # pool 16
    "gpt2": lambda: tiny("recurrence"),  # n_positions 32
}


@pytest.mark.parametrize(
    ("axis", "model", "mode", "length", "message"),
    [
        ("window", "window", "segments", 17, "window lengths from 1 to 16"),
        ("span_cap", "span", "segments", 33, "span_cap lengths from 1 to 32"),
        ("attended", "trams", "segments", 17, "attended lengths from 1 to 16"),
        ("overlap", "gpt2", "windows", 16, "overlap lengths from 0 to 15"),
        ("memory", "span", "segments", 8, "--axis memory does not apply to AdaptiveSpanLM"),
    ],
)
def test_each_axis_refuses_lengths_beyond_the_model(tmp_path, axis, model, mode, length, message):
    data = LMDataModule("sample", cache_dir=str(tmp_path), mode=mode, tgt_len=16)
    with pytest.raises(AxisError, match=message):
        axis_named(axis).lengths_for(TINY[model](), data, [length])
    if "does not apply" not in message:
        assert axis_named(axis).lengths_for(TINY[model](), data, [length - 1, 1]) == [1, length - 1]


def test_lengths_whose_memory_cannot_fit_are_refused_before_anything_is_allocated(tmp_path, monkeypatch):
    """`--lengths 100000000` tried to allocate 819 GB, then failed in a 96-line traceback: each length's
    evaluation step is estimated first against the memory the device has (here said to be 100 MB)."""
    model = tiny("transformer_xl")  # 2 layers, d 16, 2 heads
    data = LMDataModule("sample", cache_dir=str(tmp_path), tgt_len=16, eval_batch_size=4)
    monkeypatch.setattr(context, "available_bytes", lambda device: 10**8)
    memory = axis_named("memory")
    context.check_memory(model, data, memory, [0, 16, 4096], torch.device("cpu"))  # fits
    with pytest.raises(ContextError) as info:
        context.check_memory(model, data, memory, [0, 16, 10**8], torch.device("cpu"))
    message = str(info.value)
    assert message.startswith(
        "--lengths 100000000: TransformerXLLM at memory length 100,000,000 needs about 467.2 GB for one "
        "evaluation step (data.eval_batch_size 4, segments of 16), more than the 100.0 MB available on cpu; "
        "give lengths up to about "
    )
    fits = re.search(r"up to about ([\d,]+), or lower data.eval_batch_size$", message)[1]
    fits = int(fits.replace(",", ""))

    def need(length: int) -> int:
        memory.set(model, data, length)
        return evaluation_bytes(model, data)

    assert need(fits) <= 10**8 < need(fits + 1)  # the longest length that fits, as said


def test_the_estimate_covers_the_memory_a_transformer_xl_evaluation_holds():
    """The dominant term is real: the buffers of the evaluation's key/value cache (and carried states)
    after two segments at memory 512 lie within the estimate, and are most of it."""
    model = tiny("transformer_xl", evaluation={"mem_len": 512}).eval()
    data = SimpleNamespace(eval_batch_size=2, eval_tgt_len=16)
    memory = model.init_memory(2)
    tokens = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        for _ in range(2):
            memory = model.step({"input": tokens, "target": tokens, "mask": tokens >= 0}, memory).memory
    held = sum(buffer.nbytes for buffer in memory.slots.store.buffers.values())
    estimate = evaluation_bytes(model, data)
    assert held <= estimate <= 3 * held


@pytest.mark.slow  # two context commands through the CLI
def test_ctrl_c_keeps_the_finished_points_and_exits_130(xl_checkpoint, monkeypatch, capsys):
    """Was exit 1, no longctx line, and every finished point lost (the table was written at the end).
    A point that runs out of memory keeps those before it, too."""
    flags = xl_checkpoint
    command = ["--config", flags[1], "--ckpt_path", "xl.ckpt", "--name", "xl", "--lengths", "0", "8", "16",
               "--run_name", "ctx", "--", *flags[2:]]  # fmt: skip
    validation_step = TransformerXLLM.validation_step

    def ctrl_c_at_memory_16(self, *args, **kwargs):
        if self.eval_lengths.mem_len == 16:
            raise KeyboardInterrupt
        return validation_step(self, *args, **kwargs)

    with monkeypatch.context() as patch, pytest.raises(SystemExit) as info:
        patch.setattr(TransformerXLLM, "validation_step", ctrl_c_at_memory_16)
        context_main(command)
    assert info.value.code == 130
    err = capsys.readouterr().err
    table = Path("runs/ctx/context.csv")
    assert (
        f"longctx: Ctrl-C: stopped after 2 of 3 points; the finished ones are in {table} (RECL and the "
        "figures need every point: run the command again); exit code 130"
    ) in err
    assert "Traceback" not in err
    assert [(row["model"], row["context_length"]) for row in read_csv(table)] == [("xl", "0"), ("xl", "8")]
    context_main(command)  # the same command again evaluates every point
    assert [row["context_length"] for row in read_csv(table)] == ["0", "8", "16"]

    def out_of_memory_at_16(self, *args, **kwargs):
        if self.eval_lengths.mem_len == 16:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return validation_step(self, *args, **kwargs)

    with monkeypatch.context() as patch, pytest.raises(SystemExit) as info:
        patch.setattr(TransformerXLLM, "validation_step", out_of_memory_at_16)
        context_main(command)
    assert info.value.code == (
        "error: xl at memory length 16: out of memory (CUDA out of memory. Tried to allocate 20.00 GiB); "
        f"give shorter lengths or lower data.eval_batch_size (the points finished before are in {table})"
    )


def write_config(path: Path, base: str, overrides: dict) -> str:
    """A config file composed on a repo config (`config:`), with dotted overrides."""
    lines = [f"config: {REPO / 'configs' / base}"] + [f"{key}: {value}" for key, value in overrides.items()]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.slow
def test_several_models_in_one_call_each_point_equal_to_validate(tmp_path, monkeypatch):
    """Adaptive span (span cap), TRAMS (attended m) and the recurrent GPT-2 (overlap, h_prev reset) in
    one call: one line per model and variant, and each model's last point equals its `validate` run."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    tiny = {"model.init_args.network.n_layers": 1, "model.init_args.network.d_model": 16,
            "model.init_args.network.n_heads": 2, "model.init_args.network.d_inner": 32}  # fmt: skip
    configs = {
        "span": write_config(tmp_path / "span.yaml", "adaptive_span_tiny.yaml", {
            **tiny, "model.init_args.network.attn_span": 64,
            "model.init_args.network.span_init": 0.5, "data.eval_tgt_len": 32}),
        "trams": write_config(tmp_path / "trams.yaml", "transformer_xl_tiny.yaml", {
            **tiny, "model.init_args.network.cutoffs": "[]", "model.init_args.network.init_std": 0.5,
            "model.init_args.trams.attended": 16, "model.init_args.trams.kept": 12,
            "model.init_args.trams.pool": 32, "model.init_args.protocol": "trams"}),
        "gpt2": write_config(tmp_path / "gpt2.yaml", "recurrent_gpt2_tiny.yaml", {
            "model.init_args.gpt2_config": "{n_layer: 3, n_embd: 16, n_head: 2, n_positions: 32}",
            "model.init_args.window_recurrence.insert_layer": 1, "data.tgt_len": 16, "data.eval_tgt_len": 16,
            "data.tokenizer": "gpt2"}),
    }  # fmt: skip
    common = [
        "--data.corpus", "sample", "--data.split_sources", "null",
        "--data.cache_dir", str(tmp_path / "cache"), "--data.eval_batch_size", "2",
        "--trainer.limit_val_batches", "2", "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false",
    ]  # fmt: skip
    command = []
    for name, config in configs.items():
        save_checkpoint(["--config", config, *common], tmp_path / f"{name}.ckpt")
        command += ["--config", config, "--ckpt_path", f"{name}.ckpt", "--name", name]
    context_main([*command, "--lengths", "4", "8", "--run_name", "ctx", *common])
    rows = read_csv(tmp_path / "runs" / "ctx" / "context.csv")
    assert [(row["model"], row["axis"], row["context_length"]) for row in rows] == [
        ("span", "span_cap", "4"), ("span", "span_cap", "8"), ("trams", "attended", "4"),
        ("trams", "attended", "8"), ("gpt2", "overlap", "4"), ("gpt2", "overlap", "8"),
        ("gpt2 (h_prev reset)", "overlap", "4"), ("gpt2 (h_prev reset)", "overlap", "8"),
    ]  # fmt: skip
    assert rows[3]["flags"] == "--model.init_args.trams.attended 8 --model.init_args.trams.kept 6"
    for row, name in [(rows[1], "span"), (rows[3], "trams"), (rows[7], "gpt2")]:
        cli = main(["validate", "--config", configs[name], *common, *row["flags"].split(),
                    "--ckpt_path", f"{name}.ckpt", "--run_name", f"validate_{name}"])  # fmt: skip
        assert float(row["loss"]) == float(cli.trainer.callback_metrics["val/loss"]), name
    assert rows[5]["loss"] != rows[7]["loss"]  # h_prev carried and reset differ
    # Numbers per layer carried: span cap x d, attended m x d, h_prev (d) or nothing when reset.
    assert [float(row["state_size"]) for row in rows] == [64, 128, 64, 128, 16, 16, 0, 0]
    recl_models = {row["model"] for row in read_csv(tmp_path / "runs" / "ctx" / "recl.csv")}
    assert recl_models == {"span", "trams", "gpt2", "gpt2 (h_prev reset)"}


def test_the_default_sweep_is_five_lengths_up_to_the_configured_one(tmp_path):
    data = LMDataModule("sample", cache_dir=str(tmp_path), tgt_len=16)
    assert axis_named("window").lengths_for(TINY["window"](), data, None) == [1, 5, 8, 12, 16]
    trams = TINY["trams"]()  # m = 8 of a pool of 16
    assert axis_named("attended").lengths_for(trams, data, None) == [1, 3, 4, 6, 8]
    axis_named("attended").set(trams, data, 4)
    assert (trams.trams.attended, trams.trams.kept) == (4, 2)  # the configured kept share, 4/8


@pytest.mark.slow
def test_tables_and_figures_go_to_wandb_unless_disabled(tmp_path, monkeypatch):
    figure = tmp_path / "context.png"
    save_figure(context_figure([{"model": "m", "axis": "memory", "context_length": 0, "loss": 1.0}]), figure)
    tables = {"losses": [{"model": "m", "context_length": 0, "loss": 1.0}]}
    monkeypatch.setenv("WANDB_MODE", "disabled")
    log_to_wandb(tmp_path, "ctx", "longctx-test", tables, [figure])
    assert not (tmp_path / "wandb").exists()
    # Offline in a fresh interpreter: a W&B service that another test started in this process (named
    # in WANDB_SERVICE) would take the run and keep its records elsewhere.
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"} | {"WANDB_MODE": "offline"}
    code = (
        "import json, sys; from pathlib import Path; from longctx.commands.context import log_to_wandb; "
        "root = Path(sys.argv[1]); "
        "log_to_wandb(root, 'ctx', 'longctx-test', json.loads(sys.argv[2]), [root / 'context.png'])"
    )
    args = [sys.executable, "-c", code, str(tmp_path), json.dumps(tables)]
    subprocess.run(args, env=env, cwd=REPO, check=True, timeout=300)
    (run,) = (tmp_path / "wandb").glob("offline-run-*-ctx")
    assert list(run.glob("*.wandb"))  # the run's records, to sync later


# ------------------------------------------------------------------ the Compressive Transformer
def tiny_compressive_flags(tmp_path: Path) -> list[str]:
    """`tiny_xl_flags` as a Compressive Transformer: n_s 8, n_m 8, n_cm 8, c 2, 4 validation segments
    (the network's knobs under `network.`)."""
    from longctx.methods.compressive_transformer.network import CompressiveTransformer

    network = {field.name for field in dataclasses.fields(CompressiveTransformer.Config)}
    flags = [
        f"--model.init_args.network.{knob}"
        if flag.startswith("--model.init_args.") and (knob := flag.rpartition(".")[2]) in network
        else flag
        for flag in tiny_xl_flags(tmp_path)
    ]
    flags[1] = str(REPO / "configs" / "compressive_transformer_tiny.yaml")
    for flag in ("--data.eval_tgt_len", "--model.init_args.mem_len"):
        flags[flags.index(flag) + 1] = "8"
    flags[flags.index("--trainer.limit_val_batches") + 1] = "4"
    return [*flags, "--model.init_args.cmem_len", "8", "--model.init_args.network.compression_rate", "2"]


def test_the_compressive_transformer_sweeps_its_compressed_memory_then_its_memory(tmp_path):
    from longctx.diagnostics.axes import default_axis
    from longctx.methods.compressive_transformer.module import CompressiveTransformerLM

    network = {"n_layers": 1, "d_model": 16, "n_heads": 2, "d_inner": 32, "compression_rate": 2}
    model = CompressiveTransformerLM(vocab_size=64, network=network, mem_len=8, cmem_len=16)
    data = LMDataModule("sample", cache_dir=str(tmp_path), tgt_len=8)
    assert default_axis(model, data).name == "compressed"
    assert axis_named("compressed").lengths_for(model, data, None) == [0, 4, 8, 12, 16]
    axis_named("compressed").set(model, data, 4)
    axis_named("memory").set(model, data, 2)
    assert (model.eval_lengths.cmem_len, model.eval_lengths.mem_len) == (4, 2)
    assert (model.train_lengths.cmem_len, model.train_lengths.mem_len) == (16, 8)
    with pytest.raises(AxisError, match="--axis compressed does not apply to TransformerXLLM"):
        axis_named("compressed").lengths_for(tiny("transformer_xl"), data, [1])


@pytest.mark.slow
def test_a_compressive_transformer_point_equals_the_validate_run_with_its_flags(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    flags = tiny_compressive_flags(tmp_path)
    save_checkpoint(flags, tmp_path / "ct.ckpt")
    context_main(["--config", flags[1], "--ckpt_path", "ct.ckpt", "--name", "ct", "--lengths", "0", "4",
                  "--run_name", "ctx", *flags[2:]])  # fmt: skip
    rows = read_csv(tmp_path / "runs" / "ctx" / "context.csv")
    assert [(row["axis"], row["context_length"], row["flags"]) for row in rows] == [
        ("compressed", "0", "--model.init_args.evaluation.cmem_len 0"),
        ("compressed", "4", "--model.init_args.evaluation.cmem_len 4"),
    ]
    assert float(rows[0]["loss"]) != float(rows[1]["loss"])  # the compressed memory is read
    cli = main(["validate", *flags, "--model.init_args.evaluation.cmem_len", "4", "--ckpt_path", "ct.ckpt",
                "--run_name", "validate"])  # fmt: skip
    metrics = cli.trainer.callback_metrics
    assert float(rows[1]["loss"]) == float(metrics["val/loss"])  # exactly
    assert int(rows[1]["tokens"]) == int(metrics["val/tokens"])
