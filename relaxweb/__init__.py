"""relaxweb: compile ONNX models into static WebGPU bundles with symbolic shapes.

The Python API matches the command line (``relaxweb/api.py``)::

    >>> import relaxweb
    >>> bundle = relaxweb.build("mlp.onnx", "dist/mlp", bounds={"batch": 64})  # relaxweb build
    >>> outputs = relaxweb.load("dist/mlp").run({"x": x})                     # relaxweb run
    >>> expected = relaxweb.run_reference("mlp.onnx", {"x": x})               # relaxweb run --reference
    >>> print(relaxweb.inspect("dist/mlp"))                                   # relaxweb inspect
    >>> relaxweb.load("dist/llama").generate("The if", max_new_tokens=64).text  # relaxweb generate

Every user error is a :class:`RelaxwebError` carrying the message the command line prints.
"""

__version__ = "0.1.0"

from .api import (
    Bundle, ModelReport, TensorSpec, build, inspect, load, profile_in_browser, run_batch_in_browser, run_in_browser,
    run_reference,
)
from .errors import InputShapeError, RelaxwebError, RunCheckError, UnsupportedModelError
from .runtime import Generation, GpuTensor, Profile, Session

__all__ = [
    "Bundle", "Generation", "GpuTensor", "InputShapeError", "ModelReport", "Profile", "RelaxwebError", "RunCheckError", "Session",
    "TensorSpec", "UnsupportedModelError", "build", "inspect", "load", "profile_in_browser", "run_batch_in_browser", "run_in_browser",
    "run_reference",
]
