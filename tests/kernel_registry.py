"""The kernels of the registry (`keras_attn.kernels.KERNELS`) that take a kind of call: what the
tests parametrise over instead of hand-written lists, so a new kernel is tested wherever it applies."""

import keras

from keras_attn.kernels import KERNELS
from keras_attn.kernels.call import AttentionCall

BATCH, LENGTH, HEADS, DEPTH = 2, 16, 2, 4


def kernels_taking(with_bias=False, **fields):
    """Names of the kernels whose `why_unsupported` accepts an `AttentionCall` with these `fields`
    (symbolic `(2, 16, 2, 4)` query, key and value; `with_bias`: a full `(1, heads, 16, 16)` bias)."""
    tensor = keras.KerasTensor((BATCH, LENGTH, HEADS, DEPTH))
    bias = keras.KerasTensor((1, HEADS, LENGTH, LENGTH)) if with_bias else None
    call = AttentionCall(query=tensor, key=tensor, value=tensor, bias=bias, **fields)
    return [name for name, kernel in KERNELS.items() if kernel.why_unsupported(call) is None]


def kernels_refusing(**fields):
    """Names of the kernels that refuse such a call (the complement of `kernels_taking`)."""
    taking = kernels_taking(**fields)
    return [name for name in KERNELS if name not in taking]
