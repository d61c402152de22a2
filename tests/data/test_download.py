"""Downloads against a local HTTP server: good, corrupt, truncated and offline files, for single files,
zip corpora (through `data.mirror`), PG-19 books and the GPT-2 tokenizer files."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import hashlib
import http.server
import io
import json
import os
import shutil
import socket
import stat
import threading
import urllib.parse
import zipfile
from pathlib import Path

import numpy as np
import platformdirs
import pytest

from longctx.data import cache, corpora
from longctx.data.cache import CorpusSpec, load_corpus, load_tokenizer, prepare_corpus, vocab_size_of
from longctx.data.corpora import Archive, Checksum, Member
from longctx.data.datamodule import LMDataModule
from longctx.data.download import ChecksumError, DataError, fetch
from tests.helpers.environment import shared_dir, skip_without_shared

SHARED = shared_dir() / "data"


class Server:
    """Serves `files` (URL path -> bytes) on 127.0.0.1; `/pg19-listing` answers like the GCS JSON API."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlparse(self.path)
                server.requests.append(url.path)
                if url.path == "/pg19-listing":
                    body = server.listing(urllib.parse.parse_qs(url.query))
                elif url.path in server.files:
                    body = server.files[url.path]
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        # shutdown() waits for the serving loop's next poll: poll often, or each test waits 0.5 s
        threading.Thread(target=self.httpd.serve_forever, args=(0.01,), daemon=True).start()

    def listing(self, query: dict[str, list[str]]) -> bytes:
        """One book per page, to exercise pagination."""
        prefix = "/pg19/" + query["prefix"][0]
        names = sorted(p for p in self.files if p.startswith(prefix))
        start = int(query.get("pageToken", ["0"])[0])
        page: dict = {"items": []}
        for path in names[start : start + 1]:
            body = self.files[path]
            md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
            page["items"].append(
                {"name": path.removeprefix("/pg19/"), "size": str(len(body)), "md5Hash": md5}
            )
        if start + 1 < len(names):
            page["nextPageToken"] = str(start + 1)
        return json.dumps(page).encode()

    def close(self) -> None:
        self.httpd.shutdown()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


def sha256(data: bytes) -> Checksum:
    return Checksum("sha256", hashlib.sha256(data).hexdigest())


def leftovers(folder: Path) -> list[str]:
    return [
        p.name for p in folder.rglob("*") if any(mark in p.name for mark in (".part-", ".raw-", ".build-"))
    ]


def tree(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path under `folder` (itself included) with its mtime and size: what a write would change."""
    return {
        str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.stat().st_size)
        for p in [folder, *folder.rglob("*")]
    }


# ---------------------------------------------------------------------------------- single files
def test_fetch_verifies_and_renames(server, tmp_path):
    server.files["/f.bin"] = data = bytes(range(256)) * 100
    dest = fetch(f"{server.url}/f.bin", tmp_path / "f.bin", checksum=sha256(data), size=len(data))
    assert dest.read_bytes() == data and not leftovers(tmp_path)


def test_corrupt_download_is_rejected_and_not_kept(server, tmp_path):
    server.files["/f.bin"] = b"corrupted content"
    with pytest.raises(ChecksumError, match=r"sha256 .* expected"):
        fetch(f"{server.url}/f.bin", tmp_path / "f.bin", checksum=sha256(b"the real content"))
    assert not (tmp_path / "f.bin").exists() and not leftovers(tmp_path)


def test_truncated_download_is_rejected(server, tmp_path):
    data = b"x" * 10_000
    server.files["/f.bin"] = data[:6_000]
    with pytest.raises(ChecksumError, match="6,000 bytes, expected 10,000"):
        fetch(f"{server.url}/f.bin", tmp_path / "f.bin", checksum=sha256(data), size=len(data))
    assert not (tmp_path / "f.bin").exists() and not leftovers(tmp_path)


def test_offline_is_a_clear_error(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DataError, match=r"cannot download .* place it at"):
        fetch(f"http://127.0.0.1:{port}/f.bin", tmp_path / "f.bin")
    assert not leftovers(tmp_path)


# ---------------------------------------------------------------------------------- zip corpora
WIKI = {
    "train": " = Title = \n \n the cat sat on the mat \n the dog \n",
    "valid": " the cat and the dog \n",
    "test": " a cat sat \n",
}


def wiki_zip(splits: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for split, text in splits.items():
            zf.writestr(f"tiny/wiki.{split}.tokens", text)
    return buffer.getvalue()


@pytest.fixture
def tiny_wikitext(monkeypatch, server):
    """A WikiText-like corpus served from the local server, registered as `wikitext2` with pinned
    digests of its generated archive and members."""
    payload = wiki_zip(WIKI)
    server.files["/tiny.zip"] = payload
    members = tuple(
        Member(
            f"wiki.{s}.tokens",
            f"tiny/wiki.{s}.tokens",
            Checksum("sha1", hashlib.sha1(t.encode()).hexdigest()),
        )
        for s, t in WIKI.items()
    )
    archive = Archive(f"{server.url}/nowhere/tiny.zip", "tiny.zip", len(payload), sha256(payload), members)
    corpus = dataclasses.replace(corpora.CORPORA["wikitext2"], archive=archive, vocab_size=None)
    monkeypatch.setitem(corpora.CORPORA, "wikitext2", corpus)
    return server


def spec(tmp_path: Path, mirror: str | None, **kwargs) -> CorpusSpec:
    return CorpusSpec(
        name=kwargs.pop("name", "wikitext2"),
        root=tmp_path / "raw",
        cache_dir=tmp_path / "cache",
        mirror=mirror,
        **kwargs,
    )


def test_zip_corpus_downloads_from_mirror_and_tokenizes(tiny_wikitext, tmp_path):
    s = spec(tmp_path, tiny_wikitext.url)
    prepare_corpus(s)
    corpus = load_corpus(s)
    # Transformer-XL vocabulary: <eos> first, then by count (ties by first appearance), all splits.
    vocab = (s.path / "vocab.txt").read_text().split("\n")[:-1]
    assert vocab[:6] == ["<eos>", "the", "cat", "=", "sat", "dog"]
    assert corpus.vocab_size == len(vocab) == 11
    ids = {w: i for i, w in enumerate(vocab)}
    expected = [ids[w] for w in ["a", "cat", "sat", "<eos>"]]
    np.testing.assert_array_equal(corpus.split("test").tokens, expected)
    assert len(corpus.split("train").tokens) == 4 + 1 + 7 + 3  # <eos> per line, blank lines too
    assert corpus.split("train").tokens.dtype == np.uint8
    assert tiny_wikitext.requests == ["/tiny.zip"]  # the mirror replaced the canonical URL
    assert not (tmp_path / "raw" / "wikitext-2" / "tiny.zip").exists()  # extracted and verified
    prepare_corpus(s)  # a second call reads the cache only
    assert tiny_wikitext.requests == ["/tiny.zip"]


def test_corrupt_archive_leaves_no_cache(tiny_wikitext, tmp_path):
    tiny_wikitext.files["/tiny.zip"] = wiki_zip({**WIKI, "test": " a dog sat \n"})
    s = spec(tmp_path, tiny_wikitext.url)
    with pytest.raises(ChecksumError, match="wikitext2"):
        prepare_corpus(s)
    assert not (s.path / "meta.json").exists()
    assert not list((tmp_path / "raw").rglob("*.zip")) and not leftovers(tmp_path)
    assert list(tmp_path.iterdir()) == []  # neither the data root nor the cache folder was created


def test_a_file_missing_offline_leaves_no_cache_folder(tiny_wikitext, tmp_path):
    (tmp_path / "raw").mkdir()
    with pytest.raises(DataError, match=r"wiki\.test\.tokens is missing from .* downloads are off"):
        prepare_corpus(spec(tmp_path, None, download=False))
    assert [p.name for p in tmp_path.iterdir()] == ["raw"] and not any((tmp_path / "raw").iterdir())


def test_two_data_roots_never_share_a_cache(tmp_path):
    """Caches of every data root share one cache folder: the root is part of the fingerprint (except
    for the sample shipped in the package, which no root changes)."""
    a, b = (CorpusSpec("wikitext2", root=tmp_path / r, cache_dir=tmp_path / "cache") for r in ("a", "b"))
    assert a.path.parent == b.path.parent and a.path != b.path
    a, b = (CorpusSpec("sample", root=tmp_path / r, cache_dir=tmp_path / "cache") for r in ("a", "b"))
    assert a.path == b.path


def test_token_cache_goes_to_the_cache_folder_and_nothing_under_the_data_root(
    tiny_wikitext, tmp_path, monkeypatch
):
    """A read-only data root (CI's ../shared) works: the cache goes to `$LONGCTX_CACHE`, readable as the
    umask allows (not mkdtemp's 0700), and nothing under the root changes."""
    folder = tmp_path / "raw" / "wikitext-2"
    folder.mkdir(parents=True)
    for split, text in WIKI.items():
        (folder / f"wiki.{split}.tokens").write_text(text)
    before = tree(tmp_path / "raw")
    monkeypatch.setenv("LONGCTX_CACHE", str(tmp_path / "user-cache"))
    umask = os.umask(0o027)
    try:
        data = LMDataModule("wikitext2", root=str(tmp_path / "raw"), download=False, batch_size=1, tgt_len=2)
        data.prepare_data()
        data.setup()
    finally:
        os.umask(umask)
    assert tree(tmp_path / "raw") == before
    assert data.corpus.path.parent == tmp_path / "user-cache"
    assert stat.S_IMODE(data.corpus.path.stat().st_mode) == 0o750
    assert {stat.S_IMODE(f.stat().st_mode) for f in data.corpus.path.iterdir()} == {0o640}


def test_default_cache_folder_is_the_users_never_the_data_root(tmp_path, monkeypatch):
    monkeypatch.delenv("LONGCTX_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # where platformdirs looks on Linux
    cache_dir = LMDataModule("wikitext2", root=str(tmp_path / "raw")).spec.cache_dir
    assert cache_dir == platformdirs.user_cache_path("longctx") / "tokens"
    assert tmp_path / "raw" not in [cache_dir, *cache_dir.parents]


def test_tampered_member_on_disk_is_rejected(tiny_wikitext, tmp_path):
    folder = tmp_path / "raw" / "wikitext-2"
    folder.mkdir(parents=True)
    for split, text in WIKI.items():
        (folder / f"wiki.{split}.tokens").write_text(text)
    (folder / "wiki.valid.tokens").write_text(" the cat and the cat \n")
    with pytest.raises(ChecksumError, match=r"wiki\.valid\.tokens .* sha1"):
        prepare_corpus(spec(tmp_path, None, download=False))


def test_existing_gzipped_files_need_no_network(tiny_wikitext, tmp_path):
    folder = tmp_path / "raw" / "wikitext-2"
    folder.mkdir(parents=True)
    for split, text in WIKI.items():
        (folder / f"wiki.{split}.tokens.gz").write_bytes(gzip.compress(text.encode()))
    s = spec(tmp_path, None, download=False)
    assert vocab_size_of(s) == 11 and tiny_wikitext.requests == []


# ---------------------------------------------------------------------------------- token cache integrity
def test_truncated_cache_is_refused_then_rebuilt_from_the_corpus_files(tiny_wikitext, tmp_path):
    s = spec(tmp_path, tiny_wikitext.url)
    prepare_corpus(s)
    good = np.array(load_corpus(s).split("train").tokens)
    train = s.path / "train.npy"
    train.write_bytes(train.read_bytes()[:-3])
    with pytest.raises(
        DataError,
        match=rf"token cache file {train} has [\d,]+ bytes, expected [\d,]+ \(truncated\); delete .*`"
        "python -m longctx.data prepare wikitext2",
    ):
        load_corpus(s)
    prepare_corpus(s)  # the extracted corpus files are on disk: rebuilt without the network
    np.testing.assert_array_equal(load_corpus(s).split("train").tokens, good)
    assert tiny_wikitext.requests == ["/tiny.zip"] and not leftovers(tmp_path)


def test_same_size_corruption_is_caught_by_the_checksum(tiny_wikitext, tmp_path, monkeypatch):
    s = spec(tmp_path, tiny_wikitext.url)
    prepare_corpus(s)
    load_corpus(s)
    test = s.path / "test.npy"
    data = bytearray(test.read_bytes())
    data[-1] ^= 1  # one id changes, the size does not
    test.write_bytes(bytes(data))
    monkeypatch.setattr(cache, "_CHECKED", set())  # a new process: every file is checked at first open
    with pytest.raises(DataError, match=rf"token cache file {test} fails its blake2b checksum"):
        load_corpus(s)


def test_corrupt_cache_without_its_corpus_files_is_refused(tiny_wikitext, tmp_path, monkeypatch):
    s = spec(tmp_path, tiny_wikitext.url)
    prepare_corpus(s)
    shutil.rmtree(tmp_path / "raw")
    (tmp_path / "raw").mkdir()  # the data root is there, its files are not
    vocab = s.path / "vocab.txt"
    vocab.write_text(vocab.read_text().replace("cat", "cow"))
    monkeypatch.setattr(cache, "_CHECKED", set())
    with pytest.raises(
        DataError,
        match=r"vocab\.txt fails its blake2b checksum .*, and it cannot be rebuilt: wikitext2: "
        r"wiki\.test\.tokens is missing .* downloads are off",
    ):
        prepare_corpus(dataclasses.replace(s, download=False))


# ---------------------------------------------------------------------------------- PG-19 and GPT-2
needs_shared = skip_without_shared("data")

BOOKS = {
    "train": {"200.txt": "Second book.\n", "100.txt": "First book, by name.\n", "300.txt": "Third.\n"},
    "validation": {"400.txt": "A validation book with more words in it.\n"},
    "test": {"500.txt": "The test book.\n"},
}


@needs_shared
def test_pg19_books_and_gpt2_files_from_mirror(server, tmp_path):
    for name in ("encoder.json", "vocab.bpe"):
        server.files[f"/gpt2/{name}"] = gzip.decompress((SHARED / "gpt2" / f"{name}.gz").read_bytes())
    for folder, books in BOOKS.items():
        for name, text in books.items():
            server.files[f"/pg19/{folder}/{name}"] = text.encode()
    s = spec(tmp_path, server.url, name="pg19", max_train_documents=2, max_eval_document_tokens=3)
    prepare_corpus(s)
    corpus = load_corpus(s)
    train = corpus.split("train")
    # The first two train books by file name: 100.txt then 200.txt, each its own document.
    assert len(train.doc_offsets) == 3
    first = np.asarray(train.tokens[: train.doc_offsets[1]])
    tokenizer = load_tokenizer(s)
    assert tokenizer.decode(first.tolist()) == BOOKS["train"]["100.txt"]
    assert len(corpus.split("valid").tokens) == 3  # first 3 tokens of the validation book
    assert corpus.split("test").n_words == {"whitespace": 3}
    assert (tmp_path / "raw" / "gpt2" / "encoder.json").is_file()
    assert not leftovers(tmp_path)


def test_pg19_corrupt_book_is_rejected(server, tmp_path, monkeypatch):
    server.files["/pg19/test/500.txt"] = b"The test book.\n"
    listing = server.listing

    def bad_listing(query):  # the listing promises other bytes than the server sends
        page = json.loads(listing(query))
        for item in page["items"]:
            item["md5Hash"] = base64.b64encode(hashlib.md5(b"other").digest()).decode()
        return json.dumps(page).encode()

    monkeypatch.setattr(server, "listing", bad_listing)
    from longctx.data import pg19

    with pytest.raises(ChecksumError, match=r"pg19 test/500\.txt"):
        pg19.ensure_split(
            tmp_path,
            "test",
            download=True,
            max_documents=None,
            bucket_url=f"{server.url}/pg19",
            listing_url=f"{server.url}/pg19-listing",
        )
    assert not (tmp_path / "pg19" / "test" / "500.txt").exists()
    assert list(tmp_path.iterdir()) == []  # nor the folders made for it


@needs_shared  # the GPT-2 tokenizer loads before the books are looked for
def test_pg19_offline_without_books_names_the_folder(tmp_path):
    (tmp_path / "raw").mkdir()
    with pytest.raises(DataError, match=r"pg19: no books for split train .*train"):
        prepare_corpus(spec(tmp_path, None, name="pg19", download=False, tokenizer=str(SHARED / "gpt2")))


def test_pg19_at_byte_level(server, tmp_path):
    """`tokenizer: bytes`: the books' UTF-8 bytes are the ids, one document per book."""
    books = {**BOOKS, "test": {"500.txt": "Ein Büchlein — «test».\n"}}
    for folder, files in books.items():
        for name, text in files.items():
            server.files[f"/pg19/{folder}/{name}"] = text.encode()
    s = spec(tmp_path, server.url, name="pg19", tokenizer="bytes")
    assert vocab_size_of(s) == 256
    prepare_corpus(s)
    corpus = load_corpus(s)
    test = corpus.split("test")
    text = books["test"]["500.txt"].encode()
    assert bytes(test.tokens) == text and test.doc_offsets.tolist() == [0, len(text)] and len(text) == 28
    assert corpus.token_bytes.tolist() == [1] * 256 and corpus.split("train").doc_offsets.tolist() == [
        0,
        21,
        34,
        41,
    ]


@needs_shared
def test_missing_tokenizer_folder_is_fetched_only_when_downloads_are_on(server, tmp_path):
    for name in ("encoder.json", "vocab.bpe"):
        server.files[f"/gpt2/{name}"] = gzip.decompress((SHARED / "gpt2" / f"{name}.gz").read_bytes())
    folder = tmp_path / "tok" / "gpt2"
    offline = spec(tmp_path, server.url, name="wikitext103_raw", tokenizer=str(folder), download=False)
    with pytest.raises(DataError, match=r"not in .*tok/gpt2 and downloads are off\. .*longctx\.data prepare"):
        load_tokenizer(offline)
    assert load_tokenizer(dataclasses.replace(offline, download=True)).get_vocab_size() == 50_257
    assert sorted(p.name for p in folder.iterdir()) == ["encoder.json", "vocab.bpe"]
