"""validate_manifest: check a bundle's manifest.json before anything in it is used.

A bundle comes from strangers.  Every field the runtime reads is checked against the one
schema both runtimes share, ``relaxweb/runtime_js/manifest-schema.json`` (types, ranges,
file names, indices into the manifest's own arrays), and then against the facts a schema
cannot state (a weight lies inside its shard, a call site binds as many buffers as its kernel
declares).  ``relaxweb/runtime_js/manifest.js`` is the same code in JavaScript; both give the
same message for the same manifest, e.g. ``manifest.json: kernels[0].file: "../x" is not
allowed (it must match ^kernels/...$)``.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any, Callable, Mapping

from relaxweb.errors import RelaxwebError

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "runtime_js" / "manifest-schema.json"
_SCHEMA = json.loads(SCHEMA_PATH.read_text())
_SHOWN_CHARACTERS = 80
_SAFE_INTEGER = 2**53 - 1
#: bytes per element of every dtype the schema allows (``dtypes`` entries must agree)
_DTYPE_BYTES = {"float16": 2, "float32": 4, "float64": 8, "int8": 1, "int16": 2, "int32": 4, "int64": 8,
                "uint8": 1, "uint16": 2, "uint32": 4, "bool": 1}


class ManifestError(RelaxwebError):
    """A manifest that does not follow the schema (or its stated facts)."""


def validate_manifest(manifest: Any) -> None:
    """Raise :class:`ManifestError` with the first problem found, or return."""
    problem = manifest_problem(manifest)
    if problem is not None:
        raise ManifestError(f"manifest.json: {problem}")


def manifest_problem(manifest: Any) -> str | None:
    """The first problem of ``manifest`` as ``path: what is wrong``, or None."""
    return _check(manifest, _SCHEMA["manifest"], "", manifest) or _fact_problem(manifest)


def describe_value(value: Any) -> str:
    """A short quoted form of a value for messages (the JS runtime writes the same)."""
    if isinstance(value, str):
        text = value[:_SHOWN_CHARACTERS]
        return json.dumps(text, ensure_ascii=False) + ("..." if len(value) > _SHOWN_CHARACTERS else "")
    return _type_name(value)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


_ARTICLED = {"number": "an integer", "string": "a string", "array": "an array", "object": "an object"}


def _json_type(value: Any) -> str:
    return _type_name(value).split(" ")[-1]


def _json_type_of_schema(kind: str) -> str:
    """The JSON type a schema type takes (as ``_json_type`` names it)."""
    return {"integer": "number", "index": "number", "key": "string", "enum": "string"}.get(kind, kind)


def _is_integer(value: Any) -> bool:
    """An integer as JSON gives it (``2`` or ``2.0``; never a boolean), exact in a double (as
    JavaScript needs it)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, float):
        return math.isfinite(value) and value.is_integer() and abs(value) <= _SAFE_INTEGER
    return isinstance(value, int) and abs(value) <= _SAFE_INTEGER


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _check(value: Any, schema: dict, path: str, manifest: dict) -> str | None:
    """Why ``value`` at ``path`` does not fit ``schema``, or None (each schema type's check is
    one function of :data:`_TYPE_CHECKS`)."""
    if "ref" in schema:
        resolved = {**_SCHEMA["definitions"][schema["ref"]], **{k: v for k, v in schema.items() if k != "ref"}}
        return _check(value, resolved, path, manifest)
    if value is None and schema.get("nullable"):
        return None
    check = _TYPE_CHECKS.get(schema["type"])
    if check is None:
        raise ValueError(f"manifest schema: unknown type {schema['type']!r}")
    return check(value, schema, path, manifest)


def _where(path: str) -> str:
    return path or "the manifest"


def _first_problem(checks) -> str | None:
    """The first problem the (lazy) checks find, or None."""
    return next((problem for problem in checks if problem), None)


def _check_object(value: Any, schema: dict, path: str, manifest: dict) -> str | None:
    """Each required field present and valid, in order, then each optional one given."""
    if not isinstance(value, dict):
        return f"{_where(path)}: expected an object, got {_type_name(value)}"
    for key, inner in schema.get("required", {}).items():
        if key not in value:
            return f"{_where(path)}: has no '{key}'"
        problem = _check(value[key], inner, _join(path, key), manifest)
        if problem:
            return problem
    return _first_problem(_check(value[key], inner, _join(path, key), manifest)
                          for key, inner in schema.get("optional", {}).items() if key in value)


def _check_array(value: Any, schema: dict, path: str, manifest: dict) -> str | None:
    where = _where(path)
    if not isinstance(value, list):
        return f"{where}: expected an array, got {_type_name(value)}"
    if "length" in schema and len(value) != schema["length"]:
        return f"{where}: has {len(value)} items, expected {schema['length']}"
    if "max_items" in schema and len(value) > schema["max_items"]:
        return f"{where}: has {len(value)} items, at most {schema['max_items']} allowed"
    return _first_problem(_check(item, schema["items"], f"{path}[{index}]", manifest) for index, item in enumerate(value))


def _check_map(value: Any, schema: dict, path: str, manifest: dict) -> str | None:
    where = _where(path)
    if not isinstance(value, dict):
        return f"{where}: expected an object, got {_type_name(value)}"
    if len(value) > schema["max_items"]:
        return f"{where}: has {len(value)} entries, at most {schema['max_items']} allowed"
    for key, item in value.items():
        if not re.fullmatch(schema["keys_pattern"], key):
            return f"{where}: the key {describe_value(key)} is not allowed (it must match {schema['keys_pattern']})"
        problem = _check(item, schema["values"], f"{path}[{json.dumps(key)}]", manifest)
        if problem:
            return problem
    return None


def _check_integer(value: Any, schema: dict, path: str, manifest: dict) -> str | None:
    """An ``integer`` within ``min..max``, or an ``index`` of the manifest's list ``of``."""
    where = _where(path)
    if not _is_integer(value):
        return f"{where}: expected an integer, got {_type_name(value)}"
    number = int(value)
    if schema["type"] == "index":
        target = manifest.get(schema["of"]) if isinstance(manifest, dict) else None
        count = len(target) if isinstance(target, list) else 0
        return None if 0 <= number < count else f"{where}: {number} is not an index of {schema['of']} (it has {count})"
    if not schema["min"] <= number <= schema["max"]:
        return f"{where}: {number} is outside {schema['min']}..{schema['max']}"
    return None


def _check_number(value: Any, schema: dict, path: str, manifest: dict) -> str | None:
    """A finite ``number`` (an integer or not) within ``min..max``."""
    where = _where(path)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return f"{where}: expected a number, got {_type_name(value)}"
    if not schema["min"] <= value <= schema["max"]:
        return f"{where}: a number outside {schema['min']}..{schema['max']}"
    return None


def _check_string(value: Any, schema: dict, path: str, manifest: dict) -> str | None:
    """A ``string``, an ``enum`` value or a ``key`` of the manifest's map ``of``."""
    where, kind = _where(path), schema["type"]
    if not isinstance(value, str):
        expected = "one of " + ", ".join(json.dumps(v) for v in schema["values"]) if kind == "enum" else "a string"
        return f"{where}: expected {expected}, got {_type_name(value)}"
    if kind == "enum" and value not in schema["values"]:
        return f"{where}: {describe_value(value)} is not one of " + ", ".join(json.dumps(v) for v in schema["values"])
    if kind == "key":
        table = manifest.get(schema["of"]) if isinstance(manifest, dict) else None
        if not isinstance(table, dict) or value not in table:
            return f"{where}: {describe_value(value)} is not in {schema['of']}"
    if "max_length" in schema and len(value) > schema["max_length"]:
        return f"{where}: a string of {len(value)} characters, at most {schema['max_length']} allowed"
    if "pattern" in schema and not re.fullmatch(schema["pattern"], value):
        return f"{where}: {describe_value(value)} is not allowed (it must match {schema['pattern']})"
    return None


def _check_one_key(value: Any, schema: dict, path: str, manifest: dict) -> str | None:
    keys = list(schema["keys"])
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in keys:
        return f"{_where(path)}: expected an object with exactly one of " + ", ".join(f"'{k}'" for k in keys)
    key = next(iter(value))
    return _check(value[key], schema["keys"][key], _join(path, key), manifest)


def _check_union(value: Any, schema: dict, path: str, manifest: dict) -> str | None:
    for option in schema["options"]:
        if _json_type(value) == _json_type_of_schema(option["type"]):
            return _check(value, option, path, manifest)
    expected = " or ".join(_ARTICLED[_json_type_of_schema(o["type"])] for o in schema["options"])
    return f"{_where(path)}: expected {expected}, got {_type_name(value)}"


def _check_expression(value: Any, schema: dict, path: str, manifest: dict) -> str | None:
    return _expression_problem(value, schema, _where(path))


_TYPE_CHECKS: dict[str, Callable[[Any, dict, str, dict], str | None]] = {
    "object": _check_object, "array": _check_array, "map": _check_map, "integer": _check_integer, "number": _check_number,
    "index": _check_integer, "string": _check_string, "key": _check_string, "enum": _check_string,
    "one_key": _check_one_key, "union": _check_union, "expression": _check_expression,
}
"""Each schema type's check (the schema's ``type`` -> a function of value, schema, path, manifest)."""


def _expression_problem(value: Any, schema: dict, where: str) -> str | None:
    """Why ``value`` is not an expression tree of ``schema`` (its nodes depth first, each
    operator's operands in order), or None.  A loop, not recursion: the limits are what
    is being checked."""
    operators = schema["operators"]
    pending = [(value, where, 1)]
    nodes = 0
    while pending:
        node, at, depth = pending.pop()
        nodes += 1
        if nodes > schema["max_nodes"]:
            return f"{where}: an expression of more than {schema['max_nodes']} nodes"
        if depth > schema["max_depth"]:
            return f"{at}: an expression nested deeper than {schema['max_depth']} levels"
        if isinstance(node, list):
            if len(node) != 3:
                return f"{at}: expected [operator, a, b], got {len(node)} items"
            if not isinstance(node[0], str) or node[0] not in operators:
                return f"{at}[0]: {describe_value(node[0])} is not one of " + ", ".join(json.dumps(o) for o in operators)
            pending += [(node[2], f"{at}[2]", depth + 1), (node[1], f"{at}[1]", depth + 1)]
        elif isinstance(node, str):
            if len(node) > schema["max_length"]:
                return f"{at}: a string of {len(node)} characters, at most {schema['max_length']} allowed"
        elif not _is_integer(node):
            return f"{at}: expected an integer, a string or an array, got {_type_name(node)}"
    return None


def expression_names(tree: Any, where: str) -> list[tuple[str, str]]:
    """The names an expression tree (valid by the schema) uses, each with where it is."""
    if isinstance(tree, str):
        return [(tree, where)]
    if isinstance(tree, list):
        return expression_names(tree[1], f"{where}[1]") + expression_names(tree[2], f"{where}[2]")
    return []


def _fact_problem(manifest: dict) -> str | None:
    """What the schema cannot say: sizes and counts that must agree across fields."""
    for name, entry in manifest["dtypes"].items():
        if entry["bytes"] != _DTYPE_BYTES[name] or entry["device_bytes"] != _DTYPE_BYTES[entry["device_dtype"]]:
            return (f"dtypes[{json.dumps(name)}]: bytes {entry['bytes']} and device_bytes {entry['device_bytes']} "
                    f"are not those of {name} and {entry['device_dtype']}")
        # kernels.wasm holds a tensor as the GPU does, but an int64 as int64
        if entry["wasm_dtype"] != entry["device_dtype"] and not name == entry["wasm_dtype"] == "int64":
            return (f"dtypes[{json.dumps(name)}]: wasm_dtype {entry['wasm_dtype']} is not its device_dtype "
                    f"{entry['device_dtype']} (only int64 may be int64 in kernels.wasm)")
        if entry["wasm_bytes"] != _DTYPE_BYTES[entry["wasm_dtype"]]:
            return (f"dtypes[{json.dumps(name)}]: wasm_bytes {entry['wasm_bytes']} is not the size of its wasm_dtype "
                    f"{entry['wasm_dtype']} ({_DTYPE_BYTES[entry['wasm_dtype']]} bytes)")
    inputs_storages = [entry["storage"] for entry in manifest["inputs"]]
    cached = {cache["input"] for cache in manifest.get("caches", [])}
    for index, storage in enumerate(inputs_storages):
        role = "cache" if index in cached else "input"
        if manifest["storages"][storage]["role"] != role or inputs_storages.count(storage) > 1:
            return f"inputs[{index}].storage: storage {storage} is not {'a cache' if index in cached else 'an input'} storage of its own"
    caches = manifest.get("caches", [])
    for index, cache in enumerate(caches):
        entry, output = manifest["inputs"][cache["input"]], manifest["outputs"][cache["output"]]
        if (entry["storage"] != cache["storage"] or output["storage"] != cache["storage"]
                or manifest["storages"][cache["storage"]]["size_at_bounds"] is None
                or entry.get("kind", "tensor") != "tensor" or output.get("kind", "tensor") != "tensor"
                or output.get("ndim") != len(entry["shape"]) or cache["axis"] >= len(entry["shape"])
                or output["dtype"] != entry["dtype"]
                or sum(c["input"] == cache["input"] or c["output"] == cache["output"] for c in caches) > 1):
            return (f"caches[{index}]: input {cache['input']} and output {cache['output']} are not tensors of one "
                    f"dtype and rank above axis {cache['axis']} in storage {cache['storage']} (sized at load), "
                    "each in one cache")
    pool = manifest.get("kv_pool")
    if pool is not None:
        table = manifest["inputs"][pool["page_table"]]
        if (table.get("kind", "tensor") != "tensor" or table["dtype"] != "int32" or len(table["shape"]) != 3
                or table["shape"][2] != pool["pages_per_sequence"]):
            return (f"kv_pool.page_table: input {pool['page_table']} is not an int32 tensor of 3 dimensions whose last "
                    f"is pages_per_sequence ({pool['pages_per_sequence']})")
    for kind in ("inputs", "outputs"):
        for index, entry in enumerate(manifest[kind]):
            if entry.get("kind") in ("sequence", "optional_sequence") and (
                    "sequence" not in entry or "element_ndim" not in entry or "sequence_capacity" not in manifest):
                return (f"{kind}[{index}]: a sequence needs its sequence and element_ndim, "
                        "and the manifest its sequence_capacity")
    for index, weight in enumerate(manifest["weights"]):
        shard = manifest["shards"][weight["shard"]]
        if weight["offset"] % 4 or weight["offset"] + weight["nbytes"] > shard["nbytes"]:
            return (f"weights[{index}]: bytes {weight['offset']}..{weight['offset'] + weight['nbytes']} "
                    f"are not inside shard {weight['shard']} ({shard['nbytes']} bytes, 4-byte aligned)")
        elements = math.prod(weight["shape"])
        expected = elements * manifest["dtypes"][weight["dtype"]]["wasm_bytes"]  # the shards hold the wasm form
        if weight["nbytes"] != expected:
            return f"weights[{index}]: nbytes is {weight['nbytes']}, but its shape and dtype make {expected}"
    for index, kernel in enumerate(manifest["kernels"]):
        bindings = kernel["bindings"]
        if not bindings or bindings[0] != "uniform" or "uniform" in bindings[1:]:
            return f"kernels[{index}].bindings: binding 0 and only binding 0 must be \"uniform\""
        fields = kernel.get("params", [])
        for part in ("flops", "bytes") if "cost" in kernel else ():
            for name, at in expression_names(kernel["cost"][part], f"kernels[{index}].cost.{part}"):
                if name not in fields:
                    return f"{at}: {describe_value(name)} is not one of the kernel's params"
    problem = _tokenizer_problem(manifest.get("tokenizer"))
    if problem:
        return problem
    if "wasm" in manifest:
        keys = sorted(key for key in manifest["wasm"]
                      if key in ("file", "relaxed_madd_sites", "scratch_bytes", "unavailable"))
        if keys not in (["file", "scratch_bytes"], ["file", "relaxed_madd_sites", "scratch_bytes"], ["unavailable"]):
            return "wasm: expected either file and scratch_bytes (and maybe relaxed_madd_sites) or unavailable"
        problem = _prepacked_problem(manifest)
        if problem:
            return problem
    for index, site in enumerate(manifest["call_sites"]):
        end = site["params_offset"] + site["params_size"]
        if site["params_offset"] % 256 or site["params_size"] % 16 or end > manifest["params_bytes"]:
            return (f"call_sites[{index}]: params bytes {site['params_offset']}..{end} are not a 16-byte "
                    f"multiple at a 256-byte boundary inside params_bytes ({manifest['params_bytes']})")
        fields = manifest["kernels"][site["kernel"]].get("params", [])
        if 4 * len(fields) > site["params_size"]:
            return (f"call_sites[{index}].params_size: {site['params_size']} bytes, but kernel {site['kernel']} "
                    f"declares {len(fields)} params of 4 bytes")
        bindings = manifest["kernels"][site["kernel"]]["bindings"]
        if len(site["buffers"]) != len(bindings) - 1:
            return (f"call_sites[{index}].buffers: {len(site['buffers'])} buffers, but kernel "
                    f"{site['kernel']} declares {len(bindings) - 1}")
        problem = _weight_parts_problem(manifest, site["buffers"], f"call_sites[{index}].buffers")
        if problem:
            return problem
        written = [b.get("storage") for b, kind in zip(site["buffers"], bindings[1:]) if kind == "storage"]
        for buffer in site["buffers"]:
            storage = buffer.get("storage")
            if storage is not None and storage in written and sum(b.get("storage") == storage for b in site["buffers"]) > 1:
                return f"call_sites[{index}].buffers: storage {storage} is both written and bound again"
    return None


def _weight_parts_problem(manifest: dict, buffers: list, where: str) -> str | None:
    """Why a call site's weight references do not fit the weights' ``parts`` (a part that
    does not exist, a weight in parts bound whole), or None."""
    weights = manifest["weights"]
    for position, buffer in enumerate(buffers):
        if "weight_part" in buffer:
            weight, part = buffer["weight_part"]
            if weight >= len(weights) or part >= weights[weight].get("parts", 1):
                return f"{where}[{position}].weight_part: weight {weight} has no part {part}"
        elif "weight" in buffer and weights[buffer["weight"]].get("parts", 1) > 1:
            return f"{where}[{position}].weight: weight {buffer['weight']} is bound in parts (weight_part)"
    return None


#: The largest file of each kind a runtime reads from a bundle (a kernel or a host module
#: past these is not one relaxweb wrote; a shard's size is its manifest's ``nbytes``).
MAX_MANIFEST_BYTES = 256 * 1024 * 1024
MAX_HOST_MODULE_BYTES = 64 * 1024 * 1024
MAX_KERNEL_BYTES = 16 * 1024 * 1024


def _prepacked_problem(manifest: Mapping[str, Any]) -> str | None:
    """What is wrong with ``wasm.prepacked`` beyond the schema: an entry without a kernels.wasm,
    a call site named twice, params that do not fit the call site's params block."""
    regions = manifest["wasm"].get("prepacked", [])
    if regions and "file" not in manifest["wasm"]:
        return "wasm.prepacked: the bundle has no kernels.wasm"
    seen = set()
    for index, region in enumerate(regions):
        site = region["call_site"]
        if site in seen:
            return f"wasm.prepacked[{index}].call_site: call site {site} is named twice"
        seen.add(site)
        if 4 * len(region["params"]) > manifest["call_sites"][site]["params_size"]:
            return (f"wasm.prepacked[{index}].params: {4 * len(region['params'])} bytes, more than call site {site}'s "
                    f"params_size ({manifest['call_sites'][site]['params_size']})")
    return None


def _tokenizer_problem(tokenizer: dict | None) -> str | None:
    """What the schema cannot say of the tokenizer entry: a byte tokenizer has the 256 bytes
    and its special ids below vocab_size; a huggingface one has its tokenizer.json."""
    if tokenizer is None:
        return None
    if tokenizer["kind"] == "byte":
        if tokenizer["vocab_size"] < 256:
            return f"tokenizer.vocab_size: a byte tokenizer has at least 256 ids (one per byte), got {tokenizer['vocab_size']}"
        for name in ("bos_token_id", "eos_token_id"):
            if name in tokenizer and tokenizer[name] >= tokenizer["vocab_size"]:
                return f"tokenizer.{name}: {tokenizer[name]} is not below vocab_size ({tokenizer['vocab_size']})"
    elif "tokenizer.json" not in tokenizer.get("files", []):
        return "tokenizer.files: a huggingface tokenizer has its tokenizer.json"
    return None


def read_bundle_file(bundle_dir: Path, relative: str, max_bytes: int, what: str) -> bytes:
    """The bytes of ``relative`` inside ``bundle_dir``, refusing anything that resolves
    outside the folder (``..``, absolute paths, symbolic links out), that is not a regular
    file (``/dev/zero``, a pipe) or that is larger than ``max_bytes``.  Messages name the
    bundle's own path only, never what lies outside."""
    root = bundle_dir.resolve()
    path = (root / relative).resolve()
    if not path.is_relative_to(root):
        raise RelaxwebError(f"{what} {relative} is not inside the bundle folder {bundle_dir}")
    try:
        # non-blocking: opening a named pipe must not wait for a writer
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(descriptor, "rb") as file:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                raise RelaxwebError(f"{what} {relative} in {bundle_dir} is not a regular file")
            data = file.read(max_bytes + 1)
    except FileNotFoundError:
        raise RelaxwebError(f"{what} {relative} is missing from {bundle_dir}") from None
    except OSError as error:
        raise RelaxwebError(f"{what} {relative} in {bundle_dir} cannot be read ({error.strerror})") from None
    if len(data) > max_bytes:
        raise RelaxwebError(f"{what} {relative} in {bundle_dir} is larger than {max_bytes} bytes")
    return data


def kernel_source(bundle_dir: Path, file: str) -> str:
    """The WGSL text of a bundle's kernel file (read as :func:`read_bundle_file` reads), or a
    RelaxwebError when it is not UTF-8."""
    try:
        return read_bundle_file(bundle_dir, file, MAX_KERNEL_BYTES, "kernel").decode("utf-8")
    except UnicodeDecodeError:
        raise RelaxwebError(f"kernel {file} in {bundle_dir} is not UTF-8 text") from None
