"""Peak memory and throughput of backprop through K windows: no recomputation, per-window checkpointing,
and the window-by-window reverse backward (`longctx/methods/bptt.py`).

Yoshida et al. 2020 §3.2: with gradient checkpointing per window only the window inputs, z_i and h_prev,i
are kept, so training on K windows needs about the memory of one window (M + 2k⌈N/T⌉) at the cost of
one extra forward per window. This script measures one training step (forward + backward of the
recurrent GPT-2 on a random batch (B, K, T)) for each K and backward mode, each in a fresh process,
and prints peak memory and tokens/s as ratios to K = (the first K) in the same mode, measured in the
same repeat; with `--repeats N` every configuration runs N times (round robin) and the min and median of
each ratio are printed. The windowed baseline (no recurrence) is measured the same way for reference.

Backward modes (`--modes`): `none` (one graph over the K windows, nothing recomputed), `checkpoint`
(`torch.utils.checkpoint` per window, one backward), `window` (window by window in reverse).
Memory-lean options, for every configuration of a run: `--checkpoint_blocks` (every GPT-2 block
checkpointed too) and `--loss_chunk N` (the LM head's logits N tokens at a time). `--eval` measures an
evaluation step (forward without gradients) instead, where `--loss_chunk` is what matters.

Peak memory = parameters + gradients + activations: on CPU the growth of the process's peak resident
set (ru_maxrss) over its size right before the first step, plus the parameters' bytes, with glibc's mmap
threshold fixed at 128 KiB so that freed activations leave the process; on CUDA
`torch.cuda.max_memory_allocated` (which includes the parameters).

    python benchmarks/recurrence.py                       # CPU defaults (small GPT-2, real vocabulary)
    python benchmarks/recurrence.py --device cuda --n_layer 12 --n_embd 768 --n_head 12 --window 300
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def measure(cfg: dict) -> dict:
    """One configuration in this process: build, warm up, time `steps` training steps, peak memory."""
    sys.path.insert(0, str(REPO))
    from longctx.methods.recurrence.module import RecurrentGPT2LM

    torch.manual_seed(0)
    torch.set_num_threads(cfg["threads"]) if cfg["threads"] else None
    device = torch.device(cfg["device"])
    gpt2 = {"n_layer": cfg["n_layer"], "n_embd": cfg["n_embd"], "n_head": cfg["n_head"], "n_positions": 1024}
    model = RecurrentGPT2LM(
        vocab_size=cfg["vocab"],
        gpt2_config=gpt2,
        recurrence=cfg["recurrence"],
        checkpoint_windows=cfg["mode"] != "none",
        window_by_window=cfg["mode"] == "window",
        checkpoint_blocks=cfg["checkpoint_blocks"],
        loss_chunk=cfg["loss_chunk"],
    ).to(device)
    model.train(not cfg["eval"])
    shape = (cfg["batch"], cfg["windows"], cfg["window"])
    x = torch.randint(0, cfg["vocab"], (*shape[:2], shape[2] + 1), device=device)
    batch = {
        "input": x[..., :-1],
        "target": x[..., 1:],
        "mask": torch.ones(shape, dtype=torch.bool, device=device),
        "reset": torch.zeros(shape[:2], dtype=torch.bool, device=device),
    }

    def step() -> None:
        if cfg["eval"]:
            with torch.no_grad():
                model.step(batch, None)
            return
        out = model.step(batch, None)
        (out.nll * batch["mask"]).sum().div(batch["mask"].sum()).backward()
        for p in model.parameters():
            p.grad = None

    step_s, peak = fastest_step_and_peak(step, model, device, cfg["steps"])
    tokens = shape[0] * shape[1] * shape[2]
    return {**cfg, "peak_mib": peak / 2**20, "tokens_per_s": tokens / step_s, "step_s": step_s}


def fastest_step_and_peak(
    step: Callable[[], None], model: torch.nn.Module, device: torch.device, steps: int, warmup: int = 1
) -> tuple[float, int]:
    """The fastest of `steps` timed calls of `step` after `warmup` untimed ones (which count for the
    peak), and the peak memory in bytes over all of them (see the module docstring)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    before = rss_bytes()
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    if device.type == "cuda":
        return min(times), torch.cuda.max_memory_allocated()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return min(times), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before + params


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--n_layer", type=int, default=4)
    parser.add_argument("--n_embd", type=int, default=256)
    parser.add_argument("--n_head", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--window", type=int, default=128, help="T")
    parser.add_argument("--batch", type=int, default=1, help="B rows")
    parser.add_argument("--windows", type=int, nargs="+", default=[1, 5, 20], help="K values")
    parser.add_argument("--modes", nargs="+", default=["none", "checkpoint", "window"], help="backward modes")
    parser.add_argument("--steps", type=int, default=2, help="timed steps (the fastest is reported)")
    parser.add_argument("--repeats", type=int, default=1, help="fresh-process runs of every configuration")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--checkpoint_blocks", action="store_true", help="also checkpoint every block")
    parser.add_argument("--loss_chunk", type=int, default=0, help="tokens per LM-head chunk (0: stock)")
    parser.add_argument("--eval", action="store_true", help="an evaluation step (no_grad) instead")
    parser.add_argument("--no_baseline", action="store_true", help="skip the windowed baseline rows")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(json.loads(args.one))))
        return
    base = {
        k: getattr(args, k) for k in ("device", "n_layer", "n_embd", "n_head", "vocab", "window", "batch")
    }
    base.update(steps=args.steps, threads=args.threads)
    base.update(checkpoint_blocks=args.checkpoint_blocks, loss_chunk=args.loss_chunk, eval=args.eval)
    configs = [(True, k, mode) for mode in args.modes for k in args.windows]
    if not args.no_baseline:
        configs += [(False, k, "none") for k in args.windows]
    # A fixed mmap threshold turns off glibc's adaptive one, so freed large buffers go back to the OS and
    # the peak resident set tracks live tensors instead of heap fragmentation.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 17)}
    results: dict[tuple, list[dict]] = {c: [] for c in configs}
    for repeat in range(args.repeats):  # round robin: a change in machine load hits every configuration
        for recurrence, windows, mode in configs:
            cfg = {**base, "recurrence": recurrence, "windows": windows, "mode": mode}
            cmd = [sys.executable, __file__, "--one", json.dumps(cfg)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                sys.exit(f"measurement {cfg} failed:\n{proc.stderr[-3000:]}")
            results[(recurrence, windows, mode)].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"repeat {repeat}: recurrence={recurrence} K={windows} mode={mode}", file=sys.stderr)
    step = "evaluation step (forward)" if args.eval else "training step (forward + backward)"
    print(
        f"device {args.device}; GPT-2 n_layer={args.n_layer} d={args.n_embd} heads={args.n_head} "
        f"vocab={args.vocab}; B={args.batch}, T={args.window}; checkpoint_blocks={args.checkpoint_blocks}, "
        f"loss_chunk={args.loss_chunk}; one {step}; "
        f"threads={args.threads or torch.get_num_threads()}; {args.repeats} repeat(s)"
    )
    print(f"ratios vs K={args.windows[0]} of the same model and mode, same repeat: min / median")
    print(
        f"{'model':>10} {'mode':>10} {'K':>3} {'peak MiB':>9} {'mem/K1 min':>10} {'median':>7} "
        f"{'tok/s':>8} {'tok/s/K1 min':>12} {'median':>7}"
    )
    for recurrence, windows, mode in configs:
        runs, refs = results[(recurrence, windows, mode)], results[(recurrence, args.windows[0], mode)]
        mem = [r["peak_mib"] / ref["peak_mib"] for r, ref in zip(runs, refs, strict=True)]
        speed = [r["tokens_per_s"] / ref["tokens_per_s"] for r, ref in zip(runs, refs, strict=True)]
        name = "recurrent" if recurrence else "baseline"
        print(
            f"{name:>10} {mode:>10} {windows:>3} {statistics.median(r['peak_mib'] for r in runs):>9.1f} "
            f"{min(mem):>10.3f} {statistics.median(mem):>7.3f} "
            f"{statistics.median(r['tokens_per_s'] for r in runs):>8.0f} {min(speed):>12.3f} "
            f"{statistics.median(speed):>7.3f}"
        )


if __name__ == "__main__":
    main()
