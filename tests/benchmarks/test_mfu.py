"""`benchmarks/mfu.py` checked without a GPU: the peak table, the MFU arithmetic, the rows' order, the
model FLOPs against what the networks compute (FlopCounterMode) and against the papers' numbers, the
paper shapes against their configs, and the rows themselves at tiny shapes on the CPU.

`bash benchmarks/gpu.sh mfu` runs the script on a GPU; `tests/benchmarks/test_benchmarks.py` runs it whole at
tiny shapes (slow tier).
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from torch.utils.flop_counter import FlopCounterMode

from tests.helpers.environment import REPO
from tests.methods.transformer_xl.test_transformer_xl import RESOLVED, xl_init_args

BENCHMARKS = REPO / "benchmarks"


@pytest.fixture(scope="module")
def mfu() -> Iterator:
    """benchmarks/mfu.py as a module (its folder's modules importable, as when run as a script)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCHMARKS))
        yield importlib.import_module("mfu")
        for name in ("mfu", "mfu_shapes", "attention", "gpu_report"):
            sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def shapes(mfu):
    return sys.modules["mfu_shapes"]


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989.4),  # the SXM board, what the lent H100 reports
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.5),
        ("NVIDIA H200", 989.4),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A100 80GB PCIe", 312.0),
        ("NVIDIA L40S", 362.05),
        ("NVIDIA L4", 121.0),
        ("NVIDIA L40", None),  # not in the table: blank, not the L4's or L40S's number
        ("NVIDIA GH200 480GB", None),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_peak_table_gives_the_datasheet_dense_bf16_rate_or_nothing(mfu, name, peak):
    found = mfu.bf16_peak(name)
    assert (found and found[0]) == peak
    assert found is None or found[1].startswith("https://www.nvidia.com/")


def test_mfu_is_palms_model_flops_rate_over_the_peak(mfu):
    """3 × forward FLOPs in training (backward = 2 forwards), 1 × at evaluation; blank without a peak
    or without a measurement."""
    row = {"forward_flops_per_token": 2e9, "tokens_per_s": 5e4}
    assert mfu.mfu(row, "train", 600.0) == pytest.approx(3 * 2e9 * 5e4 / 600e12)
    assert mfu.mfu(row, "eval", 600.0) == pytest.approx(2e9 * 5e4 / 600e12)
    assert mfu.mfu(row, "train", None) is None
    assert mfu.mfu({"error": "OutOfMemoryError: ..."}, "train", 600.0) is None


def test_rows_run_by_tier_and_each_method_gets_its_own_variants(mfu, shapes):
    jobs = mfu.plan(list(shapes.BENCHES), ["train", "eval"], list(mfu.VARIANTS), tiny=False)
    ids = [job.id for job in jobs]
    assert [job.tier for job in jobs] == sorted(job.tier for job in jobs)
    tier1 = {job.id for job in jobs if job.tier == 1}
    assert {"transformer_xl/train/sdpa", "transformer_xl/eval/eager-uncached", "trams/eval/sdpa"} <= tier1
    assert {"adaptive_span/train/sdpa", "adaptive_span/train/eager"} <= tier1
    assert [job.id for job in jobs if job.tier == 2][:2] == [
        "transformer_xl/train/compiled",
        "adaptive_span/train/compiled",
    ]
    assert not [i for i in ids if i.startswith("trams/train/")]  # TRAMS is an evaluation method
    assert not [i for i in ids if i.endswith("/train/flex") or i.endswith("/train/eager-uncached")]
    assert "recurrence/eval/flex" not in ids and "recurrence/eval/eager-uncached" not in ids
    assert "recurrence/eval/eager" in tier1  # no cache: its eager row is the authors' evaluation
    assert "transformer_xl/eval/eager" not in tier1  # with the cache: tier 3, beside eager-uncached


# ------------------------------------------------------------------ model FLOPs


@pytest.mark.parametrize("projected", [False, True], ids=["div_val 1", "div_val 2, d_embed 16"])
def test_adaptive_softmax_count_is_what_the_nll_computes(shapes, projected):
    """The output layer's count for given targets equals the matrix products the NLL runs (counted by
    FlopCounterMode): the head for every target, a tail cluster only for its own targets."""
    knobs = {"network": {"d_embed": 16, "div_val": 2}} if projected else {}
    bench = shapes.BENCHES["transformer_xl"]
    lm = bench.build(bench.tiny, "eval", "cpu", **knobs)  # vocabulary 300, cutoffs 100, 200; d 32
    targets = torch.tensor([[0, 5, 99, 100, 150, 250, 299, 7]])
    hidden = torch.randn(1, targets.shape[1], 32)
    with FlopCounterMode(display=False) as counter:
        lm.net.nll(hidden, targets)
    assert counter.get_total_flops() == pytest.approx(2 * 8 * shapes.adaptive_softmax_macs(lm, targets))
    if not projected:  # 32·(100 + 2) for all 8, 32·100 for the 2 in [100, 200) and the 2 in [200, 300)
        assert shapes.adaptive_softmax_macs(lm, targets) == 32 * 102 + (2 / 8 + 2 / 8) * 32 * 100


@pytest.mark.slow  # ~5 s: adaptive span's 38.5M parameters initialised on the CPU
def test_paper_shapes_build_and_count_the_papers_numbers(mfu):
    """`--dry`: every paper-shape model builds (meta device) and its FLOPs per token are the papers'
    where they state them. The counts themselves are fast-tier facts of each method's tests (XL's
    151M parameters, adaptive span's 42.4M MACs, GPT-2's 1.75e8, the Compressive Transformer's and
    the Recurrent Memory Transformer's FLOPs against torch's count); this checks mfu.py's rows."""
    rows = {(r["method"], r["mode"]): r for r in mfu.dry(tiny=False)}
    assert set(rows) == {
        ("transformer_xl", "train"), ("transformer_xl", "eval"), ("trams", "eval"),
        ("adaptive_span", "train"), ("adaptive_span", "eval"),
        ("compressive_transformer", "train"), ("compressive_transformer", "eval"),
        ("recurrence", "train"), ("recurrence", "eval"),
        ("recurrent_memory", "train"), ("recurrent_memory", "eval"),
    }  # fmt: skip
    xl = rows["transformer_xl", "train"]
    assert xl["params"] == 151_107_538  # Dai et al. 2019, Table 1: the base model's 151M
    # The adaptive softmax counted for the targets: far below every cluster for every token (the count
    # of a module that has scored no target yet).
    assert xl["forward_flops_per_token"] < 0.6 * xl["report_flops_per_token"]
    # Adaptive span: spans of 245 give the small enwik8 model's 42.4M multiply-accumulates (RESULTS.md,
    # "FLOPs per token against the paper"); the module also counts each block's re-projection of its
    # cache (trimmed to 256 states: 2·d²·256/512 per layer).
    span = rows["adaptive_span", "train"]
    reprojection = 12 * 2 * 512**2 * 256 / 512
    assert (span["forward_flops_per_token"] / 2 - reprojection) / 1e6 == pytest.approx(42.4, abs=0.05)
    assert span["params"] / 38.5e6 == pytest.approx(1, abs=0.01)  # RESULTS.md: 38.5M (the paper: 39M)
    # GPT-2 small at T = 300: Kaplan's count 1.754e8 (the paper's 1.75e8) plus the LM head.
    gpt2 = rows["recurrence", "train"]["forward_flops_per_token"] - 2 * 768 * 50_257
    assert gpt2 / 1.75e8 == pytest.approx(1, abs=0.005)
    # The Recurrent Memory Transformer runs GPT-2 small over 512 + 2·16 = 544 positions per 512 scored
    # tokens: Kaplan's 2N + 2·n_layer·n_ctx·d at n_ctx 544, times 544/512, plus the LM head.
    rmt = rows["recurrent_memory", "train"]["forward_flops_per_token"] - 2 * 768 * 50_257
    kaplan = 2 * 12 * 12 * 768**2 + 2 * 12 * 544 * 768
    assert rmt / (kaplan * 544 / 512) == pytest.approx(1, abs=0.005)
    # The Compressive Transformer's cache saves the keys and values of n_m + n_cm − n/c = 768 slots
    # per segment of 512: 2 projections d × d, 1.5 slots per token, 36 layers (the module's own count,
    # test_flops_are_what_an_evaluation_step_computes in
    # tests/methods/compressive_transformer/test_compressive_transformer.py).
    saved = rows["compressive_transformer", "train"]["forward_flops_per_token"]
    saved -= rows["compressive_transformer", "eval"]["forward_flops_per_token"]
    assert saved == 2 * 36 * 2 * 1024 * 1024 * 1.5
    compressive = rows["compressive_transformer", "eval"]  # a full softmax: the module's count is exact
    assert compressive["report_flops_per_token"] == compressive["forward_flops_per_token"]


def config_module(shapes, name: str, config: str, mode: str):
    """The bench's module for `mode` and the module its config builds (both on the meta device)."""
    bench = shapes.BENCHES[name]
    with torch.device("meta"):
        from_config = bench.module_class()(vocab_size=bench.paper.vocab, **xl_init_args(config))
    return bench.build(bench.paper, mode, "meta"), from_config


@pytest.mark.parametrize(
    ("name", "mode", "config", "same", "scaled"),
    [
        ("transformer_xl", "train", "transformer_xl_wt103.yaml", ("train_lengths",), {}),
        ("trams", "eval", "trams_wt103.yaml", ("eval_lengths", "trams"), {}),
        ("adaptive_span", "train", "adaptive_span.yaml", ("span_loss",), {}),
        ("compressive_transformer", "train", "compressive_transformer_pg19.yaml",
         ("train_lengths", "eval_lengths"), {"batch_size": 8}),
    ],
)  # fmt: skip
def test_paper_shapes_are_their_configs(shapes, name, mode, config, same, scaled):
    """The measured network, memories and batch are the config's (adaptive span: but for the spans,
    set to the paper's average; the Compressive Transformer: batch scaled to one GPU)."""
    lm, from_config = config_module(shapes, name, config, mode)
    expected = from_config.net.config
    if name == "adaptive_span":
        expected = replace(expected, span_init=lm.net.config.span_init)
    assert lm.net.config == expected
    for attribute in same:
        assert getattr(lm, attribute) == getattr(from_config, attribute)
    resolved = yaml.safe_load((RESOLVED / config).read_text())
    data = {key.removeprefix("data."): value for key, value in resolved.items() if key.startswith("data.")}
    step = getattr(shapes.BENCHES[name].paper, mode)
    length = data["tgt_len"] if mode == "train" else data["eval_tgt_len"]
    batch = data["batch_size"] if mode == "train" else data["eval_batch_size"]
    assert step.length == length
    if name != "trams":  # TRAMS's evaluation batch is 10 (one GPU is filled with 60 rows)
        assert step.batch == scaled.get("batch_size", batch)


def test_recurrent_gpt2_shape_is_its_config_but_for_the_weights_and_rows(shapes):
    """configs/recurrent_gpt2_wt103.yaml with GPT-2 small's sizes instead of the hub's weights."""
    bench = shapes.BENCHES["recurrence"]
    init_args = xl_init_args("recurrent_gpt2_wt103.yaml")
    lm = bench.build(bench.paper, "train", "meta")
    for knob in ("recurrence", "checkpoint_windows", "window_by_window", "checkpoint_blocks", "loss_chunk"):
        assert lm.hparams[knob] == init_args[knob], knob
    assert lm.hparams["window_recurrence"] == init_args["window_recurrence"]
    assert init_args["pretrained"] == "gpt2" and lm.lm.config.n_layer == 12 and lm.lm.config.n_embd == 768
    assert (bench.paper.train.length, bench.paper.train.windows) == (300, 20)


def test_recurrent_memory_shape_is_its_config_but_for_the_weights_and_rows(shapes):
    """configs/recurrent_memory_gpt2_wt103.yaml with GPT-2 small's sizes instead of the hub's weights."""
    bench = shapes.BENCHES["recurrent_memory"]
    init_args = xl_init_args("recurrent_memory_gpt2_wt103.yaml")
    lm = bench.build(bench.paper, "train", "meta")
    assert lm.hparams["checkpoint_blocks"] == init_args["checkpoint_blocks"]
    assert lm.memory_cell.num_mem_tokens == init_args["memory_cell"]["num_mem_tokens"]
    resolved = yaml.safe_load((RESOLVED / "recurrent_memory_gpt2_wt103.yaml").read_text())
    assert (bench.paper.train.length, bench.paper.train.windows) == (
        resolved["data.tgt_len"],
        resolved["data.windows_per_batch"],
    )


# ------------------------------------------------------------------ rows on the CPU


def tiny_args(profile: Path | None = None) -> argparse.Namespace:
    return argparse.Namespace(device=torch.device("cpu"), tiny=True, steps=1, profile=profile)


@pytest.mark.parametrize("job", ["transformer_xl/train/sdpa", "trams/eval/sdpa", "recurrence/train/eager"])
def test_a_row_measures_its_step_at_tiny_shape(mfu, shapes, job):
    """One row, in this process: tokens per step, a speed, no GPU peak on the CPU, and the FLOPs count
    of its (method, mode)."""
    method, mode, variant = job.split("/")
    bench = shapes.BENCHES[method]
    row = mfu.measure(mfu.Job(method, mode, variant, 1), tiny_args())
    step = bench.tiny.step(mode)
    assert row["tokens_per_step"] == step.batch * step.length * max(step.windows, 1)
    assert row["tokens_per_s"] > 0 and row["peak_gib"] is None and row["batch"] == step.batch
    assert row["note"] == ""
    if method == "recurrence":  # no correction: the module's own count
        lm = bench.build(bench.tiny, mode, "cpu")
        assert row["forward_flops_per_token"] == lm.flops_per_token(step.length)


def test_profile_writes_a_table_and_says_where_the_time_goes(mfu, tmp_path):
    row = mfu.measure(mfu.Job("transformer_xl", "train", "sdpa", 1), tiny_args(tmp_path))
    table = tmp_path / "transformer_xl_train_sdpa.txt"
    assert table.is_file() and "aten::" in table.read_text()
    lines = row["profile"]
    assert lines[0].startswith("per step: ") and "aten::nonzero" in lines[0]  # the adaptive softmax's
    assert any(line.startswith("forward by module (inclusive): ") for line in lines)
    assert lines[1].startswith("ops: ") and "aten::mm" in lines[1]


# ------------------------------------------------------------------ workers


def fake_worker(script: str):
    """A worker_command that runs `script` with the pending row ids as its arguments."""
    return lambda args, job_ids, deadline: [sys.executable, "-c", script, *job_ids]


def test_a_crashed_worker_loses_only_its_row(mfu, monkeypatch):
    """Each fake worker reports its first row and dies on the second: the dead row says why, and a new
    worker runs the rest."""
    script = (
        "import json, sys; print(json.dumps({'id': sys.argv[1], 'error': 'x'}), flush=True); "
        "sys.exit('RuntimeError: CUDA error: an illegal memory access')"
    )
    monkeypatch.setattr(mfu, "worker_command", fake_worker(script))
    jobs = [mfu.Job("transformer_xl", "train", v, 1) for v in ("sdpa", "eager", "compiled")]
    results = mfu.run_workers(jobs, argparse.Namespace(budget_s=math.inf), lambda line: None)
    assert results == {
        "transformer_xl/train/sdpa": {"error": "x"},
        "transformer_xl/train/eager": {
            "error": "worker died (exit 1): RuntimeError: CUDA error: an illegal memory access"
        },
        "transformer_xl/train/compiled": {"error": "x"},
    }


def test_past_the_budget_the_worker_is_killed_and_the_rest_marked(mfu, monkeypatch):
    monkeypatch.setattr(mfu, "worker_command", fake_worker("import time; time.sleep(60)"))
    monkeypatch.setattr(mfu, "GRACE_S", 0.2)
    jobs = [mfu.Job("transformer_xl", "train", v, 1) for v in ("sdpa", "eager")]
    results = mfu.run_workers(jobs, argparse.Namespace(budget_s=0.3), lambda line: None)
    assert results == {
        "transformer_xl/train/sdpa": {"error": "killed 0 s past the time budget"},
        "transformer_xl/train/eager": {"skipped": "time budget"},
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--device", "cpu", "--only", "transformer_xl/train/fast"],
            "no row transformer_xl/train/fast; rows are METHOD/MODE/VARIANT, e.g. transformer_xl/train/sdpa",
        ),
        (["--device", "cpu", "--steps", "0"], "--steps must be >= 1, got 0"),
        (["--variants", "fast"], "argument --variants: invalid choice: 'fast' (choose from "),
        ([], "--device cuda but torch sees no CUDA device; use --device cpu --tiny, or --dry"),
    ],
)  # fmt: skip
def test_bad_arguments_are_one_line(mfu, argv, message, monkeypatch):
    """Before any work (on a GPU machine too: CUDA is hidden here)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_:
        mfu.parse_args(argv)
    said = str(exit_.value)  # argparse words its own messages a little differently across Pythons
    assert said.startswith(f"error: {message}") and said.endswith(" (python benchmarks/mfu.py --help)")
    assert "\n" not in said


def test_sigterm_kills_the_worker_and_keeps_the_rows_so_far(mfu, monkeypatch):
    """`gpu.sh`'s time limit sends SIGTERM (`mfu.stop` raises `Stopped`): the measured rows stay, the
    running one says so, the rest are not run, and the worker does not outlive it."""
    script = (
        "import json, sys, time; print(json.dumps({'id': sys.argv[1], 'error': 'x'}), flush=True); "
        "time.sleep(60)"
    )
    monkeypatch.setattr(mfu, "worker_command", fake_worker(script))
    spawned = []
    popen = mfu.subprocess.Popen
    monkeypatch.setattr(
        mfu.subprocess, "Popen", lambda *a, **k: spawned.append(popen(*a, **k)) or spawned[-1]
    )

    def log(line: str) -> None:
        mfu.stop(15, None)

    jobs = [mfu.Job("transformer_xl", "train", v, 1) for v in ("sdpa", "eager", "compiled")]
    results = mfu.run_workers(jobs, argparse.Namespace(budget_s=math.inf), log)
    assert results == {
        "transformer_xl/train/sdpa": {"error": "x"},
        "transformer_xl/train/eager": {"error": "stopped by SIGTERM"},
        "transformer_xl/train/compiled": {"skipped": "time budget"},
    }
    assert len(spawned) == 1 and spawned[0].returncode is not None
