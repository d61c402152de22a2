"""Lightning callbacks of longctx.

- `CompileNetwork`: `torch.compile` of a method's network (opt in: `trainer.callbacks`).
- `ProgressLog`: plain progress lines in log files and a closing summary (registered by the CLI:
  the `progress:` config section).
"""

from longctx.callbacks.compile import CompileNetwork
from longctx.callbacks.progress import ProgressLog

__all__ = ["CompileNetwork", "ProgressLog"]
