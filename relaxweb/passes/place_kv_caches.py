"""place_kv_caches: a decoder's KV cache in one buffer that never moves.

A decoder exported with a cache (optimum's signature) has, for each layer, an input ``past``
``[batch, heads, p, D]`` and an output ``present = concat(past, new, axis=2)`` that the next
step feeds back as its ``past``.  Computed as written, every step copies the whole past in,
again into ``present``, and out.  This pass finds each such (input, output, axis):

- ``present`` is ``concat(past, new, axis=a)`` (or GroupQueryAttention's
  ``ragged_concat(past, new, lengths, axis=a)``, each batch entry's new rows after its own
  past length) of an input ``past`` read by nothing else (or a ``match_cast`` of one read
  once: a converter's check of a head size the model left symbolic), whose dim ``a`` is a
  size variable and the rest of whose dims are bounded;
- ``present`` is an output, or the one value an ``identity`` output copies (the importer's
  binding of a value the converter also reads);
- the bound of ``present``'s dim ``a`` under the user's bounds is the *capacity* ``C``
  (no bound: no cache, the model builds as written);
- every other reader of ``present`` is an ``attention`` reading it as its keys with a
  ``present`` of the same kind as its values (the only reader that can read the cache's
  layout in place), or a binding the outputs do not need (dropped later);

and rewrites the pair into one cache (``ops/kv_cache.py``)::

    cache = kv_cache_write(past, new, axis=a, capacity=C)     # past's storage, C rows along a
    present = kv_cache_view(cache, prim(p + s), axis=a)       # the output: the valid prefix
    out = attention(q, cache_k, cache_v, mask, prim(p + s))   # reads the prefix in place

(a ragged append gives ``kv_cache_write(past, new, lengths, ...)``; a copied present's view is
bound to the copy's output.)

``plan_memory`` turns the write into an in-place kernel writing only ``new`` at row ``p``;
``lower_shapes_to_host`` gives ``past`` a storage of the cache's size and makes ``present``
an output in that same storage; the manifest lists the pair (``caches``), and the runtimes
keep ``present`` on the GPU as a view that the next run takes back as ``past`` without a copy.
Keys and values form a pair only together: a cache is placed for both or for neither.
It runs after ``fuse_attention`` (which makes the attention op) and before legalization.
"""

from __future__ import annotations

from ..ir.builder import FunctionBuilder
from ..ir.expr import Call, DataflowBlock, DataflowVar, Expr, Function, MatchCast, PrimValue, Tuple, Var, VarBinding
from ..ir.functor import ExprMutator, iter_bindings, use_counts
from ..ir.module import IRModule
from ..ir.struct_info import TensorStructInfo
from ..ir.symbolic import Analyzer, SizeVar, prove_equal
from ..ops import call_op
from .context import PassContext
from .plan_memory import tensor_bytes


def place_kv_caches(module: IRModule) -> IRModule:
    """Give each (past input, present = concat(past, new) output) pair one cache buffer of the
    bound's capacity (see the module doc), under the current context's bounds."""
    analyzer = Analyzer.from_bounds(PassContext.current().bounds)
    functions = {name: _place(f, analyzer) if isinstance(f, Function) and name == "main" else f
                 for name, f in module.functions.items()}
    return module.replace(functions=functions)


#: The ops that append a step's rows to a past: (past, new) or (past, new, each entry's past length).
APPENDS = ("concat", "ragged_concat")


def _place(function: Function, analyzer: Analyzer) -> Function:
    outputs = function.body.body.fields if isinstance(function.body.body, Tuple) else (function.body.body,)
    uses = use_counts(function)
    definitions = {binding.var: binding for binding in iter_bindings(function)}
    named = _output_names(outputs, definitions)
    candidates: dict[Var, tuple[Call, int]] = {}  # present -> (its concat, the capacity)
    for binding in iter_bindings(function):
        value = binding.value
        if not (isinstance(binding, VarBinding) and isinstance(value, Call) and value.op in APPENDS
                and len(value.args) == (2 if value.op == "concat" else 3) and binding.var in named):
            continue
        past = value.args[0]
        info = binding.var.struct_info
        if not (_past_input(past, function, definitions, uses) and isinstance(info, TensorStructInfo)
                and info.shape is not None):
            continue
        axis = value.attrs.get("axis", 0) % len(info.shape)
        capacity = analyzer.upper_bound(info.shape[axis])
        bounded = analyzer.upper_bound(tensor_bytes(info)) is not None  # every dim: the cache is sized at load
        if isinstance(past.struct_info.shape[axis], SizeVar) and capacity is not None and bounded:
            candidates[binding.var] = (value, capacity)
    readers = _attention_readers(function, candidates, named, _dead_vars(function))
    while True:  # a present read otherwise than as attention's keys or values with a cached partner: no cache
        kept = {present for present in candidates if readers.get(present) is not None
                and all(call.args[1] in candidates and call.args[2] in candidates
                        and _same_cache(candidates[call.args[1]], candidates[call.args[2]], call.args[1], call.args[2])
                        for call in readers[present])}
        if kept == set(candidates):
            break
        candidates = {present: candidates[present] for present in kept}
    if not candidates:
        return function
    copies = {named[present]: present for present in candidates}
    # a present read by what the outputs do not need (besides its attentions and its copy) keeps its name, as a view
    read_elsewhere = {present for present in candidates
                      if uses.get(present, 0) > len(readers[present]) + (named[present] is not present)}
    return _CachePlacer(function, candidates, copies, read_elsewhere).visit_function(function)


def _dead_vars(function: Function) -> set[Var]:
    """The variables of top-level bindings the outputs do not need, even through others:
    the importer leaves them (the layout ops a converter looked through); canonicalize_bindings
    drops them later.  What reads a present there does not stop its cache."""
    live = set(use_counts(function.body.body))
    dead: set[Var] = set()
    for block in reversed(function.body.blocks):
        for binding in reversed(block.bindings):
            if binding.var in live:
                live |= set(use_counts(binding.value))
            else:
                dead.add(binding.var)
    return dead


def _output_names(outputs: tuple, definitions: dict) -> dict[Var, Var]:
    """Each variable that is one output, or the one thing an ``identity`` output copies (the
    importer's binding of a value a converter also reads), -> that output."""
    named: dict[Var, Var] = {}
    for var in outputs:
        if outputs.count(var) != 1:
            continue
        binding = definitions.get(var)
        value = binding.value if isinstance(binding, VarBinding) else None
        copied = value.args[0] if isinstance(value, Call) and value.op == "identity" else None
        named[copied if isinstance(copied, Var) and copied not in outputs else var] = var
    return named


def _past_input(past: Expr, function: Function, definitions: dict, uses: dict) -> bool:
    """Whether ``past`` is an input read only here, or a shape check of one (``match_cast``s
    each read once: a converter's check of a symbolic head size against the model's)."""
    while isinstance(past, Var) and uses.get(past) == 1:
        if past in function.params:
            return True
        binding = definitions.get(past)
        if not (isinstance(binding, MatchCast) and isinstance(binding.struct_info, TensorStructInfo)):
            return False
        past = binding.value
    return False


def _attention_readers(function: Function, candidates: dict, named: dict, dead: set[Var]) -> dict[Var, list[Call] | None]:
    """For each candidate, the attention calls reading it as keys or values; None when anything
    else reads it (its output, the identity that copies it into the output, and bindings the
    outputs do not need aside)."""
    readers: dict[Var, list[Call] | None] = {present: [] for present in candidates}
    for binding in iter_bindings(function):
        value = binding.value
        for present in candidates:
            if not _reads(value, present) or binding.var is named[present] or binding.var in dead:
                continue
            ok = (isinstance(value, Call) and value.op == "attention" and present in value.args[1:3]
                  and present not in (value.args[0], *value.args[3:]) and readers[present] is not None
                  and isinstance(value.args[-1].struct_info, TensorStructInfo))  # no key length of its own yet
            readers[present] = readers[present] + [value] if ok else None
    return readers


def _reads(value: Expr, var: Var) -> bool:
    return var in use_counts(value)


def _same_cache(keys: tuple[Call, int], values: tuple[Call, int], k: Var, v: Var) -> bool:
    """Keys and values cached alike: the same axis (the attention's rows), capacity and length."""
    (key_concat, key_capacity), (value_concat, value_capacity) = keys, values
    rank = len(k.struct_info.shape)
    axes = {concat.attrs.get("axis", 0) % rank for concat in (key_concat, value_concat)}
    return (axes == {rank - 2} and key_capacity == value_capacity
            and prove_equal(k.struct_info.shape[rank - 2], v.struct_info.shape[rank - 2]))


class _CachePlacer(ExprMutator):
    def __init__(self, function: Function, candidates: dict[Var, tuple[Call, int]], copies: dict[Var, Var],
                 read_elsewhere: set[Var]) -> None:
        super().__init__()
        self.candidates = candidates
        self.copies = {output: present for output, present in copies.items() if output is not present}
        self.read_elsewhere = read_elsewhere
        self.caches: dict[Var, Var] = {}  # present -> its cache
        self.names = FunctionBuilder.avoiding_names_of(function)

    def visit_dataflow_block(self, block: DataflowBlock) -> DataflowBlock:
        bindings = []
        for binding in block.bindings:
            value = binding.value if isinstance(binding, VarBinding) else None
            if binding.var in self.candidates:
                concat, capacity = self.candidates[binding.var]
                axis = concat.attrs.get("axis", 0) % len(binding.var.struct_info.shape)
                write = call_op("kv_cache_write", *concat.args, axis=axis, capacity=capacity)
                cache = DataflowVar(self.names.unique_name(f"{binding.var.name}_cache"), write.struct_info)
                self.caches[binding.var] = cache
                bindings.append(VarBinding(cache, write))
                if binding.var not in self.copies.values() or binding.var in self.read_elsewhere:
                    bindings.append(VarBinding(binding.var, self.view(binding.var)))  # (a copied one: its copy is)
            elif binding.var in self.copies:
                bindings.append(VarBinding(binding.var, self.view(self.copies[binding.var])))
            elif isinstance(value, Call) and value.op == "attention" and value.args[1] in self.caches:
                q, k, v, *mask = value.args
                length = PrimValue(k.struct_info.shape[-2])
                bindings.append(VarBinding(binding.var, call_op("attention", q, self.caches[k], self.caches[v], *mask,
                                                                 length, **value.attrs)))
            else:
                bindings.append(binding)
        return super().visit_dataflow_block(DataflowBlock(tuple(bindings)))

    def view(self, present: Var) -> Call:
        """``present`` as the valid prefix of its cache."""
        concat, _ = self.candidates[present]
        axis = concat.attrs.get("axis", 0) % len(present.struct_info.shape)
        return call_op("kv_cache_view", self.caches[present], PrimValue(present.struct_info.shape[axis]), axis=axis)
