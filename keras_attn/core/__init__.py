"""The attention core the kernels build on: the masked softmax, masks, segments, and the
position-bias protocol every kernel asks per block. The dispatcher over the kernels
(`scaled_dot_product_attention`) lives above them, in `keras_attn.dispatch`.
"""
