"""fuse_ops: merge chains of tensor-program calls into one kernel each (after legalize_ops).

Every ``call_tir`` is a kernel launch that writes its result to GPU memory for the next
kernel to read back.  This pass groups a producer binding with the bindings that read its
result and merges the group's tensor programs into one (loop-level merge:
``relaxweb.ir.fusion.inline_producer``), deciding from the programs' patterns
(``relaxweb.ir.pattern``) and the graph's symbolic shapes:

- a producer without reductions (elementwise, broadcast, injective: bias adds, activations,
  reshapes, transposes, slices) merges into every consumer that reads it by plain loads:
  elementwise chains become one kernel, and data movement becomes index arithmetic in the
  prologue of a reduction or matmul; one that calls a math function (exp, tanh; erf and GELU
  are polynomials and an exp) merges only where one kernel reads it, since several would each
  compute it again;
- a producer with reductions (matmul, softmax sums, means) merges into its single consumer
  when that consumer has no reduction of its own, reads it at one index, and has no more
  elements than it (provably, with symbolic shapes): an epilogue (bias, GELU, residual
  add, scaling, reshape) that is computed once per element.

A concatenation (a producer that selects between its inputs by index, maybe reshaped or
sliced after) does not merge into a reduction: it would be evaluated at every step of every
output there; written once, it costs one pass over its elements.

A merge that would turn a matmul-like program into one that is not (a transpose that
merges attention heads mixes the factors' axes) is skipped: the tiled schedule is worth
more than the launch it saves.  So is an epilogue that leaves a matmul with fewer rows x
columns (a reshape that interleaves them, as after a transposed convolution's tiles: the
merged body reads both factors at the output's spatial axes, which become batch axes of a
one-row product).

A producer merges only when every use of its result is one of those consumers, in the same
dataflow block or loop body (function outputs, If branches, a loop's carried and stacked
values and library kernels keep theirs).  A loop's body is fused like a dataflow block: it
runs once per iteration, so each launch it saves is saved at every iteration.  A merged
kernel keeps within WebGPU's default of 8 storage buffers per shader stage (a weight above
the context's ``binding_split_bytes`` counts once per part it is bound as), and a body stays
under a size cap and a depth cap, so repeated inlining cannot blow up: a chain of 10,000
activations becomes kernels of 64 levels each (two distinct programs: the program table keeps
one of identical ones), which every recursive walk of a body, the WGSL emitter, the IR text's
parser and shader compilers handle.
Merged programs get new names; programs nothing calls any more are dropped from the module.

The pass takes time linear in the number of bindings (times the size of what it merges):
each variable's readers are indexed (:class:`_Block`), a merge rewrites its consumers in
place, and a merge that failed is not tried again while its bindings are the same.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir.expr import (
    BindingBlock, CallLibrary, CallTIR, DataflowBlock, Expr, Function, Loop, SeqExpr, Var, VarBinding,
)
from ..ir.error_sites import reports_errors
from ..ir.functor import ExprMutator, use_counts
from ..ir.fusion import inline_producer, merge_inputs
from ..ir.launch import MAX_STORAGE_BINDINGS, argument_bindings
from ..ir.module import IRModule, ProgramTable, drop_uncalled_programs
from ..ir.pattern import Pattern, analyze_matmul, program_pattern
from ..ir.symbolic import Analyzer, IntImm, PrimExpr, product
from ..ir.tir import (
    MATH_CALLS, Gather, Load, Select, TensorProgram, Unary, contains_reduce, expression_depth, expression_size,
    loads_of, scalar_nodes,
)
from ..ir.struct_info import TensorStructInfo
from .context import PassContext

MAX_STORAGE_BUFFERS = MAX_STORAGE_BINDINGS  # WebGPU's default maxStorageBuffersPerShaderStage
MAX_BODY_SIZE = 600  # nodes in a merged program's body
MAX_BODY_DEPTH = 64  # nesting levels of a merged program's body


def fuse_ops(module: IRModule) -> IRModule:
    """Merge producer/consumer tensor-program calls in every graph function."""
    analyzer = Analyzer.from_bounds(PassContext.current().bounds)  # the user's bounds help prove sizes
    programs = dict(module.programs)
    functions = {}
    for name, function in module.functions.items():
        if not isinstance(function, Function):
            functions[name] = function
            continue
        fuser = _Fuser(programs, analyzer, use_counts(function))
        functions[name] = fuser.visit_function(function)
        programs = fuser.programs
    return drop_uncalled_programs(module.replace(functions=functions, programs=programs))


class _Fuser(ExprMutator):
    """Fuses within each dataflow block and loop body (bindings elsewhere are kept as they are)."""

    def __init__(self, programs: dict, analyzer: Analyzer, uses: dict[Var, int]) -> None:
        super().__init__()
        self.table = ProgramTable(programs)
        self.programs = self.table.programs
        self.analyzer = analyzer
        self.uses = uses
        self.patterns: dict[str, Pattern] = {}

    def visit_dataflow_block(self, block: DataflowBlock) -> DataflowBlock:
        return DataflowBlock(tuple(self.fuse(list(block.bindings))))

    def visit_loop(self, node: Loop) -> Expr:
        loop = super().visit_loop(node)
        assert isinstance(loop, Loop)
        blocks = tuple(BindingBlock(tuple(self.fuse(list(block.bindings)))) for block in loop.body.blocks)
        return Loop(loop.count, loop.iteration, loop.carried, loop.init, SeqExpr(blocks, loop.body.body))

    def fuse(self, bindings: list) -> list:
        """The bindings of one block, merged.

        Forward sweeps until nothing merges, in two phases: first every merge but an
        elementwise producer into a reducing consumer, then those too (epilogues merge
        before prologues).  After a merge the sweep steps back to the producers of what the
        merged producer read: their consumers changed, so they may merge now, before the
        sweep goes on (a convolution's SiLU merges into its output's two slices only after
        the convolution took the SiLU as its epilogue).  A merge removes the producer and
        rewrites its consumers in place, so the block is kept as slots (None once removed)
        with each variable's consumers indexed: a merge costs the size of the programs it
        merges, never a scan of the block.  An attempt that failed is not repeated while its
        producer and consumers are the same bindings (the answer depends on nothing else)."""
        block = _Block(bindings)
        for prologues in (False, True):
            failed: dict[int, tuple] = {}  # id(producer) -> (producer, its consumers) that did not merge
            changed = True
            while changed:
                changed = False
                position = 0
                while position < len(block.slots):
                    producer = block.slots[position]
                    position += 1
                    if producer is None:
                        continue
                    consumers = block.consumers(producer)
                    attempt = (producer, tuple(block.slots[i] for i in consumers))
                    previous = failed.get(id(producer))
                    if previous is not None and _same_bindings(previous, attempt):
                        continue
                    fused_calls = self.try_merge(producer, consumers, block, prologues)
                    if fused_calls is None:
                        failed[id(producer)] = attempt
                        continue
                    self._count_uses(producer, [block.slots[i].value for i in fused_calls], fused_calls.values())
                    block.remove(position - 1)
                    for i, call in fused_calls.items():
                        block.replace_value(i, call)
                    position = min([position, *block.definitions(_arg_vars(producer.value))])
                    changed = True
        return block.bindings()

    def _count_uses(self, producer: VarBinding, old_calls: list, new_calls) -> None:
        """Keep :attr:`uses` true after a merge: the consumers' new calls read the producer's
        arguments instead of its result (a tensor both read is passed once), so a variable
        read twice before may be read once now (a convolution read by a SiLU's sigmoid and
        multiply, and then by the one merged program: its epilogue can merge)."""
        for call in (producer.value, *old_calls):
            for var in _arg_vars(call):
                self.uses[var] = self.uses.get(var, 0) - 1
        for call in new_calls:
            for var in _arg_vars(call):
                self.uses[var] = self.uses.get(var, 0) + 1

    def try_merge(self, producer: object, consumers: list[int], block: _Block,
                  prologues: bool = True) -> dict[int, CallTIR] | None:
        """The new call of each consumer (by slot) with ``producer`` merged in, or None.

        Without ``prologues`` (the first phase of :meth:`fuse`), an elementwise producer
        does not merge into a consumer with reductions yet: its own chain completes first
        and merges as the epilogue of the reduction before it (a convolution's SiLU, a
        matmul's GELU: computed once per element, not once per use in the next kernel's
        tiles or, for a 3x3 convolution, once per kernel tap)."""
        if not (isinstance(producer, VarBinding) and self._is_program_call(producer.value)):
            return None
        var = producer.var
        if not consumers or sum(_arg_vars(block.slots[i].value).count(var) for i in consumers) != self.uses.get(var, 0):
            return None  # used elsewhere too: an output, a tuple, an If, a library kernel ...
        if not all(self._is_program_call(block.slots[i].value) for i in consumers):
            return None
        reduces = self.pattern(producer.value.program) in (Pattern.REDUCTION, Pattern.MATMUL)
        if not prologues and not reduces and any(
                self.pattern(block.slots[i].value.program) in (Pattern.REDUCTION, Pattern.MATMUL) for i in consumers):
            return None
        if not reduces and _concatenates(self.programs[producer.value.program]) and any(
                self.pattern(block.slots[i].value.program) is Pattern.REDUCTION for i in consumers):
            return None  # a concatenation stays a kernel before a reduction (see _concatenates)
        if not reduces and _concatenates(self.programs[producer.value.program], same_buffer=True) and any(
                _windowed_matmul(self.programs[block.slots[i].value.program]) for i in consumers):
            return None  # nor is it gathered at every tap of a convolution's window (see _windowed_matmul)
        if reduces and len(consumers) != 1:
            return None
        if not reduces and len(consumers) > 1 and _calls_math(self.programs[producer.value.program]):
            return None  # its exp, erf or tanh computed once, not again in each consumer
        fused_calls = {}
        for i in consumers:
            call = self.merge_call(producer, block.slots[i].value, reduces)
            if call is None:
                return None
            fused_calls[i] = call
        return fused_calls

    def merge_call(self, producer: VarBinding, consumer_call: CallTIR, producer_reduces: bool) -> CallTIR | None:
        """The consumer call with the producer merged into its program, or None if not allowed."""
        producer_call: CallTIR = producer.value  # type: ignore[assignment]
        consumer = self.programs[consumer_call.program]
        source = self.programs[producer_call.program]
        positions = [i for i, arg in enumerate(consumer_call.args) if arg is producer.var]
        if producer_reduces and not self._epilogue_allowed(consumer, consumer_call, producer, positions):
            return None
        program, values = consumer, dict(consumer_call.size_var_values)
        args: list[Expr] = list(consumer_call.args)
        # inline one argument position at a time (a consumer may pass the tensor twice)
        for position in sorted(positions, reverse=True):
            name = program.inputs[position].name
            if any(isinstance(load, Gather) for load in loads_of(program.body, name)):
                return None
            fused = inline_producer(program, values, name, source, dict(producer_call.size_var_values))
            args = [args[i] if side == "consumer" else producer_call.args[i] for side, i in fused.input_sources]
            program, values = fused.program, fused.size_var_values
        program, args = _merge_duplicate_inputs(program, args)
        if (_storage_bindings(args, program) > MAX_STORAGE_BUFFERS or expression_size(program.body) > MAX_BODY_SIZE
                or expression_depth(program.body) > MAX_BODY_DEPTH):
            return None
        if (Pattern.MATMUL in (self.pattern(producer_call.program), self.pattern(consumer_call.program))
                and program_pattern(program) is not Pattern.MATMUL):
            return None  # e.g. a head-merging transpose after attention: keep the tiled matmul
        if (producer_reduces and self.pattern(producer_call.program) is Pattern.MATMUL
                and not self.analyzer.prove_less_equal(_tile_elements(source), _tile_elements(program))):
            return None  # the epilogue would make rows or columns batch axes: keep the matmul's tiles
        name = self.table.add(program)
        return CallTIR(name, tuple(args), consumer_call.struct_info,
                       tuple((v.name, values[v.name]) for v in self.programs[name].size_vars))

    def _epilogue_allowed(self, consumer: TensorProgram, call: CallTIR, producer: VarBinding, positions: list[int]) -> bool:
        """A reduction merges into a consumer that computes each of its elements once."""
        if contains_reduce(consumer.body) or len(positions) != 1:
            return False
        loads = loads_of(consumer.body, consumer.inputs[positions[0]].name)
        if len({getattr(load, "indices", None) for load in loads}) != 1:
            return False
        produced, consumed = producer.var.struct_info, call.struct_info
        if not (isinstance(produced, TensorStructInfo) and isinstance(consumed, TensorStructInfo)):
            return False
        if produced.shape is None or consumed.shape is None:
            return False
        return self.analyzer.prove_less_equal(product(consumed.shape), product(produced.shape))

    def pattern(self, name: str) -> Pattern:
        """The pattern of the program named ``name``, computed once (a name's program never changes)."""
        if name not in self.patterns:
            self.patterns[name] = program_pattern(self.programs[name])
        return self.patterns[name]

    def _is_program_call(self, value: object) -> bool:
        return (isinstance(value, CallTIR) and not isinstance(value, CallLibrary)
                and isinstance(self.programs.get(value.program), TensorProgram))



class _Block:
    """A block's bindings while they merge: slots in block order (None once a producer is
    merged away) and, for each variable, the slots of the program calls that read it."""

    def __init__(self, bindings: list) -> None:
        self.slots: list = list(bindings)
        self._readers: dict[Var, set[int]] = {}
        self._definitions: dict[Var, int] = {binding.var: i for i, binding in enumerate(self.slots)
                                             if isinstance(binding, VarBinding)}
        for i, binding in enumerate(self.slots):
            self._index(i, +1)

    def definitions(self, variables: list[Var]) -> list[int]:
        """The slots that bind ``variables`` (those bound in this block and still there)."""
        return [i for i in (self._definitions.get(var) for var in variables)
                if i is not None and self.slots[i] is not None]

    def consumers(self, producer: object) -> list[int]:
        """The slots whose call reads ``producer``'s variable, in block order."""
        if not isinstance(producer, VarBinding):
            return []
        return sorted(self._readers.get(producer.var, ()))

    def remove(self, i: int) -> None:
        self._index(i, -1)
        self.slots[i] = None

    def replace_value(self, i: int, value: Expr) -> None:
        self._index(i, -1)
        self.slots[i] = replace(self.slots[i], value=value)
        self._index(i, +1)

    def bindings(self) -> list:
        return [binding for binding in self.slots if binding is not None]

    def _index(self, i: int, change: int) -> None:
        binding = self.slots[i]
        if not (isinstance(binding, VarBinding) and isinstance(binding.value, CallTIR)):
            return
        for var in _arg_vars(binding.value):
            readers = self._readers.setdefault(var, set())
            if change > 0:
                readers.add(i)
            else:
                readers.discard(i)


def _concatenates(program: TensorProgram, same_buffer: bool = False) -> bool:
    """Whether ``program`` picks between inputs by index (a ``Select`` whose branches read
    different buffers: a concatenation, maybe reshaped or sliced after it; with
    ``same_buffer``, also different parts of one buffer chosen by index alone, as YOLOX's
    space-to-depth stem).  Merged into a reduction it would be evaluated at every step of
    every output, its selection and index arithmetic with it (YOLOv8's detection head: the
    three scales' outputs concatenated, then a softmax over 16 bins of each box side read
    through the concatenation, symbolic divisions at every step); written once as a kernel
    of its own it costs one pass over its elements.  A matmul's prologue evaluates it once
    per element already, unless the matmul sums over a window (:func:`_windowed_matmul`)."""
    for node in scalar_nodes(program.body):
        if isinstance(node, Select):
            read_a, read_b = ({load.buffer.name for load in scalar_nodes(branch) if isinstance(load, Load)}
                              for branch in (node.a, node.b))
            by_index = not any(isinstance(load, Load) for load in scalar_nodes(node.condition))
            if read_a and read_b and (not read_a & read_b or same_buffer and by_index):
                return True
    return False


def _windowed_matmul(program: TensorProgram) -> bool:
    """Whether ``program`` is a matmul that sums over more than one axis (a convolution's
    channels and window): its prologue is evaluated once per window position of each input
    element, not once per element.  YOLOX's stem, four strided slices of the image
    concatenated and read by a 3x3 convolution, took 33 ms at 416 x 416 merged (one thread,
    Chromium), the selections at every tap."""
    info = analyze_matmul(program)
    return info is not None and len(info.reduce_axes) > 1


def _tile_elements(program: TensorProgram) -> PrimExpr:
    """How many output elements a matmul-like program's row x column tiles cover (its batch
    axes not counted; 0 for a program that is no matmul)."""
    info = analyze_matmul(program)
    if info is None:
        return IntImm(0)
    return product([program.output.shape[position] for position in (*info.rows, *info.columns)])


def _calls_math(program: TensorProgram) -> bool:
    """Whether ``program``'s body calls a math function (exp, tanh, log, sin ...; erf and GELU
    are polynomials and an exp).  Such a producer with several consumers stays a kernel: merged,
    each consumer would compute it again (Whisper's GELU before its first layer norm: in the
    mean's, the variance's and the normalization's kernels and the residual add's)."""
    return any(isinstance(node, Unary) and node.op in MATH_CALLS for node in scalar_nodes(program.body))


def _storage_bindings(args: list[Expr], program: TensorProgram) -> int:
    """The storage bindings of ``program``'s kernel called with ``args``: one per argument and
    one for its output, a weight above the split size once per part (``ir/launch.binding_parts``),
    and the run status where it checks the run's data (``ir/error_sites.reports_errors``)."""
    split_bytes = PassContext.current().binding_split_bytes
    return 1 + reports_errors(program) + argument_bindings(args, split_bytes)


def _same_bindings(a: tuple, b: tuple) -> bool:
    """Whether two (producer, consumers) attempts are the same binding objects."""
    return a[0] is b[0] and len(a[1]) == len(b[1]) and all(x is y for x, y in zip(a[1], b[1]))


def _merge_duplicate_inputs(program: TensorProgram, args: list[Expr]) -> tuple[TensorProgram, list[Expr]]:
    """Read a tensor passed at two argument positions through one binding."""
    position = 1
    while position < len(args):
        first = next((i for i in range(position) if args[i] is args[position]), None)
        if first is None:
            position += 1
            continue
        program = merge_inputs(program, first, position)
        args = args[:position] + args[position + 1:]
    return program, args


def _arg_vars(call: CallTIR) -> list[Var]:
    return [arg for arg in call.args if isinstance(arg, Var)]
