"""The host module's side of a run, step by step: what the driver (``runtime/driver.py``) asks of it.

A run starts the host on the input shapes and gets a :class:`HostStep`: the command list to
carry out, the storage sizes and the params block it needs, and (once the list ends with the
outputs) the output shapes.  After a list that ends with a read, the value read back is handed
over and the host resumed for the next step; after one that ends with a resume record, the host
is resumed at once.  :class:`HostSessions` holds the session runs use and one per instance of
a batch, each with its own host state across the rounds.  ``runtime_js/host_session.js`` is the
twin (docs/runtime-core.md, "Host steps").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from relaxweb.errors import RelaxwebError
from relaxweb.runtime.host import Command, Dispatch, HostModule, Read, Resume
from relaxweb.runtime.tensors import sequence_output_tables, with_flat_sequences

Shape = tuple[int, ...]


class HostStep:
    """One command list of a run and what the host wrote with it (not changed once made).

    ``commands``: the decoded list; ``sizes``: bytes each storage needs; ``params``: the params
    block.  ``output_shapes`` and ``element_shapes`` are only set on the last step (a list that
    ends neither with a read nor with a resume): the shape of each output (a sequence output's
    as the 1-D shape of its flat values) and, by output index, the element shapes of each
    sequence output (None: an optional sequence that is none).  ``var_values``: the symbolic
    sizes by name, for a batch instance's first step (its messages name them).  Derived once
    (the driver asks for them several times per step and instance): ``dispatches`` (the
    dispatch records in order), ``read`` (the read record that ends the list, or None),
    ``resumes`` (it ends with a resume record: a loop's iteration) and ``finished`` (neither:
    the run's last step).

    A plain class with slots, not a frozen dataclass: one is made per step of every run and
    batch instance, and a frozen dataclass's ``__init__`` costs several times as much."""

    __slots__ = ("commands", "sizes", "params", "output_shapes", "element_shapes", "var_values",
                 "dispatches", "read", "resumes", "finished")

    def __init__(self, commands: list[Command], sizes: list[int], params: bytes, output_shapes: list[Shape] | None = None,
                 element_shapes: dict[int, list[Shape] | None] | None = None,
                 var_values: dict[str, int] | None = None) -> None:
        self.commands = commands
        self.sizes = sizes
        self.params = params
        self.output_shapes: list[Shape] = output_shapes or []
        self.element_shapes: dict[int, list[Shape] | None] = element_shapes or {}
        self.var_values: dict[str, int] = var_values or {}
        last = commands[-1] if commands else None
        self.dispatches: list[Dispatch] = [command for command in commands if type(command) is Dispatch]
        self.read: Read | None = last if type(last) is Read else None
        self.resumes: bool = type(last) is Resume
        self.finished: bool = self.read is None and not self.resumes

    def __repr__(self) -> str:
        return f"HostStep({len(self.dispatches)} dispatches, {'read' if self.read else 'resume' if self.resumes else 'outputs'})"


class HostSession:
    """A host module instance driven step by step."""

    def __init__(self, module: HostModule) -> None:
        self.module = module

    def start(self, shapes: Sequence[Sequence[int]], sequences: Mapping[int, list | None] | None = None) -> HostStep:
        """Run on these input shapes (and the element shapes of sequence inputs, by input
        index); an :class:`InputShapeError` when the host refuses them."""
        manifest = self.module.manifest
        for index, element_shapes in (sequences or {}).items():
            entry = manifest["inputs"][index]
            self.module.write_sequence(entry["name"], entry["sequence"], element_shapes)
        self.module.run_with_shapes(shapes)
        return self.step()

    def resume(self, slot: int | None, value: int) -> HostStep:
        """Go on after a step: the value read back written to ``slot`` (None: the step read
        nothing), then ``resume``; an :class:`InputShapeError` when the host refuses."""
        if slot is not None:
            self.module.write_read_value(slot, value)
        self.module.resume_or_raise()
        return self.step()

    def step(self) -> HostStep:
        """The host's current step."""
        module = self.module
        commands = module.commands()
        sizes = module.storage_sizes()
        params = module.params()
        if commands and isinstance(commands[-1], (Read, Resume)):
            return HostStep(commands, sizes, params)
        tables = sequence_output_tables(module.manifest, module)
        return HostStep(commands, sizes, params, with_flat_sequences(module.output_shapes(), tables), tables)


class HostSessions:
    """The host sessions of one loaded bundle: ``main`` for its runs, and one per instance of
    a batch, made on first use from the main module's compiled code and given the main
    module's bounds each time it starts."""

    def __init__(self, module: HostModule) -> None:
        self.main = HostSession(module)
        self.instances: list[HostSession] = []
        #: the main session's ``start`` and ``resume`` (bound here: a run calls them once per step)
        self.start = self.main.start
        self.resume = self.main.resume

    def start_instance(self, index: int, shapes: Sequence[Sequence[int]],
                       sequences: Mapping[int, list | None] | None = None) -> HostStep:
        """Start batch instance ``index`` on its own session: its first step, with its
        symbolic sizes (``var_values``)."""
        while len(self.instances) <= index:
            self.instances.append(HostSession(self.main.module.new_instance()))
        session = self.instances[index]
        session.module.write_var_bounds(self.main.module.var_bounds())
        step = session.start(shapes, sequences)
        return HostStep(step.commands, step.sizes, step.params, step.output_shapes, step.element_shapes,
                        session.module.var_values())

    def resume_instance(self, index: int, slot: int | None, value: int) -> HostStep:
        """Go on with batch instance ``index`` (see :meth:`HostSession.resume`)."""
        if index >= len(self.instances):
            raise RelaxwebError(f"batch instance {index} was not started")
        return self.instances[index].resume(slot, value)
