"""The module attribute of a paged KV cache's layout, which ``passes/page_kv_caches.py`` writes
and the bundle writer turns into the manifest's ``kv_pool`` (``docs/bundle-format.md``).

``module.attrs[KV_POOL]`` is a dict: ``pages`` (per pool), ``page_size`` (positions per page),
``pages_per_sequence`` (a page table's entries), ``capacity`` (the longest sequence),
``page_table`` (the name of the page table input) and ``replaced_size_vars`` (the size
variables the pools replaced, the past length among them: their bounds sized the pools).
"""

KV_POOL = "kv_pool"
