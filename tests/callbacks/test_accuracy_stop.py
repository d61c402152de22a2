"""`--recall_stop.min_acc`: the fit stops at the first validation whose recall reaches the threshold,
within the step budget, and records that step (summary.json `recall_stop`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from longctx.callbacks.accuracy_stop import StopAtAccuracy
from longctx.core.base import LMBase, StepOutput
from longctx.core.recall import TargetMarks
from tests.helpers.lm_fixtures import SyntheticData, cpu_trainer
from tests.helpers.methods import VOCAB

MARKS = TargetMarks(np.arange(5, 400, 10), np.arange(40) % 4)  # 10 episodes of 4 queries


class LearnsAtStepLM(LMBase):
    """Its validation recall jumps from 0 to 1 once `learned_at` optimizer steps are done."""

    def __init__(self, learned_at: int) -> None:
        super().__init__(vocab_size=VOCAB)
        self.learned_at = learned_at
        self.weight = nn.Parameter(torch.zeros(()))

    def step(self, batch: dict[str, Tensor], memory: None) -> StepOutput:
        nll = torch.ones_like(batch["target"], dtype=torch.float32) + self.weight.square()
        learned = self.global_step >= self.learned_at
        correct = torch.full_like(batch["target"], learned, dtype=torch.bool) if self.wants_correct else None
        return StepOutput(nll=nll, correct=correct)


def fit(
    tmp_path, learned_at: int, max_steps: int = 20, marks: TargetMarks = MARKS, **stop
) -> tuple[StopAtAccuracy, int]:
    """Validate every 3 steps; returns the callback and the step the fit ended at."""
    callback = StopAtAccuracy(**stop)
    trainer = cpu_trainer(
        tmp_path, max_steps=max_steps, val_check_interval=3, callbacks=[callback], num_sanity_val_steps=0
    )
    data = SyntheticData(n_tokens=2001, batch_size=2, eval_batch_size=4, marks=marks)
    trainer.fit(LearnsAtStepLM(learned_at), datamodule=data)
    return callback, trainer.global_step


def test_the_fit_stops_at_the_first_validation_at_the_threshold_and_records_its_step(tmp_path):
    callback, ended = fit(tmp_path, learned_at=7, min_acc=0.99)
    # Validations at steps 3, 6, 9, ...: the first after step 7 is at 9.
    assert ended == callback.reached_step == 9 and callback.reached_value == 1.0
    assert callback.summary_fields() == {
        "recall_stop": {
            "monitor": "val/recall_acc_first",
            "min_acc": 0.99,
            "reached_step": 9,
            "reached_value": 1.0,
            "global_step": 9,
        }
    }


def test_a_threshold_not_reached_runs_the_budget_and_says_so(tmp_path):
    callback, ended = fit(tmp_path, learned_at=100, max_steps=12, min_acc=0.99)
    assert ended == 12 and callback.reached_step is None
    assert callback.summary_fields()["recall_stop"]["reached_step"] is None


def test_no_threshold_never_stops_nor_records(tmp_path):
    callback, ended = fit(tmp_path, learned_at=0, max_steps=12)
    assert ended == 12 and callback.summary_fields() == {}


def test_answers_without_query_order_are_watched_all_together(tmp_path):
    """Marks without episodes (the copy task; a recall text not written one episode per line): the
    first query means nothing, so the rule watches every answer (stricter at 0.99)."""
    callback, ended = fit(tmp_path, learned_at=7, min_acc=0.99, marks=TargetMarks(MARKS.offset))
    assert ended == callback.reached_step == 9
    assert callback.summary_fields()["recall_stop"]["monitor"] == "val/recall_acc"


def test_a_threshold_on_text_without_marks_is_refused_before_any_step(tmp_path):
    trainer = cpu_trainer(tmp_path, max_steps=5, callbacks=[StopAtAccuracy(min_acc=0.99)])
    with pytest.raises(
        ValueError, match=r"^recall_stop\.min_acc 0\.99 watches val/recall_acc_first, but the "
    ):
        trainer.fit(LearnsAtStepLM(0), datamodule=SyntheticData(n_tokens=2001))
    assert trainer.global_step == 0


@pytest.mark.parametrize(
    "knobs,message",
    [
        ({"min_acc": 1.5}, r"^recall_stop\.min_acc is an accuracy in \(0, 1\], got 1\.5$"),
        (
            {"min_acc": 0.9, "monitor": "test/recall_acc"},
            r"^recall_stop\.monitor must be a validation metric",
        ),
    ],
)
def test_bad_knobs_are_refused(knobs, message):
    with pytest.raises(ValueError, match=message):
        StopAtAccuracy(**knobs)
