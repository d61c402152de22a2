"""The Recurrent Memory Transformer (longctx/methods/recurrent_memory/): its invariants against a
straightforward reference, on a small random GPT-2 (no hub).

- with m = 0 it is the backbone over independent windows, on the same weights;
- segment t + 1 reads exactly what segment t wrote (its write tokens' last hidden states), at its read
  and at its write positions; the read tokens see no segment token, the segment no write token;
- gradients reach the K segments of a batch (through the memory alone) and not the batch before;
- a row whose document restarts reads the initial memory, and then equals a fresh run of that row;
- evaluation carrying the memory across batches equals one batch of all the windows; the segment-by-
  segment backward equals the plain one;
- FLOPs per token against torch's own count; the curriculum's weights-only hand-over between stages.
"""

from __future__ import annotations

import math
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from longctx.checkpoints.safe_unpickle import load_tensors_file
from longctx.commands.cli import main
from longctx.core.base import detach_memory
from longctx.core.data_facts import DataMismatch
from longctx.methods.recurrence.flops import hf_model_flops_per_scored_token
from longctx.methods.recurrent_memory.flops import flops_per_token
from longctx.methods.recurrent_memory.memory import MemoryTokens
from longctx.methods.recurrent_memory.module import RecurrentMemoryLM
from longctx.methods.recurrent_memory.network import HFBackbone, MemoryCell
from tests.helpers.environment import REPO
from tests.helpers.knob_checks import assert_same_weights
from tests.helpers.memory_checks import assert_losses_depend_on_windows_from_their_memory_start

VOCAB, D, N_LAYER = 50, 32, 2
GPT2 = {"n_layer": N_LAYER, "n_embd": D, "n_head": 4, "n_positions": 40}
NO_DROPOUT = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}


def rmt(num_mem_tokens: int = 3, seed: int = 0, **knobs) -> RecurrentMemoryLM:
    torch.manual_seed(seed)
    config = {**GPT2, **NO_DROPOUT}
    memory_cell = MemoryCell.Config(num_mem_tokens=num_mem_tokens)
    return RecurrentMemoryLM(vocab_size=VOCAB, gpt2_config=config, memory_cell=memory_cell, **knobs)


def windows(batch: int = 2, n_windows: int = 3, length: int = 8, seed: int = 1) -> dict[str, torch.Tensor]:
    """A window-mode batch (B, K, T) of random tokens, nothing reset."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(0, VOCAB, (batch, n_windows, length + 1), generator=generator)
    return {
        "input": x[..., :-1],
        "target": x[..., 1:],
        "mask": torch.ones(batch, n_windows, length, dtype=torch.bool),
        "reset": torch.zeros(batch, n_windows, dtype=torch.bool),
    }


def stock_nll(lm: torch.nn.Module, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The plain GPT-2 on one window (B, T): per-target NLL (B, T)."""
    logits = lm(input_ids=x).logits
    return F.cross_entropy(logits.float().transpose(1, 2), target, reduction="none")


class BackboneCalls:
    """Records what every segment feeds the GPT-2's body and what it returns."""

    def __init__(self, lm: torch.nn.Module) -> None:
        self.inputs: list[torch.Tensor] = []
        self.outputs: list[torch.Tensor] = []
        body = lm.base_model
        self.handles = [
            body.register_forward_pre_hook(self._input, with_kwargs=True),
            body.register_forward_hook(self._output),
        ]

    def _input(self, module, args, kwargs):
        self.inputs.append(kwargs["inputs_embeds"].detach().clone())

    def _output(self, module, args, output):
        self.outputs.append(output.last_hidden_state.detach().clone())

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


# ------------------------------------------------------------------ the invariants
def test_with_no_memory_tokens_it_is_the_backbone_over_independent_windows():
    model = rmt(num_mem_tokens=0).eval()
    batch = windows()
    with torch.no_grad():
        out = model.step(batch, None)
        reference = torch.stack(
            [stock_nll(model.lm, batch["input"][:, k], batch["target"][:, k]) for k in range(3)], 1
        )
    assert torch.equal(out.nll, reference)
    assert out.memory.state.shape == (2, 0, D)


def test_segment_t_plus_1_reads_exactly_what_segment_t_wrote():
    model = rmt(num_mem_tokens=3).eval()
    batch, m, length = windows(), 3, 8
    calls = BackboneCalls(model.lm)
    with torch.no_grad():
        out = model.step(batch, None)
    calls.remove()
    initial = model.memory_cell.memory.detach().expand(2, m, D)
    assert torch.equal(calls.inputs[0][:, :m], initial) and torch.equal(calls.inputs[0][:, -m:], initial)
    for k in range(1, 3):
        written = calls.outputs[k - 1][:, m + length :]  # the write tokens' last hidden states (after ln_f)
        assert torch.equal(calls.inputs[k][:, :m], written)  # read tokens
        assert torch.equal(calls.inputs[k][:, -m:], written)  # write tokens: the same inputs
        tokens = model.lm.get_input_embeddings()(batch["input"][:, k])
        assert torch.equal(calls.inputs[k][:, m : m + length], tokens)
    assert torch.equal(out.memory.state, calls.outputs[-1][:, -m:])
    final = model.lm.base_model.ln_f
    assert final is not None and calls.outputs[0].shape == (2, length + 2 * m, D)


def test_read_tokens_see_no_segment_token_and_the_segment_no_write_token():
    """The backbone's causal mask over [read; segment; write] (positions 0 … T + 2m − 1)."""
    model = rmt(num_mem_tokens=3).eval()
    cell, lm, m, length = model.memory_cell, model.lm, 3, 8
    memory = torch.randn(2, m, D)
    x = windows()["input"][:, 0]
    changed = x.clone()
    changed[:, -1] = (changed[:, -1] + 1) % VOCAB  # the segment's last token only
    with torch.no_grad():
        hidden, written = cell.segment(HFBackbone(lm), x, memory)
        hidden_changed, written_changed = cell.segment(HFBackbone(lm), changed, memory)
        sequence = torch.cat([memory, lm.get_input_embeddings()(x), memory], 1)
        full = lm.base_model(inputs_embeds=sequence).last_hidden_state
        other_write = lm.base_model(inputs_embeds=torch.cat([sequence[:, :-m], -memory], 1)).last_hidden_state
    assert torch.equal(hidden[:, :-1], hidden_changed[:, :-1])  # causal within the segment
    assert not torch.allclose(written, written_changed)  # the write tokens see the whole segment
    assert torch.equal(full[:, m : m + length], hidden) and torch.equal(full[:, m + length :], written)
    assert torch.equal(other_write[:, : m + length], full[:, : m + length])  # nothing sees the write tokens


@pytest.mark.parametrize("num_mem_tokens", [3, 0])
def test_gradients_reach_the_k_segments_of_a_batch_and_not_the_batch_before(num_mem_tokens):
    """The loss of a batch's last segment reaches its first segment through the memory alone (m > 0;
    with m = 0 it does not: the windows are independent), and no segment of the previous batch: the
    memory carried across batches is detached (`LMBase`, `detach_memory`)."""
    model = rmt(num_mem_tokens=num_mem_tokens).train()
    embedded: list[torch.Tensor] = []

    def keep(module, args, output):
        output.retain_grad()
        embedded.append(output)

    handle = model.lm.get_input_embeddings().register_forward_hook(keep)
    first = model.step(windows(seed=1), None)
    second = model.step(windows(seed=2), detach_memory(first.memory))
    handle.remove()
    second.nll[:, -1].sum().backward()
    previous, current = embedded[:3], embedded[3:]
    assert all(e.grad is None for e in previous)
    reached = [bool(e.grad.abs().sum() > 0) for e in current]
    assert reached == ([True, True, True] if num_mem_tokens else [False, False, True])


def test_the_segment_by_segment_backward_equals_the_plain_one():
    batch = windows()
    batch["reset"][1, 1] = True  # so the initial memory is read, and gets a gradient
    carried = MemoryTokens(torch.randn(2, 3, D, generator=torch.Generator().manual_seed(5)))
    grads = {}
    for lean in (False, True):
        model = rmt(num_mem_tokens=3, checkpoint_segments=lean).train()
        out = model.step(batch, carried)
        (out.nll.mean() + out.memory.state.square().mean()).backward()
        grads[lean] = (out.nll.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    torch.testing.assert_close(grads[True][0], grads[False][0], rtol=0, atol=0)
    for name, grad in grads[False][1].items():
        torch.testing.assert_close(grads[True][1][name], grad, rtol=1e-5, atol=1e-7, msg=name)
    assert grads[False][1]["memory_cell.memory"].abs().sum() > 0


def test_a_reset_row_reads_the_initial_memory_and_then_equals_a_fresh_run():
    model = rmt(num_mem_tokens=3).eval()
    batch = windows(n_windows=4)
    batch["reset"][1, 2] = True  # row 1 starts a document at window 2
    carried = MemoryTokens(torch.randn(2, 3, D, generator=torch.Generator().manual_seed(3)))
    calls = BackboneCalls(model.lm)
    with torch.no_grad():
        out = model.step(batch, carried)
        fresh = model.step({key: value[1:, 2:] for key, value in batch.items()}, None)
        unreset = model.step({**batch, "reset": torch.zeros_like(batch["reset"])}, carried)
    calls.remove()
    initial = model.memory_cell.memory.detach()
    assert torch.equal(calls.inputs[0][:, :3], carried.state)  # rows read the carried memory ...
    assert torch.equal(calls.inputs[2][1, :3], initial)  # ... the reset row its initial memory
    assert not torch.equal(calls.inputs[2][0, :3], initial)
    assert torch.equal(out.nll[1:, 2:], fresh.nll)
    assert torch.equal(out.nll[0], unreset.nll[0]) and not torch.allclose(out.nll[1, 2:], unreset.nll[1, 2:])


def test_reset_rows_makes_those_rows_read_the_initial_memory_at_the_next_batch():
    """`MemoryTokens.reset_rows` (the `RowMemory` protocol): the next batch reads as if those rows'
    first segment started a document; the empty memory reads as no memory."""
    model = rmt(num_mem_tokens=3).eval()
    batch = windows()
    carried = MemoryTokens(torch.randn(2, 3, D, generator=torch.Generator().manual_seed(3)))
    started = batch["reset"].clone()
    started[1, 0] = True
    with torch.no_grad():
        cleared = model.step(batch, carried.reset_rows(torch.tensor([False, True]))).nll
        assert torch.equal(cleared, model.step({**batch, "reset": started}, carried).nll)
        assert torch.equal(model.step(batch, model.init_memory(2)).nll, model.step(batch, None).nll)
        assert torch.equal(cleared[0], model.step(batch, carried).nll[0])


def test_evaluation_carried_across_batches_equals_one_batch_of_all_windows():
    """What the memory carries between batches is exactly what it carries between the windows of one
    batch (`LMBase` hands it over), so splitting the stream into batches changes no number."""
    model = rmt(num_mem_tokens=3).eval()
    batch = windows(n_windows=6)
    with torch.no_grad():
        whole = model.step(batch, None)
        memory, parts = None, []
        for start in range(0, 6, 2):
            out = model.step({key: value[:, start : start + 2] for key, value in batch.items()}, memory)
            memory = detach_memory(out.memory)
            parts.append(out.nll)
    assert torch.equal(torch.cat(parts, 1), whole.nll)
    assert torch.equal(memory.state, whole.memory.state)


def test_fresh_training_samples_and_reset_evaluation_start_every_batch_or_window_from_the_initial_memory():
    carried = MemoryTokens(torch.randn(2, 3, D))
    batch = windows()
    fresh = rmt(train_memory="fresh").train()
    with torch.no_grad():
        assert torch.equal(fresh.step(batch, carried).nll, fresh.step(batch, None).nll)
        cut = rmt(eval_memory="reset").eval()
        nll = cut.step(batch, carried).nll
        alone = [
            cut.step({key: value[:, k : k + 1] for key, value in batch.items()}, None).nll for k in range(3)
        ]
    assert torch.equal(nll, torch.cat(alone, 1))


def test_restarting_every_k_segments_evaluates_samples_of_k_segments_from_the_initial_memory():
    """`eval_restart_every: K` (the authors' evaluation of a model trained on samples of K segments):
    the stream, in batches of any size, scores what each K-segment sample scores alone from the
    initial memory; a new evaluation (no memory) counts from its first segment again."""
    model = rmt(eval_restart_every=2).eval()
    batch = windows(n_windows=6)

    def sample(k: int) -> torch.Tensor:
        return model.step({key: value[:, k : k + 2] for key, value in batch.items()}, None).nll

    with torch.no_grad():
        memory, parts = None, []
        for start in range(0, 6, 3):  # batches of 3 windows, across the samples' boundaries
            out = model.step({key: value[:, start : start + 3] for key, value in batch.items()}, memory)
            memory = detach_memory(out.memory)
            parts.append(out.nll)
        whole = torch.cat(parts, 1)
        again = model.step(batch, None).nll  # a second evaluation counts from its first segment again
        samples = [sample(k) for k in (0, 2, 4)]
        carried = rmt().eval().step(batch, None).nll
    assert torch.equal(whole, torch.cat(samples, 1)) and torch.equal(again, whole)
    assert not torch.equal(carried[:, 2:], whole[:, 2:])  # the restarts change what the memory holds


@pytest.mark.parametrize(
    ("knobs", "begins"),
    [({"eval_restart_every": 2}, [0, 0, 2, 2, 4, 4]), ({"eval_memory": "reset"}, [0, 1, 2, 3, 4, 5]),
     ({}, [0] * 6)],
)  # fmt: skip
def test_the_memory_start_is_where_the_evaluation_last_restarted_the_memory(knobs, begins):
    """token_nll.npz `memory_start` (`evaluation_memory_start`, what `report`'s recall by segments
    back reads): samples of 2 segments, each segment alone, the row's start; a target's loss depends
    on no token before it and on the segments between it and the target's own."""
    model = rmt(**knobs).eval()
    assert (
        assert_losses_depend_on_windows_from_their_memory_start(model, windows(n_windows=6), VOCAB) == begins
    )


def test_the_state_size_is_the_memory_a_row_carries_to_its_next_segment():
    """m·d (`LMBase.state_size`, numbers per layer carried across segments at evaluation): what a row's
    memory holds after a batch; none when every segment reads the initial memory."""
    model = rmt(num_mem_tokens=3).eval()
    with torch.no_grad():
        memory = model.step(windows(), None).memory
    assert model.state_size() == memory.state[0].numel() == 3 * D
    assert rmt(eval_memory="reset").state_size() == 0


def test_the_evaluation_footprint_is_a_gpt2_window_of_the_segment_and_its_memory_tokens():
    """What `context` checks before it allocates (`footprint`): the windowed GPT-2's tensors at T + 2m
    positions, plus the (B, m, d) memory carried; at m = 0 exactly the windowed GPT-2's."""
    from longctx.methods.recurrence.module import RecurrentGPT2LM

    window = RecurrentGPT2LM(vocab_size=VOCAB, gpt2_config=GPT2, recurrence=False)
    assert rmt(num_mem_tokens=0).evaluation_elements(4, 16) == window.evaluation_elements(4, 16)
    assert rmt(num_mem_tokens=3).evaluation_elements(4, 16) == window.evaluation_elements(4, 22) + 4 * 3 * D


def test_the_initial_memory_is_drawn_at_the_scale_of_the_token_embedding():
    embedding = torch.randn(1000, 64) * 0.3
    torch.manual_seed(0)
    cell = MemoryCell.Config(num_mem_tokens=400).build(embedding)
    assert cell.memory.shape == (400, 64) and cell.memory.requires_grad
    assert cell.memory.std().item() == pytest.approx(0.3, rel=0.02)
    torch.manual_seed(0)
    assert torch.equal(MemoryCell.Config(num_mem_tokens=400).build(embedding).memory, cell.memory)


def test_a_segment_and_its_memory_beyond_the_positions_is_refused_in_one_line():
    model = rmt(num_mem_tokens=3)  # 40 positions: T + 6 <= 40
    model.step(windows(length=34), None)
    with pytest.raises(DataMismatch, match=r"^segments of 35 tokens with 3 memory tokens read and 3 written "
                       r"need T \+ 2m = 41 positions, the GPT-2 has 40: lower data.tgt_len"):  # fmt: skip
        model.step(windows(length=35), None)


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"num_mem_tokens": -1}, r"^num_mem_tokens \(m\) must be 0 or more, got -1$"),
        ({"train_memory": "random"}, r"^train_memory must be 'carried' or 'fresh', got 'random'$"),
        ({"eval_memory": "fresh"}, r"^eval_memory must be 'carried' or 'reset', got 'fresh'$"),
        ({"eval_restart_every": 0}, r"^eval_restart_every must be at least 1 \(or null: never\), got 0$"),
    ],
)
def test_a_bad_knob_is_one_line(knobs, message):
    with pytest.raises(ValueError, match=message):
        rmt(**knobs)


# ------------------------------------------------------------------ FLOPs
def test_flops_per_token_match_torchs_counter_over_the_memory_positions():
    """torch counts every product of the forward; Kaplan's count (the recurrent GPT-2's) takes the
    attention as n_ctx·d per position, i.e. one of the two (T + 2m)² products torch's math SDPA
    multiplies. The backbone runs over T + 2m positions, the LM head over T."""
    model, m, length, batch = rmt(num_mem_tokens=3).eval(), 3, 8, 2
    x = windows(batch=batch, n_windows=1, length=length)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model.step(x, None)
    positions = length + 2 * m
    value_products = N_LAYER * 2 * batch * positions * positions * D  # probs·v, left out by Kaplan
    expected = flops_per_token(N_LAYER, D, 4 * D, VOCAB, length, m) * batch * length
    assert counter.get_total_flops() - value_products == expected
    assert model.flops_per_token(length) == flops_per_token(N_LAYER, D, 4 * D, VOCAB, length, m)


@pytest.mark.parametrize("overlap", [0, 3])
def test_without_memory_tokens_the_flops_are_the_windowed_gpt2s(overlap):
    model = rmt(num_mem_tokens=0)
    windowed = hf_model_flops_per_scored_token(model.lm, 16, overlap, output_layer=True)
    assert flops_per_token(N_LAYER, D, 4 * D, VOCAB, 16, 0, overlap) == pytest.approx(windowed, rel=1e-12)
    assert flops_per_token(N_LAYER, D, 4 * D, VOCAB, 16, 4, overlap) > windowed


# ------------------------------------------------------------------ knobs, checkpoints, curriculum
def test_the_module_from_its_group_as_a_dataclass_equals_the_one_from_a_dict():
    torch.manual_seed(0)
    grouped = RecurrentMemoryLM(vocab_size=VOCAB, gpt2_config=GPT2, memory_cell=MemoryCell.Config(5))
    torch.manual_seed(0)
    from_dict = RecurrentMemoryLM(vocab_size=VOCAB, gpt2_config=GPT2, memory_cell={"num_mem_tokens": 5})
    assert grouped.memory_cell.config == from_dict.memory_cell.config == MemoryCell.Config(num_mem_tokens=5)
    assert grouped.hparams["memory_cell"] == from_dict.hparams["memory_cell"] == {"num_mem_tokens": 5}
    assert_same_weights(grouped, from_dict)
    assert [k for k in grouped.state_dict() if not k.startswith("lm.")] == ["memory_cell.memory"]


def test_a_stage_starts_from_the_previous_stages_weights_only(tmp_path):
    """The curriculum's hand-over: `pretrained: <stage k − 1>.ckpt` gives the GPT-2 and the initial
    memory, nothing else (the optimizer and schedule start afresh, as in the authors' stages)."""
    stage = rmt(num_mem_tokens=3, seed=0)
    checkpoint = {"state_dict": stage.state_dict(), "optimizer_states": ["not read"]}
    stage.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, tmp_path / "best.ckpt")
    torch.manual_seed(1)
    best = str(tmp_path / "best.ckpt")
    following = RecurrentMemoryLM(vocab_size=VOCAB, pretrained=best, memory_cell={"num_mem_tokens": 3})
    assert following.lm.training  # fine-tuned with dropout on
    assert_same_weights(following, stage)
    with pytest.raises(ValueError, match=r"has 3 memory tokens of width 32, this model 4 of width 32: set "):
        RecurrentMemoryLM(vocab_size=VOCAB, pretrained=best, memory_cell={"num_mem_tokens": 4})


def test_a_recurrent_gpt2_checkpoint_gives_its_gpt2_and_a_fresh_memory(tmp_path):
    from longctx.methods.recurrence.module import RecurrentGPT2LM

    torch.manual_seed(0)
    window = RecurrentGPT2LM(vocab_size=VOCAB, gpt2_config=GPT2, recurrence=False)
    checkpoint = {"state_dict": window.state_dict()}
    window.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, tmp_path / "last.ckpt")
    last = str(tmp_path / "last.ckpt")
    model = RecurrentMemoryLM(vocab_size=VOCAB, pretrained=last, memory_cell={"num_mem_tokens": 2})
    for name, tensor in window.lm.state_dict().items():
        assert torch.equal(model.lm.state_dict()[name], tensor), name
    embedding_std = window.lm.get_input_embeddings().weight.std()
    assert (
        model.memory_cell.memory.shape == (2, D) and model.memory_cell.memory.abs().max() < 10 * embedding_std
    )


@pytest.mark.slow  # through the CLI (~14 s here)
def test_recipe_config_trains_two_steps_through_the_cli(tmp_path, monkeypatch):
    """configs/recurrent_memory_tiny.yaml built by the CLI, on the bundled sample text (bytes; the
    config's own text lives in ../shared): 2 training steps of K = 2 windows, a validation, FLOPs
    logged, the best checkpoint under the fixed name the curriculum reads."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    cli = main([
        "fit",
        "--config", str(REPO / "configs" / "recurrent_memory_tiny.yaml"),
        "--data.corpus", "sample", "--data.split_sources", "null", "--data.tokenizer", "null",
        "--data.cache_dir", str(tmp_path / "cache"), "--data.windows_per_batch", "2",
        "--model.init_args.gpt2_config", "{n_layer: 1, n_embd: 32, n_head: 2, n_positions: 80}",
        "--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "2",
        "--trainer.enable_progress_bar", "false", "--run_name", "rmt",
    ])  # fmt: skip
    model, metrics = cli.model, cli.trainer.callback_metrics
    assert isinstance(model, RecurrentMemoryLM) and cli.trainer.global_step == 2
    assert math.isfinite(float(metrics["train/loss"])) and float(metrics["val/loss"]) < math.log(256) + 0.5
    assert float(metrics["val/flops_per_token"]) == model.flops_per_token(64)
    assert (tmp_path / "runs" / "rmt" / "checkpoints" / "best.ckpt").is_file()


@pytest.mark.parametrize("sweep", ["recurrent_memory_curriculum_tiny.txt", "recurrent_memory_curriculum.txt"])
def test_each_curriculum_stage_starts_from_the_previous_stages_best_checkpoint(sweep):
    """The staged sweep: K grows from 1, each line's `pretrained` is the best checkpoint the line
    before it writes (checkpoints/best.ckpt: `configs/base/callbacks/val_loss_best.yaml`), and every
    line resumes its own run (`--ckpt_path last`), so a stopped curriculum restarts at its stage and step."""
    lines = [
        shlex.split(line, comments=True)
        for line in (REPO / "slurm" / "sweeps" / sweep).read_text().splitlines()
    ]
    lines = [args for args in lines if args]
    stages, previous = [], None
    for args in lines:
        options = dict(zip(args[1::2], args[2::2], strict=False))
        assert args[0] == "fit" and options["--ckpt_path"] == "last"
        stages.append(int(options["--data.windows_per_batch"]))
        pretrained = options.get("--model.init_args.pretrained")
        assert pretrained == (None if previous is None else f"runs/{previous}/checkpoints/best.ckpt")
        previous = options["--run_name"]
        config = load_config(REPO / options["--config"])
        assert config["trainer.callbacks"].endswith("callbacks/val_loss_best.yaml")
    assert stages[0] == 1 and stages == sorted(set(stages)) and stages[1] == 2


@pytest.mark.slow  # two fits through the sweep runner, then the runner again (~60 s here)
def test_a_curriculum_runs_stage_after_stage_and_a_restart_skips_the_finished_stages(tmp_path):
    """A two-stage curriculum as the staged sweep runs it (`python -m longctx.sweep run`, every line
    `--ckpt_path last`): stage 2 starts from stage 1's best weights, GPT-2 and initial memory (with a
    learning rate of 0 its weights stay exactly those), and the same command again runs nothing."""
    tiny = (
        f"--config {REPO / 'configs' / 'recurrent_memory_tiny.yaml'} --data.corpus sample "
        f"--data.split_sources null --data.tokenizer null --data.cache_dir {tmp_path / 'cache'} "
        "--trainer.max_steps 2 --trainer.val_check_interval 2 --trainer.limit_val_batches 2 "
        "--trainer.logger false --trainer.enable_progress_bar false --model.init_args.train_memory fresh "
        "--ckpt_path last"
    )
    gpt2 = shlex.quote("{n_layer: 1, n_embd: 32, n_head: 2, n_positions: 80}")
    sweep = tmp_path / "curriculum.txt"
    sweep.write_text(
        f"fit {tiny} --data.windows_per_batch 1 --model.init_args.gpt2_config {gpt2} --run_name stage_1\n"
        f"fit {tiny} --data.windows_per_batch 2 --model.init_args.gpt2_config null "
        "--model.init_args.pretrained runs/stage_1/checkpoints/best.ckpt "
        "--model.init_args.optimizer.init_args.lr 0 --run_name stage_2\n"
    )
    env = {"WANDB_MODE": "disabled", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}

    def sweep_run() -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "longctx.sweep", "run", str(sweep)]
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)

    first = sweep_run()
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    best = load_tensors_file(tmp_path / "runs/stage_1/checkpoints/best.ckpt")["state_dict"]
    following = load_tensors_file(tmp_path / "runs/stage_2/checkpoints/last.ckpt")
    assert following["global_step"] == 2 and following["state_dict"].keys() == best.keys()
    for name, tensor in best.items():
        assert torch.equal(following["state_dict"][name], tensor), name
    again = sweep_run()
    assert again.returncode == 0 and again.stdout.count("finished earlier, skipped") == 2, again.stdout


def load_config(path: Path) -> dict:
    """A config's dotted keys over its bases' (the files it names as `config:`)."""
    raw = yaml.safe_load(path.read_text())
    base = load_config(path.parent / raw.pop("config")) if "config" in raw else {}
    return {**base, **raw}


@pytest.mark.slow  # four parses of the CLI (~11 s here)
def test_through_the_cli_a_bad_memory_is_one_line(tmp_path, monkeypatch):
    """m < 0 when the config is made; T + 2m beyond the GPT-2's positions at the first segment (the
    data's window length is not known before); a stage checkpoint with another m, or not written yet,
    when it is read."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    args = [
        "fit", "--config", str(REPO / "configs" / "recurrent_memory_tiny.yaml"),
        "--data.corpus", "sample", "--data.split_sources", "null", "--data.tokenizer", "null",
        "--data.cache_dir", str(tmp_path / "cache"), "--trainer.logger", "false", "--trainer.max_steps", "1",
        "--trainer.enable_progress_bar", "false",
    ]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--model.init_args.memory_cell.num_mem_tokens", "-1"])
    assert exit_info.value.code == (
        "error: model.init_args.memory_cell: MemoryCellConfig: num_mem_tokens (m) must be 0 or more, got -1"
    )
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--model.init_args.memory_cell.num_mem_tokens", "40", "--run_name", "positions"])
    assert exit_info.value.code == (
        "error: segments of 64 tokens with 40 memory tokens read and 40 written need T + 2m = 144 positions, "
        "the GPT-2 has 128: lower data.tgt_len and data.eval_tgt_len or "
        "model.init_args.memory_cell.num_mem_tokens (a GPT-2 from scratch: raise "
        "model.init_args.gpt2_config.n_positions)"
    )
    stage = RecurrentMemoryLM(vocab_size=256, gpt2_config=GPT2, memory_cell={"num_mem_tokens": 3})  # bytes
    checkpoint = {"state_dict": stage.state_dict()}
    stage.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, tmp_path / "best.ckpt")
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--model.init_args.gpt2_config", "null", "--model.init_args.pretrained", "best.ckpt"])
    assert exit_info.value.code == (
        "error: model: RecurrentMemoryLM: best.ckpt has 3 memory tokens of width 32, this model 8 of width "
        "32: set model.init_args.memory_cell.num_mem_tokens to 3"
    )
    with pytest.raises(SystemExit) as exit_info:  # a stage run before the one it starts from
        main(
            [
                *args,
                "--model.init_args.gpt2_config",
                "null",
                "--model.init_args.pretrained",
                "stage/best.ckpt",
            ]
        )
    assert exit_info.value.code == "error: model: RecurrentMemoryLM: stage/best.ckpt: no such file"
