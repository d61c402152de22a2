"""Transformer-XL's context axes (`longctx.diagnostics.axes`): its evaluation memory M, or TRAMS's
attended memory m.

`MEMORY` is shared: the Compressive Transformer sweeps its memory n_m along it (the same
`evaluation.mem_len`, read at every step). TRAMS keeps the share of always-attended slots: at m the
newest round(m·kept/attended) slots are kept (the configured trams_kept/trams_attended, e.g. 150/200)
and the rest is selected from the pool.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from longctx.diagnostics.axes import Axis, knob_flag


def _set_memory(model: Any, data: Any, length: int) -> None:
    model.eval_lengths = dataclasses.replace(model.eval_lengths, mem_len=length)


def _trams_kept(model: Any, attended: int) -> int:
    """m − k for `attended` m, in the configured proportion (the configured group, not the swept one)."""
    configured = model.hparams["trams"]
    return round(attended * configured["kept"] / configured["attended"])


def _set_attended(model: Any, data: Any, length: int) -> None:
    model.trams = dataclasses.replace(model.trams, attended=length, kept=_trams_kept(model, length))


MEMORY = Axis(
    "memory",
    # `eval_lengths.mem_len`, read at every step; a TRAMS model (`trams` set) sweeps `attended`.
    applies=lambda model, data: getattr(model, "trams", None) is None,
    why_not=(
        "it is the memory length of Transformer-XL, RPE and the Compressive Transformer "
        "(a TRAMS model sweeps `attended`)"
    ),
    limits=lambda model, data: (0, None),
    default_max=lambda model, data: model.eval_lengths.mem_len,
    set=_set_memory,
    flags=lambda model, data, length: knob_flag(model, "eval_mem_len", length),
)
ATTENDED = Axis(
    "attended",
    applies=lambda model, data: model.trams is not None,
    why_not="it is TRAMS's attended memory m (set model.init_args.trams.attended)",
    limits=lambda model, data: (1, model.eval_lengths.mem_len),
    default_max=lambda model, data: model.hparams["trams"]["attended"],
    set=_set_attended,
    flags=lambda model, data, length: [
        *knob_flag(model, "trams_attended", length),
        *knob_flag(model, "trams_kept", _trams_kept(model, length)),
    ],
)
