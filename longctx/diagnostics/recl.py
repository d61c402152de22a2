"""Relative Effective Context Length (RECL) of Dai et al. 2019, "Transformer-XL: Attentive Language
Models Beyond a Fixed-Length Context", Section 4.3 and Appendix C ("Details About RECL").

The paper's definition, in its names. A model group M = {m_1, ..., m_N}; l_i(c, t) is the loss of
model m_i on the t-th token with context length c. For a short context c and a long one c' >= c:

    b(c, t)      = min_i l_i(c, t)                                   (the group's baseline at t)
    f_i(c, c')   = (1/|T|) Σ_{t ∈ T} min(b(c, t), l_i(c', t))        (relative loss of m_i)
    T            = the top-r positions t with the largest b(c, t)    (r: a fraction of positions)
    g_i(c, c')   = (exp f_i(c, c) − exp f_i(c, c')) / exp f_i(c, c)  (relative gain)

and, with a step Δ: start at the shortest c, c' = c + Δ; while g_i(c, c') >= 0.01 move on (c = c');
the first c whose gain falls below 0.01 is m_i's RECL. Only losses below the group's best short-context
loss count, so every model is measured against the same baseline (the paper's "fair comparison").

Here Δ is the step between consecutive context lengths of the sweep (an evenly spaced sweep is the
paper's fixed Δ), and the gain threshold is a parameter (`gain_threshold`, the paper's 0.01). The
paper reports r = 0.1, 0.5 and 1.0 (its Table 8). A model whose gain never falls below the threshold
gets the longest context of the sweep, flagged `reached_end` (its RECL is at least that).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

PAPER_R = (0.1, 0.5, 1.0)
PAPER_GAIN_THRESHOLD = 0.01


@dataclass(frozen=True)
class Recl:
    """One model's RECL at one r: `length` (a context length of the sweep) and whether the gain was
    still above the threshold at the end of the sweep (`reached_end`: the RECL is at least `length`)."""

    model: str
    r: float
    length: int
    reached_end: bool


@dataclass(frozen=True)
class Gain:
    """g_i(c, c') of one model at one r."""

    model: str
    r: float
    short: int
    long: int
    gain: float


def hardest_positions(baseline: np.ndarray, r: float) -> np.ndarray:
    """T: the indices of the ceil(r·n) positions with the largest baseline loss b(c, t)."""
    if not 0.0 < r <= 1.0:
        raise ValueError(f"r is a fraction of positions in (0, 1], got {r}")
    count = max(1, math.ceil(r * baseline.size))
    return np.argsort(-baseline, kind="stable")[:count]


def relative_gain(
    losses: Mapping[str, Mapping[int, np.ndarray]], short: int, long: int, r: float
) -> dict[str, float]:
    """g_i(c, c') of every model of the group for c = `short`, c' = `long`.

    losses[model][c]: l_i(c, t), float arrays over the same tokens t (the same order in every array).
    """
    baseline = np.min(np.stack([np.asarray(per_c[short], np.float64) for per_c in losses.values()]), axis=0)
    top = hardest_positions(baseline, r)
    f_short = baseline[top].mean()  # f_i(c, c): min(b, l_i(c, t)) is b(c, t) for every model
    gains = {}
    for model, per_c in losses.items():
        f_long = np.minimum(baseline[top], np.asarray(per_c[long], np.float64)[top]).mean()
        gains[model] = float((math.exp(f_short) - math.exp(f_long)) / math.exp(f_short))
    return gains


def relative_effective_context_length(
    losses: Mapping[str, Mapping[int, np.ndarray]],
    rs: Sequence[float] = PAPER_R,
    gain_threshold: float = PAPER_GAIN_THRESHOLD,
) -> tuple[list[Recl], list[Gain]]:
    """RECL of every model of the group at every r, and every gain g_i(c, c') computed on the way.

    losses[model][c]: per-token losses l_i(c, t) over the same tokens; every model needs the same
    context lengths c (at least two).
    """
    lengths = sorted(next(iter(losses.values())))
    if len(lengths) < 2 or any(sorted(per_c) != lengths for per_c in losses.values()):
        raise ValueError("RECL needs every model of the group at the same context lengths, at least two")
    recls, gains = [], []
    for r in rs:
        steps = [relative_gain(losses, c, c_next, r) for c, c_next in itertools.pairwise(lengths)]
        for model in losses:
            recl = None
            for (c, c_next), gain in zip(itertools.pairwise(lengths), steps):
                gains.append(Gain(model, r, c, c_next, gain[model]))
                if recl is None and gain[model] < gain_threshold:
                    recl = c
            recls.append(Recl(model, r, lengths[-1] if recl is None else recl, recl is None))
    return recls, gains
