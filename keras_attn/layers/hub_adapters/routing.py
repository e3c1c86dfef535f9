"""A function that a KerasHub layer's `call` looks up by name, replaced for the duration of that call."""

import contextlib


@contextlib.contextmanager
def routed(owner, name, function):
    """`owner.name` is `function` inside the block (then what it was).

    The attribute is shared by the whole process: a call of it that another thread makes during
    the block runs `function` too.
    """
    original = getattr(owner, name)
    setattr(owner, name, function)
    try:
        yield
    finally:
        setattr(owner, name, original)
