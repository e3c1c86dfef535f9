"""Command-line conventions every CLI of the apps shares: flag types with ranges, up-front
checks of outputs, and one clear line (exit status 2) for a user's error.

    parser.add_argument("--batch-size", type=positive_int, default=32)
    add_debug_flag(parser)
    args = parser.parse_args(argv)               # a bad value exits 2 before any work
    with user_errors_exit(parser.prog, args.debug):  # a bad data file ends in one line, exit 2
        require_writable_directory(args.export_dir, "--export-dir")
        ...

`--debug` lets the error through with its traceback.
"""

import argparse
import contextlib
import dataclasses
import os
import sys
import tempfile
from pathlib import Path

# What a user's input can cause: our own checks raise ValueError naming the argument and the
# value; a missing, unreadable or unwritable path is an OSError.
USER_ERRORS = (ValueError, OSError)


def _number(kind, text):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
        ) from None


def _checked(kind, accepts, requirement):
    def parse(text):
        value = _number(kind, text)
        if not accepts(value):  # NaN fails every comparison, so it never passes
            raise argparse.ArgumentTypeError(f"must be {requirement}, got {text!r}")
        return value

    parse.__name__ = requirement.replace(" ", "_")  # argparse names the type in some messages
    return parse


positive_int = _checked(int, lambda value: value > 0, "a positive integer")
non_negative_int = _checked(int, lambda value: value >= 0, "a non-negative integer")
positive_float = _checked(float, lambda value: 0 < value < float("inf"), "a positive finite number")
non_negative_float = _checked(float, lambda value: 0 <= value < float("inf"), "a non-negative finite number")
fraction = _checked(float, lambda value: 0 <= value < 1, "a number in [0, 1)")


def int_at_least(minimum):
    """The flag type of integers from `minimum` on."""
    return _checked(int, lambda value: value >= minimum, f"an integer >= {minimum}")


# The key of a config field's smallest value in its `dataclasses.field` metadata (`config_field`).
_MINIMUM = "minimum"


def config_field(default, minimum):
    """A config dataclass field of integers from `minimum` on: its flag (`config_flag_type`) refuses
    smaller values at parse time, naming the flag, before a layer deep in the model refuses them in
    its own terms (a vocabulary size of 1 is `TextVectorization`'s `max_tokens` error)."""
    return dataclasses.field(default=default, metadata={_MINIMUM: minimum})


def parse_bool(text):
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() == "true"


def comma_separated(text):
    """`"mean,max"` -> `("mean", "max")`."""
    return tuple(text.split(","))


def config_flag_type(field, default):
    """The flag type of the config dataclass field `field` from its default: booleans true/false,
    sizes positive integers (from the minimum of a `config_field`), rates (`*dropout`, `*fraction`)
    in [0, 1), other numbers positive, tuples comma-separated, strings as given."""
    name = field.name
    if isinstance(default, bool):
        return parse_bool
    if isinstance(default, tuple):
        return comma_separated
    if _MINIMUM in field.metadata:
        return int_at_least(field.metadata[_MINIMUM])
    if isinstance(default, int):
        return positive_int
    if isinstance(default, float):
        return fraction if name.endswith(("dropout", "fraction")) else positive_float
    return type(default)


def add_debug_flag(parser):
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")


@contextlib.contextmanager
def user_errors_exit(prog, debug=False):
    """Ends a user's error raised in the block as argparse does: `<prog>: error: <message>` on
    stderr, exit status 2, no traceback (`debug` lets it through)."""
    try:
        yield
    except USER_ERRORS as error:
        if debug:
            raise
        message = " ".join((str(error) or repr(error)).split())  # one line
        print(f"{prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2) from None


def require_writable_directory(path, flag):
    """Creates `path` if needed and proves it writable now, before any training; raises OSError
    naming `flag` and the path otherwise."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:
        raise OSError(f"{flag} {os.fspath(path)!r} is not a writable directory: {error.strerror or error}") from None
    return Path(path)
