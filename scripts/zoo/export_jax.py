"""A JAX model converted the way JAX users reach ONNX: ``jax2tf.convert`` (graph
serialization, shape-polymorphic batch) then tf2onnx, in the ``tf`` environment."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import tensorflow as tf
import tf2onnx
from jax.experimental import jax2tf


def byte_classifier(work: Path) -> dict[str, Path]:
    """A file-type classifier over the first 512 bytes of a file (the shape of Magika):
    byte embedding, two 1-D convolutions with max pooling, global average, dense, softmax."""
    keys = jax.random.split(jax.random.PRNGKey(0), 8)
    params = {
        "embed": jax.random.normal(keys[0], (256, 16)) * 0.5,
        "conv1": jax.random.normal(keys[1], (5, 16, 32)) * 0.2, "b1": jax.random.normal(keys[2], (32,)) * 0.1,
        "conv2": jax.random.normal(keys[3], (3, 32, 32)) * 0.2, "b2": jax.random.normal(keys[4], (32,)) * 0.1,
        "dense": jax.random.normal(keys[5], (32, 8)) * 0.3, "b3": jax.random.normal(keys[6], (8,)) * 0.1,
    }

    def conv(x, w, b):
        y = jax.lax.conv_general_dilated(x, w, (1,), "SAME", dimension_numbers=("NWC", "WIO", "NWC"))
        return jax.nn.relu(y + b)

    def pool(x):
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 4, 1), (1, 4, 1), "VALID")

    def predict(data):
        x = params["embed"][data]  # [batch, 512, 16]
        x = pool(conv(x, params["conv1"], params["b1"]))
        x = pool(conv(x, params["conv2"], params["b2"]))
        x = jnp.mean(x, axis=1)
        return jax.nn.softmax(x @ params["dense"] + params["b3"])

    # enable_xla=False: plain TF ops (Conv2D, MaxPool...) rather than Xla* ops tf2onnx cannot convert
    converted = jax2tf.convert(predict, polymorphic_shapes=["(b, 512)"], native_serialization=False, enable_xla=False)
    signature = (tf.TensorSpec((None, 512), tf.int32, name="bytes"),)
    serve = tf.function(converted, input_signature=signature, autograph=False)
    path = work / "model.onnx"
    tf2onnx.convert.from_function(serve, input_signature=signature, opset=17, output_path=str(path))
    return {"model": path}
