"""Passes over IRModules, one per file; ``pipeline.py`` lists them in order."""

from .canonicalize_bindings import canonicalize_bindings
from .compress_weights import compress_weights
from .context import DEFAULT_KV_PAGE_SIZE, PassContext
from .fold_scalar_constants import fold_scalar_constants
from .fuse_attention import fuse_attention
from .fuse_ops import fuse_ops
from .legalize_ops import legalize_ops
from .place_kv_caches import place_kv_caches
from .lower_shapes_to_host import lower_shapes_to_host
from .page_kv_caches import page_kv_caches
from .pipeline import DEFAULT_OPT_LEVEL, OPT_LEVELS, PIPELINE, pipeline, run_pipeline
from .plan_memory import plan_memory
from .schedule_programs import schedule_programs
from .share_programs import share_programs
from .split_wide_concats import split_wide_concats
from .split_wide_einsums import split_wide_einsums

__all__ = [
    "DEFAULT_KV_PAGE_SIZE", "DEFAULT_OPT_LEVEL", "OPT_LEVELS", "PIPELINE", "PassContext", "canonicalize_bindings", "compress_weights", "fold_scalar_constants", "fuse_attention", "fuse_ops", "legalize_ops", "lower_shapes_to_host", "page_kv_caches", "pipeline",
    "place_kv_caches", "plan_memory", "run_pipeline", "schedule_programs", "share_programs", "split_wide_concats",
    "split_wide_einsums",
]
