"""Runs that differ only in their seed, as one row: the median and range of each result.

One seed of a phase change is a coin toss (recall jumps after a plateau, at a seed-dependent step),
so a claim about a method is the median and spread of its seeds. `python -m longctx report` groups
the runs whose names differ only in a `_seed<N>` part (the sweeps' convention: `xl`, `xl_seed2`,
`xl_seed3`) and whose configs agree once the seed and the settings that name the run (its folder,
logger name and id, the checkpoint a test read) are set aside; a name group whose configs differ in
anything else is not merged (a note names it), since its median would mix two recipes.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Sequence
from typing import Any

SEED_PART = re.compile(r"_seed\d+")
RUN_NAMING = ("seed_everything", "run_name", "ckpt_path")  # what may differ between seeds of a recipe


def recipe(config: dict[str, Any]) -> Any:
    """The config with the seed and the run's own naming set aside: `RUN_NAMING` removed, and every
    string that holds the run's name (its folder, logger name and id) made the same for every run."""
    name = str(config.get("run_name") or "")
    names = (name, name.replace("/", "-")) if name else ()

    def same(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: same(v) for k, v in value.items() if k not in RUN_NAMING}
        if isinstance(value, list):
            return [same(v) for v in value]
        if isinstance(value, str):
            for own in names:
                value = value.replace(own, "<run>")
        return value

    return same(config)


def seed_groups(runs: Sequence[tuple[str, dict[str, Any]]]) -> tuple[dict[str, list[str]], list[str]]:
    """(group name -> its runs' names, notes) for `runs` given as (name, config): every group of two
    or more runs whose names differ only in `_seed<N>`, with distinct seeds and one recipe."""
    by_name: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for name, config in runs:
        by_name.setdefault(SEED_PART.sub("", name), []).append((name, config))
    groups, notes = {}, []
    for group, members in by_name.items():
        if len(members) < 2:
            continue
        seeds = [config.get("seed_everything") for _, config in members]
        names = ", ".join(name for name, _ in members)
        if len(set(map(str, seeds))) < len(seeds):
            notes.append(f"- over seeds: not merged ({names}): two runs share a seed")
        elif any(recipe(config) != recipe(members[0][1]) for _, config in members[1:]):
            notes.append(f"- over seeds: not merged ({names}): their configs differ beyond the seed")
        else:
            groups[group] = [name for name, _ in members]
    return groups, notes


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    """Median, min and max of the recorded values (None where none is)."""
    found = [v for v in values if v is not None]
    if not found:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(found), "min": min(found), "max": max(found)}


def seed_rows(
    groups: dict[str, list[str]],
    rows: dict[str, dict[str, Any]],
    columns: Sequence[str],
    listed: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """One row per group: `group`, `seeds` (its runs), `finished` and, per result column, `<column>`
    (the median), `<column>_min` and `<column>_max` over its finished runs (a diverged or unfinished
    seed is counted in `seeds`, never silently in a median). `listed` columns give every run's value
    in the group's order instead (e.g. the steps to an accuracy, where ">8000" is not a number)."""
    table = []
    for group, names in groups.items():
        done = [name for name in names if rows[name].get("status") == "finished"]
        row: dict[str, Any] = {"group": group, "seeds": len(names), "finished": len(done)}
        for column in listed:
            row[column] = ", ".join(
                "-" if rows[name].get(column) is None else str(rows[name][column]) for name in names
            )
        for column in columns:
            s = spread([rows[name].get(column) for name in done])
            row.update({column: s["median"], f"{column}_min": s["min"], f"{column}_max": s["max"]})
        table.append(row)
    return table


def markdown(
    table: Sequence[dict[str, Any]],
    columns: Sequence[str],
    show: Callable[[float], str],
    listed: Sequence[str] = (),
) -> str:
    """`median (min-max)` per column, then the `listed` columns' values per run; a dash where no run of
    the group recorded it."""
    heads = [*listed, *columns]
    lines = ["| group | seeds | finished | " + " | ".join(heads) + " |", "|" + "---|" * (len(heads) + 3)]
    for row in table:
        cells = [row[c] for c in listed] + [
            "-" if row[c] is None else f"{show(row[c])} ({show(row[c + '_min'])}-{show(row[c + '_max'])})"
            for c in columns
        ]
        lines.append(f"| {row['group']} | {row['seeds']} | {row['finished']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def to_csv(table: Sequence[dict[str, Any]], columns: Sequence[str], listed: Sequence[str] = ()) -> str:
    header = ["group", "seeds", "finished", *listed]
    header += [f"{c}{part}" for c in columns for part in ("", "_min", "_max")]
    lines = [",".join(header)]
    quote = lambda value: f'"{value}"' if "," in value else value  # noqa: E731 (a listed cell)
    lines += [",".join("" if row[h] is None else quote(str(row[h])) for h in header) for row in table]
    return "\n".join(lines) + "\n"
