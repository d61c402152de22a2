"""Reading a run's recorded settings, for the modules' `LMBase.describe_run`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def first_set(*values: Any) -> Any:
    """The first value that is not None (an evaluation knob left unset falls back to training's)."""
    return next((value for value in values if value is not None), None)


def eval_window(data: Mapping[str, Any]) -> Any:
    """The evaluation window (segment) length of a run's data settings."""
    return first_set(data.get("eval_tgt_len"), data.get("tgt_len"))
