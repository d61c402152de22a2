"""The memory warm-up a segment-memory method may take (`mem_warmup_steps`): train with a short memory
for the first N optimizer steps (none, or attention capped a few positions back: each method's
docstring says which), then with the configured memory. A memory-length curriculum, in none of the
papers: attention that starts spread over a long memory learns a sharp match later; with a short
memory the same heads first learn what lies close by, then read the long memory with it
(docs/long_range.md "Recall": the recipe's seeds).

On text whose answers are bound beyond their segment there is nothing to learn without the memory,
so the warm-up runs only where at least `mem_warmup_min_within` of the training answers are bound
within their own segment (the data module's `train_answers_within_segment`), decided at every fit
start from the configured steps and this fit's data.
"""

from __future__ import annotations

from lightning.pytorch.utilities.rank_zero import rank_zero_info


def check_memory_warmup(steps: int, min_within: float) -> None:
    """Refuse a negative warm-up or a share outside [0, 1], naming the knob."""
    if steps < 0:
        raise ValueError(f"mem_warmup_steps must be >= 0, got {steps}")
    if not 0.0 <= min_within <= 1.0:
        raise ValueError(f"mem_warmup_min_within is a fraction in [0, 1], got {min_within}")


class MemoryWarmup:
    """`mem_warmup_steps` and `mem_warmup_min_within` for an `LMBase` method that saves them as
    hyperparameters: `on_fit_start` decides the warm-up this fit runs, `warming_up` says whether the
    current optimizer step trains with the method's short memory."""

    mem_warmup_steps: int = 0
    mem_warmup_min_within: float = 0.0

    def init_memory_warmup(self, steps: int, min_within: float) -> None:
        """Check and keep the two knobs (from the method's `__init__`)."""
        check_memory_warmup(steps, min_within)
        self.mem_warmup_steps, self.mem_warmup_min_within = steps, min_within

    def on_fit_start(self) -> None:
        """Drop the warm-up when the training text binds too few answers within the segment, saying so
        in one line. From the configured steps at every fit start: a resumed fit decides as the first
        did, and a later fit of the same model on other text decides afresh."""
        self.mem_warmup_steps = configured = self.hparams.mem_warmup_steps
        within = getattr(self.data_facts(), "train_answers_within_segment", None)
        if configured and within is not None and within < self.mem_warmup_min_within:
            rank_zero_info(
                f"longctx: {within:.1%} of the training answers are bound within their segment (under "
                f"mem_warmup_min_within {self.mem_warmup_min_within:.0%}): no memory warm-up, the memory "
                f"is on from the first step (mem_warmup_steps {configured} skipped)"
            )
            self.mem_warmup_steps = 0

    @property
    def warming_up(self) -> bool:
        """This optimizer step trains with the short memory (one of the first `mem_warmup_steps`)."""
        return bool(self.mem_warmup_steps) and self.global_step < self.mem_warmup_steps
