"""`python -m longctx convert`: released checkpoints in the authors' own layouts give the authors' own
per-token NLL in longctx.

The fixtures (`../shared/fixtures/authors_checkpoints`, see its README) were written by the authors'
code itself, with that code's float32 per-token NLL on a real text piece; those NLLs are the
independent computation the converted models are compared with (≤ 1e-5 relative), so no hand-written
reference forward is needed here. Skipped when `../shared` is absent.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch import Trainer

from longctx.checkpoints.convert import ConvertError
from longctx.checkpoints.safe_unpickle import UnsafePickleError, load_pickle, load_torch_pickle
from longctx.commands.convert import convert, main, split_overrides, vocab_path_for
from longctx.data.tokenize import WordVocab
from longctx.methods.adaptive_span.convert import (
    longctx_id,
    permute_rows,
    vocabulary_from_files,
    vocabulary_from_ids,
)
from longctx.methods.adaptive_span.module import AdaptiveSpanLM
from longctx.methods.transformer_xl.convert import read_hf_vocab
from longctx.methods.transformer_xl.module import TransformerXLLM
from tests.helpers.environment import REPO, shared_dir, skip_without_shared

FIXTURES = shared_dir() / "fixtures" / "authors_checkpoints"
pytestmark = skip_without_shared("fixtures", "authors_checkpoints")
ADAPTIVE = FIXTURES / "adaptive_span"
RTOL = 1e-5

ADAPTIVE_SIZES = "d_model: 32, n_layers: 2, n_heads: 4, d_inner: 64, attn_span: 256"
ADAPTIVE_CONFIG = f"""\
model:
  class_path: longctx.methods.adaptive_span.module.AdaptiveSpanLM
  init_args: {{network: {{{ADAPTIVE_SIZES}, span_ramp: 8, dropout: 0.0}}}}
data:
  corpus: enwik8
"""


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")


def write_config(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ---------------------------------------------------------------------------------- adaptive-span
def adaptive_blocks(n_blocks: int = 46, block: int = 32, batch: int = 2) -> list[dict[str, torch.Tensor]]:
    """Their full_eval batches on the test bytes: rows = batchify(test, 2) (1500 columns each; their
    extra final `<eos>` falls in the dropped tail), block i predicts columns i·M+1 .. (i+1)·M."""
    raw = (ADAPTIVE / "data" / "test.txt.raw").read_bytes()
    ncols = len(raw) // batch
    rows = torch.tensor(list(raw[: ncols * batch])).view(batch, ncols)
    return [
        {
            "input": rows[:, i * block : (i + 1) * block],
            "target": rows[:, i * block + 1 : (i + 1) * block + 1],
            "mask": torch.ones(batch, block, dtype=torch.bool),
            "reset": torch.full((batch,), i == 0),
        }
        for i in range(n_blocks)
    ]


class Batches:
    """One loader of ready batches (Lightning reads a plain list as several loaders)."""

    def __init__(self, batches: list[dict[str, torch.Tensor]]) -> None:
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


@pytest.fixture(scope="module")
def adaptive_ckpt(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("adaptive")
    config = write_config(tmp, ADAPTIVE_CONFIG)
    dest = tmp / "adaptive_span.ckpt"
    convert("adaptive-span", config, ADAPTIVE / "checkpoint.pt", dest, vocab=ADAPTIVE / "data")
    return dest


def test_adaptive_span_vocabulary_is_theirs():
    expected = json.loads((ADAPTIVE / "expected.json").read_text())["vocab"]["idx2word"]
    assert vocabulary_from_files(ADAPTIVE / "data") == expected
    # Rebuilt from the raw bytes of the splits (what longctx's enwik8 cache holds): the same order.
    splits = [
        np.frombuffer((ADAPTIVE / "data" / f"{s}.txt.raw").read_bytes(), np.uint8)
        for s in ("train", "valid", "test")
    ]
    assert vocabulary_from_ids(splits, "byte") == expected
    # The test ids are the test bytes with <eos> for the newline byte.
    test_ids = np.load(ADAPTIVE / "test_ids.npy")
    raw = (ADAPTIVE / "data" / "test.txt.raw").read_bytes()
    byte_of_id = [10 if s == "<eos>" else int(s) for s in expected]
    assert (
        bytes(np.asarray(byte_of_id)[test_ids.reshape(-1)].astype(np.uint8).tolist()) == raw[: test_ids.size]
    )


def test_text8_vocabulary_maps_onto_longctx_characters():
    """prep_text8.py writes `_` for a space and each split as one line (one `<eos>` after it); their
    `<eos>` has no longctx text8 id and its row is dropped."""
    splits = [np.array([1, 0, 2, 1]), np.array([3, 0]), np.array([1])]  # "a ba" | "c " | "a"
    symbols = vocabulary_from_ids(splits, "char")
    assert symbols == ["a", "_", "b", "<eos>", "c"]
    targets = [longctx_id(s, "char") for s in symbols]
    assert targets == [1, 0, 2, None, 3]
    rows = torch.arange(5.0)[:, None]  # their row i holds i
    moved = permute_rows(rows, targets, 27, fill=-1.0)[:, 0]
    assert moved[:4].tolist() == [1.0, 0.0, 2.0, 4.0] and moved[4:].eq(-1.0).all()
    with pytest.raises(ConvertError, match="is not a text8 character"):
        longctx_id("A", "char")


@pytest.mark.slow  # ~10-30 s on 2 CPU cores: the fast tier stays within 3 minutes
def test_adaptive_span_matches_their_per_token_nll(adaptive_ckpt):
    model = AdaptiveSpanLM.load_from_checkpoint(adaptive_ckpt).eval()
    assert model.net.cache_sizes() == [128, 192]  # their cache sizes at the start of full_eval
    expected = np.load(ADAPTIVE / "expected_nll.npy")  # (2, 46·32)
    memory, nll = model.init_memory(2), []  # zero caches, attended (as theirs)
    with torch.no_grad():
        for batch in adaptive_blocks():
            out = model.step(batch, memory)
            memory = out.memory
            nll.append(out.nll)
    np.testing.assert_allclose(torch.cat(nll, dim=1).numpy(), expected, rtol=RTOL, atol=0)


def test_adaptive_span_unseen_bytes_have_probability_zero(adaptive_ckpt):
    model = AdaptiveSpanLM.load_from_checkpoint(adaptive_ckpt).eval()
    seen = {10 if s == "<eos>" else int(s) for s in vocabulary_from_files(ADAPTIVE / "data")}
    batch = adaptive_blocks(n_blocks=1)[0]
    with torch.no_grad():
        probs = model.net(batch["input"], model.init_memory(2)).logits.softmax(-1)  # (B, M, 256)
    unseen = sorted(set(range(256)) - seen)
    assert probs[..., unseen].max().item() == 0.0
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 32))


def test_adaptive_span_checkpoint_keeps_the_architecture_and_loads_into_the_network_group(adaptive_ckpt):
    """The converted checkpoint's hyperparameters: the sizes and R (which their checkpoint does not
    store) in the network group, none of the module's evaluation knobs."""
    hparams = torch.load(adaptive_ckpt, weights_only=True)["hyper_parameters"]
    assert hparams["network"] == dict(
        d_model=32, n_layers=2, n_heads=4, d_inner=64, attn_span=256, span_kind="adaptive", span_ramp=8
    )
    assert set(hparams) == {"_class_path", "vocab_size", "network"}
    model = AdaptiveSpanLM.load_from_checkpoint(adaptive_ckpt, eval_span_cap=64)
    sizes = dict(
        d_model=32, n_layers=2, n_heads=4, d_inner=64, attn_span=256, span_ramp=8, span_kind="adaptive"
    )
    assert {key: getattr(model.net.config, key) for key in sizes} == sizes
    assert model.eval_span_cap == 64


@pytest.mark.slow
def test_adaptive_span_checkpoint_runs_through_lightning_test(adaptive_ckpt):
    """`trainer.test(ckpt_path=DEST)` (what `python -m longctx test --ckpt_path` calls) restores it."""
    network = dict(d_model=32, n_layers=2, n_heads=4, d_inner=64, attn_span=256, span_ramp=8)
    model = AdaptiveSpanLM(vocab_size=256, network=network)
    trainer = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    loader = Batches(adaptive_blocks())
    metrics = trainer.test(model, dataloaders=loader, ckpt_path=str(adaptive_ckpt), verbose=False)[0]
    expected = np.load(ADAPTIVE / "expected_nll.npy")
    assert metrics["test/loss"] == pytest.approx(float(expected.mean()), rel=RTOL)


def test_every_size_difference_is_reported_at_once_with_the_flags(tmp_path):
    """Not one mismatch per attempt (six tries for this checkpoint): all of them, and the flags."""
    sizes = "d_model: 64, n_layers: 3, n_heads: 4, d_inner: 128, attn_span: 512"
    config = write_config(tmp_path, ADAPTIVE_CONFIG.replace(ADAPTIVE_SIZES, sizes))
    source = ADAPTIVE / "checkpoint.pt"
    with pytest.raises(ConvertError) as info:
        convert("adaptive-span", config, source, tmp_path / "x.ckpt", vocab=ADAPTIVE / "data")
    assert str(info.value) == (
        f"{config} does not describe {source}: model.init_args d_model 64 (checkpoint: 32), n_layers 3 "
        "(checkpoint: 2), d_inner 128 (checkpoint: 64), attn_span 512 (checkpoint: 256); "
        "add --model.init_args.network.d_model 32 --model.init_args.network.n_layers 2 "
        "--model.init_args.network.d_inner 64 --model.init_args.network.attn_span 256 to this command "
        "(convert prints them in its evaluate: line)"
    )
    assert not (tmp_path / "x.ckpt").exists()
    # Those flags fix it.
    flags = ["--model.init_args.network.d_model", "32", "--model.init_args.network.n_layers", "2"]
    flags += ["--model.init_args.network.d_inner", "64", "--model.init_args.network.attn_span", "256"]
    convert("adaptive-span", config, source, tmp_path / "x.ckpt", vocab=ADAPTIVE / "data", overrides=flags)
    assert (tmp_path / "x.ckpt").is_file()


def test_adaptive_span_offline_without_vocab_names_vocab(tmp_path):
    """Their vocabulary is rebuilt from the corpus; with no corpus here, one line naming --vocab."""
    data = f"  root: {tmp_path / 'empty'}\n  download: false\n"
    config = write_config(tmp_path, ADAPTIVE_CONFIG + data)
    with pytest.raises(ConvertError) as info:
        convert("adaptive-span", config, ADAPTIVE / "checkpoint.pt", tmp_path / "x.ckpt")
    message = str(info.value)
    assert message.startswith(
        "the vocabulary of an adaptive-span checkpoint is not stored in it: it is rebuilt from the corpus "
        "it was trained on, and the config's enwik8 is not available here ("
    )
    assert "does not exist" in message  # the data module's own reason, inside the brackets
    assert message.endswith(
        "give --vocab DIR, the authors' prepared data folder (train.txt, valid.txt, test.txt)"
    )


def test_adaptive_span_wrong_vocabulary_source(tmp_path):
    config = write_config(tmp_path, ADAPTIVE_CONFIG)
    with pytest.raises(ConvertError, match=r"train\.txt is missing"):
        convert("adaptive-span", config, ADAPTIVE / "checkpoint.pt", tmp_path / "x.ckpt", vocab=tmp_path)


# ---------------------------------------------------------------------------------- Transformer-XL
XL_CONFIG = """\
model:
  class_path: longctx.methods.transformer_xl.module.TransformerXLLM
  init_args:
    network: {{n_layers: 2, d_model: 32, n_heads: 4, d_head: 8, d_inner: 64, d_embed: 32, cutoffs: [100, 400],
              div_val: {div_val}, tie_projs: [false, true, true], untie_r: {untie_r}}}
    mem_len: 16
    evaluation: {{mem_len: 16}}
data:
  corpus: wikitext2
"""
XL_FORMATS = {  # format -> fixture folder, source of each model, untie_r per model, vocabulary source
    "transfo-xl-hf": ("transfo_xl_hf", "{div}", {"div1": "false", "div2": "true"}, None),
    "transfo-xl": ("transfo_xl", "{div}/model.pt", {"div1": "false", "div2": "false"}, "wt2_piece/cache.pt"),
}
XL_CASES = [(fmt, div) for fmt in XL_FORMATS for div in ("div1", "div2")]
SEGMENT = 16


def convert_xl(tmp: Path, fmt: str, div: str) -> Path:
    folder, source, untie, vocab = XL_FORMATS[fmt]
    config = write_config(tmp, XL_CONFIG.format(div_val=div[-1], untie_r=untie[div]), f"{fmt}-{div}.yaml")
    dest = tmp / f"{fmt}-{div}.ckpt"
    vocab_path = FIXTURES / vocab if vocab else None
    convert(fmt, config, FIXTURES / folder / source.format(div=div), dest, vocab=vocab_path)
    return dest


@pytest.fixture(scope="module")
def xl_ckpts(tmp_path_factory) -> dict[tuple[str, str], Path]:
    tmp = tmp_path_factory.mktemp("xl")
    return {case: convert_xl(tmp, *case) for case in XL_CASES}


def xl_nll(
    ckpt: Path, stream: torch.Tensor, protocol: str, same_length: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Per-token NLL (48,) and scored mask over 3 segments of 16 (bsz 1), memory 16, as the fixture."""
    evaluation = {"mem_len": SEGMENT, "same_length": same_length}
    model = TransformerXLLM.load_from_checkpoint(ckpt, evaluation=evaluation, protocol=protocol).eval()
    memory, nll, mask = model.init_memory(1), [], []
    with torch.no_grad():
        for i in range(3):
            batch = {
                "input": stream[:, i * SEGMENT : (i + 1) * SEGMENT],
                "target": stream[:, i * SEGMENT + 1 : (i + 1) * SEGMENT + 1],
                "mask": torch.ones(1, SEGMENT, dtype=torch.bool),
                "reset": torch.tensor([i == 0]),
            }
            out = model.step(batch, memory)
            memory = out.memory
            nll.append(out.nll)
            mask.append(batch["mask"] if out.mask is None else out.mask)
    return torch.cat(nll, dim=1)[0].numpy(), torch.cat(mask, dim=1)[0].numpy()


@pytest.mark.parametrize("fmt, div", XL_CASES)
@pytest.mark.parametrize("memory", ["empty", "zero"])
@pytest.mark.parametrize("same_length", [0, 1])
def test_transformer_xl_matches_their_per_token_nll(xl_ckpts, fmt, div, memory, same_length):
    """All four variants of their evaluation: longctx's protocol xl starts from an empty memory (as
    kimiyoung), protocol trams from mem_len zero states (as HF's init_mems and TRAMS)."""
    folder = FIXTURES / XL_FORMATS[fmt][0]
    stream = torch.from_numpy(np.load(folder / "stream_ids.npy")).long()[None]  # (1, 49)
    expected = np.load(folder / f"expected_nll_{div}.npz")[f"mem-{memory}_samelen-{same_length}"]  # (48,)
    protocol = "xl" if memory == "empty" else "trams"
    nll, scored = xl_nll(xl_ckpts[(fmt, div)], stream, protocol, bool(same_length))
    np.testing.assert_allclose(nll, expected, rtol=RTOL, atol=0)
    # The TRAMS protocol also leaves out the last target of every segment (their loss never scores a
    # segment's first token): the scored tokens are the others, with the same values.
    expected_scored = np.ones(48, dtype=bool)
    if protocol == "trams":
        expected_scored[SEGMENT - 1 :: SEGMENT] = False
    np.testing.assert_array_equal(scored, expected_scored)


def test_transformer_xl_vocabulary_tokenizes_wikitext_to_their_ids(xl_ckpts, tmp_path):
    """The written vocabulary makes longctx's word tokenizer give the checkpoint's ids."""
    for fmt in XL_FORMATS:
        vocab = WordVocab.load(vocab_path_for(xl_ckpts[(fmt, "div1")]))
        ids = vocab.encode_file(FIXTURES / "wt2_piece" / "test.txt")
        np.testing.assert_array_equal(ids[:49], np.load(FIXTURES / "transfo_xl_hf" / "stream_ids.npy"))
    # A vocabulary without <unk> that does not cover the text is refused.
    partial = tmp_path / "partial.txt"
    partial.write_text("<eos>\n=\n")
    with pytest.raises(
        ValueError, match=r"word 'Robert' is not in the vocabulary and the vocabulary has no <unk>"
    ):
        WordVocab.load(partial).encode_file(FIXTURES / "wt2_piece" / "test.txt")


def test_transformer_xl_sizes_are_read_before_the_model_is_built(tmp_path):
    """Sizes the model could not even be built with (cutoffs beyond the vocabulary) and untie_r: all
    reported from the checkpoint's config.json, with the flags, before anything is built or written."""
    text = XL_CONFIG.format(div_val=2, untie_r="false").replace("n_layers: 2", "n_layers: 4")
    config = write_config(tmp_path, text.replace("cutoffs: [100, 400]", "cutoffs: [2000, 8000]"))
    source = FIXTURES / "transfo_xl_hf" / "div2"
    with pytest.raises(ConvertError) as info:
        convert("transfo-xl-hf", config, source, tmp_path / "x.ckpt")
    assert str(info.value) == (
        f"{config} does not describe {source}: model.init_args n_layers 4 (checkpoint: 2), cutoffs "
        "[2000, 8000] (checkpoint: [100, 400]), untie_r False (checkpoint: True); add "
        "--model.init_args.network.n_layers 2 --model.init_args.network.cutoffs '[100,400]' "
        "--model.init_args.network.untie_r true "
        "to this command (convert prints them in its evaluate: line)"
    )
    assert not (tmp_path / "x.ckpt").exists() and not vocab_path_for(tmp_path / "x.ckpt").exists()


def test_transformer_xl_hf_cluster_rows_are_reversed(xl_ckpts):
    theirs = torch.load(FIXTURES / "transfo_xl_hf" / "div1" / "pytorch_model.bin", weights_only=True)
    ours = torch.load(xl_ckpts[("transfo-xl-hf", "div1")], weights_only=True)["state_dict"]
    torch.testing.assert_close(ours["net.crit.cluster_weight"], theirs["crit.cluster_weight"].flip(0))
    torch.testing.assert_close(ours["net.crit.cluster_bias"], theirs["crit.cluster_bias"].flip(0))


def test_data_vocab_file_gives_the_vocabulary_and_its_own_cache(tmp_path):
    from longctx.data.datamodule import LMDataModule

    vocab = tmp_path / "v.vocab.txt"
    vocab.write_text("<eos>\n<unk>\nthe\n")
    data = LMDataModule(corpus="wikitext2", cache_dir=str(tmp_path), vocab_file=str(vocab))
    assert data.vocab_size == 3
    assert data.spec.path != LMDataModule(corpus="wikitext2", cache_dir=str(tmp_path)).spec.path
    with pytest.raises(ValueError, match=r"data\.vocab_file is a word vocabulary, but corpus enwik8 is not"):
        LMDataModule(corpus="enwik8", vocab_file=str(vocab))


def test_hf_vocab_saved_with_legacy_torch_save_is_read(tmp_path):
    """Older hub files (transfo-xl-wt103's vocab.pkl) are a legacy torch.save of the dict."""
    path = tmp_path / "vocab.pkl"
    torch.save(
        {"idx2sym": ["<eos>", "a", "<unk>"], "lower_case": False}, path, _use_new_zipfile_serialization=False
    )
    assert read_hf_vocab(path, 3) == ["<eos>", "a", "<unk>"]
    with pytest.raises(ConvertError, match="the vocabulary has 3 symbols, the checkpoint 4 rows"):
        read_hf_vocab(path, 4)


def test_kimiyoung_pickle_is_read_without_their_classes(tmp_path):
    """Their model.pt names only the allowed classes; anything else is refused by name."""
    with pytest.raises(UnsafePickleError, match=r"names 'mem_transformer\.MemTransformerLM'"):
        load_torch_pickle(FIXTURES / "transfo_xl" / "div1" / "model.pt", allowed=set())


# ---------------------------------------------------------------------------------- errors
def test_config_of_another_model_is_refused(tmp_path):
    config = write_config(tmp_path, ADAPTIVE_CONFIG)
    message = "this format converts into TransformerXLLM, but .* configures .*AdaptiveSpanLM"
    with pytest.raises(ConvertError, match=message):
        convert("transfo-xl-hf", config, FIXTURES / "transfo_xl_hf" / "div1", tmp_path / "x.ckpt")
    assert not vocab_path_for(tmp_path / "x.ckpt").exists()


def test_unknown_format(tmp_path):
    with pytest.raises(
        ConvertError, match="unknown format 'fairseq'; formats: adaptive-span, transfo-xl-hf, transfo-xl"
    ):
        convert("fairseq", tmp_path / "c.yaml", tmp_path / "s", tmp_path / "d")


def test_command_exits_with_the_message(tmp_path, capsys):
    with pytest.raises(SystemExit, match="error: unknown format 'fairseq'"):
        main(
            [
                "--from",
                "fairseq",
                "--config",
                str(tmp_path / "c.yaml"),
                str(tmp_path / "s"),
                str(tmp_path / "d"),
            ]
        )


def test_unsafe_pickle_is_refused(tmp_path):
    class Payload:
        def __reduce__(self):
            return (print, ("this must never run",))

    path = tmp_path / "vocab.pkl"
    path.write_bytes(__import__("pickle").dumps({"idx2sym": [Payload()]}))
    with pytest.raises(UnsafePickleError, match=r"names 'builtins\.print', which is not on the list"):
        load_pickle(path, allowed={"transformers.tokenization_utils.Trie"})


@pytest.mark.slow
def test_python_entry_point_dispatches_convert(tmp_path):
    import subprocess

    result = subprocess.run(
        [sys.executable, "-m", "longctx", "convert", "--from", "nope", "--config", "c", "s", "d"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode != 0 and "unknown format 'nope'" in result.stderr


@pytest.mark.slow
def test_converted_checkpoint_evaluates_through_the_cli(tmp_path, monkeypatch):
    """`python -m longctx test --config C --ckpt_path DEST --data.vocab_file V` on real WikiText-2 text
    gives the same loss as the converted weights evaluated directly."""
    from longctx.commands.cli import main as cli_main
    from longctx.data.datamodule import LMDataModule

    data_root = FIXTURES.parents[1] / "data"
    if not (data_root / "wikitext-2").is_dir():
        pytest.skip("../shared/data/wikitext-2 is absent")
    monkeypatch.chdir(tmp_path)
    dest = convert_xl(tmp_path, "transfo-xl-hf", "div2")
    data = {
        "corpus": "wikitext2",
        "root": str(data_root),
        "cache_dir": str(tmp_path / "cache"),
        "download": False,
        "split_sources": {"train": "valid", "valid": "valid", "test": "test"},
        "eval_batch_size": 2,
        "eval_tgt_len": SEGMENT,
        "vocab_file": str(vocab_path_for(dest)),
    }
    flags = [f"--data.{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in data.items()]
    args = ["test", "--config", str(tmp_path / "transfo-xl-hf-div2.yaml"), "--ckpt_path", str(dest), *flags]
    args += ["--trainer.limit_test_batches", "3", "--trainer.logger", "false", "--run_name", "cli"]
    cli = cli_main(args)
    model = TransformerXLLM.load_from_checkpoint(dest, evaluation={"mem_len": SEGMENT})
    trainer = Trainer(accelerator="cpu", logger=False, limit_test_batches=3, enable_progress_bar=False)
    direct = trainer.test(model, datamodule=LMDataModule(**data), verbose=False)[0]["test/loss"]
    assert float(cli.trainer.callback_metrics["test/loss"]) == pytest.approx(direct, rel=RTOL)


# ---------------------------------------------------------------------------------- command line
def test_overrides_are_never_taken_for_source_or_dest():
    """`--model.init_args.network.cutoffs [100,400]` (a separate value, as a shell gives it): an override."""
    argv = ["--from", "transfo-xl-hf", "--model.init_args.network.cutoffs", "[100,400]", "--config", "c.yaml"]
    argv += ["SRC", "--data.root=../data", "DEST", "--model.init_args.network.untie_r", "true"]
    own, overrides = split_overrides(argv)
    assert own == ["--from", "transfo-xl-hf", "--config", "c.yaml", "SRC", "DEST"]
    assert overrides == [
        "--model.init_args.network.cutoffs", "[100,400]", "--data.root=../data",
        "--model.init_args.network.untie_r", "true",
    ]  # fmt: skip


XL_FLAGS = ["--model.init_args.network.cutoffs", "[100,400]", "--model.init_args.network.untie_r", "true"]


def converted_by_the_command(tmp_path: Path, capsys, *data_flags: str) -> str:
    """`python -m longctx convert` of the div2 HF fixture from a config with other cutoffs and
    untie_r, fixed by flags; returns its `evaluate:` line."""
    text = XL_CONFIG.format(div_val=2, untie_r="false").replace(
        "cutoffs: [100, 400]", "cutoffs: [2000, 8000]"
    )
    config = write_config(tmp_path, text)
    source = FIXTURES / "transfo_xl_hf" / "div2"
    main(
        [
            "--from",
            "transfo-xl-hf",
            "--config",
            str(config),
            str(source),
            str(tmp_path / "x.ckpt"),
            *XL_FLAGS,
            *data_flags,
        ]
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"wrote {tmp_path / 'x.ckpt'}"
    return next(line for line in lines if line.startswith("evaluate: "))


def test_evaluate_line_carries_the_overrides(tmp_path, capsys):
    line = converted_by_the_command(tmp_path, capsys)
    assert line == (
        f"evaluate: python -m longctx test --config {tmp_path / 'config.yaml'} "
        "--model.init_args.network.cutoffs '[100,400]' --model.init_args.network.untie_r true "
        f"--ckpt_path {tmp_path / 'x.ckpt'} --data.vocab_file {tmp_path / 'x.vocab.txt'}"
    )


@pytest.mark.slow  # a conversion and a Lightning test run (~15 s)
@skip_without_shared("data", "wikitext-2")
def test_evaluate_line_runs_without_a_train_split_and_reports_the_oov_rate(tmp_path, capsys, monkeypatch):
    """The printed command runs as printed (plus a batch limit): ../shared/data/wikitext-2 has no
    train file, which an imported vocabulary does not need; the words the fixture's 1,431-word
    vocabulary lacks are counted per split and written to summary.json."""
    import shlex

    from longctx.commands.cli import main as cli_main

    monkeypatch.chdir(tmp_path)
    data = ["--data.root", str(shared_dir() / "data"), "--data.download", "false"]
    data += ["--data.cache_dir", str(tmp_path / "cache"), "--data.eval_batch_size", "2"]
    line = converted_by_the_command(tmp_path, capsys, *data)
    args = shlex.split(line.removeprefix("evaluate: python -m longctx "))
    cli_main([*args, "--trainer.limit_test_batches", "2", "--trainer.logger", "false", "--run_name", "ev"])
    summary = json.loads((tmp_path / "runs" / "ev" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["metrics"]["test/loss"] > 0
    oov = summary["out_of_vocabulary"]
    assert set(oov) == {"valid", "test"}  # no train split: none was needed
    test = oov["test"]
    vocab = WordVocab.load(tmp_path / "x.vocab.txt")
    ids, unknown = vocab.encode_file_counting_unknown(
        shared_dir() / "data" / "wikitext-2" / "wiki.test.tokens.gz"
    )
    assert test == {"tokens": len(ids), "oov_tokens": unknown, "oov_fraction": unknown / len(ids)}
    assert 0.2 < test["oov_fraction"] < 0.5  # a third of WikiText-2's test words are not in the piece


def test_oov_count_leaves_out_a_written_unk(tmp_path):
    """Words the vocabulary lacks are counted; `<unk>` written in the text is a word it has."""
    vocab = WordVocab(["<eos>", "<unk>", "the"])
    text = tmp_path / "t.txt"
    text.write_text("the cat <unk>\nthe dog\n")
    ids, unknown = vocab.encode_file_counting_unknown(text)
    assert ids.tolist() == [2, 1, 1, 0, 2, 1, 0] and unknown == 2


def test_a_split_left_out_of_the_cache_fails_when_read(tmp_path):
    from longctx.data.cache import TokenizedCorpus
    from longctx.data.corpora import get_corpus
    from longctx.data.download import DataError

    corpus = TokenizedCorpus(get_corpus("wikitext2"), 3, {}, tmp_path, np.ones(3), {"train": "no train file"})
    with pytest.raises(
        DataError, match=r"^no train file; the token cache .* was built without the train split"
    ):
        corpus.split("train")


def test_missing_format_is_one_line_without_usage(tmp_path):
    with pytest.raises(SystemExit) as info:
        main(["--config", "c.yaml", "SRC", "DEST"])
    assert info.value.code == (
        "error: the following arguments are required: --from (`python -m longctx convert --help` shows "
        "the usage)"
    )
