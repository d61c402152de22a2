"""Bad input gets one line (`error: ...`, exit status 1) naming the problem and the fix: no usage dump,
no traceback (both only with LONGCTX_DEBUG=1). Each case is one a new user met (issue 20); the parse
errors go through the CLI's own parser (`parser_only`, what `main` and `sweep check` use), a few go
through `main` itself to pin the whole path. docs/bad_inputs.md lists every line tested here.
"""

from __future__ import annotations

import os
import pickle
import random
import subprocess
from pathlib import Path

import pytest
import torch

from longctx.checkpoints.fit_check import check_checkpoint_fits
from longctx.checkpoints.safe_unpickle import NotACheckpoint, load_tensors_file
from longctx.commands.cli import main, parser_only
from longctx.commands.data import main as data_main
from longctx.commands.sweep import check_sweeps
from longctx.methods.adaptive_span.module import AdaptiveSpanLM
from longctx.methods.recurrence.export import main as export_main
from longctx.runtime.errors import DEBUG_ENV, ParseError
from tests.helpers.environment import REPO

XL = "longctx.methods.transformer_xl.module.TransformerXLLM"
CONFIG = f"""\
model:
  class_path: {XL}
  init_args: {{network: {{n_layers: 2, d_model: 16, n_heads: 2, d_inner: 32}}, mem_len: 8}}
data:
  corpus: sample
"""


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch, tmp_path):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def parser():
    return parser_only()


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def parse_error(parser, args: list[str]) -> str:
    with pytest.raises(ParseError) as info:
        parser.parse_args(args)
    message = str(info.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------------------------- config and flags
def test_unknown_key_in_yaml_names_the_class_and_the_close_option(parser, tmp_path):
    config = write(tmp_path / "c.yaml", CONFIG.replace("n_layers", "n_layerz"))
    assert parse_error(parser, ["fit", "--config", str(config)]) == (
        "model.init_args.network: no option 'n_layerz' (did you mean n_layers?)"
    )
    flat = write(tmp_path / "flat.yaml", CONFIG.replace("network: {n_layers: 2,", "n_layers: 2, network: {"))
    assert parse_error(parser, ["fit", "--config", str(flat)]) == (  # a config from before the knob groups
        "model: TransformerXLLM has no option 'n_layers' (it moved to model.init_args.network.n_layers)"
    )


SPAN = "longctx.methods.adaptive_span.module.AdaptiveSpanLM"
SPAN_NETWORK = "{network: {d_model: 16, n_heads: 2}}"


MOVED = "model: AdaptiveSpanLM has no option"
TYPO = "model.init_args.network: no option"


@pytest.mark.parametrize(
    "init_args, flags, expected",
    [
        ("{d_model: 16}", [], f"{MOVED} 'd_model' (it moved to model.init_args.network.d_model)"),
        ("{network: {span_knd: fixed}}", [], f"{TYPO} 'span_knd' (did you mean span_kind"),
        ("{network: {span: fixed}}", [], f"{TYPO} 'span' (it is model.init_args.network.span_kind now)"),
        (SPAN_NETWORK, ["--model.init_args.network.span", "fixed"], f"{TYPO} 'span' (it is model.init_args"),
        (SPAN_NETWORK, ["--model.init_args.network.span_", "fixed"], "model: --network.span_ is the begin"),
        (SPAN_NETWORK, ["--model.init_args.attn_span", "8"], f"{MOVED} 'attn_span' (it moved to"),
        (SPAN_NETWORK, ["--model.init_args.network.chunk_sise", "8"], f"{TYPO} 'chunk_sise' (did you mean"),
    ],
)
def test_a_network_knob_outside_or_misspelt_in_its_group_names_its_place(
    parser, tmp_path, init_args, flags, expected
):
    """Adaptive span's network knobs live under model.init_args.network (`SpanTransformer.Config`):
    the flat name of before says where it moved; a typo inside the group, as a YAML key or a flag,
    names the group and the close field; a renamed field (`span`, now `span_kind`) its new name; a
    flag that begins several names (argparse's prefix matching) asks for the whole name."""
    config = write(tmp_path / "c.yaml", f"model:\n  class_path: {SPAN}\n  init_args: {init_args}\n")
    message = parse_error(parser, ["fit", "--config", str(config), *flags])
    assert message.startswith(expected), message


def test_unknown_key_of_the_data_or_trainer_in_yaml_names_the_close_setting(parser, tmp_path):
    config = write(tmp_path / "c.yaml", CONFIG.replace("corpus: sample", "corpuz: sample"))
    assert parse_error(parser, ["fit", "--config", str(config)]) == (
        "unknown setting 'data.corpuz' in the config (did you mean data.corpus or data.overlap or "
        "data.mirror?)"
    )


def test_optimizer_typos_name_the_optimizer(parser, tmp_path):
    sizes = "{network: {n_layers: 2, d_model: 16, n_heads: 2, d_inner: 32}, mem_len: 8}"
    optimizer = "{mem_len: 8, optimizer: {class_path: torch.optim.Adamm}}"
    config = write(tmp_path / "c.yaml", CONFIG.replace(sizes, optimizer))
    assert parse_error(parser, ["fit", "--config", str(config)]) == (
        "model.init_args.optimizer: class_path 'torch.optim.Adamm': module 'torch.optim' has no attribute "
        "'Adamm' (did you mean Adam or RAdam or NAdam?)"
    )
    config.write_text(config.read_text().replace("Adamm}", "Adam, init_args: {lrr: 0.1}}"))
    assert parse_error(parser, ["fit", "--config", str(config)]) == (
        "model.init_args.optimizer: Adam has no option 'lrr' (did you mean lr?)"
    )


def test_unknown_flag_names_the_close_flag_and_help(parser, tmp_path):
    config = write(tmp_path / "c.yaml", CONFIG)
    message = parse_error(parser, ["fit", "--config", str(config), "--trainer.max_stepz", "3"])
    assert message.startswith("unknown flag(s): --trainer.max_stepz 3 (did you mean --trainer.max_steps")
    assert message.endswith("; `python -m longctx fit --help` lists the options")


def test_wrong_type_names_the_full_key(parser, tmp_path):
    config = write(tmp_path / "c.yaml", CONFIG)
    args = ["fit", "--config", str(config), "--model.init_args.network.n_layers", "two"]
    assert parse_error(parser, args) == "model.init_args.network.n_layers: expected int, got two"
    args = ["fit", "--config", str(config), "--data.batch_size", "x"]
    assert parse_error(parser, args) == "data.batch_size: expected int, got x"


def test_a_callback_knob_out_of_range_is_a_parse_error(parser, tmp_path):
    """The progress and divergence sections are checked by the parser (one line), not by a callback's
    `__init__` after the parse (a traceback)."""
    config = write(tmp_path / "c.yaml", CONFIG)
    args = ["fit", "--config", str(config), "--progress.every_n_steps", "0"]
    assert parse_error(parser, args) == (
        "progress.every_n_steps: Not of type PositiveInt: 0 does not conform to restriction v>0"
    )


def test_misspelled_class_path_suggests_the_class(parser, tmp_path):
    config = write(tmp_path / "c.yaml", CONFIG.replace("TransformerXLLM", "TransformerXLL"))
    message = parse_error(parser, ["fit", "--config", str(config)])
    assert message.startswith(f"model: class_path '{XL[:-1]}': module ")
    assert message.endswith(
        "has no attribute 'TransformerXLL' (did you mean TransformerXLLM or TransformerXL?)"
    )


def test_yaml_syntax_error_names_the_file_and_the_line(parser, tmp_path):
    config = write(tmp_path / "c.yaml", "trainer:\n  max_steps: 1\n   foo: 2\n")
    assert parse_error(parser, ["fit", "--config", str(config)]) == (
        f"Problems parsing config: YAML syntax error in {config}, line 3, column 7: mapping values are "
        "not allowed in this context; fix the file"
    )


def test_yaml_syntax_error_in_a_nested_config_names_that_file(parser, tmp_path):
    (tmp_path / "base").mkdir()
    write(tmp_path / "base" / "trainer.yaml", "max_steps: [1\n")
    config = write(tmp_path / "c.yaml", CONFIG + "trainer: base/trainer.yaml\n")
    assert parse_error(parser, ["fit", "--config", str(config)]) == (
        "trainer: YAML syntax error in base/trainer.yaml, line 2, column 1: did not find expected ',' or "
        "']'; fix the file"
    )


def test_settings_above_config_are_refused_in_every_file_read(parser, tmp_path):
    """jsonargparse applies a file's keys in order: `lr` above `config:` would silently become the
    base's lr. Refused in the command line's file and in a file it includes."""
    write(tmp_path / "base.yaml", CONFIG + "model.init_args.optimizer: {init_args: {lr: 0.001}}\n")
    bad = write(
        tmp_path / "bad.yaml", "model.init_args.optimizer: {init_args: {lr: 0.05}}\nconfig: base.yaml\n"
    )
    line = (  # the file named relative to the working directory (tmp_path)
        "move `config:` to the top of bad.yaml: keys above it (model.init_args.optimizer) are overridden by "
        "the file it names"
    )
    assert parse_error(parser, ["fit", "--config", str(bad)]) == line
    outer = write(tmp_path / "outer.yaml", "config: bad.yaml\n")
    assert parse_error(parser, ["fit", "--config", str(outer)]) == line
    write(tmp_path / "good.yaml", "config: base.yaml\nmodel.init_args.optimizer: {init_args: {lr: 0.05}}\n")
    parsed = parser.parse_args(["fit", "--config", str(tmp_path / "good.yaml")])
    assert parsed.fit.model.init_args.optimizer.init_args.lr == 0.05


def test_missing_config_file(parser, tmp_path):
    missing = tmp_path / "nope.yaml"
    assert parse_error(parser, ["fit", "--config", str(missing)]) == f"config: no such file '{missing}'"


def test_main_prints_one_line_without_usage(tmp_path, capsys):
    config = write(tmp_path / "c.yaml", CONFIG.replace("n_layers", "n_layerz"))
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", str(config)])
    assert info.value.code == "error: model.init_args.network: no option 'n_layerz' (did you mean n_layers?)"
    assert "usage" not in capsys.readouterr().err


def test_debug_switch_keeps_jsonargparse_message(parser, tmp_path, monkeypatch, capsys):
    config = write(tmp_path / "c.yaml", CONFIG.replace("n_layers", "n_layerz"))
    monkeypatch.setenv(DEBUG_ENV, "1")
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["fit", "--config", str(config)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage:") and "Given value type" in err  # jsonargparse's own, in full


def test_sweep_check_prints_the_line_the_command_prints(tmp_path):
    config = write(tmp_path / "c.yaml", CONFIG)
    line = f"fit --config {config} --model.init_args.network.n_layers two"
    sweep = write(tmp_path / "sweep.txt", f"{line}\nfit --config {config}\n")
    with pytest.raises(SystemExit) as info:
        main(line.split())
    assert check_sweeps([sweep]) == {f"{sweep}:run 0": info.value.code}
    assert info.value.code == "error: model.init_args.network.n_layers: expected int, got two"


def test_a_value_a_knob_group_refuses_names_the_group_s_place_in_the_config(tmp_path):
    """The group's own check, one line that says where to fix it (jsonargparse builds the group
    before the module, and would bury the error in a dump of every setting)."""
    config = write(tmp_path / "c.yaml", CONFIG)
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", str(config), "--model.init_args.evaluation.mem_len", "-1"])
    assert info.value.code == (
        "error: model.init_args.evaluation: EvaluationMemory: evaluation mem_len (-1) and clamp_len "
        "(None) must be >= 0"
    )


# ---------------------------------------------------------------------------------- data root
def test_missing_data_root_is_one_line(tmp_path):
    config = write(tmp_path / "c.yaml", CONFIG.replace("corpus: sample", "corpus: wikitext2"))
    args = ["validate", "--config", str(config), "--data.root", str(tmp_path / "nonexistent")]
    args += ["--data.download", "false", "--trainer.logger", "false", "--run_name", "r"]
    with pytest.raises(SystemExit) as info:
        main(args)
    message = str(info.value.code)
    assert message.startswith(f"error: data.root {tmp_path / 'nonexistent'} does not exist: point")
    assert "\n" not in message and "--data.download true" in message
    assert not (tmp_path / "nonexistent").exists()  # nothing created on failure


def test_data_prepare_reports_config_and_corpus_errors_in_one_line(tmp_path):
    with pytest.raises(SystemExit) as info:
        data_main(["prepare", "--config", str(tmp_path / "nope.yaml")])
    assert info.value.code == f"error: config: no such file '{tmp_path / 'nope.yaml'}'"
    with pytest.raises(SystemExit) as info:
        data_main(["prepare", "wikitext2", "--root", str(tmp_path / "none"), "--no-download"])
    assert str(info.value.code).startswith(f"error: data.root {tmp_path / 'none'} does not exist")
    with pytest.raises(SystemExit) as info:
        data_main(["prepare"])
    assert (
        info.value.code
        == "error: name a corpus or give --config (`python -m longctx.data prepare --help` shows the usage)"
    )


# ---------------------------------------------------------------------------------- checkpoint files
@pytest.fixture
def tiny_model() -> AdaptiveSpanLM:
    network = {"d_model": 16, "n_layers": 1, "n_heads": 2, "d_inner": 32, "attn_span": 32}
    return AdaptiveSpanLM(vocab_size=256, network=network)


def saved(tmp_path: Path, model: AdaptiveSpanLM) -> Path:
    path = tmp_path / "good.ckpt"
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": {}}, path)
    return path


class Payload:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_truncated_checkpoint_is_not_a_checkpoint(tmp_path, tiny_model):
    good = saved(tmp_path, tiny_model)
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(NotACheckpoint, match=rf"^{cut} is not a readable PyTorch checkpoint \(not a zip"):
        check_checkpoint_fits(cut, tiny_model)
    check_checkpoint_fits(good, tiny_model)  # the whole file fits


def test_random_bytes_are_not_a_checkpoint(tmp_path, tiny_model):
    noise = tmp_path / "noise.ckpt"
    noise.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(NotACheckpoint, match=rf"^{noise} is not a readable PyTorch checkpoint"):
        check_checkpoint_fits(noise, tiny_model)
    legacy = tmp_path / "legacy.ckpt"
    legacy.write_bytes(pickle.dumps(3) + b"garbage")
    with pytest.raises(NotACheckpoint, match="is not a readable PyTorch checkpoint"):
        load_tensors_file(legacy)


@pytest.mark.parametrize("seed", [2, 20])  # seeds whose bytes drive the unpickler to IndexError, KeyError
def test_any_random_bytes_are_not_a_checkpoint(tmp_path, seed):
    """CI once drew random bytes on which the unpickler popped an empty stack: a traceback."""
    noise = tmp_path / "noise.ckpt"
    noise.write_bytes(random.Random(seed).randbytes(2000))
    with pytest.raises(NotACheckpoint, match=rf"^{noise} is not a readable PyTorch checkpoint"):
        load_tensors_file(noise)


def test_hostile_torch_zip_is_refused_naming_the_global(tmp_path, tiny_model, capsys):
    hostile = tmp_path / "hostile.ckpt"
    torch.save({"state_dict": tiny_model.state_dict(), "x": Payload()}, hostile)
    with pytest.raises(NotACheckpoint) as info:
        check_checkpoint_fits(hostile, tiny_model)
    message = str(info.value)
    assert message.startswith(f"{hostile} is not a longctx checkpoint: its pickle names print, ")
    assert "refuses unsafe content" in message and "weights_only" not in message
    assert "this must never run" not in capsys.readouterr().out


class SystemCall:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class Spawn(SystemCall):
    def __reduce__(self):
        return (subprocess.Popen, (self.command.split(),))


@pytest.mark.parametrize(
    "payload, named",
    [(SystemCall, "os.system (posix.system)"), (Spawn, "subprocess.Popen (commands.Popen)")],
)
def test_a_hostile_torch_zip_calling_the_system_names_the_global(tmp_path, tiny_model, payload, named):
    """torch blocks the `posix` module outright with another message than for a global off its list:
    this was "not a readable PyTorch checkpoint (Check the documentation ...)", blaming truncation."""
    hostile, ran = tmp_path / "hostile.ckpt", tmp_path / "ran"
    torch.save({"state_dict": tiny_model.state_dict(), "x": payload(f"touch {ran}")}, hostile)
    with pytest.raises(NotACheckpoint) as info:
        check_checkpoint_fits(hostile, tiny_model)
    assert str(info.value) == (
        f"{hostile} is not a longctx checkpoint: its pickle names {named}, which is neither a tensor nor "
        "plain data, and longctx refuses unsafe content (unpickling it could run any code); give a "
        "checkpoint that longctx wrote or converted"
    )
    assert not ran.exists()


def test_export_of_the_wrong_checkpoint_is_one_line(tmp_path, tiny_model):
    other = tmp_path / "span.ckpt"
    hparams = {"_class_path": "longctx.methods.adaptive_span.module.AdaptiveSpanLM"}
    torch.save({"state_dict": tiny_model.state_dict(), "hyper_parameters": hparams}, other)
    with pytest.raises(SystemExit) as info:
        export_main([str(other), str(tmp_path / "out")])
    assert str(info.value.code).startswith(
        f"error: {other} is not a RecurrentGPT2LM checkpoint (it holds a "
        "longctx.methods.adaptive_span.module.AdaptiveSpanLM): export writes the GPT-2 of a "
        "RecurrentGPT2LM run"
    )
    noise = tmp_path / "noise.ckpt"
    noise.write_bytes(b"\xc6" * 100)
    with pytest.raises(SystemExit) as info:
        export_main([str(noise), str(tmp_path / "out")])
    assert str(info.value.code).startswith(f"error: {noise} is not a readable PyTorch checkpoint")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------- other entry points
def test_report_without_run_directories_is_one_line():
    from longctx.commands.report import main as report_main

    with pytest.raises(SystemExit) as info:
        report_main([])
    assert info.value.code == (
        "error: the following arguments are required: RUN_DIR (`python -m longctx report --help` shows "
        "the usage)"
    )


def test_sweep_of_a_missing_file_or_a_line_that_is_no_run_is_one_line(tmp_path):
    """Through the module's own entry point (a fresh interpreter: `python -m longctx.sweep`)."""
    import sys

    repo = REPO
    bad = write(tmp_path / "bad.txt", "fitt --config c.yaml\n")
    for args, expected in (
        (
            ["run", str(tmp_path / "none.txt")],
            f"error: [Errno 2] No such file or directory: '{tmp_path / 'none.txt'}'",
        ),
        (
            ["run", str(bad)],
            f"error: {bad}: run 0 must start with one of fit, validate, test, evaluate_overlaps, got 'fitt'",
        ),
        (
            ["check"],
            "error: the following arguments are required: sweep_files (`python -m longctx.sweep check "
            "--help` shows the usage)",
        ),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "longctx.sweep", *args], capture_output=True, text=True, cwd=repo
        )
        assert (done.returncode, done.stderr) == (1, expected + "\n")


def test_authors_pickles_that_are_no_pickles_are_one_line(tmp_path):
    """`convert --from transfo-xl` reads model.pt / cache.pt / vocab.pkl with the record unpickler."""
    from longctx.checkpoints.safe_unpickle import load_pickle, load_torch_pickle

    noise = tmp_path / "model.pt"
    noise.write_bytes(b"\xc6" * 100)
    with pytest.raises(NotACheckpoint, match=rf"^{noise} is not a readable PyTorch checkpoint \(neither"):
        load_torch_pickle(noise, allowed=set())
    with pytest.raises(NotACheckpoint, match=rf"^{noise} is not a pickle file \(truncated or another kind"):
        load_pickle(noise, allowed=set())
