"""PG-19 (Rae et al. 2020): one text file per book in the bucket `deepmind-gutenberg`.

Layout under `<root>/pg19/`: `{train,validation,test}/<book_id>.txt` as in the bucket, plus
`<folder>.listing.json`, the bucket listing a completed download was checked against (name, size,
md5 of every book). A folder without a listing (books copied by hand) is used as it is.

Books are taken in file-name order, so "the first N train books" (Yoshida et al. 2020 train on the
first 1,250 alphabetically) is a stable subset.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from longctx.data.corpora import PG19_BUCKET, PG19_LISTING, PG19_SPLIT_FOLDERS, Checksum
from longctx.data.download import DataError, atomic_path, fetch, fetch_json

DOWNLOAD_THREADS = 8


@dataclass(frozen=True)
class Book:
    """One book file of the bucket: `name` like `test/10146.txt`, its size and md5 (hex)."""

    name: str
    size: int
    md5: str

    @property
    def filename(self) -> str:
        return self.name.rsplit("/", 1)[-1]


def list_bucket(folder: str, listing_url: str = PG19_LISTING) -> list[Book]:
    """Every book of a bucket folder, from the storage JSON API (paginated), in file-name order."""
    books: list[Book] = []
    token = None
    while True:
        query = {"prefix": f"{folder}/", "fields": "items(name,size,md5Hash),nextPageToken"}
        if token:
            query["pageToken"] = token
        page = fetch_json(f"{listing_url}?{urllib.parse.urlencode(query)}", f"pg19 {folder} listing")
        for item in page.get("items", []):
            if item["name"].endswith(".txt"):
                md5 = base64.b64decode(item["md5Hash"]).hex()
                books.append(Book(item["name"], int(item["size"]), md5))
        token = page.get("nextPageToken")
        if not token:
            return sorted(books, key=lambda b: b.filename)


def select(books: list[Book], max_documents: int | None) -> list[Book]:
    return books if max_documents is None else books[:max_documents]


def book_files(folder: Path, max_documents: int | None) -> list[Path]:
    """The book files of a local split folder in file-name order (the first `max_documents`)."""
    files = sorted(folder.glob("*.txt"), key=lambda p: p.name)
    return files if max_documents is None else files[:max_documents]


def ensure_split(
    root: Path,
    split: str,
    *,
    download: bool,
    max_documents: int | None,
    bucket_url: str = PG19_BUCKET,
    listing_url: str = PG19_LISTING,
) -> list[Path]:
    """The (first `max_documents`) book files of `split`, downloaded and md5-checked if needed."""
    folder_name = PG19_SPLIT_FOLDERS[split]
    folder = root / "pg19" / folder_name
    listing_path = root / "pg19" / f"{folder_name}.listing.json"
    if listing_path.is_file():
        wanted = select([Book(**b) for b in json.loads(listing_path.read_text())], max_documents)
        missing = [b for b in wanted if not (folder / b.filename).is_file()]
        if not missing:
            return [folder / b.filename for b in wanted]
    elif folder.is_dir() and any(folder.glob("*.txt")) and not download:
        return book_files(folder, max_documents)
    if not download:
        raise DataError(
            f"pg19: no books for split {split} under {folder} and downloads are off. Fetch them with "
            "`python -m longctx.data prepare --config <your config>` where there is network access, or "
            f"put the bucket's `{folder_name}/*.txt` files (gs://deepmind-gutenberg/{folder_name}/) there"
        )
    books = list_bucket(folder_name, listing_url)
    if not books:
        raise DataError(f"pg19: the bucket listing of {folder_name}/ at {listing_url} is empty")
    wanted = select(books, max_documents)

    def get(book: Book) -> Path:
        dest = folder / book.filename
        if dest.is_file() and dest.stat().st_size == book.size:
            return dest
        return fetch(
            f"{bucket_url}/{book.name}",
            dest,
            checksum=Checksum("md5", book.md5),
            size=book.size,
            what=f"pg19 {book.name}",
            quiet=True,
        )

    with ThreadPoolExecutor(min(DOWNLOAD_THREADS, os.cpu_count() or 1)) as pool:
        paths = list(tqdm(pool.map(get, wanted), total=len(wanted), desc=f"download pg19 {folder_name}"))
    with atomic_path(listing_path) as tmp:
        tmp.write_text(json.dumps([b.__dict__ for b in books]))
    return paths
