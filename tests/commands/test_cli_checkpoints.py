"""`--ckpt_path`: the config and the flags decide every setting, and a checkpoint that does not fit
the configured model is refused in one line.

One tiny Transformer-XL is trained through the CLI once for the module; the same checkpoint is then
validated plain, with TRAMS flags and with a `configs/trams_*.yaml`-style file, and each number is
compared with a direct evaluation of the same weights built with those settings.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from longctx.commands.cli import main
from longctx.data.datamodule import LMDataModule
from longctx.methods.transformer_xl.module import TransformerXLLM
from tests.helpers.lm_fixtures import cpu_trainer, run_cli_in
from tests.helpers.methods import config_init_args, tiny

pytestmark = pytest.mark.slow  # each CLI run builds the parser (seconds); training once for the module

# A wide initialisation makes attention sharp, so the memory (hence TRAMS) matters after 2 steps.
ARCH = {"n_layers": 2, "d_model": 16, "n_heads": 2, "d_inner": 32, "mem_len": 16, "dropout": 0.0}
INIT = {"init_std": 0.3, "proj_init_std": 0.3}
DATA = {"corpus": "sample", "batch_size": 4, "tgt_len": 16, "eval_batch_size": 2}
VAL_BATCHES = 6
TRAMS_FLAGS = {"trams_pool": 16, "trams_attended": 8, "trams_kept": 4}
# What a configs/trams_*.yaml file sets on top of the architecture: TRAMS's protocol and selection.
TRAMS_FILE = {
    "protocol": "trams",
    "eval_mem_len": 16,
    "trams_pool": 16,
    "trams_attended": 12,
    "trams_kept": 8,
}


def config(model_settings: dict) -> dict:
    return {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "max_steps": 2,
            "max_epochs": -1,
            "logger": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "limit_val_batches": VAL_BATCHES,
            "val_check_interval": 2,
            "check_val_every_n_epoch": None,
            "callbacks": [
                {
                    "class_path": "longctx.callbacks.RunCheckpoint",
                    "init_args": {"save_last": True},
                }
            ],
        },
        "model": {
            "class_path": "longctx.methods.transformer_xl.module.TransformerXLLM",
            "init_args": {
                **config_init_args(TransformerXLLM, {**ARCH, **INIT, **model_settings}),
                "optimizer": {"class_path": "torch.optim.Adam", "init_args": {"lr": 0.001}},
            },
        },
        "data": DATA,
    }


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A directory holding xl.yaml, trams.yaml and the trained XL checkpoint; the tests run in it."""
    root = tmp_path_factory.mktemp("ckpt")
    with pytest.MonkeyPatch.context() as mp:
        run_cli_in(root, mp)
        (root / "xl.yaml").write_text(yaml.safe_dump(config({})))
        (root / "trams.yaml").write_text(yaml.safe_dump(config(TRAMS_FILE)))
        main(cli_args("fit", "xl.yaml", "train"))
        assert (root / "runs/train/checkpoints/last.ckpt").is_file()
        yield root


def cli_args(command: str, config_file: str, run_name: str, *extra: str) -> list[str]:
    return [command, "--config", config_file, "--data.cache_dir", "cache", "--run_name", run_name, *extra]


def flags(settings: dict) -> list[str]:
    return [
        item
        for key, value in settings.items()
        for item in (f"--model.init_args.{TransformerXLLM.knob_path(key)}", str(value))
    ]


def direct_val_loss(root: Path, **settings) -> float:
    """The same weights in a model built with `settings`, validated with a plain Trainer."""
    model = TransformerXLLM(vocab_size=256, **config_init_args(TransformerXLLM, {**ARCH, **settings}))
    state = torch.load(root / "runs/train/checkpoints/last.ckpt", weights_only=True)["state_dict"]
    model.load_state_dict(state)
    data = LMDataModule(**DATA, cache_dir=str(root / "cache"))
    trainer = cpu_trainer(root, limit_val_batches=VAL_BATCHES)
    return trainer.validate(model, datamodule=data, verbose=False)[0]["val/loss"]


def test_validate_evaluates_the_configured_settings_not_the_checkpoints(work, monkeypatch):
    monkeypatch.chdir(work)
    ckpt = ["--ckpt_path", "runs/train/checkpoints/last.ckpt"]
    runs = {
        "plain": (main(cli_args("validate", "xl.yaml", "plain", *ckpt)), {}),
        "flags": (main(cli_args("validate", "xl.yaml", "flags", *ckpt, *flags(TRAMS_FLAGS))), TRAMS_FLAGS),
        "file": (main(cli_args("validate", "trams.yaml", "file", *ckpt)), TRAMS_FILE),
    }
    losses = {name: float(cli.trainer.callback_metrics["val/loss"]) for name, (cli, _) in runs.items()}
    for name, (_, settings) in runs.items():
        assert losses[name] == pytest.approx(direct_val_loss(work, **settings), rel=1e-6), name
        saved = yaml.safe_load((work / "runs" / name / "config.yaml").read_text())["model"]["init_args"]
        flat = TransformerXLLM.flatten_knobs(saved)  # the groups' fields under their flat names
        assert {key: flat[key] for key in settings} == settings, name  # config.yaml is what ran
    # TRAMS attends other memory slots, and its protocol scores other targets: other numbers.
    values = sorted(losses.values())
    assert values[1] - values[0] > 1e-3 and values[2] - values[1] > 1e-3, losses


def test_checkpoint_of_another_method_is_refused_in_one_line(work, monkeypatch):
    monkeypatch.chdir(work)
    other = tiny("adaptive_span", vocab_size=256)
    hparams = {"_class_path": "longctx.methods.adaptive_span.module.AdaptiveSpanLM", **other.hparams}
    torch.save({"state_dict": other.state_dict(), "hyper_parameters": hparams}, "span.ckpt")
    with pytest.raises(SystemExit) as exit_info:
        main(cli_args("validate", "xl.yaml", "other", "--ckpt_path", "span.ckpt"))
    message = str(exit_info.value.code)
    assert message.startswith(
        "error: checkpoint span.ckpt does not fit the configured model "
        "longctx.methods.transformer_xl.module.TransformerXLLM: it holds a "
        "longctx.methods.adaptive_span.module.AdaptiveSpanLM, "
    ), message
    assert "weights missing" in message and "unexpected weights" in message and "\n" not in message


def test_checkpoint_of_other_sizes_is_refused_naming_the_shapes(work, monkeypatch):
    monkeypatch.chdir(work)
    with pytest.raises(SystemExit) as exit_info:
        main(
            cli_args(
                "test", "xl.yaml", "sizes", "--ckpt_path", "runs/train/checkpoints/last.ckpt",
                "--model.init_args.network.d_inner", "24",
            )
        )  # fmt: skip
    message = str(exit_info.value.code)
    assert "does not fit the configured model" in message
    assert "6 shapes differ, checkpoint vs model (net.layers.0.ff.fc1.bias: (32,) vs (24,);" in message
