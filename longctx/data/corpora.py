"""What each corpus is and where it comes from: the registry `CORPORA`.

A `Corpus` record says how a corpus is tokenized (`unit`), where its raw files come from (canonical
URLs with pinned checksums, from `../shared/data/README.md`) and which file holds each split once
extracted under `<root>/<dirname>/`. The heavy lifting (download, tokenize,
cache) lives in `download.py`, `tokenize.py`, `cache.py` and `pg19.py`.

Checksums: archives are pinned by sha256 (verified after download); extracted members by the sha1
that gluon-nlp pins for WikiText and by the sizes/hashes of the enwik8/text8 archives' single member,
so a user who points `root` at files they already have gets the same verification.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Unit = Literal["byte", "char", "word", "bpe"]

WIKITEXT_BASE = "https://s3.amazonaws.com/research.metamind.io/wikitext"
MAHONEY_BASE = "http://mattmahoney.net/dc"
PG19_BUCKET = "https://storage.googleapis.com/deepmind-gutenberg"
PG19_LISTING = "https://storage.googleapis.com/storage/v1/b/deepmind-gutenberg/o"
GPT2_BASE = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main"


@dataclass(frozen=True)
class Checksum:
    """A pinned digest: `algorithm` is any `hashlib` name (sha256, sha1, md5)."""

    algorithm: str
    hexdigest: str


@dataclass(frozen=True)
class Member:
    """A file the corpus reads, extracted under `<root>/<dirname>/<name>` (or `<name>.gz`)."""

    name: str
    archive_path: str  # path inside the archive
    checksum: Checksum | None = None


@dataclass(frozen=True)
class Archive:
    """A downloadable archive (zip) with its pinned checksum and size."""

    url: str
    filename: str
    size: int
    checksum: Checksum | None  # None: only the size and the members' digests are checked
    members: tuple[Member, ...]


@dataclass(frozen=True)
class Corpus:
    """One named corpus.

    name: registry key. unit: byte (enwik8, sample), char (text8), word (WikiText, Transformer-XL
    convention), bpe (GPT-2 BPE by default; raw text, so `data.tokenizer: bytes` can read it at byte
    level). The metric follows the unit (`LMDataModule.metric`: bpc for bytes/chars, else ppl).
    vocab_size: fixed size (None: built from the
    data). documents: a collection of books (PG-19), streamed document by document with resets.
    dirname: the folder under `root` holding the extracted files; aliases: other folder names
    accepted (e.g. the `wikitext-raw` folder of `../shared/data`). splits: the member holding each
    split for single-file-per-split corpora; contiguous_split: for enwik8/text8, the one member cut
    90M/5M/5M. vocab_splits: splits whose words build the vocabulary (Transformer-XL counts train,
    valid and test for WikiText-2, train only for WikiText-103). count_words: keep word counts per
    split (perplexity per word of a BPE model). user_files: the files are the user's own (`data.files`,
    one UTF-8 text file per split), not a published archive.
    """

    name: str
    unit: Unit
    vocab_size: int | None
    dirname: str
    archive: Archive | None = None
    splits: dict[str, str] = field(default_factory=dict)
    contiguous_split: str | None = None
    aliases: tuple[str, ...] = ()
    documents: bool = False
    vocab_splits: tuple[str, ...] = ("train",)
    count_words: bool = False
    user_files: bool = False
    description: str = ""

    @property
    def dirnames(self) -> tuple[str, ...]:
        return (self.dirname, *self.aliases)

    @property
    def members(self) -> tuple[Member, ...]:
        return self.archive.members if self.archive else ()

    def member(self, name: str) -> Member | None:
        return next((m for m in self.members if m.name == name), None)


def _wikitext(
    name: str, zip_name: str, size: int, sha256: str, folder: str, ext: str, sha1s: dict[str, str | None]
) -> Archive:
    members = tuple(
        Member(
            f"wiki.{split}.{ext}",
            f"{folder}/wiki.{split}.{ext}",
            Checksum("sha1", sha1s[split]) if sha1s[split] else None,
        )
        for split in ("train", "valid", "test")
    )
    return Archive(f"{WIKITEXT_BASE}/{zip_name}", zip_name, size, Checksum("sha256", sha256), members)


_WT_SPLITS_TOKENS = {s: f"wiki.{s}.tokens" for s in ("train", "valid", "test")}
_WT_SPLITS_RAW = {s: f"wiki.{s}.raw" for s in ("train", "valid", "test")}

# Enwik8/text8: one 100M member; the last 5M units are test, the 5M before them validation.
CONTIGUOUS_SPLIT = {"valid": 5_000_000, "test": 5_000_000}

# WikiText-103 v1 (tokenized release), read at word level (`wikitext103`) or as text (`wikitext103_text`).
WIKITEXT103_ARCHIVE = _wikitext(
    "wikitext103",
    "wikitext-103-v1.zip",
    190_229_076,
    "242ba0f20b329cfdf1ccc61e9e9e5b59becf189db7f7a81cd2a0e2fc31539590",
    "wikitext-103",
    "tokens",
    {
        "train": "b7497e2dfe77e72cfef5e3dbc61b7b53712ac211",
        "valid": "c326ac59dc587676d58c422eb8a03e119582f92b",
        "test": "8a5befc548865cec54ed4273cf87dbbad60d1e47",
    },
)

CORPORA: dict[str, Corpus] = {
    c.name: c
    for c in (
        Corpus(
            "enwik8",
            unit="byte",
            vocab_size=256,
            dirname="enwik8",
            archive=Archive(
                f"{MAHONEY_BASE}/enwik8.zip",
                "enwik8.zip",
                36_445_475,
                Checksum("sha256", "547994d9980ebed1288380d652999f38a14fe291a6247c157c3d33d4932534bc"),
                (
                    Member(
                        "enwik8",
                        "enwik8",
                        Checksum(
                            "sha256", "2b49720ec4d78c3c9fabaee6e4179a5e997302b3a70029f30f2d582218c024a8"
                        ),
                    ),
                ),
            ),
            contiguous_split="enwik8",
            description="first 100M bytes of an English Wikipedia XML dump; 90M/5M/5M bytes",
        ),
        Corpus(
            "text8",
            unit="char",
            vocab_size=27,
            dirname="text8",
            archive=Archive(
                f"{MAHONEY_BASE}/text8.zip",
                "text8.zip",
                31_344_016,
                None,  # the zip has no published digest; its single member is pinned (sha1)
                (Member("text8", "text8", Checksum("sha1", "0dc3edebc970dcc96137e7deda4d9995af9d93de")),),
            ),
            contiguous_split="text8",
            description="enwik8 cleaned to 27 symbols (a-z and space); 90M/5M/5M chars",
        ),
        Corpus(
            "wikitext103",
            unit="word",
            vocab_size=267_735,
            dirname="wikitext-103",
            archive=WIKITEXT103_ARCHIVE,
            splits=_WT_SPLITS_TOKENS,
            description="WikiText-103 v1, word level as Transformer-XL (<eos> per line)",
        ),
        Corpus(
            "wikitext2",
            unit="word",
            vocab_size=33_278,
            dirname="wikitext-2",
            archive=_wikitext(
                "wikitext2",
                "wikitext-2-v1.zip",
                4_475_746,
                "92675f1d63015c1c8b51f1656a52d5bdbc33aafa60cc47a218a66e7ee817488c",
                "wikitext-2",
                "tokens",
                {
                    "train": "863f29c46ef9d167fff4940ec821195882fe29d1",
                    "valid": "0418625c8b4da6e4b5c7a0b9e78d4ae8f7ee5422",
                    "test": "c7b8ce0aa086fb34dab808c5c49224211eb2b172",
                },
            ),
            splits=_WT_SPLITS_TOKENS,
            vocab_splits=("train", "valid", "test"),
            description="WikiText-2 v1, word level as Transformer-XL (vocabulary from all splits)",
        ),
        Corpus(
            "wikitext103_raw",
            unit="bpe",
            vocab_size=50_257,
            dirname="wikitext-103-raw",
            aliases=("wikitext-raw",),
            archive=_wikitext(
                "wikitext103_raw",
                "wikitext-103-raw-v1.zip",
                191_984_949,
                "91c00ae287f0d699e18605c84afc9e45c192bc6b7797ff8837e5474655a33794",
                "wikitext-103-raw",
                "raw",
                {
                    "train": "3d06627c15e834408cfee91293f862c11c1cc9ef",
                    "valid": "db78d4db83700cba1b1bf4a9381087043db2876d",
                    "test": "6f1fe2054a940eebfc76b284b09680763b37f5ea",
                },
            ),
            splits=_WT_SPLITS_RAW,
            count_words=True,
            description="WikiText-103 raw text in GPT-2 BPE, with word counts for perplexity per word",
        ),
        Corpus(
            "wikitext103_text",
            unit="bpe",
            vocab_size=50_257,
            dirname="wikitext-103",
            archive=WIKITEXT103_ARCHIVE,
            splits=_WT_SPLITS_TOKENS,
            count_words=True,
            description="WikiText-103 v1 (the tokenized release: <unk>, ' @-@ ') read as plain text, in "
            "GPT-2 BPE or bytes: the same text for every method where only the tokenized valid and "
            "test splits are at hand (../shared/data has the raw test split only)",
        ),
        Corpus(
            "pg19",
            unit="bpe",
            vocab_size=50_257,
            dirname="pg19",
            documents=True,
            description="PG-19 books (one document per book) in GPT-2 BPE; train/validation/test",
        ),
        Corpus(
            "sample",
            unit="byte",
            vocab_size=256,
            dirname="sample",
            contiguous_split="sample",
            description="a public-domain essay bundled with longctx (byte level, 90/5/5): no network",
        ),
        Corpus(
            "text_files",
            unit="bpe",
            vocab_size=50_257,
            dirname="",
            count_words=True,
            user_files=True,
            description="your own UTF-8 text files, one per split (`data.files`; one file may feed "
            "several splits), in GPT-2 BPE, another byte-level BPE, or bytes (token i = byte i)",
        ),
    )
}

# PG-19's bucket folder of each split.
PG19_SPLIT_FOLDERS = {"train": "train", "valid": "validation", "test": "test"}

# GPT-2 BPE files (OpenAI's names; `vocab.json`/`merges.txt` in Hugging Face's), sha256 from tiktoken.
GPT2_FILES = {
    "encoder.json": Checksum("sha256", "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"),
    "vocab.bpe": Checksum("sha256", "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"),
}


def get_corpus(name: str) -> Corpus:
    """The registered corpus `name`, or a ValueError listing the known names."""
    try:
        return CORPORA[name]
    except KeyError:
        raise ValueError(f"unknown corpus {name!r}; choose one of {sorted(CORPORA)}") from None
