"""The softmax attention layers (`MultiHeadAttention` and the layers built on it), the capabilities
every family declares, and `convert`.
"""
