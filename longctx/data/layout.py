"""`FarTextLayout`: the training batch layout for text whose answers are bound beyond their segment."""

from __future__ import annotations

from dataclasses import dataclass

# The settings that decide a stream's layout fields when far text trains in `FarTextLayout`'s layout
# (`SegmentStream`'s `settings`: a refused resume names the setting to change back).
FAR_TEXT_LAYOUT_SETTINGS = {
    "batch_size": "data.far_text_layout.batch_size",
    "windows_per_batch": "data.far_text_layout.windows_per_batch",
}


@dataclass(frozen=True)
class FarTextLayout:
    """Training batches of `batch_size` rows x `windows_per_batch` segments for far text: text where
    fewer than `max_within` of the training answers are bound within their own segment
    (`LMDataModule.train_answers_within_segment`, measured at `setup`).

    Why the data decides: on such text an answer trains the layer that wrote its binding only
    through the memory's gradient, from the answer back to the binding's segment (truncated BPTT
    over the segments a batch holds, the model's `tbptt_segments: null`), so far text wants more
    segments per row, at the same tokens a step (fewer rows); near text learns the match within the
    segment first and wants more rows. Measured on recall text (docs/long_range.md "Recall, tiny"):
    8 segments x 16 rows learned far text on 3 seeds of 3, 4 x 32 on none of 3; 4 x 32 learned two
    near texts on 6 of 6, 8 x 16 on 2 of 5.
    """

    max_within: float = 0.1
    batch_size: int = 16
    windows_per_batch: int = 8

    def __post_init__(self) -> None:
        if not 0.0 < self.max_within <= 1.0:
            raise ValueError(f"data.far_text_layout.max_within is a share in (0, 1], got {self.max_within}")
        if self.batch_size < 1 or self.windows_per_batch < 1:
            raise ValueError(
                "data.far_text_layout: batch_size and windows_per_batch must be >= 1, got "
                f"{self.batch_size} and {self.windows_per_batch}"
            )

    def applies(self, within: float | None) -> bool:
        """Whether text with `within` of its training answers bound in their segment is far text."""
        return within is not None and within < self.max_within
