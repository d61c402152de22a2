"""How a process that joined a torch.distributed process group ends: its exit handlers run, then it
exits without finalizing the interpreter.

Why. A finished DDP rank sometimes died at exit with "terminate called without an active exception"
(SIGABRT, status 134; two of our CI runs, torch 2.13, a rank other than 0, after its run had
finished and saved everything). Such aborts come from teardown that runs while the interpreter
finalizes, beside gloo's worker threads: a thread that needs the GIL then (e.g. to free a tensor's
Python object held by a finished collective's work) is ended by CPython with `pthread_exit`, whose
unwinding crosses a `noexcept` frame (pytorch/pytorch#190489); a joinable `std::thread` destroyed by
a static destructor ends the same way. `destroy_process_group()` does not help: Lightning already
calls it from an exit handler, and DistributedDataParallel keeps the group, and its worker threads,
alive past it (the upstream fix, the same exit handler in torch, pytorch/pytorch#179291, was
abandoned). A rare race cannot be caught in the act (a deliberate reproduction did not abort), so
the whole window goes: a job that finished must not tell SLURM it failed. A process that joined a
group ends as finalization would, minus freeing its objects: non-daemon threads are joined, exit
handlers run (W&B's finish, logging's flush, Lightning's `destroy_process_group`), the standard
streams are flushed, then `os._exit`, which runs neither Python's finalization nor C++'s static
destructors.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn


def joined_process_group() -> bool:
    """Whether this process joined a torch.distributed process group (without importing torch: the
    commands that never train, e.g. `longctx report`, stay free of it)."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def exit_status(exit: SystemExit) -> int:
    """The status the interpreter gives `sys.exit(code)`: None is 0, an int is itself, anything else
    is printed to stderr and is 1."""
    if exit.code is None:
        return 0
    if isinstance(exit.code, int):
        return exit.code
    print(exit.code, file=sys.stderr)
    return 1


def end_process(status: int) -> NoReturn:
    """End this process with `status` after everything finalization would do but free objects."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # public since Python 2; only the name is underscored
    for stream in (sys.stdout, sys.stderr):
        # A closed pipe (`longctx fit | head`) or stream: nothing left to keep.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(status)


def run_and_exit_cleanly(command: Callable[[], object]) -> None:
    """Run `command`; if it joined a process group, end the process here with its status (0, or its
    `sys.exit` code), so that finalization never runs beside gloo's threads. Otherwise return, or
    raise its SystemExit, as if called directly (in-process callers and tests see no difference)."""
    try:
        command()
    except SystemExit as exit:
        if not joined_process_group():
            raise
        end_process(exit_status(exit))
    if joined_process_group():
        end_process(0)
