"""The core op as the adapted KerasHub layers call it: with KerasHub's own treatment of masked keys."""

from keras_attn.dispatch.attention import scaled_dot_product_attention


def hub_attention(query, key, value, **options):
    """`scaled_dot_product_attention(query, key, value, **options)` with `zero_unattended_keys=False`.

    KerasHub's attention computes with the masked keys and values as they are (its layers feed it
    finite ones: padding tokens' projections, a cache's zeros), so the adapters skip the core op's
    two selects over all the keys and values, which in a cached decoding step are a pass over the
    whole cache of every layer at every new token.
    """
    return scaled_dot_product_attention(query, key, value, zero_unattended_keys=False, **options)
