"""Parallel-text data for the translator: reading, a seeded split, vocabularies and `tf.data`.

The reader takes any UTF-8 file of tab-separated sentence pairs (the manythings.org/anki
Tatoeba files, plain or zipped): only the first two columns are read, so a third attribution
column is ignored, and `__MACOSX/` entries of a zip are skipped. Which column is the source
is a matter of language codes (`columns=("en", "es")`, `source="es"`, `target="en"`), so the
same code trains either direction and any other pair.

Tokens are words and punctuation marks: the standardisation splits every character that is not
a letter, a digit, an apostrophe or a space into its own token, with Unicode classes (`\\p{L}`,
`\\p{N}`), so `¿`, `¡` and accented letters are handled like ASCII and accents are kept.
The source side is lowercased (Unicode-aware); the target side keeps its case so that the
detokenised output can be scored with cased BLEU. The target vocabulary holds `[start]` and
`[end]` right after the padding and OOV tokens; they are added around the token ids, never
written into the text (the standardisation would split their brackets).
"""

import io
import json
import os
import zipfile

import keras
import numpy as np
import tensorflow as tf

from pipelines.common import file_sha256
from pipelines.common import write_json_atomic

START_TOKEN = "[start]"
END_TOKEN = "[end]"
PADDING_ID = 0
_SEPARATE_PUNCTUATION = r"([^\p{L}\p{N}\p{M}\s'])"
_TEXT_MEMBER_SUFFIX = ".txt"
_IGNORED_MEMBERS = ("__MACOSX/", "_about.txt")


def _separate_punctuation(text):
    text = tf.strings.regex_replace(text, _SEPARATE_PUNCTUATION, r" \1 ")
    text = tf.strings.regex_replace(text, r"\s+", " ")
    return tf.strings.strip(text)


@keras.saving.register_keras_serializable(package="keras_attn")
def standardize_keep_case(text):
    """Splits punctuation into tokens and collapses whitespace; keeps case and accents."""
    return _separate_punctuation(text)


@keras.saving.register_keras_serializable(package="keras_attn")
def standardize_lowercase(text):
    """`standardize_keep_case` after a Unicode-aware lowercasing (`Ñ` -> `ñ`, `É` -> `é`)."""
    return _separate_punctuation(tf.strings.lower(text, encoding="utf-8"))


def _standardizer(lowercase):
    return standardize_lowercase if lowercase else standardize_keep_case


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
                f"Every line of `path` needs two tab-separated columns. Received: path={path!r}, "
                f"line {number}={line!r}"
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


def split_indices(num_pairs, seed, validation_fraction=0.1, test_fraction=0.1):
    """A fixed, seeded permutation of `range(num_pairs)` cut into train/validation/test.

    Returns:
        A dict `{"train": ..., "validation": ..., "test": ...}` of sorted int arrays.
    """
    for name, fraction in (("validation_fraction", validation_fraction), ("test_fraction", test_fraction)):
        if not 0.0 < fraction < 0.5:
            raise ValueError(f"`{name}` must be in (0, 0.5). Received: {name}={fraction}")
    order = np.random.default_rng(seed).permutation(num_pairs)
    num_test = max(1, int(round(num_pairs * test_fraction)))
    num_validation = max(1, int(round(num_pairs * validation_fraction)))
    if num_test + num_validation >= num_pairs:
        raise ValueError(f"`num_pairs` is too small to split. Received: num_pairs={num_pairs}")
    return {
        "test": np.sort(order[:num_test]),
        "validation": np.sort(order[num_test : num_test + num_validation]),
        "train": np.sort(order[num_test + num_validation :]),
    }


def write_split(path, split, data_path, seed):
    """Records the split (with the seed and the data file's sha256) next to a run."""
    write_json_atomic(
        path,
        {
            "data": os.path.abspath(data_path),
            "sha256": file_sha256(data_path),
            "seed": seed,
            "sizes": {name: int(len(indices)) for name, indices in split.items()},
            **{name: indices.tolist() for name, indices in split.items()},
        },
    )


def read_split(path):
    with open(path, encoding="utf-8") as handle:
        payload = json.load(handle)
    return {name: np.asarray(payload[name], np.int64) for name in ("train", "validation", "test")}


def make_vectorizer(vocabulary=None, lowercase=False, max_tokens=None, sequence_length=None):
    """A `TextVectorization` with the project's standardisation (word and punctuation tokens).

    With `sequence_length=None` it returns ragged ids (for `tf.data`), otherwise ids padded or
    truncated to `sequence_length` (for serving).
    """
    return keras.layers.TextVectorization(
        max_tokens=max_tokens,
        standardize=_standardizer(lowercase),
        split="whitespace",
        output_mode="int",
        output_sequence_length=sequence_length,
        ragged=sequence_length is None,
        vocabulary=vocabulary,
    )


def build_vocabularies(sources, targets, source_vocabulary_size, target_vocabulary_size):
    """Adapts the source and target vocabularies on the training sentences.

    Returns:
        `(source_vocabulary, target_vocabulary)`, lists of tokens without the padding and OOV
        entries (`TextVectorization(vocabulary=...)` adds them back at ids 0 and 1); the target
        list starts with `[start]` and `[end]` (ids 2 and 3).
    """
    vocabularies = []
    for texts, size, lowercase, reserved in (
        (sources, source_vocabulary_size, True, []),
        (targets, target_vocabulary_size, False, [START_TOKEN, END_TOKEN]),
    ):
        vectorizer = make_vectorizer(lowercase=lowercase, max_tokens=size - len(reserved))
        vectorizer.adapt(tf.data.Dataset.from_tensor_slices(list(texts)).batch(4096))
        tokens = vectorizer.get_vocabulary(include_special_tokens=False)
        vocabularies.append(reserved + [str(token) for token in tokens])
    return tuple(vocabularies)


def save_vocabulary(path, vocabulary):
    """One token a line, written atomically."""
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write("".join(f"{token}\n" for token in vocabulary))
    os.replace(temporary, path)


def load_vocabulary(path):
    with open(path, encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]


class TranslationVectorizers:
    """The source and target `TextVectorization` layers and the ids of the special tokens.

    Args:
        source_vocabulary: source tokens (no padding/OOV entries).
        target_vocabulary: target tokens starting with `[start]`, `[end]`.
        sequence_length: the longest source and the longest target (with start and end tokens)
            the model handles.
    """

    def __init__(self, source_vocabulary, target_vocabulary, sequence_length):
        if target_vocabulary[:2] != [START_TOKEN, END_TOKEN]:
            raise ValueError(
                f"`target_vocabulary` must start with {[START_TOKEN, END_TOKEN]}. "
                f"Received: target_vocabulary[:2]={target_vocabulary[:2]}"
            )
        self.source_vocabulary = list(source_vocabulary)
        self.target_vocabulary = list(target_vocabulary)
        self.sequence_length = sequence_length
        self.source = make_vectorizer(self.source_vocabulary, lowercase=True)
        self.target = make_vectorizer(self.target_vocabulary, lowercase=False)
        target_tokens = self.target.get_vocabulary()
        self.start_id = target_tokens.index(START_TOKEN)
        self.end_id = target_tokens.index(END_TOKEN)

    @property
    def source_vocabulary_size(self):
        return self.source.vocabulary_size()

    @property
    def target_vocabulary_size(self):
        return self.target.vocabulary_size()

    def save(self, directory):
        save_vocabulary(os.path.join(directory, "source_vocabulary.txt"), self.source_vocabulary)
        save_vocabulary(os.path.join(directory, "target_vocabulary.txt"), self.target_vocabulary)

    @classmethod
    def load(cls, directory, sequence_length):
        return cls(
            load_vocabulary(os.path.join(directory, "source_vocabulary.txt")),
            load_vocabulary(os.path.join(directory, "target_vocabulary.txt")),
            sequence_length,
        )

    def source_ids(self, sentences):
        """`(batch, sequence_length)` int32 source ids, zero-padded, truncated if longer."""
        ragged = self.source(tf.constant(list(sentences)))[:, : self.sequence_length]
        return tf.cast(ragged.to_tensor(PADDING_ID, shape=(None, self.sequence_length)), tf.int32)

    def target_tokens(self, ids):
        """Turns a row of target ids (stopping at `[end]` or padding) into a token list."""
        vocabulary = self.target.get_vocabulary()
        tokens = []
        for token_id in np.asarray(ids).tolist():
            if token_id in (self.end_id, PADDING_ID):
                break
            if token_id != self.start_id:
                tokens.append(vocabulary[token_id])
        return tokens


_NO_SPACE_BEFORE = r" ([.,!?;:%)\]}»…])"
_NO_SPACE_AFTER = r"([¿¡(\[{«]) "


def detokenize(tokens):
    """Joins word and punctuation tokens back into text (`tf.string` tensor or Python lists).

    Args:
        tokens: a `tf.string` tensor of space-joined tokens, or a list of token lists.
    """
    if isinstance(tokens, (list, tuple)):
        joined = tf.constant([" ".join(row) for row in tokens], tf.string)
        return [text.decode("utf-8") for text in detokenize(joined).numpy()]
    text = tf.strings.regex_replace(tokens, _NO_SPACE_BEFORE, r"\1")
    text = tf.strings.regex_replace(text, _NO_SPACE_AFTER, r"\1")
    text = tf.strings.regex_replace(text, r" ' ", "'")
    return tf.strings.regex_replace(text, r"\s+' ", "' ")


def _teacher_forcing(source_ids, target_ids):
    """`((source, target_in), target_out)`: the decoder reads `[start] w1 .. wn` for `w1 .. [end]`."""
    return (source_ids, target_ids[:-1]), target_ids[1:]


def bucket_boundaries(sequence_length, step=4):
    """Upper bounds (exclusive) of the length buckets, up to `sequence_length + 1`."""
    boundaries = list(range(step + 1, sequence_length + 1, step))
    return boundaries + [sequence_length + 1]


def make_dataset(
    vectorizers,
    sources,
    targets,
    tokens_per_batch=4096,
    shuffle=False,
    seed=0,
    drop_long=True,
    max_batch_size=None,
):
    """A teacher-forcing `tf.data.Dataset` of `((source, target_in), target_out)` int32 batches.

    Pairs are vectorised once and cached; batches group sentences of similar length
    (`bucket_by_sequence_length`, padded to the bucket boundary so that compiled shapes are few)
    with about `tokens_per_batch` tokens each, and are prefetched.

    Args:
        vectorizers: a `TranslationVectorizers`.
        sources, targets: lists of sentences.
        tokens_per_batch: padded tokens per batch (per side); short buckets get more sentences.
        shuffle: shuffle pairs each epoch (training).
        seed: shuffle seed.
        drop_long: drop pairs longer than `vectorizers.sequence_length` (else truncate them).
        max_batch_size: optional cap on the sentences in a batch.
    """
    if len(sources) != len(targets):
        raise ValueError(
            f"`sources` and `targets` must have the same length. Received: {len(sources)} and {len(targets)}"
        )
    length = vectorizers.sequence_length
    start = tf.constant([vectorizers.start_id], tf.int64)
    end = tf.constant([vectorizers.end_id], tf.int64)

    def vectorize(source_text, target_text):
        source_ids = vectorizers.source(source_text)
        target_ids = vectorizers.target(target_text)
        return source_ids, target_ids

    def add_special_tokens(source_ids, target_ids):
        target_ids = tf.concat([start, target_ids, end], axis=0)
        return tf.cast(source_ids, tf.int32), tf.cast(target_ids, tf.int32)

    def fits(source_ids, target_ids):
        return tf.logical_and(tf.size(source_ids) <= length, tf.size(target_ids) <= length + 1)

    def truncate(source_ids, target_ids):
        return source_ids[:length], tf.concat([target_ids[:length], target_ids[-1:]], 0)[: length + 1]

    dataset = tf.data.Dataset.from_tensor_slices((list(sources), list(targets)))
    dataset = dataset.batch(4096).map(vectorize).unbatch().map(add_special_tokens)
    dataset = dataset.filter(fits) if drop_long else dataset.map(truncate)
    dataset = dataset.map(_teacher_forcing).cache()
    if shuffle:
        dataset = dataset.shuffle(len(sources), seed=seed, reshuffle_each_iteration=True)
    boundaries = bucket_boundaries(length)
    # One batch size per bucket, plus one for the (empty) bucket past the last boundary.
    batch_sizes = [max(1, tokens_per_batch // (boundary - 1)) for boundary in boundaries + boundaries[-1:]]
    if max_batch_size:
        batch_sizes = [min(size, max_batch_size) for size in batch_sizes]
    dataset = dataset.bucket_by_sequence_length(
        element_length_func=lambda inputs, target_out: tf.maximum(
            tf.size(inputs[0]), tf.size(target_out)
        ),
        bucket_boundaries=boundaries,
        bucket_batch_sizes=batch_sizes,
        pad_to_bucket_boundary=True,
    )
    return dataset.prefetch(tf.data.AUTOTUNE)
