"""Lightning callbacks of longctx.

- `CompileNetwork`: `torch.compile` of a method's network (opt in: `trainer.callbacks`).
- `RunCheckpoint`: Lightning's `ModelCheckpoint` with a `last.ckpt` that is always the newest model
  (the callback configs' checkpointing; the CLI refuses Lightning's own with `save_last`).
- `ProgressLog`: plain progress lines in log files and a closing summary (registered by the CLI:
  the `progress:` config section).
- `StopOnDivergence`: a NaN, infinite or out-of-bound loss stops `fit` with `DivergenceError`
  (registered by the CLI: the `divergence:` config section).
- `StopAtAccuracy`: validation recall at or above a threshold stops `fit` and records the step
  (registered by the CLI: the `recall_stop:` config section; off unless `min_acc` is set).
- `CheckpointOnSigterm`: SIGTERM (Ctrl-C) during `fit` saves `last.ckpt` and exits 143 (130) (registered
  by the CLI).
- `RunRecord` (+ `recorded`): `summary.json` and `metrics.jsonl` in the run directory (registered by
  the CLI; read by `python -m longctx report` and the sweep runner).
- `InitWeights` (`longctx.callbacks.init_weights`): a fresh `fit` starts from another checkpoint's
  weights only (added by the CLI's `--init_weights PATH`).
- `UpdateEveryAfter`: an update every `every` batches once `after` updates are done (Rae et al. 2020's
  late-training schedule; opt in: `trainer.callbacks`).
- `RunVocabulary` (`longctx.callbacks.vocabulary`): a `fit` writes the word vocabulary it trains with
  into its run directory, `vocabulary.txt`, for `--data.vocab_file` (registered by the CLI).
- `TokenNLLWriter` (`longctx.callbacks.token_nll`): `token_nll.npz`, every scored target's NLL
  (added by the CLI's `--write_token_nll true`).
"""

from longctx.callbacks.accuracy_stop import StopAtAccuracy
from longctx.callbacks.checkpoint import RunCheckpoint
from longctx.callbacks.compile import CompileNetwork
from longctx.callbacks.divergence import DivergenceError, StopOnDivergence
from longctx.callbacks.progress import ProgressLog
from longctx.callbacks.run_record import RunRecord, recorded
from longctx.callbacks.sigterm import CheckpointOnSigterm
from longctx.callbacks.update_every import UpdateEveryAfter

__all__ = [
    "CheckpointOnSigterm",
    "CompileNetwork",
    "DivergenceError",
    "ProgressLog",
    "RunCheckpoint",
    "RunRecord",
    "StopAtAccuracy",
    "StopOnDivergence",
    "UpdateEveryAfter",
    "recorded",
]
