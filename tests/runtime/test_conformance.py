"""The conformance corpus (``tests/conformance/*.json``) through the Python runtime.

Each file holds the cases of one kind of pure work both runtimes do alike (manifest checks,
batch layouts and tables, the merge of dispatches, grids, the sampler's draws, cost trees,
command lists): the same file is read by ``tests/runtime_js/conformance.test.js`` through the
JS runtime, so a difference between the two is a failing case in one of them
(docs/runtime-core.md, "The conformance corpus").
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from relaxweb.errors import InputShapeError, RelaxwebError
from relaxweb.runtime import batch
from relaxweb.runtime.generate import mulberry32
from relaxweb.runtime.host import Dispatch, Read, Resume, decode_commands
from relaxweb.runtime.manifest import manifest_problem
from relaxweb.runtime.profile import evaluate_tree
from relaxweb.runtime.tensors import checked_inputs, wasm_manifest

CORPUS = Path(__file__).resolve().parents[1] / "conformance"
COMMON_FIELDS = {"name", "pending_in", "pending_why"}


def _at(manifest: Any, path: list) -> tuple[Any, Any]:
    target = manifest
    for step in path[:-1]:
        target = target[step]
    return target, path[-1]


def manifest_problems(case: dict, corpus: dict) -> None:
    manifest = copy.deepcopy(corpus["bases"][case["base"]])
    for path, value in case.get("set", []):
        target, key = _at(manifest, path)
        target[key] = value
    for path in case.get("delete", []):
        target, key = _at(manifest, path)
        del target[key]
    if "nest" in case:
        target, key = _at(manifest, case["nest"]["path"])
        for _ in range(case["nest"]["depth"]):
            target[key] = ["add", target[key], 1]
    if "double" in case:
        target, key = _at(manifest, case["double"]["path"])
        for _ in range(case["double"]["times"]):
            target[key] = ["add", target[key], target[key]]
    assert manifest_problem(manifest) == case["problem"]


def cost_trees(case: dict, corpus: dict) -> None:
    assert evaluate_tree(case["tree"], case["values"]) == case["value"]


def sampler_draws(case: dict, corpus: dict) -> None:
    draw = mulberry32(case["seed"])
    assert [draw() for _ in case["uniforms"]] == case["uniforms"]


def slice_layouts(case: dict, corpus: dict) -> None:
    layout = batch.SliceLayout.of(case["sizes"])
    assert (layout.offsets, layout.capacities, layout.totals) == (case["offsets"], case["capacities"], case["totals"])
    if "grown_sizes" in case:
        grown, changed = layout.grown(case["grown_sizes"])
        assert {"offsets": grown.offsets, "capacities": grown.capacities, "totals": grown.totals,
                "changed": changed} == case["grown"]


def merged_dispatches(case: dict, corpus: dict) -> None:
    lists = {instance: [Dispatch(site, tuple(grid)) for site, grid in dispatches] for instance, dispatches in case["lists"]}
    merged = batch.merge_dispatches(lists)
    assert [[site, [instance for instance, _ in members]] for site, members in merged] == case["merged"]


def batch_tables(case: dict, corpus: dict) -> None:
    entries = [(bytes.fromhex(entry["params"]), entry["bases"], entry["first_workgroup"]) for entry in case["entries"]]
    table = batch.batch_table(case["call_site"], entries)
    expected = bytes.fromhex(case["table"]["hex"])
    assert len(table) == case["table"]["bytes"]
    assert table == expected + bytes(len(table) - len(expected))


def grids(case: dict, corpus: dict) -> None:
    _expect(lambda: list(batch.grid_of(case["workgroups"], case["text"])), case.get("grid"), case.get("error"))


def batch_totals(case: dict, corpus: dict) -> None:
    layout = batch.SliceLayout.of(case["sizes"])
    _expect(lambda: batch.check_totals(case["manifest"], layout, case["sizes"], case["var_values"], case["largest"],
                                       case["limit_name"]), None, case["error"])


def batch_modes(case: dict, corpus: dict) -> None:
    values = {"array": lambda: np.zeros(1, np.float32), "list": lambda: []}
    instances = [{name: values[kind]() for name, kind in instance.items()} for instance in case["instances"]]
    assert batch.one_by_one_reason(case["manifest"], instances) == case["reason"]


def command_lists(case: dict, corpus: dict) -> None:
    def step() -> dict:
        commands = decode_commands(case["words"], case["call_sites"], case["storages"], case["read_slots"])
        last = commands[-1] if commands else None
        decoded = {"dispatches": [[command.call_site, list(command.grid)] for command in commands
                                  if isinstance(command, Dispatch)],
                   "end": "read" if isinstance(last, Read) else "resume" if isinstance(last, Resume) else "outputs"}
        if isinstance(last, Read):
            decoded["read"] = {"storage": last.storage, "byte_offset": last.byte_offset, "slot": last.slot}
        return decoded
    _expect(step, case.get("step"), case.get("error"))


def input_arrays(case: dict, corpus: dict) -> None:
    manifest = {"inputs": [{"name": "x", "dtype": case["input"], "shape": ["n"], "storage": 0}], "dtypes": corpus["dtypes"]}
    given = case["given"]
    value = given["list"] if "list" in given else np.array(given["values"], dtype=given["dtype"])
    # on WebGPU (the manifest's dtypes), then on kernels.wasm (wasm_manifest's): `wasm` where it differs
    for view, device in ((manifest, case.get("device")), (wasm_manifest(manifest), case.get("wasm", case.get("device")))):
        if device is None:
            with pytest.raises(InputShapeError) as caught:
                checked_inputs(view, {"x": value}, None)
            assert all(part in str(caught.value) for part in case["refused"]), str(caught.value)
            continue
        [held], _ = checked_inputs(view, {"x": value}, None)
        assert (held.dtype.name, held.tolist()) == (device["dtype"], device["values"])


def _expect(compute: Callable[[], Any], value: Any, error: str | None) -> None:
    """``compute()`` gives ``value``, or raises a RelaxwebError saying exactly ``error``."""
    if error is None:
        assert compute() == value
        return
    with pytest.raises(RelaxwebError) as caught:
        compute()
    assert str(caught.value) == error


#: kind -> (its runner, the fields its cases may have besides name and pending_in / pending_why)
RUNNERS: dict[str, tuple[Callable[[dict, dict], None], set[str]]] = {
    "manifest_problems": (manifest_problems, {"base", "set", "delete", "nest", "double", "problem"}),
    "cost_trees": (cost_trees, {"tree", "values", "value"}),
    "sampler_draws": (sampler_draws, {"seed", "uniforms"}),
    "slice_layouts": (slice_layouts, {"sizes", "offsets", "capacities", "totals", "grown_sizes", "grown"}),
    "merged_dispatches": (merged_dispatches, {"lists", "merged"}),
    "batch_tables": (batch_tables, {"call_site", "entries", "table"}),
    "grids": (grids, {"workgroups", "text", "grid", "error"}),
    "batch_totals": (batch_totals, {"manifest", "sizes", "var_values", "largest", "limit_name", "error"}),
    "batch_modes": (batch_modes, {"manifest", "instances", "reason"}),
    "command_lists": (command_lists, {"call_sites", "storages", "read_slots", "words", "step", "error"}),
    "input_arrays": (input_arrays, {"input", "given", "device", "refused", "wasm"}),
}


def _corpus() -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(CORPUS.glob("*.json"))]


def _cases() -> list:
    return [pytest.param(corpus, case, id=f"{corpus['kind']}/{case['name']}")
            for corpus in _corpus() for case in corpus["cases"]]


def test_every_file_is_a_known_kind_with_named_cases() -> None:
    corpora = _corpus()
    assert sorted(corpus["kind"] for corpus in corpora) == sorted(RUNNERS)
    for corpus in corpora:
        names = [case["name"] for case in corpus["cases"]]
        assert len(names) == len(set(names)) and names, corpus["kind"]
        assert (CORPUS / f"{corpus['kind']}.json").is_file()


@pytest.mark.parametrize(("corpus", "case"), _cases())
def test_the_python_runtime_conforms(corpus: dict, case: dict) -> None:
    run, fields = RUNNERS[corpus["kind"]]
    unknown = set(case) - fields - COMMON_FIELDS
    assert not unknown, f"fields no runner reads: {sorted(unknown)}"
    if "python" in case.get("pending_in", []):
        pytest.skip(case["pending_why"])
    run(case, corpus)
