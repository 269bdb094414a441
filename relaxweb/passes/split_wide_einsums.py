"""split_wide_einsums: an einsum of more operands than one kernel can bind becomes a chain of einsums.

``einsum(x0, ..., xn)`` is legalized as one kernel that binds every operand and its result as
storage buffers, and a WebGPU kernel may bind at most ``MAX_STORAGE_BINDINGS`` (8:
``ir/launch.py``).  This pass contracts the leading operands that fit one kernel into an
intermediate first, keeping only the subscripts that the output or a later operand still
uses, and lets the rest of the einsum read that intermediate in their place, until the
einsum fits::

    y = einsum(x0, ..., x8, equation="ab,bc,cd,de,ef,fg,gh,hi,ij->aj")
      ->  y_part = einsum(x0, ..., x6, equation="ab,bc,cd,de,ef,fg,gh->ah")
          y = einsum(y_part, x7, x8, equation="ah,hi,ij->aj")

A sum over a subscript that no later operand and not the output uses may be taken over the
leading operands alone (the product of the others does not depend on it), so the chain
computes the same tensor, up to the order of float additions.  An ellipsis is kept in the
intermediate where a later operand or the output still has one (its dims broadcast as before)
and summed there otherwise.  An operand too large to fit a kernel even alone is left for the
bundle writer to refuse by name.  The pass runs next to ``split_wide_concats``, before
``legalize_ops``.
"""

from __future__ import annotations

from ..ir.expr import Call, Function, VarBinding
from ..ir.launch import MAX_STORAGE_BINDINGS
from ..ir.module import IRModule
from ..ir.struct_info import TensorStructInfo
from ..ops import call_op
from ..ops.linear_algebra import parse_einsum
from .split_wide_concats import WideCallSplitter

# The storage bindings an einsum kernel may give its operands: all but its output's.
ARGUMENT_BINDINGS = MAX_STORAGE_BINDINGS - 1


def split_wide_einsums(module: IRModule) -> IRModule:
    """Rewrite every einsum whose kernel would bind too many buffers into a chain of einsums."""
    functions = {name: _Splitter(function).visit_function(function) if isinstance(function, Function) else function
                 for name, function in module.functions.items()}
    return module.replace(functions=functions)


class _Splitter(WideCallSplitter):
    """Emits the leading contractions of each wide einsum before its binding."""

    def visit_var_binding(self, binding: VarBinding) -> None:
        value = binding.value
        terms = _terms(value) if isinstance(value, Call) and value.op == "einsum" else None
        if terms is None or self._bindings(value.args) <= ARGUMENT_BINDINGS:
            super().visit_var_binding(binding)
            return
        operands, output = terms
        args = [self.visit_expr(arg) for arg in value.args]
        while self._bindings(args) > ARGUMENT_BINDINGS:
            count = len(self._runs(args)[0])
            if count < 2:
                break  # the first two operands do not fit one kernel: the bundle writer names the weights
            later = operands[count:]
            kept = _kept_subscripts(operands[:count], later, output)
            part = call_op("einsum", *args[:count], equation=f"{','.join(operands[:count])}->{kept}")
            args = [self._emit_part(binding.var, part), *args[count:]]
            operands = [kept, *later]
        equation = f"{','.join(operands)}->{output}"
        self.emit_binding(VarBinding(self.visit_var_def(binding.var), call_op("einsum", *args, equation=equation)))



def _terms(call: Call) -> tuple[list[str], str] | None:
    """The einsum's operand terms and its output term, as written (an implicit output spelled
    out); None where an operand's rank is unknown (its legalization refuses it)."""
    infos = [arg.struct_info for arg in call.args]
    if not all(isinstance(info, TensorStructInfo) and info.ndim >= 0 for info in infos):
        return None
    equation = str(call.attrs["equation"]).replace(" ", "")
    inputs, arrow, output = equation.partition("->")
    if not arrow:
        _, letters, _ = parse_einsum(equation, [info.ndim for info in infos])
        ellipsis = "..." if any(letter.startswith("...") for letter in letters) else ""
        output = ellipsis + "".join(letter for letter in letters if not letter.startswith("..."))
    return inputs.split(","), output


def _kept_subscripts(leading: list[str], later: list[str], output: str) -> str:
    """The term of the intermediate of ``leading``: its subscripts that a later operand or the
    output uses, in the order they first appear, after an ellipsis where one is still used."""
    used = set("".join(later + [output]).replace("...", ""))
    letters = dict.fromkeys(letter for term in leading for letter in term.replace("...", "") if letter in used)
    ellipsis = any("..." in term for term in leading) and any("..." in term for term in [*later, output])
    return ("..." if ellipsis else "") + "".join(letters)
