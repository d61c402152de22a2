"""The Recurrent Memory Transformer on Transformer-XL's network (`xl_backbone.py`, the 2022 paper's
own backbone, booydar/LM-RMT), against straightforward references on a small random network:

- with m = 0 it is Transformer-XL without memory (the Transformer+RPE baseline) over independent
  windows, on the same weights;
- segment t + 1 reads exactly what segment t wrote; LM-RMT's mask: the read tokens see each other and
  no segment token, the segment sees the read tokens and no write token, the write tokens all;
- gradients reach the K segments of a batch through the memory alone;
- the curriculum's hand-over of the backbone and the memory; FLOPs against torch's counter.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from longctx.methods.recurrent_memory.flops import flops_per_token
from longctx.methods.recurrent_memory.module import RecurrentMemoryLM
from longctx.methods.transformer_xl.network import TransformerXL
from tests.helpers.knob_checks import assert_same_weights
from tests.methods.recurrent_memory.test_recurrent_memory import VOCAB, windows

D, N_LAYER = 32, 2
XL = {"n_layers": N_LAYER, "d_model": D, "n_heads": 4, "d_inner": 64, "dropout": 0.0}  # post-LN, as LM-RMT


def rmt_xl(num_mem_tokens: int = 3, seed: int = 0, **knobs) -> RecurrentMemoryLM:
    torch.manual_seed(seed)
    knobs = {"xl_config": XL, "memory_cell": {"num_mem_tokens": num_mem_tokens}, **knobs}
    return RecurrentMemoryLM(vocab_size=VOCAB, **knobs)


def test_with_no_memory_tokens_it_is_transformer_xl_without_memory_over_independent_windows():
    model = rmt_xl(num_mem_tokens=0).eval()
    batch = windows()
    net: TransformerXL = model.xl.net
    with torch.no_grad():
        nll = model.step(batch, None).nll
        for k in range(batch["input"].shape[1]):
            out = net(batch["input"][:, k], net.empty_memory(2), mem_len=0)
            expected = net.nll(out.hidden, batch["target"][:, k])
            torch.testing.assert_close(nll[:, k], expected, rtol=1e-5, atol=1e-5)


def test_segment_t_plus_1_reads_exactly_what_segment_t_wrote():
    model, m = rmt_xl(num_mem_tokens=3).eval(), 3
    seen = []
    outputs = []
    handle = model.xl.register_forward_pre_hook(lambda module, args: seen.append(args[0].clone()))
    handle_out = model.xl.register_forward_hook(lambda module, args, out: outputs.append(out.clone()))
    with torch.no_grad():
        model.step(windows(), None)
    handle.remove(), handle_out.remove()
    torch.testing.assert_close(seen[0][:, :m], model.memory_cell.memory.expand(2, -1, -1))
    for t in range(1, len(seen)):
        written = outputs[t - 1][:, -m:]
        assert torch.equal(seen[t][:, :m], written) and torch.equal(seen[t][:, -m:], written)


def test_the_mask_is_lm_rmts_memory_blocks_over_a_causal_segment():
    """Changing a segment token changes no read token's output nor an earlier segment token's;
    changing the last read token changes the first read token (the read block sees itself); changing
    the last write token's input changes the first write token's output, and no segment token's.
    (Weights drawn wider than the code's N(0, 0.02), under which attention moves the outputs by 1e-7.)"""
    model, m, T = rmt_xl(num_mem_tokens=3, xl_config={**XL, "init_std": 0.3}).eval(), 3, 8
    sequence = torch.randn(2, T + 2 * m, D)
    with torch.no_grad():
        base = model.xl(sequence, m)
        token = sequence.clone()
        token[:, m + 4] += 1.0
        changed = model.xl(token, m)
        assert torch.equal(changed[:, : m + 4], base[:, : m + 4])
        assert not torch.allclose(changed[:, m + 4 :], base[:, m + 4 :])
        read = sequence.clone()
        read[:, m - 1] += 1.0
        assert not torch.allclose(model.xl(read, m)[:, 0], base[:, 0])
        write = sequence.clone()
        write[:, -1] += 1.0
        out = model.xl(write, m)
        assert torch.equal(out[:, : m + T], base[:, : m + T])
        assert not torch.allclose(out[:, m + T], base[:, m + T])


def test_gradients_reach_the_k_segments_of_a_batch_through_the_memory():
    model = rmt_xl(num_mem_tokens=3)
    batch = windows(n_windows=3)
    embedded = []
    original = model.xl.embed

    def embed(ids):
        tokens = original(ids)
        tokens.retain_grad()
        embedded.append(tokens)
        return tokens

    model.xl.embed = embed
    nll = model.step(batch, None).nll
    nll[:, -1].sum().backward()  # the last segment's loss alone
    assert all(tokens.grad is not None and tokens.grad.abs().sum() > 0 for tokens in embedded)
    assert model.memory_cell.memory.grad.abs().sum() > 0


def test_a_stage_hands_its_backbone_and_memory_to_the_next(tmp_path):
    stage = rmt_xl(num_mem_tokens=3, seed=0)
    checkpoint = {"state_dict": stage.state_dict()}
    stage.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, tmp_path / "best.ckpt")
    following = rmt_xl(num_mem_tokens=3, seed=1, pretrained=str(tmp_path / "best.ckpt"))
    assert_same_weights(following, stage)
    smaller = {**XL, "d_inner": 32}
    with pytest.raises(ValueError, match=r"best.ckpt's Transformer-XL network does not fit xl_config"):
        RecurrentMemoryLM(vocab_size=VOCAB, xl_config=smaller, pretrained=str(tmp_path / "best.ckpt"))


def test_a_transformer_xl_run_gives_its_network_and_a_fresh_memory(tmp_path):
    """The RPE of the recall sweep as a pretrained backbone: its network, the memory drawn afresh."""
    from longctx.methods.transformer_xl.module import TransformerXLLM

    torch.manual_seed(0)
    rpe = TransformerXLLM(vocab_size=VOCAB, network=XL, mem_len=0)
    torch.save({"state_dict": rpe.state_dict()}, tmp_path / "last.ckpt")
    model = rmt_xl(num_mem_tokens=2, seed=1, pretrained=str(tmp_path / "last.ckpt"))
    for name, tensor in rpe.net.state_dict().items():
        assert torch.equal(model.xl.net.state_dict()[name], tensor), name
    fresh = rmt_xl(num_mem_tokens=2, seed=1)
    assert torch.equal(model.memory_cell.memory, fresh.memory_cell.memory)
    torch.save({"state_dict": {"lm.transformer.wte.weight": torch.zeros(3)}}, tmp_path / "gpt2.ckpt")
    with pytest.raises(ValueError, match=r"gpt2.ckpt holds no Transformer-XL network \(xl.net.\* or net.\*"):
        rmt_xl(pretrained=str(tmp_path / "gpt2.ckpt"))


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"gpt2_config": {"n_layer": 2}}, r"^give one backbone: xl_config .* or gpt2_config, not both$"),
        ({"pretrained": "gpt2"}, r"^with xl_config, pretrained must be a .ckpt of a run on the same"),
        ({"checkpoint_blocks": True}, r"^checkpoint_blocks is Hugging Face's block checkpointing"),
        ({"xl_config": {**XL, "attention": "flex"}}, r"^xl_config.attention 'flex' forms Transformer-XL's"),
    ],
)
def test_a_knob_that_does_not_go_with_the_xl_backbone_is_one_line(knobs, message):
    with pytest.raises(ValueError, match=message):
        rmt_xl(**knobs)


def written_memory_norms(model: RecurrentMemoryLM, n_segments: int) -> list[float]:
    """The mean norm of the memory written by each of `n_segments` random segments read in a row."""
    memory, norms = model.memory_cell.memory.expand(2, -1, -1), []
    with torch.no_grad():
        for k in range(n_segments):
            x = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(k))
            _, memory = model.memory_cell.segment(model.xl, x, memory)
            norms.append(memory.norm(dim=-1).mean().item())
    return norms


def test_a_post_ln_memory_stays_bounded_and_a_pre_ln_one_is_refused_over_the_stream():
    """Post-LN: the memory is a LayerNorm's output (norm <= |gamma|·√d + |beta|) however long it is
    carried; pre-LN: no final norm, the memory grows with every segment, so carrying it over the
    stream is refused in one line (samples of a few segments are allowed)."""
    post = rmt_xl().eval()
    norm = post.xl.net.layers[-1].ff.layer_norm
    bound = norm.weight.abs().max().item() * D**0.5 + norm.bias.norm().item()
    assert max(written_memory_norms(post, 30)) <= bound + 1e-4
    pre_ln = {**XL, "pre_lnorm": True}
    samples = rmt_xl(xl_config=pre_ln, train_memory="fresh", eval_restart_every=2).eval()
    norms = written_memory_norms(samples, 30)
    assert norms[-1] > 3 * norms[0] and all(b > a for a, b in itertools.pairwise(norms))
    refused = r"^xl_config.pre_lnorm with the memory carried over the stream: a pre-LN"
    for knobs in ({"train_memory": "carried"}, {"train_memory": "fresh"}):
        with pytest.raises(ValueError, match=refused):
            rmt_xl(xl_config=pre_ln, **knobs)


def test_flops_per_token_match_torchs_counter_with_the_relative_positions():
    """torch counts every product; the count leaves out probs·v as Kaplan's does (as the GPT-2's test
    says), the output layer runs on the T segment positions alone, and W_R's projection of the
    positions, which the network computes once for all rows of a batch, is counted per row (as
    Transformer-XL's own count does)."""
    model, m, length, batch = rmt_xl(num_mem_tokens=3, xl_config={**XL, "attention": "eager"}), 3, 8, 2
    model.eval()
    x = windows(batch=batch, n_windows=1, length=length)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model.step(x, None)
    positions = length + 2 * m
    value_products = N_LAYER * 2 * batch * positions * positions * D
    shared_positions = N_LAYER * 2 * (batch - 1) * positions * D * D  # W_R·R, once for the batch
    expected = flops_per_token(N_LAYER, D, 64, VOCAB, length, m, relative_positions=True) * batch * length
    assert counter.get_total_flops() - value_products + shared_positions == expected
    assert model.flops_per_token(length) == flops_per_token(N_LAYER, D, 64, VOCAB, length, m, 0, True)


def test_the_state_is_the_m_memory_tokens_of_width_d():
    model = rmt_xl(num_mem_tokens=3).eval()
    with torch.no_grad():
        state = model.step(windows(), None).memory.state
    assert model.state_size() == state[0].numel() == 3 * D
