"""Tokens/s and peak memory of the Compressive Transformer against Transformer-XL, side by side.

Rae et al. 2020's claim: a compressed memory reaches as far back as a much longer XL memory at a
fraction of its cost. Three models of the same network size are measured, each in a fresh process:

- `compressive`: memory n_m + compressed memory n_cm at rate c (f_c `--compression`, its
  reconstruction loss included when training): attends n_m + n_cm slots, reaches n_m + c·n_cm back;
- `xl_same_attention`: Transformer-XL with memory n_m + n_cm (the same attention cost, less reach);
- `xl_same_reach`: Transformer-XL with memory n_m + c·n_cm (the same reach, more attention).

A step is one segment (B, n_s) of random tokens carried over from the previous step's memories, after
enough warm-up segments that every memory is full; training steps are forward + backward (f_c's
reconstruction loss added for the Compressive Transformer), evaluation steps are forward without
gradients (`--eval`). Each configuration is run `--repeats` times round robin; tokens/s (the fastest
of `--steps` steps) and peak memory are printed as ratios to `xl_same_reach` of the same repeat,
min / median over repeats.

Peak memory = parameters + gradients + activations + memories: on CPU the growth of the process's peak
resident set (ru_maxrss) over its size before the first step, plus the parameters' bytes, with glibc's
mmap threshold fixed at 128 KiB so that freed activations leave the process; on CUDA
`torch.cuda.max_memory_allocated`.

    python benchmarks/compressive.py                 # CPU: 4 layers, d 256, n_s 128, n_m = n_cm = 128, c 4
    python benchmarks/compressive.py --eval
    python benchmarks/compressive.py --device cuda --n_layers 12 --d_model 512 --n_heads 8 \\
        --segment 512 --mem_len 256 --cmem_len 256 --rate 4 --batch 16
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch
from recurrence import fastest_step_and_peak  # this folder's timing and peak memory

REPO = Path(__file__).resolve().parents[1]
MODELS = ("compressive", "xl_same_attention", "xl_same_reach")


def build(cfg: dict) -> torch.nn.Module:
    """The model of `cfg["model"]` with the shared network knobs."""
    sys.path.insert(0, str(REPO))
    from longctx.methods.compressive_transformer.module import CompressiveTransformerLM
    from longctx.methods.transformer_xl.module import TransformerXLLM

    network = {k: cfg[k] for k in ("n_layers", "d_model", "n_heads", "d_inner")}
    network.update(cutoffs=[], dropout=0.0)
    n_m, n_cm, c = cfg["mem_len"], cfg["cmem_len"], cfg["rate"]
    if cfg["model"] == "compressive":
        compressive = {**network, "compression_rate": c, "compression": cfg["compression"]}
        return CompressiveTransformerLM(
            vocab_size=cfg["vocab"], network=compressive, mem_len=n_m, cmem_len=n_cm
        )
    memory = n_m + n_cm if cfg["model"] == "xl_same_attention" else n_m + c * n_cm
    return TransformerXLLM(vocab_size=cfg["vocab"], network=network, mem_len=memory)


def measure(cfg: dict) -> dict:
    """One configuration in this process: build, fill the memories, time `steps` steps, peak memory."""
    torch.manual_seed(0)
    if cfg["threads"]:
        torch.set_num_threads(cfg["threads"])
    device = torch.device(cfg["device"])
    model = build(cfg).to(device)
    model.train(not cfg["eval"])
    shape = (cfg["batch"], cfg["segment"])
    x = torch.randint(0, cfg["vocab"], (shape[0], shape[1] + 1), device=device)
    batch = {
        "input": x[:, :-1],
        "target": x[:, 1:],
        "mask": torch.ones(shape, dtype=torch.bool, device=device),
    }
    memory = model.init_memory(shape[0])

    def step() -> None:
        nonlocal memory
        if cfg["eval"]:
            with torch.no_grad():
                memory = model.step(batch, memory).memory
            return
        out = model.step(batch, memory)
        loss = out.nll.mean() + (out.extra_loss if out.extra_loss is not None else 0.0)
        loss.backward()
        memory = out.memory
        for p in model.parameters():
            p.grad = None

    reach = cfg["mem_len"] + cfg["rate"] * cfg["cmem_len"]
    fill = math.ceil(reach / cfg["segment"]) + 1  # every memory full from here on
    step_s, peak = fastest_step_and_peak(step, model, device, cfg["steps"], warmup=fill)
    tokens = shape[0] * shape[1]
    return {"peak_mib": peak / 2**20, "tokens_per_s": tokens / step_s}


def describe(cfg: dict, model: str) -> str:
    n_m, n_cm, c = cfg["mem_len"], cfg["cmem_len"], cfg["rate"]
    if model == "compressive":
        return f"n_m {n_m} + n_cm {n_cm} (c {c}): attends {n_m + n_cm}, reaches {n_m + c * n_cm}"
    memory = n_m + n_cm if model == "xl_same_attention" else n_m + c * n_cm
    return f"XL memory {memory}: attends and reaches {memory}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--n_layers", type=int, default=4)
    parser.add_argument("--d_model", type=int, default=256)
    parser.add_argument("--n_heads", type=int, default=4)
    parser.add_argument("--d_inner", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--segment", type=int, default=128, help="n_s")
    parser.add_argument("--mem_len", type=int, default=128, help="n_m")
    parser.add_argument("--cmem_len", type=int, default=128, help="n_cm")
    parser.add_argument("--rate", type=int, default=4, help="c")
    parser.add_argument("--compression", default="conv", help="f_c")
    parser.add_argument("--batch", type=int, default=4, help="B rows")
    parser.add_argument("--steps", type=int, default=3, help="timed steps (the fastest is reported)")
    parser.add_argument("--repeats", type=int, default=1, help="fresh-process runs of every configuration")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--eval", action="store_true", help="evaluation steps (no_grad) instead of training")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(json.loads(args.one))))
        return
    cfg = {k: v for k, v in vars(args).items() if k not in ("repeats", "one")}
    # A fixed mmap threshold turns off glibc's adaptive one, so freed large buffers go back to the OS and
    # the peak resident set tracks live tensors instead of heap fragmentation.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 17)}
    results: dict[str, list[dict]] = {model: [] for model in MODELS}
    for repeat in range(args.repeats):  # round robin: a change in machine load hits every model
        for model in MODELS:
            cmd = [sys.executable, __file__, "--one", json.dumps({**cfg, "model": model})]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                sys.exit(f"measurement of {model} failed:\n{proc.stderr[-3000:]}")
            results[model].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"repeat {repeat}: {model}", file=sys.stderr)
    step = "evaluation step (forward)" if args.eval else "training step (forward + backward)"
    print(
        f"device {args.device}; {args.n_layers} layers, d {args.d_model}, {args.n_heads} heads, inner "
        f"{args.d_inner}, vocab {args.vocab}; B={args.batch}, n_s={args.segment}; f_c {args.compression}; "
        f"one {step}; threads={args.threads or torch.get_num_threads()}; {args.repeats} repeat(s)"
    )
    print("ratios to xl_same_reach in the same repeat: min / median")
    print(
        f"{'model':>18} {'peak MiB':>9} {'mem ratio min':>13} {'median':>7} {'tok/s':>8} "
        f"{'tok/s ratio min':>15} {'median':>7}  memories"
    )
    for model in MODELS:
        runs, refs = results[model], results["xl_same_reach"]
        mem = [r["peak_mib"] / ref["peak_mib"] for r, ref in zip(runs, refs, strict=True)]
        speed = [r["tokens_per_s"] / ref["tokens_per_s"] for r, ref in zip(runs, refs, strict=True)]
        print(
            f"{model:>18} {statistics.median(r['peak_mib'] for r in runs):>9.1f} {min(mem):>13.3f} "
            f"{statistics.median(mem):>7.3f} {statistics.median(r['tokens_per_s'] for r in runs):>8.0f} "
            f"{min(speed):>15.3f} {statistics.median(speed):>7.3f}  {describe(cfg, model)}"
        )


if __name__ == "__main__":
    main()
