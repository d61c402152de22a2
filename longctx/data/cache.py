"""Tokenize a corpus once into an on-disk cache that every rank memory-maps.

Cache layout, `<cache_dir>/<corpus>-<fingerprint>/`, where `cache_dir` is a folder of its own (by
default in the user's cache folder, never inside the data root, which may be read-only):

- `<split>.npy`: token ids, smallest unsigned dtype that fits the vocabulary (uint8 bytes, uint16
  GPT-2, uint32 WikiText-103 words);
- `<split>.docs.npy`: for document corpora (PG-19), `(n_docs + 1,)` offsets of the books;
- `vocab.txt`: the word vocabulary of word-level corpora (and of `text_files` read with `tokenizer:
  words`), one symbol per line, id = line number;
- `token_bytes.npy`: (V,) UTF-8 bytes each id stands for (bits per byte; see `tokenize.py`);
- `meta.json`: vocabulary size, token/document/word counts per split, and the size and blake2b
  digest of every other file. Written last: a cache without it is incomplete and is rebuilt.

A cache is built in a temporary folder beside its final one and renamed into place when complete,
so a failed or interrupted build leaves nothing behind (no empty folder either) and a crash never
leaves a cache that a later run trusts. A cache damaged later (truncated, or overwritten in place
with the same size) fails its size/digest check at its first open in a process: `prepare_corpus`
rebuilds it from the corpus files, `load_corpus` refuses it with the fix. The fingerprint covers
everything that changes the ids (corpus, the data root it is read from, which file feeds each split,
tokenizer, PG-19 subset, imported vocabulary, format version), so two data roots never share a cache.
PG-19 is tokenized book by book and streamed to disk: it is never held in memory whole.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from longctx.data import pg19
from longctx.data.corpora import (
    CONTIGUOUS_SPLIT,
    GPT2_BASE,
    GPT2_FILES,
    PG19_BUCKET,
    PG19_LISTING,
    Corpus,
    get_corpus,
)
from longctx.data.download import (
    DataError,
    atomic_path,
    existing,
    extract_members,
    fetch,
    open_maybe_gz,
    verify,
    verify_member,
)
from longctx.data.tokenize import (
    BPEEncoder,
    ByteEncoder,
    WordVocab,
    count_words,
    encode_bytes,
    encode_text8,
    gpt2_files,
    gpt2_tokenizer_from_files,
    smallest_uint,
    text_lines,
    unit_token_bytes,
)
from longctx.runtime.atomic import created_dirs, umask_mode

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 2: token_bytes.npy and per-file checksums in meta.json
SPLITS = ("train", "valid", "test")  # the splits every corpus provides, in this order
SAMPLE = "sample"  # the corpus shipped inside the package: read from SAMPLE_FILE, not from the data root
SAMPLE_FILE = Path(__file__).parent / "sample" / "theophrastus_such.txt.gz"
SAMPLE_EVAL_FRACTION = 0.05
GPT2_VOCAB_SIZE = 50_257
BYTES_TOKENIZER = "bytes"  # `data.tokenizer: bytes` reads a raw-text corpus at byte level
# `data.tokenizer: words` reads the user's own files (`text_files`) as whitespace-separated words with
# an `<eos>` per line, the vocabulary built from the train file (`tokenize.WordVocab`).
WORDS_TOKENIZER = "words"
TOKEN_BYTES_FILE = "token_bytes.npy"
META_FILE = "meta.json"


@dataclass(frozen=True)
class CorpusSpec:
    """Everything that decides which raw files are read and which token ids come out.

    name: corpus (see `corpora.CORPORA`). root: raw files. cache_dir: the folder holding token caches.
    download: allow network access. split_sources: which corpus split feeds each split (default:
    itself). tokenizer: how a raw-text corpus (wikitext103_raw, pg19) is tokenized: `gpt2`
    (OpenAI's BPE files, fetched into `<root>/gpt2` when missing), a local folder or a Hugging Face
    hub id of a byte-level BPE, or `bytes` (byte level, for the byte-level methods). max_train_documents /
    max_eval_document_tokens: PG-19 subset (first N train books; first K tokens of every validation
    book). mirror: base URL of a mirror with the same file names (`<mirror>/<archive>.zip`,
    `<mirror>/gpt2/*`, `<mirror>/pg19/<folder>/*.txt`, `<mirror>/pg19-listing`). vocab_file: a
    word vocabulary to tokenize with instead of building one (one symbol per line, id = line
    number; e.g. a released checkpoint's, written by `python -m longctx convert`). files: the file
    of each split of `text_files` (the fingerprint holds their content digests, so an edited file
    gets a new cache: never stale ids).
    """

    name: str
    root: Path
    cache_dir: Path
    download: bool = True
    split_sources: dict[str, str] | None = None
    tokenizer: str = "gpt2"
    max_train_documents: int | None = None
    max_eval_document_tokens: int | None = None
    mirror: str | None = None
    vocab_file: Path | None = None
    files: dict[str, Path] | None = None

    @property
    def corpus(self) -> Corpus:
        return get_corpus(self.name)

    @property
    def unit(self) -> str:
        """The token unit: the corpus's, `byte` for a raw-text corpus read with `tokenizer: bytes`, or
        `word` for the user's files read with `tokenizer: words`."""
        unit = self.corpus.unit
        if unit == "bpe" and self.tokenizer == BYTES_TOKENIZER:
            return "byte"
        if self.corpus.user_files and self.tokenizer == WORDS_TOKENIZER:
            return "word"
        return unit

    def url(self, canonical: str, mirror_path: str) -> str:
        """`canonical`, or `<mirror>/<mirror_path>` when a mirror is set."""
        return f"{self.mirror.rstrip('/')}/{mirror_path}" if self.mirror else canonical

    def source(self, split: str) -> str:
        return (self.split_sources or {}).get(split, split)

    def fingerprint(self) -> str:
        corpus = self.corpus
        key = {
            "version": FORMAT_VERSION,
            "name": self.name,
            "sources": {s: self.source(s) for s in SPLITS},
            "tokenizer": resolved_tokenizer_name(self.tokenizer) if corpus.unit == "bpe" else None,
            "subset": [self.max_train_documents, self.max_eval_document_tokens] if corpus.documents else None,
        }
        if self.reads_root:  # caches of several data roots share one cache folder: keep them apart
            key["root"] = os.path.abspath(self.root)
        if self.vocab_file is not None:  # the ids depend on the imported vocabulary's content
            key["vocab_file"] = hashlib.sha1(self.vocab_file.read_bytes()).hexdigest()
        if corpus.user_files:  # the ids depend on the files' content, not on their names
            key["files"] = {split: source_digest(file) for split, file in self.user_files().items()}
        return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]

    def user_files(self) -> dict[str, Path]:
        """The file of each split of a `text_files` corpus."""
        if self.files is None:
            raise DataError(f"{self.name}: no data.files given")
        return self.files

    @property
    def path(self) -> Path:
        return self.cache_dir / f"{self.name}-{self.fingerprint()}"

    @property
    def reads_root(self) -> bool:
        """Whether the corpus files come from the data root (every corpus but the shipped sample and
        the user's own `text_files`, which are keyed by their content instead)."""
        return self.name != SAMPLE and not self.corpus.user_files


@dataclass
class TokenizedSplit:
    """tokens: (N,) memory-mapped ids; doc_offsets: (n_docs + 1,) or None; n_words: word counts by
    convention (`whitespace_eos`, `whitespace`) for corpora that keep them, else None; oov_tokens: how
    many of the tokens stand for words the vocabulary lacks (word corpora; None: not counted)."""

    tokens: np.ndarray
    doc_offsets: np.ndarray | None
    n_words: dict[str, int] | None
    oov_tokens: int | None = None  # word corpora: tokens that were not in the vocabulary (<unk>)


@dataclass
class TokenizedCorpus:
    """corpus: the registry record. token_bytes: (vocab_size,) UTF-8 bytes per id (bits per byte)."""

    corpus: Corpus
    vocab_size: int
    splits: dict[str, TokenizedSplit]
    path: Path
    token_bytes: np.ndarray
    absent: dict[str, str] = field(default_factory=dict)  # split -> why it was not tokenized
    # The cache's recorded digest of `vocab.txt`, the word vocabulary built from the data (or
    # imported): which word each id stands for. None where no text changes the ids (bytes,
    # characters, GPT-2's BPE).
    vocabulary_digest: str | None = None

    def split(self, name: str) -> TokenizedSplit:
        if name in self.absent:
            raise DataError(
                f"{self.absent[name]}; the token cache {self.path} was built without the {name} split (an "
                "imported data.vocab_file needs no train split to evaluate): put the file there and delete "
                "the cache to use it"
            )
        if name not in self.splits:
            raise KeyError(f"{self.corpus.name} has no split {name!r}; splits: {list(self.splits)}")
        return self.splits[name]


# ---------------------------------------------------------------------------------- public API
def prepare_corpus(spec: CorpusSpec) -> Path:
    """Download (if allowed), verify and tokenize `spec` into its cache; a no-op if it is there and
    passes its checks, a rebuild if it is damaged."""
    path = spec.path
    if (path / META_FILE).is_file():
        if (problem := cache_problem(path)) is None:
            return path
        log.warning("%s; rebuilding the token cache", problem)
        try:
            return _build(spec, path)
        except DataError as err:
            raise DataError(f"{problem}, and it cannot be rebuilt: {err}") from err
    return _build(spec, path)


def _build(spec: CorpusSpec, path: Path) -> Path:
    """Tokenize into a temporary folder beside `path`, then rename it into place: nothing is left
    behind when reading, downloading or tokenizing fails (not even the cache folder)."""
    check_root(spec)
    with created_dirs(path.parent):
        build = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.build-"))
        try:
            corpus = spec.corpus
            if corpus.contiguous_split:
                meta = _tokenize_contiguous(spec, build)
            elif corpus.unit == "word":
                meta = _tokenize_words(spec, build)
            elif corpus.documents:
                meta = _tokenize_documents(spec, build)
            elif corpus.user_files:
                meta = _tokenize_text_files(spec, build)
            else:
                meta = _tokenize_raw_files(spec, build)
            meta.update(
                version=FORMAT_VERSION,
                corpus=spec.name,
                root=os.path.abspath(spec.root) if spec.reads_root else None,
                sources={s: spec.source(s) for s in SPLITS},
                files=_file_records(build),
            )
            with atomic_path(build / META_FILE) as tmp:
                tmp.write_text(json.dumps(meta, indent=1))
            os.chmod(build, umask_mode(0o777))  # mkdtemp's 0700 would hide the cache from teammates
            _move_into_place(build, path)
        finally:
            shutil.rmtree(build, ignore_errors=True)
    return path


def _move_into_place(build: Path, path: Path) -> None:
    """Rename the finished cache `build` onto `path`, replacing a damaged cache there; a sound cache
    that another process finished meanwhile (e.g. each node's rank 0 on a shared file system) wins."""
    if path.exists():
        if (path / META_FILE).is_file() and cache_problem(path) is None:
            return
        shutil.rmtree(path)
    try:
        os.rename(build, path)
    except OSError:
        if not ((path / META_FILE).is_file() and cache_problem(path) is None):
            raise


def check_root(spec: CorpusSpec) -> None:
    """A data root that is not there is an error when nothing may be downloaded into it (it is never
    created for a run that cannot fill it)."""
    if spec.reads_root and not spec.download and not spec.root.is_dir():
        problem = "is not a folder" if spec.root.exists() else "does not exist"
        raise DataError(
            f"data.root {spec.root} {problem}: point --data.root at the folder that holds the "
            f"{spec.name} files, or download them into it (--data.download true, or `python -m "
            "longctx.data prepare --config <your config>` where there is network access)"
        )


def load_corpus(spec: CorpusSpec) -> TokenizedCorpus:
    """Memory-map a prepared cache (every rank calls this; nothing is read into RAM)."""
    path = spec.path
    prepare = f"`python -m longctx.data prepare {spec.name} --root {spec.root} --cache_dir {spec.cache_dir}`"
    if not (path / META_FILE).is_file():
        raise DataError(
            f"{spec.name}: no token cache at {path}. Prepare it first: {prepare} (Lightning's "
            "prepare_data does this on local rank 0 before setup)"
        )
    if (problem := cache_problem(path)) is not None:
        raise DataError(
            f"{problem}; delete {path} and run again (prepare_data rebuilds it from the corpus files), "
            f"or rebuild it with {prepare}"
        )
    meta = json.loads((path / META_FILE).read_text())
    splits = {}
    for split, info in meta["splits"].items():
        docs = path / f"{split}.docs.npy"
        splits[split] = TokenizedSplit(
            tokens=np.load(path / f"{split}.npy", mmap_mode="r"),
            doc_offsets=np.load(docs) if docs.is_file() else None,
            n_words=info.get("n_words"),
            oov_tokens=info.get("oov_tokens"),
        )
    token_bytes = np.load(path / TOKEN_BYTES_FILE)
    absent = meta.get("absent", {})
    vocabulary = meta["files"].get("vocab.txt")  # its blake2b, checked with the cache's other files
    return TokenizedCorpus(
        spec.corpus, int(meta["vocab_size"]), splits, path, token_bytes, absent,
        vocabulary_digest=vocabulary["blake2b"] if vocabulary else None,
    )  # fmt: skip


# ---------------------------------------------------------------------------------- integrity
_CHECKED: set[tuple[str, int, int]] = set()  # (file, size, mtime_ns) that passed, in this process


def file_digest(path: Path) -> str:
    """blake2b (128-bit) of a file's bytes (stdlib; 260 MB/s measured on a busy 2-core machine, so the
    first open of a 1 GB cache costs a few seconds per process)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, lambda: hashlib.blake2b(digest_size=16)).hexdigest()


def _file_records(path: Path) -> dict[str, dict[str, int | str]]:
    """Size and digest of every finished file of the cache (not meta.json, not temporaries)."""
    return {
        file.name: {"size": file.stat().st_size, "blake2b": file_digest(file)}
        for file in sorted(path.iterdir())
        if file.is_file()
        and file.name != META_FILE
        and ".part-" not in file.name
        and ".raw-" not in file.name
    }


_SOURCE_DIGESTS: dict[tuple[str, int, int, int, int], str] = {}  # (file, size, mtime, ctime, inode)


def source_digest(path: Path) -> str:
    """blake2b of a user's text file (`text_files`), once per process per (size, mtime, ctime, inode).

    The token cache is keyed by this digest, not by name, size and mtime: a file rewritten with the
    same size within the clock's resolution, or copied with its old mtime (`cp -p`, `rsync -t`), is
    still re-tokenized. The cost is one read of the file per process (blake2b, ~260 MB/s here).
    """
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)
    if key not in _SOURCE_DIGESTS:
        _SOURCE_DIGESTS[key] = file_digest(path)
    return _SOURCE_DIGESTS[key]


def cache_problem(path: Path) -> str | None:
    """What is wrong with the cache at `path` (a missing, truncated or altered file), or None.

    Each file is hashed once per process (a file whose size or mtime changes is hashed again).
    """
    try:
        records = json.loads((path / META_FILE).read_text())["files"]
    except (OSError, ValueError, KeyError):
        return f"token cache {path / META_FILE} is unreadable or lists no file checksums"
    for name, record in records.items():
        file = path / name
        if not file.is_file():
            return f"token cache file {file} is missing"
        stat = file.stat()
        key = (str(file.resolve()), stat.st_size, stat.st_mtime_ns)
        if key in _CHECKED:
            continue
        if stat.st_size != record["size"]:
            return (
                f"token cache file {file} has {stat.st_size:,} bytes, expected {record['size']:,} (truncated)"
            )
        if file_digest(file) != record["blake2b"]:
            return f"token cache file {file} fails its blake2b checksum (corrupted in place)"
        _CHECKED.add(key)
    return None


def imported_vocab(spec: CorpusSpec) -> WordVocab:
    """`data.vocab_file` as the corpus reads it: as it is for a word corpus, with `<unk>` appended
    when it lacks one for the user's files (their words may be any)."""
    vocab = WordVocab.load(spec.vocab_file)
    return vocab.with_unk() if spec.corpus.user_files else vocab


def vocab_size_of(spec: CorpusSpec) -> int:
    """The vocabulary size, known before `setup` so the CLI can link it into the model.

    Fixed for byte/char corpora and for the GPT-2 tokenizer; a word vocabulary built from other
    splits than the canonical ones (`split_sources`) is read from (or built into) the cache.
    """
    corpus = spec.corpus
    if spec.vocab_file is not None:
        return len(imported_vocab(spec))
    if spec.unit == "byte":
        return 256
    if spec.unit == "word" and corpus.user_files:  # built from the train file: read from the cache
        return int(json.loads((prepare_corpus(spec) / META_FILE).read_text())["vocab_size"])
    if corpus.unit == "bpe":
        if resolved_tokenizer_name(spec.tokenizer) == "gpt2":
            return GPT2_VOCAB_SIZE
        return load_tokenizer(spec).get_vocab_size()
    if corpus.vocab_size is not None and not (corpus.unit == "word" and spec.split_sources):
        return corpus.vocab_size
    meta = json.loads((prepare_corpus(spec) / META_FILE).read_text())
    return int(meta["vocab_size"])


# ---------------------------------------------------------------------------------- raw files
def corpus_folder(spec: CorpusSpec) -> Path:
    """The folder holding the corpus's extracted files: the first of its names that exists."""
    corpus = spec.corpus
    for name in corpus.dirnames:
        if (spec.root / name).is_dir():
            return spec.root / name
    return spec.root / corpus.dirname


def ensure_member(spec: CorpusSpec, name: str) -> Path:
    """The extracted file `name` of the corpus (plain or .gz), downloading the archive if needed.

    Files found on disk are checked against their pinned digest; a missing file offline is an error
    naming the corpus, the file, where to put it and where it comes from.
    """
    corpus = spec.corpus
    folder = corpus_folder(spec)
    member = corpus.member(name)
    if (path := existing(folder, name)) is not None:
        verify_member(path, member, spec.name)
        return path
    archive = corpus.archive
    if archive is None:
        raise DataError(f"{spec.name}: {name} is not part of the corpus")
    url = spec.url(archive.url, archive.filename)
    if not spec.download:
        expected = ", ".join(m.name for m in archive.members)
        raise DataError(
            f"{spec.name}: {name} is missing from {folder} and downloads are off (data.download: "
            f"false). Fetch the corpus with `python -m longctx.data prepare --config <your config>` (or "
            f"`python -m longctx.data prepare {spec.name} --root {spec.root}`) where there is network "
            f"access, or put its files ({expected}; plain or .gz) in {folder} (from {url})"
        )
    with created_dirs(folder):  # removed again (with a missing root) if the download fails
        zip_path = folder / archive.filename
        if not zip_path.is_file():
            fetch(url, zip_path, checksum=archive.checksum, size=archive.size, what=spec.name)
        else:
            verify(zip_path, archive.checksum, size=archive.size, what=spec.name)
        extract_members(archive, zip_path, folder, spec.name)
    zip_path.unlink()  # every member is extracted and verified
    return folder / name


def resolved_tokenizer_name(tokenizer: str) -> str:
    if tokenizer in (BYTES_TOKENIZER, WORDS_TOKENIZER):  # names, never a folder of that name
        return tokenizer
    path = Path(tokenizer).expanduser()
    return str(path.resolve()) if path.is_dir() or is_local_path(tokenizer) else tokenizer


def raw_text_encoder(spec: CorpusSpec) -> ByteEncoder | BPEEncoder:
    """How a raw-text corpus is tokenized: bytes, or the BPE named by `spec.tokenizer`."""
    return ByteEncoder() if spec.unit == "byte" else BPEEncoder(load_tokenizer(spec))


def is_local_path(tokenizer: str) -> bool:
    """A `data.tokenizer` naming a local folder (`./x`, `../x`, `/x`, `~/x`) rather than a hub id."""
    return tokenizer.startswith((".", "/", "~"))


def load_tokenizer(spec: CorpusSpec) -> Tokenizer:
    """The GPT-2 BPE tokenizer named by `spec.tokenizer` (see `CorpusSpec`).

    A local folder that does not exist is filled with OpenAI's GPT-2 files when downloads are on
    (what `python -m longctx.data prepare --config X` does for `tokenizer: ../shared/data/gpt2`).
    """
    source = spec.tokenizer
    path = Path(source).expanduser()
    if path.is_dir():
        files = gpt2_files(path)
        if files is None:
            raise DataError(
                f"tokenizer folder {path} has no vocab.json + merges.txt (or encoder.json + vocab.bpe)"
            )
        return gpt2_tokenizer_from_files(*files)
    if source == "gpt2" or is_local_path(source):
        return gpt2_tokenizer_from_files(
            *ensure_gpt2_files(spec, spec.root / "gpt2" if source == "gpt2" else path)
        )
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(source).backend_tokenizer
    except (OSError, ValueError) as err:
        raise DataError(
            f"cannot load tokenizer {source!r} ({err}); offline, point data.tokenizer at a folder with "
            "vocab.json and merges.txt"
        ) from err


def ensure_gpt2_files(spec: CorpusSpec, folder: Path) -> tuple[Path, Path]:
    """OpenAI's GPT-2 `encoder.json` + `vocab.bpe` in `folder`, fetched if missing and allowed; both
    checked against their pinned sha256."""
    if (files := gpt2_files(folder)) is None:
        if not spec.download:
            raise DataError(
                f"GPT-2 tokenizer files (encoder.json, vocab.bpe) are not in {folder} and downloads are "
                "off. Fetch them with `python -m longctx.data prepare --config <your config>` where there "
                f"is network access, or copy them there from {GPT2_BASE}, or point data.tokenizer at a "
                "folder with vocab.json and merges.txt"
            )
        base = spec.url(GPT2_BASE, "gpt2")
        for name, checksum in GPT2_FILES.items():
            fetch(f"{base}/{name}", folder / name, checksum=checksum, what=f"gpt2 {name}")
        files = gpt2_files(folder)
    for file, checksum in zip(files, GPT2_FILES.values(), strict=True):
        verify(file, checksum, what="GPT-2 tokenizer")
    return files


# ---------------------------------------------------------------------------------- tokenizers
def _save(path: Path, array: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.save(f, array)


def _split_info(tokens: np.ndarray, **extra) -> dict:
    return {"tokens": len(tokens), "dtype": str(tokens.dtype), **extra}


def _tokenize_contiguous(spec: CorpusSpec, path: Path) -> dict:
    """enwik8 / text8 / sample: one member cut into train / valid / test by position."""
    corpus = spec.corpus
    if corpus.name == "sample":
        with open_maybe_gz(SAMPLE_FILE) as f:
            data = f.read()
        n_eval = round(SAMPLE_EVAL_FRACTION * len(data))
        sizes = {"valid": n_eval, "test": n_eval}
    else:
        with open_maybe_gz(ensure_member(spec, corpus.contiguous_split)) as f:
            data = f.read()
        sizes = CONTIGUOUS_SPLIT
    ids = encode_text8(data) if corpus.unit == "char" else encode_bytes(data)
    n_test, n_valid = sizes["test"], sizes["valid"]
    parts = {
        "train": ids[: len(ids) - n_valid - n_test],
        "valid": ids[len(ids) - n_valid - n_test : len(ids) - n_test],
        "test": ids[len(ids) - n_test :],
    }
    splits = {}
    for split in SPLITS:
        tokens = parts[spec.source(split)]
        _save(path / f"{split}.npy", tokens)
        splits[split] = _split_info(tokens)
    _save(path / TOKEN_BYTES_FILE, unit_token_bytes(corpus.vocab_size))
    return {"vocab_size": corpus.vocab_size, "splits": splits}


def _tokenize_words(spec: CorpusSpec, path: Path) -> dict:
    """WikiText word level: the Transformer-XL vocabulary and ids."""
    corpus = spec.corpus
    sources = {spec.source(split) for split in SPLITS}
    imported = spec.vocab_file is not None
    source_files, absent_sources = _word_files(spec, sorted(sources), may_lack=imported)
    if imported:
        vocab = imported_vocab(spec)
    else:
        files = {split: source_files[spec.source(split)] for split in SPLITS}
        vocab = WordVocab.build(list(dict.fromkeys(files[s] for s in corpus.vocab_splits)))
    if not imported and spec.split_sources is None and corpus.vocab_size and len(vocab) != corpus.vocab_size:
        vocab_files = [str(source_files[s]) for s in corpus.vocab_splits]
        raise DataError(
            f"{spec.name}: the vocabulary built from {vocab_files} has {len(vocab):,} "
            f"symbols, expected {corpus.vocab_size:,}: these are not the published files"
        )
    with atomic_path(path / "vocab.txt") as tmp:
        vocab.save(tmp)
    _save(path / TOKEN_BYTES_FILE, vocab.token_bytes())
    encoded = {source: vocab.encode_file_counting_unknown(file) for source, file in source_files.items()}
    splits, absent = {}, {}
    for split in SPLITS:
        if spec.source(split) in absent_sources:
            absent[split] = absent_sources[spec.source(split)]
            continue
        tokens, unknown = encoded[spec.source(split)]
        _save(path / f"{split}.npy", tokens)
        splits[split] = _split_info(tokens, oov_tokens=unknown)
    return {"vocab_size": len(vocab), "splits": splits, "absent": absent}


def _word_files(
    spec: CorpusSpec, sources: list[str], may_lack: bool
) -> tuple[dict[str, Path], dict[str, str]]:
    """The file of each source split, and (when `may_lack`: the vocabulary is imported, so no split
    is needed to build it) the splits whose file cannot be had, with the reason. At least one split
    must be there."""
    files, absent = {}, {}
    for source in sources:
        try:
            files[source] = ensure_member(spec, spec.corpus.splits[source])
        except DataError as err:
            if not may_lack:
                raise
            absent[source] = str(err)
    if not files:
        raise DataError(next(iter(absent.values())))
    return files, absent


def _tokenize_raw_files(spec: CorpusSpec, path: Path) -> dict:
    """WikiText-103 raw in GPT-2 BPE (or bytes), with the word counts of each split."""
    corpus = spec.corpus
    encoder = raw_text_encoder(spec)
    encoded: dict[str, tuple[np.ndarray, dict[str, int]]] = {}  # each source file read once
    splits = {}
    for split in SPLITS:
        source = spec.source(split)
        if source not in encoded:
            with open_maybe_gz(ensure_member(spec, corpus.splits[source])) as f:
                text = f.read().decode("utf-8")
            encoded[source] = (encoder.encode(text), count_words(text))
        tokens, n_words = encoded[source]
        _save(path / f"{split}.npy", tokens)
        splits[split] = _split_info(tokens, n_words=n_words)
    _save(path / TOKEN_BYTES_FILE, encoder.token_bytes())
    return {"vocab_size": encoder.vocab_size, "splits": splits}


def _tokenize_documents(spec: CorpusSpec, path: Path) -> dict:
    """PG-19: book by book, streamed to disk; offsets of the books kept per split."""
    encoder = raw_text_encoder(spec)
    dtype = smallest_uint(encoder.vocab_size - 1)
    bucket = spec.url(PG19_BUCKET, "pg19")
    listing = spec.url(PG19_LISTING, "pg19-listing")
    splits = {}
    for split in SPLITS:
        source = spec.source(split)
        books = pg19.ensure_split(
            spec.root,
            source,
            download=spec.download,
            max_documents=spec.max_train_documents if split == "train" else None,
            bucket_url=bucket,
            listing_url=listing,
        )
        limit = spec.max_eval_document_tokens if split == "valid" else None
        offsets, words = [0], 0
        with TokenFileWriter(path / f"{split}.npy", dtype) as writer:
            for ids, n_words in _book_ids(encoder, books, limit):
                writer.append(ids)
                offsets.append(offsets[-1] + len(ids))
                words += n_words
        _save(path / f"{split}.docs.npy", np.asarray(offsets, dtype=np.int64))
        # Books are not line-oriented: only whitespace words are counted (none for a truncated split).
        n_words = None if limit else {"whitespace": words}
        splits[split] = {
            "tokens": offsets[-1],
            "dtype": str(dtype),
            "documents": len(books),
            "n_words": n_words,
        }
    _save(path / TOKEN_BYTES_FILE, encoder.token_bytes())
    return {"vocab_size": encoder.vocab_size, "splits": splits}


def _tokenize_text_files(spec: CorpusSpec, path: Path) -> dict:
    """The user's files (`text_files`): each file read once and checked against the digest its cache
    is keyed by (`_read_user_file`), tokenized whole: bytes (id i = byte i of the file) or a BPE, with
    word counts per split, or words (`tokenizer: words`: the vocabulary from the train file, or
    `vocab_file`'s; words of other files it lacks mapped to `<unk>` and counted)."""
    texts: dict[Path, str] = {}
    for split, file in spec.user_files().items():
        if file.resolve() not in texts:
            texts[file.resolve()] = _read_user_file(spec, path, split, file)
    if spec.unit == "word":
        if spec.vocab_file is not None:  # a trained model's ids (its run's vocab.txt)
            vocab = imported_vocab(spec)
        else:
            vocab = WordVocab.from_lines(text_lines(texts[spec.user_files()["train"].resolve()])).with_unk()
        with atomic_path(path / "vocab.txt") as tmp:
            vocab.save(tmp)

        def encode(file: Path, text: str) -> tuple[np.ndarray, dict]:
            tokens, unknown = vocab.encode_lines(text_lines(text), str(file))
            return tokens, {"oov_tokens": unknown}

        vocab_size, token_bytes = len(vocab), vocab.token_bytes()
    else:
        encoder = raw_text_encoder(spec)

        def encode(file: Path, text: str) -> tuple[np.ndarray, dict]:
            return encoder.encode(text), {"n_words": count_words(text)}

        vocab_size, token_bytes = encoder.vocab_size, encoder.token_bytes()
    encoded = {file: encode(file, text) for file, text in texts.items()}
    splits, sources = {}, {}
    for split, file in spec.user_files().items():
        tokens, extra = encoded[file.resolve()]
        _save(path / f"{split}.npy", tokens)
        splits[split] = _split_info(tokens, **extra)
        sources[split] = {"path": str(file.resolve()), "blake2b": source_digest(file)}
    _save(path / TOKEN_BYTES_FILE, token_bytes)
    return {"vocab_size": vocab_size, "splits": splits, "text_files": sources}


def _read_user_file(spec: CorpusSpec, path: Path, split: str, file: Path) -> str:
    """The text of a `text_files` file, refused if it changed since the cache `path` was named for
    its content (it would otherwise cache new ids under the old content's key)."""
    data = file.read_bytes()
    read_digest = hashlib.blake2b(data, digest_size=16).hexdigest()
    # `path` is the build folder `.<cache name>.build-*` beside the cache `spec.path` names.
    named_for_this_content = path.name.startswith(f".{spec.path.name}.build-")
    if read_digest != source_digest(file) or not named_for_this_content:
        raise DataError(f"data.files {split}: {file} changed while it was being read; run again")
    return decode_text(file, data)


def decode_text(path: Path, data: bytes) -> str:
    """The file's text; a file that is not UTF-8 is an error naming the first bad byte's offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        bad = data[err.start : err.start + 1]
        raise DataError(
            f"data.files: {path} is not UTF-8 text (byte {err.start:,} is {bad!r}); convert it, e.g. "
            "`iconv -f latin1 -t utf-8`"
        ) from err


def _book_ids(
    encoder: ByteEncoder | BPEEncoder, books: list[Path], limit: int | None
) -> Iterator[tuple[np.ndarray, int]]:
    for book in books:
        with open_maybe_gz(book) as f:
            text = f.read().decode("utf-8")
        ids = encoder.encode(text)
        yield (ids[:limit] if limit else ids), len(text.split())


class TokenFileWriter:
    """Append id arrays to a temporary raw file; on success, turn it into `<path>` (.npy) atomically."""

    def __init__(self, path: Path, dtype: np.dtype) -> None:
        self.path, self.dtype, self.n = path, np.dtype(dtype), 0
        self.raw = path.with_name(f"{path.name}.raw-{os.getpid()}")

    def __enter__(self) -> TokenFileWriter:
        self.file = open(self.raw, "wb")
        return self

    def append(self, ids: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(ids, dtype=self.dtype).tobytes())
        self.n += len(ids)

    def __exit__(self, exc_type, exc, tb) -> None:
        self.file.close()
        try:
            if exc_type is None:
                with atomic_path(self.path) as tmp:
                    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=self.dtype, shape=(self.n,))
                    if self.n:
                        src = np.memmap(self.raw, dtype=self.dtype, mode="r", shape=(self.n,))
                        for start in range(0, self.n, 1 << 24):
                            out[start : start + (1 << 24)] = src[start : start + (1 << 24)]
                        del src
                    out.flush()
                    del out
        finally:
            self.raw.unlink(missing_ok=True)
