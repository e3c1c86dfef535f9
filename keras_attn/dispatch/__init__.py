"""The dispatcher: `scaled_dot_product_attention` (validation, then one kernel of
`keras_attn.kernels.KERNELS`), what `implementation="auto"` chooses and why (`cost_model`), and the
calibration it reads (`tuning`, `calibration.json`).

Imports look down only: `keras_attn.dispatch` -> `keras_attn.kernels` -> `keras_attn.core`.
"""
