"""Lightning callbacks of longctx.

- `CompileNetwork`: `torch.compile` of a method's network (opt in: `trainer.callbacks`).
- `ProgressLog`: plain progress lines in log files and a closing summary (registered by the CLI:
  the `progress:` config section).
- `CheckpointOnSigterm`: SIGTERM during `fit` saves `last.ckpt` and exits 143 (registered by the CLI).
"""

from longctx.callbacks.compile import CompileNetwork
from longctx.callbacks.progress import ProgressLog
from longctx.callbacks.sigterm import CheckpointOnSigterm

__all__ = ["CheckpointOnSigterm", "CompileNetwork", "ProgressLog"]
