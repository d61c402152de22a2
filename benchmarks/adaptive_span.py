"""Adaptive Attention Span: is the saving real? Training tokens/s and peak memory, fixed vs adaptive span.

For each maximum span S, one run measures, on the same network and the same data:
- `fixed`: every head attends to its S previous tokens (the paper's fixed-span model);
- `adaptive-small`: adaptive span with small learned spans (every head z = 40, R = 32: each layer
  attends to 128 positions after the code's trimming, its cache holds 192 states);
- `adaptive-mixed`: the paper's pattern (its Figure 4): small spans in the lower layers, and in the
  last layer one head at z = S/4 (that layer attends S/4 + R, rounded up to 64 positions);
- `adaptive-small-layer`, `adaptive-mixed-layer`: the same spans trimmed per layer as in the released
  code (`span_trim="layer"`, the reference); the two above trim per head (`span_trim="head"`, the
  default), where only the long head of `adaptive-mixed` pays for its span;
and prints tokens/s, peak memory and the ratios to `fixed` at the same S. A training step is the
forward pass over one block with the carried cache, the loss with the span penalty, the backward
pass, a ClippedAdagrad step and the clamping of z'. With `--eval`, a step is the evaluation forward
pass (no gradients, dropout off). `--attention` is the kernel of every variant (default sdpa);
`--layer_attention eager` gives the `-layer` variants the released code's computation as well as
its trimming (op by op: the score matrix over the layer's longest span, the soft mask, the softmax),
the stand-in for the authors' code in issue 24's evaluation goal at S = 8192.

Speed: the variants of one S are built in one process and stepped in turns (round robin), and each
reports its median step time, so that a machine whose load changes during the run (shared CPUs)
slows every variant alike. The goal ratios (issue 15: mixed ÷ small per head ≤ 1.3; per head no
slower than per layer at equal spans) are taken round by round and printed as min and median.
Memory: every configuration runs alone in its own process, so that its peak resident memory
(VmHWM minus the resident memory before the first step) is its own.

Then the cost per token of the paper's models against its Tables 1-2: the paper's #FLOPS counts
multiply-accumulates (`macs_per_token`); longctx logs FLOPs = 2 × MACs (`flops_per_token`,
`longctx.core.flops`). Both are printed.

    python benchmarks/adaptive_span.py                       # S = 512, 2048, 8192 (CPU: ~5 min)
    python benchmarks/adaptive_span.py --spans 512 --steps 2 # quick
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from longctx.core.base import detach_memory
from longctx.methods.adaptive_span.flops import (
    flops_per_token,
    macs_per_token,
    network_flops_per_token,
    parameter_count,
)
from longctx.methods.adaptive_span.network import SpanTransformer
from longctx.optim.adagrad import ClippedAdagrad

VARIANTS = ("fixed", "adaptive-small", "adaptive-mixed", "adaptive-small-layer", "adaptive-mixed-layer")
LAYER_SUFFIX = "-layer"  # the released code's per-layer trimming
SMALL_SPAN = 40.0


def head_spans(variant: str, S: int, n_layers: int, n_heads: int) -> list[list[float]] | None:
    """z of every head (None: fixed span)."""
    if variant == "fixed":
        return None
    spans = [[SMALL_SPAN] * n_heads for _ in range(n_layers)]
    if variant.removesuffix(LAYER_SUFFIX) == "adaptive-mixed":
        spans[-1][0] = S / 4
    return spans


def proc_status_bytes(field: str) -> int:
    """VmRSS (resident now) or VmHWM (its peak) of this process, from /proc/self/status. VmHWM belongs
    to the process's own address space; ru_maxrss would also carry the parent's peak across exec."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


class Runner:
    """One network with its optimizer, carried cache and token stream."""

    def __init__(self, config: dict, variant: str) -> None:
        torch.manual_seed(0)
        S, n_layers, n_heads = config["S"], config["n_layers"], config["n_heads"]
        self.spans = head_spans(variant, S, n_layers, n_heads)
        self.trim = "layer" if variant.endswith(LAYER_SUFFIX) or self.spans is None else "head"
        reference = variant.endswith(LAYER_SUFFIX) and config["layer_attention"] is not None
        self.evaluating = config["eval"]
        self.net = (
            SpanTransformer.Config(
                d_model=config["d_model"],
                n_layers=n_layers,
                n_heads=n_heads,
                d_inner=config["d_inner"],
                attn_span=S,
                dropout=0.0,
                span_kind="fixed" if self.spans is None else "adaptive",
                span_ramp=32,
                chunk_size=config["chunk_size"],
                span_trim=self.trim,
                attention=config["layer_attention"] if reference else config["attention"],
            )
            .build(256)
            .train(not self.evaluating)
        )
        if self.spans is not None:
            with torch.no_grad():
                for layer, z in zip(self.net.layers, self.spans):
                    layer.attn.adaptive_mask.z_ratio.copy_(torch.tensor(z) / S)
        # a tiny learning rate: the spans stay where they were set
        self.optimizer = ClippedAdagrad(self.net.parameters(), lr=1e-4, grad_clip=0.03)
        self.B, self.M = config["batch"], config["block"]
        self.cache = self.net.init_cache(self.B)
        self.attended: list[int] = []
        self.flops = network_flops_per_token(
            self.net.config,
            256,
            [[float(S)] * n_heads] * n_layers if self.spans is None else self.spans,
            block=config["block"],
            attended="trimmed",
        )

    def step(self) -> float:
        """One training (or evaluation) step on random tokens; returns its duration in seconds."""
        batch = torch.randint(0, 256, (self.B, self.M + 1))
        start = time.perf_counter()
        if self.evaluating:
            with torch.no_grad():
                out = self.net(batch[:, :-1], self.cache)
            self.cache, self.attended = out.cache, out.attended
            return time.perf_counter() - start
        out = self.net(batch[:, :-1], self.cache)
        loss = F.cross_entropy(out.logits.transpose(1, 2), batch[:, 1:])
        if out.penalty is not None:
            loss = loss + 2e-6 * out.penalty
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.net.clamp_spans_()
        self.cache = detach_memory(out.cache)
        self.attended = out.attended
        return time.perf_counter() - start


def measure_memory(config: dict, queue: mp.Queue) -> None:
    """Runs in a fresh process: peak resident memory of training steps of one variant."""
    torch.set_num_threads(config["threads"])
    runner = Runner(config, config["variant"])
    rss_start = proc_status_bytes("VmRSS")
    for _ in range(2):
        runner.step()
    queue.put((proc_status_bytes("VmHWM") - rss_start) / 2**20)


def peak_memory_mb(config: dict) -> float:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=measure_memory, args=(config, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def measure_speed(config: dict, variants: list[str]) -> dict[str, dict]:
    """Round robin over the variants: `warmup` untimed rounds, then `steps` timed rounds."""
    runners = {v: Runner(config, v) for v in variants}
    times: dict[str, list[float]] = {v: [] for v in variants}
    for round_ in range(config["warmup"] + config["steps"]):
        for variant, runner in runners.items():
            elapsed = runner.step()
            if round_ >= config["warmup"]:
                times[variant].append(elapsed)
    results = {}
    for variant, runner in runners.items():
        step_time = statistics.median(times[variant])
        results[variant] = {
            "S": config["S"],
            "variant": variant,
            "s_per_step": step_time,
            "step_times": times[variant],
            "tokens_per_s": runner.B * runner.M / step_time,
            "attended": runner.attended,
            "cache": [c.shape[1] for c in runner.cache.h_cache],
            "flops_per_token": runner.flops,
        }
    return results


def print_goal_ratios(speed: dict[str, dict]) -> None:
    """Step-time ratios taken round by round (same machine load), as min and median over rounds."""
    pairs = [
        ("adaptive-mixed", "adaptive-small", "per head: mixed ÷ small step time (goal ≤ 1.3)"),
        ("adaptive-mixed-layer", "adaptive-small", "per layer: mixed ÷ small step time"),
        ("adaptive-small", "adaptive-small-layer", "equal spans: per head ÷ per layer (goal ≤ 1)"),
        ("adaptive-mixed", "adaptive-mixed-layer", "mixed spans: per head ÷ per layer"),
    ]
    for a, b, label in pairs:
        if a in speed and b in speed:
            ratios = [x / y for x, y in zip(speed[a]["step_times"], speed[b]["step_times"], strict=True)]
            print(
                f"{'':>6} {label}: min {min(ratios):.3f}, median {statistics.median(ratios):.3f} "
                f"({len(ratios)} rounds)",
                flush=True,
            )


def paper_flops() -> list[dict]:
    """The paper's models: our FLOPs/token count against its Tables 1-2."""
    small = dict(d_model=512, n_layers=12, d_inner=2048)
    large = dict(d_model=768, n_layers=24, d_inner=4096)
    rows = [
        # (name, sizes, vocab, average span, paper #params, paper #FLOPS): from the issue / paper
        ("text8 small, adaptive, avg span 314", small, 27, 314, 38e6, 42e6),
        ("text8 small, fixed S=8192", small, 27, 8192, 38e6, None),
        ("text8 small, fixed S=512", small, 27, 512, 38e6, None),
        ("enwik8 small, adaptive, avg span 245", small, 206, 245, 39e6, None),
        ("text8 large, adaptive, avg span 245", large, 27, 245, 209e6, None),
    ]
    out = []
    for name, sizes, vocab, span, params, flops in rows:
        ours = macs_per_token(vocab_size=vocab, spans=span, **sizes)
        out.append(
            {
                "model": name,
                "params": parameter_count(vocab_size=vocab, attn_span=8192, n_heads=8, **sizes),
                "paper_params": params,
                "macs": ours,
                "flops": flops_per_token(vocab_size=vocab, spans=span, **sizes),
                "paper_flops": flops,
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--spans", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--d_model", type=int, default=256)
    parser.add_argument("--n_layers", type=int, default=4)
    parser.add_argument("--n_heads", type=int, default=4)
    parser.add_argument("--d_inner", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--block", type=int, default=256)
    parser.add_argument("--chunk_size", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds")
    parser.add_argument("--steps", type=int, default=5, help="timed rounds (median)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--no_memory", action="store_true", help="skip the peak-memory processes")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--eval", action="store_true", help="evaluation steps (no gradients) instead")
    parser.add_argument("--attention", default="sdpa", choices=["eager", "sdpa"], help="the variants' kernel")
    parser.add_argument(
        "--layer_attention", default=None, choices=["eager", "sdpa"], help="the -layer variants' kernel"
    )
    args = parser.parse_args()

    base = {k: v for k, v in vars(args).items() if k not in ("spans", "variants", "json", "no_memory")}
    print(
        f"model: {args.n_layers} layers, d={args.d_model}, {args.n_heads} heads, inner {args.d_inner}; "
        f"block {args.block} × batch {args.batch}; {args.threads} threads; torch {torch.__version__}; "
        f"{'evaluation' if args.eval else 'training'} steps; attention {args.attention}"
        f"{f' (-layer variants: {args.layer_attention})' if args.layer_attention else ''}"
    )
    header = (
        f"{'S':>6} {'variant':>20} {'attended/layer':>22} {'tokens/s':>9} {'speed-up':>8} "
        f"{'peak MB':>8} {'mem ratio':>9} {'MFLOPs/tok':>10} {'FLOPs ratio':>11}"
    )
    print(header)
    torch.set_num_threads(args.threads)
    results = []
    for S in args.spans:
        config = {**base, "S": S}
        memory = {
            v: float("nan") if args.no_memory else peak_memory_mb({**config, "variant": v})
            for v in args.variants
        }
        speed = measure_speed(config, args.variants)
        for variant in args.variants:
            speed[variant]["peak_mem_mb"] = memory[variant]
        fixed = speed.get("fixed")
        for variant in args.variants:
            r = speed[variant]
            results.append(r)
            up = r["tokens_per_s"] / fixed["tokens_per_s"] if fixed else float("nan")
            mem = fixed["peak_mem_mb"] / r["peak_mem_mb"] if fixed else float("nan")
            flops = fixed["flops_per_token"] / r["flops_per_token"] if fixed else float("nan")
            print(
                f"{S:>6} {variant:>20} {r['attended']!s:>22} {r['tokens_per_s']:>9.0f} {up:>7.2f}× "
                f"{r['peak_mem_mb']:>8.0f} {mem:>8.2f}× {r['flops_per_token'] / 1e6:>10.2f} {flops:>10.2f}×",
                flush=True,
            )
        print_goal_ratios(speed)
    print("\nspeed-up = tokens/s ÷ fixed's at the same S; mem ratio = fixed's peak ÷ this peak;")
    print("FLOPs ratio = fixed's FLOPs/token ÷ this one (counted over the attended, trimmed positions).\n")

    print("Cost per token of the paper's models (methods/adaptive_span/flops.py): multiply-accumulates,")
    print(
        "the paper's #FLOPS convention, and FLOPs = 2 × MACs, longctx's convention (longctx/core/flops.py):"
    )
    print(f"{'model':>40} {'params':>8} {'paper':>6} {'MMACs':>8} {'paper':>6} {'MFLOPs':>8}")
    paper = paper_flops()
    for row in paper:
        paper_flops_str = f"{row['paper_flops'] / 1e6:.0f}M" if row["paper_flops"] else "-"
        print(
            f"{row['model']:>40} {row['params'] / 1e6:>7.1f}M {row['paper_params'] / 1e6:>5.0f}M "
            f"{row['macs'] / 1e6:>8.1f} {paper_flops_str:>6} {row['flops'] / 1e6:>8.1f}"
        )
    if args.json:
        args.json.write_text(json.dumps({"runs": results, "paper_flops": paper}, indent=1))


if __name__ == "__main__":
    main()
