"""The head-to-head sweeps (slurm/sweeps/compare_*.txt, configs/compare/) compare what they claim to.

compare_tiny: every method reads the same text (same corpus, same split sources, the same fraction of
the same number of test rows), trains on the same number of bytes (byte-level: steps x rows x L; GPT-2:
pretraining + fine-tuning tokens x bytes per BPE token of the training text), with non-embedding
parameter counts within 10% of each other (the recurrence's and f_c's own weights on top); every line
names its run under compare_tiny/ (compare_paper/), and a line that reads a checkpoint comes after the
fit line that writes it.
"""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from longctx.methods import registry
from tests.helpers.environment import REPO, shared_dir, skip_without_shared
from tests.test_configs import resolve

COMPARE = REPO / "configs" / "compare"
SWEEPS = REPO / "slurm" / "sweeps"

BUDGET_BYTES = 196_608  # training bytes per method (configs/compare/tiny_bytes.yaml)
TRAIN_BYTES, TRAIN_BPE_TOKENS = 1_142_309, 249_735  # WikiText-103 valid as text: bytes, GPT-2 BPE tokens


def sweep_lines(name: str) -> list[list[str]]:
    lines = [shlex.split(line, comments=True) for line in (SWEEPS / name).read_text().splitlines()]
    return [args for args in lines if args]


def option(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def run_name(args: list[str], prefix: str) -> str:
    return option(args, "--run_name").removeprefix(f"{prefix}/")


def read_run(ckpt: str) -> str:
    """The run whose checkpoint a `runs/<run>/checkpoints/last.ckpt` path reads."""
    writer = re.fullmatch(r"runs/(.+)/checkpoints/last\.ckpt", ckpt)
    assert writer, f"{ckpt}: not runs/<run>/checkpoints/last.ckpt"
    return writer[1]


def evaluated_only(sweep: str) -> dict[str, str]:
    """The test lines that evaluate another run's checkpoint under a name of their own (TRAMS and the
    oracle on Transformer-XL's): name -> the name of the run that trained it."""
    prefix = sweep.removesuffix(".txt")
    return {
        name: read_run(ckpt).removeprefix(f"{prefix}/")
        for args in sweep_lines(sweep)
        if args[0] == "test" and (ckpt := option(args, "--ckpt_path")) is not None
        and read_run(ckpt) != f"{prefix}/{(name := run_name(args, prefix))}"
    }  # fmt: skip


def fit_configs(sweep: str) -> dict[str, Path]:
    """name -> config of every fit line."""
    prefix = sweep.removesuffix(".txt")
    return {
        run_name(args, prefix): REPO / option(args, "--config")
        for args in sweep_lines(sweep)
        if args[0] == "fit"
    }


@pytest.mark.parametrize("sweep", ["compare_tiny.txt", "compare_paper.txt"])
def test_every_method_is_fit_then_tested_under_its_own_run_name(sweep):
    prefix = sweep.removesuffix(".txt")
    fitted: set[str] = set()  # runs, with the prefix
    tested: set[str] = set()  # names
    read_by_configs: set[str] = set()  # names of the runs whose checkpoint a config reads
    for args in sweep_lines(sweep):
        run = option(args, "--run_name")
        assert run is not None and run.startswith(f"{prefix}/"), f"{args}: no --run_name {prefix}/<name>"
        config = option(args, "--config")
        assert config is not None and (REPO / config).is_file(), f"{args}: missing config {config}"
        if (ckpt := option(args, "--ckpt_path")) is not None:
            assert read_run(ckpt) in fitted, f"{ckpt} is read before a fit line writes it"
        text = (REPO / config).read_text()
        for pretrained in re.findall(r"runs/(\S+)/checkpoints/last\.ckpt", text):
            assert pretrained in fitted, f"{config} reads {pretrained} before a fit line writes it"
            read_by_configs.add(pretrained.removeprefix(f"{prefix}/"))
        (fitted if args[0] == "fit" else tested).add(
            run if args[0] == "fit" else run.removeprefix(f"{prefix}/")
        )
    fitted_names = {run.removeprefix(f"{prefix}/") for run in fitted}
    # Every fit is tested under its own name but a pretraining the others fine-tune (the tiny sweep
    # pretrains its own small GPT-2; the paper sweep fine-tunes GPT-2 small from the hub); the other
    # test lines evaluate a fit's checkpoint under a name of their own (TRAMS, the oracle).
    pretraining = fitted_names - tested
    assert pretraining == ({"gpt2_pretrain"} if prefix == "compare_tiny" else set())
    assert pretraining <= read_by_configs
    assert tested == (fitted_names - pretraining) | set(evaluated_only(sweep))
    assert set(evaluated_only(sweep)) == {"trams", "oracle"}


def model_class_path(config: Path) -> str | None:
    """The config's `model.class_path`, from the file or the base it names (`config:`), without the
    CLI parser (`resolve` takes seconds per config)."""
    text = yaml.safe_load(config.read_text()) or {}
    model = text.get("model") or {}
    found = text.get("model.class_path") or (model.get("class_path") if isinstance(model, dict) else None)
    bases = text.get("config") or []
    for base in [bases] if isinstance(bases, str) else bases:
        found = found or model_class_path(config.parent / base)
    return found


@pytest.mark.parametrize("sweep", ["compare_tiny.txt", "compare_paper.txt"])
def test_every_registered_method_is_in_the_head_to_head(sweep):
    classes = {model_class_path(config) for config in fit_configs(sweep).values()}
    assert {method.module for method in registry.METHODS.values()} <= classes


def test_tiny_sweep_checkpoints_match_their_configs():
    """TRAMS and the oracle differ from the config that trained their checkpoint (Transformer-XL's)
    only in evaluation knobs."""
    evaluated = evaluated_only("compare_tiny.txt")
    trained_configs = {by: resolve(COMPARE / f"tiny_{by}.yaml") for by in set(evaluated.values())}
    for name, trained_by in evaluated.items():
        trained = trained_configs[trained_by]
        other = resolve(COMPARE / f"tiny_{name}.yaml")
        changed = {k for k, v in other["model"]["init_args"].items() if trained["model"]["init_args"][k] != v}
        assert changed <= {"evaluation", "trams"}
        assert other["data"] == trained["data"]


def non_embedding_parameters(config: dict) -> int:
    """Parameters outside embedding tables (a tied output layer is the embedding)."""
    module_path, _, class_name = config["model"]["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module_path), class_name)
    kwargs = {k: v for k, v in config["model"]["init_args"].items() if k not in ("optimizer", "lr_scheduler")}
    if kwargs.get("pretrained"):  # the fine-tuned GPT-2s have the pretraining run's network
        pretrain = resolve(COMPARE / "tiny_gpt2_pretrain.yaml")
        kwargs.update(pretrained=None, gpt2_config=pretrain["model"]["init_args"]["gpt2_config"])
    vocab = 256 if config["data"]["tokenizer"] == "bytes" else 50_257
    model = cls(**{**kwargs, "vocab_size": vocab})
    embedding = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    skipped = embedding | {id(p) for p in compression_parameters(model)}
    return sum(p.numel() for p in model.parameters() if id(p) not in skipped and p.shape[0] != vocab)


def compression_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The Compressive Transformer's f_c weights: on top of the matched network, as the recurrence's."""
    net = getattr(model, "net", None)
    return net.compression_parameters() if hasattr(net, "compression_parameters") else []


@pytest.mark.slow
def test_tiny_runs_read_the_same_text_with_the_same_budget_and_size():
    configs = {name: resolve(path) for name, path in fit_configs("compare_tiny.txt").items()}
    byte_methods = {name for name, config in configs.items() if config["data"]["tokenizer"] == "bytes"}
    gpt2_finetuned = [
        name for name, config in configs.items() if config["model"]["init_args"].get("pretrained")
    ]
    assert {"gpt2_window", "recurrent_gpt2", "recurrent_memory"} <= set(gpt2_finetuned)
    for name, config in configs.items():
        data, trainer = config["data"], config["trainer"]
        assert data["corpus"] == "wikitext103_text", name
        assert data["split_sources"] == {"train": "valid", "valid": "test", "test": "test"}, name
        # The same fraction of the same number of equal test rows: the same text, up to BPE boundaries.
        assert (data["eval_batch_size"], trainer["limit_test_batches"]) == (16, 0.125), name
        if name in byte_methods:
            assert data["tokenizer"] == "bytes"
            assert trainer["max_steps"] * data["batch_size"] * data["tgt_len"] == BUDGET_BYTES, name
    bpe_tokens = {
        name: configs[name]["trainer"]["max_steps"]
        * configs[name]["data"]["batch_size"]
        * configs[name]["data"]["windows_per_batch"]
        * configs[name]["data"]["tgt_len"]
        for name in ("gpt2_pretrain", *gpt2_finetuned)
    }
    for name in gpt2_finetuned:
        seen_bytes = (bpe_tokens["gpt2_pretrain"] + bpe_tokens[name]) * TRAIN_BYTES / TRAIN_BPE_TOKENS
        assert seen_bytes == pytest.approx(BUDGET_BYTES, rel=0.01), name
    sizes = {name: non_embedding_parameters(config) for name, config in configs.items()}
    # The recurrence's pooling and FFN come on top of the shared GPT-2 (~17% here, as in the paper);
    # every other network is within 10% of the smallest.
    recurrent = sizes.pop("recurrent_gpt2")
    assert max(sizes.values()) <= 1.10 * min(sizes.values()), sizes
    assert sizes["compressive_transformer"] == sizes["transformer_xl"]  # XL's network, f_c on top
    ct = resolve(COMPARE / "tiny_compressive_transformer.yaml")["model"]["init_args"]
    net = ct["network"]
    d, c = net["d_model"], net["compression_rate"]
    assert ct["mem_len"] + ct["cmem_len"] == configs["transformer_xl"]["model"]["init_args"]["mem_len"]
    assert net["compression"] == "conv" and net["n_layers"] * (d * d * c + d) < 0.2 * sizes["transformer_xl"]
    assert sizes["gpt2_window"] < recurrent <= 1.2 * sizes["gpt2_window"]
    rmt = configs["recurrent_memory"]["model"]["init_args"]["memory_cell"]["num_mem_tokens"]
    assert sizes["recurrent_memory"] - sizes["gpt2_window"] == rmt * 128  # its initial memory, m x d


@pytest.mark.slow
@skip_without_shared("data", "wikitext-103", "wiki.valid.tokens.gz")
def test_training_text_has_the_bytes_and_bpe_tokens_the_budget_assumes(tmp_path):
    from longctx.data.datamodule import LMDataModule

    counts = {}
    for tokenizer in ("bytes", str(shared_dir() / "data" / "gpt2")):
        data = LMDataModule(
            corpus="wikitext103_text", root=str(shared_dir() / "data"), cache_dir=str(tmp_path),
            download=False, tokenizer=tokenizer, split_sources={"train": "valid"},
        )  # fmt: skip
        data.prepare_data()
        data.setup()
        tokens = torch.from_numpy(data.corpus.split("train").tokens.astype("int64"))
        counts[tokenizer] = (len(tokens), int(data.token_bytes[tokens].sum()))
    assert counts["bytes"] == (TRAIN_BYTES, TRAIN_BYTES)
    assert counts[str(shared_dir() / "data" / "gpt2")] == (TRAIN_BPE_TOKENS, TRAIN_BYTES)


def test_recurrent_gpt2_takes_the_gpt2_of_a_lightning_checkpoint_as_pretrained(tmp_path):
    """A sweep line can pretrain a GPT-2 and the next add recurrence to its checkpoint."""
    from longctx.methods.recurrence.module import RecurrentGPT2LM

    torch.manual_seed(0)
    small = {"n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 16}
    window = RecurrentGPT2LM(vocab_size=64, gpt2_config=small, recurrence=False)
    checkpoint = {"state_dict": window.state_dict()}
    window.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, tmp_path / "last.ckpt")
    recurrent = RecurrentGPT2LM(
        vocab_size=64,
        pretrained=str(tmp_path / "last.ckpt"),
        recurrence=True,
        window_recurrence={"insert_layer": 1},
    )
    assert recurrent.lm.training  # fine-tuned with dropout on
    x = torch.randint(0, 64, (2, 16))
    assert torch.equal(recurrent.lm.eval()(x).logits, window.lm.eval()(x).logits)
    assert recurrent.recurrence is not None
