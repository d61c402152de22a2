"""Knob groups (`longctx.core.knob_groups`): a module's knobs as dataclasses or dicts of their fields; the
flat names of checkpoints saved before the groups moved into them where a checkpoint is read, and
refused, naming the group, where a module is built."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from longctx.core.base import LMBase
from longctx.core.knob_groups import as_group, override_groups, rename_knobs
from longctx.methods.transformer_xl.network import TransformerXL


@dataclass(frozen=True)
class Sizes:
    d_model: int = 8
    n_layers: int = 2


@dataclass(frozen=True)
class Evaluation:
    mem_len: int | None = None
    same_length: bool | None = None


@dataclass(frozen=True)
class Selection:
    attended: int  # required: the switch
    metric: str = "code"


class Knobbed(LMBase):
    flat_prefixes: ClassVar[dict[str, str]] = {"evaluation": "eval_", "selection": "sel_"}

    def __init__(
        self,
        vocab_size: int = 5,
        network: Sizes = Sizes(),
        evaluation: Evaluation = Evaluation(),
        selection: Selection | None = None,
        protocol: str = "xl",
    ) -> None:
        groups = self.read_groups(dict(network=network, evaluation=evaluation, selection=selection))
        network, evaluation, selection = groups["network"], groups["evaluation"], groups["selection"]
        super().__init__(vocab_size=vocab_size)
        self.save_hyperparameters()
        self.groups = groups
        self.layer = torch.nn.Linear(network.d_model, network.d_model)


def test_groups_are_read_from_dataclasses_or_dicts_and_default_when_required():
    model = Knobbed(network={"d_model": 4}, evaluation=Evaluation(mem_len=7), protocol="trams")
    assert model.groups["network"] == Sizes(d_model=4, n_layers=2)
    assert model.groups["evaluation"] == Evaluation(mem_len=7)
    assert model.groups["selection"] is None
    assert Knobbed(network=None).groups["network"] == Sizes()  # a required group: its defaults


def test_a_flat_keyword_is_refused_in_one_line_naming_its_group():
    with pytest.raises(TypeError) as refused:
        Knobbed(network={"d_model": 4}, eval_mem_len=7, sel_attended=3)
    assert str(refused.value) == (
        "Knobbed() takes its knobs in groups: eval_mem_len is evaluation.mem_len "
        "(evaluation={'mem_len': ...}); sel_attended is selection.attended (selection={'attended': ...})"
    )
    with pytest.raises(TypeError, match=r"Knobbed.__init__\(\) got an unexpected keyword argument 'mem_len'"):
        Knobbed(mem_len=3)  # evaluation's field, but only under its prefix: Python's own refusal


def test_the_upgrade_moves_flat_keys_into_their_groups_after_the_prefix():
    saved = {"_class_path": "x.Knobbed", "vocab_size": 5, "d_model": 4, "n_layers": 3, "eval_mem_len": 7,
             "eval_same_length": None, "protocol": "trams"}  # fmt: skip
    assert Knobbed.upgrade_hyperparameters(saved) == {
        "_class_path": "x.Knobbed",
        "vocab_size": 5,
        "network": {"d_model": 4, "n_layers": 3},
        "evaluation": {"mem_len": 7, "same_length": None},
        "protocol": "trams",
    }
    grouped = {"vocab_size": 5, "network": {"d_model": 4, "n_layers": 2}, "selection": None}
    assert Knobbed.upgrade_hyperparameters(grouped) == grouped  # nothing flat: unchanged
    with pytest.raises(
        ValueError, match=r"^the checkpoint's hyperparameter 'mem_len' is neither an argument"
    ):
        Knobbed.upgrade_hyperparameters({"mem_len": 3})  # dropped in silence it would change the model


def test_the_upgrade_switches_an_optional_group_on_only_by_its_required_fields():
    # Checkpoints of earlier versions hold every flat knob, the switch None among them: still off.
    upgrade = Knobbed.upgrade_hyperparameters
    assert upgrade({"sel_attended": None, "sel_metric": "code"})["selection"] is None
    assert upgrade({"sel_attended": 3})["selection"] == {"attended": 3}
    on = upgrade({"selection": {"attended": 2, "metric": "paper"}, "sel_metric": "oracle"})
    assert on["selection"] == {"attended": 2, "metric": "oracle"}  # a flat key overrides the group's field


def test_a_groups_dict_overrides_only_the_fields_it_names():
    saved = {"network": {"d_model": 4, "n_layers": 2}, "selection": None, "protocol": "xl"}
    merged = override_groups(
        saved, {"network": {"n_layers": 3}, "selection": {"attended": 1}, "protocol": "t"}
    )
    assert merged == {"network": {"d_model": 4, "n_layers": 3}, "selection": {"attended": 1}, "protocol": "t"}
    assert override_groups(saved, {"network": Sizes(d_model=8)})["network"] == Sizes(d_model=8)  # replaced


def test_groups_are_saved_as_plain_dicts_and_load_back():
    model = Knobbed(network={"d_model": 4}, evaluation={"mem_len": 7}, selection=Selection(attended=3))
    assert model.hparams["network"] == {"d_model": 4, "n_layers": 2}
    assert model.hparams["selection"] == {"attended": 3, "metric": "code"}
    buffer = io.BytesIO()
    torch.save({"hyper_parameters": dict(model.hparams)}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)["hyper_parameters"]  # plain values only
    again = Knobbed(**saved)
    assert again.groups == model.groups


def test_flatten_knobs_gives_a_run_configs_groups_their_flat_names():
    init_args = {"network": {"d_model": 4, "n_layers": 2}, "evaluation": {"mem_len": 7, "same_length": None}}
    flat = Knobbed.flatten_knobs({**init_args, "selection": None, "protocol": "xl"})
    assert flat == {
        "d_model": 4,
        "n_layers": 2,
        "eval_mem_len": 7,
        "eval_same_length": None,
        "protocol": "xl",
    }
    assert Knobbed.flatten_knobs({"d_model": 4, "eval_mem_len": 7}) == {"d_model": 4, "eval_mem_len": 7}


def test_a_renamed_field_is_read_under_its_old_name_grouped_or_flat():
    renamed = {"evaluation.same_length": "evaluation.same_len"}
    grouped = {"network": {"d_model": 4}, "evaluation": {"mem_len": 7, "same_length": True}}
    assert rename_knobs(grouped, renamed, Knobbed.flat_prefixes) == {
        "network": {"d_model": 4},
        "evaluation": {"mem_len": 7, "same_len": True},
    }
    flat = {"d_model": 4, "eval_same_length": True, "protocol": "xl"}  # before the groups
    assert rename_knobs(flat, renamed, Knobbed.flat_prefixes) == {
        "d_model": 4,
        "eval_same_len": True,
        "protocol": "xl",
    }
    current = {"evaluation": {"same_len": False}}
    assert rename_knobs(current, renamed, Knobbed.flat_prefixes) == current


def test_as_group_reads_a_dataclass_a_dict_or_none():
    assert as_group(Sizes, None) is None
    assert as_group(Sizes, {"d_model": 3}) == Sizes(d_model=3)
    with pytest.raises(TypeError, match="expected a Sizes"):
        as_group(Sizes, 3)


def test_a_network_takes_its_config():
    config = TransformerXL.Config(n_layers=2, d_model=16, n_heads=2, d_inner=32, cutoffs=[4, 8])
    assert config.cutoffs == (4, 8)  # frozen: lists become tuples
    torch.manual_seed(0)
    built = config.build(20)
    torch.manual_seed(0)
    constructed = TransformerXL(20, config)
    assert built.config == constructed.config == config
    assert built.state_dict().keys() == constructed.state_dict().keys()
    for name, tensor in built.state_dict().items():
        torch.testing.assert_close(tensor, constructed.state_dict()[name], rtol=0, atol=0)
    with pytest.raises(ValueError, match="must be even"):
        TransformerXL.Config(d_model=15)
