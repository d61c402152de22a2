"""Context axes: per method, the evaluation knob that sets how much context a checkpoint may use.

Each module class declares its own (`LMBase.context_axes`, in its method's folder; the first that
applies is its default); the window and overlap of the data module, defined here, apply to every model.

Each axis changes one knob *in place* on a built model or data module, between evaluations of one
checkpoint: every knob here is read afresh by each evaluation (nothing is precomputed from it), so
an evaluation after `set(...)` is the `validate` run with `flags(...)` added to its command line
(tested in tests/commands/test_context.py). The context length of a point means:

| axis       | methods                        | knob (flat name)  | context length |
|------------|--------------------------------|-------------------|----------------|
| memory     | Transformer-XL, RPE (no TRAMS) | eval_mem_len      | memory M       |
|            | and Compressive Transformer    |                   | (n_m)          |
| compressed | Compressive Transformer        | eval_cmem_len     | n_cm slots     |
| attended   | TRAMS                          | trams_attended    | attended m     |
| span_cap   | adaptive / dynamic / fixed     | eval_span_cap     | farthest reach |
| window     | any segment or window model    | data.eval_tgt_len | segment length |
| overlap    | windowed / recurrent GPT-2     | data.eval_overlap | overlap o      |

A model knob is named by its flat name; its `validate` flag is where the module's knob groups put it
(`LMBase.knob_path`: eval_mem_len is `--model.init_args.evaluation.mem_len` for Transformer-XL).

The Compressive Transformer sweeps its compressed memory n_cm by default (`compressed`; n_m stays
the configured evaluation.mem_len, so the last layer reaches n_m + c·n_cm back) or its memory n_m
(`--axis memory`, n_cm fixed); both are lengths in attended slots, not in tokens reached.
TRAMS keeps the share of always-attended slots: at m the newest round(m·kept/attended) slots are kept
(the configured trams_kept/trams_attended, e.g. 150/200) and the rest is selected from the pool.
A recurrent GPT-2 is evaluated twice at every point, with h_prev carried and reset
(`--model.init_args.eval_h_prev reset`): two lines of the figure (`variants`, which a module declares
through `LMBase.context_variants`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from longctx.core.base import LMBase
from longctx.data.datamodule import LMDataModule
from longctx.methods import registry


class AxisError(ValueError):
    """A context axis or length the model cannot take; the command prints it as one line."""


@dataclass(frozen=True)
class Axis:
    """name: as in the CSV; applies: whether the model/data can take it (else `why_not`), asked only of
    a model whose class declares the axis (`LMBase.context_axes`) or of any model for the data
    module's axes (`DATA_AXES`); limits: (smallest, largest or None: no limit) context length accepted;
    default_max: the longest length of the default sweep (the configured value; for the overlap, half
    the window); set: applies a length in place; flags: the same setting as `validate` flags."""

    name: str
    applies: Callable[[LMBase, LMDataModule], bool]
    why_not: str
    limits: Callable[[LMBase, LMDataModule], tuple[int, int | None]]
    default_max: Callable[[LMBase, LMDataModule], int]
    set: Callable[[LMBase, LMDataModule, int], None]
    flags: Callable[[LMBase, LMDataModule, int], list[str]]

    def takes(self, model: LMBase, data: LMDataModule) -> bool:
        """Whether `model` on `data` has this axis: its class declares it, or it is the data's, and it
        applies."""
        declared = self in DATA_AXES or self in type(model).context_axes
        return declared and self.applies(model, data)

    def lengths_for(self, model: LMBase, data: LMDataModule, requested: list[int] | None) -> list[int]:
        """The sorted lengths to evaluate (`requested`, else `default_lengths`); one-line errors for an
        axis the model cannot take or a length beyond its limits."""
        if not self.takes(model, data):
            raise AxisError(f"--axis {self.name} does not apply to {type(model).__name__}: {self.why_not}")
        lengths = sorted(set(requested)) if requested else self.default_lengths(model, data)
        low, high = self.limits(model, data)
        if bad := [length for length in lengths if length < low or (high is not None and length > high)]:
            accepted = f"from {low} to {high}" if high is not None else f">= {low}"
            raise AxisError(
                f"--lengths {' '.join(map(str, bad))}: {type(model).__name__} takes {self.name} lengths "
                f"{accepted}"
            )
        return lengths

    def default_lengths(self, model: LMBase, data: LMDataModule) -> list[int]:
        """Five evenly spaced lengths from the smallest accepted to `default_max`."""
        low, high = self.limits(model, data)[0], self.default_max(model, data)
        return sorted({round(low + (high - low) * i / 4) for i in range(5)})


def knob_flag(model: LMBase, knob: str, value: int) -> list[str]:
    """The `validate` flag setting the flat knob `knob`, wherever the module's groups put it."""
    return [f"--model.init_args.{model.knob_path(knob)}", str(value)]


def _window_limits(model: LMBase, data: LMDataModule) -> tuple[int, int | None]:
    return (data.eval_overlap + 1 if data.mode == "windows" else 1), model.longest_window()


def _set_window(model: LMBase, data: LMDataModule, length: int) -> None:
    data.eval_tgt_len = length


WINDOW = Axis(
    "window",
    applies=lambda model, data: True,
    why_not="",
    limits=_window_limits,
    default_max=lambda model, data: data.eval_tgt_len,
    set=_set_window,
    flags=lambda model, data, length: ["--data.eval_tgt_len", str(length)],
)
OVERLAP = Axis(
    "overlap",
    applies=lambda model, data: data.mode == "windows",
    why_not="it is the overlap of consecutive windows (data.mode: windows, the GPT-2 models)",
    limits=lambda model, data: (0, data.eval_tgt_len - 1),
    default_max=lambda model, data: data.eval_tgt_len // 2,
    set=lambda model, data, length: data.set_eval_overlap(length),
    flags=lambda model, data, length: ["--data.eval_overlap", str(length)],
)
DATA_AXES = (WINDOW, OVERLAP)  # the data module's: every model has them


@cache
def all_axes() -> dict[str, Axis]:
    """Every axis by name: the registered methods' (registry order; imports them), then the data's."""
    declared = [axis for method in registry.METHODS.values() for axis in method.module_class().context_axes]
    return {axis.name: axis for axis in [*declared, *DATA_AXES]}


def default_axis(model: LMBase, data: LMDataModule) -> Axis:
    """The axis a method is swept along unless `--axis` says otherwise: the first of its own that
    applies, else the overlap of windows, else the window."""
    own = [axis for axis in type(model).context_axes if axis.applies(model, data)]
    return own[0] if own else OVERLAP if OVERLAP.applies(model, data) else WINDOW


def axis_named(name: str) -> Axis:
    axes = all_axes()
    if name not in axes:
        raise AxisError(f"--axis {name}: unknown context axis; choose one of {', '.join(axes)}")
    return axes[name]


@dataclass(frozen=True)
class Variant:
    """A line of the figure for one checkpoint: a suffix of the model's name (and of its per-token
    files' names), its in-place setting and the same setting as `validate` flags."""

    suffix: str
    file_tag: str
    set: Callable[[LMBase], None]
    flags: list[str]


AS_BUILT = Variant("", "", lambda model: None, [])


def variants(model: LMBase) -> list[Variant]:
    """The settings each point is evaluated under (`LMBase.context_variants`; e.g. h_prev carried and
    reset for a recurrent GPT-2), else the model as built."""
    return list(model.context_variants()) or [AS_BUILT]
