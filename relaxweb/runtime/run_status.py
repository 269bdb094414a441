"""The run status: where a bundle's kernels report the first error they find in a run's data
(an index out of range of its axis), read back with the outputs.

A kernel that checks the run's data binds the status as its last buffer (a call site's
``{"status": 0}``); the status is :data:`~relaxweb.errors.STATUS_WORDS` u32 words, word 0
the site of the first error (0: none), 1-based into the manifest's ``run_errors``, then the
values its message shows.  Each backend clears it before a run's first dispatch and reads it
with the outputs (and with a value read mid-run, whose value an error may have made
meaningless); :func:`check_run_status` turns what it read into the run's error
(``relaxweb/ir/error_sites.py`` has the compiler's side; ``runtime_js/run_status.js`` is the twin).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

from relaxweb.errors import STATUS_WORDS, RelaxwebError, RunCheckError, run_error_message

STATUS_BYTES = 4 * STATUS_WORDS
CLEARED = bytes(STATUS_BYTES)


def check_run_status(manifest: Mapping[str, Any], data: bytes | bytearray | memoryview) -> None:
    """Raise the run's error when the status ``data`` (its bytes, as read back) holds one:
    a :class:`~relaxweb.errors.RunCheckError` worded from the manifest's ``run_errors``."""
    site, *values = struct.unpack(f"<I{STATUS_WORDS - 1}i", bytes(data[:STATUS_BYTES]))
    if site == 0:
        return
    sites = manifest.get("run_errors", [])
    if site > len(sites):
        raise RelaxwebError(f"a kernel reported error site {site}, but the manifest's run_errors has {len(sites)}: "
                            "the bundle is damaged")
    entry = sites[site - 1]
    raise RunCheckError(run_error_message(entry["node"], entry["op"], entry["message"], values))
