"""The host module of a bundle (``host.wasm``), run with wasmtime.

The host module does all the shape work of a model: it checks input shapes, binds the
symbolic vars, and writes the storage sizes, output shapes, the params block and the
command list (see "host.wasm" in ``docs/bundle-format.md``).  When a shape or a branch
depends on a value computed on the GPU, the command list ends with a :class:`Read`; the
runtime reads that value, hands it over with :meth:`HostModule.write_read_value` and calls
:meth:`HostModule.resume` for the next list (see "Values read back" in the doc).  A list
that ends with a :class:`Resume` (an iteration of a loop) is submitted and resumed at once.
:class:`HostModule` wraps it all with plain Python types so the GPU side (``webgpu.py``) and
tests never touch raw memory.  Nothing here needs a GPU.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence, Union

import wasmtime

from relaxweb.errors import InputShapeError, RelaxwebError
from relaxweb.runtime.manifest import MAX_HOST_MODULE_BYTES, MAX_MANIFEST_BYTES, read_bundle_file, validate_manifest

#: The bundle format version this runtime reads (``relaxweb/bundle.py`` writes it).
FORMAT_VERSION = 3
#: Command-list opcode: dispatch a call site.
OPCODE_DISPATCH = 1
#: Command-list opcode: read an i32 back from a storage (always the last record of a list).
OPCODE_READ = 2
#: Command-list opcode: submit and resume, reading nothing (always the last record of a list).
OPCODE_RESUME = 3

#: Fuel (about one unit per WebAssembly instruction) each call into the host module may use:
#: about a second of work, far more than the run of any module relaxweb writes.
HOST_FUEL_PER_CALL = 1_000_000_000
_REQUIRED_EXPORTS = {
    "memory": wasmtime.Memory, "run": wasmtime.Func, "input_shapes": wasmtime.Func, "var_bounds": wasmtime.Func,
    "var_values": wasmtime.Func, "storage_sizes": wasmtime.Func, "output_shapes": wasmtime.Func,
    "error_info": wasmtime.Func, "commands": wasmtime.Func, "params": wasmtime.Func, "sizes_at_bounds": wasmtime.Func,
}
_I32 = struct.Struct("<i")
_COMMAND_RECORD = struct.Struct("<5i")


@dataclass(frozen=True)
class Dispatch:
    """One command-list record: dispatch ``call_sites[call_site]`` over ``grid`` workgroups."""

    call_site: int
    grid: tuple[int, int, int]


@dataclass(frozen=True)
class Read:
    """The last record of a command list that stops for a value computed on the GPU: read
    the i32 at ``byte_offset`` of storage ``storage``, write it to read slot ``slot``
    (:meth:`HostModule.write_read_value`) and call :meth:`HostModule.resume`."""

    storage: int
    byte_offset: int
    slot: int


@dataclass(frozen=True)
class Resume:
    """The last record of a command list after which the host writes new params for the
    same call sites (a loop's next iteration): submit the list and call
    :meth:`HostModule.resume`, with nothing to read."""


#: One command-list record.
Command = Union[Dispatch, Read, Resume]


def load_manifest(bundle_dir: str | Path) -> dict[str, Any]:
    """Read ``manifest.json`` of a bundle folder and validate it (``runtime/manifest.py``)."""
    bundle_dir = Path(bundle_dir)
    if not (bundle_dir / "manifest.json").is_file():
        raise RelaxwebError(f"{bundle_dir} is not a relaxweb bundle: it has no manifest.json")
    manifest_path = bundle_dir / "manifest.json"
    text = read_bundle_file(bundle_dir, "manifest.json", MAX_MANIFEST_BYTES, "the manifest")
    try:
        manifest = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as error:
        raise RelaxwebError(f"{manifest_path} is not valid JSON: {error}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != "relaxweb-bundle":
        raise RelaxwebError(f"{manifest_path} is not a relaxweb bundle manifest")
    if manifest.get("version") != FORMAT_VERSION:
        raise RelaxwebError(
            f"{manifest_path} has bundle format version {json.dumps(manifest.get('version'))[:40]}; "
            f"this runtime reads version {FORMAT_VERSION} (rebuild the bundle with this relaxweb)"
        )
    validate_manifest(manifest)
    return manifest


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


class HostModule:
    """An instance of a bundle's ``host.wasm``, described by the bundle's manifest.

    The manifest gives the counts needed to read the module's areas (inputs, outputs,
    symbolic vars, storages, ``max_rank``, ``params_bytes``) and the error templates.
    """

    def __init__(self, wasm_bytes: bytes | None, manifest: dict[str, Any], *, like: HostModule | None = None) -> None:
        """``like``: another instance of the same module, whose compiled code this one shares
        (a batch's host instances: instantiating takes microseconds, compiling milliseconds);
        ``wasm_bytes`` is then not needed."""
        self.manifest = manifest
        self.max_rank: int = manifest["max_rank"]
        self.input_names: list[str] = [entry["name"] for entry in manifest["inputs"]]
        self.output_names: list[str] = [entry["name"] for entry in manifest["outputs"]]
        self.var_names: list[str] = [entry["name"] for entry in manifest["symbolic_vars"]]
        self.storage_count: int = len(manifest["storages"])
        self.params_bytes: int = manifest["params_bytes"]
        #: How many values a run may read back (0 for bundles without reads, and for
        #: bundles written before reads existed, whose manifests have no ``read_slots``).
        self.read_slots: int = manifest.get("read_slots", 0)
        self._error_templates: dict[int, str] = {
            entry["code"]: entry["message"] for entry in manifest["errors"]
        }

        if like is None:
            config = wasmtime.Config()
            config.consume_fuel = True  # a host module that loops is stopped (HOST_FUEL_PER_CALL)
            engine = wasmtime.Engine(config)
        else:
            engine = like._store.engine
        self._store = wasmtime.Store(engine)
        try:
            module = wasmtime.Module(engine, wasm_bytes or b"") if like is None else like._module
            self._module = module
            instance = wasmtime.Instance(self._store, module, [])
        except (wasmtime.WasmtimeError, wasmtime.Trap) as error:
            first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise RelaxwebError(f"the bundle's host.wasm cannot be loaded: {first_line}") from None
        self._exports = instance.exports(self._store)
        missing = [name for name, kind in _REQUIRED_EXPORTS.items()
                   if not isinstance(self._exports.get(name), kind)]
        if missing:
            raise RelaxwebError(f"the bundle's host.wasm does not export {', '.join(missing)} as a relaxweb host module does")
        self._memory: wasmtime.Memory = self._exports["memory"]
        if self.read_slots > 0:
            missing = [name for name in ("read_values", "resume") if name not in self._exports]
            if missing:
                raise RelaxwebError(
                    f"the bundle's manifest has {self.read_slots} read slot(s) but its host.wasm "
                    f"does not export {' or '.join(missing)}: the bundle is inconsistent"
                )

    @classmethod
    def from_bundle(cls, bundle_dir: str | Path) -> HostModule:
        """Instantiate ``host.wasm`` of the bundle in ``bundle_dir``."""
        manifest = load_manifest(bundle_dir)
        return cls(read_bundle_file(Path(bundle_dir), "host.wasm", MAX_HOST_MODULE_BYTES, "the host module"), manifest)

    def new_instance(self) -> HostModule:
        """Another instance of this module (its own memory and state), sharing its compiled code."""
        return HostModule(None, self.manifest, like=self)

    # Raw memory access -------------------------------------------------------------------

    def _call(self, export_name: str) -> int:
        """Call an export of the module within the fuel budget; a trap or an exhausted
        budget is a RelaxwebError (the module is not one relaxweb wrote, or it is damaged)."""
        self._store.set_fuel(HOST_FUEL_PER_CALL)
        try:
            result = self._exports[export_name](self._store)
        except wasmtime.Trap as error:
            if "fuel" in str(error):
                raise RelaxwebError(
                    f"the bundle's host module did not finish {export_name} within {HOST_FUEL_PER_CALL:,} "
                    "instructions (a module relaxweb writes needs far fewer): it loops, the bundle is damaged"
                ) from None
            reason = next((line.strip() for line in str(error).splitlines() if "wasm trap" in line), "a trap")
            raise RelaxwebError(f"the bundle's host module failed in {export_name}: {reason}") from None
        if not isinstance(result, int):
            raise RelaxwebError(f"the bundle's host module returned {type(result).__name__} from {export_name}, not an i32")
        return result

    def _address(self, export_name: str) -> int:
        """Call the export that returns the address of one of the module's areas."""
        return self._call(export_name)

    def _memory_slice(self, start: int, end: int) -> bytes:
        """Bytes ``start:end`` of the module's memory; an area outside it is a RelaxwebError."""
        if not 0 <= start <= end <= self._memory.data_len(self._store):
            raise RelaxwebError(
                f"the bundle's host module points outside its memory (bytes {start}..{end}): the bundle is damaged"
            )
        return bytes(self._memory.read(self._store, start, end))

    def _read_i64s(self, address: int, count: int) -> list[int]:
        data = self._memory_slice(address, address + 8 * count)
        return list(struct.unpack(f"<{count}q", data))

    def _write_i64s(self, address: int, values: Sequence[int]) -> None:
        self._memory_slice(address, address + 8 * len(values))  # inside the memory
        self._memory.write(self._store, struct.pack(f"<{len(values)}q", *values), address)

    def _read_shapes(self, address: int, count: int) -> list[tuple[int, ...]]:
        """Read ``count`` shapes laid out as ``[ndim, d0, d1, ...]`` in ``1 + max_rank`` slots."""
        slots = self._read_i64s(address, count * (1 + self.max_rank))
        shapes = []
        for index in range(count):
            record = slots[index * (1 + self.max_rank):(index + 1) * (1 + self.max_rank)]
            ndim = record[0]
            shapes.append(tuple(record[1:1 + ndim]))
        return shapes

    # The ABI, one export at a time -------------------------------------------------------

    def write_input_shapes(self, shapes: Sequence[Sequence[int]]) -> None:
        """Write one shape per manifest input (manifest order) into ``input_shapes``."""
        if len(shapes) != len(self.input_names):
            raise ValueError(f"expected {len(self.input_names)} input shapes, got {len(shapes)}")
        slots: list[int] = []
        for name, shape in zip(self.input_names, shapes):
            if len(shape) > self.max_rank:
                raise InputShapeError(
                    f"input '{name}' has {len(shape)} dimensions; this bundle accepts at most "
                    f"{self.max_rank}"
                )
            padding = [0] * (self.max_rank - len(shape))
            slots.extend([len(shape), *shape, *padding])
        self._write_i64s(self._address("input_shapes"), slots)

    def run(self) -> int:
        """Call the module's ``run``: 0, or an error code from ``manifest["errors"]``."""
        return self._call("run")

    def run_with_shapes(self, shapes: Sequence[Sequence[int]]) -> None:
        """Write input shapes and run; a non-zero code raises :class:`InputShapeError`."""
        self.write_input_shapes(shapes)
        code = self.run()
        if code != 0:
            raise InputShapeError(self.format_error(code))

    def write_read_value(self, slot: int, value: int) -> None:
        """Write a value read back from the GPU into ``read_values()[slot]`` (as an i64)."""
        if not 0 <= slot < self.read_slots:
            raise RelaxwebError(
                f"read slot {slot} does not exist: the bundle has {self.read_slots} read slot(s)"
            )
        self._write_i64s(self._address("read_values") + 8 * slot, [value])

    def read_values(self) -> list[int]:
        """The values in the read slots (as last written by :meth:`write_read_value`)."""
        if self.read_slots == 0:
            return []
        return self._read_i64s(self._address("read_values"), self.read_slots)

    def resume(self) -> int:
        """Call the module's ``resume`` after a read: 0, or an error code like :meth:`run`.

        On 0 the module has written the next command list, the storage sizes and (after the
        last read of a run) the output shapes.
        """
        if "resume" not in self._exports:
            raise RelaxwebError(
                "the bundle's host.wasm has no resume export, so its command lists cannot "
                "contain reads"
            )
        return self._call("resume")

    def resume_or_raise(self) -> None:
        """Resume; a non-zero code raises :class:`InputShapeError` with the manifest message."""
        code = self.resume()
        if code != 0:
            raise InputShapeError(self.format_error(code))

    def error_info(self) -> tuple[int, int, int]:
        """``(code, value, expected)`` of the last failed ``run`` or ``resume``."""
        code, value, expected = self._read_i64s(self._address("error_info"), 3)
        return code, value, expected

    def format_error(self, code: int) -> str:
        """The manifest message for ``code`` with ``{value}``/``{expected}`` filled in."""
        template = self._error_templates.get(code)
        _, value, expected = self.error_info()
        if template is None:
            raise RelaxwebError(
                f"the bundle's host module returned error code {code} (value {value}, "
                f"expected {expected}), which its manifest does not describe"
            )
        # str.replace, not str.format: templates may contain other braces (names, shapes).
        return template.replace("{value}", str(value)).replace("{expected}", str(expected))

    def var_bounds(self) -> dict[str, int | None]:
        """The bound of each symbolic var (``None``: unbounded)."""
        bounds = self._read_i64s(self._address("var_bounds"), len(self.var_names))
        return {name: (None if bound < 0 else bound) for name, bound in zip(self.var_names, bounds)}

    def write_var_bounds(self, bounds: dict[str, int | None]) -> None:
        """Overwrite the bounds of the named vars (``None``: unbounded); others are kept."""
        unknown = set(bounds) - set(self.var_names)
        if unknown:
            raise RelaxwebError(
                f"unknown symbolic var(s) {sorted(unknown)}; the bundle's vars are {self.var_names}"
            )
        current = self.var_bounds()
        current.update(bounds)
        values = [-1 if current[name] is None else current[name] for name in self.var_names]
        self._write_i64s(self._address("var_bounds"), values)

    def var_values(self) -> dict[str, int]:
        """The value each symbolic var took in the last successful run."""
        values = self._read_i64s(self._address("var_values"), len(self.var_names))
        return dict(zip(self.var_names, values))

    def storage_sizes(self) -> list[int]:
        """Bytes needed by each storage in the last run (or by :meth:`sizes_at_bounds`)."""
        return self._read_i64s(self._address("storage_sizes"), self.storage_count)

    def sizes_at_bounds(self) -> list[int] | None:
        """Each storage's size with every var at its bound; ``None`` if some var is unbounded."""
        if self._call("sizes_at_bounds") != 0:
            return None
        return self.storage_sizes()

    def output_shapes(self) -> list[tuple[int, ...]]:
        """The shape of each output (manifest order) computed by the last run."""
        return self._read_shapes(self._address("output_shapes"), len(self.output_names))

    # Sequences (docs/bundle-format.md "Sequences") ---------------------------------------

    def _sequence_table(self, sequence: int) -> tuple[int, int]:
        """The address of table ``sequence`` and the capacity of a table."""
        if "sequences" not in self._exports:
            raise RelaxwebError("the bundle's manifest has sequences but its host.wasm does not export sequences: "
                                "the bundle is inconsistent")
        capacity = self.manifest["sequence_capacity"]
        table_bytes = (8 + capacity * (1 + self.max_rank) * 8 + 15) // 16 * 16
        return self._address("sequences") + sequence * table_bytes, capacity

    def write_sequence(self, name: str, sequence: int, shapes: Sequence[Sequence[int]] | None) -> None:
        """Write a sequence input's table: its length and its elements' shapes (length -1: an
        optional sequence that is none)."""
        address, capacity = self._sequence_table(sequence)
        if shapes is None:
            self._write_i64s(address, [-1])
            return
        if len(shapes) > capacity:
            raise InputShapeError(f"input '{name}' has {len(shapes)} elements, above the {capacity} a sequence can hold")
        slots = [len(shapes)]
        for shape in shapes:
            if len(shape) > self.max_rank:
                raise InputShapeError(f"input '{name}': an element has {len(shape)} dimensions; "
                                      f"this bundle accepts at most {self.max_rank}")
            slots += [len(shape), *shape, *[0] * (self.max_rank - len(shape))]
        self._write_i64s(address, slots)

    def read_sequence(self, sequence: int, optional: bool = False) -> list[tuple[int, ...]] | None:
        """The shapes of a sequence's elements, as the last run left its table (None: an
        optional sequence that is none)."""
        address, capacity = self._sequence_table(sequence)
        length = self._read_i64s(address, 1)[0]
        if optional and length == -1:
            return None
        if not 0 <= length <= capacity:
            raise RelaxwebError(f"the bundle's host module wrote a sequence of {length} elements: the bundle is damaged")
        shapes = self._read_shapes(address + 8, length)
        if any(len(shape) > self.max_rank or min(shape, default=0) < 0 for shape in shapes):
            raise RelaxwebError("the bundle's host module wrote a malformed sequence table: the bundle is damaged")
        return shapes

    def params(self) -> bytes:
        """The params block (``params_bytes`` bytes) written by the last run."""
        address = self._address("params")
        return self._memory_slice(address, address + self.params_bytes)

    def commands(self) -> list[Command]:
        """The command list written by the last ``run`` or ``resume``, in execution order
        (:func:`decode_commands` of the words at the module's ``commands`` address)."""
        address = self._address("commands")
        (count,) = _I32.unpack(self._memory_slice(address, address + 4))
        call_sites = len(self.manifest["call_sites"])
        check_command_count(count, call_sites)
        data = self._memory_slice(address + 4, address + 4 + count * _COMMAND_RECORD.size)
        return _decode_records(count, _COMMAND_RECORD.iter_unpack(data), call_sites, self.storage_count, self.read_slots)


def check_command_count(count: int, call_sites: int) -> None:
    """Refuse a command list longer than every call site and a final read or resume."""
    if not 0 <= count <= call_sites + 1:
        raise RelaxwebError(
            f"the bundle's command list is malformed: it has {count} records for {call_sites} call sites"
        )


def decode_commands(words: Sequence[int], call_sites: int, storages: int, read_slots: int) -> list[Command]:
    """A command list from its i32 words (the record count, then five words per record), for
    a bundle of ``call_sites`` call sites, ``storages`` storages and ``read_slots`` read slots:
    dispatches, possibly followed by one :class:`Read` or :class:`Resume` (only ever the last
    record).  A malformed list is a RelaxwebError saying what is wrong (the same messages as
    ``runtime_js/host.js``; the conformance corpus's ``command_lists`` pins them)."""
    count = words[0] if words else 0
    check_command_count(count, call_sites)
    if len(words) < 1 + 5 * count:
        raise RelaxwebError(f"the bundle's command list is malformed: it has {count} records but only "
                            f"{(len(words) - 1) // 5} were written")
    records = (tuple(words[1 + 5 * index:6 + 5 * index]) for index in range(count))
    return _decode_records(count, records, call_sites, storages, read_slots)


def _decode_records(count: int, records: Iterable[tuple[int, ...]], call_sites: int, storages: int,
                    read_slots: int) -> list[Command]:
    """:func:`decode_commands` of ``count`` records of five words each."""
    commands: list[Command] = []
    for index, (opcode, a, b, c, d) in enumerate(records):
        if opcode == OPCODE_DISPATCH:
            if not 0 <= a < call_sites:
                raise RelaxwebError(
                    f"the bundle's command list is malformed: record {index} dispatches call site {a} "
                    f"over ({b}, {c}, {d}) workgroups; the bundle has {call_sites} call sites"
                )
            commands.append(Dispatch(a, (b, c, d)))
        elif opcode == OPCODE_READ:
            commands.append(_checked_read(Read(a, b, c), index, count, storages, read_slots))
        elif opcode == OPCODE_RESUME:
            if index != count - 1:
                raise RelaxwebError(
                    f"the bundle's command list is malformed: its resume record is record {index} of "
                    f"{count}; a resume must be the last record"
                )
            commands.append(Resume())
        else:
            raise RelaxwebError(f"the bundle's command list has opcode {opcode}, unknown to this runtime")
    return commands


def _checked_read(read: Read, index: int, count: int, storages: int, read_slots: int) -> Read:
    """``read`` if it is well formed, else a RelaxwebError saying what is wrong."""
    problem = None
    if index != count - 1:
        problem = f"is record {index} of {count}; a read must be the last record"
    elif not 0 <= read.slot < read_slots:
        problem = f"uses slot {read.slot}; the manifest has {read_slots} read slot(s)"
    elif not 0 <= read.storage < storages:
        problem = f"reads storage {read.storage}; the bundle has {storages}"
    elif read.byte_offset < 0 or read.byte_offset % 4 != 0:
        problem = f"reads at byte offset {read.byte_offset}, not a multiple of 4"
    if problem is not None:
        raise RelaxwebError(f"the bundle's command list is malformed: its read record {problem}")
    return read
