"""Constructor knobs in groups: frozen dataclasses, one source per knob.

A network declares its knobs once, as a frozen dataclass (`TransformerXL.Config`, with
`.build(vocab_size)`); a module takes it, and its other groups (the evaluation memory, TRAMS's
settings), as constructor arguments, which LightningCLI reads as nested groups
(`model.init_args.network.d_model`, `model.init_args.trams.attended`).

Besides a dataclass, a group argument may arrive in two other forms, both handled here so that no
module lists a knob a second time:
- a dict of the group's fields: how a checkpoint stores a group (`LMBase.save_hyperparameters` keeps
  plain values, which `torch.load(weights_only=True)` reads) and how `load_from_checkpoint` and the
  CLI hand it back;
- flat keywords, one per field (`TransformerXLLM(vocab_size=V, n_layers=2, eval_mem_len=64)`): what
  Python callers write and what checkpoints saved before the groups existed hold. `fold_flat` puts
  each into the group with a field of that name, after the group's prefix (`eval_mem_len` →
  `evaluation.mem_len`).
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def as_group(cls: type[T], value: T | Mapping[str, Any] | None) -> T | None:
    """`value` as a `cls` dataclass: itself, built from a dict of its fields, or None."""
    if value is None or isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        return cls(**value)
    if hasattr(value, "as_dict"):  # a jsonargparse Namespace
        return cls(**value.as_dict())
    raise TypeError(f"expected a {cls.__name__} or a dict of its fields, got {type(value).__name__}")


def network_config(cls: type[T], knobs: tuple[Any, ...], named_knobs: Mapping[str, Any]) -> T:
    """A network's `Config` from its constructor's arguments after the vocabulary size: the Config
    itself, or its fields (positional in the Config's order, or by name)."""
    if len(knobs) == 1 and not named_knobs and isinstance(knobs[0], cls):
        return knobs[0]
    return cls(*knobs, **named_knobs)


def check_sizes(config: Any, *names: str) -> None:
    """Each named field of `config` (an int, or None where the field allows it) must be at least 1: a
    zero or negative size fails later as a division by zero or a tensor of negative shape."""
    for name in names:
        value = getattr(config, name)
        if value is not None and value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")


def check_probabilities(config: Any, *names: str) -> None:
    """Each named field of `config` (a dropout rate) must be in [0, 1)."""
    for name in names:
        value = getattr(config, name)
        if not 0.0 <= value < 1.0:
            raise ValueError(f"{name} must be in [0, 1), got {value}")


def group_types(init: Callable[..., Any]) -> dict[str, tuple[type, bool]]:
    """The parameters of `init` whose annotation is a dataclass (or a dataclass or None): name →
    (the dataclass, whether None is allowed)."""
    hints = typing.get_type_hints(init)
    groups: dict[str, tuple[type, bool]] = {}
    for name in inspect.signature(init).parameters:
        hint = hints.get(name)
        options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        classes = [t for t in options if dataclasses.is_dataclass(t)]
        if len(classes) == 1:
            groups[name] = (classes[0], type(None) in options)
    return groups


def fold_flat(
    init: Callable[..., Any],
    given: Mapping[str, Any],
    flat: Mapping[str, Any],
    prefixes: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The group arguments of `init` (a module's `__init__`) as dataclasses, with the flat keywords folded in.

    given: each group argument as passed (a dataclass, a dict of its fields, or None).
    flat: the remaining keywords; each must name a field of exactly one group, after that group's
        prefix in `prefixes` (default no prefix), else TypeError as for any unexpected keyword.
        A flat keyword overrides the group's value. An optional group that is None (off) is built
        from the flat fields given for it if they switch it on: a required field of its dataclass
        (one without a default, e.g. TRAMS's m) given and not None (a group with no required field:
        any field not None); the dataclass then checks the rest. Checkpoints of earlier versions
        hold every flat knob, `trams_attended=None` among them: the group stays off.
    """
    prefixes = prefixes or {}
    groups = group_types(init)
    owner = init.__qualname__.removesuffix(".__init__")
    folded = {name: as_group(cls, given.get(name)) for name, (cls, _) in groups.items()}
    updates: dict[str, dict[str, Any]] = {name: {} for name in groups}
    for key, value in flat.items():
        homes = _homes(groups, prefixes, key)
        if len(homes) != 1:
            raise TypeError(f"{owner}() got an unexpected keyword argument {key!r}")
        name, field = homes[0]
        updates[name][field] = value
    for name, fields in updates.items():
        cls, optional = groups[name]
        current = folded[name]
        if not fields:
            if current is None and not optional:
                folded[name] = cls()
            continue
        if current is None and optional and _switched_off(cls, fields):
            continue
        folded[name] = dataclasses.replace(current, **fields) if current is not None else cls(**fields)
    return folded


def _homes(
    groups: Mapping[str, tuple[type, bool]], prefixes: Mapping[str, str], name: str
) -> list[tuple[str, str]]:
    """(group, field) for every group with a field called `name` after the group's prefix."""
    return [
        (group, name.removeprefix(prefixes.get(group, "")))
        for group, (cls, _) in groups.items()
        if name.startswith(prefixes.get(group, ""))
        and name.removeprefix(prefixes.get(group, "")) in {f.name for f in dataclasses.fields(cls)}
    ]


def _switched_off(cls: type, fields: Mapping[str, Any]) -> bool:
    required = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    return all(fields.get(name) is None for name in required or fields)


def flatten_knobs(
    init: Callable[..., Any], init_args: Mapping[str, Any], prefixes: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The inverse of `fold_flat`: `init_args` (a resolved config's, groups as dicts) with each group's
    fields under their flat names (`evaluation: {mem_len: 64}` → `eval_mem_len: 64`), so that readers
    of run configs (`report`) read runs from before and after the groups alike. A group that is None
    (off) gives no flat names."""
    prefixes = prefixes or {}
    groups = group_types(init)
    flat: dict[str, Any] = {}
    for key, value in init_args.items():
        if key in groups and isinstance(value, Mapping):
            flat.update({prefixes.get(key, "") + field: v for field, v in value.items()})
        elif key not in groups:
            flat[key] = value
    return flat


def knob_path(init: Callable[..., Any], name: str, prefixes: Mapping[str, str] | None = None) -> str:
    """Where the flat knob `name` lives in a config's init_args: `group.field` for a group's field
    (`eval_mem_len` → `evaluation.mem_len`), else `name` itself."""
    homes = _homes(group_types(init), prefixes or {}, name)
    return f"{homes[0][0]}.{homes[0][1]}" if homes else name


def plain(value: Any) -> Any:
    """A group as a dict of plain values (what a checkpoint stores); anything else unchanged."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value
