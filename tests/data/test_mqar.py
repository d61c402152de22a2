"""`synth mqar`: zoology's multi-query associative recall as word-token text, checked from the text alone.

Each episode's bindings are its first 2K words; every later mention of one of its keys is a query
whose next word must be the value bound to it. The marks (token offsets under `tokenizer: words`,
one `<eos>` per line counted; distance; query index; episode) are recomputed from that and must
equal the sidecar exactly.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from longctx.commands.data import main as data_main
from longctx.data.datamodule import LMDataModule
from longctx.data.layout import FarTextLayout
from longctx.data.mqar import MQARSettings, generate
from longctx.data.streams import SegmentStream, StreamMismatch
from longctx.data.synth import load_marks
from longctx.data.text_files import TextFileError
from tests.helpers.methods import tiny as tiny_method

SPLITS = ("train", "valid", "test")
SMALL = dict(pairs=3, keys=40, values=40, filler_vocab=30, train_tokens=6000, eval_tokens=1500)


def answers_from_text(text: str, pairs: int) -> dict[str, np.ndarray]:
    """Every query's answer found in the text: its token offset (words plus one <eos> per line), the
    distance to its binding's value, its index among the episode's queries, its episode."""
    found: dict[str, list[int]] = {"offset": [], "distance": [], "query": [], "episode": []}
    start = 0
    for number, line in enumerate(text.splitlines()):
        words = line.split()
        bound = {words[2 * j]: (words[2 * j + 1], 2 * j + 1) for j in range(pairs)}
        assert all(key.startswith("k") and value.startswith("v") for key, (value, _) in bound.items())
        assert len(bound) == pairs and len({value for value, _ in bound.values()}) == pairs
        queries = [i for i in range(2 * pairs, len(words)) if words[i] in bound]
        assert len(queries) == pairs  # each key asked once
        for n, i in enumerate(queries):
            value, source = bound[words[i]]
            assert words[i + 1] == value  # the answer is the value bound to the key
            found["offset"].append(start + i + 1)
            found["distance"].append(i + 1 - source)
            found["query"].append(n)
            found["episode"].append(number)
        assert queries[-1] + 2 == len(words)  # the episode ends with its last query
        start += len(words) + 1  # the <eos>
    return {key: np.asarray(value) for key, value in found.items()}


def small_mqar_data(tmp_path: Path, **shape: int) -> LMDataModule:
    """`SMALL` episodes (answers 6-20 tokens back) in tmp_path/mqar, read with the words tokenizer."""
    generate(MQARSettings(**SMALL, min_distance=6, max_distance=20), tmp_path / "mqar")
    files = {split: str(tmp_path / "mqar" / f"{split}.txt") for split in SPLITS}
    data = LMDataModule(
        "text_files", files=files, tokenizer="words", cache_dir=str(tmp_path / "cache"), **shape
    )
    data.prepare_data()
    data.setup()
    return data


@pytest.mark.parametrize("low,high", [(6, 20), (30, 60), (9, 9 + 6)])
def test_marks_are_exactly_the_answers_found_in_the_text_and_lie_in_the_range(tmp_path, low, high):
    settings = MQARSettings(**SMALL, min_distance=low, max_distance=high, seed=low)
    generate(settings, tmp_path)
    for split in SPLITS:
        text = (tmp_path / f"{split}.txt").read_text()
        found = answers_from_text(text, settings.pairs)
        marks = load_marks(tmp_path, split)
        for key in ("offset", "distance", "query", "episode"):
            np.testing.assert_array_equal(marks[key], found[key], err_msg=f"{split} {key}")
        assert (marks["pairs"] == settings.pairs).all()
        assert low <= found["distance"].min() and found["distance"].max() <= high
        assert str(marks["tokenizer"]) == "words"
        assert found["offset"][-1] < settings.split_tokens(split) + high + 2 * settings.pairs + 1


def test_marks_point_at_the_answer_tokens_in_the_words_tokenizers_stream(tmp_path):
    data = small_mqar_data(tmp_path, batch_size=2, tgt_len=8)
    vocabulary = (data.corpus.path / "vocab.txt").read_text().split("\n")[:-1]
    for split in SPLITS:
        tokens = data.corpus.split(split).tokens
        words = np.array(vocabulary)[tokens]
        marks = load_marks(tmp_path / "mqar", split)
        # The answer token is a value; the token before it is its key, which the episode bound to it.
        assert all(word.startswith("v") for word in words[marks["offset"]])
        assert all(word.startswith("k") for word in words[marks["offset"] - 1])
        source = marks["offset"] - marks["distance"]
        np.testing.assert_array_equal(tokens[source], tokens[marks["offset"]])
        np.testing.assert_array_equal(tokens[source - 1], tokens[marks["offset"] - 1])


def test_episodes_are_fresh_and_the_seed_decides_every_file(tmp_path):
    """No episode is written twice, within train or across splits; a seed rewrites the same files."""
    # 1 pair, 3 keys x 3 values x distances 2..4, one filler word: 27 distinct episodes, 2-6 tokens.
    tiny = dict(pairs=1, keys=3, values=3, filler_vocab=1, min_distance=2, max_distance=4)
    settings = MQARSettings(**tiny, train_tokens=60, eval_tokens=15)
    generate(settings, tmp_path / "a")
    lines = {split: (tmp_path / "a" / f"{split}.txt").read_text().splitlines() for split in SPLITS}
    every = [line for split in SPLITS for line in lines[split]]
    assert len(set(every)) == len(every) > 15  # drawn at random, most would repeat without the check
    generate(settings, tmp_path / "b")
    generate(MQARSettings(**tiny, train_tokens=60, eval_tokens=15, seed=1), tmp_path / "c")
    for name in [*(f"{s}.txt" for s in SPLITS), *(f"{s}.marks.npz" for s in SPLITS), "synth.json"]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (tmp_path / "a" / "train.txt").read_bytes() != (tmp_path / "c" / "train.txt").read_bytes()
    with pytest.raises(ValueError, match=r"^train: 1000 episodes in a row were written before \(27 distinct"):
        generate(MQARSettings(**tiny, train_tokens=1000), tmp_path / "d")


def test_the_zoology_preset_places_queries_by_the_power_law_in_64_token_episodes(tmp_path):
    """zoology's cell: keys k0..k4094, values v0..v4095, K 4, 64 tokens, random non-query tokens; query
    slot g (key at 8 + 2g, value at 8 + 2g + 1) of 28 drawn with p ∝ (g + 1)^-0.99, without replacement."""
    settings = MQARSettings.preset("zoology", train_tokens=65 * 400, eval_tokens=65 * 20)
    assert (settings.keys, settings.values, settings.pairs, settings.episode_tokens) == (4095, 4096, 4, 64)
    generate(settings, tmp_path)
    lines = (tmp_path / "train.txt").read_text().splitlines()
    assert {len(line.split()) for line in lines} == {64}
    marks = load_marks(tmp_path, "train")
    position = marks["offset"] - 65 * marks["episode"]  # within the episode
    assert (position % 2 == 1).all() and position.min() >= 9 and position.max() <= 63
    words = [line.split() for line in lines]
    for offset, distance, episode in zip(position, marks["distance"], marks["episode"], strict=True):
        line = words[episode]
        assert line[offset] == line[offset - distance] and line[offset - 1] == line[offset - distance - 1]
    slots = (position - 9) // 2
    share = np.bincount(slots, minlength=28) / len(slots)  # of the queries, per slot
    assert share[0] > share[1] > 2 * share[14:].mean() > 0  # the power law: the early slots first
    vocabulary = {word for line in words for word in line}
    assert all(word[0] in "kv" for word in vocabulary) and len(vocabulary) > 4000  # random filler


def test_the_cli_writes_mqar_and_says_how_to_train_on_it(tmp_path, capsys):
    out = tmp_path / "mqar"
    data_main(["synth", "mqar", "--out", str(out), "--train_tokens", "3000", "--eval_tokens", "1000"])
    printed = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [*(f"{s}.txt" for s in SPLITS), *(f"{s}.marks.npz" for s in SPLITS), "synth.json"]
    )
    assert "answers 32-128 tokens after their binding" in printed
    assert printed.strip().endswith("--data.tokenizer words")
    zoology = ["--preset", "zoology", "--pairs", "8", "--train_tokens", "650", "--eval_tokens", "65"]
    data_main(["synth", "mqar", "--out", str(tmp_path / "z"), *zoology])
    settings = json.loads((tmp_path / "z" / "synth.json").read_text())["settings"]
    assert (settings["pairs"], settings["keys"], settings["gap_law"]) == (8, 4095, "zoology")  # a flag wins


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--pairs", "0"], "error: synth: --pairs must be a positive integer, got 0"),
        (["--keys", "3"], "error: synth: --pairs (4) needs as many distinct keys and values per episode"),
        (["--min_distance", "1"], "error: synth: --min_distance (1) must be at least 2 and at most"),
        (
            ["--max_distance", "40"],
            "error: synth: --max_distance must be at least 41 for 4 queries after 4 bindings with "
            "--min_distance 32 (max(min_distance, 2K) + 3K - 3)",
        ),
        (["--gap_law", "zoology"], "error: synth: --gap_law zoology needs an even --episode_tokens"),
        (
            ["--preset", "zoology", "--min_distance", "10"],
            "error: synth: --gap_law zoology places the queries by zoology's power law; --min_distance",
        ),
        (["--episode_tokens", "50"], "error: synth: --episode_tokens (50) must hold the farthest query"),
    ],
)
def test_bad_mqar_settings_are_one_line(tmp_path, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        data_main(["synth", "mqar", "--out", str(Path(tmp_path) / "x"), *flags])
    assert str(exit_info.value.code).startswith(message)
    assert not (Path(tmp_path) / "x").exists()


def test_a_budget_that_reads_the_train_file_twice_is_warned_about(tmp_path):
    """Fresh episodes need a train file of max_steps x batch_size x tgt_len tokens: fit says when not."""
    data = small_mqar_data(tmp_path, batch_size=4, tgt_len=50)
    data.trainer = SimpleNamespace(global_rank=0, world_size=1, accumulate_grad_batches=1)
    per_pass = len(data.stream("train", train=True))  # batches of 4 rows x 50 tokens, the last one short
    assert per_pass == -(-((len(data.corpus.split("train").tokens) - 1) // 4) // 50)  # ceil(row / 50)
    for max_steps, repeats in ((per_pass, False), (per_pass + 1, True)):
        data.trainer.max_steps = max_steps
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            data.train_dataloader()
        said = [str(w.message) for w in caught if "its episodes repeat" in str(w.message)]
        assert bool(said) == repeats
    assert said[0].startswith(f"longctx: trainer.max_steps {per_pass + 1} reads the train file ")


@pytest.mark.parametrize("windows", [1, 3])
def test_training_on_marked_targets_scores_the_answers_alone(tmp_path, windows):
    """`data.train_targets: marked` (zoology's loss on the answers alone): every training target that
    counts is a marked answer (a value after its key), all but the pass's dropped remainder are
    served, the inputs are unchanged, and evaluation still scores every target."""
    generate(MQARSettings(**SMALL, min_distance=6, max_distance=20), tmp_path / "mqar")
    files = {split: str(tmp_path / "mqar" / f"{split}.txt") for split in SPLITS}
    shape = dict(files=files, tokenizer="words", batch_size=2, tgt_len=8, cache_dir=str(tmp_path / "cache"))
    if windows > 1:
        shape |= dict(mode="windows", windows_per_batch=windows)
    data, everything = (
        LMDataModule("text_files", train_targets="marked", **shape),
        LMDataModule("text_files", **shape),
    )
    data.prepare_data()
    data.setup()
    everything.setup()
    words = np.array((data.corpus.path / "vocab.txt").read_text().split("\n")[:-1])
    served = 0
    for chosen, full in zip(
        data.stream("train", train=True), everything.stream("train", train=True), strict=True
    ):
        assert torch.equal(chosen["input"], full["input"]) and not (chosen["mask"] & ~full["mask"]).any()
        answers, keys = chosen["target"][chosen["mask"]].numpy(), chosen["input"][chosen["mask"]].numpy()
        assert all(w.startswith("v") for w in words[answers]) and all(w.startswith("k") for w in words[keys])
        served += int(chosen["mask"].sum())
    marked = len(load_marks(tmp_path / "mqar", "train")["offset"])
    assert marked - 2 * 8 * windows <= served <= marked  # each row drops less than one batch's tokens
    valid, valid_all = (next(iter(d.stream("valid", train=False))) for d in (data, everything))
    assert torch.equal(valid["mask"], valid_all["mask"])


@pytest.mark.parametrize("targets", ["marked", "induction"])
def test_the_share_of_training_answers_bound_within_their_segment(tmp_path, targets):
    """`train_answers_within_segment`: the training answers (the sidecar's, 6-20 tokens after their
    binding; or the rule's, found here by a plain scan of the tokens) bound within their segment, on
    average over the answer's place in it; 0 when every binding lies a segment or more back; None
    when every target trains."""
    generate(MQARSettings(**SMALL, min_distance=6, max_distance=20), tmp_path / "mqar")
    files = {split: str(tmp_path / "mqar" / f"{split}.txt") for split in SPLITS}

    def data_with(tgt_len: int, train_targets: str = targets) -> LMDataModule:
        data = LMDataModule(
            "text_files", files=files, tokenizer="words", batch_size=2, tgt_len=tgt_len,
            train_targets=train_targets, cache_dir=str(tmp_path / "cache"),
        )  # fmt: skip
        data.prepare_data()
        data.setup()
        return data

    data = data_with(16)
    if targets == "marked":
        distance = load_marks(tmp_path / "mqar", "train")["distance"]
    else:  # each target completing a pair seen at most 256 tokens before (no line end in it)
        tokens = data.corpus.split("train").tokens.tolist()
        eos = (data.corpus.path / "vocab.txt").read_text().split("\n").index("<eos>")
        last_seen: dict[tuple[int, int], int] = {}
        distance = []
        for t in range(1, len(tokens)):
            pair = (tokens[t - 1], tokens[t])
            if eos not in pair and pair in last_seen and t - last_seen[pair] <= 256:
                distance.append(t - last_seen[pair])
            last_seen[pair] = t
        distance = np.array(distance)
    expected = np.clip(16 - distance, 0, None).mean() / 16
    assert data.train_answers_within_segment == pytest.approx(expected) and 0 < expected < 1
    if targets == "marked":
        assert data_with(6).train_answers_within_segment == 0.0  # every binding 6 or more tokens back
    assert data_with(16, "all").train_answers_within_segment is None


def test_transformer_xl_reads_the_share_its_data_module_measured(tmp_path):
    """The fact the data module measures is the one Transformer-XL's warm-up reads: on text whose
    every binding lies a segment or more back the fit starts without the warm-up."""
    generate(MQARSettings(**SMALL, min_distance=6, max_distance=20), tmp_path / "mqar")
    files = {split: str(tmp_path / "mqar" / f"{split}.txt") for split in SPLITS}
    data = LMDataModule(
        "text_files", files=files, tokenizer="words", batch_size=2, tgt_len=6, train_targets="marked",
        cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    data.prepare_data()
    data.setup()
    assert data.train_answers_within_segment == 0.0  # every answer 6-20 tokens back
    model = tiny_method("transformer_xl", mem_len=8, mem_warmup_steps=1000, mem_warmup_min_within=0.1)
    model._trainer = SimpleNamespace(datamodule=data)
    model.on_fit_start()
    assert model.mem_warmup_steps == 0


@pytest.mark.parametrize("tgt_len", [6, 16])
def test_far_text_trains_in_its_own_layout(tmp_path, tgt_len, caplog):
    """`data.far_text_layout`: text whose answers lie a segment or more back (6-20 tokens, segments
    of 6: none within) trains in the layout's rows x segments, said in one line; near text (segments
    of 16: a share of 0.23 within) keeps `batch_size` x `windows_per_batch`. The stream serves what
    the module decided."""
    generate(MQARSettings(**SMALL, min_distance=6, max_distance=20), tmp_path / "mqar")
    files = {split: str(tmp_path / "mqar" / f"{split}.txt") for split in SPLITS}
    layout = FarTextLayout(max_within=0.1, batch_size=2, windows_per_batch=4)
    data = LMDataModule(
        "text_files", files=files, tokenizer="words", batch_size=4, windows_per_batch=2, tgt_len=tgt_len,
        train_targets="marked", far_text_layout=layout, cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    data.prepare_data()
    with caplog.at_level("INFO"):
        data.setup()
    far = tgt_len == 6
    assert (data.train_answers_within_segment < 0.1) == far
    rows, segments = (2, 4) if far else (4, 2)
    assert data.train_layout == (rows, segments)
    assert (data.batch_size, data.windows_per_batch) == (4, 2)  # the configured layout stays as set
    assert next(iter(data.stream("train", train=True)))["input"].shape == (rows, segments, tgt_len)
    said = [r.getMessage() for r in caplog.records if "far_text_layout" in r.getMessage()]
    if far:
        assert said == [
            "longctx: 0.0% of the training answers are bound within their segment (under "
            "data.far_text_layout.max_within 10%): training batches of 2 rows x 4 segments "
            "(data.far_text_layout), not 4 x 2"
        ]
    else:
        assert said == []


def test_a_far_text_stream_refuses_another_layout_naming_the_far_setting(tmp_path):
    """A resumed fit whose far layout changed is refused with the setting that decided it
    (`data.far_text_layout.batch_size`), not `data.batch_size`, which did not."""
    generate(MQARSettings(**SMALL, min_distance=6, max_distance=20), tmp_path / "mqar")
    files = {split: str(tmp_path / "mqar" / f"{split}.txt") for split in SPLITS}

    def far_stream(rows: int) -> SegmentStream:
        data = LMDataModule(
            "text_files", files=files, tokenizer="words", batch_size=4, windows_per_batch=2, tgt_len=6,
            train_targets="marked", far_text_layout=FarTextLayout(batch_size=rows, windows_per_batch=4),
            cache_dir=str(tmp_path / "cache"),
        )  # fmt: skip
        data.prepare_data()
        data.setup()
        return data.stream("train", train=True)

    saved = far_stream(2)
    next(iter(saved))
    with pytest.raises(
        StreamMismatch,
        match=r"^the checkpoint's training stream was cut with data\.far_text_layout\.batch_size 2, this run "
        r"has 4: .*; resume with --data\.far_text_layout\.batch_size 2, or start a fresh run",
    ):
        far_stream(4).load_state_dict(saved.state_dict())


def test_the_far_text_layout_needs_answers_and_a_sound_layout():
    with pytest.raises(ValueError, match=r"^data.far_text_layout decides .* needs data.train_targets marked"):
        LMDataModule("text_files", tokenizer="words", far_text_layout=FarTextLayout())
    with pytest.raises(
        ValueError, match=r"^data.far_text_layout.max_within is a share in \(0, 1\], got 0.0$"
    ):
        FarTextLayout(max_within=0.0)
    with pytest.raises(ValueError, match=r"^data.far_text_layout: batch_size and windows_per_batch must"):
        FarTextLayout(windows_per_batch=0)


def test_training_on_marked_targets_needs_marks(tmp_path):
    data = small_mqar_data(tmp_path, batch_size=2, tgt_len=8)
    (tmp_path / "mqar" / "train.marks.npz").unlink()
    marked = LMDataModule(
        "text_files",
        files=data.hparams.files,
        tokenizer="words",
        train_targets="marked",
        batch_size=2,
        tgt_len=8,
        cache_dir=str(tmp_path / "cache"),
    )
    with pytest.raises(TextFileError, match=r"^data.train_targets: marked needs marks for .*train.txt"):
        marked.setup()
    with pytest.raises(ValueError, match="wikitext103 has no marks: drop the option"):
        LMDataModule("wikitext103", train_targets="marked")
