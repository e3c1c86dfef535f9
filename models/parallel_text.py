"""Parallel text as the translator reads it: tab-separated sentence pairs, oriented by language code.

The reader takes any UTF-8 file of tab-separated sentence pairs (the manythings.org/anki
Tatoeba files, plain or zipped): only the first two columns are read, so a third attribution
column is ignored, and `__MACOSX/` entries of a zip are skipped. Which column is the source
is a matter of language codes (`columns=("en", "es")`, `source="es"`, `target="en"`), so the
same code trains either direction and any other pair.
"""

import io
import os
import zipfile

_TEXT_MEMBER_SUFFIX = ".txt"
_IGNORED_MEMBERS = ("__MACOSX/", "_about.txt")


def _read_text(path):
    """The decoded text of `path`, or of the largest `.txt` member of a zip (not `__MACOSX/`)."""
    if not os.path.exists(path):
        raise ValueError(f"`path` does not exist. Received: path={path!r}")
    if not zipfile.is_zipfile(path):
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    with zipfile.ZipFile(path) as archive:
        members = [
            info
            for info in archive.infolist()
            if info.filename.endswith(_TEXT_MEMBER_SUFFIX)
            and not any(part in info.filename for part in _IGNORED_MEMBERS)
        ]
        if not members:
            raise ValueError(f"`path` is a zip without a `.txt` file of pairs. Received: path={path!r}")
        largest = max(members, key=lambda info: info.file_size)
        with archive.open(largest) as handle:
            return io.TextIOWrapper(handle, encoding="utf-8").read()


def read_pairs(path):
    """Reads the first two tab-separated columns of every non-empty line of `path`.

    Args:
        path: a UTF-8 text file of tab-separated pairs, or a zip holding one.

    Returns:
        Two lists of strings, the first and the second column.
    """
    first, second = [], []
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        columns = line.split("\t")
        if len(columns) < 2:
            raise ValueError(
                f"Every line of `path` needs two tab-separated columns. Received: path={path!r}, line {number}={line!r}"
            )
        first.append(columns[0].strip())
        second.append(columns[1].strip())
    if not first:
        raise ValueError(f"`path` holds no sentence pairs. Received: path={path!r}")
    return first, second


def orient_pairs(columns, pair_columns, source, target):
    """Picks the source and target sentence lists by language code.

    Args:
        columns: the two sentence lists returned by `read_pairs`.
        pair_columns: the language codes of the two columns, e.g. `("en", "es")`.
        source: language code of the source side.
        target: language code of the target side.
    """
    pair_columns = tuple(pair_columns)
    if len(pair_columns) != 2 or pair_columns[0] == pair_columns[1]:
        raise ValueError(f"`pair_columns` must be two different codes. Received: pair_columns={pair_columns}")
    for name, code in (("source", source), ("target", target)):
        if code not in pair_columns:
            raise ValueError(f"`{name}` must be one of {pair_columns}. Received: {name}={code!r}")
    if source == target:
        raise ValueError(f"`source` and `target` must differ. Received: source={source!r}, target={target!r}")
    return columns[pair_columns.index(source)], columns[pair_columns.index(target)]
