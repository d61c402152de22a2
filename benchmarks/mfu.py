"""Model FLOPs utilisation (MFU) of every method at its paper's shape: training and evaluation in
bf16-mixed, with eager, fused (sdpa, flex) and compiled attention, tokens/s and peak memory.

    python benchmarks/mfu.py --device cuda                 # every method, within --budget_s (300 s)
    python benchmarks/mfu.py --dry                         # no GPU: the paper shapes on the meta device
    python benchmarks/mfu.py --device cpu --tiny           # the same code at tiny shapes, in seconds
    python benchmarks/mfu.py --device cuda --variants sdpa --profile DIR   # and a profile of each step
    python benchmarks/mfu.py --device cuda --only transformer_xl/train/compiled   # chosen rows

The shapes, batches and FLOPs counts are `mfu_shapes.BENCHES` (one entry per method). A row is one
(method, mode, variant): the module built at the paper's shape with random weights, its own step
(`LMBase.step`) on tokens drawn from a Zipf law (word-level vocabularies are sorted by frequency,
which sets how often the adaptive softmax computes its tail clusters), the memory carried from step
to step. A training step is what Lightning's `bf16-mixed` runs: the forward and the loss under
`torch.autocast(bfloat16)`, float32 weights, backward, the method's own optimizer step (its default,
with learning rate 0 so the weights and spans stay those of the measured shape; no gradient
clipping). An evaluation step is the forward under `torch.inference_mode` and the same autocast,
with the evaluation memory (XL family: the key/value cache, its default). Variants: `sdpa` (the
default fused kernel), `eager` (the authors' op-by-op attention), `eager-uncached` (evaluation
without the key/value cache, as the released codes compute it), `flex` (compiled flex_attention,
evaluation) and `compiled` (`torch.compile` of the network, as `CompileNetwork`, with sdpa).

Timing: `fill` + 2 untimed steps (every memory full; compiled: 3 more, compilation), then `--steps`
steps between two `torch.cuda.synchronize`; tokens/s = tokens of those steps ÷ their time. Peak
memory: `torch.cuda.max_memory_allocated` over the timed steps (weights, gradients, optimizer state,
activations, memories). A batch that runs out of memory is halved (said in the row).

MFU is PaLM's (Chowdhery et al. 2022, Appendix B): model FLOPs per token × tokens/s ÷ the device's
dense bf16 peak from its datasheet (`PEAK_BF16_TFLOPS`). Model FLOPs per token are the method's own
forward count (`mfu_shapes.forward_flops`: its flops.py, what `report` shows), ×3 in training (the
backward costs twice the forward); recomputation (the recurrent GPT-2's checkpointed windows), the
optimizer and the Compressive Transformer's reconstruction loss are not counted, and every variant of
a row's (method, mode) is credited the same FLOPs, so MFU ranks them as tokens/s does.

Each row runs in a worker process, in try/except: an error is one line in its row, a crash of the
worker loses only its row (a new worker runs the rest). Rows run by tier (fused and eager first, then
compiled training, then the rest) and a row is not started when the time budget would not hold it,
so a budget cuts from the end; the rows left out are printed with the command that runs them.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attention import synchronize  # this folder's
from gpu_report import commit, device_name
from mfu_shapes import BENCHES, MODES, Bench, Mode, Step, counting_module, forward_flops

from longctx.callbacks.compile import compile_network
from longctx.core.base import LMBase, detach_memory
from longctx.core.knob_groups import at_path, override_groups

# Dense (no sparsity) bf16 tensor-core peaks, TFLOP/s, by torch.cuda.get_device_name; first match wins.
PEAK_BF16_TFLOPS: list[tuple[str, float, str]] = [
    # H100 datasheet (https://www.nvidia.com/en-us/data-center/h100/): BF16 Tensor Core 1,979 (SXM),
    # 1,513 (PCIe), 1,671 (NVL) TFLOPS "with sparsity"; dense is half.
    (r"\bH100 NVL\b", 835.5, "https://www.nvidia.com/en-us/data-center/h100/"),
    (r"\bH100 PCIe\b", 756.0, "https://www.nvidia.com/en-us/data-center/h100/"),
    (r"\bH100\b", 989.4, "https://www.nvidia.com/en-us/data-center/h100/"),  # SXM ("H100 80GB HBM3")
    # H200 datasheet (https://www.nvidia.com/en-us/data-center/h200/): 1,979 (SXM), 1,671 (NVL) sparse.
    (r"\bH200 NVL\b", 835.5, "https://www.nvidia.com/en-us/data-center/h200/"),
    (r"\bH200\b", 989.4, "https://www.nvidia.com/en-us/data-center/h200/"),
    # A100 datasheet (https://www.nvidia.com/en-us/data-center/a100/): BF16 312 dense (624 sparse).
    (r"\bA100\b", 312.0, "https://www.nvidia.com/en-us/data-center/a100/"),
    # L40S datasheet (https://www.nvidia.com/en-us/data-center/l40s/): 362.05 dense (733 sparse).
    (r"\bL40S\b", 362.05, "https://www.nvidia.com/en-us/data-center/l40s/"),
    # L4 datasheet (https://www.nvidia.com/en-us/data-center/l4/): 121 dense (242 sparse).
    (r"\bL4\b", 121.0, "https://www.nvidia.com/en-us/data-center/l4/"),
]
TRAIN_FLOPS_FACTOR = 3  # forward + backward (2× the forward), PaLM's convention
# Seconds a row is expected to take on a GPU (the budget does not start a row it cannot hold).
EXPECTED_S = {"compiled": 75.0, "flex": 45.0}
EXPECTED_OTHER_S = 15.0
GRACE_S = 20.0  # past the budget, the worker is killed
PROFILE_STEPS = 3


@dataclass(frozen=True)
class Variant:
    """How a row runs its method: the attention kernel, compiled or not, the evaluation cache."""

    kernel: str
    compiled: bool = False
    cached: bool = True


VARIANTS = {
    "sdpa": Variant("sdpa"),
    "eager": Variant("eager"),
    "eager-uncached": Variant("eager", cached=False),
    "flex": Variant("flex"),
    "compiled": Variant("sdpa", compiled=True),
}


@dataclass(frozen=True)
class Job:
    """One row: (method, mode, variant); `tier` orders the rows (a time budget cuts from the end)."""

    method: str
    mode: Mode
    variant: str
    tier: int

    @property
    def id(self) -> str:
        return f"{self.method}/{self.mode}/{self.variant}"


def tier(bench: Bench, mode: Mode, variant: str) -> int | None:
    """Run order of a variant (1: fused and eager, the goals' rows; 2: compiled training; 3: the
    rest), or None where the method has no such variant."""
    if variant in ("eager", "eager-uncached") and bench.kernel_knob is None:
        return None
    if variant == "eager-uncached":
        return 1 if mode == "eval" and bench.cache_knob else None
    if variant == "flex":
        return 3 if mode == "eval" and bench.flex else None
    if variant == "compiled":
        return 2 if mode == "train" else 3
    if variant == "eager" and mode == "eval" and bench.cache_knob:
        return 3  # the authors' evaluation is eager-uncached; this one separates kernel from cache
    return 1


def plan(methods: list[str], modes: list[str], variants: list[str], tiny: bool) -> list[Job]:
    """Every applicable row, by tier, then method, mode and variant in the order given."""
    jobs = []
    for method in methods:
        bench = BENCHES[method]
        for mode in modes:
            if bench.scale(tiny).step(mode) is None:
                continue
            for variant in variants:
                if (t := tier(bench, mode, variant)) is not None:
                    jobs.append(Job(method, mode, variant, t))
    return sorted(jobs, key=lambda j: j.tier)  # stable: the given order within a tier


# ------------------------------------------------------------------ the device


def bf16_peak(name: str) -> tuple[float, str] | None:
    """(dense bf16 TFLOP/s, source) of the device named `name`, or None when it is not in the table."""
    for pattern, tflops, source in PEAK_BF16_TFLOPS:
        if re.search(pattern, name):
            return tflops, source
    return None


def measured_matmul_tflops(device: torch.device, n: int = 8192, repeats: int = 10) -> float:
    """TFLOP/s of the fastest of `repeats` bf16 (n × n) @ (n × n) products (2·n³ FLOPs each)."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    best = math.inf
    for i in range(repeats + 3):  # 3 warm-ups
        synchronize(device)
        start = time.perf_counter()
        a @ b
        synchronize(device)
        if i >= 3:
            best = min(best, time.perf_counter() - start)
    del a, b
    torch.cuda.empty_cache()  # the workers measure; this process keeps no memory on the device
    return 2 * n**3 / best / 1e12


def versions() -> str:
    import lightning
    import transformers

    cuda = (
        f", CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}" if torch.version.cuda else ""
    )
    return (
        f"torch {torch.__version__}{cuda}, lightning {lightning.__version__}, "
        f"transformers {transformers.__version__}, Python {sys.version.split()[0]}"
    )


# ------------------------------------------------------------------ one row


def zipf_tokens(vocab: int, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Token ids with p(id) ∝ 1/(id + 1) (Zipf's law over frequency-sorted ids)."""
    cdf = torch.cumsum(1.0 / torch.arange(1, vocab + 1, dtype=torch.float64), 0)
    uniform = torch.rand(shape, generator=generator, dtype=torch.float64) * cdf[-1]
    return torch.searchsorted(cdf, uniform).clamp_max(vocab - 1)


def token_batches(step: Step, vocab: int, n: int, device: torch.device) -> list[dict[str, torch.Tensor]]:
    """`n` consecutive batches of one token stream per row (segments (B, L) or windows (B, K, T)),
    made on the host once and moved to `device` before the timing."""
    per_step = step.length * max(step.windows, 1)
    stream = zipf_tokens(vocab, (step.batch, n * per_step + 1), torch.Generator().manual_seed(0)).to(device)
    shape = (step.batch, step.windows, step.length) if step.windows else (step.batch, step.length)
    batches = []
    for i in range(n):
        chunk = stream[:, i * per_step : (i + 1) * per_step + 1]
        batches.append(
            {
                "input": chunk[:, :-1].reshape(shape),
                "target": chunk[:, 1:].reshape(shape),
                "mask": torch.ones(shape, dtype=torch.bool, device=device),
                "reset": torch.zeros(shape[:-1], dtype=torch.bool, device=device),
            }
        )
    return batches


def autocast(device: torch.device) -> torch.autocast:
    """Lightning's `bf16-mixed`: the forward and the loss in bfloat16 where autocast casts."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def training_step(lm: LMBase, rows: int) -> Callable[[dict], None]:
    """Forward, token-weighted NLL (+ the method's extra loss), backward, optimizer step (lr 0)."""
    optimizer = lm.optimizer_factory(lm.optimizer_param_groups())
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    memory = lm.init_memory(rows)

    def step(batch: dict) -> None:
        nonlocal memory
        with autocast(lm.device):
            out = lm.step(batch, memory)
            mask = batch["mask"] if out.mask is None else out.mask
            loss = (out.nll.float() * mask).sum() / mask.sum()
            if out.extra_loss is not None:
                loss = loss + out.extra_loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        memory = detach_memory(out.memory)

    return step


def evaluation_step(lm: LMBase, rows: int) -> Callable[[dict], None]:
    """Forward without gradients (inference mode, as Lightning validates), the memory carried."""
    memory = lm.init_memory(rows)

    def step(batch: dict) -> None:
        nonlocal memory
        with torch.inference_mode(), autocast(lm.device):
            memory = lm.step(batch, memory).memory

    return step


def variant_knobs(bench: Bench, variant: Variant) -> dict:
    knobs = at_path(bench.kernel_knob, variant.kernel) if bench.kernel_knob else {}
    if bench.cache_knob and not variant.cached:
        knobs = override_groups(knobs, at_path(bench.cache_knob, False))
    return knobs


def measure(job: Job, args: argparse.Namespace) -> dict:
    """The row of `job`: its batch halved while it runs out of memory (said in `note`)."""
    step = BENCHES[job.method].scale(args.tiny).step(job.mode)
    rows, note = step.batch, ""
    while True:
        try:
            return {**run_row(job, replace(step, batch=rows), args), "batch": rows, "note": note}
        except torch.cuda.OutOfMemoryError:
            if rows == 1:
                raise
        release_memory()  # here, where the failed step's frames are gone
        rows //= 2
        note = f"{step.batch} rows ran out of memory: {rows}"


def run_row(job: Job, step: Step, args: argparse.Namespace) -> dict:
    """Build, warm up, time `args.steps` steps; tokens/s, peak memory, FLOPs per token; a profile."""
    bench, variant, device = BENCHES[job.method], VARIANTS[job.variant], args.device
    scale = replace(bench.scale(args.tiny), **{job.mode: step})
    torch.manual_seed(0)
    lm = bench.build(scale, job.mode, device, **variant_knobs(bench, variant))
    lm.train(job.mode == "train")
    if variant.compiled:
        torch._dynamo.reset()
        compile_network(getattr(lm, lm.network_attribute))  # as CompileNetwork does
    warmup = step.fill + 2 + (3 if variant.compiled else 0)
    profiled = PROFILE_STEPS if args.profile else 0
    batches = token_batches(step, scale.vocab, warmup + args.steps + profiled, device)
    flops = forward_flops(bench, scale, job.mode, lm, torch.stack([b["target"] for b in batches]))
    run_step = training_step(lm, step.batch) if job.mode == "train" else evaluation_step(lm, step.batch)
    for batch in batches[:warmup]:
        run_step(batch)
    synchronize(device)
    if device.type == "cuda":  # the steady state's peak: not compilation's or a filling memory's
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for batch in batches[warmup : warmup + args.steps]:
        run_step(batch)
    synchronize(device)
    elapsed = time.perf_counter() - start
    row = {
        "tokens_per_step": step.tokens,
        "tokens_per_s": step.tokens * args.steps / elapsed,
        "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "forward_flops_per_token": flops,
        "params": sum(p.numel() for p in lm.parameters()),
    }
    if args.profile:
        path = Path(args.profile) / f"{job.id.replace('/', '_')}.txt"
        hooks = [] if variant.compiled else label_modules(getattr(lm, lm.network_attribute))
        row["profile"] = profile(run_step, batches[warmup + args.steps :], path, device)
        for hook in hooks:
            hook.remove()
    return row


def release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ------------------------------------------------------------------ profile


def label_modules(network: torch.nn.Module) -> list:
    """Name every composite submodule's forward in the profile (`module::<class>`): the blocks, their
    attention and feed-forward, the embedding, the (adaptive) softmax. Forward only: the backward
    runs in autograd's engine, outside these ranges."""
    handles = []
    for module in network.modules():
        children = list(module.children())
        if (
            module is network
            or not children
            or isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict))
        ):
            continue
        label = f"module::{type(module).__name__}"

        def enter(mod, args, label=label):
            mod._profile_range = torch.autograd.profiler.record_function(label)
            mod._profile_range.__enter__()

        def leave(mod, args, out):
            mod._profile_range.__exit__(None, None, None)

        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    return handles


LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize")
HOST_READS = ("aten::_local_scalar_dense", "aten::nonzero")  # .item()/.tolist(); data-dependent shapes


def profile(step: Callable[[dict], None], batches: list[dict], path: Path, device: torch.device) -> list[str]:
    """torch.profiler over `batches`: the table (top 60 by self device time; CPU time on a CPU)
    written to `path`, and per step a few lines: kernel launches, host syncs and the GPU's busy share
    of the wall time (low: launch- or host-bound); the aten ops by the time of the kernels they
    launch themselves (the relative shift's copies, the adaptive softmax's nonzero...); the kernels;
    the forward's time by module."""
    from torch.profiler import ProfilerActivity

    cuda = device.type == "cuda"
    synchronize(device)
    start = time.perf_counter()
    with torch.profiler.profile(
        activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    ) as prof:
        for batch in batches:
            step(batch)
        synchronize(device)
    wall_ms = (time.perf_counter() - start) * 1e3 / len(batches)
    events = prof.key_averages()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        events.table(sort_by="self_device_time_total" if cuda else "self_cpu_time_total", row_limit=60)
    )
    per_step = {e.key: e.count / len(batches) for e in events}
    own = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    inclusive = (lambda e: e.device_time_total) if cuda else (lambda e: e.cpu_time_total)
    kernels = [e for e in events if cuda and e.device_type == torch.autograd.DeviceType.CUDA]
    busy_us = sum(own(e) for e in kernels)
    busy_ms = busy_us / 1e3 / len(batches)
    ops = [e for e in events if e.key.startswith("aten::")]
    total = sum(own(e) for e in ops) or 1.0

    def shares(ranked: list, of: float, width: int) -> str:
        return "; ".join(f"{100 * own(e) / of:.0f}% {e.key[:width]}" for e in ranked)

    lines = [
        f"per step: {sum(per_step.get(k, 0) for k in LAUNCHES):.0f} kernel launches, "
        f"{sum(per_step.get(k, 0) for k in SYNCS):.1f} stream syncs, "
        + ", ".join(f"{per_step.get(k, 0):.1f} {k}" for k in HOST_READS)
        + (f"; GPU busy {busy_ms:.1f} of {wall_ms:.1f} ms ({100 * busy_ms / wall_ms:.0f}%)" if cuda else ""),
        "ops: " + shares(sorted(ops, key=own, reverse=True)[:8], total, 48),
    ]
    if kernels:
        lines.append("kernels: " + shares(sorted(kernels, key=own, reverse=True)[:4], busy_us or 1.0, 90))
    if modules := sorted((e for e in events if e.key.startswith("module::")), key=inclusive, reverse=True):
        lines.append(
            "forward by module (inclusive): "
            + "; ".join(f"{e.key[8:]} {inclusive(e) / 1e3 / len(batches):.1f} ms" for e in modules[:6])
        )
    return lines


# ------------------------------------------------------------------ workers


def worker(args: argparse.Namespace) -> None:
    """Run `args.only` rows in this process, one JSON line each, in order; a row is skipped when
    the deadline would not hold it (on a GPU)."""
    if args.device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # float32 matmuls (outside autocast) in TF32
    die_with_parent(args.parent)
    jobs = {job.id: job for job in plan(list(BENCHES), list(MODES), list(VARIANTS), args.tiny)}
    for job_id in args.only:
        job = jobs[job_id]
        expected = EXPECTED_S.get(job.variant, EXPECTED_OTHER_S) if args.device.type == "cuda" else 0.0
        if time.time() + expected > args.deadline:
            result = {"skipped": "time budget"}
        else:
            try:
                result = measure(job, args)
            except Exception as err:  # one row's failure is its row's note; the others run
                first_line = (str(err).strip().splitlines() or [""])[0]
                result = {"error": f"{type(err).__name__}: {first_line[:300]}"}
            release_memory()
        print(json.dumps({"id": job_id, **result}), flush=True)


def die_with_parent(parent: int) -> None:
    """A killed parent takes its worker along (Linux: PR_SET_PDEATHSIG), so that no orphan keeps the
    GPU busy during the next part of `gpu.sh`; a parent already gone (killed while this process
    imported torch) ends it here."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:
        sys.exit("error: the parent process is gone")


def worker_command(args: argparse.Namespace, job_ids: list[str], deadline: float) -> list[str]:
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", str(os.getpid())]
    command += ["--device", str(args.device)]
    command += ["--steps", str(args.steps), "--deadline", repr(deadline), "--only", *job_ids]
    if args.tiny:
        command.append("--tiny")
    if args.profile:
        command += ["--profile", str(args.profile)]
    return command


class Stopped(Exception):
    """SIGTERM reached the parent (e.g. `gpu.sh`'s time limit): the table of the rows so far is printed."""


def stop(signum: int, frame: object) -> None:
    raise Stopped


def run_workers(jobs: list[Job], args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, dict]:
    """Each job's result, from worker processes: a worker that dies loses its current row (the
    error: its stderr's last line) and a new one runs the rest; past the deadline plus a grace, or
    on SIGTERM (`Stopped`), the worker is killed and the rows left are marked."""
    start = time.time()
    deadline = start + args.budget_s
    results: dict[str, dict] = {}
    pending = [job.id for job in jobs]
    while pending and time.time() <= deadline:
        with tempfile.TemporaryFile("w+") as stderr:
            process = subprocess.Popen(
                worker_command(args, pending, deadline), stdout=subprocess.PIPE, stderr=stderr, text=True
            )
            try:
                for line in lines_until(process, deadline + GRACE_S):
                    try:
                        result = json.loads(line)
                    except json.JSONDecodeError:
                        continue  # a library printed to stdout
                    job_id = result.pop("id")
                    results[job_id] = result
                    pending.remove(job_id)
                    log(f"[{time.time() - start:5.0f} s] {job_id}: {summary(result)}")
            except Stopped:
                results[pending.pop(0)] = {"error": "stopped by SIGTERM"}
                deadline = 0.0  # the rest: not run
            if process.poll() is None:
                process.kill()
                process.wait()
                if deadline:
                    results[pending.pop(0)] = {"error": f"killed {GRACE_S:.0f} s past the time budget"}
            elif pending and deadline:
                stderr.seek(0)
                last = [line for line in stderr.read().splitlines() if line.strip()][-1:] or ["no output"]
                results[pending.pop(0)] = {
                    "error": f"worker died (exit {process.returncode}): {last[0][:300]}"
                }
    results.update({job_id: {"skipped": "time budget"} for job_id in pending})
    return results


def lines_until(process: subprocess.Popen, deadline: float) -> Iterator[str]:
    """The process's stdout lines until it ends or the deadline passes (then it is left running)."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=None if deadline == math.inf else max(deadline - time.time(), 0.01))
        except queue.Empty:
            return
        if line is None:
            process.wait()
            return
        yield line


# ------------------------------------------------------------------ the report


def summary(result: dict) -> str:
    if "error" in result or "skipped" in result:
        return result.get("error") or f"not run ({result['skipped']})"
    return f"{result['tokens_per_s']:,.0f} tok/s"


def mfu(result: dict, mode: str, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation: forward FLOPs per token (×3 in training) × tokens/s ÷ the peak."""
    if peak_tflops is None or "tokens_per_s" not in result:
        return None
    factor = TRAIN_FLOPS_FACTOR if mode == "train" else 1
    return factor * result["forward_flops_per_token"] * result["tokens_per_s"] / (peak_tflops * 1e12)


def table(jobs: list[Job], results: dict[str, dict], peak_tflops: float | None) -> list[str]:
    """The Markdown table, grouped by method and mode."""
    lines = [
        "| method | mode | variant | batch | tokens/step | tokens/s | peak GiB | MFLOP/token | MFU % "
        "| note |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    order = {method: i for i, method in enumerate(BENCHES)}
    for job in sorted(jobs, key=lambda j: (order[j.method], MODES.index(j.mode))):
        r = results.get(job.id, {"skipped": "not reached"})
        if "tokens_per_s" not in r:
            lines.append(f"| {job.method} | {job.mode} | {job.variant} | | | | | | | {summary(r)} |")
            continue
        factor = TRAIN_FLOPS_FACTOR if job.mode == "train" else 1
        utilisation = mfu(r, job.mode, peak_tflops)
        cells = [
            job.method, job.mode, job.variant, str(r["batch"]), f"{r['tokens_per_step']:,}",
            f"{r['tokens_per_s']:,.0f}", "" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}",
            f"{factor * r['forward_flops_per_token'] / 1e6:.4g}",
            "" if utilisation is None else f"{100 * utilisation:.1f}", r["note"],
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def ratio(results: dict[str, dict], fast: str, slow: str) -> str:
    a, b = results.get(fast, {}), results.get(slow, {})
    if "tokens_per_s" not in a or "tokens_per_s" not in b:
        return "not measured"
    return f"{a['tokens_per_s'] / b['tokens_per_s']:.2f}×"


def goals(results: dict[str, dict], peak_tflops: float | None) -> list[str]:
    """Issue 33's goals, read off the rows."""
    lines = []
    for method in ("transformer_xl", "adaptive_span"):
        rows = {
            v: mfu(results.get(f"{method}/train/{v}", {}), "train", peak_tflops) for v in ("sdpa", "compiled")
        }
        best = {v: u for v, u in rows.items() if u is not None}
        text = ", ".join(f"{v} {100 * u:.1f}%" for v, u in best.items()) or "not measured"
        lines.append(f"goal: {method} training ≥ 35% MFU: {text}")
    for method, name in (("transformer_xl", "XL at m = 200"), ("trams", "TRAMS at M = 400 → m = 200")):
        base = f"{method}/eval/eager-uncached"
        lines.append(
            f"goal: {name}, evaluation with the key/value cache ≥ 3× eager without it: "
            f"sdpa {ratio(results, f'{method}/eval/sdpa', base)}, "
            f"compiled {ratio(results, f'{method}/eval/compiled', base)}, "
            f"eager with the cache {ratio(results, f'{method}/eval/eager', base)}"
        )
    return lines


def dry(tiny: bool) -> list[dict]:
    """Every (method, mode) built at its shape without running it (meta device; adaptive span on the
    CPU, whose FLOPs count reads the spans' values): parameters and model FLOPs per token, and the
    counting module's own `flops_per_token` (`report`'s number, before the correction)."""
    rows = []
    for method, bench in BENCHES.items():
        scale = bench.scale(tiny)
        for mode in MODES:
            if (step := scale.step(mode)) is None:
                continue
            lm = bench.build(scale, mode, "cpu" if method == "adaptive_span" else "meta")
            lm.train(mode == "train")
            targets = zipf_tokens(scale.vocab, (2**16,), torch.Generator().manual_seed(0))
            counted = counting_module(bench, scale, mode, lm)
            rows.append(
                {
                    "method": method, "mode": mode, "batch": step.batch, "tokens_per_step": step.tokens,
                    "params": sum(p.numel() for p in lm.parameters()),
                    "forward_flops_per_token": forward_flops(bench, scale, mode, lm, targets),
                    "report_flops_per_token": counted.flops_per_token(step.length),
                }
            )  # fmt: skip
    return rows


def print_dry(tiny: bool) -> None:
    print(
        "| method | mode | batch | tokens/step | params | model GFLOP/token | forward | report's forward "
        "| TFLOP/step |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in dry(tiny):
        factor = TRAIN_FLOPS_FACTOR if r["mode"] == "train" else 1
        total = factor * r["forward_flops_per_token"]
        cells = [
            r["method"], r["mode"], str(r["batch"]), f"{r['tokens_per_step']:,}", f"{r['params'] / 1e6:.1f}M",
            f"{total / 1e9:.3f}", f"{r['forward_flops_per_token'] / 1e9:.3f}",
            f"{r['report_flops_per_token'] / 1e9:.3f}", f"{total * r['tokens_per_step'] / 1e12:.2f}",
        ]  # fmt: skip
        print("| " + " | ".join(cells) + " |")
    print("report's forward: the method's `flops_per_token` of a module that has scored no target yet (the")
    print(
        "adaptive softmax: every cluster for every token; a run counts its own targets); model: as computed."
    )


def progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def header(args: argparse.Namespace, peak: tuple[float, str] | None) -> list[str]:
    name = device_name(args.device)
    lines = [f"device {name}; {versions()}; commit {commit()}"]
    if args.device.type == "cuda":
        measured = measured_matmul_tflops(args.device)
        if peak is None:
            lines.append(
                f"MFU blank: no dense bf16 peak known for {name} (add it to PEAK_BF16_TFLOPS in "
                f"benchmarks/mfu.py); measured bf16 matmul (8192³) {measured:.0f} TFLOP/s"
            )
        else:
            lines.append(
                f"dense bf16 peak {peak[0]} TFLOP/s ({peak[1]}); measured bf16 matmul (8192³) "
                f"{measured:.0f} TFLOP/s = {100 * measured / peak[0]:.0f}% of it"
            )
    else:
        lines.append("MFU blank: not a CUDA device (the peaks are GPUs' dense bf16 tensor-core rates)")
    lines += [
        "MFU = model FLOPs per token × tokens/s ÷ peak (PaLM, Chowdhery et al. 2022, App. B): the forward's "
        "FLOPs from each method's flops.py (the adaptive softmax counted for the step's targets), ×3 in "
        "training; recomputation, optimizer and reconstruction loss not counted; bf16-mixed (autocast)",
        f"{args.steps} timed steps after every memory is full (compiled: 3 more warm-up steps); "
        "tokens drawn from a Zipf law; scale: " + ("tiny" if args.tiny else "the papers'"),
    ]
    if not args.tiny:
        lines += [f"{method}: {bench.shape}" for method, bench in BENCHES.items()]
    return lines


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        sys.exit(f"error: {message} (python benchmarks/mfu.py --help)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", type=torch.device, default=torch.device("cuda"))
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (the code path, in seconds)")
    parser.add_argument(
        "--dry", action="store_true", help="build the shapes, print params and FLOPs; run nothing"
    )
    parser.add_argument("--methods", nargs="+", default=list(BENCHES), choices=list(BENCHES))
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument(
        "--only", nargs="+", default=None, help="rows METHOD/MODE/VARIANT (instead of the three above)"
    )
    parser.add_argument("--steps", type=int, default=10, help="timed steps per row")
    parser.add_argument(
        "--budget_s", type=float, default=None, help="rows are not started past it (GPU: 300)"
    )
    parser.add_argument("--profile", type=Path, default=None, help="folder: a torch.profiler table per row")
    parser.add_argument("--worker", type=int, default=None, dest="parent", help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, default=math.inf, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.budget_s is None:
        args.budget_s = 300.0 if args.device.type == "cuda" else math.inf
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    known = {job.id for job in plan(list(BENCHES), list(MODES), list(VARIANTS), args.tiny)}
    if args.only and (unknown := sorted(set(args.only) - known)):
        parser.error(
            f"no row {', '.join(unknown)}; rows are METHOD/MODE/VARIANT, e.g. transformer_xl/train/sdpa"
        )
    if args.device.type == "cuda" and not args.dry and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no CUDA device; use --device cpu --tiny, or --dry")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.dry:
        print_dry(args.tiny)
        return
    if args.parent is not None:  # a worker
        worker(args)
        return
    jobs = plan(args.methods, args.modes, args.variants, args.tiny)
    if args.only:
        jobs = [
            job for job in plan(list(BENCHES), list(MODES), list(VARIANTS), args.tiny) if job.id in args.only
        ]
    peak = bf16_peak(torch.cuda.get_device_name(args.device)) if args.device.type == "cuda" else None
    lines = header(args, peak)  # before the workers: the matmul is measured on an idle device
    signal.signal(signal.SIGTERM, stop)
    results = run_workers(jobs, args, progress)
    peak_tflops = None if peak is None else peak[0]
    print("\n".join(lines + table(jobs, results, peak_tflops)))
    print("\n".join(goals(results, peak_tflops)))
    if args.profile:
        print(f"profiles (a table per row, by self device time): {args.profile}")
    for job in jobs:
        for line in results.get(job.id, {}).get("profile", []):
            print(f"profile {job.id}: {line}")
    if left := [job.id for job in jobs if "skipped" in results[job.id]]:
        tiny = " --tiny" if args.tiny else ""
        print(f"not run: python benchmarks/mfu.py --device {args.device}{tiny} --only {' '.join(left)}")


if __name__ == "__main__":
    main()
