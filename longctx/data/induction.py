"""Recall answers read off any token text: the targets that complete a pair of tokens seen shortly before.

An associative-recall text binds a key to a value (`... k7 v95 ...`) and later asks the key again
(`... k7` -> `v95`): the answer is the second token of a pair `(previous token, target)` that occurred
earlier. That is the pattern an induction head completes ([A][B] ... [A] -> [B]; Olsson et al. 2022,
"In-context Learning and Induction Heads", §2), and it needs no knowledge of the text's format: which
words are keys, which are values, where the episodes start. So a text without a marks sidecar (one
written by another generator than `python -m longctx.data synth`) still has its answers:

    target t is marked  <=>  (tokens[t-1], tokens[t]) == (tokens[s-1], tokens[s]) for some s < t
                             with t - s <= window,

its `distance` t - s to the nearest such s (as `synth` counts: the answer's offset minus the bound
value's), and its `query` the order of the mark within its line (`synth` writes one episode per
line; the `words` tokenizer ends each line with `<eos>`). Pairs with `<eos>` in them are line ends, not
bindings, and are never marked. A text whose lines are not episodes (a line with more than
`MAX_QUERIES_PER_LINE` answers, e.g. a whole file on one line) gets no query order: its "first
query" would be one answer per file.

On `synth mqar` text the rule finds the sidecar's answers and a few chance repeats besides (a filler
pair seen again within the window): `tests/data/test_induction.py` counts them.
"""

from __future__ import annotations

import numpy as np

from longctx.core.recall import TargetMarks

MAX_QUERIES_PER_LINE = 256  # more answers in one line than a recall episode asks: lines are not episodes


def induction_marks(tokens: np.ndarray, window: int, eos_id: int | None = None) -> TargetMarks:
    """The targets of `tokens` (n,) that complete a pair seen at most `window` tokens before.

    Returns TargetMarks: `offset` (sorted target indices), `distance` (t - s, the nearest earlier
    occurrence), and `query` (index of the mark within its line, counted from `<eos>` to `<eos>`) when
    `eos_id` is given and the lines are episodes, else None.
    """
    if window < 1:
        raise ValueError(f"data.induction_window must be a positive number of tokens, got {window}")
    tokens = np.asarray(tokens, dtype=np.int64)
    n = len(tokens)
    if n < 2:
        none = np.zeros(0, np.int64)
        return TargetMarks(none, None if eos_id is None else none, none)
    vocab = int(tokens.max()) + 1
    pair = tokens[:-1] * vocab + tokens[1:]  # (n-1,): pair[i] ends at target i + 1
    order = np.argsort(pair, kind="stable")  # equal pairs in text order
    same = pair[order[1:]] == pair[order[:-1]]
    previous = np.full(n - 1, -1, np.int64)  # the latest earlier index of the same pair, or -1
    previous[order[1:][same]] = order[:-1][same]
    t = np.arange(1, n, dtype=np.int64)
    distance = t - (previous + 1)
    marked = (previous >= 0) & (distance <= window)
    if eos_id is not None:
        marked &= (tokens[:-1] != eos_id) & (tokens[1:] != eos_id)
    offset, distance = t[marked], distance[marked]
    if eos_id is None:
        return TargetMarks(offset, None, distance)
    line = np.cumsum(tokens == eos_id)[offset - 1]  # lines ended before each mark's target
    first_of_line = np.r_[True, line[1:] != line[:-1]]
    start = np.maximum.accumulate(np.where(first_of_line, np.arange(len(offset)), 0))
    query = np.arange(len(offset), dtype=np.int64) - start
    if query.size and query.max() >= MAX_QUERIES_PER_LINE:
        return TargetMarks(offset, None, distance)
    return TargetMarks(offset, query, distance)
