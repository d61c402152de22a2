"""The shared first-in first-out memory (`longctx/methods/fifo.py`) on hand-computed cases: slot t
holds the value t, so what is kept and what is evicted can be read off."""

from __future__ import annotations

import pytest
import torch

from longctx.methods.fifo import evicted_count, fifo_append, split_evicted


def slots(first: int, count: int, batch: int = 2) -> torch.Tensor:
    """(B, count, 1) states whose value is their slot index, first .. first + count − 1, in every row."""
    return torch.arange(first, first + count, dtype=torch.float32).view(1, count, 1).repeat(batch, 1, 1)


def values(t: torch.Tensor) -> list[int]:
    return t[0, :, 0].long().tolist()


@pytest.mark.parametrize(
    ("held", "incoming", "capacity", "group", "expected"),
    [
        (0, 3, 5, 1, 0),  # partial fill: nothing leaves
        (2, 3, 5, 1, 0),  # exact fill
        (4, 3, 5, 1, 2),  # overflow 2
        (5, 3, 0, 1, 8),  # keep nothing: all leave
        (4, 3, 5, 2, 2),  # overflow 2, whole groups of 2
        (4, 4, 5, 2, 2),  # overflow 3: one group leaves, one slot stays beyond capacity
        (4, 4, 5, 4, 0),  # overflow 3 < one group of 4: nothing leaves yet
    ],
)
def test_evicted_count(held, incoming, capacity, group, expected):
    assert evicted_count(held, incoming, capacity, group) == expected


def test_partial_fill_keeps_everything_and_evicts_nothing():
    kept, evicted = fifo_append(slots(0, 2), slots(2, 2), capacity=5)
    assert values(kept) == [0, 1, 2, 3] and evicted.shape == (2, 0, 1)


def test_exact_fill_keeps_everything():
    kept, evicted = fifo_append(slots(0, 3), slots(3, 2), capacity=5)
    assert values(kept) == [0, 1, 2, 3, 4] and evicted.shape[1] == 0


def test_overflow_evicts_the_oldest_in_order():
    kept, evicted = fifo_append(slots(0, 4), slots(4, 3), capacity=5)
    assert values(kept) == [2, 3, 4, 5, 6]
    assert values(evicted) == [0, 1]


def test_an_empty_memory_keeps_nothing_and_evicts_all():
    kept, evicted = fifo_append(slots(0, 2), slots(2, 3), capacity=0)
    assert kept.shape == (2, 0, 1)
    assert values(evicted) == [0, 1, 2, 3, 4]


def test_groups_keep_the_remainder_until_a_group_is_whole():
    kept, evicted = fifo_append(slots(0, 4), slots(4, 4), capacity=5, group=2)  # overflow 3
    assert values(kept) == [2, 3, 4, 5, 6, 7]  # capacity + 1
    assert values(evicted) == [0, 1]


def test_per_row_validity_moves_with_its_slots():
    """Row 0 was reset (its two held slots invalid), row 1 was not: validity is a FIFO like the
    states, so evicted and kept slots carry their rows' own validity."""
    valid = torch.tensor([[False, False, True], [True, True, True]])
    kept, evicted = fifo_append(valid, valid.new_ones(2, 2), capacity=3)
    assert kept.tolist() == [[True, True, True], [True, True, True]]
    assert evicted.tolist() == [[False, False], [True, True]]
    kept, evicted = fifo_append(valid, valid.new_ones(2, 1), capacity=3)
    assert kept.tolist() == [[False, True, True], [True, True, True]]
    assert evicted.tolist() == [[False], [True]]


def test_other_slot_dims_and_a_custom_join():
    """The slot dim of a key/value cache (2, B, H, P, Dh) is −2; `join` forms [old, new] (as the
    XL slot store does in place) and the split is the same."""
    old, new = torch.arange(3.0).view(1, 3, 1), torch.arange(3.0, 5.0).view(1, 2, 1)
    joined_by = []

    def join(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        joined_by.append((a, b))
        return torch.cat([a, b], dim=-2)

    kept, evicted = fifo_append(old, new, capacity=4, dim=-2, join=join)
    assert kept[0, :, 0].tolist() == [1.0, 2.0, 3.0, 4.0] and evicted[0, :, 0].tolist() == [0.0]
    assert len(joined_by) == 1 and joined_by[0][0] is old and joined_by[0][1] is new


def test_kept_and_evicted_are_views_of_the_joined_slots():
    joined = slots(0, 5)
    kept, evicted = split_evicted(joined, 2)
    assert kept.data_ptr() == joined[:, 2:].data_ptr() and evicted.data_ptr() == joined.data_ptr()


def test_a_negative_capacity_or_an_empty_group_is_refused():
    with pytest.raises(ValueError, match="capacity >= 0 and group >= 1"):
        evicted_count(1, 1, -1)
    with pytest.raises(ValueError, match="capacity >= 0 and group >= 1"):
        evicted_count(1, 1, 2, group=0)
