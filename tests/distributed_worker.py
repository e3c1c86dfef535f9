"""One worker of a tiny multi-worker run for the tests: `python -m tests.distributed_worker ...`.

A two-layer classifier with a dict output, trained by `pipelines.distributed.fit_distributed` on
fixed data (no shuffle, so the global batches are the test's), starting from the weights in
`--initial`. Every worker writes its final weights to `<--weights-out>/<task index>.npz`.
"""

import argparse
import os
import time

import keras
import numpy as np
import tensorflow as tf

from pipelines import distributed

FEATURES = 8


def build_model():
    inputs = keras.Input((FEATURES,), name="features")
    hidden = keras.layers.Dense(16, activation="tanh", name="hidden")(inputs)
    probability = keras.layers.Dense(1, activation="sigmoid", name="probability")(hidden)
    return keras.Model(inputs, {"probability": probability})


def data(examples, seed=0):
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(examples, FEATURES)).astype("float32")
    labels = (features[:, 0] + 0.5 * features[:, 1] > 0).astype("float32")
    return features, labels


def dataset(features, labels, batch_size, seconds_per_batch=0.0):
    batches = tf.data.Dataset.from_tensor_slices((features, {"probability": labels})).batch(batch_size, drop_remainder=True)
    if seconds_per_batch:
        batches = batches.map(lambda x, y: (tf.py_function(lambda t: time.sleep(seconds_per_batch) or t, [x], tf.float32), y))
        batches = batches.map(lambda x, y: (tf.ensure_shape(x, (batch_size, FEATURES)), y))
    return batches


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--initial", required=True)
    parser.add_argument("--weights-out", required=True)
    parser.add_argument("--examples", type=int, default=64)
    parser.add_argument("--global-batch-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--seconds-per-batch", type=float, default=0.0)
    parser.add_argument("--timeout", type=float, default=30)
    args = parser.parse_args()
    strategy = distributed.multi_worker_strategy(args.timeout)
    with strategy.scope():
        model = build_model()
        model.set_weights(list(np.load(args.initial).values()))
        optimizer = keras.optimizers.SGD(args.learning_rate)
    features, labels = data(args.examples)
    distributed.fit_distributed(
        strategy,
        model,
        optimizer,
        distributed.per_example_losses(probability=keras.losses.BinaryCrossentropy()),
        {"probability_accuracy": distributed.accuracy("probability")},
        lambda epoch: dataset(features, labels, args.global_batch_size, args.seconds_per_batch),
        dataset(features, labels, args.global_batch_size),
        epochs=args.epochs,
        global_batch_size=args.global_batch_size,
        output_dir=args.output_dir,
        patience=args.epochs,
        checkpoint_every=args.checkpoint_every,
    )
    task_type, task_id, _ = distributed.cluster_task()
    np.savez(os.path.join(args.weights_out, f"{task_id}.npz"), *model.get_weights(),
             iterations=int(tf.convert_to_tensor(optimizer.iterations.value)))


if __name__ == "__main__":
    main()
