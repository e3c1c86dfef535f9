"""The attention core: `scaled_dot_product_attention` (the dispatcher over `keras_attn.kernels`),
the masked softmax, masks, and the position-bias protocol every kernel asks per block.
"""
