"""Packed rows built by hand for the per-document tests: documents side by side, then padding."""

import numpy as np


def packed_rows(rng, lengths, row_length, features):
    """`(values, segment_ids, documents)`: random float32 `values` `(rows, row_length, features)`,
    int32 `segment_ids` numbering row `r`'s documents of `lengths[r]` tokens `1, 2, ...` from its
    start (0 after them), and `documents`, `(row, segment id, its values)` for each document."""
    values = rng.standard_normal((len(lengths), row_length, features)).astype("float32")
    segment_ids = np.zeros((len(lengths), row_length), "int32")
    documents = []
    for row, row_lengths in enumerate(lengths):
        start = 0
        for segment, length in enumerate(row_lengths, start=1):
            segment_ids[row, start : start + length] = segment
            documents.append((row, segment, values[row, start : start + length]))
            start += length
    return values, segment_ids, documents
