"""Checkpoints saved before the knob groups load through `LMBase.load_from_checkpoint`, which upgrades
their flat hyperparameters into the groups (`knob_groups.upgrade_flat`): the same module, the same
weights and the same loss as from the checkpoint saved with the groups. A module's constructor takes
groups only: a flat keyword is refused in one line naming the group it moved to."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from longctx.core.base import LMBase
from longctx.core.knob_groups import group_types
from tests.helpers.knob_checks import assert_same_weights, save_with_hparams
from tests.helpers.methods import TINY, tiny

# Every method, and Transformer-XL with TRAMS on (an optional group given).
CASES = {
    **{name: (method.build, method.data) for name, method in TINY.items()},
    "trams": (
        lambda: tiny("transformer_xl", protocol="trams", trams={"attended": 8, "kept": 4}),
        TINY["transformer_xl"].data,
    ),
}
# What LightningCLI adds to a run's hyperparameters (the checkpoints users hold come from CLI runs).
CLI_KEYS = {"_instantiator": "lightning.pytorch.cli.instantiate_module"}


def flat_form(model: LMBase) -> dict:
    """`model`'s hyperparameters as versions before the knob groups saved them: every argument at the
    top level, a group's fields under the group's prefix (`evaluation.mem_len` as `eval_mem_len`), a
    group switched off (None) as its fields with None for the required ones (`trams_attended=None`), or
    absent when it has none (it cannot be told from the group at its defaults)."""
    cls = type(model)
    flat = {}
    for name, value in model.hparams.items():
        if name not in (groups := group_types(cls.__init__)):
            flat[name] = value
            continue
        group, _ = groups[name]
        required = [f for f in dataclasses.fields(group) if f.default is dataclasses.MISSING]
        if value is None and not required:
            continue  # a group off whose fields all have defaults (RMT's xl_config) had no flat form: absent
        if value is None:
            value = {
                f.name: None if f.default is dataclasses.MISSING else f.default
                for f in dataclasses.fields(group)
            }
        flat.update({cls.flat_prefixes.get(name, "") + field: v for field, v in value.items()})
    return flat


def evaluation_loss(model: LMBase, data_class: type) -> torch.Tensor:
    """The per-token NLL of two evaluation batches, the second reading the first's memory."""
    data = data_class(n_tokens=200, eval_batch_size=2, seq_len=16)
    data.trainer = SimpleNamespace(global_rank=0, world_size=1)
    model.eval()
    memory, nll = model.init_memory(2), []
    with torch.no_grad():
        for _, batch in zip(range(2), data.val_dataloader(), strict=False):
            out = model.step(batch, memory)
            memory, nll = out.memory, [*nll, out.nll]
    return torch.cat([n.flatten() for n in nll])


def cli_checkpoint(model: LMBase, hparams: dict, path: Path) -> Path:
    cls = type(model)
    return save_with_hparams(
        model, {"_class_path": f"{cls.__module__}.{cls.__qualname__}", **CLI_KEYS, **hparams}, path
    )


@pytest.mark.parametrize("case", list(CASES))
def test_a_checkpoint_with_flat_hyperparameters_loads_as_the_one_with_groups(case, tmp_path):
    build, data_class = CASES[case]
    torch.manual_seed(0)
    model = build()
    flat = flat_form(model)
    assert not set(flat) & set(group_types(type(model).__init__))  # no group left: the old form
    grouped_path = cli_checkpoint(model, dict(model.hparams), tmp_path / "grouped.ckpt")
    flat_path = cli_checkpoint(model, flat, tmp_path / "flat.ckpt")
    grouped, upgraded = (type(model).load_from_checkpoint(path) for path in (grouped_path, flat_path))
    assert dict(upgraded.hparams) == dict(grouped.hparams) == dict(model.hparams)
    assert_same_weights(upgraded, grouped)
    assert torch.equal(evaluation_loss(upgraded, data_class), evaluation_loss(grouped, data_class))


@pytest.mark.parametrize("method", list(TINY))
def test_a_flat_keyword_is_refused_in_one_line_naming_its_group(method):
    cls = type(TINY[method].build())
    name, (group, _) = next(iter(group_types(cls.__init__).items()))
    field = dataclasses.fields(group)[0].name
    flat = cls.flat_prefixes.get(name, "") + field
    expected = (
        f"{cls.__name__}() takes its knobs in groups: {flat} is {name}.{field} ({name}={{{field!r}: ...}})"
    )
    with pytest.raises(TypeError) as refused:
        cls(vocab_size=64, **{flat: getattr(group(), field)})
    assert str(refused.value) == expected
    with pytest.raises(TypeError) as refused_at_loading:
        cls.load_from_checkpoint("never read.ckpt", **{flat: getattr(group(), field)})
    assert str(refused_at_loading.value) == expected


def test_a_group_given_at_loading_overrides_only_the_fields_it_names(tmp_path):
    model = tiny("transformer_xl", evaluation={"mem_len": 12, "same_length": True})
    path = save_with_hparams(model, dict(model.hparams), tmp_path / "xl.ckpt")
    loaded = type(model).load_from_checkpoint(path, evaluation={"mem_len": 20})
    assert loaded.hparams["evaluation"] == {**model.hparams["evaluation"], "mem_len": 20}
    assert (loaded.eval_lengths.mem_len, loaded.eval_lengths.same_length) == (20, True)
