"""The recall sweep (slurm/sweeps/recall_tiny.txt, configs/recall/) runs what it claims to.

Every line names its run under recall_tiny/ and configs that exist, a checkpoint is read only after
the fit line that writes it, every method is fitted at three learning rates and three seeds; the
methods read the same text with the same budget of training tokens per step, at 2 layers of d 64,
and the first XL and RPE fit lines are the recipes with memory 128 and 0.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.environment import REPO
from tests.integration.test_compare import option, sweep_lines
from tests.test_configs import resolve_arguments

METHODS = (
    "xl", "rpe", "compressive", "adaptive_span", "fixed_span", "window_transformer", "gpt2_window",
    "recurrent_gpt2", "recurrent_memory", "recurrent_memory_xl",
)  # fmt: skip
TOKENS_PER_STEP = 128 * 32  # rows x tokens (the window methods: rows x windows x window)
LR = "--model.init_args.optimizer.init_args.lr"


def lines() -> list[list[str]]:
    return sweep_lines("recall_tiny.txt")


def configs(args: list[str]) -> list[str]:
    return [args[i + 1] for i, arg in enumerate(args) if arg == "--config"]


def test_every_line_names_its_run_and_reads_checkpoints_written_before():
    fitted: set[str] = set()
    for args in lines():
        run = option(args, "--run_name")
        assert run is not None and run.startswith("recall_tiny/"), args
        assert all((REPO / config).is_file() for config in configs(args)), args
        if (ckpt := option(args, "--ckpt_path")) is not None:
            writer = re.fullmatch(r"runs/(.+)/checkpoints/last\.ckpt", ckpt)
            assert writer and writer[1] in fitted, f"{ckpt} is read before a fit line writes it"
        if args[0] == "fit":
            fitted.add(run)


def test_every_method_has_three_learning_rates_and_three_seeds():
    rates, seeds = defaultdict(set), defaultdict(set)
    for args in lines():
        if args[0] != "fit":
            continue
        method = Path(configs(args)[0]).stem
        rates[method].add(option(args, LR))
        seeds[method].add(option(args, "--seed_everything"))
    assert set(rates) == set(METHODS)
    for method in METHODS:
        assert len(rates[method]) == 3 and len(seeds[method]) == 3, method


def resolve_line(args: list[str]) -> dict[str, Any]:
    """What the line's `fit` resolves to (its configs and flags, run name aside)."""
    return resolve_arguments([a for a in args[1:] if a != "--run_name" and not a.startswith("recall_tiny/")])


def first_fit(method: str) -> list[str]:
    return next(a for a in lines() if a[0] == "fit" and Path(configs(a)[0]).stem == method)


@pytest.mark.slow  # one parse per method (~2 s each)
@pytest.mark.parametrize("method", METHODS)
def test_methods_share_the_text_the_budget_and_the_size(method):
    config = resolve_line(first_fit(method))
    data, trainer, init = config["data"], config["trainer"], config["model"]["init_args"]
    text = (data["corpus"], data["tokenizer"], data["tgt_len"], data["eval_tgt_len"])
    assert text == ("text_files", "words", 32, 32)
    assert data["files"]["train"] == "runs/recall_tiny/data/mqar/train.txt"
    assert data["batch_size"] * data["windows_per_batch"] * data["tgt_len"] == TOKENS_PER_STEP
    if far := data.get("far_text_layout"):  # the layout far text trains in: the same tokens a step
        assert far["batch_size"] * far["windows_per_batch"] * data["tgt_len"] == TOKENS_PER_STEP
    assert trainer["max_steps"] == 8000 and config["recall_stop"]["min_acc"] == 0.99
    network = init.get("network") or init.get("xl_config") or init["gpt2_config"]
    width = network.get("d_model") or network.get("n_embd")
    layers = network.get("n_layers") or network.get("n_layer")
    assert (width, layers) == (64, 2)
    optimizer = init["optimizer"]
    assert optimizer["class_path"] == "torch.optim.AdamW" and optimizer["init_args"]["lr"] == 0.003


@pytest.mark.slow
def test_the_first_xl_and_rpe_lines_are_the_recipes_with_memory_128_and_0():
    for method, memory in (("xl", 128), ("rpe", 0)):
        init = resolve_line(first_fit(method))["model"]["init_args"]
        assert (init["mem_len"], init["evaluation"]["mem_len"]) == (memory, memory), method
