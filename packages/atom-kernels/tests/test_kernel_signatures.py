"""Kernel signatures Triton's GPU launcher can bind: what the CPU interpreter cannot show.

The launcher binds a kernel's arguments in a generated function with locals of its own (`params`,
`specialization`, `options`); an argument of one of those names is shadowed by that local there, and the
launch fails on a GPU only ("failed to specialize argument of type: dict" for one named params).
"""

import ast
from pathlib import Path

import atom_kernels

BINDER_LOCALS = {"params", "specialization", "options", "backend"}
SRC = Path(atom_kernels.__file__).parent


def _jit_functions():
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            is_jit = isinstance(node, ast.FunctionDef) and any(
                "jit" in ast.unparse(d) for d in node.decorator_list
            )
            if is_jit:
                yield path.relative_to(SRC), node


def test_no_kernel_argument_is_named_as_a_launcher_local():
    found = [
        f"{path}:{node.lineno} {node.name}({name})"
        for path, node in _jit_functions()
        for name in (a.arg for a in node.args.args)
        if name in BINDER_LOCALS
    ]
    assert not found, found


def test_the_scan_sees_the_kernels():
    assert sum(1 for _ in _jit_functions()) > 50
