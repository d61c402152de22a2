"""Context axes: per method, the evaluation knob that sets how much context a checkpoint may use.

Each axis changes one knob *in place* on a built model or data module, between evaluations of one
checkpoint: every knob here is read afresh by each evaluation (nothing is precomputed from it), so
an evaluation after `set(...)` is the `validate` run with `flags(...)` added to its command line
(tested in tests/test_context.py). The context length of a point means:

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
(`--model.init_args.eval_h_prev reset`): two lines of the figure (`variants`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from longctx.core.base import LMBase
from longctx.data.datamodule import LMDataModule
from longctx.methods.adaptive_span.module import AdaptiveSpanLM
from longctx.methods.compressive_transformer.module import CompressiveTransformerLM
from longctx.methods.recurrence.module import RecurrentGPT2LM
from longctx.methods.transformer_xl.module import TransformerXLLM
from longctx.methods.window_transformer.module import WindowTransformerLM


class AxisError(ValueError):
    """A context axis or length the model cannot take; the command prints it as one line."""


@dataclass(frozen=True)
class Axis:
    """name: as in the CSV; applies: whether the model/data can take it (else `why_not`); limits:
    (smallest, largest or None: no limit) context length accepted; default_max: the longest length of
    the default sweep (the configured value; for the overlap, half the window); set: applies a length
    in place; flags: the same setting as `validate` flags."""

    name: str
    applies: Callable[[LMBase, LMDataModule], bool]
    why_not: str
    limits: Callable[[LMBase, LMDataModule], tuple[int, int | None]]
    default_max: Callable[[LMBase, LMDataModule], int]
    set: Callable[[LMBase, LMDataModule, int], None]
    flags: Callable[[LMBase, LMDataModule, int], list[str]]

    def lengths_for(self, model: LMBase, data: LMDataModule, requested: list[int] | None) -> list[int]:
        """The sorted lengths to evaluate (`requested`, else `default_lengths`); one-line errors for an
        axis the model cannot take or a length beyond its limits."""
        if not self.applies(model, data):
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


def _has_xl_memory(model: LMBase, data: LMDataModule) -> bool:
    """Transformer-XL (not TRAMS) and the Compressive Transformer: `eval_lengths.mem_len` read at every
    step."""
    if isinstance(model, CompressiveTransformerLM):
        return True
    return isinstance(model, TransformerXLLM) and model.trams is None


def _set_memory(model: TransformerXLLM | CompressiveTransformerLM, data: LMDataModule, length: int) -> None:
    model.eval_lengths = dataclasses.replace(model.eval_lengths, mem_len=length)


def _set_compressed(model: CompressiveTransformerLM, data: LMDataModule, length: int) -> None:
    model.eval_lengths = dataclasses.replace(model.eval_lengths, cmem_len=length)


def _trams_kept(model: TransformerXLLM, attended: int) -> int:
    """m − k for `attended` m, in the configured proportion (the configured group, not the swept one)."""
    configured = model.hparams["trams"]
    return round(attended * configured["kept"] / configured["attended"])


def _flag(model: LMBase, knob: str, value: int) -> list[str]:
    """The CLI override of a flat knob name, wherever the module's groups put it."""
    return [f"--model.init_args.{model.knob_path(knob)}", str(value)]


def _set_attended(model: TransformerXLLM, data: LMDataModule, length: int) -> None:
    model.trams = dataclasses.replace(model.trams, attended=length, kept=_trams_kept(model, length))


def _max_positions(model: LMBase) -> int | None:
    if isinstance(model, WindowTransformerLM):
        return model.net.config.max_len
    if isinstance(model, RecurrentGPT2LM):
        return model.lm.config.n_positions
    return None


def _window_limits(model: LMBase, data: LMDataModule) -> tuple[int, int | None]:
    return (data.eval_overlap + 1 if data.mode == "windows" else 1), _max_positions(model)


def _set_window(model: LMBase, data: LMDataModule, length: int) -> None:
    data.eval_tgt_len = length


MEMORY = Axis(
    "memory",
    applies=_has_xl_memory,
    why_not=(
        "it is the memory length of Transformer-XL, RPE and the Compressive Transformer "
        "(a TRAMS model sweeps `attended`)"
    ),
    limits=lambda model, data: (0, None),
    default_max=lambda model, data: model.eval_lengths.mem_len,
    set=_set_memory,
    flags=lambda model, data, length: _flag(model, "eval_mem_len", length),
)
COMPRESSED = Axis(
    "compressed",
    applies=lambda model, data: isinstance(model, CompressiveTransformerLM),
    why_not="it is the compressed memory n_cm of the Compressive Transformer (evaluation.cmem_len)",
    limits=lambda model, data: (0, None),
    default_max=lambda model, data: model.eval_lengths.cmem_len,
    set=_set_compressed,
    flags=lambda model, data, length: _flag(model, "eval_cmem_len", length),
)
ATTENDED = Axis(
    "attended",
    applies=lambda model, data: isinstance(model, TransformerXLLM) and model.trams is not None,
    why_not="it is TRAMS's attended memory m (set model.init_args.trams.attended)",
    limits=lambda model, data: (1, model.eval_lengths.mem_len),
    default_max=lambda model, data: model.hparams["trams"]["attended"],
    set=_set_attended,
    flags=lambda model, data, length: [
        *_flag(model, "trams_attended", length),
        *_flag(model, "trams_kept", _trams_kept(model, length)),
    ],
)
SPAN_CAP = Axis(
    "span_cap",
    applies=lambda model, data: isinstance(model, AdaptiveSpanLM),
    why_not="it caps the attended distance of adaptive-span models (eval_span_cap)",
    limits=lambda model, data: (1, model.net.config.attn_span),
    default_max=lambda model, data: model.net.config.attn_span,
    set=lambda model, data, length: setattr(model, "eval_span_cap", length),
    flags=lambda model, data, length: ["--model.init_args.eval_span_cap", str(length)],
)
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
AXES = {axis.name: axis for axis in (MEMORY, ATTENDED, SPAN_CAP, WINDOW, OVERLAP, COMPRESSED)}


def default_axis(model: LMBase, data: LMDataModule) -> Axis:
    """The axis a method is swept along unless `--axis` says otherwise."""
    if isinstance(model, CompressiveTransformerLM):
        return COMPRESSED
    if isinstance(model, TransformerXLLM):
        return MEMORY if model.trams is None else ATTENDED
    if isinstance(model, AdaptiveSpanLM):
        return SPAN_CAP
    if data.mode == "windows":
        return OVERLAP
    return WINDOW


def axis_named(name: str) -> Axis:
    if name not in AXES:
        raise AxisError(f"--axis {name}: unknown context axis; choose one of {', '.join(AXES)}")
    return AXES[name]


@dataclass(frozen=True)
class Variant:
    """A line of the figure for one checkpoint: a suffix of the model's name (and of its per-token
    files' names), its in-place setting and the same setting as `validate` flags."""

    suffix: str
    file_tag: str
    set: Callable[[LMBase], None]
    flags: list[str]


def variants(model: LMBase) -> list[Variant]:
    """The settings each point is evaluated under: h_prev carried and reset for a recurrent GPT-2."""
    if isinstance(model, RecurrentGPT2LM) and model.recurrence is not None:
        return [
            Variant("", "", lambda m: setattr(m, "eval_h_prev", "carried"),
                    ["--model.init_args.eval_h_prev", "carried"]),
            Variant(" (h_prev reset)", "_reset", lambda m: setattr(m, "eval_h_prev", "reset"),
                    ["--model.init_args.eval_h_prev", "reset"]),
        ]  # fmt: skip
    return [Variant("", "", lambda m: None, [])]
