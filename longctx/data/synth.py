"""Synthetic long-range tasks: text in which some bytes can be predicted only from context >= G back.

    python -m longctx.data synth copy --out data/copy --gap 160

writes `train.txt`, `valid.txt`, `test.txt` (read them with `data.corpus: text_files`), a sidecar
`<split>.marks.npz` per split and `synth.json` (the settings and counts). docs/long_range.md has the
formats, a worked example and the reasons for the defaults. `synth mqar` (token-level associative
recall, read with `tokenizer: words`) is `longctx.data.mqar`.

Two tasks, one episode per line, words from `WORDS` (lower-case English nouns, so byte-level and BPE
tokenizers both read ordinary words; GPT-2 BPE gives most of them one or two tokens):

- copy: `remember: maple violin harbor. again: maple violin harbor. <filler words>. recall: maple
  violin harbor.` A random passage, repeated at once (a copy within one short segment, so a tiny
  model learns to copy quickly), then filler words until the passage's last copy is >= G bytes
  back, then the passage again.
- recall: `the fox is lemon. the owl is cedar. so the owl is cedar. so the fox is lemon. <distractor
  bindings: the KEY is VALUE.> so the fox is lemon. so the owl is cedar.` Key -> value bindings,
  queried at once (`so the ...`), then bindings of other keys until every key's last mention is >= G
  bytes back, then every key queried again, in a random order.

Which bytes are marked. An *answer* byte is a byte of a repeated passage (after `again: ` or
`recall: `) or of a queried value (after `so the KEY is `). Its *source* is the same byte of the most
recent earlier mention of the same passage (`: PASSAGE.`) or of the same key (`the KEY is VALUE`),
and its *distance* is the number of bytes between the two. The answer's content was drawn at random
where it was first written, and nothing between source and answer mentions it again (filler has no
`:`, distractors bind other keys), so an answer byte is determined by its source and predictable
from no nearer text (word spelling aside, which any model knows equally with or without memory). A
byte is *marked* (long-range) iff it is an answer byte at distance >= G. Cues, keys, punctuation,
filler and first mentions are never marked: they are either unpredictable or predictable from
nearby text. The tests recompute the marks from the text alone by searching backwards.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from longctx.data.cache import SPLITS
from longctx.runtime.atomic import atomic_path, write_json_atomic, write_text_atomic

Task = Literal["copy", "recall"]
TASKS: tuple[Task, ...] = ("copy", "recall")
MARKS_SUFFIX = ".marks.npz"

# 278 concrete English nouns of 3-8 lower-case letters; none is a cue word (remember, again, recall,
# so, the, is). Changing the list changes every generated file: `synth.json` records its sha1.
_WORD_TEXT = """
acid acorn actor adult agent alarm album alley amber angle ankle apple apron arena arrow aspen atlas attic
badge bagel baker bamboo banjo barn basin beach beard beast bell bench berry bison blade blank blaze bloom
board boat bonus boot bottle brain brass bread brick bride brook broom brush bucket buffalo bugle cabin
cactus camel candle canoe canyon cargo carpet carrot castle cedar cellar chain chair chalk cherry chest chin
cider cigar circle clay cliff clock cloud clover coach coast cobra cocoa comet coral cotton couch cousin cow
crane crater crayon creek crow crown cube curtain daisy dancer delta desert diary dinner doctor dolphin donkey
door dragon drum eagle earth easel elbow ember engine falcon farmer feather fence ferry fiddle field finch
flag flame flute forest fossil fountain fox frog garden garlic gate geese ghost giant ginger glove goat
grape gravel guitar hammer harbor harp hawk helmet hill honey horse hotel igloo island ivory jacket jaguar
jelly jewel kettle kitten koala ladder lake lamp lantern lemon lily lion lizard llama lobster locket lotus
magnet mango maple marble meadow melon mirror mitten monkey moose mule museum nectar needle nickel noodle
oak oasis ocean olive onion orange otter owl oyster paddle palace panda parrot peach pearl pebble pencil
pepper piano pickle pigeon pillow pilot pine planet plum pony poppy potato pumpkin puppet quilt rabbit
radio raven reef ribbon river robin rocket rose saddle sailor salmon sand scarf shell sheep shovel silver
skate sled snail spider spoon squid stable star stone stove sugar summer swan table tiger timber toast
tomato tower tractor train trumpet tulip turtle umbrella valley velvet violin wagon walnut whale wheat
willow window winter wizard wolf yacht zebra
"""
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())
# The first word of each initial letter, in order (25: no word starts with x): the vocabulary of
# `--passage_vocab N` takes the first N, so a passage word's first letter alone decides which it is.
INITIAL_WORDS: tuple[str, ...] = tuple(sorted({word[0]: word for word in reversed(WORDS)}.values()))


@dataclass(frozen=True)
class SynthSettings:
    """What `generate` writes. gap: G, the least distance (bytes) between a marked answer byte and
    its source. train_bytes / eval_bytes: size of the train split / of valid and test each (whole
    episodes: the split ends with the first episode that reaches the size). passage_words: words of
    a copy passage. pairs: keys bound and queried per recall episode. near_repeat: repeat each
    passage / query each key at once too, within one short segment: the short-range copy a tiny
    model learns first and then applies at distance G (without it, it may never learn to copy).
    """

    task: Task
    gap: int = 160
    seed: int = 0
    train_bytes: int = 1_000_000
    eval_bytes: int = 100_000
    passage_words: int = 3
    pairs: int = 2
    near_repeat: bool = True
    passage_vocab: int | None = None
    recalls: int = 1

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; choose one of {list(TASKS)}")
        for name in ("gap", "train_bytes", "eval_bytes", "passage_words", "pairs", "recalls"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be a positive integer, got {getattr(self, name)}")
        if self.pairs > len(WORDS) // 2:
            raise ValueError(f"--pairs must be at most {len(WORDS) // 2} (half the word list)")
        if self.passage_vocab is not None and not 1 <= self.passage_vocab <= len(INITIAL_WORDS):
            raise ValueError(
                f"--passage_vocab must be in [1, {len(INITIAL_WORDS)}] (one word per initial letter), "
                f"got {self.passage_vocab}"
            )
        if self.task != "copy" and (self.passage_vocab is not None or self.recalls != 1):
            raise ValueError("--passage_vocab and --recalls are for the copy task")

    def split_bytes(self, split: str) -> int:
        return self.train_bytes if split == "train" else self.eval_bytes


class SplitText:
    """The text of one split as it is built, with every answer byte's offset and distance."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.size = 0
        self.offsets: list[int] = []
        self.distances: list[int] = []

    def add(self, text: str) -> int:
        """Append `text` (ASCII: one byte per character); return where it starts."""
        start = self.size
        self.parts.append(text)
        self.size += len(text)
        return start

    def answer(self, text: str, source: int) -> int:
        """Append `text`, a copy of the text at `source`: each of its bytes is an answer byte."""
        start = self.add(text)
        self.offsets.extend(range(start, start + len(text)))
        self.distances.extend([start - source] * len(text))
        return start

    def text(self) -> str:
        return "".join(self.parts)


def random_words(rng: np.random.Generator, n: int, vocabulary: Sequence[str] = WORDS) -> list[str]:
    return [vocabulary[i] for i in rng.integers(len(vocabulary), size=n)]


def copy_episode(out: SplitText, rng: np.random.Generator, settings: SynthSettings) -> None:
    """remember: P. [again: P.] <filler>. recall: P. [<filler>. recall: P. ...]  (`recalls` times;
    each recalled P starts >= G after the previous copy)"""
    vocabulary = WORDS if settings.passage_vocab is None else INITIAL_WORDS[: settings.passage_vocab]
    passage = " ".join(random_words(rng, settings.passage_words, vocabulary))
    out.add("remember: ")
    source = out.add(passage)
    if settings.near_repeat:
        out.add(". again: ")
        source = out.answer(passage, source)
    cue = ". recall: "
    for _ in range(settings.recalls):
        out.add(".")
        out.add(" " + random_words(rng, 1)[0])  # at least one filler word
        while out.size + len(cue) - source < settings.gap:
            out.add(" " + random_words(rng, 1)[0])
        out.add(cue)
        source = out.answer(passage, source)
    out.add(".\n")


def recall_episode(out: SplitText, rng: np.random.Generator, settings: SynthSettings) -> None:
    """the K is V. ... [so the K is V. ...] <the D is W. ...> so the K is V. ...  (each last query's
    value starts >= G after that key's previous mention)"""
    order = rng.permutation(len(WORDS))
    keys = [WORDS[i] for i in order[: settings.pairs]]
    others = [WORDS[i] for i in order[settings.pairs :]]
    values = dict(zip(keys, random_words(rng, len(keys)), strict=True))
    last: dict[str, int] = {}  # where each key's value was last written
    for key in keys:
        out.add(f"the {key} is ")
        last[key] = out.add(values[key])
        out.add(". ")

    def query_all(end: str) -> None:
        order = rng.permutation(len(keys))
        for n, i in enumerate(order):
            key = keys[i]
            out.add(f"so the {key} is ")
            last[key] = out.answer(values[key], last[key])
            out.add(end if n == len(order) - 1 else ". ")

    if settings.near_repeat:
        query_all(". ")
    shortest_query = len("so the ") + min(len(key) for key in keys) + len(" is ")
    n_distractors = 0
    while out.size + shortest_query - max(last.values()) < settings.gap:
        key = others[n_distractors % len(others)]
        out.add(f"the {key} is {random_words(rng, 1)[0]}. ")
        n_distractors += 1
    query_all(".\n")


EPISODES = {"copy": copy_episode, "recall": recall_episode}


def generate_split(settings: SynthSettings, split: str) -> SplitText:
    """Whole episodes until the split holds `settings.split_bytes(split)` bytes; seeded by
    (seed, split), so every split differs and each is reproducible alone."""
    rng = np.random.default_rng([settings.seed, SPLITS.index(split)])
    out = SplitText()
    episode = EPISODES[settings.task]
    while out.size < settings.split_bytes(split):
        episode(out, rng, settings)
    return out


def generate(settings: SynthSettings, out_dir: Path) -> dict[str, dict[str, int]]:
    """Write the three splits, their marks and `synth.json` into `out_dir`; return counts per split."""
    counts = {}
    for split in SPLITS:
        built = generate_split(settings, split)
        offsets = np.asarray(built.offsets, dtype=np.int64)
        distances = np.asarray(built.distances, dtype=np.int64)
        far = distances >= settings.gap
        text = built.text()
        write_text_atomic(out_dir / f"{split}.txt", text)
        with atomic_path(out_dir / f"{split}{MARKS_SUFFIX}") as tmp, open(tmp, "wb") as f:
            np.savez_compressed(
                f,
                offset=offsets[far],
                distance=distances[far],
                near_offset=offsets[~far],
                near_distance=distances[~far],
                gap=np.int64(settings.gap),
                tokenizer=np.array("bytes"),
                text_blake2b=np.array(hashlib.blake2b(text.encode(), digest_size=16).hexdigest()),
            )
        counts[split] = {"bytes": built.size, "marked": int(far.sum()), "near": int((~far).sum())}
    write_json_atomic(
        out_dir / "synth.json",
        {
            "settings": asdict(settings),
            "splits": counts,
            "words_sha1": hashlib.sha1(" ".join(WORDS).encode()).hexdigest(),
        },
    )
    return counts


def marks_path(text_file: Path | str) -> Path:
    """The marks sidecar of a text file: `<folder>/<stem>.marks.npz` (`valid.txt` -> `valid.marks.npz`)."""
    text_file = Path(text_file)
    return text_file.parent / f"{text_file.stem}{MARKS_SUFFIX}"


def load_marks(out_dir: Path | str, split: str) -> dict[str, np.ndarray]:
    """The marks of one split (`<split>.marks.npz`). copy/recall: `offset` and `distance` of the
    long-range bytes, `near_offset` and `near_distance` of the answer bytes nearer than G, `gap`;
    mqar: `offset`, `distance`, `query`, `pairs`, `episode` of every answer (`longctx.data.mqar`).
    Both: `tokenizer` (the unit of the offsets: "bytes" or "words"; absent in sidecars written
    before it was recorded, which are bytes) and `text_blake2b` (the digest of the marked file)."""
    with np.load(Path(out_dir) / f"{split}{MARKS_SUFFIX}") as marks:
        return {key: marks[key] for key in marks.files}


def marked_tokens(byte_offsets: np.ndarray, token_lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """Indices of the tokens that hold at least one of `byte_offsets`, given each token's length in
    bytes in order (e.g. `token_bytes[tokens]` of a token cache). With bytes it is the identity."""
    ends = np.cumsum(np.asarray(token_lengths, dtype=np.int64))
    if len(byte_offsets) and byte_offsets.max() >= (ends[-1] if len(ends) else 0):
        raise ValueError("a marked byte lies beyond the tokens' text: the marks belong to another file")
    return np.unique(np.searchsorted(ends, byte_offsets, side="right"))
