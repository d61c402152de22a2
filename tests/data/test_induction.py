"""`data.train_targets: induction`: recall answers read off a text that has no marks sidecar.

The rule (`longctx.data.induction`) against a count by hand; on `synth mqar` text it finds every
sidecar answer with its distance, and nothing but targets that repeat a pair; a data module on text
without sidecars trains on those targets and scores them at evaluation, as `marked` does with marks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from longctx.data.datamodule import LMDataModule
from longctx.data.induction import MAX_QUERIES_PER_LINE, induction_marks
from longctx.data.mqar import MQARSettings, generate
from longctx.data.synth import load_marks
from longctx.data.text_files import TextFileError

SPLITS = ("train", "valid", "test")


def marks_by_hand(tokens: list[int], window: int, eos: int) -> tuple[list[int], list[int], list[int]]:
    """Offsets, distances and in-line query indices, by scanning every earlier pair."""
    offsets, distances, queries, line, in_line = [], [], [], 0, 0
    for t in range(1, len(tokens)):
        if tokens[t - 1] == eos:
            line, in_line = line + 1, 0
        if eos in (tokens[t - 1], tokens[t]):
            continue
        earlier = [s for s in range(1, t) if (tokens[s - 1], tokens[s]) == (tokens[t - 1], tokens[t])]
        if earlier and t - earlier[-1] <= window:
            offsets.append(t)
            distances.append(t - earlier[-1])
            queries.append(in_line)
            in_line += 1
    return offsets, distances, queries


@pytest.mark.parametrize("seed", range(4))
def test_the_rule_equals_a_scan_of_every_earlier_pair(seed):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 6, size=400)  # a small vocabulary: many repeats, near and far; 0 is <eos>
    for window in (1, 7, 50, 1000):
        marks = induction_marks(tokens, window, eos_id=0)
        offsets, distances, queries = marks_by_hand(tokens.tolist(), window, eos=0)
        assert marks.offset.tolist() == offsets and marks.distance.tolist() == distances
        assert marks.query.tolist() == queries
    assert induction_marks(tokens, 7).query is None  # without line ends: no query order


def test_lines_that_are_not_episodes_give_no_query_order():
    """A whole recall text on one line: its "first query" would be one answer per file."""
    episode = [1, 2, 3, 4, 1, 2, 3, 4]  # two bindings asked again: answers 2, 3 (a repeated pair) and 4
    one_line = np.array(episode * 200 + [0])
    assert len(induction_marks(one_line, 4, eos_id=0).offset) > MAX_QUERIES_PER_LINE
    assert induction_marks(one_line, 4, eos_id=0).query is None
    lines = np.array([*episode, 0] * 200)
    assert set(induction_marks(lines, 4, eos_id=0).query.tolist()) == {0, 1, 2}


def tokens_of(text: str) -> np.ndarray:
    """The words tokenizer's stream (one `<eos>` per line) with ids of first appearance, `<eos>` = 0."""
    ids = {"<eos>": 0}
    return np.array(
        [ids.setdefault(w, len(ids)) for line in text.splitlines() for w in [*line.split(), "<eos>"]]
    )


@pytest.mark.parametrize("gap_law", ["uniform", "zoology"])
def test_on_mqar_text_it_finds_every_answer_and_only_repeated_pairs(tmp_path, gap_law):
    shape = dict(pairs=4, keys=64, values=64, train_tokens=3000, eval_tokens=3000)
    if gap_law == "zoology":
        shape |= dict(
            gap_law="zoology", episode_tokens=32, filler="random", min_distance=None, max_distance=None
        )
    generate(MQARSettings(**shape), tmp_path)
    text = (tmp_path / "valid.txt").read_text()
    tokens, sidecar = tokens_of(text), load_marks(tmp_path, "valid")
    marks = induction_marks(tokens, window=128, eos_id=0)
    found = np.isin(marks.offset, sidecar["offset"])
    assert found.sum() == len(sidecar["offset"])  # every answer
    assert np.array_equal(marks.distance[found], sidecar["distance"])
    extra = marks.offset[~found]  # the rest repeat a pair by chance (a query after the one before it)
    first_in_line = marks.offset[marks.query == 0]
    first_query = np.isin(first_in_line, sidecar["offset"][sidecar["query"] == 0])
    assert first_query.mean() > 0.9 and np.isin(first_in_line[~first_query], extra).all()
    assert all(
        any((tokens[s - 1], tokens[s]) == (tokens[t - 1], tokens[t]) for s in range(max(1, t - 128), t))
        for t in extra
    )


def text_files_without_marks(tmp_path: Path, **options) -> LMDataModule:
    generate(
        MQARSettings(pairs=3, keys=40, values=40, train_tokens=6000, eval_tokens=1500), tmp_path / "mqar"
    )
    for sidecar in (tmp_path / "mqar").glob("*.marks.npz"):
        sidecar.rename(sidecar.with_suffix(".kept"))  # another generator's text: no sidecar
    files = {split: str(tmp_path / "mqar" / f"{split}.txt") for split in SPLITS}
    data = LMDataModule(
        "text_files",
        files=files,
        tokenizer="words",
        batch_size=2,
        tgt_len=8,
        cache_dir=str(tmp_path),
        **options,
    )
    data.prepare_data()
    data.setup()
    return data


def test_a_text_without_marks_trains_and_is_scored_on_its_answers(tmp_path):
    data = text_files_without_marks(tmp_path, train_targets="induction", induction_window=256)
    answers = np.load(tmp_path / "mqar" / "train.marks.kept", allow_pickle=False)["offset"]
    scored = np.flatnonzero(data._train_scored)
    assert np.isin(answers, scored).all() and len(scored) < 1.2 * len(answers)
    for split in ("valid", "test"):
        sidecar = np.load(tmp_path / "mqar" / f"{split}.marks.kept")
        marks = data.target_marks(split)
        assert marks is not None and np.isin(marks.offset, sidecar["offset"]).mean() > 0.8
        assert marks.query is not None and marks.query.min() == 0  # lines are episodes: <eos> was found
    served = sum(int(batch["mask"].sum()) for batch in data.stream("train", train=True))
    assert len(scored) - 2 * 8 <= served <= len(scored)  # each row drops less than one batch's tokens


def test_induction_reads_words_of_ones_own_files_only():
    with pytest.raises(ValueError, match=r"^data.train_targets: induction marks repeated pairs of words"):
        LMDataModule("wikitext103", train_targets="induction")
    with pytest.raises(ValueError, match="induction_window must be a positive integer"):
        LMDataModule("text_files", tokenizer="words", train_targets="induction", induction_window=0)


def test_a_text_with_no_repeated_pair_is_refused_in_one_line(tmp_path):
    files = {}
    for split in SPLITS:  # every word new: no pair of words occurs twice
        files[split] = tmp_path / f"{split}.txt"
        files[split].write_text("\n".join(" ".join(f"{split}{i}_{j}" for j in range(10)) for i in range(60)))
    data = LMDataModule(
        "text_files",
        files={split: str(file) for split, file in files.items()},
        tokenizer="words",
        train_targets="induction",
        batch_size=2,
        tgt_len=8,
        cache_dir=str(tmp_path / "cache"),
    )
    data.prepare_data()
    with pytest.raises(TextFileError, match=r"^data.train_targets: induction found no target of .*train.txt"):
        data.setup()
