"""Every script in `benchmarks/` runs end to end at tiny sizes (slow tier).

The benchmarks are scripts, not timed tests; this only checks that each still runs against the
current code (a changed network signature once broke `benchmarks/trams.py` with no test noticing),
and that each prints the table it exists for.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.environment import REPO, shared_dir, skip_without_shared

BENCHMARKS = REPO / "benchmarks"

TINY_RUNS = {
    "attention.py": (
        [
            *("--vocab", "64", "--n_layers", "2", "--d_model", "32", "--n_heads", "2", "--d_inner", "64"),
            *("--batch", "2", "--tgt_len", "16", "--mem_len", "16", "--pool", "32", "--attended", "16"),
            *("--kept", "8", "--attn_span", "64", "--warmup", "2", "--rounds", "1"),
        ],
        "| adaptive_span | eval |",
    ),
    "compressive.py": (
        [
            "--n_layers",
            "1",
            "--d_model",
            "16",
            "--n_heads",
            "2",
            "--d_inner",
            "32",
            "--vocab",
            "64",
            "--segment",
            "8",
            "--mem_len",
            "8",
            "--cmem_len",
            "4",
            "--rate",
            "2",
            "--batch",
            "2",
            "--steps",
            "1",
            "--repeats",
            "1",
        ],
        "n_m 8 + n_cm 4 (c 2): attends 12, reaches 16",
    ),
    "trams.py": (
        [
            "--shape",
            "tiny",
            "--vocab",
            "64",
            "--batch",
            "2",
            "--tgt_len",
            "16",
            "--pool",
            "32",
            "--attended",
            "16",
            "--kept",
            "8",
            "--segments",
            "4",
            "--warmup",
            "1",
            "--repeats",
            "1",
        ],
        "max |trams(_cached) - trams_released|",
    ),
    "adaptive_span.py": (
        [
            "--spans",
            "128",
            "--d_model",
            "32",
            "--n_layers",
            "2",
            "--n_heads",
            "2",
            "--d_inner",
            "64",
            "--batch",
            "2",
            "--block",
            "64",
            "--chunk_size",
            "32",
            "--warmup",
            "1",
            "--steps",
            "1",
            "--no_memory",
        ],
        "adaptive-mixed",
    ),
    "recurrence.py": (
        [
            "--n_layer",
            "3",
            "--n_embd",
            "32",
            "--n_head",
            "2",
            "--vocab",
            "64",
            "--window",
            "16",
            "--windows",
            "1",
            "2",
            "--modes",
            "none",
            "window",
            "--steps",
            "1",
        ],
        "window",
    ),
    "recurrent_memory.py": (
        [
            *("--n_layer", "3", "--n_embd", "32", "--n_head", "2", "--vocab", "64", "--window", "16"),
            *("--windows", "2", "--mem_tokens", "2", "--steps", "1"),
        ],
        "rmt m=2",
    ),
    "compile.py": (
        ["--methods", "transformer_xl", "--batch", "2", "--block", "32", "--warmup", "2", "--steps", "2"],
        "transformer_xl",
    ),
    "mfu.py": (  # the workers, the table and a goal's ratio (tests/benchmarks/test_mfu.py: the rest)
        ["--device", "cpu", "--tiny", "--methods", "transformer_xl", "--variants", "sdpa", "eager-uncached"],
        # a ratio, whatever its value (timing-dependent: 1.x or 2.x on a loaded CPU), not "not measured"
        re.compile(
            r"goal: XL at m = 200, evaluation with the key/value cache ≥ 3× eager without it: "
            r"sdpa \d+\.\d+×"
        ),
    ),
}


def test_every_benchmark_script_is_covered():
    # tokenization.py, gpu_report.py: tests below; mfu_shapes.py (mfu.py's table):
    # tests/benchmarks/test_mfu.py
    covered = [*TINY_RUNS, "tokenization.py", "gpu_report.py", "mfu_shapes.py"]
    assert sorted(p.name for p in BENCHMARKS.glob("*.py")) == sorted(covered)


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(TINY_RUNS))
def test_benchmark_runs_at_tiny_size(script, tmp_path):
    run_script(script, *TINY_RUNS[script], tmp_path)


@pytest.mark.slow
@skip_without_shared("data", "gpt2")
def test_tokenization_benchmark_runs_on_one_megabyte(tmp_path):
    args = ["--shared", str(shared_dir() / "data"), "--mb", "1"]
    run_script("tokenization.py", args, "GPT-2 BPE (WikiText raw test)", tmp_path)


def run_script(script: str, args: list[str], expected: str | re.Pattern, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    done = subprocess.run(  # -X faulthandler: a crash in torch's native code prints where it was
        [sys.executable, "-X", "faulthandler", str(BENCHMARKS / script), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = expected.search(done.stdout) if isinstance(expected, re.Pattern) else expected in done.stdout
    assert found, done.stdout[-3000:]


# ------------------------------------------------------------------ bash benchmarks/gpu.sh


def gpu_sh(*parts: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(BENCHMARKS / "gpu.sh"), *parts],
        env={**os.environ, "PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow  # ~2-5 s: torch's import
@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here: gpu.sh would run everything")
def test_gpu_sh_without_cuda_says_one_line_and_exits_0():
    done = gpu_sh(CUDA_VISIBLE_DEVICES="")
    assert (done.returncode, done.stdout, done.stderr) == (0, "no CUDA device: nothing to run\n", "")


@pytest.mark.slow  # ~2-5 s: torch's import
@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here: gpu.sh would run everything")
def test_gpu_sh_names_a_cpu_torch_on_a_gpu_machine(tmp_path):
    """nvidia-smi lists a GPU that torch cannot use (its CPU build): the one line says what to install."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3'\n")
    fake.chmod(0o755)
    done = gpu_sh(CUDA_VISIBLE_DEVICES="", PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == (
        "no CUDA device: nothing to run (nvidia-smi lists a GPU, but this torch cannot use it: "
        "install torch's CUDA build)\n"
    )


def test_gpu_sh_with_a_python_that_fails_says_so_and_fails():
    """An interpreter that cannot import torch must not pass for "no CUDA device"."""
    done = gpu_sh(PYTHON="false")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (
        "error: could not ask torch for a CUDA device (false exited 1); activate the project's environment\n"
    )


def test_gpu_sh_refuses_an_unknown_part_naming_the_parts():
    """Checked before torch is asked for a device: a typo never costs GPU time."""
    done = gpu_sh("tests", "benchmark", PYTHON="false")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "error: no part 'benchmark'; the parts are: "
        "tests mfu profile attention compile recurrence compressive\n"
    )


def load_gpu_report():
    spec = importlib.util.spec_from_file_location("gpu_report", BENCHMARKS / "gpu_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_report_appends_one_section_per_run_with_device_and_date(tmp_path):
    report = load_gpu_report()
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\nearlier numbers\n")
    tests, bench = tmp_path / "1-tests.log", tmp_path / "2-attention.log"
    tests.write_text(
        "$ python -m pytest -q -m gpu\n" + "".join(f"line {i}\n" for i in range(200)) + "[exit 0]\n"
    )
    bench.write_text("$ python benchmarks/attention.py --device cuda\n| xl | train |\n[exit 0 after 9 s]\n")
    before = dt.datetime.now(dt.timezone.utc).replace(second=0, microsecond=0)
    report.append(results, "NVIDIA H100 80GB HBM3, 79 GiB", [tests, bench])
    report.append(results, "NVIDIA H100 80GB HBM3, 79 GiB", [bench])
    text = results.read_text()
    assert text.startswith(
        "# Benchmark results\n\nearlier numbers\n\n## GPU run: NVIDIA H100 80GB HBM3, 79 GiB, "
    )
    assert text.count("## GPU run: NVIDIA H100") == 2
    date = text.split("79 GiB, ", 1)[1].split(" UTC", 1)[0]
    stamp = dt.datetime.strptime(date, "%Y-%m-%d %H:%M").replace(tzinfo=dt.timezone.utc)
    assert 0 <= (stamp - before).total_seconds() <= 120
    assert (
        "### `python -m pytest -q -m gpu`" in text
        and "### `python benchmarks/attention.py --device cuda`" in text
    )
    assert "line 121\n" in text and "line 120\n" not in text  # the last 80 lines of a long log
    assert text.count("| xl | train |\n[exit 0 after 9 s]\n```") == 2
    assert sorted(tmp_path.iterdir()) == sorted([results, tests, bench])  # no temporary file left


def test_gpu_report_refuses_a_missing_log_in_one_line(tmp_path, monkeypatch, capsys):
    results, missing = tmp_path / "RESULTS.md", tmp_path / "nope.log"
    argv = ["gpu_report.py", "append", "--results", str(results), "--device", "x", str(missing)]
    monkeypatch.setattr(sys, "argv", argv)
    assert load_gpu_report().main() == 2
    assert capsys.readouterr().err == f"error: no such log: {missing}\n"
    assert not results.exists()


def load_attention_benchmark(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("attention_benchmark", BENCHMARKS / "attention.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.parametrize("train", [False, True])
def test_attention_benchmark_counts_a_steps_matrix_products_with_eager_attention(train, monkeypatch):
    """The "% of peak" numerator: y = x Wᵀ with x (2, 4), W (3, 4) is 2·2·4·3 = 48 FLOPs forward; its
    backward adds dW = dyᵀ x, 48 more (x needs no gradient). The step runs with eager attention."""
    bench = load_attention_benchmark(monkeypatch)
    layer = torch.nn.Linear(4, 3, bias=False)
    layer.attention = "sdpa"  # as the networks' attention modules carry their kernel
    x = torch.randn(2, 4)
    kernels = []

    def step() -> None:
        kernels.append(layer.attention)
        with torch.set_grad_enabled(train):
            out = layer(x)
            if train:
                out.sum().backward()

    assert bench.step_flops(layer, step) == (96 if train else 48)
    assert kernels == ["eager"]


def test_attention_benchmark_matmul_peak_is_the_fastest_products_flop_rate(monkeypatch):
    bench = load_attention_benchmark(monkeypatch)
    clock = iter([0.0, 0.5, 1.0, 1.25, 2.0, 3.0])  # products of 0.5 s, 0.25 s and 1 s
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(clock))
    assert bench.matmul_peak(torch.device("cpu"), n=8, repeats=3) == 2 * 8**3 / 0.25


@pytest.mark.parametrize(
    ("method", "train"), [("xl", True), ("xl", False), ("trams", False), ("adaptive_span", True)]
)
def test_attention_benchmark_steps_stay_on_the_requested_device(method, train, monkeypatch):
    """`attention.py --device cuda` checked without a GPU: on the meta device every tensor of its
    steps (inputs, memories, caches) must be created there, none on the CPU."""
    from tests.methods.test_meta_device import META, NoHostTensors

    bench = load_attention_benchmark(monkeypatch)
    sizes = dict(vocab=50, n_layers=2, d_model=16, n_heads=2, d_inner=32, batch=2, tgt_len=8)
    args = argparse.Namespace(**sizes, mem_len=8, pool=16, attended=8, kept=4, attn_span=32, device=META)
    model, step = (
        bench.span_step(args, train)
        if method == "adaptive_span"
        else bench.xl_step(args, method == "trams", train)
    )
    with NoHostTensors():
        for _ in range(3):  # the memory fills
            step()
    assert all(p.device == META for p in model.parameters())
    assert not train or all(p.grad is None or p.grad.device == META for p in model.parameters())
