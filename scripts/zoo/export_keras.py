"""Keras applications (``weights=None``: random weights, nothing downloaded) converted with
tf2onnx, in the ``tf`` environment.  Keras 3 models go through ``tf2onnx.convert.from_function``
of a ``tf.function`` with a dynamic NHWC signature (``from_keras`` reads Keras 2 models)."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import tensorflow as tf
import tf2onnx

SEED = 0


def perturb(model: keras.Model) -> keras.Model:
    """Batch-norm statistics and constant weights (biases, gammas) get random values, so a
    dropped bias or scale shows in the numbers."""
    rng = np.random.default_rng(SEED)
    for weight in model.weights:
        value = weight.numpy()
        path = weight.path
        if "moving_variance" in path:
            weight.assign(rng.uniform(0.5, 1.5, value.shape).astype(value.dtype))
        elif "moving_mean" in path:
            weight.assign(rng.uniform(-0.2, 0.2, value.shape).astype(value.dtype))
        elif value.size > 1 and value.min() == value.max() and np.issubdtype(value.dtype, np.floating):
            weight.assign(value + rng.uniform(0, 0.2, value.shape).astype(value.dtype))
    return model


def convert(model: keras.Model, work: Path, opset: int = 17) -> dict[str, Path]:
    signature = (tf.TensorSpec((None, None, None, 3), tf.float32, name="input"),)

    @tf.function(input_signature=signature)
    def serve(image):
        return {"logits": model(image, training=False)}

    path = work / "model.onnx"
    tf2onnx.convert.from_function(serve, input_signature=signature, opset=opset, output_path=str(path))
    return {"model": path}


def application(name: str, work: Path, **options) -> dict[str, Path]:
    """The application as a feature extractor of any image size (``include_top`` needs a
    static size) under a new 10-class head: the usual transfer-learning model."""
    keras.utils.set_random_seed(SEED)
    base = getattr(keras.applications, name)(weights=None, input_shape=(None, None, 3), include_top=False,
                                             pooling="avg", **options)
    model = keras.Sequential([keras.Input((None, None, 3)), base, keras.layers.Dense(10, activation="softmax")])
    return convert(perturb(model), work)


def mobilenet_v3_small(work: Path) -> dict[str, Path]:
    """MobileNetV3 keeps its own head at any size (its pooling keeps the dims, 1x1 convs follow)."""
    keras.utils.set_random_seed(SEED)
    model = keras.applications.MobileNetV3Small(weights=None, input_shape=(None, None, 3), classes=10)
    return convert(perturb(model), work)


def efficientnet_b0(work: Path) -> dict[str, Path]:
    return application("EfficientNetB0", work)


def resnet50(work: Path) -> dict[str, Path]:
    return application("ResNet50", work)


def mobilenet_v2(work: Path) -> dict[str, Path]:
    return application("MobileNetV2", work, alpha=0.35)


def small_cnn(work: Path) -> dict[str, Path]:
    """A small CNN as a Keras user writes one (small enough to commit for CI)."""
    keras.utils.set_random_seed(SEED)
    layers = keras.layers
    model = keras.Sequential([
        keras.Input((None, None, 3)),
        layers.Rescaling(1 / 2.0, offset=0.1),
        layers.Conv2D(16, 3, padding="same", activation="relu"),
        layers.BatchNormalization(),
        layers.MaxPooling2D(2),
        layers.DepthwiseConv2D(3, padding="same", activation="relu6"),
        layers.Conv2D(32, 1, strides=2, activation="swish"),
        layers.BatchNormalization(),
        layers.GlobalAveragePooling2D(),
        # not gelu: tf2onnx 1.17 writes TF 2.21's gelu as "Erfc", which is no ONNX op (onnxruntime
        # rejects the model too)
        layers.Dense(32, activation="tanh"),
        layers.Dense(10, activation="softmax"),
    ])
    return convert(perturb(model), work)
