"""ONNX LSTM, GRU and RNN: one ``lstm`` / ``gru`` / ``rnn`` call each (``relaxweb/ops/recurrent.py``).

The optional inputs given (``B``, ``sequence_lens``, ``initial_h``, ``initial_c``, ``P``)
become the call's optional arguments, named in its ``optional`` attribute; the activation
attributes are resolved into one ``(name, alpha, beta)`` per function and direction.
``hidden_size`` may be omitted when R's last dimension is a constant.  The outputs are the
items of the call's tuple (``Y``, ``Y_h``, and ``Y_c`` for an LSTM).
"""

from __future__ import annotations

from ...ir.expr import TupleGetItem, tensor_dtype, tensor_shape
from ...ir.symbolic import as_int
from ...ops import call_op
from ...ops.recurrent import resolve_activations
from .manipulation import fail
from .nn import text_attr
from .registry import converter

# ONNX's optional inputs (positions 3 on) by the names the ops give them.
OPTIONAL_NAMES = ("bias", "sequence_lens", "initial_h", "initial_c", "peepholes")


@converter("LSTM", "GRU", "RNN")
def convert_recurrent(context, node, inputs):
    cell = node.op_type.lower()
    attrs = context.attributes(node)
    direction = text_attr(attrs, "direction", "forward")
    hidden = attrs.get("hidden_size")
    if hidden is None:
        hidden = as_int(tensor_shape(inputs[2])[-1])
        if hidden is None:
            raise fail(node, "hidden_size is not given and R's last dimension is not a constant")
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in attrs.get("activations", ())]
    options = {
        "direction": direction, "hidden_size": int(hidden), "layout": int(attrs.get("layout", 0)),
        "activations": resolve_activations(cell, direction, names, attrs.get("activation_alpha"),
                                           attrs.get("activation_beta")),
        "clip": float(attrs["clip"]) if "clip" in attrs else None,
    }
    if cell == "lstm":
        options["input_forget"] = bool(attrs.get("input_forget", 0))
    if cell == "gru":
        options["linear_before_reset"] = bool(attrs.get("linear_before_reset", 0))
    optional, args = [], list(inputs[:3])
    for name, value in zip(OPTIONAL_NAMES, inputs[3:]):
        if value is None:
            continue
        if name == "sequence_lens" and tensor_dtype(value) != "int32":
            value = call_op("cast", value, dtype="int32")
        optional.append(name)
        args.append(value)
    result = context.builder.emit(call_op(cell, *args, optional=optional, **options), node.name or cell)
    return [TupleGetItem(result, index) for index in range(3 if cell == "lstm" else 2)]
