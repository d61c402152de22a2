"""More bad input, each answered with one line (`error: ...`, exit status 1; 130 for Ctrl-C), no
traceback, no usage: sizes of zero, trainer settings Lightning divides by, config files that hold no
mapping, configs of two methods composed, a sweep file that is not text, a report folder that is a
file, a resumed stream of another layout, a full disk before the first file. docs/bad_inputs.md lists
every line tested here.
"""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from jsonargparse import Namespace

from longctx.commands import report
from longctx.commands.cli import ConfigError, check_trainer_settings, main, parser_only
from longctx.commands.report import main as report_main
from longctx.commands.sweep import main as sweep_main
from longctx.methods.adaptive_span.network import SpanTransformer
from longctx.methods.compressive_transformer.network import CompressiveTransformer
from longctx.methods.recurrence.hf import build_lm
from longctx.methods.recurrence.overlaps import check_overlaps
from longctx.methods.transformer_xl.network import TransformerXL
from longctx.methods.window_transformer.network import WindowTransformer
from longctx.runtime.errors import DEBUG_ENV, BadInput, NotText, ParseError
from tests.helpers.environment import REPO
from tests.helpers.lm_fixtures import CarryLM

SIZES = {"n_layers": 2, "d_model": 16, "n_heads": 2, "d_inner": 32}
NETWORKS = {
    "adaptive span": (SpanTransformer.Config, {**SIZES, "attn_span": 16, "chunk_size": 8}),
    "Transformer-XL": (TransformerXL.Config, SIZES),
    "Compressive Transformer": (CompressiveTransformer.Config, SIZES),
    "window transformer": (WindowTransformer.Config, {**SIZES, "max_len": 16}),
}


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch, tmp_path):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    monkeypatch.chdir(tmp_path)


# ---------------------------------------------------------------------------------- network sizes
@pytest.mark.parametrize("method", NETWORKS)
@pytest.mark.parametrize("field", ["n_layers", "d_model", "n_heads", "d_inner"])
@pytest.mark.parametrize("value", [0, -2])
def test_a_zero_or_negative_size_is_refused_when_the_config_is_made(method, field, value):
    """Was a ZeroDivisionError (d_model 0, n_heads 0) or a tensor of negative shape at build time."""
    config, sizes = NETWORKS[method]
    with pytest.raises(ValueError, match=rf"^{field} must be at least 1, got {value}$"):
        config(**{**sizes, field: value})


@pytest.mark.parametrize("method", ["Transformer-XL", "Compressive Transformer"])
def test_xl_sizes_a_head_must_have_a_dimension(method):
    config, sizes = NETWORKS[method]
    for field in ("d_head", "d_embed", "div_val"):
        with pytest.raises(ValueError, match=rf"^{field} must be at least 1, got 0$"):
            config(**{**sizes, field: 0})
    with pytest.raises(ValueError, match=r"^n_heads \(32\) exceeds d_model \(16\): each head gets"):
        config(**{**sizes, "n_heads": 32})
    assert config(**{**sizes, "n_heads": 32, "d_head": 4}).head_dim == 4  # the code's d_head decouples it
    with pytest.raises(ValueError, match=r"^dropatt must be in \[0, 1\), got 1.5$"):
        config(**{**sizes, "dropatt": 1.5})
    with pytest.raises(ValueError, match=r"init_std \(-1\) and proj_init_std \(0.01\) must be >= 0"):
        config(**{**sizes, "init_std": -1})


def test_adaptive_span_heads_must_divide_the_width():
    config, sizes = NETWORKS["adaptive span"]
    with pytest.raises(ValueError, match=r"^d_model \(16\) must be divisible by n_heads \(3\)$"):
        config(**{**sizes, "n_heads": 3})
    with pytest.raises(ValueError, match=r"^emb_dropout must be in \[0, 1\), got -0.1$"):
        config(**{**sizes, "emb_dropout": -0.1})


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"n_embd": 0}, r"^gpt2_config.n_embd must be at least 1, got 0$"),
        ({"n_head": 0}, r"^gpt2_config.n_head must be at least 1, got 0$"),
        ({"n_layer": -1}, r"^gpt2_config.n_layer must be at least 1, got -1$"),
        ({"n_positions": 0}, r"^gpt2_config.n_positions must be at least 1, got 0$"),
        ({"n_embd": 130}, r"^gpt2_config.n_embd \(130\) must be divisible by gpt2_config.n_head \(4\)$"),
    ],
)
def test_a_gpt2_size_its_modules_cannot_take_is_refused(fields, message):
    """The windowed and recurrent GPT-2 (`gpt2_config`): was a ZeroDivisionError inside transformers."""
    base = {"n_layer": 2, "n_embd": 16, "n_head": 4, "n_positions": 32}
    with pytest.raises(ValueError, match=message):
        build_lm(None, {**base, **fields}, vocab_size=64)


def test_a_zero_size_on_the_command_line_is_one_line(capsys):
    args = ["fit", "--config", str(REPO / "configs" / "transformer_xl_tiny.yaml")]
    args += ["--model.init_args.network.n_heads", "0", "--data.corpus", "sample"]
    with pytest.raises(SystemExit) as info:
        main([*args, "--data.split_sources", "null", "--trainer.logger", "false"])
    assert info.value.code == (
        "error: model.init_args.network: TransformerXLConfig: n_heads must be at least 1, got 0"
    )
    assert "Traceback" not in capsys.readouterr().err


# ---------------------------------------------------------------------------------- trainer settings
@pytest.mark.parametrize(
    "setting, value, expected",
    [
        ("val_check_interval", 0, "trainer.val_check_interval 0: give the training steps between two"),
        ("check_val_every_n_epoch", 0, "trainer.check_val_every_n_epoch 0: give the epochs between two"),
        ("accumulate_grad_batches", 0, "trainer.accumulate_grad_batches 0: give the batches whose"),
        ("gradient_clip_val", -1.0, "trainer.gradient_clip_val -1.0: give the clipping threshold (> 0),"),
    ],
)
def test_a_trainer_count_lightning_divides_by_is_refused(setting, value, expected):
    """Lightning takes these and fails at the first step (ZeroDivisionError) or, for a negative
    clipping threshold, clips nothing."""
    trainer = Namespace(val_check_interval=200, check_val_every_n_epoch=None, accumulate_grad_batches=1)
    trainer[setting] = value
    with pytest.raises(ConfigError, match=f"^{re.escape(expected)}"):
        check_trainer_settings(trainer)
    trainer[setting] = 0.5 if setting == "val_check_interval" else None  # a fraction of an epoch; null
    check_trainer_settings(trainer)


def test_a_trainer_setting_lightning_refuses_is_one_line(capsys):
    """Lightning's MisconfigurationException, as its one line (was a traceback)."""
    args = ["fit", "--config", str(REPO / "configs" / "transformer_xl_tiny.yaml"), "--data.corpus", "sample"]
    with pytest.raises(SystemExit) as info:
        main([*args, "--data.split_sources", "null", "--trainer.limit_val_batches", "-1"])
    assert info.value.code == (
        "error: You have passed invalid value -1 for limit_val_batches, it has to be in [0.0, 1.0] or an int."
    )
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("callback", ["ModelCheckpoint", "lightning.pytorch.callbacks.ModelCheckpoint"])
def test_lightnings_model_checkpoint_with_save_last_is_refused(capsys, callback):
    """Its last.ckpt falls behind once val/loss stops improving (`longctx.callbacks.checkpoint`)."""
    args = ["fit", "--config", str(REPO / "configs" / "transformer_xl_tiny.yaml"), "--data.corpus", "sample"]
    args += ["--data.split_sources", "null", "--trainer.logger", "false"]
    args += [f"--trainer.callbacks+={callback}", "--trainer.callbacks.save_last", "true"]
    with pytest.raises(SystemExit) as info:
        main(args)
    line = str(info.value.code)
    assert line.startswith("error: trainer.callbacks: Lightning's ModelCheckpoint with save_last writes")
    assert line.endswith("use longctx.callbacks.RunCheckpoint (the same arguments)")
    assert "Traceback" not in capsys.readouterr().err


# ---------------------------------------------------------------------------------- config files
@pytest.fixture(scope="module")
def parser():
    return parser_only()


def parse_error(parser, args: list[str]) -> str:
    with pytest.raises(ParseError) as info:
        parser.parse_args(args)
    assert "\n" not in str(info.value)
    return str(info.value)


FIX = "a config file maps settings to values, e.g. `trainer: {max_steps: 100}`"


@pytest.mark.parametrize(
    "text, holds",
    [
        ("", "is empty"),
        ("# settings to come\n", "is empty"),
        ("- a\n- b\n", "holds a list (\"['a', 'b']\"), not a mapping of settings"),
        ("just a string\n", "holds a str ('just a string'), not a mapping of settings"),
    ],
)
def test_a_config_file_that_holds_no_mapping_is_named(parser, tmp_path, text, holds):
    """Was `error: Unexpected config:` (empty) and `error: b` (a list): neither named the file."""
    (tmp_path / "c.yaml").write_text(text)
    assert parse_error(parser, ["fit", "--config", "c.yaml"]) == f"config file c.yaml {holds}: {FIX}"


def test_an_included_config_file_that_holds_no_mapping_is_named(parser, tmp_path):
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "c.yaml").write_text("trainer: empty.yaml\n")
    assert parse_error(parser, ["fit", "--config", "c.yaml"]) == (
        f"trainer: config file empty.yaml is empty or holds no mapping of settings: {FIX}"
    )


def test_configs_of_two_methods_composed_say_so(parser, tmp_path):
    """The second config's class replaces the first's, whose settings stay (was: `no option
    'dropatt' (did you mean dropout?)`, as if the second config had a typo)."""
    configs = REPO / "configs"
    xl, span = configs / "transformer_xl_tiny.yaml", configs / "adaptive_span_tiny.yaml"
    assert parse_error(parser, ["fit", "--config", str(xl), "--config", str(span)]) == (
        f"model: {span} builds the model AdaptiveSpanLM, but {xl} before it built TransformerXLLM, whose "
        f"settings stay and do not fit AdaptiveSpanLM; compose configs of one method, or give {span} "
        f"without {xl} (model.init_args.network: no option 'dropatt')"
    )
    typo = tmp_path / "typo.yaml"  # one method: a typo is still a typo
    typo.write_text("model.init_args.network.dropatz: 0.1\n")
    assert parse_error(parser, ["fit", "--config", str(xl), "--config", str(typo)]) == (
        "model.init_args.network: no option 'dropatz' (did you mean dropatt or dropout?)"
    )


# ---------------------------------------------------------------------------------- sweep files
@pytest.mark.parametrize("command", ["run", "check"])
def test_a_sweep_file_that_is_not_text_is_named(tmp_path, command):
    """Was `error: 'utf-8' codec can't decode byte 0xe9 in position 20: ...`, without the file."""
    sweep = tmp_path / "sweep.txt"
    sweep.write_bytes(b"fit --config a.yaml\n\xe9t\xe9\n")
    with pytest.raises(NotText) as info:
        sweep_main([command, str(sweep)])
    assert str(info.value) == (
        f"{sweep} is not UTF-8 text (line 2: byte 20 is b'\\xe9'); a sweep file is text, one command per "
        "line (e.g. `fit --config C.yaml --run_name r`)"
    )


# ---------------------------------------------------------------------------------- report --out
OUT_FIX = "give --out a folder you can write (it is made if missing)"


def test_report_out_that_is_a_file_or_under_one_is_one_line(tmp_path):
    """Was a FileExistsError / NotADirectoryError traceback."""
    (tmp_path / "notes").write_text("")
    for out, expected in (
        ("notes", f"error: --out notes is a file, not a folder; {OUT_FIX}"),
        ("notes/report", f"error: --out notes/report: notes is a file, not a folder; {OUT_FIX}"),
    ):
        with pytest.raises(SystemExit) as info:
            report_main(["runs/a", "--out", out])
        assert info.value.code == expected


def test_report_out_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    """A read-only folder (os.access says so, as for a user without the permission; this suite may
    run as root) or a write that fails (a read-only mount) was a PermissionError / OSError traceback."""
    run_dir = tmp_path / "runs" / "a"
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps({"status": "finished", "metrics": {"test/bpb": 1.0}}))
    (tmp_path / "shared").mkdir()
    with monkeypatch.context() as patch:
        patch.setattr(os, "access", lambda path, mode: Path(path).name != "shared")
        with pytest.raises(SystemExit) as info:
            report_main(["runs/a", "--out", "shared"])
    assert info.value.code == f"error: --out shared is a folder you cannot write in; {OUT_FIX}"

    def read_only(path, text):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(report, "write_text_atomic", read_only)
    with pytest.raises(SystemExit) as info:
        report_main(["runs/a", "--out", "shared"])
    assert info.value.code == f"error: cannot write the report into shared (Read-only file system): {OUT_FIX}"


# ---------------------------------------------------------------------------------- resuming, overlaps
@pytest.fixture(scope="module")
def xl_run(tmp_path_factory) -> tuple[Path, list[str]]:
    """A 2-step fit of the tiny XL on the sample text (runs/xl), and its flags."""
    root = tmp_path_factory.mktemp("xl_run")
    flags = [
        "--config", str(REPO / "configs" / "transformer_xl_tiny.yaml"), "--data.corpus", "sample",
        "--data.split_sources", "null", "--data.cache_dir", str(root / "cache"),
        "--trainer.default_root_dir", str(root / "runs"), "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false", "--trainer.limit_val_batches", "1",
        "--model.init_args.network.n_layers", "1", "--model.init_args.network.d_inner", "64",
        "--trainer.callbacks", str(REPO / "configs" / "base" / "callbacks" / "val_loss_no_lr_monitor.yaml"),
    ]  # fmt: skip
    main(["fit", *flags, "--trainer.max_steps", "2", "--run_name", "xl"])
    return root, flags


@pytest.mark.slow  # a fit and a resume through the CLI, ~20 s
def test_resuming_with_another_segment_length_is_one_line(xl_run, capsys):
    """Was a ValueError traceback ("seq_len=32, this run seq_len=48")."""
    _, flags = xl_run
    with pytest.raises(SystemExit) as info:
        main(["fit", *flags, "--ckpt_path", "last", "--run_name", "xl", "--data.tgt_len", "48"])
    assert info.value.code == (
        "error: the checkpoint's training stream was cut with data.tgt_len 32, this run has 48: the stream "
        "cannot resume where it stopped with another layout; resume with --data.tgt_len 32, or start a "
        "fresh run (another --run_name, no --ckpt_path)"
    )
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.slow  # with the fit of `xl_run`
def test_evaluate_overlaps_of_a_segment_model_is_one_line(xl_run):
    """evaluate_overlaps is for windowed GPT-2 models; was a ValueError traceback."""
    root, flags = xl_run
    ckpt = str(root / "runs" / "xl" / "checkpoints" / "last.ckpt")
    with pytest.raises(SystemExit) as info:
        main(["evaluate_overlaps", *flags, "--ckpt_path", ckpt, "--run_name", "overlaps"])
    assert info.value.code == (
        "error: evaluate_overlaps evaluates windowed models (data.mode: windows, the GPT-2 configs such as "
        "configs/gpt2_window_tiny.yaml), and TransformerXLLM reads segments: evaluate it with validate or "
        "test, or sweep its context with `python -m longctx context`"
    )


@pytest.mark.parametrize("overlaps, bad", [([-1, 8], "-1 out of range"), ([0, 16], "16 out of range"),
                                           ([], "no overlap given")])  # fmt: skip
def test_an_overlap_the_window_cannot_take_is_one_line_before_any_evaluation(overlaps, bad):
    data = SimpleNamespace(mode="windows", eval_tgt_len=16)  # what the check reads of LMDataModule
    with pytest.raises(BadInput) as info:
        check_overlaps(CarryLM(), data, overlaps)
    assert str(info.value) == (
        f"--overlaps {overlaps}: {bad}; each overlap o must satisfy 0 <= o < the window (data.eval_tgt_len "
        "16), so that the stride window - o is positive; e.g. --overlaps '[0,4,8,12]'"
    )


# ---------------------------------------------------------------------------------- a full disk
def test_a_disk_that_fills_before_the_config_is_written_is_one_line(tmp_path, monkeypatch, capsys):
    """`config.yaml` is the run's first file: a full disk there was a 249-line traceback, and
    jsonargparse's `save` would leave a truncated file under the name."""
    real_open = Path.open

    def full(path: Path, mode: str = "r", *args, **kwargs):
        if "config.yaml" in path.name and "w" in mode:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", full)
    args = ["fit", "--config", str(REPO / "configs" / "quickstart.yaml"), "--trainer.logger", "false"]
    with pytest.raises(SystemExit) as info:
        main([*args, "--trainer.max_steps", "1", "--run_name", "full"])
    message = str(info.value.code)
    assert message.startswith("error: disk full writing the run's config runs/full/config.yaml: it needs ")
    assert message.endswith(
        "free there (or a quota is reached); nothing was written under that name. Free some space, or put "
        "the run on a larger disk (--trainer.default_root_dir)"
    )
    assert not (tmp_path / "runs" / "full" / "config.yaml").exists()
    assert [p.name for p in (tmp_path / "runs" / "full").glob("*config.yaml*")] == []
    assert "Traceback" not in capsys.readouterr().err


def test_a_seed_numpy_cannot_take_is_one_line():
    """Was a ValueError traceback from LightningCLI's seeding."""
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", str(REPO / "configs" / "quickstart.yaml"), "--seed_everything", "-1"])
    assert (
        info.value.code == "error: seed_everything: -1 is not in bounds, numpy accepts from 0 to 4294967295"
    )
