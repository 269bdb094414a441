"""An int64 input takes int32 data in the Python runtime, as the browser's takes an
Int32Array: the same outputs on both backends (the conversions themselves are conformance
cases, tests/conformance/input_arrays.json)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from relaxweb.errors import InputShapeError
from tests.helpers import build_once, load_bundle, make_model, rand


@pytest.fixture(scope="module")
def gather_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """y = table[ids]: ids int64 [n], table float32 [10, 3]."""
    model = make_model([helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)], [("ids", TensorProto.INT64, ["n"])],
                       ["y"], {"table": rand(10, 3)})
    return build_once(model, tmp_path_factory.mktemp("gather") / "dist")


def test_an_int64_input_takes_int32_data(gather_bundle: Path, backend: str) -> None:
    session = load_bundle(gather_bundle, backend)
    ids = np.array([7, 0, 9, 7], np.int64)
    expected = rand(10, 3)[ids]
    np.testing.assert_array_equal(session.run({"ids": ids})["y"], expected)
    np.testing.assert_array_equal(session.run({"ids": ids.astype(np.int32)})["y"], expected)
    with pytest.raises(InputShapeError, match=r"input 'ids': expected int64 data \(a numpy array of dtype int64 or "
                                              r"int32\), got an array of dtype int16"):
        session.run({"ids": ids.astype(np.int16)})
    with pytest.raises(InputShapeError, match="got a list"):
        session.run({"ids": [7, 0]})
