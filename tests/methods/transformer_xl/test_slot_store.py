"""The evaluation key/value cache's in-place slot buffers (`slot_store.py`): the same slots as
`torch.cat` then a slice, no buffer allocated after the first, and no memory silently changed."""

import pytest
import torch

from longctx.methods.transformer_xl.memory import XLMemory
from longctx.methods.transformer_xl.network import TransformerXL
from longctx.methods.transformer_xl.slot_store import SlotAppender
from longctx.methods.transformer_xl.trams import TramsSettings


def stream(P: int, n: int, keep: int, segments: int):
    """Append `segments` segments of n slots to a (2, P, 3) field; yield (appended, reference, appender)."""
    g = torch.Generator().manual_seed(0)
    memory, reference, cursor = torch.randn(2, P, 3, generator=g), None, None
    reference = memory
    for _ in range(segments):
        new = torch.randn(2, n, 3, generator=g)
        appender = SlotAppender(XLMemory.SLOTS, cursor, memory.shape[1], n, keep)
        joined = appender.extend("hidden", memory, new)
        expected = torch.cat([reference, new], dim=1)
        yield joined, expected, appender
        cursor = appender.cursor()
        memory, reference = joined[:, -keep:], expected[:, -keep:]


@pytest.mark.parametrize(("P", "n", "keep"), [(6, 2, 6), (0, 3, 5), (7, 4, 7)])
def test_appending_in_place_equals_cat_then_slice_and_allocates_once(P, n, keep):
    buffers, generations = set(), []
    for joined, expected, appender in stream(P, n, keep, segments=25):
        assert torch.equal(joined, expected)
        buffers.add(joined.untyped_storage().data_ptr())
        generations.append(appender.store.generation)
    assert len(buffers) == 1  # one buffer for the whole stream: compactions reuse it
    assert generations[-1] >= 3  # and there were several


def test_a_second_forward_from_the_same_memory_leaves_both_results_intact():
    torch.manual_seed(0)
    model = TransformerXL.Config(2, 16, 2, 32, dropout=0.0).build(30).double().eval()
    x = torch.randint(0, 30, (2, 12))
    with torch.no_grad():
        memory = model(x[:, :4], model.empty_memory(2), mem_len=6, cache_kv=True).memory
        first = model(x[:, 4:8], memory, mem_len=6, cache_kv=True)
        kept = [k.clone() for k in first.memory.key]
        second = model(x[:, 8:12], memory, mem_len=6, cache_kv=True)  # forks: copies into a new store
        plain = model(x[:, 8:12], model(x[:, :4], model.empty_memory(2), mem_len=6).memory, mem_len=6)
    torch.testing.assert_close(second.hidden, plain.hidden)
    assert all(torch.equal(k, c) for k, c in zip(first.memory.key, kept))
    assert second.memory.slots.store is not first.memory.slots.store


def test_a_memory_overwritten_by_later_segments_is_refused():
    torch.manual_seed(0)
    model = TransformerXL.Config(1, 16, 2, 32, dropout=0.0).build(30).eval()
    x = torch.randint(0, 30, (2, 4))
    with torch.no_grad():
        memory = model(x, model.empty_memory(2), mem_len=8, cache_kv=True).memory
        old, newest = memory, memory
        for _ in range(12):  # past at least two compactions of the store
            newest = model(x, newest, mem_len=8, cache_kv=True).memory
        assert newest.slots.store.generation >= 2
        with pytest.raises(ValueError, match="overwritten by later segments"):
            model(x, old, mem_len=8, cache_kv=True)


@pytest.mark.parametrize("trams", [None, TramsSettings(8, 4)], ids=["xl", "trams"])
def test_cached_evaluation_equals_the_uncached_one_across_compactions(trams):
    torch.manual_seed(0)
    model = TransformerXL.Config(2, 12, 3, 20, dropout=0.0).build(40).double().eval()
    x = torch.randint(0, 40, (2, 4 * 20))
    mem_len = 16
    start = model.zero_memory(2, mem_len) if trams else model.empty_memory(2)
    plain = cached = start
    with torch.no_grad():
        for s in range(20):
            seg = x[:, 4 * s : 4 * s + 4]
            a = model(seg, plain, mem_len=mem_len, trams=trams)
            b = model(seg, cached, mem_len=mem_len, trams=trams, cache_kv=True)
            torch.testing.assert_close(b.hidden, a.hidden)
            plain, cached = a.memory, b.memory
    assert cached.slots.store.generation >= 2


def test_with_autograd_the_cache_concatenates_and_the_segment_keys_get_gradients():
    torch.manual_seed(0)
    model = TransformerXL.Config(1, 16, 2, 32, dropout=0.0).build(30).double()
    x = torch.randint(0, 30, (2, 8))
    memory = model(x[:, :4], model.empty_memory(2), mem_len=6, cache_kv=True).memory
    assert memory.slots is None and not memory.key[0].requires_grad
    out = model(x[:, 4:], memory, mem_len=6, cache_kv=True)
    out.hidden.sum().backward()
    w_k = model.layers[0].attn.qkv_net.weight.grad[32:64]
    assert w_k.abs().sum() > 0


def test_a_memory_type_declares_its_own_fields_to_the_store():
    """The store is not tied to XL's fields: a layout naming another field and slot dim appends it in
    place as XL's are, and `SlotLayout.cat` forms the same tensor anew; a field the layout does not
    declare is refused by name."""
    from longctx.methods.transformer_xl.slot_store import SlotLayout

    layout = SlotLayout({"summary": 2})
    g = torch.Generator().manual_seed(0)
    old, new = torch.randn(2, 3, 4, 5, generator=g), torch.randn(2, 3, 1, 5, generator=g)
    appender = SlotAppender(layout, None, P=4, n=1, keep=4)
    joined = appender.extend("summary", old, new)
    assert torch.equal(joined, torch.cat([old, new], dim=2))
    assert torch.equal(layout.cat("summary", old, new), joined)
    with pytest.raises(KeyError, match="hidden"):
        appender.extend("hidden", old, new)
