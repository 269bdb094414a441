"""lower_shapes_to_host: turn the planned ``main`` into the host function.

Everything the host module must do on each run becomes explicit (see
``relaxweb/ir/host.py``): the checks that bind the size variables from the input shapes and
enforce the model's annotations and the user's bounds (each with its own error message),
the storages and their byte sizes, the weights, and the dispatches in order with the values
of their programs' size variables.  After this pass no graph-level construct is left; the
WebAssembly and WGSL backends read the host function and the tensor programs.
"""

from __future__ import annotations

from ..errors import RelaxwebError, UnsupportedModelError
from ..ir.expr import AllocStorage, AllocTensor, CallTIRInto, Constant, Expr, Function, Tuple, Var
from ..ir.host import (
    BufferRef, HostDispatch, HostFunction, HostInput, HostOutput, HostStorage, ShapeCheck, used_vars,
)
from ..ir.module import IRModule
from ..ir.printer import format_value
from ..ir.struct_info import DTYPE_SIZES, TensorStructInfo
from ..ir.symbolic import SizeVar, as_int, format_expr, product, simplify


def lower_shapes_to_host(module: IRModule) -> IRModule:
    """Replace ``main`` (after plan_memory) by its HostFunction."""
    bounds = dict(module.attrs.get("bounds", {}))
    host = _lower(module.main, bounds)
    return module.with_function(host)  # type: ignore[arg-type]


def _input_checks(function: Function, bounds: dict[str, int]) -> tuple[list[ShapeCheck], list[str]]:
    checks: list[ShapeCheck] = []
    bound_by: dict[str, str] = {}
    order: list[str] = []
    for index, (param, name) in enumerate(zip(function.params, function.input_names)):
        info = param.struct_info
        if not isinstance(info, TensorStructInfo) or info.shape is None:
            raise UnsupportedModelError(f"input '{name}': needs a tensor annotation with a known rank")
        checks.append(ShapeCheck("ndim", index, -1, len(info.shape), None, len(checks) + 1,
                                 f"input '{name}' has {{value}} dimensions, expected {{expected}}"))
        for dim, expected in enumerate(info.shape):
            if isinstance(expected, SizeVar) and expected.name not in bound_by:
                bound_by[expected.name] = f"input '{name}' dimension {dim}"
                order.append(expected.name)
                checks.append(ShapeCheck("bind", index, dim, None, expected.name, 0, ""))
                # Checked at run time against the host's var_bounds, which a runtime may
                # tighten at load even when the build gave no bound.
                checks.append(ShapeCheck(
                    "bound", index, dim, None, expected.name, 0,
                    f"input '{name}': dimension {dim} ({expected.name}) is {{value}}, above its bound "
                    f"{expected.name} <= {{expected}}",
                ))
                continue
            missing = [v for v in used_vars([expected]) if v not in bound_by]
            if missing:
                raise UnsupportedModelError(
                    f"input '{name}': dimension {dim} is {format_expr(expected)}; size variables must first "
                    "appear alone as a dimension"
                )
            if as_int(expected) is not None:
                detail = ""
            else:
                sources = ", ".join(f"{v} from {bound_by[v]}" for v in sorted(used_vars([expected])))
                detail = f" ({format_expr(expected)}; {sources})"
            checks.append(ShapeCheck("equal", index, dim, expected, None, len(checks) + 1,
                                     f"input '{name}': dimension {dim} is {{value}}, expected {{expected}}{detail}"))
    # number the codes densely (bind checks have none)
    numbered, code = [], 0
    for check in checks:
        if check.kind == "bind":
            numbered.append(check)
        else:
            code += 1
            numbered.append(ShapeCheck(check.kind, check.input, check.dim, check.expected, check.variable, code, check.message))
    return numbered, order


def _lower(function: Function, bounds: dict[str, int]) -> HostFunction:
    checks, symbolic_vars = _input_checks(function, bounds)
    unknown = sorted(set(bounds) - set(symbolic_vars))
    if unknown:
        raise RelaxwebError(
            f"--bound names {', '.join(unknown)}, but the model's symbolic variables are: "
            f"{', '.join(symbolic_vars) or '(none)'}"
        )
    storages: list[HostStorage] = []
    inputs = []
    storage_of: dict[Var, int] = {}
    for param, name in zip(function.params, function.input_names):
        info = param.struct_info
        assert isinstance(info, TensorStructInfo) and info.shape is not None
        storage_of[param] = len(storages)
        inputs.append(HostInput(name, info.dtype, info.shape, len(storages)))
        storages.append(HostStorage(simplify(product(info.shape) * DTYPE_SIZES[info.dtype]), "input"))

    outputs_vars = list(function.body.body.fields) if isinstance(function.body.body, Tuple) else [function.body.body]
    planned: dict[Var, int] = {}
    weights: list[Constant] = []
    weight_index: dict[int, int] = {}
    dispatches: list[HostDispatch] = []

    def buffer_ref(expr: Expr) -> BufferRef:
        if isinstance(expr, Constant):
            if id(expr) not in weight_index:
                weight_index[id(expr)] = len(weights)
                weights.append(expr)
            return BufferRef("weight", weight_index[id(expr)])
        if isinstance(expr, Var) and expr in storage_of:
            return BufferRef("storage", storage_of[expr])
        raise ValueError(f"lower_shapes_to_host: {format_value(expr)} is not a planned tensor")

    for binding in function.bindings():
        value = binding.value
        if isinstance(value, AllocStorage):
            planned[binding.var] = len(storages)
            storages.append(HostStorage(value.size, "intermediate"))
        elif isinstance(value, AllocTensor):
            storage_of[binding.var] = planned[value.storage]
        elif isinstance(value, CallTIRInto):
            refs = tuple(buffer_ref(a) for a in value.args) + (buffer_ref(value.output),)
            info = value.output.struct_info
            args = ", ".join(format_value(a) for a in value.args)
            dispatches.append(HostDispatch(
                value.program, refs, value.size_var_values, product(info.shape),
                f"{value.output.name} = {value.program}({args})",
            ))
        else:
            raise ValueError(f"lower_shapes_to_host expects a planned function, found {type(value).__name__}")

    outputs = []
    for var, name in zip(outputs_vars, function.output_names):
        if not isinstance(var, Var) or var not in storage_of or storage_of[var] < len(inputs):
            raise UnsupportedModelError(f"output '{name}' must be computed by the model (not an input or a constant)")
        info = var.struct_info
        storages[storage_of[var]] = HostStorage(storages[storage_of[var]].size, "output")
        outputs.append(HostOutput(name, info.dtype, info.shape, storage_of[var]))

    needed = used_vars([s.size for s in storages]) | used_vars(
        [v for d in dispatches for _, v in d.size_var_values]
    ) | used_vars([d for o in outputs for d in o.shape])
    missing = sorted(needed - set(symbolic_vars))
    if missing:
        raise UnsupportedModelError(
            f"symbolic variable(s) {', '.join(missing)} cannot be computed from the input shapes "
            "(data-dependent shapes are not supported yet)"
        )
    return HostFunction(
        function.name, tuple(inputs), tuple(outputs), tuple(symbolic_vars),
        tuple((v, bounds.get(v)) for v in symbolic_vars), tuple(checks), tuple(storages),
        tuple(weights), tuple(dispatches),
    )
