"""`TransformerXLLM`: Transformer-XL (Dai et al. 2019), the Transformer+RPE baseline (`mem_len: 0`) and
TRAMS memory selection at evaluation (Yu et al. 2023) on the `LMBase` spine.

The memory carried across batches is, per layer, the last `mem_len` inputs of the layer plus a
validity mask (`memory.py`). Every evaluation knob is an init argument, so it can be
changed without retraining: LightningCLI builds the model from the config and then loads the
checkpoint's weights (`python -m longctx test --config configs/trams_wt103.yaml --ckpt_path X`), and
`TransformerXLLM.load_from_checkpoint(X, trams_attended=200, ...)` overrides the stored ones.

Training uses `mem_len`, `clamp_len`, `same_length`. Validation and test use `eval_mem_len`,
`eval_clamp_len`, `eval_same_length` (None = the training value); Transformer-XL's published
evaluation is wt103 eval_tgt_len 64 (a data knob), eval_mem_len 640, eval_clamp_len 400, same_length;
enwik8 eval_tgt_len 80, eval_mem_len 2100, eval_clamp_len 820, same_length.

TRAMS (evaluation only) is on when `trams_attended` (m) is set: the memory is a pool of the last
`trams_pool` (M) states per layer, updated with every new state whatever was selected; each query
attends to the newest `trams_kept` (m − k) pool slots plus k = m − trams_kept slots selected from the
older ones (paper and code: M=400, m=200 = 150 kept + 50 selected, n = 64). `trams_metric` "code"
(the released ‖K′‖·|ΣK′|), "paper" (cos⟨K′, 1⟩·‖K′‖) or "oracle" (largest actual attention
probability); `trams_positions` "compact" (the code: selected tokens placed right before the kept
block) or "true" (their real distances). Details in `longctx.methods.transformer_xl.trams`.

Evaluation protocols (`protocol`), a config choice to match the table compared with:
- "xl": Transformer-XL's evaluation: the first segment has an empty memory and every target is
  scored (compare with the Transformer-XL paper).
- "trams": the TRAMS code's evaluation: the first memory is mem_len zero states that are attended,
  and the first token of each segment is never scored (their Hugging Face loss shifts labels inside
  each segment); in our batches that is the last real target of each segment row, the token that
  opens the next segment (`drop_last_scored`; compare with the TRAMS paper's tables).

Logged at evaluation (when `log_attention_mass`): `trams/mem_mass`, the attention probability on the
attended memory keys averaged over layers, heads, queries and batch rows (the paper's attention-mass
analysis: XL at m vs TRAMS at m), and `trams/mem_mass_layer{i}`.

The papers' symbols and where each lives in this folder: the package docstring (`__init__.py`).
"""

from __future__ import annotations

from typing import Literal

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch import Tensor

from longctx.core.base import LMBase, StepOutput
from longctx.methods.attention_kernel import AttentionKernel
from longctx.methods.transformer_xl import flops as xl_flops
from longctx.methods.transformer_xl import memory as xl_memory
from longctx.methods.transformer_xl.adaptive_softmax import cutoffs_within
from longctx.methods.transformer_xl.memory import XLMemory
from longctx.methods.transformer_xl.network import TransformerXL
from longctx.methods.transformer_xl.trams import Metric, Positions, TramsSettings

Protocol = Literal["xl", "trams"]


class TransformerXLLM(LMBase):
    """Transformer-XL language model with evaluation-time memory settings and TRAMS.

    Args:
        n_layers, d_model, n_heads, d_head, d_inner, d_embed: sizes (wt103 base: 16, 410, 10, 41,
            2100; enwik8 base: 12, 512, 8, 64, 2048). d_head / d_embed None: d_model // n_heads / d_model.
        dropout, dropatt: dropout (0.1) and attention dropout (0.0).
        pre_lnorm: pre-LN blocks (the code's scripts all use post-LN).
        cutoffs, div_val, tie_weight, tie_projs: adaptive input and softmax (wt103: [20000, 40000,
            200000], div_val 1, tied, tie_projs [False, True, True, True]); cutoffs [] = full softmax.
        init_std, proj_init_std: initialisation (0.02, 0.01).
        untie_r: one u, v pair per layer (Hugging Face's transfo-xl-wt103) instead of one shared pair.
        mem_len, clamp_len, same_length: training memory length (0 = Transformer+RPE), cap of
            relative positions (0 = none), equal key count per query.
        eval_mem_len, eval_clamp_len, eval_same_length: the same at validation/test (None = training's).
        protocol: "xl" or "trams" evaluation protocol (see the module docstring).
        trams_attended, trams_pool, trams_kept, trams_metric, trams_positions: TRAMS's m, M (default:
            the evaluation memory length), m − k, metric and positions; trams_attended None = off.
        log_attention_mass: log `trams/mem_mass*` at evaluation. Off by default: the fused kernels
            return no probabilities, so this runs the evaluation attention op by op (the TRAMS
            configs turn it on for the paper's attention-mass analysis).
        attention: "sdpa" (the attention in one fused kernel, default), "eager" (op by op, as the
            released code) or "flex" (compiled flex_attention at evaluation, sdpa in training, said
            once in the log); equal to float rounding, see `relative_attention`.
        eval_cache_kv: at evaluation, carry the memory's keys and values instead of projecting the
            memory again every segment (exact; the released codes re-project).
        vocab_size, optimizer, lr_scheduler: see `LMBase` (paper: Adam 2.5e-4, cosine, no warm-up).
    """

    batch_mode = "segments"

    def __init__(
        self,
        vocab_size: int = 0,
        n_layers: int = 16,
        d_model: int = 410,
        n_heads: int = 10,
        d_head: int | None = None,
        d_inner: int = 2100,
        d_embed: int | None = None,
        dropout: float = 0.1,
        dropatt: float = 0.0,
        pre_lnorm: bool = False,
        cutoffs: list[int] | None = None,
        div_val: int = 1,
        tie_weight: bool = True,
        tie_projs: list[bool] | None = None,
        init_std: float = 0.02,
        proj_init_std: float = 0.01,
        untie_r: bool = False,
        mem_len: int = 150,
        clamp_len: int = 0,
        same_length: bool = False,
        eval_mem_len: int | None = None,
        eval_clamp_len: int | None = None,
        eval_same_length: bool | None = None,
        protocol: Protocol = "xl",
        trams_attended: int | None = None,
        trams_pool: int | None = None,
        trams_kept: int | None = None,
        trams_metric: Metric = "code",
        trams_positions: Positions = "compact",
        log_attention_mass: bool = False,
        eval_cache_kv: bool = True,
        attention: AttentionKernel = "sdpa",
        optimizer: OptimizerCallable = torch.optim.Adam,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__(vocab_size=vocab_size, optimizer=optimizer, lr_scheduler=lr_scheduler)
        self.save_hyperparameters()
        if mem_len < 0 or clamp_len < 0 or (eval_mem_len or 0) < 0 or (eval_clamp_len or 0) < 0:
            raise ValueError("mem_len, clamp_len, eval_mem_len and eval_clamp_len must be >= 0")
        if protocol not in ("xl", "trams"):
            raise ValueError(f"protocol must be 'xl' or 'trams', got {protocol!r}")
        # A word-level recipe's cutoffs on a byte-level corpus: a full softmax, said once.
        self.cutoffs = cutoffs_within(vocab_size, cutoffs)
        if len(self.cutoffs) < len(cutoffs or []):
            rank_zero_info(
                f"longctx: cutoffs {list(cutoffs or [])} reach past the vocabulary ({vocab_size}): "
                f"adaptive softmax cutoffs {self.cutoffs or 'none (a full softmax)'}"
            )
        self.net = TransformerXL(
            vocab_size=vocab_size,
            n_layers=n_layers,
            d_model=d_model,
            n_heads=n_heads,
            d_inner=d_inner,
            d_head=d_head,
            d_embed=d_embed,
            dropout=dropout,
            dropatt=dropatt,
            pre_lnorm=pre_lnorm,
            cutoffs=self.cutoffs,
            div_val=div_val,
            tie_weight=tie_weight,
            tie_projs=tie_projs,
            init_std=init_std,
            proj_init_std=proj_init_std,
            untie_r=untie_r,
            attention=attention,
        )
        self.mem_len, self.clamp_len, self.same_length = mem_len, clamp_len, same_length
        self.eval_mem_len = mem_len if eval_mem_len is None else eval_mem_len
        self.eval_clamp_len = clamp_len if eval_clamp_len is None else eval_clamp_len
        self.eval_same_length = same_length if eval_same_length is None else eval_same_length
        self.protocol = protocol
        self.trams: TramsSettings | None = None
        if trams_attended is not None:
            if trams_kept is None:
                raise ValueError(
                    "trams_kept (m − k, the newest pool slots always attended) must be set with "
                    "trams_attended (paper: trams_attended 200, trams_kept 150, trams_pool 400)"
                )
            self.trams = TramsSettings(trams_attended, trams_kept, trams_metric, trams_positions)
            self.eval_mem_len = self.eval_mem_len if trams_pool is None else trams_pool
            if trams_attended > self.eval_mem_len:
                raise ValueError(
                    f"trams_attended ({trams_attended}) cannot exceed the pool ({self.eval_mem_len})"
                )
        self.log_attention_mass = log_attention_mass
        self.eval_cache_kv = eval_cache_kv

    # ------------------------------------------------------------------ memory
    def init_memory(self, batch_size: int) -> XLMemory:
        if not self.training and self.protocol == "trams":
            return self.net.zero_memory(batch_size, self.eval_mem_len)
        return self.net.empty_memory(batch_size)

    def reset_memory_rows(self, memory: XLMemory, reset: Tensor) -> XLMemory:
        zero_fill = not self.training and self.protocol == "trams"
        return xl_memory.reset_memory_rows(memory, reset, zero_fill=zero_fill)

    # ------------------------------------------------------------------ cost
    def flops_per_token(self, segment_length: int) -> float:
        """Forward FLOPs per scored token at evaluation with the full evaluation memory (TRAMS: the
        pool M, the attended window and the scoring; `flops.py`)."""
        h, net = self.hparams, self.net
        return xl_flops.flops_per_token(
            n_layers=net.n_layers,
            d_model=net.d_model,
            n_heads=net.n_heads,
            d_head=net.d_head,
            d_inner=h.d_inner,
            vocab_size=self.vocab_size,
            segment_length=segment_length,
            memory_length=self.eval_mem_len,
            cutoffs=self.cutoffs,
            d_embed=h.d_embed,
            div_val=h.div_val,
            cache_kv=self.eval_cache_kv,
            trams=self.trams,
            scored_per_segment=segment_length - 1 if self.protocol == "trams" else segment_length,
        )

    # ------------------------------------------------------------------ step
    def step(self, batch: dict[str, Tensor], memory: XLMemory) -> StepOutput:
        x = batch["input"]
        evaluating = not self.training
        need_mass = evaluating and self.log_attention_mass
        out = self.net(
            x,
            memory,
            mem_len=self.eval_mem_len if evaluating else self.mem_len,
            clamp_len=self.eval_clamp_len if evaluating else self.clamp_len,
            same_length=self.eval_same_length if evaluating else self.same_length,
            trams=self.trams if evaluating else None,
            need_mass=need_mass,
            cache_kv=evaluating and self.eval_cache_kv,
        )
        nll = self.net.nll(out.hidden, batch["target"])  # (B, n)
        mask = drop_last_scored(batch["mask"]) if evaluating and self.protocol == "trams" else None
        logs: dict[str, Tensor | float] = {}
        if need_mass:
            masses = torch.stack([a.mem_mass for a in out.attn]).detach().float()
            logs["trams/mem_mass"] = masses.mean()
            for i, m in enumerate(masses):
                logs[f"trams/mem_mass_layer{i}"] = m
        return StepOutput(nll=nll, memory=out.memory, mask=mask, logs=logs)


def drop_last_scored(mask: Tensor) -> Tensor:
    """The TRAMS protocol's mask: `mask` (B, n) without each row's last scored target.

    TRAMS's evaluation never scores the first token of a segment; in our batches that token is the
    last *real* target of the segment (the one that opens the next segment). In a short final
    segment the real targets end before column n − 1 (padding follows, already unscored), so the
    dropped column is found per row rather than fixed at −1. Rows with no scored target are unchanged.
    """
    n = mask.shape[1]
    last = n - 1 - mask.flip(-1).to(torch.uint8).argmax(-1)  # (B,) last True column (n − 1 if none)
    dropped = mask.clone()
    dropped.scatter_(1, last[:, None], False)  # a row with no True only gets its False rewritten
    return dropped
