"""Eager vs fused (SDPA, flex) attention, tokens per second, one shape per method (issue 24).

    OMP_NUM_THREADS=1 python benchmarks/attention.py --threads 1
    OMP_NUM_THREADS=1 python benchmarks/attention.py --threads 1 --methods xl trams adaptive_span \
        --modes eval --kernels eager sdpa flex
    python benchmarks/attention.py --device cuda        # on a GPU (each step synchronised)

Per method, the network with `attention="eager"` (the authors' op-by-op computation) and
`attention="sdpa"` (one fused kernel) on the same weights; the two take turns, step by step, so a
change of the machine's load hits both alike, and each step's ratio is formed within its round.
Training: forward and backward of the summed NLL over one segment with the memory carried (dropout
off). Evaluation: `torch.no_grad`, the memory carried (XL and TRAMS with the key/value cache,
TRAMS with the score cache). Prints tokens/s (median over the timed rounds) and the medians of the
per-round speed ratios of each kernel to eager (and flex to sdpa). "flex" (compiled flex_attention)
computes evaluation only: the warm-up rounds compile its shapes, and training rows leave it out.

How far each step is from the hardware: the matrix-multiply peak is measured first (float32 FLOP/s
of a large `torch.mm`, best of a few), the step's work is counted once with eager attention by
`torch.utils.flop_counter.FlopCounterMode` (matrix products: projections, attention, feed-forward,
softmax layer; the backward's too in training), and each kernel's "% of peak" is that work at its
measured speed over the peak. Every kernel is credited the same (eager's) work.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from gpu_report import device_name  # this folder's
from torch.utils.flop_counter import FlopCounterMode

from longctx.methods.adaptive_span.network import SpanTransformer
from longctx.methods.transformer_xl.network import TransformerXL
from longctx.methods.transformer_xl.trams import TramsSettings


def use_kernel(model: torch.nn.Module, attention: str) -> None:
    for module in model.modules():
        if hasattr(module, "attention"):
            module.attention = attention


def xl_step(args: argparse.Namespace, trams: bool, train: bool) -> tuple[torch.nn.Module, Callable[[], None]]:
    """A step of Transformer-XL (or TRAMS at evaluation) at the memory's full length."""
    torch.manual_seed(0)
    model = (
        TransformerXL.Config(args.n_layers, args.d_model, args.n_heads, args.d_inner, dropout=0.0)
        .build(args.vocab)
        .train(train)
    )
    model.to(args.device)
    tokens = torch.randint(0, args.vocab, (args.batch, args.tgt_len + 1), device=args.device)
    x, y = tokens[:, :-1], tokens[:, 1:]
    settings = TramsSettings(args.attended, args.kept) if trams else None
    mem_len = args.pool if trams else args.mem_len
    cache = not train
    state = {}

    def step() -> None:
        with torch.set_grad_enabled(train):
            memory = state.get("memory") or model.empty_memory(args.batch)
            out = model(x, memory, mem_len=mem_len, same_length=True, trams=settings, cache_kv=cache)
            if train:
                model.nll(out.hidden, y).sum().backward()
            state["memory"] = out.memory  # full after mem_len / n warm-up steps

    return model, step


def span_step(args: argparse.Namespace, train: bool) -> tuple[torch.nn.Module, Callable[[], None]]:
    """A step of adaptive span with spans spread over [0, S/2] (heads trimmed to their own)."""
    torch.manual_seed(0)
    model = (
        SpanTransformer.Config(
            args.d_model, args.n_layers, args.n_heads, args.d_inner, args.attn_span, dropout=0.0
        )
        .build(args.vocab)
        .train(train)
    )
    model.to(args.device)
    with torch.no_grad():
        for layer in model.layers:
            layer.attn.adaptive_mask.z_ratio.copy_(torch.linspace(0.0, 0.5, args.n_heads))
    tokens = torch.randint(0, args.vocab, (args.batch, args.tgt_len + 1), device=args.device)
    x, y = tokens[:, :-1], tokens[:, 1:]
    cache = model.init_cache(args.batch, device=args.device)

    def step() -> None:
        with torch.set_grad_enabled(train):
            logits = model(x, cache).logits
            if train:
                torch.nn.functional.cross_entropy(logits.transpose(1, 2), y, reduction="sum").backward()

    return model, step


def measure(
    model: torch.nn.Module, step: Callable[[], None], kernels: list[str], args: argparse.Namespace
) -> dict[str, float]:
    """Warm-up rounds (the memory fills, flex compiles), then timed rounds, the kernels taking turns.
    Returns tokens/s per kernel and the median of the per-round speed ratios (`ratio_names`)."""
    times: dict[str, list[float]] = {k: [] for k in kernels}
    for round_ in range(args.warmup + args.rounds):
        for kernel in kernels:
            use_kernel(model, kernel)
            model.zero_grad(set_to_none=True)
            synchronize(args.device)
            start = time.perf_counter()
            step()
            synchronize(args.device)
            if round_ >= args.warmup:
                times[kernel].append(time.perf_counter() - start)
    tokens = args.batch * args.tgt_len
    result = {f"{k} tok/s": tokens / statistics.median(t) for k, t in times.items()}
    for fast, slow in ratio_names(kernels):
        ratios = [s / f for s, f in zip(times[slow], times[fast])]
        result[f"{fast} ÷ {slow}"] = statistics.median(ratios)
    return result


def matmul_peak(device: torch.device, n: int = 2048, repeats: int = 10) -> float:
    """FLOP/s of the fastest of `repeats` float32 (n × n) @ (n × n) products (2·n³ FLOPs each)."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    for _ in range(3):  # warm-up: a process's first products ran at 0.7× (2 threads, this CPU)
        a @ b
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        a @ b
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def step_flops(model: torch.nn.Module, step: Callable[[], None]) -> int:
    """The matrix-product FLOPs of one step with eager attention (backward included in training)."""
    use_kernel(model, "eager")
    model.zero_grad(set_to_none=True)
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops()


def synchronize(device: torch.device) -> None:
    """Wait for the GPU's queued kernels, so that a step's time is its own (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def ratio_names(kernels: list[str]) -> list[tuple[str, str]]:
    """(faster?, reference) pairs reported: each kernel to eager, and flex to sdpa."""
    pairs = [(k, "eager") for k in kernels if k != "eager" and "eager" in kernels]
    return pairs + ([("flex", "sdpa")] if {"flex", "sdpa"} <= set(kernels) else [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", nargs="+", default=["xl", "trams", "adaptive_span"])
    parser.add_argument("--modes", nargs="+", default=["train", "eval"], choices=["train", "eval"])
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--n_layers", type=int, default=4)
    parser.add_argument("--d_model", type=int, default=256)
    parser.add_argument("--n_heads", type=int, default=8)
    parser.add_argument("--d_inner", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tgt_len", type=int, default=64, help="n (XL, TRAMS); the block (adaptive span)")
    parser.add_argument("--mem_len", type=int, default=200, help="XL's memory")
    parser.add_argument("--pool", type=int, default=400, help="TRAMS's M")
    parser.add_argument("--attended", type=int, default=200, help="TRAMS's m")
    parser.add_argument("--kept", type=int, default=150, help="TRAMS's m − k")
    parser.add_argument("--attn_span", type=int, default=1024, help="adaptive span's S")
    parser.add_argument("--warmup", type=int, default=8, help="untimed rounds (fill the memory)")
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds (median)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--kernels", nargs="+", default=["eager", "sdpa"], choices=["eager", "sdpa", "flex"])
    parser.add_argument("--device", type=torch.device, default=torch.device("cpu"), help="cpu or cuda")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    peak = matmul_peak(args.device)
    print(
        f"device {device_name(args.device)}, threads {args.threads}, torch {torch.__version__}; "
        f"matrix-multiply peak {peak / 1e9:,.1f} GFLOP/s (float32 2048² torch.mm)"
    )
    for method in args.methods:
        for mode in args.modes:
            train = mode == "train"
            if method == "trams" and train:
                continue  # TRAMS is an evaluation method
            kernels = [k for k in args.kernels if k != "flex" or not train]
            model, step = (
                span_step(args, train)
                if method == "adaptive_span"
                else xl_step(args, method == "trams", train)
            )
            r = measure(model, step, kernels, args)
            flops_per_token = step_flops(model, step) / (args.batch * args.tgt_len)
            pairs = [f"{fast} ÷ {slow}" for fast, slow in ratio_names(kernels)]
            speeds = [f"{r[k + ' tok/s']:,.0f}" for k in kernels] + [f"{r[p]:.2f}" for p in pairs]
            shares = [f"{100 * flops_per_token * r[k + ' tok/s'] / peak:.1f}" for k in kernels]
            print(
                f"| method | mode | {' | '.join(k + ' tok/s' for k in kernels)} | {' | '.join(pairs)} | "
                f"MFLOP/token | {' | '.join(k + ' % of peak' for k in kernels)} |"
            )
            cells = [*speeds, f"{flops_per_token / 1e6:.1f}", *shares]
            print(f"| {method} | {mode} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
