"""Input dims that exporters name by an expression of other dims.

optimum and transformers.js exports name the attention mask's length
``past_sequence_length + sequence_length`` (or ``past_sequence_length + 1``): the sum of two
other inputs' dims, written as text.  Taken as a variable of its own, it is a size the graph
cannot relate to the past and the new tokens (so the buffers that depend on it have no bound
and grow as generation goes).  Taken as the expression it says, the mask's length is checked
against the other two at run time and every size stays bounded by theirs.

Only sums, differences and products of integers and of names that some input dim has alone
are read so; any other text stays a name, as before.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping

from ..ir.symbolic import PrimExpr, SizeVar

_OPERATORS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}
#: Longer texts are names (and not worth parsing).
MAX_EXPRESSION_CHARACTERS = 200


def dim_expression(text: str, variables: Mapping[str, str]) -> PrimExpr | None:
    """The expression ``text`` writes over the dims named in ``variables`` (a dim_param ->
    its size variable), or None when ``text`` is a plain name or not such an expression."""
    if len(text) > MAX_EXPRESSION_CHARACTERS or not any(sign in text for sign in "+-*"):
        return None
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError):
        return None
    return _read(tree, variables)


def _read(node: ast.expr, variables: Mapping[str, str]) -> PrimExpr | int | None:
    if isinstance(node, ast.Name):
        return SizeVar(variables[node.id]) if node.id in variables else None
    if isinstance(node, ast.Constant):
        return node.value if type(node.value) is int and node.value >= 0 else None
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _read(node.left, variables), _read(node.right, variables)
        if left is None or right is None or (isinstance(left, int) and isinstance(right, int)):
            return None
        return _OPERATORS[type(node.op)](left, right)
    return None
