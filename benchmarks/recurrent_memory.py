"""The training step of the Recurrent Memory Transformer against the recurrent GPT-2 on the same GPT-2
and the same windows: tokens/s and peak memory, as ratios measured in the same repeat.

Both read a batch (B, K, T) of K consecutive windows per row and backpropagate through all K. The
recurrent GPT-2 (Yoshida et al. 2020) adds one key/value at one layer per window and a small pooling
FFN; the Recurrent Memory Transformer (Bulatov et al. 2022) runs every window over T + 2m positions (m
memory tokens read before it and m written after it), so its cost grows with m through every layer.
Backward modes, paired like with like: `none` (one graph over the K windows, nothing recomputed, for
both) and `lean` (the recurrent GPT-2's window-by-window reverse backward, `window_by_window`; the
memory transformer's segment-by-segment one, `checkpoint_segments`: the same `methods/bptt.py`).
Each configuration runs in a fresh process, `--repeats` times round robin; the ratios divide each
memory-transformer run by the recurrent GPT-2's run of the same K and mode in the same repeat, and
print their min and median. Peak memory as in `benchmarks/recurrence.py` (`fastest_step_and_peak`).

    python benchmarks/recurrent_memory.py                   # CPU defaults (small GPT-2, real vocabulary)
    python benchmarks/recurrent_memory.py --device cuda --n_layer 12 --n_embd 768 --n_head 12 --window 512
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch
from recurrence import fastest_step_and_peak  # this folder's

REPO = Path(__file__).resolve().parents[1]
RECURRENT_GPT2 = "recurrent_gpt2"


def build(cfg: dict) -> torch.nn.Module:
    """The module of one configuration (`mem_tokens` None: the recurrent GPT-2)."""
    sys.path.insert(0, str(REPO))
    from longctx.methods.recurrence.module import RecurrentGPT2LM
    from longctx.methods.recurrent_memory.module import RecurrentMemoryLM

    gpt2 = {"n_layer": cfg["n_layer"], "n_embd": cfg["n_embd"], "n_head": cfg["n_head"], "n_positions": 1024}
    lean = cfg["mode"] == "lean"
    if cfg["mem_tokens"] is None:
        return RecurrentGPT2LM(
            vocab_size=cfg["vocab"], gpt2_config=gpt2, checkpoint_windows=lean, window_by_window=lean
        )
    memory_cell = {"num_mem_tokens": cfg["mem_tokens"]}
    return RecurrentMemoryLM(
        vocab_size=cfg["vocab"], gpt2_config=gpt2, memory_cell=memory_cell, checkpoint_segments=lean
    )


def measure(cfg: dict) -> dict:
    """One configuration in this process: build, warm up, time `steps` training steps, peak memory."""
    torch.manual_seed(0)
    torch.set_num_threads(cfg["threads"]) if cfg["threads"] else None
    device = torch.device(cfg["device"])
    model = build(cfg).to(device).train()
    shape = (cfg["batch"], cfg["windows"], cfg["window"])
    x = torch.randint(0, cfg["vocab"], (*shape[:2], shape[2] + 1), device=device)
    batch = {
        "input": x[..., :-1],
        "target": x[..., 1:],
        "mask": torch.ones(shape, dtype=torch.bool, device=device),
        "reset": torch.zeros(shape[:2], dtype=torch.bool, device=device),
    }

    def step() -> None:
        out = model.step(batch, None)
        (out.nll * batch["mask"]).sum().div(batch["mask"].sum()).backward()
        for p in model.parameters():
            p.grad = None

    step_s, peak = fastest_step_and_peak(step, model, device, cfg["steps"])
    tokens = shape[0] * shape[1] * shape[2]
    return {**cfg, "peak_mib": peak / 2**20, "tokens_per_s": tokens / step_s}


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
    parser.add_argument("--batch", type=int, default=2, help="B rows")
    parser.add_argument("--windows", type=int, nargs="+", default=[1, 4, 16], help="K values")
    parser.add_argument("--mem_tokens", type=int, nargs="+", default=[8, 32], help="m values")
    parser.add_argument("--modes", nargs="+", default=["none", "lean"], choices=["none", "lean"])
    parser.add_argument("--steps", type=int, default=2, help="timed steps (the fastest is reported)")
    parser.add_argument("--repeats", type=int, default=1, help="fresh-process runs of every configuration")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(json.loads(args.one))))
        return
    base = {
        k: getattr(args, k) for k in ("device", "n_layer", "n_embd", "n_head", "vocab", "window", "batch")
    }
    base.update(steps=args.steps, threads=args.threads)
    configs = [(m, k, mode) for mode in args.modes for k in args.windows for m in (None, *args.mem_tokens)]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 17)}  # as benchmarks/recurrence.py
    results: dict[tuple, list[dict]] = {c: [] for c in configs}
    for repeat in range(args.repeats):  # round robin: a change in machine load hits every configuration
        for mem_tokens, windows, mode in configs:
            cfg = {**base, "mem_tokens": mem_tokens, "windows": windows, "mode": mode}
            proc = subprocess.run(
                [sys.executable, __file__, "--one", json.dumps(cfg)], capture_output=True, text=True, env=env
            )
            if proc.returncode != 0:
                sys.exit(f"measurement {cfg} failed:\n{proc.stderr[-3000:]}")
            results[(mem_tokens, windows, mode)].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"repeat {repeat}: m={mem_tokens} K={windows} mode={mode}", file=sys.stderr)
    print(
        f"device {args.device}; GPT-2 n_layer={args.n_layer} d={args.n_embd} heads={args.n_head} "
        f"vocab={args.vocab}; B={args.batch}, T={args.window}; one training step (forward + backward); "
        f"threads={args.threads or torch.get_num_threads()}; {args.repeats} repeat(s)"
    )
    print("ratios vs the recurrent GPT-2 of the same K and mode, same repeat: min / median")
    print(
        f"{'model':>14} {'mode':>5} {'K':>3} {'peak MiB':>9} {'mem ratio':>9} {'median':>7} "
        f"{'tok/s':>8} {'speed ratio':>11} {'median':>7}"
    )
    for mem_tokens, windows, mode in configs:
        runs, refs = results[(mem_tokens, windows, mode)], results[(None, windows, mode)]
        mem = [r["peak_mib"] / ref["peak_mib"] for r, ref in zip(runs, refs, strict=True)]
        speed = [r["tokens_per_s"] / ref["tokens_per_s"] for r, ref in zip(runs, refs, strict=True)]
        name = RECURRENT_GPT2 if mem_tokens is None else f"rmt m={mem_tokens}"
        print(
            f"{name:>14} {mode:>5} {windows:>3} {statistics.median(r['peak_mib'] for r in runs):>9.1f} "
            f"{min(mem):>9.3f} {statistics.median(mem):>7.3f} "
            f"{statistics.median(r['tokens_per_s'] for r in runs):>8.0f} {min(speed):>11.3f} "
            f"{statistics.median(speed):>7.3f}"
        )


if __name__ == "__main__":
    main()
