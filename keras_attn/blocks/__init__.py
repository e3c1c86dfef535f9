"""The Transformer blocks (encoder, decoder, feed-forward) and pooling that take any attention
family.
"""
