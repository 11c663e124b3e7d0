"""The calculator, an MCP toolset verifiers starts per episode (``python -m vf_calc.tools``)."""

import ast
import operator

import verifiers.v1 as vf

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.USub: operator.neg}


def _eval(node):
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    raise ValueError("only integers with + - *")


class CalcToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "calc"          # the model sees calc_evaluate

    @vf.tool
    def evaluate(self, expression: str) -> str:
        """Evaluate an integer expression with + - * and return the value."""
        return str(_eval(ast.parse(expression, mode="eval")))


if __name__ == "__main__":
    CalcToolset.run()
