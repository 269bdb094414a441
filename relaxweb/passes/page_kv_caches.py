"""page_kv_caches: a decoder's KV caches as pools of pages that several sequences share.

With ``--kv-pages N`` (``PassContext.kv_pages``) the caches ``place_kv_caches`` made become a
paged KV cache (``ops/paged_kv.py``, ``relaxweb/library/paged_kv.py``), so one run advances
several sequences at once, each at its own length (continuous batching,
``runtime/paged_generate.py``).  For each layer's cache pair, the pass rewrites::

    past_k  [B, H, p, D]                         ->  past_k [N, H, P, D]   (the pool: N pages of P rows)
    cache = kv_cache_write(past_k, new_k, ...)   ->  cache = paged_kv_write(past_k, new_k, kv_page_table, positions)
    present_k = kv_cache_view(cache, p + s)      ->  present_k = kv_cache_view(cache, N, axis=0)   (the whole pool)
    attention(q, cache_k, cache_v, mask, p + s)  ->  paged_attention(q, cache_k, cache_v, kv_page_table, positions)

with ``positions = cast(position_ids, int32)`` and a new input ``kv_page_table [B, S, M]``
(int32: each token's sequence's pages, ``M = ceil(capacity / P)`` of them).  The runtimes pack
the new tokens of every live sequence into ``input_ids [1, T]``: token ``t`` has its own
position and page table, and attends to positions ``0 .. position_ids[t]`` of its sequence.
The attention mask then has no reader: the mask's computation and the ``attention_mask``
input go, and so does the past length.

This holds for a causal decoder whose mask is the causal one over an all-ones
``attention_mask`` (what ``generate`` feeds): paging is asked for at build.  The pass refuses
(naming why) a model whose caches are not all pageable: a ragged (GroupQueryAttention) cache,
a cache not ``[batch, heads, length, head]``, no ``position_ids`` input, float16 caches, or
anything besides the mask reading ``attention_mask`` or the past length.

It runs right after ``place_kv_caches``; without ``kv_pages`` it changes nothing.
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import UnsupportedModelError
from ..ir.builder import FunctionBuilder
from ..ir.expr import Call, DataflowVar, Function, PrimValue, Var, VarBinding
from ..ir.kv_pool import KV_POOL
from ..ir.functor import ExprMutator, iter_bindings, use_counts
from ..ir.module import IRModule
from ..ir.struct_info import TensorStructInfo
from ..ir.symbolic import IntImm, SizeVar, as_int, free_vars
from ..ops import call_op
from .context import PassContext

#: The input the pass adds: each token's sequence's page table.
PAGE_TABLE_INPUT = "kv_page_table"


def page_kv_caches(module: IRModule) -> IRModule:
    """Rewrite every KV cache of ``main`` into a pool of ``PassContext.kv_pages`` pages (see
    the module doc); unchanged without ``kv_pages``."""
    context = PassContext.current()
    if context.kv_pages is None:
        return module
    main = module.functions.get("main")
    if not isinstance(main, Function):
        return module
    paged, layout = _Pager(main, context.kv_pages, context.kv_page_size).run()
    return module.replace(functions={**module.functions, "main": paged}, attrs={**module.attrs, KV_POOL: layout})


def _refuse(reason: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"--kv-pages: this model's KV caches cannot be paged: {reason}")


class _Pager:
    def __init__(self, function: Function, pages: int, page_size: int) -> None:
        self.function = function
        self.pages, self.page_size = pages, page_size
        self.names = FunctionBuilder.avoiding_names_of(function)

    def run(self) -> tuple[Function, dict]:
        function = self.function
        writes = [b for b in iter_bindings(function) if isinstance(b.value, Call) and b.value.op == "kv_cache_write"]
        if not writes:
            raise _refuse("it has no KV cache (a decoder whose present outputs are concat(past, new), with --bound "
                          "on the past length)")
        inputs = dict(zip(function.input_names, function.params))
        position_ids = inputs.get("position_ids")
        if position_ids is None:
            raise _refuse("it has no position_ids input (each token's position comes from it)")
        past_length = None
        heads = head = capacity = None
        pools: dict[Var, Var] = {}  # past input -> the pool input that replaces it
        for binding in writes:
            past, new, *lengths = binding.value.args
            info = past.struct_info
            if lengths:
                raise _refuse(f"'{binding.var.name}' is a ragged cache (GroupQueryAttention's); paging it is not built yet")
            if past not in function.params:
                raise _refuse(f"the cache '{binding.var.name}' is not written into a past input")
            if (not isinstance(info, TensorStructInfo) or info.shape is None or len(info.shape) != 4
                    or binding.value.attrs["axis"] != 2):
                raise _refuse(f"the past '{past.name}' is not [batch, heads, length, head] with the length on axis 2")
            if info.dtype != "float32":
                raise _refuse(f"the past '{past.name}' is {info.dtype}; pools hold float32")
            kv_heads, size = as_int(info.shape[1]), as_int(info.shape[3])
            if kv_heads is None or size is None:
                raise _refuse(f"the past '{past.name}' has symbolic heads or head size {info.shape}")
            length = info.shape[2]
            if past_length is None:
                past_length, capacity = length, binding.value.attrs["capacity"]
            elif length != past_length or binding.value.attrs["capacity"] != capacity:
                raise _refuse("its caches do not share one past length and capacity")
            shape = (IntImm(self.pages), IntImm(kv_heads), IntImm(self.page_size), IntImm(size))
            pools[past] = Var(past.name, TensorStructInfo(shape, info.dtype))
        batch, tokens = position_ids.struct_info.shape
        self.table_pages = -(-capacity // self.page_size)
        table = Var(self.names.unique_name(PAGE_TABLE_INPUT),
                    TensorStructInfo((batch, tokens, IntImm(self.table_pages)), "int32"))
        rewritten = _PagedRewriter(self, pools, table, position_ids).visit_function(function)
        body = _without_dead_bindings(rewritten)
        used = set(use_counts(body.body)) | {v for b in iter_bindings(body) for v in use_counts(b.value)}
        kept = [(name, pools.get(param, param)) for name, param in zip(function.input_names, function.params)
                if pools.get(param, param) in used or name != "attention_mask"]
        params = [param for _, param in kept] + [table]
        paged = Function(function.name, tuple(params), body.body, tuple(name for name, _ in kept) + (PAGE_TABLE_INPUT,),
                         function.output_names)
        self._check_no_past_length(paged, past_length)
        before, after = (_input_size_vars(f) for f in (function, paged))
        layout = {"pages": self.pages, "page_size": self.page_size, "pages_per_sequence": self.table_pages,
                  "page_table": PAGE_TABLE_INPUT, "capacity": capacity, "replaced_size_vars": sorted(before - after)}
        return paged, layout

    def _check_no_past_length(self, function: Function, past_length) -> None:
        """The past length and the attention mask must have no reader left."""
        if "attention_mask" in function.input_names:
            reader = next(b.var.name for b in iter_bindings(function)
                          if function.params[function.input_names.index("attention_mask")] in use_counts(b.value))
            raise _refuse(f"'{reader}' reads attention_mask, not only the attention mask's computation")
        if not isinstance(past_length, SizeVar):
            return
        for binding in iter_bindings(function):
            info = binding.var.struct_info
            if isinstance(info, TensorStructInfo) and info.shape is not None and any(
                    past_length in free_vars(dim) for dim in info.shape):
                raise _refuse(f"'{binding.var.name}' {info} depends on the past length {past_length.name}")


class _PagedRewriter(ExprMutator):
    def __init__(self, pager: _Pager, pools: dict[Var, Var], table: Var, position_ids: Var) -> None:
        super().__init__(var_remap=dict(pools))
        self.pager = pager
        self.table = table
        self.position_ids = position_ids
        self.positions: Var | None = None
        self.caches: set[Var] = set()  # the rewritten cache writes' variables

    def token_positions(self) -> Var:
        """``cast(position_ids, int32)``, bound once before the first paged op."""
        if self.positions is None:
            value = call_op("cast", self.position_ids, dtype="int32")
            kind = DataflowVar if self.in_dataflow_block else Var
            self.positions = kind(self.pager.names.unique_name("kv_positions"), value.struct_info)
            self.emit_binding(VarBinding(self.positions, value))
        return self.positions

    def visit_var_binding(self, binding: VarBinding) -> None:
        value = binding.value
        if not isinstance(value, Call) or value.op not in ("kv_cache_write", "kv_cache_view", "attention"):
            return super().visit_var_binding(binding)
        args = tuple(self.visit_expr(arg) for arg in value.args)
        if value.op == "attention" and args[1] not in self.caches:
            return super().visit_var_binding(binding)
        if value.op == "kv_cache_write":
            new_value = call_op("paged_kv_write", args[0], args[1], self.table, self.token_positions())
        elif value.op == "kv_cache_view":
            new_value = call_op("kv_cache_view", args[0], PrimValue(IntImm(self.pager.pages)), axis=0)
        else:
            if args[2] not in self.caches:
                raise _refuse(f"the attention '{binding.var.name}' reads a paged key cache with unpaged values")
            new_value = call_op("paged_attention", args[0], args[1], args[2], self.table, self.token_positions(),
                                scale=float(value.attrs.get("scale", 1.0)))
        kind = DataflowVar if isinstance(binding.var, DataflowVar) else Var
        var = kind(binding.var.name, new_value.struct_info)
        self.var_remap[binding.var] = var
        if value.op == "kv_cache_write":
            self.caches.add(var)
        self.emit_binding(VarBinding(var, new_value))


def _input_size_vars(function: Function) -> set[str]:
    return {var.name for param in function.params if isinstance(param.struct_info, TensorStructInfo)
            and param.struct_info.shape is not None for dim in param.struct_info.shape for var in free_vars(dim)}


def _without_dead_bindings(function: Function) -> Function:
    """``function`` without the bindings its outputs do not need (the attention mask's computation)."""
    live = set(use_counts(function.body.body))
    keep: set[int] = set()
    for block in reversed(function.body.blocks):
        for binding in reversed(block.bindings):
            if binding.var in live:
                keep.add(id(binding))
                live |= set(use_counts(binding.value))
    blocks = tuple(type(block)(tuple(b for b in block.bindings if id(b) in keep)) for block in function.body.blocks)
    return replace(function, body=replace(function.body, blocks=tuple(b for b in blocks if b.bindings)))
