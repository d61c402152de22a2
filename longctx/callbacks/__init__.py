"""Lightning callbacks of longctx.

- `CompileNetwork`: `torch.compile` of a method's network (opt in: `trainer.callbacks`).
- `ProgressLog`: plain progress lines in log files and a closing summary (registered by the CLI:
  the `progress:` config section).
- `CheckpointOnSigterm`: SIGTERM (Ctrl-C) during `fit` saves `last.ckpt` and exits 143 (130) (registered
  by the CLI).
- `RunRecord` (+ `recorded`): `summary.json` and `metrics.jsonl` in the run directory (registered by
  the CLI; read by `python -m longctx report` and the sweep runner).
"""

from longctx.callbacks.compile import CompileNetwork
from longctx.callbacks.progress import ProgressLog
from longctx.callbacks.run_record import RunRecord, recorded
from longctx.callbacks.sigterm import CheckpointOnSigterm

__all__ = ["CheckpointOnSigterm", "CompileNetwork", "ProgressLog", "RunRecord", "recorded"]
