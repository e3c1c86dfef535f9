"""What a converted model's training step leaves held after it, against Keras's layer's.

TensorFlow keeps what a traced graph holds as constants for the graph's life: a `zeros_like` of
a static shape folded into one by its graph optimiser, the zeros a `tf.cond`'s gradient fills in
for the branch not taken. A converted layer must hold no more between steps than the layer it
replaced. Run in a process whose CPU allocator keeps statistics (`TF_CPU_ALLOCATOR_USE_BFC` is read
when TensorFlow starts).
"""

import os
import subprocess
import sys
import textwrap

_HELD_SCRIPT = textwrap.dedent(
    """
    import keras
    import tensorflow as tf

    import keras_attn

    def current():
        return tf.config.experimental.get_memory_info("CPU:0")["current"]

    def held_after_a_step(convert):
        keras.utils.set_random_seed(0)
        query, value = keras.Input((512, 256)), keras.Input((512, 256))
        mask = keras.Input((512, 512), dtype="bool")
        output = keras.layers.MultiHeadAttention(4, 128)(query, value, attention_mask=mask)
        model = keras.Model([query, value, mask], output)
        if convert:
            model = keras_attn.convert(model, implementation="dense")
        inputs = [tf.random.normal((4, 512, 256)), tf.random.normal((4, 512, 256)), tf.ones((4, 512, 512), bool)]

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(inputs, training=True) ** 2)
            return tape.gradient(loss, model.trainable_variables)

        before = current()
        [gradient.numpy() for gradient in step()]
        return current() - before

    print(held_after_a_step(False), held_after_a_step(True))
    """
)


def test_a_converted_layer_holds_no_more_between_steps_than_keras():
    # Per layer and signature the converted layer once held two more tensors than Keras's: its
    # output's size (the dense kernel zeroing rows without keys against a `zeros_like`) and its
    # values' (a `tf.cond` around Keras's mean rows). Each is 4 MiB here.
    env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_ATTN_MEASURE": "0"}
    done = subprocess.run([sys.executable, "-c", _HELD_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    keras_held, converted_held = (int(figure) for figure in done.stdout.split()[-2:])
    assert converted_held <= keras_held + 2**20, (keras_held, converted_held)
