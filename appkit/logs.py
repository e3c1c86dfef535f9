"""Known-harmless framework log lines, dropped only around the calls known to emit them.

    with dropping_log_messages(*TF_TABLE_INITIALIZER):
        archive.write_out(path)

Any other message of the logger, and the same message anywhere else, still shows.
"""

import contextlib
import logging
import os
import sys

# (logger, message prefix) of the known lines. TensorFlow writes this one for every graph it
# serialises (a SavedModel, tf2onnx's frozen graph) that holds a vectoriser's lookup table, whose
# initializer has no collection entry; the table travels all the same (the fresh-process serving
# check and the ONNX parity check prove it).
TF_TABLE_INITIALIZER = ("tensorflow", "Issue encountered when serializing table_initializer")
# onnxruntime's advice before `quantize_dynamic`: pre-processing changed neither the quantised
# IMDB model's outputs nor its size, so the advice is noise here.
ORT_QUANTIZATION_PREPROCESSING = ("", "Please consider to run pre-processing before quantization")


# TensorFlow's C++ log level for the apps (a user's own setting wins): errors included, because on a
# machine without a GPU the one error TensorFlow logs is its failed CUDA probe; a real failure
# reaches the user as the Python exception it raises. Level 1 and up also hides the INFO lines of
# `tf.data` ("Filling up shuffle buffer").
APP_TF_LOG_LEVEL = "3"


def quiet_tensorflow_import():
    """Sets `TF_CPP_MIN_LOG_LEVEL` (unless set) and imports TensorFlow with the lines its libraries
    write while loading dropped, when that level hides INFO lines.

    Those lines (no CUDA driver found, absl's "All log messages before absl::InitializeLog() is
    called are written to STDERR") come before TensorFlow reads its log level, so only closing the
    stderr file descriptor while `import tensorflow` runs keeps them from a user who runs an app
    directly (`python -m pipelines.train_translator`). Called by the app packages' `__init__`.
    """
    level = os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", APP_TF_LOG_LEVEL)
    if "tensorflow" in sys.modules or level == "0":
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            try:
                import tensorflow  # noqa: F401
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


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
