"""The no-memory baseline: attention against a hand-written softmax, causality, FLOPs against torch's
counter, and the recipe of docs/architecture.md end to end (its config through the CLI, 2 steps)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from longctx.commands.cli import main
from longctx.methods.window_transformer.flops import flops_per_token
from longctx.methods.window_transformer.module import WindowTransformerLM
from longctx.methods.window_transformer.network import CausalSelfAttention, WindowTransformer
from tests.helpers.environment import REPO
from tests.helpers.knob_checks import assert_same_weights, save_with_hparams

SIZES = dict(d_model=24, n_layers=2, n_heads=3, d_inner=40, max_len=16, dropout=0.0)
VOCAB = 37


def test_attention_equals_a_manual_masked_softmax():
    torch.manual_seed(0)
    attn = CausalSelfAttention(d_model=24, n_heads=3, dropout=0.0).double()
    x = torch.randn(2, 7, 24, dtype=torch.double)  # (B, L, d)
    q, k, v = attn.qkv(x).split(24, dim=-1)
    q, k, v = (t.view(2, 7, 3, 8).transpose(1, 2) for t in (q, k, v))  # (B, H, L, d_head)
    scores = q @ k.transpose(-1, -2) / math.sqrt(8)  # (B, H, L, L)
    future = torch.ones(7, 7, dtype=torch.bool).triu(1)  # key j > query i
    probs = scores.masked_fill(future, float("-inf")).softmax(-1)
    expected = attn.out((probs @ v).transpose(1, 2).reshape(2, 7, 24))
    torch.testing.assert_close(attn(x), expected, rtol=1e-12, atol=1e-12)


def test_position_t_sees_tokens_up_to_t_only():
    torch.manual_seed(0)
    net = WindowTransformer.Config(**SIZES).build(VOCAB).eval()
    x = torch.randint(0, 37, (2, 12))
    t = 5
    changed_after = x.clone()
    changed_after[:, t + 1 :] = (x[:, t + 1 :] + 1) % 37
    changed_at = x.clone()
    changed_at[:, t] = (x[:, t] + 1) % 37
    with torch.no_grad():
        logits, after, at = net(x), net(changed_after), net(changed_at)
    assert torch.equal(logits[:, : t + 1], after[:, : t + 1])
    assert not torch.allclose(logits[:, t + 1 :], after[:, t + 1 :])
    assert torch.equal(logits[:, :t], at[:, :t]) and not torch.allclose(logits[:, t], at[:, t])


def test_a_window_longer_than_the_positions_is_refused():
    net = WindowTransformer.Config(**SIZES).build(VOCAB)
    with pytest.raises(ValueError, match=r"window of 17 tokens is longer than max_len=16"):
        net(torch.zeros(1, 17, dtype=torch.long))


def test_flops_per_token_match_torchs_counter_with_causal_attention():
    """torch counts every matrix product of a forward (2 × multiply-accumulates); its math SDPA
    multiplies all L×L query-key pairs, the count keeps the L(L+1)/2 a causal query attends."""
    sizes = {**SIZES, "max_len": 32}
    net = WindowTransformer.Config(**sizes).build(VOCAB).eval()
    B, L, d, n_layers = 3, 32, sizes["d_model"], sizes["n_layers"]
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        net(torch.zeros(B, L, dtype=torch.long))
    all_pairs = n_layers * 2 * 2 * B * L * L * d  # q·k and probs·v over every (query, key)
    causal_pairs = n_layers * 2 * 2 * B * d * (L * (L + 1) // 2)
    counted = counter.get_total_flops() - all_pairs + causal_pairs
    expected = flops_per_token(d, n_layers, sizes["d_inner"], VOCAB, L) * B * L
    assert counted == pytest.approx(expected, rel=1e-12)


def test_recipe_config_trains_two_steps_through_the_cli(tmp_path, monkeypatch):
    """configs/window_transformer_tiny.yaml built by the CLI, on the bundled sample text (the config's
    own text lives in ../shared): 2 training steps, a validation, FLOPs logged."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")  # the config's WandbLogger, a no-op
    cli = main([
        "fit",
        "--config", str(REPO / "configs" / "window_transformer_tiny.yaml"),
        "--data.corpus", "sample",
        "--data.split_sources", "null",
        "--data.cache_dir", str(tmp_path / "cache"),
        "--trainer.max_steps", "2",
        "--trainer.val_check_interval", "2",
        "--trainer.limit_val_batches", "2",
        "--trainer.enable_progress_bar", "false",
        "--run_name", "baseline",
    ])  # fmt: skip
    model, metrics = cli.model, cli.trainer.callback_metrics
    assert isinstance(model, WindowTransformerLM) and cli.trainer.global_step == 2
    assert model.vocab_size == 256  # linked from the data module (sample: bytes)
    assert math.isfinite(float(metrics["train/loss"])) and float(metrics["val/loss"]) < math.log(256) + 0.5
    assert float(metrics["val/flops_per_token"]) == model.flops_per_token(32)
    assert (tmp_path / "runs" / "baseline" / "checkpoints" / "last.ckpt").is_file()


# ------------------------------------------------------------------ knobs (issue 21: one source per knob)
# Recorded before `WindowTransformer.Config` existed: the knobs moved, the weights' names did not.
STATE_DICT_KEYS = [
    "net.token_emb.weight", "net.pos_emb.weight",
    *(
        f"net.blocks.{i}.{name}"
        for i in range(2)
        for name in (
            "ln_attn.weight", "ln_attn.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.out.weight",
            "attn.out.bias", "ln_ff.weight", "ln_ff.bias", "ff.0.weight", "ff.0.bias", "ff.2.weight",
            "ff.2.bias",
        )
    ),
    "net.ln_final.weight", "net.ln_final.bias", "net.head.weight",
]  # fmt: skip
# What `WindowTransformerLM(vocab_size=VOCAB, **SIZES)` saved as hyper_parameters before the group.
FLAT_HPARAMS = dict(vocab_size=VOCAB, **SIZES)
NETWORK = WindowTransformer.Config(d_model=24, n_layers=2, n_heads=3, d_inner=40, max_len=16, dropout=0.0)


def test_the_module_saves_its_network_group_as_a_dict_with_the_keys_of_before():
    torch.manual_seed(0)
    grouped = WindowTransformerLM(vocab_size=37, network=NETWORK)
    assert dict(grouped.hparams) == {"vocab_size": 37, "network": vars(NETWORK)}
    assert list(grouped.state_dict()) == STATE_DICT_KEYS


def test_a_checkpoint_with_the_old_flat_hyperparameters_loads_into_the_same_knobs_and_weights(tmp_path):
    torch.manual_seed(0)
    model = WindowTransformerLM(vocab_size=37, network=NETWORK)
    path = save_with_hparams(model, FLAT_HPARAMS, tmp_path / "flat.ckpt")
    loaded = WindowTransformerLM.load_from_checkpoint(path)
    assert loaded.net.config == NETWORK and dict(loaded.hparams) == dict(model.hparams)
    assert_same_weights(loaded, model)
    # A group's dict at loading overrides the fields it names.
    assert WindowTransformerLM.load_from_checkpoint(path, network={"dropout": 0.3}).net.config.dropout == 0.3


def test_config_build_equals_the_network_from_its_fields():
    torch.manual_seed(0)
    built = NETWORK.build(37)
    torch.manual_seed(0)
    constructed = WindowTransformer(37, NETWORK)
    assert built.config == constructed.config == NETWORK
    assert_same_weights(built, constructed)


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ({"n_heads": 5}, r"^d_model \(128\) must be divisible by n_heads \(5\)$"),
        ({"max_len": 0}, r"^max_len must be at least 1, got 0$"),
        ({"dropout": 1.5}, r"^dropout must be in \[0, 1\), got 1.5$"),
    ],
)
def test_a_bad_network_knob_is_one_line_when_the_config_is_made(field, message):
    with pytest.raises(ValueError, match=message):
        WindowTransformer.Config(**field)


def test_through_the_cli_a_bad_knob_and_a_knob_under_its_old_flat_name_are_one_line(tmp_path, monkeypatch):
    """jsonargparse builds the group before the module (its check would be a traceback); the old flat
    key, and a misspelt one, name where the knob lives now."""
    monkeypatch.chdir(tmp_path)
    args = [
        "fit", "--config", str(REPO / "configs" / "window_transformer_tiny.yaml"),
        "--data.corpus", "sample", "--data.split_sources", "null",
        "--data.cache_dir", str(tmp_path / "cache"), "--trainer.logger", "false",
    ]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--model.init_args.network.n_heads", "5"])
    assert exit_info.value.code == (
        "error: model.init_args.network: WindowTransformerConfig: d_model (128) must be divisible by "
        "n_heads (5)"
    )
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--model.init_args.d_model", "64"])
    assert exit_info.value.code == (
        "error: model: WindowTransformerLM has no option 'd_model' "
        "(it moved to model.init_args.network.d_model)"
    )
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--model.init_args.d_modle", "64"])
    assert exit_info.value.code.endswith("has no option 'd_modle' (did you mean network.d_model?)")
