"""Known-harmless framework log lines, dropped only around the calls known to emit them.

    with dropping_log_messages(*TF_TABLE_INITIALIZER):
        archive.write_out(path)

Any other message of the logger, and the same message anywhere else, still shows.
"""

import contextlib
import logging

# (logger, message prefix) of the known lines. TensorFlow writes this one for every graph it
# serialises (a SavedModel, tf2onnx's frozen graph) that holds a vectoriser's lookup table, whose
# initializer has no collection entry; the table travels all the same (the fresh-process serving
# check and the ONNX parity check prove it).
TF_TABLE_INITIALIZER = ("tensorflow", "Issue encountered when serializing table_initializer")
# onnxruntime's advice before `quantize_dynamic`: pre-processing changed neither the quantised
# IMDB model's outputs nor its size (BENCHMARKS.md).
ORT_QUANTIZATION_PREPROCESSING = ("", "Please consider to run pre-processing before quantization")


class _DropPrefixes(logging.Filter):
    def __init__(self, prefixes):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record):
        return not record.getMessage().startswith(self.prefixes)


@contextlib.contextmanager
def dropping_log_messages(logger_name, *prefixes):
    """While the block runs, the records logged on the logger `logger_name` (`""`: the root
    logger) whose message starts with one of `prefixes` are dropped.

    >>> import logging
    >>> with dropping_log_messages("demo", "noise"):
    ...     logging.getLogger("demo").warning("noise: dropped")
    """
    logger = logging.getLogger(logger_name or None)
    dropping = _DropPrefixes(tuple(prefixes))
    logger.addFilter(dropping)
    try:
        yield
    finally:
        logger.removeFilter(dropping)
