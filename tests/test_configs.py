"""Every config in configs/ resolves to the values it resolved to before configs were composed.

The experiment configs build on the files in configs/base/ (configs/README.md): a composed file must
resolve, under `fit --config X --print_config`, to exactly the values stored in
tests/fixtures/resolved_configs/<name>.yaml. Those were written from the self-contained configs of
commit 4bf8e12, before the restructure, resolved by that commit's code (`python -m tests.test_configs
--regen --from-rev 4bf8e12` with 4bf8e12's `longctx` on the path), so they hold only the knobs that
existed then; window_transformer_tiny, added later, from its first committed version.

- A key of the stored values that changes or disappears fails the test (a changed default too: it
  changes what a paper config runs).
- A key that did not exist (a knob added since) passes if it holds its default value.
- To change a config's values on purpose, edit the config, then regenerate and review the diff:
      python -m tests.test_configs --regen adaptive_span trams_wt103   # some configs
      python -m tests.test_configs --regen                             # all of them
      git diff tests/fixtures/resolved_configs

Resolving costs about half a CPU-second per config (jsonargparse introspects every class), so the
fast tier checks one config per base file and the rest are `slow`; the parser is built once.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import io
import subprocess
import sys
import tarfile
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.environment import REPO

CONFIGS = REPO / "configs"
EXPECTED = REPO / "tests" / "fixtures" / "resolved_configs"
# One experiment config per base chain (adaptive span, Transformer-XL training, TRAMS evaluation,
# GPT-2 recurrence, a tiny CPU run): the fast tier's check that composition resolves as before.
FAST = {"adaptive_span", "transformer_xl_wt103", "trams_wt103", "recurrent_gpt2_pg19", "quickstart"}
FAST |= {"compressive_transformer_pg19"}  # the Compressive Transformer's base chain
MISSING = object()


def experiment_configs(root: Path = CONFIGS) -> list[Path]:
    """The runnable configs: configs/*.yaml (configs/base/ holds the pieces they build on)."""
    return sorted(root.glob("*.yaml"))


class _ParserBuilt(Exception):
    """Carries the CLI's parser out of `LightningCLI.__init__` before it parses or instantiates."""


@cache
def cli_parser() -> Any:
    """The `python -m longctx` parser, built once (building it takes seconds)."""
    from longctx.commands.cli import LongCtxCLI

    class ParserOnly(LongCtxCLI):
        def parse_arguments(self, parser: Any, args: Any) -> None:
            raise _ParserBuilt(parser)

    try:
        ParserOnly(args=[])
    except _ParserBuilt as built:
        return built.args[0]
    raise AssertionError("LongCtxCLI did not reach parse_arguments")


def resolve(config: Path) -> dict[str, Any]:
    """What `python -m longctx fit --config <config> --print_config` prints, as a dict."""
    return resolve_arguments(["--config", str(config)])


def resolve_arguments(arguments: list[str]) -> dict[str, Any]:
    """What `python -m longctx fit <arguments> --print_config` prints, as a dict."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            cli_parser().parse_args(["fit", *arguments, "--print_config"])
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            raise AssertionError(f"{arguments} do not parse (the error is printed above)") from None
        return yaml.safe_load(out.getvalue())
    raise AssertionError("--print_config did not exit")


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """{"trainer.callbacks[0].init_args.monitor": "val/bpc", ...}: one key per leaf value."""
    if isinstance(value, dict) and value:
        items = [(f"{prefix}.{key}" if prefix else str(key), item) for key, item in value.items()]
    elif isinstance(value, list) and any(isinstance(item, dict) for item in value):
        items = [(f"{prefix}[{i}]", item) for i, item in enumerate(value)]
    else:
        return {prefix: value}
    return {key: leaf for name, item in items for key, leaf in flatten(item, name).items()}


def default_value(key: str, resolved: dict[str, Any]) -> Any:
    """The value `key` takes when no config sets it: its class's signature default, else the parser's."""
    owner, sep, name = key.rpartition(".init_args.")
    if sep and "." not in name and f"{owner}.class_path" in resolved:
        module, _, attr = resolved[f"{owner}.class_path"].rpartition(".")
        cls = getattr(importlib.import_module(module), attr)
        for klass in cls.__mro__:  # a parameter forwarded by **kwargs has its default in a base class
            parameter = inspect.signature(klass.__init__).parameters.get(name)
            if parameter is not None and parameter.default is not inspect.Parameter.empty:
                return parameter.default
        return MISSING
    return parser_defaults().get(key, MISSING)


@cache
def parser_defaults() -> dict[str, Any]:
    """The `fit` parser's defaults (trainer.*, data.*, ...), flattened."""
    fit = cli_parser()._subcommands_action._name_parser_map["fit"]
    return flatten(fit.get_defaults().as_dict())


def differences(expected: dict[str, Any], resolved: dict[str, Any]) -> list[str]:
    """Changed or missing keys of `expected`, and new keys of `resolved` that are not at their default."""
    problems = [
        f"{key}: {value!r} -> {resolved.get(key, '<missing>')!r}"
        for key, value in expected.items()
        if resolved.get(key, MISSING) != value
    ]
    for key in sorted(resolved.keys() - expected.keys()):
        default = default_value(key, resolved)
        if default is MISSING or resolved[key] != default:
            shown = "no known default" if default is MISSING else f"default {default!r}"
            problems.append(f"{key}: new key set to {resolved[key]!r} ({shown})")
    return problems


def expected_path(name: str) -> Path:
    return EXPECTED / f"{name}.yaml"


def load_expected(name: str) -> dict[str, Any]:
    path = expected_path(name)
    if not path.is_file():
        pytest.fail(f"no stored values for configs/{name}.yaml: python -m tests.test_configs --regen {name}")
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize(
    "config",
    [
        pytest.param(path, id=path.stem, marks=() if path.stem in FAST else pytest.mark.slow)
        for path in experiment_configs()
    ],
)
def test_config_resolves_to_stored_values(config: Path):
    resolved = flatten(resolve(config))
    problems = differences(load_expected(config.stem), resolved)
    assert not problems, (
        f"configs/{config.name} resolves differently (if intended: "
        f"python -m tests.test_configs --regen {config.stem}):\n  " + "\n  ".join(problems)
    )


def test_every_config_has_stored_values_and_no_stale_ones():
    configs = {path.stem for path in experiment_configs()}
    stored = {path.stem for path in EXPECTED.glob("*.yaml")}
    assert configs - stored == set(), f"configs without stored values (--regen them): {configs - stored}"
    assert stored - configs == set(), f"stored values of deleted configs (delete them): {stored - configs}"
    assert configs >= FAST


def test_difference_check_catches_changed_missing_and_non_default_new_keys():
    """The comparison itself: a changed value, a lost key and a new key off its default all fail."""
    scheduler = "model.init_args.lr_scheduler"
    resolved = {
        f"{scheduler}.class_path": "longctx.optim.schedules.WarmupCosine",
        f"{scheduler}.init_args.warmup_steps": 100,
        f"{scheduler}.init_args.max_steps": 400,
    }
    assert differences(dict(resolved), resolved) == []
    assert differences({**resolved, f"{scheduler}.init_args.warmup_steps": 50}, resolved) == [
        f"{scheduler}.init_args.warmup_steps: 50 -> 100"
    ]
    lost = differences({**resolved, "data.corpus": "text8"}, resolved)
    assert lost == ["data.corpus: 'text8' -> '<missing>'"]
    default = default_value(f"{scheduler}.init_args.min_lr_ratio", resolved)
    assert default == 0.0  # WarmupCosine's signature default
    assert differences(resolved, {**resolved, f"{scheduler}.init_args.min_lr_ratio": default}) == []
    assert differences(resolved, {**resolved, f"{scheduler}.init_args.min_lr_ratio": 0.5}) == [
        f"{scheduler}.init_args.min_lr_ratio: new key set to 0.5 (default 0.0)"
    ]


# ---- how config files compose (pure YAML, no parser) -------------------------------------------


def config_files() -> list[Path]:
    return sorted(CONFIGS.rglob("*.yaml"))


def base_chain_groups(path: Path) -> set[str]:
    """Top-level groups (trainer, model, data, ...) that `path` and the files it builds on set."""
    groups: set[str] = set()
    while isinstance(raw := yaml.safe_load(path.read_text()), dict):
        groups |= {key.split(".")[0] for key in raw if key != "config"}
        if "config" not in raw:
            break
        path = path.parent / raw["config"]
    return groups


def is_mapping(path: Path) -> bool:
    return isinstance(yaml.safe_load(path.read_text()), dict)


MAPPING_FILES = [path for path in config_files() if is_mapping(path)]
LIST_FILES = [path for path in config_files() if not is_mapping(path)]


@pytest.mark.parametrize("path", LIST_FILES, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_list_config_is_a_callback_list_some_config_uses(path: Path):
    """A config that is a list (not a mapping) is a list of callbacks, the value of `trainer.callbacks`
    in another config: each item names its class, and some config points at the file."""
    items = yaml.safe_load(path.read_text())
    assert isinstance(items, list) and items, f"{path}: neither a mapping nor a non-empty list"
    assert all(isinstance(item, dict) and "class_path" in item for item in items), path
    users = [other for other in config_files() if path.name in other.read_text() and other != path]
    assert users, f"{path}: no config uses this list"


@pytest.mark.parametrize("path", MAPPING_FILES, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_config_file_composes_safely(path: Path):
    """The rules of configs/README.md whose breach jsonargparse would not report.

    After `config: <base>`, an override is a dotted key (`trainer.max_steps: 10`); a nested block
    (`trainer: {...}`) would silently replace the whole group of the base. In one file a group given
    as a path (`model: x.yaml`) loses to any dotted key under it (`model.init_args.d: 1`), and a
    `key+:` list append is silently ignored.
    """
    raw = yaml.safe_load(path.read_text())
    keys = list(raw)
    assert not [k for k in keys if k.endswith("+")], f"{path}: `key+:` appends are ignored in config files"
    shadowed = [(a, b) for a in keys for b in keys if b.startswith(a + ".")]
    assert not shadowed, f"{path}: {shadowed}: the dotted key silently replaces the whole group"
    if "config" in raw:
        assert keys[0] == "config", f"{path}: `config:` must come first (its base overrides keys before it)"
        base = path.parent / raw["config"]
        assert base.is_file(), f"{path}: base {raw['config']} not found (paths are relative to the file)"
        replaced = sorted(k for k in keys if isinstance(raw[k], dict) and k in base_chain_groups(base))
        assert not replaced, f"{path}: nested {replaced} would replace the base's group: use dotted keys"
    if path.parent == CONFIGS:
        assert path.read_text().startswith("# "), f"{path}: an experiment config opens with a header comment"


# ---- regeneration -------------------------------------------------------------------------------


def write_expected(config: Path, name: str) -> None:
    values = flatten(resolve(config))
    header = (
        f"# `python -m longctx fit --config configs/{name}.yaml --print_config`, flattened: what\n"
        "# tests/test_configs.py compares with. Regenerate, never edit:\n"
        f"#   python -m tests.test_configs --regen {name}\n"
    )
    EXPECTED.mkdir(parents=True, exist_ok=True)
    tmp = expected_path(name).with_suffix(".yaml.tmp")
    tmp.write_text(header + yaml.safe_dump(values, sort_keys=True, allow_unicode=True))
    tmp.replace(expected_path(name))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description="Rewrite tests/fixtures/resolved_configs from configs/.")
    parser.add_argument("--regen", nargs="*", metavar="NAME", required=True, help="configs (default: all)")
    parser.add_argument("--from-rev", help="resolve the configs as they were at this git revision instead")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = CONFIGS
        if args.from_rev:
            archive = subprocess.run(
                ["git", "-C", str(REPO), "archive", args.from_rev, "configs"], capture_output=True, check=True
            ).stdout
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                tar.extractall(tmp, filter="data")
            root = Path(tmp) / "configs"
        configs = {path.stem: path for path in experiment_configs(root)}
        unknown = set(args.regen) - configs.keys()
        if unknown:
            sys.exit(f"unknown configs {sorted(unknown)}: choose from {sorted(configs)}")
        for name in args.regen or sorted(configs):
            write_expected(configs[name], name)
            print(f"wrote {expected_path(name).relative_to(REPO)}")


if __name__ == "__main__":
    main(sys.argv[1:])
