"""Every script in `benchmarks/` runs end to end at tiny sizes (slow tier).

The benchmarks are scripts, not timed tests; this only checks that each still runs against the
current code (a changed network signature once broke `benchmarks/trams.py` with no test noticing),
and that each prints the table it exists for.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import shared_dir, skip_without_shared

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"

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
    "compile.py": (
        ["--methods", "transformer_xl", "--batch", "2", "--block", "32", "--warmup", "2", "--steps", "2"],
        "transformer_xl",
    ),
}


def test_every_benchmark_script_is_covered():
    assert sorted(p.name for p in BENCHMARKS.glob("*.py")) == sorted([*TINY_RUNS, "tokenization.py"])


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(TINY_RUNS))
def test_benchmark_runs_at_tiny_size(script, tmp_path):
    run_script(script, *TINY_RUNS[script], tmp_path)


@pytest.mark.slow
@skip_without_shared("data", "gpt2")
def test_tokenization_benchmark_runs_on_one_megabyte(tmp_path):
    args = ["--shared", str(shared_dir() / "data"), "--mb", "1"]
    run_script("tokenization.py", args, "GPT-2 BPE (WikiText raw test)", tmp_path)


def run_script(script: str, args: list[str], expected: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert expected in done.stdout, done.stdout[-3000:]
