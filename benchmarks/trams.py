"""Evaluation throughput of Transformer-XL at m, at the full pool M, and TRAMS (M → m), on one model.

    python benchmarks/trams.py                   # paper shapes: 16 layers, d=410, M=400, m=200=150+50, n=64
    python benchmarks/trams.py --ckpt <xl.ckpt>  # a trained TransformerXLLM checkpoint
    python benchmarks/trams.py --grid configs/transformer_xl_tiny.yaml --ckpt <xl.ckpt> \
        --pool 64 --attended 32 --kept 24         # perplexity grid on the config's validation split
    python benchmarks/trams.py --goal --shape tiny --threads 1 2 --repeats 7   # issue 15's goal, see below

Every setting runs the same weights on the same token stream, with TRAMS's protocol (a zero-filled
memory, so every segment attends to a full pool from the start), in inference mode:

- `xl_m`: Transformer-XL with memory m (the paper's baseline, cost of m keys);
- `xl_M`: Transformer-XL over the whole pool M;
- `trams_released`: TRAMS computed as the released code does (lwaekfjlk/TRAMS: d_model-sized
  K′ = W_Qᵀk materialised for every key and head, the content score as x·K′, the memory's keys and
  values projected again every segment);
- `trams`: ours (‖K′‖ = ‖Rk‖ with W_Qᵀ = QR, ΣK′ = (W_Q 1)·k, each slot scored once with the cache);
- `*_cached`: the same with the evaluation key/value cache (the memory's keys and values carried
  instead of projected again every segment), `TransformerXLLM`'s default at evaluation.

Prints tokens/s and the ratio to `xl_m` measured in the same run, plus the mean attention mass on
the attended memory (XL at m vs TRAMS), and checks that both TRAMS implementations agree.

With `--goal`, only `trams_cached` (with its score cache) and `xl_m_cached` run, in lockstep: segment
by segment, in alternating order, so that a change in machine load hits both alike. Each of
`--repeats` repeats gives the ratio of their evaluation times over the timed segments (TRAMS ÷ XL at
m; issue 15's goal: ≤ 1.10), in wall-clock time and in process CPU time (which leaves out the time
spent waiting for a core on a shared machine); printed as min and median, for each `--threads` count.
`--shape tiny` takes the model sizes of configs/transformer_xl_tiny.yaml (4 layers, d_model 128,
4 heads, inner 512), `--shape wt103` the WikiText-103 base model's (the defaults). Both use the
random-init full softmax over `--vocab` tokens: a real (adaptive) softmax adds the same cost to both
settings and would only bring the ratio closer to 1.

With `--grid CONFIG`, evaluates the checkpoint instead on the config's validation split (through
Lightning, `TransformerXLLM` built from the config with evaluation knobs overridden): Transformer+RPE
(no memory), XL at m, XL at M, TRAMS (M → m) with the code's and the paper's metric and the oracle,
under both protocols, printing loss, perplexity, scored tokens and the memory attention mass.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

from longctx.core.knob_groups import override_groups
from longctx.methods.transformer_xl.memory import XLMemory
from longctx.methods.transformer_xl.network import TransformerXL
from longctx.methods.transformer_xl.relative_attention import (
    RelMultiHeadAttention,
    rel_shift,
    sinusoid_positions,
)
from longctx.methods.transformer_xl.trams import TramsSettings


class Segment(NamedTuple):
    """One segment's last hidden states (B, n, d), the memory kept, the mean memory mass (or None)."""

    hidden: Tensor
    memory: object
    mem_mass: float | None


def released_attention(
    attn: RelMultiHeadAttention,
    x: Tensor,
    mem: Tensor,
    pos_emb: Tensor,
    u: Tensor,
    v: Tensor,
    trams: TramsSettings,
) -> Tensor:
    """The released TRAMS attention layer (post-LN, all memory slots real), restated batch-first:
    x (B, n, d) over its memory mem (B, M, d) -> (B, n, d)."""
    B, n, _ = x.shape
    H, Dh = attn.n_heads, attn.d_head
    cat = torch.cat([mem, x], 1)
    klen = cat.shape[1]
    q, k, vv = attn.qkv_net(cat).split(H * Dh, dim=-1)
    q = q[:, -n:].view(B, n, H, Dh)
    k, vv = k.view(B, klen, H, Dh), vv.view(B, klen, H, Dh)
    qkk = torch.einsum("bjnd,ndk->bjnk", k, attn.query_weight())  # (B, klen, H, d): K′ for every key
    stdlen = n + trams.kept
    mem_qkk = qkk[:, :-stdlen]
    score = mem_qkk.norm(dim=-1) * mem_qkk.sum(-1).abs()
    idx = score.topk(trams.selected, dim=1).indices.sort(dim=1).values  # (B, k, H)

    def pick(t: Tensor) -> Tensor:
        sel = t[:, :-stdlen].gather(1, idx[..., None].expand(-1, -1, -1, t.shape[-1]))
        return torch.cat([sel, t[:, -stdlen:]], 1)

    qkk_w, k_w, v_w = pick(qkk), pick(k), pick(vv)
    W = trams.attended + n
    r = attn.r_net(pos_emb[-W:]).view(W, H, Dh)
    ac = torch.einsum("bik,bjnk->bnij", x, qkk_w) + torch.einsum("nd,bjnd->bnj", u, k_w)[:, :, None]
    bd = rel_shift(torch.einsum("bind,jnd->bnij", q + v, r))
    mask = torch.triu(torch.ones(n, W, dtype=torch.bool, device=x.device), 1 + W - n)
    probs = torch.softmax(((ac + bd) * attn.scale).masked_fill(mask, float("-inf")), dim=-1)
    vec = torch.einsum("bnij,bjnd->bind", probs, v_w).reshape(B, n, H * Dh)
    return attn.layer_norm(x + attn.o_net(vec))


def released_forward(model: TransformerXL, x: Tensor, memory: list[Tensor], trams: TramsSettings) -> Segment:
    """The released TRAMS network over one segment on `model`'s weights: each layer's released
    attention over its memory (the whole pool M), then its feed-forward; each layer's memory becomes
    the last M of [memory, input], as the code's `_update_mems`. No key/value or score cache."""
    h = model.drop(model.word_emb(x))  # (B, n, d)
    M = memory[0].shape[1]
    pos_emb = model.drop(sinusoid_positions(M + x.shape[1], model.d_model, 0, h.device, h.dtype))
    kept = []
    for i, (layer, mem) in enumerate(zip(model.layers, memory)):
        kept.append(torch.cat([mem, h], 1)[:, -M:])
        u, v = (model.r_w_bias[i], model.r_r_bias[i]) if model.untie_r else (model.r_w_bias, model.r_r_bias)
        h = layer.ff(released_attention(layer.attn, h, mem, pos_emb, u, v, trams))
    return Segment(model.drop(h), kept, None)


def ours(model: TransformerXL, mem_len: int, trams: TramsSettings | None, cache_kv: bool, need_mass: bool):
    """A segment step of `model` itself (`TransformerXL.forward`) with these evaluation knobs."""

    def step(x: Tensor, memory: XLMemory) -> Segment:
        out = model(x, memory, mem_len=mem_len, trams=trams, need_mass=need_mass, cache_kv=cache_kv)
        mass = torch.stack([a.mem_mass for a in out.attn]).mean().item() if need_mass else None
        return Segment(out.hidden, out.memory, mass)

    return step


def run(
    model: TransformerXL,
    step: Callable[[Tensor, object], Segment],
    memory: object,
    tokens: Tensor,
    n: int,
    warmup: int,
) -> tuple[float, float | None, Tensor]:
    """Tokens/s of `step` over the stream after `warmup` segments from `memory`; mean memory mass;
    last hidden states."""
    B = tokens.shape[0]
    masses, start, counted = [], None, 0
    for s in range(tokens.shape[1] // n):
        if s == warmup:
            start = time.perf_counter()
        seg = tokens[:, s * n : (s + 1) * n]
        out = step(seg, memory)
        nll = model.nll(out.hidden, tokens[:, s * n : (s + 1) * n])
        nll.sum().item()  # synchronise
        memory = out.memory
        if s >= warmup:
            counted += B * n
            if out.mem_mass is not None:
                masses.append(out.mem_mass)
    elapsed = time.perf_counter() - start
    return counted / elapsed, (sum(masses) / len(masses) if masses else None), out.hidden


TRAMS_POOL = {"pool": "M", "attended": "m", "kept": "kept"}
# name: the evaluation groups of TransformerXLLM (m, M, kept filled in from the arguments)
GRID = {
    "rpe": {"evaluation": {"mem_len": 0}},
    "xl_m": {"evaluation": {"mem_len": "m"}},
    "xl_M": {"evaluation": {"mem_len": "M"}},
    "trams": {"trams": TRAMS_POOL},
    "trams_paper": {"trams": {**TRAMS_POOL, "metric": "paper"}},
    "trams_true_pos": {"trams": {**TRAMS_POOL, "positions": "true"}},
    "oracle": {"trams": {**TRAMS_POOL, "metric": "oracle"}},
}


SHAPES = {  # model sizes: (n_layers, d_model, n_heads, d_inner)
    "wt103": (16, 410, 10, 2100),  # the WikiText-103 base model (TRAMS's paper)
    "tiny": (4, 128, 4, 512),  # configs/transformer_xl_tiny.yaml
}


def lockstep(model: TransformerXL, tokens: Tensor, args: argparse.Namespace) -> tuple[float, float]:
    """TRAMS (M → m) ÷ XL at m evaluation time over the timed segments, both with the key/value
    cache, run segment by segment in alternating order: (wall-clock ratio, process CPU time ratio)."""
    n, B = args.tgt_len, tokens.shape[0]
    streams = {
        "xl_m_cached": (args.attended, None),
        "trams_cached": (args.pool, TramsSettings(args.attended, args.kept)),
    }
    memory = {name: model.zero_memory(B, mem_len) for name, (mem_len, _) in streams.items()}
    wall, cpu = dict.fromkeys(streams, 0.0), dict.fromkeys(streams, 0.0)
    for s in range(tokens.shape[1] // n):
        seg = tokens[:, s * n : (s + 1) * n]
        for name in sorted(streams, reverse=bool(s % 2)):
            mem_len, trams = streams[name]
            w, c = time.perf_counter(), time.process_time()
            out = model(seg, memory[name], mem_len=mem_len, trams=trams, cache_kv=True)
            model.nll(out.hidden, seg).sum().item()  # synchronise
            if s >= args.warmup:
                wall[name] += time.perf_counter() - w
                cpu[name] += time.process_time() - c
            memory[name] = out.memory
    return wall["trams_cached"] / wall["xl_m_cached"], cpu["trams_cached"] / cpu["xl_m_cached"]


def goal(model: TransformerXL, tokens: Tensor, args: argparse.Namespace) -> None:
    """Issue 15's goal, TRAMS at the cost of XL: min and median of `lockstep`'s ratios per thread count."""
    print(
        f"{args.shape or 'custom'}: layers {model.n_layers}, d_model {model.d_model}, heads {model.n_heads}, "
        f"batch {args.batch}, n {args.tgt_len}, M {args.pool}, m {args.attended} = {args.kept} kept + "
        f"{args.attended - args.kept} selected, {args.segments - args.warmup} timed segments, "
        f"{args.repeats} repeats"
    )
    print("trams_cached ÷ xl_m_cached evaluation time (goal ≤ 1.10)")
    with torch.inference_mode():
        for threads in args.threads:
            torch.set_num_threads(threads)
            wall, cpu = zip(*(lockstep(model, tokens, args) for _ in range(args.repeats)))
            print(
                f"  {threads} thread(s): wall min {min(wall):.3f} median {statistics.median(wall):.3f}; "
                f"CPU time min {min(cpu):.3f} median {statistics.median(cpu):.3f}  "
                f"(wall by repeat {[round(r, 3) for r in wall]})",
                flush=True,
            )


def grid(args: argparse.Namespace) -> None:
    """Validation loss of one checkpoint under every setting of GRID and both protocols."""
    import lightning.pytorch as pl
    import yaml

    from longctx.data.datamodule import LMDataModule
    from longctx.methods.transformer_xl.module import TransformerXLLM

    config = yaml.safe_load(Path(args.grid).read_text())
    model_args = {
        k: v for k, v in config["model"]["init_args"].items() if k not in ("optimizer", "lr_scheduler")
    }
    data = LMDataModule(**config["data"])
    state = torch.load(args.ckpt, map_location="cpu", weights_only=False)["state_dict"]
    values = {"m": args.attended, "M": args.pool, "kept": args.kept}
    rows = []
    for protocol in ("xl", "trams"):
        for name, groups in GRID.items():
            knobs = {
                group: {k: values.get(v, v) if isinstance(v, str) else v for k, v in fields.items()}
                for group, fields in groups.items()
            }
            plain_evaluation = {"evaluation": {"same_length": False, "clamp_len": 0}, "protocol": protocol}
            settings = override_groups(override_groups(model_args, plain_evaluation), knobs)
            model = TransformerXLLM(vocab_size=data.vocab_size, **settings)
            model.load_state_dict(state)
            trainer = pl.Trainer(
                accelerator="cpu",
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                limit_val_batches=args.limit_batches or 1.0,
            )
            start = time.perf_counter()
            metrics = trainer.validate(model, datamodule=data, verbose=False)[0]
            elapsed = time.perf_counter() - start
            rows.append((protocol, name, metrics, elapsed))
            print(
                f"{protocol:>6s} {name:>15s} loss {float(metrics['val/loss']):.4f} "
                f"ppl {math.exp(float(metrics['val/loss'])):9.2f} tokens {int(metrics['val/tokens']):7d} "
                f"mem_mass {float(metrics['trams/mem_mass']):.4f} ({elapsed:.0f} s)",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ckpt", default=None, help="TransformerXLLM checkpoint (else random init)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default=None, help="preset model sizes")
    parser.add_argument("--n_layers", type=int, default=16)
    parser.add_argument("--d_model", type=int, default=410)
    parser.add_argument("--n_heads", type=int, default=10)
    parser.add_argument("--d_inner", type=int, default=2100)
    parser.add_argument("--goal", action="store_true", help="only the issue-15 ratio, min/median")
    parser.add_argument("--vocab", type=int, default=1000, help="random init only (full softmax)")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--tgt_len", type=int, default=64, help="n")
    parser.add_argument("--pool", type=int, default=400, help="M")
    parser.add_argument("--attended", type=int, default=200, help="m")
    parser.add_argument("--kept", type=int, default=150, help="m − k")
    parser.add_argument("--segments", type=int, default=11)
    parser.add_argument("--warmup", type=int, default=7, help="untimed segments (fill the pool)")
    parser.add_argument("--repeats", type=int, default=2, help="best of")
    parser.add_argument(
        "--threads", type=int, nargs="+", default=[2], help="thread counts (--goal: each; else the first)"
    )
    parser.add_argument("--grid", default=None, help="config: evaluate --ckpt on its validation split")
    parser.add_argument("--limit_batches", type=int, default=0, help="--grid: validation batches (0 = all)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads[0])
    if args.shape:
        args.n_layers, args.d_model, args.n_heads, args.d_inner = SHAPES[args.shape]
    if args.grid:
        if not args.ckpt:
            raise SystemExit("--grid needs --ckpt")
        grid(args)
        return
    torch.manual_seed(0)
    if args.ckpt:
        from longctx.methods.transformer_xl.module import TransformerXLLM

        model = TransformerXLLM.load_from_checkpoint(args.ckpt, map_location="cpu").net
    else:
        model = TransformerXL.Config(
            args.n_layers, args.d_model, args.n_heads, args.d_inner, dropout=0.0
        ).build(args.vocab)
    model.eval()
    vocab = model.word_emb.n_token
    n_tokens = args.tgt_len * args.segments
    tokens = torch.randint(0, vocab, (args.batch, n_tokens))
    if args.goal:
        goal(model, tokens, args)
        return
    trams = TramsSettings(args.attended, args.kept)
    settings = {  # name: (memory length, TRAMS, key/value cache)
        "xl_m": (args.attended, None, False),
        "xl_M": (args.pool, None, False),
        "trams_released": (args.pool, trams, False),
        "trams": (args.pool, trams, False),
        "xl_m_cached": (args.attended, None, True),
        "xl_M_cached": (args.pool, None, True),
        "trams_cached": (args.pool, trams, True),
    }
    results: dict[str, tuple[float, float | None]] = {}
    hidden: dict[str, Tensor] = {}
    with torch.inference_mode():
        for _ in range(args.repeats):
            for name, (mem_len, setting, cache_kv) in settings.items():
                memory = model.zero_memory(args.batch, mem_len)
                if name == "trams_released":
                    step, memory = partial(released_forward, model, trams=setting), memory.hidden
                else:
                    step = ours(model, mem_len, setting, cache_kv, need_mass=name in ("xl_m", "trams"))
                tps, mass, hid = run(model, step, memory, tokens, args.tgt_len, args.warmup)
                best = results.get(name, (0.0, None))[0]
                results[name] = (max(best, tps), mass)
                hidden[name] = hid
    diff = max(
        (hidden[name] - hidden["trams_released"]).abs().max().item() for name in ("trams", "trams_cached")
    )
    base = results["xl_m"][0]
    print(
        f"layers {model.n_layers}, d_model {model.d_model}, heads {model.n_heads}, batch {args.batch}, "
        f"n {args.tgt_len}, M {args.pool}, m {args.attended} = {args.kept} kept + "
        f"{args.attended - args.kept} selected, {args.segments - args.warmup} timed segments, "
        f"best of {args.repeats}, {torch.get_num_threads()} threads"
    )
    print(f"{'setting':>16s} {'tokens/s':>10s} {'vs xl_m':>8s}")
    for name, (tps, _) in results.items():
        print(f"{name:>16s} {tps:10.1f} {tps / base:8.3f}")
    mass_xl, mass_trams = results["xl_m"][1], results["trams"][1]
    print(
        f"attention mass on the attended memory: xl_m {mass_xl:.4f}, trams {mass_trams:.4f} "
        f"({100 * (mass_trams / mass_xl - 1):+.2f}%)"
    )
    print(f"max |trams(_cached) - trams_released| on the last hidden states: {diff:.2e}")
    if not math.isfinite(diff) or diff > 1e-3:
        raise SystemExit("our TRAMS and the released computation disagree")


if __name__ == "__main__":
    main()
