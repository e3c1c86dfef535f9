"""A process of the dispatcher's state tests: `python -m tests.dispatch_state_worker MODE ...`.

`update PATH PREFIX COUNT`: merges COUNT entries `PREFIX-i` into the measured-times file at PATH
one at a time (`keras_attn.dispatch.state.update`), as processes measuring at once do.
`fit CACHE`: (with `KERAS_ATTN_CACHE=CACHE`) a tiny model with our `MultiHeadAttention` (`implementation="auto"`, measuring on)
trained one epoch under `tf.distribute.MirroredStrategy` on two logical CPUs; prints the number
of buckets measured into the cache directory CACHE.
"""

import json
import sys

import tensorflow as tf


def update(path, prefix, count):
    from keras_attn.dispatch import measuring
    from keras_attn.dispatch import state

    for index in range(count):
        key = f"{prefix}-{index}"

        def merged(current, key=key, seconds=0.001 * (index + 1)):
            return {"times": {**(current or {}).get("times", {}), key: {"dense": seconds}}}

        state.update(path, measuring._times_problem, merged)


def fit(cache):
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras

    import keras_attn
    from keras_attn.dispatch import cost_model
    from keras_attn.dispatch import measuring
    from keras_attn.dispatch import tuning

    # Dense and blockwise predicted alike (both measured), the others pruned; every kernel holds
    # the tensors it counts once (none heavier than Keras's dense attention).
    seconds = {"dense": 1.0, "chunked": 10.0, "blockwise": 1.0, "strided": 10.0}
    times = {name: dict.fromkeys(cost_model.MODES, {"calls": value}) for name, value in seconds.items()}
    memory = {name: dict.fromkeys(cost_model.MODES, cost_model.ANALYTIC_MEMORY) for name in [*seconds, "keras_dense"]}
    tuning.write_calibration({"time": times, "memory": memory}, cost_model.user_calibration_path(), {})
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        inputs = keras.Input((32, 8))
        attended = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4)(inputs, inputs, use_causal_mask=True)
        model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Flatten()(attended)))
        model.compile(optimizer="sgd", loss="mse")
    x = tf.random.stateless_normal((8, 32, 8), seed=(1, 2))
    model.fit(x, tf.zeros((8, 1)), batch_size=4, epochs=1, verbose=0)
    payload = json.loads(measuring.times_path().read_text())
    print(json.dumps({"buckets": len(payload["times"])}))


if __name__ == "__main__":
    mode, *arguments = sys.argv[1:]
    if mode == "update":
        update(arguments[0], arguments[1], int(arguments[2]))
    else:
        fit(arguments[0])
