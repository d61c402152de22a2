"""Parse errors of the CLI as one line: the line of jsonargparse's message that names the problem.

LightningCLI's parser (jsonargparse) answers a config typo with the whole usage (~75 lines) and a
nested message whose last line is a dump of the given value. `OneLineParser.error` raises
`ParseError` with `parse_error_line(message)` instead (`longctx.commands.cli.main` prints it as `error: ...`;
`python -m longctx.sweep check` prints the same line), and `load_yaml_naming_the_file` makes a YAML
syntax error name its file and line.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import os
import re
from pydoc import locate
from typing import Any, NoReturn

import yaml
from jsonargparse import get_loader, set_loader
from lightning.pytorch.cli import LightningArgumentParser

from longctx.core.knob_groups import group_types
from longctx.runtime.errors import ParseError, debug_enabled, one_line

_YAML_LOAD = get_loader("yaml")


def load_yaml_naming_the_file(value: str, path: str = "") -> Any:
    """jsonargparse's YAML loader, but a syntax error in a config file names the file and the line
    (jsonargparse reads the file into a string and reports `"<unicode string>", line 3`). jsonargparse
    passes the file's base name while the working directory is the file's folder."""
    try:
        return _YAML_LOAD(value)
    except yaml.YAMLError as err:
        if not path:
            raise
        mark = getattr(err, "problem_mark", None)
        where = os.path.abspath(path) + (f", line {mark.line + 1}, column {mark.column + 1}" if mark else "")
        problem = getattr(err, "problem", None) or one_line(err)
        raise yaml.YAMLError(f"YAML syntax error in {where}: {problem}; fix the file") from err


set_loader("yaml", load_yaml_naming_the_file, exceptions=(yaml.YAMLError,))

# Lines of jsonargparse's messages that say where it looked, not what is wrong.
_NOISE = (
    "Does not validate against any of the Union subtypes",
    "Subtypes:",
    "Errors:",
    "Given value",
    "Expected a <class 'NoneType'>",
    "tip:",
)
_PARSER_KEY = re.compile(r'^Parser key "([^"]+)":\s*(.*)$')
_CLASS_PROBLEM = re.compile(r"^Problem with given class_path '([^']+)':$")
_UNKNOWN_OPTION = re.compile(r"^Option '([^']+)' is not accepted$")
_NO_ATTRIBUTE = re.compile(r"^module '([\w.]+)' has no attribute '(\w+)'$")
_UNABLE_TO_LOAD = re.compile(r"^Unable to load config '([^']+)'$")
_NO_MAPPING = re.compile(r'^Unable to load config "([^"]+)"$')  # a nested file that holds no mapping
_YAML_MARK = re.compile(r'^in "<unicode string>", line (\d+), column (\d+)$')
_GIVEN_CLASS = re.compile(r"Got value: Namespace\(class_path='([^']+)'")
_NOT_ACCEPTED = re.compile(r"^Subcommand '\w+' does not accept option '([^']+)'$")
_UNRECOGNIZED = re.compile(r"^Unrecognized arguments: (\S+)")
_GROUP_OPTION = re.compile(r"^Group '(\w+)' does not accept option '([^']+)'$")  # a knob group's field
# argparse's prefix matching: a flag that begins more than one option's name (`--network.span` when the
# group has span_kind and span_ramp)
_AMBIGUOUS = re.compile(r"^ambiguous option: --([\w.]+)(?:=\S*)? could match (.+)$")


def parse_error_line(message: str, options: list[str] = ()) -> str:
    """The one line of a jsonargparse error that names the problem, prefixed by the setting it is
    about, with a fix where one is known (a close option name, class name or flag).

    jsonargparse nests its messages (`Parser key "model":` / `Does not validate against any of the
    Union subtypes` / `Problem with given class_path ...:` / the real problem / `Given value: ...`);
    the real problem is the innermost line that is not one of those frames.
    """
    keys: list[str] = []
    class_path = nested = mark = None
    detail = ""
    for raw in message.splitlines():
        line = raw.strip().removeprefix("- ").strip()
        if not line or line.startswith(_NOISE):
            continue
        if match := _PARSER_KEY.match(line):
            keys.append(match.group(1))
            line = match.group(2)
            if not line:
                continue
        if match := _CLASS_PROBLEM.match(line):
            class_path = match.group(1)
            continue
        if match := _UNABLE_TO_LOAD.match(line):  # a nested config file (`trainer: base/x.yaml`)
            nested = match.group(1)
            continue
        if match := _YAML_MARK.match(line):  # where in that file: the loader could not name it
            mark = f"line {match.group(1)}, column {match.group(2)}"
            continue
        detail = line
    if nested and mark:
        detail = f"YAML syntax error in {nested}, {mark}: {detail}; fix the file"
    if match := _NO_MAPPING.match(detail):
        detail = f"config file {match.group(1)} {holds_no_mapping(UNREAD)}"
        keys = list(dict.fromkeys(keys))  # jsonargparse names the key twice
    if given := _GIVEN_CLASS.search(detail):  # the innermost class (e.g. an optimizer's)
        class_path = given.group(1)
    detail = re.sub(r"\. Got value: Namespace\(.*$", "", detail)
    detail = re.sub(r"^Type .+? expects a function or a callable class: ", "", detail)
    detail = re.sub(r"<class '([\w.]+)'>", r"\1", detail).replace("typing.", "")
    detail = re.sub(r"^Expected a (.+?)\. Got value: (.*)$", r"expected \1, got \2", detail)
    detail = re.sub(r"^File does not exist: (.*)$", r"no such file \1", detail)
    fix = ""
    if (match := _UNKNOWN_OPTION.match(detail)) and class_path:
        name = class_path.rsplit(".", 1)[-1]
        detail = f"{name} has no option {match.group(1)!r}"
        fix = _unknown_option_fix(match.group(1), class_path, keys[0] if keys else "model")
    elif (match := _AMBIGUOUS.match(detail)) and not _renamed_flag(match.group(1), class_path):
        detail = f"--{match.group(1)} is the beginning of more than one option ({match.group(2)})"
        fix = "write the option's whole name"
    elif class_path and (option := _group_option(detail)):  # a knob group's field: a YAML key or a flag
        group, option = option
        keys = [*keys, group]
        detail = f"no option {option!r}"
        renamed = _renamed_knobs(class_path).get(f"{group}.{option}")
        prefix = ".".join([*keys[:1], "init_args"]) + "." if keys else ""
        close = _did_you_mean(option, _group_fields(class_path, group))
        fix = f"it is {prefix}{renamed} now" if renamed else close
    elif match := _NO_ATTRIBUTE.match(detail):
        detail = f"class_path {class_path or match.group(2)!r}: {detail}"
        fix = _did_you_mean(match.group(2), _module_names(match.group(1)))
    elif match := _NOT_ACCEPTED.match(detail):  # a key in a YAML file that no setting has
        detail = f"unknown setting {match.group(1)!r} in the config"
        fix = _did_you_mean(match.group(1), [option.removeprefix("--") for option in options])
    elif match := _UNRECOGNIZED.match(detail):
        detail = detail.replace("Unrecognized arguments", "unknown flag(s)")
        fix = _did_you_mean(match.group(1).split("=", 1)[0], list(options))
    where = keys[0] if keys else ""
    if len(keys) > 1:
        where += (".init_args." if class_path else ".") + ".".join(keys[1:])
    line = f"{where}: {detail}" if where else detail
    return line + (f" ({fix})" if fix else "")


UNREAD = object()  # the content of a config file that was not read here


def holds_no_mapping(content: Any) -> str:
    """What a config file that is no mapping of settings holds (its loaded YAML, or `UNREAD`), and
    the fix."""
    if content is UNREAD:
        what = "is empty or holds no mapping of settings"
    elif content is None or (isinstance(content, str) and not content.strip()):
        what = "is empty"
    else:
        what = f"holds a {type(content).__name__} ({one_line(content)[:40]!r}), not a mapping of settings"
    return f"{what}: a config file maps settings to values, e.g. `trainer: {{max_steps: 100}}`"


def _group_option(detail: str) -> tuple[str, str] | None:
    """(group, option) when a class's knob group has no such option, as jsonargparse says it for a
    YAML key (`Group 'network' does not accept option 'd_modle'`) or a flag (`Unrecognized
    arguments: --network.d_modle=3`); None for another problem."""
    if match := _GROUP_OPTION.match(detail):
        return match.group(1), match.group(2)
    if (match := _UNRECOGNIZED.match(detail)) and "." in (flag := match.group(1).split("=", 1)[0]):
        group, _, option = flag.removeprefix("--").rpartition(".")
        return group, option
    if (match := _AMBIGUOUS.match(detail)) and "." in match.group(1):  # a renamed field's old name
        group, _, option = match.group(1).rpartition(".")
        return group, option
    return None


def _renamed_flag(flag: str, class_path: str | None) -> bool:
    """Whether `flag` (`network.span`) is the old name of a field the class renamed."""
    return class_path is not None and flag in _renamed_knobs(class_path)


def _did_you_mean(name: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.6)
    return f"did you mean {' or '.join(close)}?" if close else ""


def _init_parameters(class_path: str) -> list[str]:
    try:
        return list(inspect.signature(locate(class_path)).parameters)
    except (ValueError, TypeError):
        return []


def _group_fields(class_path: str, group: str) -> list[str]:
    """The fields of the knob group `group` of the class at `class_path` (none if it has no such group)."""
    cls = locate(class_path)
    groups = group_types(cls.__init__) if isinstance(cls, type) else {}
    return [field.name for field in dataclasses.fields(groups[group][0])] if group in groups else []


def _unknown_option_fix(option: str, class_path: str, key: str) -> str:
    """The fix for an init argument `class_path` does not take: where it lives now if the module
    takes it in a knob group (`n_layers` → `model.init_args.network.n_layers`), else the
    close names, a group's field named by its path (`network.d_model`)."""
    homes = _group_homes(class_path)
    if option in homes:
        return f"it moved to {key}.init_args.{homes[option]}"
    names = {**homes, **{name: name for name in _init_parameters(class_path)}}
    close = difflib.get_close_matches(option, list(names), n=3, cutoff=0.6)
    return f"did you mean {' or '.join(names[name] for name in close)}?" if close else ""


def _renamed_knobs(class_path: str) -> dict[str, str]:
    """A module's renamed group fields, old path → new path (`LMBase.renamed_knobs`)."""
    return dict(getattr(locate(class_path), "renamed_knobs", {}))


def _group_homes(class_path: str) -> dict[str, str]:
    """A module's knob-group fields by their flat names (`LMBase.flatten_knobs`), each mapped to its
    path under init_args (`d_model` → `network.d_model`); {} for a class without groups."""
    cls = locate(class_path)
    if not hasattr(cls, "flatten_knobs"):
        return {}
    paths = {
        group: {f.name: f"{group}.{f.name}" for f in dataclasses.fields(config)}
        for group, (config, _) in group_types(cls.__init__).items()
    }
    return cls.flatten_knobs(paths) if paths else {}


def _module_names(module: str) -> list[str]:
    try:
        return [name for name in dir(importlib.import_module(module)) if not name.startswith("_")]
    except ImportError:
        return []


class OneLineParser(LightningArgumentParser):
    """LightningCLI's parser, whose parse errors are one line (`parse_error_line`) raised as
    `ParseError` instead of the usage and jsonargparse's nested message (kept with LONGCTX_DEBUG=1).
    Inner parsers jsonargparse builds with `exit_on_error=False` keep raising its own error, which
    it catches itself.

    It also names what jsonargparse cannot: the config file that holds no mapping (`Unexpected
    config: - a`), and the config files of two methods composed (`--config xl.yaml --config
    span.yaml`: the second's class replaces the first's, whose settings stay and do not fit it;
    jsonargparse would only say the new class has no such option)."""

    def parse_args(self, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "_subcommands_action", None) is not None:  # the root parser: a new command line
            _CONFIG_MODELS.clear()
            _CONFIG_MODELS_FROM[:] = [os.getcwd()]
        return super().parse_args(*args, **kwargs)

    def _load_config_parser_mode(
        self, cfg_str: str, cfg_path: str | os.PathLike = "", *args: Any, **kwargs: Any
    ) -> Any:
        """jsonargparse's, plus: a file that holds no mapping is named, and each file's model class is
        recorded before its settings apply (jsonargparse passes the file's base name while the
        working directory is its folder; a file it includes is read while it is being applied)."""
        where = os.path.abspath(cfg_path) if cfg_path else ""
        try:
            content = _YAML_LOAD(cfg_str) if cfg_str.strip() else None
        except yaml.YAMLError:  # jsonargparse's loader names the file and the line
            content = UNREAD
        if misplaced := _keys_above_config(content):
            name = _shown(where) if where else "the --config value"
            raise TypeError(
                f"move `config:` to the top of {name}: keys above it ({', '.join(misplaced)}) are overridden "
                "by the file it names"
            )
        if where and (class_path := _model_class_path(content)):
            _CONFIG_MODELS.append((where, class_path, _including[0]))
        _including[0] += 1
        try:
            return super()._load_config_parser_mode(cfg_str, cfg_path, *args, **kwargs)
        except TypeError as err:
            if not str(err).startswith("Unexpected config:"):
                raise
            name = f"config file {_shown(where)}" if where else "--config"
            raise TypeError(f"{name} {holds_no_mapping(content)}") from err
        finally:
            _including[0] -= 1

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error or debug_enabled():
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self  # where jsonargparse found it
        options = [option for action in parser._actions for option in action.option_strings]
        subcommand = parser.prog.split()[-1] if parser.prog.split()[-1].isidentifier() else ""
        command = " ".join(["python -m longctx", subcommand]).strip()
        hint = f"; `{command} --help` lists the options" if "Unrecognized arguments" in message else ""
        line = parse_error_line(message, options)
        if line.startswith("model") and (mixed := _mixed_models()):
            line, hint = f"{mixed} ({line.split(' (did you mean')[0]})", ""
        raise ParseError(line + hint) from ex


# (config file, model class_path, depth: 0 for a file of the command line, 1 for a file it includes, ...)
# for each config file of the command line being parsed that names a model class, in reading order;
# and the working directory of that command line.
_CONFIG_MODELS: list[tuple[str, str, int]] = []
_CONFIG_MODELS_FROM: list[str] = []
_including = [0]  # how deep in included config files the parser reads now


def _keys_above_config(content: Any) -> list[str]:
    """The keys a config file's mapping writes before its `config:` key ([] when there are none).
    jsonargparse applies a file's keys in order and `config:` loads the file it names over what came
    before, so a setting above it is silently replaced by the base's value."""
    if not isinstance(content, dict) or "config" not in content:
        return []
    keys = [str(key) for key in content]
    return keys[: keys.index("config")]


def _model_class_path(content: Any) -> str | None:
    """The model class a config file's mapping names (`model: {class_path: ...}` or
    `model.class_path: ...`), or None."""
    if not isinstance(content, dict):
        return None
    model = content.get("model")
    class_path = model.get("class_path") if isinstance(model, dict) else model
    class_path = content.get("model.class_path", class_path)
    return class_path if isinstance(class_path, str) else None


def _mixed_models() -> str:
    """The line for config files of two model classes composed on one command line, or ""."""
    if not _CONFIG_MODELS:
        return ""
    later, later_class, _ = _CONFIG_MODELS[-1]
    name = later_class.rsplit(".", 1)[-1]
    earlier = [(path, cls, depth) for path, cls, depth in _CONFIG_MODELS if cls.rsplit(".", 1)[-1] != name]
    if not earlier:
        return ""
    path, cls, _ = min(earlier, key=lambda record: record[2])  # the command line's own file first
    return (
        f"model: {_shown(later)} builds the model {name}, but {_shown(path)} before it built "
        f"{cls.rsplit('.', 1)[-1]}, whose settings stay and do not fit {name}; compose configs of one "
        f"method, or give {_shown(later)} without {_shown(path)}"
    )


def _shown(path: str) -> str:
    """`path` relative to the command line's working directory when it is inside it, else as it is."""
    relative = os.path.relpath(path, *_CONFIG_MODELS_FROM[:1])
    return path if relative.startswith("..") else relative
