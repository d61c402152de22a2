"""Parse errors of the CLI as one line: the line of jsonargparse's message that names the problem.

LightningCLI's parser (jsonargparse) answers a config typo with the whole usage (~75 lines) and a
nested message whose last line is a dump of the given value. `OneLineParser.error` raises
`ParseError` with `parse_error_line(message)` instead (`longctx.cli.main` prints it as `error: ...`;
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
from typing import Any, NoReturn

import yaml
from jsonargparse import get_loader, set_loader
from lightning.pytorch.cli import LightningArgumentParser

from longctx.core.knob_groups import group_types
from longctx.errors import debug_enabled, one_line


class ParseError(ValueError):
    """A command line or config the parser refuses (the message is one line)."""


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
_YAML_MARK = re.compile(r'^in "<unicode string>", line (\d+), column (\d+)$')
_GIVEN_CLASS = re.compile(r"Got value: Namespace\(class_path='([^']+)'")
_NOT_ACCEPTED = re.compile(r"^Subcommand '\w+' does not accept option '([^']+)'$")
_UNRECOGNIZED = re.compile(r"^Unrecognized arguments: (\S+)")
_GROUP_OPTION = re.compile(r"^Group '([^']+)' does not accept option '([^']+)'$")


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
        known = _init_options(class_path)
        fix = _did_you_mean(match.group(1), list(known), known)
    elif match := _NO_ATTRIBUTE.match(detail):
        detail = f"class_path {class_path or match.group(2)!r}: {detail}"
        fix = _did_you_mean(match.group(2), _module_names(match.group(1)))
    elif match := _NOT_ACCEPTED.match(detail):  # a key in a YAML file that no setting has
        detail = f"unknown setting {match.group(1)!r} in the config"
        fix = _did_you_mean(match.group(1), [option.removeprefix("--") for option in options])
    elif class_path and (option := _group_option(detail)):  # inside a class's knob group
        detail = f"{class_path.rsplit('.', 1)[-1]} has no option {option!r}"
        group, _, field = option.rpartition(".")
        known = _init_options(class_path).values()
        siblings = {v.rpartition(".")[2]: v for v in known if v.rpartition(".")[0] == group}
        fix = _did_you_mean(field, list(siblings), siblings)
    elif match := _UNRECOGNIZED.match(detail):
        detail = detail.replace("Unrecognized arguments", "unknown flag(s)")
        fix = _did_you_mean(match.group(1).split("=", 1)[0], list(options))
    where = keys[0] if keys else ""
    if len(keys) > 1:
        where += (".init_args." if class_path else ".") + ".".join(keys[1:])
    line = f"{where}: {detail}" if where else detail
    return line + (f" ({fix})" if fix else "")


def _group_option(detail: str) -> str | None:
    """The option (`network.d_modle`) a class's knob group does not have, as jsonargparse names it for
    a flag (`Unrecognized arguments: --network.d_modle=3`) or a YAML key (`Group 'network' does not
    accept option 'd_modle'`); None for another problem."""
    if match := _GROUP_OPTION.match(detail):
        return f"{match.group(1)}.{match.group(2)}"
    if match := _UNRECOGNIZED.match(detail):
        return match.group(1).split("=", 1)[0].removeprefix("--")
    return None


def _did_you_mean(name: str, candidates: list[str], spelled: dict[str, str] | None = None) -> str:
    """A hint naming the candidates close to `name`, each as `spelled` writes it (default: as is)."""
    close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.6)
    spelled = spelled or {}
    return f"did you mean {' or '.join(spelled.get(c, c) for c in close)}?" if close else ""


def _init_options(class_path: str) -> dict[str, str]:
    """The options of a class's `__init__`, each → how a config writes it: its parameters, and the
    fields of its knob groups under the group (`d_model` → `network.d_model`, `longctx.core.knob_groups`),
    so that a flat name of before the groups points at its new place."""
    try:
        module, name = class_path.rsplit(".", 1)
        cls = getattr(importlib.import_module(module), name)
        parameters = inspect.signature(cls).parameters.values()
        known = {p.name: p.name for p in parameters if p.kind is not p.VAR_KEYWORD}
        for group, (config, _) in group_types(cls.__init__).items():
            for field in dataclasses.fields(config):
                known.setdefault(field.name, f"{group}.{field.name}")
        return known
    except (ImportError, AttributeError, ValueError, TypeError, NameError):
        return {}


def _module_names(module: str) -> list[str]:
    try:
        return [name for name in dir(importlib.import_module(module)) if not name.startswith("_")]
    except ImportError:
        return []


class OneLineParser(LightningArgumentParser):
    """LightningCLI's parser, whose parse errors are one line (`parse_error_line`) raised as
    `ParseError` instead of the usage and jsonargparse's nested message (kept with LONGCTX_DEBUG=1).
    Inner parsers jsonargparse builds with `exit_on_error=False` keep raising its own error, which
    it catches itself."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error or debug_enabled():
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self  # where jsonargparse found it
        options = [option for action in parser._actions for option in action.option_strings]
        subcommand = parser.prog.split()[-1] if parser.prog.split()[-1].isidentifier() else ""
        command = " ".join(["python -m longctx", subcommand]).strip()
        hint = f"; `{command} --help` lists the options" if "Unrecognized arguments" in message else ""
        raise ParseError(parse_error_line(message, options) + hint) from ex
