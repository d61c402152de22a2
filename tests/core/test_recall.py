"""Recall accuracy (`longctx.core.recall`): each method's per-target correctness is the argmax of its
full predicted distribution, and the logged accuracies are the plain shares of the marked targets.

The reference for "argmax of the full log-probabilities" is method-blind: the method's own `step` is
run once per candidate token v with every target set to v, from the same memory, and the target is
correct iff no candidate has a lower NLL (ties go to the lowest id, as `argmax`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from torch import Tensor, nn

from longctx.callbacks.token_nll import TokenNLLWriter
from longctx.core.base import LMBase, StepOutput
from longctx.core.recall import RecallScorer, TargetMarks
from longctx.data import mqar
from longctx.data.datamodule import LMDataModule
from longctx.data.streams import contiguous_rows
from longctx.data.synth import SynthSettings, generate, load_marks
from longctx.data.text_files import TextFileError
from tests.data.test_mqar import SMALL
from tests.helpers.lm_fixtures import SyntheticData, WindowData, cpu_trainer
from tests.helpers.methods import TINY, VOCAB, tiny

MQAR_SMALL = {**SMALL, "min_distance": 6, "max_distance": 20, "train_tokens": 3000, "eval_tokens": 1000}
SMALL_VOCAB = 12  # candidates the reference runs the step for
ADAPTIVE = {"network": {"cutoffs": [4, 7], "div_val": 2}}  # a head of 4 words, tail clusters of 3 and 5
SLOW = pytest.mark.slow  # the same argmax code as a fast case (XL's adaptive softmax, its TRAMS, RPE)
METHODS = {
    **{name: (method.build, method.data) for name, method in TINY.items()},
    "transformer_xl_adaptive_softmax": (lambda **k: tiny("transformer_xl", **ADAPTIVE, **k), SyntheticData),
    "compressive_adaptive_softmax": (
        lambda **k: tiny("compressive_transformer", **ADAPTIVE, **k),
        SyntheticData,
    ),
    "trams": (
        lambda **k: tiny("transformer_xl", protocol="trams", trams={"attended": 8, "kept": 4}, **k),
        SyntheticData,
    ),
    "rpe": (lambda **k: tiny("transformer_xl", mem_len=0, **k), SyntheticData),
    "gpt2_window": (lambda **k: tiny("recurrence", recurrence=False, **k), WindowData),
    "recurrence_chunked_head": (lambda **k: tiny("recurrence", loss_chunk=5, **k), WindowData),
}


@pytest.mark.parametrize(
    "method",
    [
        pytest.param(name, marks=SLOW) if name in ("compressive_adaptive_softmax", "trams", "rpe") else name
        for name in METHODS
    ],
)
def test_every_methods_correctness_is_the_argmax_of_its_full_log_probabilities(method):
    build, data_class = METHODS[method]
    pl.seed_everything(0)
    model = build(vocab_size=SMALL_VOCAB).eval()
    data = data_class(n_tokens=200, eval_batch_size=3, seq_len=16)
    data.tokens %= SMALL_VOCAB
    data.trainer = SimpleNamespace(global_rank=0, world_size=1)
    first, second = list(zip(range(2), data.val_dataloader(), strict=False))
    with torch.no_grad():
        memory = model.step(first[1], model.init_memory(3)).memory  # the second batch reads a memory
        batch, target = second[1], second[1]["target"]
        model.wants_correct = True
        out = model.step(batch, memory)
        model.wants_correct = False
        candidates = [torch.full_like(target, v) for v in range(SMALL_VOCAB)]
        nll_of = torch.stack([model.step({**batch, "target": v}, memory).nll for v in candidates], -1)
    torch.testing.assert_close(nll_of.gather(-1, target[..., None])[..., 0], out.nll)  # the same memory
    real = batch["offset"] >= 0
    assert out.correct.dtype == torch.bool and out.correct.shape == target.shape
    assert torch.equal(out.correct[real], (nll_of.argmin(-1) == target)[real])
    assert 0 < out.correct[real].sum() < real.sum()  # neither all right nor all wrong: a real check
    assert model.step(batch, memory).correct is None  # not asked: not computed


class TableLM(LMBase):
    """A stand-in whose target at offset o is correct iff `hits[o]`: any accuracy pattern on demand."""

    def __init__(self, hits: np.ndarray) -> None:
        super().__init__(vocab_size=VOCAB)
        self.hits = torch.from_numpy(hits)
        self.unused = nn.Parameter(torch.zeros(()))

    def step(self, batch: dict[str, Tensor], memory: None) -> StepOutput:
        correct = self.hits[batch["offset"].clamp_min(0)] if self.wants_correct else None
        return StepOutput(nll=torch.ones_like(batch["target"], dtype=torch.float32), correct=correct)


def test_elimination_scores_one_over_k_then_more_and_only_the_first_query_shows_it(tmp_path):
    """12 episodes of K = 4 queries; a model that only eliminates the values already asked gets query
    i right in 1/(K - i) of the episodes: 3, 4, 6 and 12 of 12. Overall 25/48 ≈ 0.52; first 1/4."""
    K, episodes = 4, 12
    offset = 20 + 7 * np.arange(episodes * K)  # one answer every 7 tokens
    query = np.tile(np.arange(K), episodes)
    episode = np.repeat(np.arange(episodes), K)
    hits = np.zeros(1003, bool)
    hits[offset] = episode < episodes // (K - query)
    data = SyntheticData(n_tokens=1003, eval_batch_size=4, marks=TargetMarks(offset, query))
    metrics = cpu_trainer(tmp_path).validate(TableLM(hits), datamodule=data, verbose=False)[0]
    assert metrics["val/recall_acc"] == pytest.approx(25 / 48)
    assert metrics["val/recall_acc_first"] == pytest.approx(1 / 4)
    assert [metrics[f"val/recall_acc_q{i}"] for i in range(K)] == pytest.approx([1 / 4, 1 / 3, 1 / 2, 1])
    assert metrics["val/recall_answers"] == episodes * K


def test_marked_targets_that_were_not_scored_do_not_count():
    """The scorer reads the mask a method scored with (e.g. the TRAMS protocol's) and the padding."""
    scorer = RecallScorer(TargetMarks(np.array([1, 2, 3, 5]), np.array([0, 1, 0, 1])), torch.device("cpu"))
    offset = torch.tensor([[1, 2, 3], [4, 5, -1]])
    mask = torch.tensor([[True, False, True], [True, True, False]])
    correct = torch.tensor([[True, True, False], [True, True, True]])
    scorer.update(correct, mask, offset)  # scored and marked: offsets 1 (q0, hit), 3 (q0, miss), 5 (q1, hit)
    results = scorer.results("test")
    assert results == {
        "test/recall_acc": 2 / 3,
        "test/recall_answers": 3.0,
        "test/recall_acc_q0": 0.5,
        "test/recall_acc_q1": 1.0,
        "test/recall_acc_first": 0.5,
    }
    assert scorer.results("test") == {}  # reset after reading
    without_queries = RecallScorer(TargetMarks(np.array([1, 3])), torch.device("cpu"))
    without_queries.update(correct, mask, offset)
    assert without_queries.results("val") == {"val/recall_acc": 0.5, "val/recall_answers": 2.0}


def test_a_method_that_cannot_say_its_argmax_is_an_error_on_marked_text(tmp_path):
    class Silent(TableLM):
        def step(self, batch, memory):
            return StepOutput(nll=torch.ones_like(batch["target"], dtype=torch.float32))

    data = SyntheticData(n_tokens=200, marks=TargetMarks(np.array([5, 9])))
    with pytest.raises(NotImplementedError, match=r"^Silent\.step returned no StepOutput\.correct"):
        cpu_trainer(tmp_path).validate(Silent(np.zeros(200, bool)), datamodule=data, verbose=False)


# ------------------------------------------------------------------ the marks of text files
def text_files_data(folder: Path, tokenizer: str, cache: Path) -> LMDataModule:
    files = {split: str(folder / f"{split}.txt") for split in ("train", "valid", "test")}
    data = LMDataModule(
        "text_files", files=files, tokenizer=tokenizer, cache_dir=str(cache), batch_size=2, tgt_len=8
    )
    data.prepare_data()
    data.setup()
    return data


def bound_in_row(sidecar: dict, n_tokens: int, n_rows: int) -> np.ndarray:
    """(M,) bool, by hand: each answer's evaluation row from the stream's own layout, and whether
    the token it recalls is one of that row's (a row starts mid-text with an empty memory)."""
    rows = [row[0] for row in contiguous_rows(n_tokens, n_rows, pad=True) if row]
    keep = []
    for offset, distance in zip(sidecar["offset"], sidecar["distance"]):
        start = next(start for start, end in rows if start < offset < end)  # its targets: start+1 .. end-1
        keep.append(offset - distance >= start)
    return np.array(keep)


def test_the_data_module_reads_the_marks_beside_each_evaluation_file_in_its_token_unit(tmp_path, caplog):
    """Every answer whose binding lies in its evaluation row is a mark; one bound before the row's
    first token is out of every model's reach, left out and counted in one line."""
    mqar.generate(mqar.MQARSettings(**MQAR_SMALL), tmp_path / "mqar")
    with caplog.at_level(logging.INFO):
        words = text_files_data(tmp_path / "mqar", "words", tmp_path / "cache")
    left_out = 0
    for split in ("valid", "test"):
        marks, sidecar = words.target_marks(split), load_marks(tmp_path / "mqar", split)
        reachable = bound_in_row(sidecar, len(words.corpus.split(split).tokens), words.eval_batch_size)
        left_out += int((~reachable).sum())
        np.testing.assert_array_equal(marks.offset, sidecar["offset"][reachable])
        np.testing.assert_array_equal(marks.query, sidecar["query"][reachable])
        np.testing.assert_array_equal(marks.distance, sidecar["distance"][reachable])
        if not reachable.all():
            assert (
                f"longctx: text_files {split} split: {(~reachable).sum()} of {reachable.size} answers are "
                "bound before the first token of their evaluation row (2 rows, each starting with an empty "
                f"memory): recall accuracy counts the {reachable.sum()} others"
            ) in caplog.text
    assert left_out > 0  # the case is exercised
    generate(SynthSettings("copy", gap=36, train_bytes=2000, eval_bytes=1000), tmp_path / "copy")
    as_bytes = text_files_data(tmp_path / "copy", "bytes", tmp_path / "cache")
    copy_marks = load_marks(tmp_path / "copy", "test")
    reachable = bound_in_row(copy_marks, len(as_bytes.corpus.split("test").tokens), as_bytes.eval_batch_size)
    np.testing.assert_array_equal(as_bytes.target_marks("test").offset, copy_marks["offset"][reachable])
    assert as_bytes.target_marks("test").query is None  # copy has no queries: recall_acc only
    assert words.target_marks("train") is None  # training is never scored
    # Byte offsets mean nothing to a run that reads words: no accuracy, and a line says why.
    assert text_files_data(tmp_path / "copy", "words", tmp_path / "cache").target_marks("valid") is None
    assert "marks bytes offsets and this run reads data.tokenizer words" in caplog.text


def test_marks_of_another_text_are_refused_at_setup(tmp_path):
    mqar.generate(mqar.MQARSettings(**MQAR_SMALL), tmp_path / "a")
    mqar.generate(mqar.MQARSettings(**MQAR_SMALL, seed=1), tmp_path / "b")
    (tmp_path / "a" / "test.marks.npz").write_bytes((tmp_path / "b" / "test.marks.npz").read_bytes())
    with pytest.raises(
        TextFileError, match=r"test\.marks\.npz marks another text than .*test\.txt \(its text_blake2b"
    ):
        text_files_data(tmp_path / "a", "words", tmp_path / "cache")
    # A sidecar that records no digest (written before it was kept) is checked against the token count.
    generate(SynthSettings("copy", gap=36, train_bytes=2000, eval_bytes=1000), tmp_path / "copy")
    with np.load(tmp_path / "copy" / "valid.marks.npz") as marks:
        old = {key: marks[key] for key in ("offset", "distance", "near_offset", "near_distance", "gap")}
    old["offset"] = old["offset"] + 10_000
    np.savez(tmp_path / "copy" / "valid.marks.npz", **old)
    with pytest.raises(
        TextFileError,
        match=r"valid\.marks\.npz marks offset .* but .*valid\.txt has .* tokens: the marks belong",
    ):
        text_files_data(tmp_path / "copy", "bytes", tmp_path / "cache")


# ------------------------------------------------------------------ state size
def carried_numbers(model: LMBase, data_class: type[SyntheticData]) -> list[int]:
    """Per layer, the numbers one row carries into the next segment after three evaluation batches."""
    data = data_class(n_tokens=400, eval_batch_size=2, seq_len=16)
    data.trainer = SimpleNamespace(global_rank=0, world_size=1)
    memory = model.eval().init_memory(2)
    with torch.no_grad():
        for _, batch in zip(range(3), data.val_dataloader(), strict=False):
            memory = model.step(batch, memory).memory
    if memory is None:
        return [0]
    if hasattr(memory, "h_prev"):  # the recurrent GPT-2's one vector
        return [0 if memory.h_prev is None else memory.h_prev[0].numel()]
    if hasattr(memory, "compressed"):
        return [h[0].numel() + c[0].numel() for h, c in zip(memory.hidden, memory.compressed, strict=True)]
    states = memory.h_cache if hasattr(memory, "h_cache") else memory.hidden
    return [h[0].numel() for h in states]


@pytest.mark.parametrize(
    "method,build,data_class,slack",
    [
        ("transformer_xl", TINY["transformer_xl"].build, SyntheticData, 0),
        ("rpe", lambda: tiny("transformer_xl", mem_len=0), SyntheticData, 0),
        ("fixed_span", lambda: TINY["adaptive_span"].build(network={"span_kind": "fixed"}), SyntheticData, 0),
        # Its memory keeps up to c - 1 states beyond n_m until they fill a group to compress.
        ("compressive", TINY["compressive_transformer"].build, SyntheticData, 1 * 16),
        ("recurrence", TINY["recurrence"].build, WindowData, 0),
        ("gpt2_window", lambda: tiny("recurrence", recurrence=False), WindowData, 0),
        ("window_transformer", TINY["window_transformer"].build, SyntheticData, 0),
    ],
)
def test_the_state_size_is_what_the_memory_carries_per_layer(method, build, data_class, slack):
    model = build()
    carried = carried_numbers(model, data_class)
    assert all(model.state_size() <= n <= model.state_size() + slack for n in carried), (carried, method)


def test_words_text_is_scored_token_by_token_and_its_marks_give_the_recall(tmp_path):
    """A tiny XL validated on `synth mqar` text read with the words tokenizer: every token but the
    first scored once (offsets count tokens, `<eos>` included), the file sums to the logged total,
    and the logged recall is the share of `correct` at the sidecar's answers."""
    mqar.generate(mqar.MQARSettings(**MQAR_SMALL), tmp_path / "mqar")
    data = text_files_data(tmp_path / "mqar", "words", tmp_path / "cache")
    model = tiny("transformer_xl", vocab_size=data.vocab_size)
    trainer = cpu_trainer(tmp_path, callbacks=[TokenNLLWriter()])
    metrics = trainer.validate(model, datamodule=data, verbose=False)[0]
    with np.load(tmp_path / "token_nll.npz") as per_token:
        nll, offset, correct = per_token["nll"], per_token["offset"], per_token["correct"]
        row_start = per_token["row_start"]
        segment_len, memory_start = int(per_token["segment_len"]), per_token["memory_start"]
    rows = [row[0] for row in contiguous_rows(len(offset) + 1, data.eval_batch_size, pad=True) if row]
    assert row_start.tolist() == [next(s for s, e in rows if s < o < e) for o in offset.tolist()]
    assert segment_len == data.eval_tgt_len and np.array_equal(memory_start, row_start)  # XL: the row's
    text = (tmp_path / "mqar" / "valid.txt").read_text()
    np.testing.assert_array_equal(offset, np.arange(1, len(text.split()) + text.count("\n")))
    assert nll.astype(np.float64).sum() == pytest.approx(
        metrics["val/loss"] * metrics["val/tokens"], rel=1e-6
    )
    marks = load_marks(tmp_path / "mqar", "valid")
    reachable = bound_in_row(marks, len(offset) + 1, data.eval_batch_size)
    assert 0 < reachable.sum() < reachable.size
    marks = {
        key: values[reachable] for key, values in marks.items() if key in ("offset", "query", "distance")
    }
    answers = np.isin(offset, marks["offset"])
    assert metrics["val/recall_answers"] == len(marks["offset"]) == answers.sum()
    assert metrics["val/recall_acc"] == pytest.approx(correct[answers].mean())
    assert metrics["val/recall_acc_first"] == pytest.approx(
        correct[np.isin(offset, marks["offset"][marks["query"] == 0])].mean()
    )


def test_within_segment_is_the_share_of_answers_whose_binding_shares_their_segment():
    """`TargetMarks.within_segment(L)`: over every position an answer can take in its segment of L
    tokens, the share where the token it recalls (distance back) lies in the same segment."""
    distance, segment_len = np.array([1, 5, 8, 12, 30]), 8
    in_segment = [position - d >= 0 for d in distance for position in range(segment_len)]
    marks = TargetMarks(np.arange(len(distance)), None, distance)
    assert marks.within_segment(segment_len) == pytest.approx(np.mean(in_segment))
    assert TargetMarks(np.arange(2), None, np.array([8, 40])).within_segment(8) == 0.0
    assert TargetMarks(np.arange(2)).within_segment(8) is None  # no distances
