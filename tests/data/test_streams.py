"""Memory-carrying streams: contiguity, exact coverage, sharding, documents, windows, resume.

Token ids are positions (`tokens = arange(N)`), so every assertion is about which text a batch holds.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from longctx.data.streams import SegmentStream, StreamMismatch, units_in_piece


def positions(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.uint32)


def scored_targets(stream: SegmentStream) -> np.ndarray:
    return np.concatenate([b["target"][b["mask"]].numpy() for b in stream])


def test_consecutive_batches_continue_each_row():
    stream = SegmentStream(positions(1000), batch_size=4, seq_len=10)
    batches = list(stream)
    assert len(batches) == len(stream) == 25  # 999 targets // 4 rows = 249 per row
    for prev, nxt in itertools.pairwise(batches):
        torch.testing.assert_close(nxt["input"][:, :1], prev["input"][:, -1:] + 1)
    for batch in batches:
        valid = batch["mask"]
        torch.testing.assert_close(batch["target"][valid], batch["input"][valid] + 1)
    assert batches[0]["reset"].all() and not any(b["reset"].any() for b in batches[1:])


def test_training_rows_match_transformer_xl_layout():
    """Row b holds tokens [b*n, b*n+n) with n = (N-1)//B, like LMOrderedIterator's view(B, -1)."""
    n_tokens, rows, seq = 103, 4, 8
    stream = SegmentStream(positions(n_tokens), batch_size=rows, seq_len=seq)
    inputs = torch.cat([b["input"][:, : int(b["mask"].sum(1).max())] for b in stream], dim=1)
    per_row = (n_tokens - 1) // rows
    expected = torch.arange(rows * per_row).view(rows, per_row)
    torch.testing.assert_close(inputs, expected)


@pytest.mark.parametrize("n_tokens,rows,seq", [(1000, 4, 10), (1001, 3, 7), (57, 5, 16), (10, 9, 3)])
def test_evaluation_scores_every_target_exactly_once(n_tokens, rows, seq):
    stream = SegmentStream(positions(n_tokens), batch_size=rows, seq_len=seq, pad=True)
    targets = np.sort(scored_targets(stream))
    np.testing.assert_array_equal(targets, np.arange(1, n_tokens))


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_get_contiguous_blocks_of_rows_and_equal_batch_counts(world):
    tokens, rows = positions(4001), 8
    single = list(SegmentStream(tokens, rows, 16, pad=True))
    per_rank = [
        list(SegmentStream(tokens, rows, 16, pad=True, rank=r, world_size=world)) for r in range(world)
    ]
    assert len({len(batches) for batches in per_rank}) == 1
    for i, batch in enumerate(single):
        for key in ("input", "target", "mask", "reset"):
            torch.testing.assert_close(torch.cat([batches[i][key] for batches in per_rank]), batch[key])


def test_batch_size_must_divide_across_ranks():
    with pytest.raises(ValueError, match="not divisible by the world size 4"):
        SegmentStream(positions(100), batch_size=6, seq_len=4, rank=0, world_size=4)


def test_bad_lengths_are_clear_errors():
    with pytest.raises(ValueError, match="fewer than one segment"):
        SegmentStream(positions(10), batch_size=1, seq_len=20)
    with pytest.raises(ValueError, match="overlap"):
        SegmentStream(positions(100), batch_size=1, seq_len=10, overlap=10, windows_per_batch=1)
    with pytest.raises(ValueError, match="cannot fill 50 rows"):
        SegmentStream(positions(30), batch_size=50, seq_len=4)


def docs(lengths: list[int]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return positions(int(offsets[-1])), offsets


def test_documents_reset_rows_and_never_mix():
    tokens, offsets = docs([50, 7, 33, 20, 64, 2, 41])
    stream = SegmentStream(tokens, batch_size=3, seq_len=8, doc_offsets=offsets, pad=True)
    doc_of = np.searchsorted(offsets, np.arange(len(tokens)), side="right") - 1
    seen_docs: list[list[int]] = [[] for _ in range(3)]
    scored = []
    for batch in stream:
        for row in range(3):
            valid = batch["mask"][row].numpy()
            if not valid.any():
                continue
            ins, tgts = batch["input"][row].numpy()[valid], batch["target"][row].numpy()[valid]
            doc = doc_of[ins[0]]
            assert (doc_of[ins] == doc).all() and (doc_of[tgts] == doc).all()
            if batch["reset"][row]:
                assert ins[0] == offsets[doc]  # a reset row starts its document
                seen_docs[row].append(doc)
            else:
                assert seen_docs[row][-1] == doc  # otherwise it continues the same document
            scored.append(tgts)
    expected = np.concatenate([np.arange(s + 1, e) for s, e in itertools.pairwise(offsets)])
    np.testing.assert_array_equal(np.sort(np.concatenate(scored)), expected)
    assert sorted(d for row in seen_docs for d in row) == list(range(7))


def test_document_order_is_shuffled_per_epoch_and_reproducible():
    tokens, offsets = docs([30] * 12)
    stream = SegmentStream(tokens, 2, 8, doc_offsets=offsets, shuffle_documents=True, seed=3)
    epoch0 = [b["input"][:, 0].tolist() for b in stream]
    epoch1 = [b["input"][:, 0].tolist() for b in stream]
    assert epoch0 != epoch1 and stream.epoch == 1
    again = SegmentStream(tokens, 2, 8, doc_offsets=offsets, shuffle_documents=True, seed=3)
    assert [b["input"][:, 0].tolist() for b in again] == epoch0


@pytest.mark.parametrize(
    "n_targets,seq,overlap", [(1, 5, 0), (5, 5, 2), (6, 5, 2), (100, 10, 3), (101, 10, 9)]
)
def test_units_in_piece(n_targets, seq, overlap):
    covered, start = 0, 0
    count = 0
    while covered < n_targets:
        covered = min(n_targets, start + seq)
        start += seq - overlap
        count += 1
    assert units_in_piece(n_targets, seq, overlap) == count


@pytest.mark.parametrize("window,overlap,k", [(10, 0, 1), (10, 3, 2), (7, 6, 3), (12, 5, 4)])
def test_windows_score_every_target_once_with_overlap(window, overlap, k):
    tokens, rows = positions(503), 2
    stream = SegmentStream(tokens, rows, window, overlap=overlap, windows_per_batch=k, pad=True)
    first = next(iter(stream))
    assert first["input"].shape == (rows, k, window) and first["reset"].shape == (rows, k)
    # The first window of a row scores all of its targets, later ones only their last T - o.
    assert first["mask"][:, 0].all()
    if k > 1:
        assert not first["mask"][:, 1, :overlap].any() and first["mask"][:, 1, overlap:].all()
        torch.testing.assert_close(first["input"][:, 1, 0], first["input"][:, 0, 0] + window - overlap)
    np.testing.assert_array_equal(np.sort(scored_targets(stream)), np.arange(1, 503))


def test_maximal_overlap_is_sliding_window_evaluation():
    """o = T-1: every window after the first predicts exactly one new token with T-1 of context."""
    window = 6
    stream = SegmentStream(positions(40), 1, window, overlap=window - 1, windows_per_batch=1, pad=True)
    batches = list(stream)
    for i, batch in enumerate(batches[1:], start=1):
        assert batch["mask"].sum() == 1 and batch["mask"][0, 0, -1]
        np.testing.assert_array_equal(batch["input"][0, 0].numpy(), np.arange(i, i + window))


def test_resume_continues_at_the_exact_next_segment():
    tokens, offsets = docs([40, 25, 61, 13, 77, 30])
    kwargs = dict(batch_size=2, seq_len=6, doc_offsets=offsets, shuffle_documents=True, seed=1)
    reference = SegmentStream(tokens, **kwargs)
    list(reference)  # epoch 0
    expected = list(reference)  # epoch 1
    interrupted = SegmentStream(tokens, **kwargs)
    list(interrupted)
    iterator = iter(interrupted)
    for _ in range(4):
        next(iterator)
    state = interrupted.state_dict()
    resumed = SegmentStream(tokens, **kwargs)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(expected) - 4
    for got, want in zip(rest, expected[4:]):
        for key in want:
            torch.testing.assert_close(got[key], want[key])
    # The epoch after the resumed one starts from its first batch.
    assert resumed.epoch == 1 and len(list(resumed)) == len(resumed)


def test_resume_after_the_last_batch_starts_the_next_epoch():
    stream = SegmentStream(positions(200), 2, 10)
    list(stream)
    state = stream.state_dict()
    resumed = SegmentStream(positions(200), 2, 10)
    resumed.load_state_dict(state)
    assert len(list(resumed)) == len(resumed) and resumed.epoch == 1


FRESH = "or start a fresh run (another --run_name, no --ckpt_path)"


@pytest.mark.parametrize(
    "change,expected",
    [
        ({"batch_size": 4}, "cut with data.batch_size 2, this run has 4: the stream cannot resume where it "
         f"stopped with another layout; resume with --data.batch_size 2, {FRESH}"),
        ({"seq_len": 12}, "cut with data.tgt_len 10, this run has 12: the stream cannot resume where it "
         f"stopped with another layout; resume with --data.tgt_len 10, {FRESH}"),
        ({"overlap": 2}, "cut with data.overlap 0, this run has 2:"),
        ({"windows_per_batch": 3}, "cut with data.windows_per_batch 2, this run has 3:"),
        ({"tokens": positions(300)}, "holds 200 tokens, this run's 300: the run was trained on other data "
         "(data.corpus, data.split_sources, data.files, data.tokenizer); resume with the data it was "
         f"trained on, {FRESH}"),
    ],
)  # fmt: skip
def test_resume_with_another_layout_is_refused_naming_the_setting(change, expected):
    """One line through the CLI (`StreamMismatch` is a `BadInput`); was a ValueError traceback naming
    the stream's own field (`seq_len`) instead of the setting (`data.tgt_len`)."""
    kwargs = dict(tokens=positions(200), batch_size=2, seq_len=10, overlap=0, windows_per_batch=2)
    stream = SegmentStream(**kwargs)
    next(iter(stream))
    state = stream.state_dict()
    with pytest.raises(StreamMismatch) as info:
        SegmentStream(**{**kwargs, **change}).load_state_dict(state)
    assert str(info.value).startswith("the checkpoint's training stream ")
    assert expected in str(info.value)


def test_resume_of_a_state_without_format_version_is_refused():
    state = {"epoch": 0, "next_batch": 3, "batch_size": 2}  # what longctx wrote before version 2
    with pytest.raises(ValueError, match="format version 1, this longctx reads 2"):
        SegmentStream(positions(200), 2, 10).load_state_dict(state)


def starts_of_epochs(stream: SegmentStream, epochs: int) -> list[list[int]]:
    """First input token of row 0 in every batch, per epoch."""
    return [[int(b["input"][0, 0]) for b in stream] for _ in range(epochs)]


def test_random_offset_wrap_matches_the_adaptive_span_trainer():
    """Epoch 0 starts at 0, later epochs at a seeded offset in [0, L); only whole segments, and the
    row's segments are consecutive from that offset (their `train_pos += block_size`)."""
    n_tokens, rows, seq = 1001, 2, 7
    stream = SegmentStream(positions(n_tokens), rows, seq, wrap="random_offset", seed=5)
    per_row = (n_tokens - 1) // rows
    offsets = []
    for epoch in range(6):
        batches = list(stream)
        offset = int(batches[0]["input"][0, 0])
        offsets.append(offset)
        assert offset == stream.epoch_offset(epoch) and 0 <= offset < seq
        assert len(batches) == (per_row - offset) // seq  # the partial last block is never trained
        for b in batches:
            assert b["mask"].all()
        for i, b in enumerate(batches):
            expected_row0 = torch.arange(offset + i * seq, offset + (i + 1) * seq)
            torch.testing.assert_close(b["input"][0], expected_row0)
            torch.testing.assert_close(b["input"][1], expected_row0 + per_row)
    assert offsets[0] == 0 and len(set(offsets[1:])) > 1
    again = SegmentStream(positions(n_tokens), rows, seq, wrap="random_offset", seed=5)
    assert starts_of_epochs(again, 6) == starts_of_epochs(
        SegmentStream(positions(n_tokens), rows, seq, wrap="random_offset", seed=5), 6
    )


def test_random_offset_is_the_same_on_every_rank():
    kwargs = dict(tokens=positions(2001), batch_size=4, seq_len=9, wrap="random_offset", seed=2)
    single = SegmentStream(**kwargs)
    ranks = [SegmentStream(**kwargs, rank=r, world_size=2) for r in range(2)]
    for _ in range(3):  # three epochs
        whole = list(single)
        parts = [list(s) for s in ranks]
        assert len(parts[0]) == len(parts[1]) == len(whole)
        for i, batch in enumerate(whole):
            torch.testing.assert_close(
                torch.cat([parts[0][i]["input"], parts[1][i]["input"]]), batch["input"]
            )


def test_random_offset_resumes_exactly_mid_epoch():
    kwargs = dict(tokens=positions(1501), batch_size=3, seq_len=8, wrap="random_offset", seed=11)
    reference = SegmentStream(**kwargs)
    list(reference), list(reference)  # epochs 0 and 1
    expected = list(reference)  # epoch 2
    interrupted = SegmentStream(**kwargs)
    list(interrupted), list(interrupted)
    iterator = iter(interrupted)
    for _ in range(5):
        next(iterator)
    state = interrupted.state_dict()
    assert state["offset"] == interrupted.epoch_offset(2) != 0
    resumed = SegmentStream(**kwargs)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(expected) - 5
    for got, want in zip(rest, expected[5:], strict=True):
        torch.testing.assert_close(got["input"], want["input"])
    nxt = list(resumed)  # epoch 3 draws its own offset
    assert int(nxt[0]["input"][0, 0]) == resumed.epoch_offset(3)


def test_random_offset_is_refused_for_documents_and_windows():
    tokens, offsets = docs([40, 30])
    with pytest.raises(ValueError, match="contiguous text in segment mode"):
        SegmentStream(tokens, 1, 5, doc_offsets=offsets, wrap="random_offset")
    with pytest.raises(ValueError, match="contiguous text in segment mode"):
        SegmentStream(positions(100), 1, 5, windows_per_batch=1, wrap="random_offset")


@pytest.mark.parametrize(("windows", "overlap", "documents"), [(None, 0, False), (3, 0, False), (2, 3, True)])
def test_scored_masks_exactly_the_chosen_targets(windows, overlap, documents):
    """`scored` (data.train_targets: marked): a target counts iff it did before and its index is chosen."""
    tokens = np.arange(500)  # every token is its own index: a target names its place in the split
    scored = np.random.default_rng(0).random(500) < 0.2
    shape = dict(
        windows_per_batch=windows,
        overlap=overlap,
        doc_offsets=np.array([0, 130, 333, 500]) if documents else None,
    )
    chosen, every = SegmentStream(tokens, 4, 8, scored=scored, **shape), SegmentStream(tokens, 4, 8, **shape)
    for a, b in zip(chosen, every, strict=True):
        assert torch.equal(a["input"], b["input"])
        assert torch.equal(a["mask"], b["mask"] & torch.from_numpy(scored)[b["target"]])
