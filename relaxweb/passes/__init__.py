"""Passes over IRModules, one per file; ``pipeline.py`` lists them in order."""

from .legalize_ops import legalize_ops
from .lower_shapes_to_host import lower_shapes_to_host
from .pipeline import PIPELINE, run_pipeline
from .plan_memory import plan_memory

__all__ = ["PIPELINE", "legalize_ops", "lower_shapes_to_host", "plan_memory", "run_pipeline"]
