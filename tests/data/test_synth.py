"""Synthetic long-range tasks: reproducible, and marked exactly where the answer lies >= G back.

The marks are recomputed here from the text alone: for every answer (a passage after `again:` or
`recall:`, a value after `so the KEY is`), search backwards for the most recent earlier mention of
the same passage (`: PASSAGE.`) or key (`the KEY is `); its distance decides the mark.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from longctx.commands.data import main as data_main
from longctx.data.datamodule import LMDataModule
from longctx.data.synth import INITIAL_WORDS, WORDS, SynthSettings, generate, load_marks, marked_tokens
from longctx.data.tokenize import gpt2_files, gpt2_tokenizer_from_files
from tests.helpers.environment import shared_dir, skip_without_shared

SPLITS = ("train", "valid", "test")


def answers_by_backward_search(text: bytes, task: str) -> tuple[list[int], list[int]]:
    """(offset, distance) of every answer byte, found from the text alone."""
    offsets: list[int] = []
    distances: list[int] = []
    if task == "copy":
        for match in re.finditer(rb"(again|recall): ([a-z ]+)\.", text):
            passage = match.group(2)
            source = text.rfind(b": " + passage + b".", 0, match.start(2) - 2) + 2
            assert source >= 2, f"passage {passage!r} at {match.start(2)} was never written before"
            offsets += range(match.start(2), match.end(2))
            distances += [match.start(2) - source] * len(passage)
    else:
        for match in re.finditer(rb"so the ([a-z]+) is ([a-z]+)\.", text):
            key, value = match.group(1), match.group(2)
            mention = text.rfind(b"the " + key + b" is ", 0, match.start(1) - 4)
            assert mention >= 0 and text[mention - 1 : mention] in (b"", b" ", b"\n")
            source = mention + len(b"the " + key + b" is ")
            assert text[source : source + len(value) + 1] == value + b"."  # the query's answer is determined
            offsets += range(match.start(2), match.end(2))
            distances += [match.start(2) - source] * len(value)
    return offsets, distances


def assert_marks_are_the_far_answers(out: Path, task: str, gap: int, near_repeat: bool) -> None:
    """Every split's sidecar holds exactly the answer bytes the backward search finds >= gap back."""
    for split in SPLITS:
        text = (out / f"{split}.txt").read_bytes()
        assert text.isascii() and text.endswith(b".\n")
        offsets, distances = answers_by_backward_search(text, task)
        offsets, distances = np.asarray(offsets), np.asarray(distances)
        far = distances >= gap
        marks = load_marks(out, split)
        assert int(marks["gap"]) == gap
        assert np.array_equal(marks["offset"], offsets[far]) and np.array_equal(
            marks["distance"], distances[far]
        )
        assert np.array_equal(marks["near_offset"], offsets[~far])
        assert np.array_equal(marks["near_distance"], distances[~far])
        assert far.sum() > 0 and (far.sum() < len(far)) == near_repeat
        # every marked byte repeats its source byte
        assert all(text[i] == text[i - d] for i, d in zip(marks["offset"], marks["distance"], strict=True))


@pytest.mark.parametrize("task", ["copy", "recall"])
@pytest.mark.parametrize("gap,near_repeat", [(160, True), (40, True), (300, False)])
def test_marks_are_exactly_the_answer_bytes_whose_source_is_at_least_gap_back(
    tmp_path, task, gap, near_repeat
):
    settings = SynthSettings(task, gap=gap, train_bytes=6_000, eval_bytes=3_000, near_repeat=near_repeat)
    counts = generate(settings, tmp_path)
    for split in SPLITS:
        assert (tmp_path / f"{split}.txt").stat().st_size == counts[split]["bytes"]
    assert_marks_are_the_far_answers(tmp_path, task, gap, near_repeat)


@pytest.mark.parametrize("vocab,recalls,near_repeat", [(2, 4, True), (5, 1, True), (3, 3, False)])
def test_copy_of_a_few_words_recalled_several_times_is_marked_exactly(tmp_path, vocab, recalls, near_repeat):
    """`--passage_vocab N`: passages only from the first N one-per-initial-letter words, every one of
    them used; `--recalls K`: K recalls per episode, each marked against the copy just before it."""
    flags = ["--gap", "36", "--passage_words", "1", "--passage_vocab", str(vocab), "--recalls", str(recalls)]
    flags += ["--train_bytes", "6000", "--eval_bytes", "3000"] + ([] if near_repeat else ["--no_near_repeat"])
    data_main(["synth", "copy", "--out", str(tmp_path), *flags])
    assert_marks_are_the_far_answers(tmp_path, "copy", 36, near_repeat)
    text = (tmp_path / "train.txt").read_text()
    passages = re.findall(r"remember: ([a-z]+)\.", text)
    assert set(passages) == set(INITIAL_WORDS[:vocab]) and len({word[0] for word in INITIAL_WORDS}) == 25
    assert all(line.count("recall: ") == recalls for line in text.splitlines())


def test_the_same_seed_writes_the_same_files_and_another_seed_others(tmp_path):
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        generate(SynthSettings("recall", seed=seed, train_bytes=2_000, eval_bytes=1_000), tmp_path / name)
    for split in SPLITS:
        for suffix in (".txt", ".marks.npz"):
            a, b, c = ((tmp_path / name / f"{split}{suffix}").read_bytes() for name in "abc")
            assert a == b and a != c
    train, valid = ((tmp_path / "a" / f"{s}.txt").read_bytes() for s in ("train", "valid"))
    assert train[:200] != valid[:200]  # each split has its own stream


def test_words_are_plain_lower_case_and_no_cue(tmp_path):
    assert len(set(WORDS)) == len(WORDS) >= 256
    assert all(re.fullmatch(r"[a-z]{3,8}", word) for word in WORDS)
    assert not {"remember", "again", "recall", "so", "the", "is"} & set(WORDS)


def test_synth_files_read_as_bytes_token_i_is_byte_i(tmp_path):
    generate(SynthSettings("copy", train_bytes=4_000, eval_bytes=2_000), tmp_path)
    files = {split: str(tmp_path / f"{split}.txt") for split in SPLITS}
    data = LMDataModule("text_files", files=files, tokenizer="bytes", cache_dir=str(tmp_path / "cache"))
    data.prepare_data()
    data.setup()
    tokens = data.corpus.split("test").tokens
    marks = load_marks(tmp_path, "test")
    assert np.array_equal(marked_tokens(marks["offset"], data.corpus.token_bytes[tokens]), marks["offset"])


@skip_without_shared("data", "gpt2")
def test_synth_files_read_in_gpt2_bpe_and_marks_map_to_word_tokens(tmp_path):
    generate(SynthSettings("recall", train_bytes=4_000, eval_bytes=2_000), tmp_path)
    gpt2 = shared_dir() / "data" / "gpt2"
    files = {split: str(tmp_path / f"{split}.txt") for split in SPLITS}
    data = LMDataModule(
        "text_files",
        files=files,
        tokenizer=str(gpt2),
        cache_dir=str(tmp_path / "cache"),
        batch_size=4,
        tgt_len=64,
    )
    data.prepare_data()
    data.setup()
    tokens = data.corpus.split("valid").tokens
    tokenizer = gpt2_tokenizer_from_files(*gpt2_files(gpt2))
    text = (tmp_path / "valid.txt").read_text()
    assert tokenizer.decode(tokens.tolist()) == text
    marks = load_marks(tmp_path, "valid")
    marked = marked_tokens(marks["offset"], data.corpus.token_bytes[tokens])
    values = {value for value in re.findall(r"so the [a-z]+ is ([a-z]+)\.", text)}
    pieces = {tokenizer.decode([int(tokens[i])]).strip() for i in marked}
    assert 0 < len(marked) < len(marks["offset"])
    assert all(any(piece in value for value in values) for piece in pieces)


def test_marked_tokens_of_bytes_beyond_the_text_is_an_error():
    with pytest.raises(ValueError, match="beyond the tokens' text"):
        marked_tokens(np.array([5]), [2, 3])


def test_the_cli_writes_the_task_and_says_how_to_train_on_it(tmp_path, capsys):
    out = tmp_path / "copy"
    data_main(
        ["synth", "copy", "--out", str(out), "--gap", "100", "--train_bytes", "3000", "--eval_bytes", "1000"]
    )
    printed = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [*(f"{s}.txt" for s in SPLITS), *(f"{s}.marks.npz" for s in SPLITS), "synth.json"]
    )
    assert f"--data.files '{{train: {out / 'train.txt'}, valid: {out / 'valid.txt'}" in printed
    assert int(load_marks(out, "train")["distance"].min()) >= 100


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--gap", "0"], "error: synth: --gap must be a positive integer, got 0"),
        (["--pairs", "500"], "error: synth: --pairs must be at most 139 (half the word list)"),
        (
            ["--passage_vocab", "26"],
            "error: synth: --passage_vocab must be in [1, 25] (one word per initial letter), got 26",
        ),
        (["--recalls", "0"], "error: synth: --recalls must be a positive integer, got 0"),
        (["--recalls", "2"], "error: synth: --passage_vocab and --recalls are for the copy task"),
    ],
)
def test_bad_synth_settings_are_one_line(tmp_path, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        data_main(["synth", "recall", "--out", str(Path(tmp_path) / "x"), *flags])
    assert exit_info.value.code == message
