"""What a command line resolves to, as one digest: the identity of a run beyond its text.

A command line names config files; what runs is what the CLI's parser makes of them: every file's
contents, the files they build on (`config: base/...yaml`, a class config or a list of callbacks
named by path) merged in, the flags over them, every default filled. Editing any of those files
changes the run without changing its command line. `summary.json` records this digest of each
subcommand run in a folder (`config_digests`, beside `commands`), and the sweep runner compares it
with the digest of the same line parsed now (`longctx.commands.sweep`): a line counts as finished only if
both match.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

# Settings that name the run rather than configure it: `run_name` only picks the folder (the sweep
# runner adds one to a line without it), so it is left out of the digest.
RUN_NAMING = ("run_name",)


def config_digest(parser: Any, config: Any) -> str:
    """sha256 (hex) of the settings `parser` (the CLI's) parsed into `config`, before the CLI fills
    in run-specific values (the run directory, the precision that ran, a drawn seed): the parser's
    JSON dump with every setting, `None` included, keys sorted, `RUN_NAMING` cleared. The config
    files themselves are not in it, only what they resolve to: reordering a file's keys or moving a
    setting into an included file keeps the digest."""
    settings = config.clone()
    subcommand = settings.get("subcommand")
    scope = settings[subcommand] if subcommand else settings
    for key in RUN_NAMING:
        if key in scope:
            scope[key] = None
    dumped = json.loads(parser.dump(settings, format="json", skip_none=False, skip_validation=True))
    canonical = json.dumps(dumped, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()
