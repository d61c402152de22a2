"""`longctx.runtime.process_exit`: a process that joined a process group ends after its exit handlers and
threads, with the status `sys.exit` would give, and without finalizing the interpreter (where gloo's
threads made a finished DDP rank abort with "terminate called without an active exception")."""

from __future__ import annotations

import subprocess
import sys

import pytest

from longctx import commands
from longctx.runtime.process_exit import exit_status, joined_process_group
from tests.helpers.environment import REPO

# A process that prints what ran at its end: its exit handler, a non-daemon thread, and an object
# freed only by finalization (a __main__ global whose __del__ prints).
ENDING = """
import atexit, sys, threading, time
from longctx.runtime.process_exit import run_and_exit_cleanly

join, how = sys.argv[1] == "join", sys.argv[2]
if join:  # only a process that joins a group spends seconds importing torch
    import torch
    import torch.distributed as dist

class FreedAtFinalization:
    def __del__(self):
        print("finalized", flush=True)

kept = FreedAtFinalization()
atexit.register(lambda: print("exit handler ran", flush=True))

def late_writer():
    time.sleep(0.2)
    print("thread done", flush=True)

def command():
    if join:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        dist.all_reduce(torch.ones(2))
    threading.Thread(target=late_writer).start()
    if how == "message":
        sys.exit("error: the reason, in one line")
    if how == "status":
        sys.exit(3)

run_and_exit_cleanly(command)
"""


ENDINGS = [("return", 0, ""), ("message", 1, "error: the reason, in one line\n"), ("status", 3, "")]
CONTROLS = [("return", 0), ("message", 1)]


@pytest.fixture(scope="module")
def ended() -> dict[tuple[bool, str], subprocess.CompletedProcess]:
    """Each process of the tests below by (joins a group, how it ends), all started at once (each
    that joins a group spends seconds importing torch)."""
    runs = [(True, how) for how, _, _ in ENDINGS] + [(False, how) for how, _ in CONTROLS]
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    started = {
        (join, how): subprocess.Popen(
            [sys.executable, "-c", ENDING, "join" if join else "alone", how], **pipes
        )
        for join, how in runs
    }
    ended = {}
    for key, process in started.items():
        stdout, stderr = process.communicate(timeout=120)
        ended[key] = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    return ended


@pytest.mark.parametrize("how,status,stderr", ENDINGS)
def test_a_process_in_a_group_ends_with_its_status_after_handlers_and_threads_without_finalizing(
    ended, how, status, stderr
):
    out = ended[True, how]
    assert (out.returncode, out.stderr) == (status, stderr)
    assert out.stdout.splitlines() == ["thread done", "exit handler ran"]  # no "finalized"


@pytest.mark.parametrize("how,status", CONTROLS)
def test_a_process_outside_any_group_ends_as_python_ends_it(ended, how, status):
    """The control: the same process without a group finalizes (so the test above can fail). It does
    not import torch; a process that imported torch.distributed without joining a group is not in
    one either (this test's own process)."""
    import torch.distributed  # noqa: F401  (imported, no group initialised)

    assert not joined_process_group()
    out = ended[False, how]
    assert out.returncode == status
    assert out.stdout.splitlines() == ["thread done", "exit handler ran", "finalized"]


def test_exit_status_is_the_interpreter_s(capsys):
    assert [exit_status(SystemExit(code)) for code in (None, 0, 3)] == [0, 0, 3]
    assert exit_status(SystemExit("error: why")) == 1
    assert capsys.readouterr().err == "error: why\n"


def test_the_script_exits_0_after_a_lightning_command(monkeypatch):
    """What failed: the installed script runs `sys.exit(main())`, and `main` returned the LongCtxCLI,
    which `sys.exit` printed and turned into status 1 after every finished `longctx fit`."""
    from longctx.commands import cli

    monkeypatch.setattr(cli, "main", lambda argv: object())
    with pytest.raises(SystemExit) as info:
        sys.exit(commands.main(["fit", "--config", "c.yaml"]))
    assert info.value.code is None


def test_ddp_spawn_workers_end_through_longctx_launcher():
    from lightning.pytorch import Trainer

    import longctx.core.base  # noqa: F401  (registers the spawn strategies, as any longctx model does)
    from longctx.core.spawn_exit import SpawnDDPStrategy, SpawnLauncher

    def strategy(name: str):
        return Trainer(strategy=name, accelerator="cpu", devices=2, logger=False).strategy

    for name in ("ddp_spawn", "ddp_spawn_find_unused_parameters_true"):
        assert isinstance(strategy(name), SpawnDDPStrategy)
        assert type(strategy(name)._launcher) is SpawnLauncher
    assert type(strategy("ddp")._launcher) is not SpawnLauncher  # popen ranks are CLI processes
