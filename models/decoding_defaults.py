"""How a trained translator decodes unless told otherwise: scoring, `pipelines.translate` and the
export read these (the module imports nothing, so `pipelines.translate --export` still runs no
model code).

Beam search with GNMT length normalisation (Wu et al. 2016: the score `log p / ((5 + length) /
6) ** LENGTH_PENALTY`) is the default; the SavedModel serves it as `serving_default` and greedy
decoding as `GREEDY_SIGNATURE`.
"""

BEAM_SIZE = 4
LENGTH_PENALTY = 0.6
GREEDY_SIGNATURE = "greedy"
