"""Constructor knobs in groups: frozen dataclasses, one source per knob.

A network declares its knobs once, as a frozen dataclass (`TransformerXL.Config`, with
`.build(vocab_size)`); a module takes it, and its other groups (the evaluation memory, TRAMS's
settings), as constructor arguments, which LightningCLI reads as nested groups
(`model.init_args.network.d_model`, `model.init_args.trams.attended`).

A group argument is the dataclass or a dict of its fields (`read_groups`): a dict is how a
checkpoint stores a group (`LMBase.save_hyperparameters` keeps plain values, which
`torch.load(weights_only=True)` reads) and how `load_from_checkpoint` and the CLI hand it back.

Each field also has a flat name, the field's name after its group's prefix (`eval_mem_len` is
`evaluation.mem_len`): the names checkpoints saved before the groups hold, which `upgrade_flat` moves
into their groups where a checkpoint is read (`LMBase.load_from_checkpoint`), and the names that
run readers (`report`, `context`) and the CLI's "it moved to" line use (`flatten_knobs`,
`knob_path`). A constructor takes groups only; a flat keyword is refused with the group it moved to
(`moved_keywords`).

A group's field renamed after checkpoints saved it (`network.span` → `network.span_kind`) is listed in
its module's `renamed_knobs`; `rename_knobs` reads the old name in both places before anything else.
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


def read_groups(init: Callable[..., Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """The group arguments of `init` (a module's `__init__`), each as passed in `given` (a dataclass, a
    dict of its fields, or None), as dataclasses; a required group given as None is its defaults."""
    groups = group_types(init)
    read = {name: as_group(cls, given.get(name)) for name, (cls, _) in groups.items()}
    for name, (cls, optional) in groups.items():
        if read[name] is None and not optional:
            read[name] = cls()
    return read


def override_groups(arguments: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`arguments` (a module's, groups as dicts) with `overrides` on top: a group given as a dict over
    a group saved as a dict overrides only the fields it names (`evaluation: {mem_len: 64}` keeps the
    saved clamp_len); anything else replaces the value."""
    merged = dict(arguments)
    for name, value in overrides.items():
        saved = plain(merged.get(name))
        merged[name] = (
            {**saved, **value} if isinstance(value, Mapping) and isinstance(saved, Mapping) else value
        )
    return merged


def at_path(path: str, value: Any) -> dict[str, Any]:
    """The keyword argument setting the knob at `path`: an argument (`protocol`) or a group's field
    (`network.attention` → `{"network": {"attention": value}}`), to merge with `override_groups`."""
    *groups, field = path.split(".")
    for group in reversed(groups):
        value, field = {field: value}, group
    return {field: value}


def moved_keywords(
    init: Callable[..., Any], keywords: Mapping[str, Any], prefixes: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The keywords of `keywords` that `init` does not take but a field of one of its groups has, under
    that group's prefix: name → `group.field` (`eval_mem_len` → `evaluation.mem_len`)."""
    named = inspect.signature(init).parameters
    unknown = [key for key in keywords if key not in named]
    groups = group_types(init) if unknown else {}
    homes = {key: _homes(groups, prefixes or {}, key) for key in unknown}
    return {key: f"{found[0][0]}.{found[0][1]}" for key, found in homes.items() if len(found) == 1}


def upgrade_flat(
    init: Callable[..., Any], hparams: Mapping[str, Any], prefixes: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A checkpoint's saved hyperparameters with the flat keys of versions before the knob groups
    (`n_layers: 2`, `eval_mem_len: 64`) moved into their groups (`network: {n_layers: 2}`,
    `evaluation: {mem_len: 64}`), each group's fields as a dict (how a checkpoint stores a group).

    A key is flat when `init` (a module's `__init__`) does not take it and it names a field of exactly
    one group after that group's prefix in `prefixes` (default no prefix); keys starting with `_`
    (Lightning's `_class_path`, `_instantiator`) are kept as they are; any other key `init` does not
    take is a ValueError (a knob dropped in silence would give a wrong number). A flat key overrides
    its group's saved value. An optional group (`X | None`) absent or None is switched on only by its
    flat fields: a required field of its dataclass (one without a default, e.g. TRAMS's m) given and
    not None (a group with no required field: any field not None); checkpoints of earlier versions
    hold every flat knob, `trams_attended=None` among them, and the group stays off. Hyperparameters
    without flat keys come back unchanged.
    """
    prefixes = prefixes or {}
    groups = group_types(init)
    named = inspect.signature(init).parameters
    upgraded: dict[str, Any] = {}
    moved: dict[str, dict[str, Any]] = {}
    for key, value in hparams.items():
        if key in named or key.startswith("_"):
            upgraded[key] = value
            continue
        homes = _homes(groups, prefixes, key)
        if len(homes) != 1:
            owner = init.__qualname__.removesuffix(".__init__")
            raise ValueError(
                f"the checkpoint's hyperparameter {key!r} is neither an argument of {owner} nor a field "
                "of one of its groups"
            )
        name, field = homes[0]
        moved.setdefault(name, {})[field] = value
    for name, fields in moved.items():
        cls, optional = groups[name]
        saved = plain(upgraded.get(name))
        if saved is None and optional and _switched_off(cls, fields):
            upgraded[name] = None
            continue
        upgraded[name] = {**(saved or {}), **fields}
    return upgraded


def rename_knobs(
    init_args: Mapping[str, Any], renamed: Mapping[str, str], prefixes: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """`init_args` (a checkpoint's saved hyperparameters or a run config's init_args) with each knob
    that was renamed after it was saved under its new name. `renamed` maps the old path of a group's
    field to the new one (`network.span` → `network.span_kind`); the old name is read in its group
    (`network: {span: fixed}`) and under its flat name (`span: fixed`, how checkpoints saved before
    the groups hold it). Anything else comes back unchanged."""
    prefixes = prefixes or {}
    out = dict(init_args)
    for old, new in renamed.items():
        (group, field), (new_group, new_field) = old.split("."), new.split(".")
        saved = plain(out.get(group))
        if isinstance(saved, Mapping) and field in saved:
            fields = {key: value for key, value in saved.items() if key != field}
            out[group] = fields
            out[new_group] = {**(plain(out.get(new_group)) or {}), new_field: saved[field]}
        flat = prefixes.get(group, "") + field
        if flat in out:
            out[prefixes.get(new_group, "") + new_field] = out.pop(flat)
    return out


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
    """The inverse of `upgrade_flat`: `init_args` (a resolved config's, groups as dicts) with each group's
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
