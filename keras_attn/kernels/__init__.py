"""The attention kernels of the one core, one module each, and their one registry, `KERNELS`.

A kernel module says what it cannot take and how it attends, for one `AttentionCall`
(`keras_attn.kernels.call`): `why_unsupported(call)` (a message naming what it needs and what it
received, or `None`) and `attend(call)`. The dispatcher
(`keras_attn.dispatch.attention.scaled_dot_product_attention`, `implementation=`), the kernels table of the
families guide (`kernels_table`) and the tests iterate `KERNELS`: a new kernel is one module and one
line here. The numerics the kernels share live in `keras_attn.core.softmax` (dense) and
`keras_attn.kernels.streaming_softmax` (the kernels that see a row's keys in pieces).
"""

from keras_attn.kernels import blockwise
from keras_attn.kernels import chunked
from keras_attn.kernels import dense
from keras_attn.kernels import strided

KERNELS = {
    "dense": dense,
    "chunked": chunked,
    "blockwise": blockwise,
    "strided": strided,
}


def kernels_table():
    """The Markdown table of the registry (name, module, what it is), the one in the families guide.

    >>> print(kernels_table().splitlines()[2])
    | `dense` | `keras_attn.kernels.dense` | The dense attention kernel: the full `(query_len, key_len)` weights, the reference path. |
    """
    rows = ["| kernel | module | what it is |", "| --- | --- | --- |"]
    for name, module in KERNELS.items():
        rows.append(f"| `{name}` | `{module.__name__}` | {module.__doc__.strip().splitlines()[0]} |")
    return "\n".join(rows)
