"""One worker of a tiny multi-worker run for the tests: `python -m tests.distributed_worker ...`.

`--model classifier`: a two-layer classifier with a dict output on fixed random data, batches of
`--global-batch-size` examples. `--model translator`: the tiny translator of
`tests.translation_fixtures` on the first `--examples` pairs of its Tatoeba slice, in the
token-budgeted, length-bucketed batches of `pipelines.translation_data` (`--tokens-per-batch`),
its loss averaged over the real target tokens. Either is trained by
`pipelines.distributed.fit_distributed` with SGD, without shuffling (so the global batches are the
test's), starting from the weights in `--initial`. Every worker writes its final weights and
optimizer step to `<--weights-out>/<task index>.npz`.
"""

import argparse
import os
import threading

import keras
import numpy as np
import tensorflow as tf

from pipelines import distributed

FEATURES = 8
CLASSIFIER, TRANSLATOR = "classifier", "translator"


def build_model():
    inputs = keras.Input((FEATURES,), name="features")
    hidden = keras.layers.Dense(16, activation="tanh", name="hidden")(inputs)
    probability = keras.layers.Dense(1, activation="sigmoid", name="probability")(hidden)
    return keras.Model(inputs, {"probability": probability})


def data(examples, seed=0, infinite_at=None):
    """Random features and their labels; the features of example `infinite_at` are `inf` (a step that overflows)."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(examples, FEATURES)).astype("float32")
    labels = (features[:, 0] + 0.5 * features[:, 1] > 0).astype("float32")
    if infinite_at is not None:
        features[infinite_at] = np.inf
    return features, labels


def dataset(features, labels, batch_size, stall_after=None):
    """The batches; with `stall_after`, the batch after that many never comes (the process waits to be killed)."""
    batches = tf.data.Dataset.from_tensor_slices((features, {"probability": labels})).batch(
        batch_size, drop_remainder=True
    )
    if stall_after is not None:
        batches = batches.enumerate().map(
            lambda index, batch: (tf.py_function(_stalled_at(stall_after), [index, batch[0]], tf.float32), batch[1])
        )
        batches = batches.map(lambda x, y: (tf.ensure_shape(x, (batch_size, FEATURES)), y))
    return batches


def _stalled_at(stall_after):
    def batch_or_wait_forever(index, features):
        if int(index) >= stall_after:
            threading.Event().wait()  # set by nobody: only a kill ends this
        return features

    return batch_or_wait_forever


def build_translator():
    """The tiny translator (one encoder and one decoder block, no dropout) and its vectorizers."""
    from models.translator import build_translator as build
    from tests.translation_fixtures import tiny_config
    from tests.translation_fixtures import tiny_vectorizers

    vectorizers = tiny_vectorizers()
    return build(tiny_config(vectorizers, num_encoder_layers=1, num_decoder_layers=1)), vectorizers


def translation_batches(vectorizers, examples, tokens_per_batch):
    """The first `examples` pairs of the slice in token-budgeted batches (no shuffle): sizes vary, some are odd."""
    from pipelines import translation_data
    from tests.translation_fixtures import spanish_english_slice

    sources, targets = spanish_english_slice()
    return translation_data.make_dataset(vectorizers, sources[:examples], targets[:examples], tokens_per_batch)


def translator_objective():
    """`(losses, metrics, counted)` of the translator for `fit_distributed`: over real target tokens."""
    from models.translator import translation_loss
    from models.vocabulary import PADDING_ID

    return (
        distributed.unreduced(translation_loss()),
        {"token_accuracy": distributed.token_accuracy()},
        distributed.real_tokens(PADDING_ID),
    )


def parse_args(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=(CLASSIFIER, TRANSLATOR), default=CLASSIFIER)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--initial", required=True)
    parser.add_argument("--weights-out", required=True)
    parser.add_argument("--examples", type=int, default=64)
    parser.add_argument("--global-batch-size", type=int, default=16)
    parser.add_argument("--tokens-per-batch", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument(
        "--stall-after", type=int, help="worker 1's input stops after this many batches: a peer lost mid-run, no timer"
    )
    parser.add_argument("--infinite-at", type=int, help="classifier: the example whose features are inf")
    parser.add_argument("--jit-compile", action="store_true")
    parser.add_argument("--mixed-precision", default="float32")
    parser.add_argument(
        "--timeout", type=float, default=120, help="collective timeout: generous, the test machine is shared"
    )
    return parser.parse_args(argv)


def main():
    args = parse_args()
    with distributed.exit_when_a_worker_is_lost():
        train(args)


def train(args):
    keras.config.set_dtype_policy(args.mixed_precision)
    strategy = distributed.multi_worker_strategy(args.timeout)
    with strategy.scope():
        if args.model == TRANSLATOR:
            model, vectorizers = build_translator()
        else:
            model = build_model()
        model.set_weights(list(np.load(args.initial).values()))
        optimizer = distributed.loss_scaled(keras.optimizers.SGD(args.learning_rate), args.mixed_precision)
    if args.model == TRANSLATOR:
        losses, metrics, counted = translator_objective()
        batches = translation_batches(vectorizers, args.examples, args.tokens_per_batch)
        train_data, validation_data = (lambda epoch: batches), batches
    else:
        losses = distributed.unreduced({"probability": keras.losses.BinaryCrossentropy()})
        metrics, counted = {"probability_accuracy": distributed.accuracy("probability")}, distributed.per_example
        features, labels = data(args.examples, infinite_at=args.infinite_at)
        stall_after = args.stall_after if distributed.cluster_task()[1] == 1 else None
        train_data = lambda epoch: dataset(features, labels, args.global_batch_size, stall_after)  # noqa: E731
        validation_data = dataset(*data(args.examples), args.global_batch_size)
    distributed.fit_distributed(
        strategy,
        model,
        optimizer,
        losses,
        metrics,
        train_data,
        validation_data,
        epochs=args.epochs,
        output_dir=args.output_dir,
        counted=counted,
        jit_compile=args.jit_compile,
        patience=args.epochs,
        checkpoint_every=args.checkpoint_every,
    )
    task_type, task_id, _ = distributed.cluster_task()
    np.savez(
        os.path.join(args.weights_out, f"{task_id}.npz"),
        *model.get_weights(),
        iterations=int(tf.convert_to_tensor(optimizer.iterations.value)),
    )


if __name__ == "__main__":
    main()
