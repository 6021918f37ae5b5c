"""The wire-format contract between ferry's engine and verl's installed rollout adapters.

verl's CheckpointEngineWorker.update_weights hands the engine's receive_weights() to the
server adapter with wire_format=getattr(engine, "wire_format", "named_tensors"), and each
adapter's update_weights branches on or asserts that value. ferry's rollout yields
(name, tensor) pairs, i.e. verl's "named_tensors" (CheckpointEngine's default). The adapters
(vLLM, TensorRT-LLM, SGLang) cannot be imported without their engines, so their source is
read from the installed verl package and every test in update_weights that involves only
wire_format is evaluated: each assert must hold for the engine's value, and each if must go
the way it goes for "named_tensors" (the delta_flush branches must not be taken).
"""

from __future__ import annotations

import ast
import importlib.util
import os

import pytest

from ferry.verl.checkpoint_engine import FerryCheckpointEngine

NAMED_TENSORS = "named_tensors"
ADAPTERS = {  # module -> must it assert wire_format (so that a wrong value is refused)?
    "verl.workers.rollout.vllm_rollout.vllm_rollout": True,
    "verl.workers.rollout.trtllm_rollout.trtllm_rollout": True,
    "verl.workers.rollout.sglang_rollout.sglang_rollout": False,
}


def _source(module: str) -> tuple[str, str]:
    spec = importlib.util.find_spec(module.rsplit(".", 1)[0])  # the package imports cleanly
    path = os.path.join(os.path.dirname(spec.origin), module.rsplit(".", 1)[1] + ".py")
    with open(path) as f:
        return path, f.read()


def _update_weights(tree: ast.Module) -> ast.AsyncFunctionDef:
    found = [node for cls in tree.body if isinstance(cls, ast.ClassDef)
             for node in cls.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
             and node.name == "update_weights"
             and "wire_format" in [a.arg for a in node.args.args + node.args.kwonlyargs]]
    assert len(found) == 1, f"{len(found)} update_weights methods taking wire_format"
    return found[0]


def _own_nodes(function: ast.AST):
    """The function's nodes, not those of functions defined inside it."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def _on_wire_format(test: ast.expr) -> bool:
    names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
    return names == {"wire_format"}


def _evaluate(test: ast.expr, value: str) -> bool:
    code = compile(ast.Expression(test), "<wire_format test>", "eval")
    return bool(eval(code, {"__builtins__": {}}, {"wire_format": value}))


def violations(module: str, value: str) -> tuple[list[str], int]:
    """What in `module`'s update_weights refuses or misroutes wire_format=value, and how
    many wire_format checks it has."""
    path, text = _source(module)
    function = _update_weights(ast.parse(text, path))
    found, checks = [], 0
    for node in _own_nodes(function):
        if isinstance(node, ast.Assert) and _on_wire_format(node.test):
            checks += 1
            if not _evaluate(node.test, value):
                found.append(f"{os.path.basename(path)}:{node.lineno}: "
                             f"assert {ast.unparse(node.test)} fails for {value!r}")
        elif isinstance(node, ast.If) and _on_wire_format(node.test):
            checks += 1
            if _evaluate(node.test, value) != _evaluate(node.test, NAMED_TENSORS):
                found.append(f"{os.path.basename(path)}:{node.lineno}: "
                             f"if {ast.unparse(node.test)} goes another way for {value!r} "
                             f"than for {NAMED_TENSORS!r}")
    return found, checks


@pytest.mark.parametrize("module", sorted(ADAPTERS))
def test_engine_wire_format_satisfies_adapter(module):
    value = getattr(FerryCheckpointEngine, "wire_format", NAMED_TENSORS)  # as verl reads it
    found, checks = violations(module, value)
    assert checks, f"{module}.update_weights has no check on wire_format to evaluate"
    # The checker itself must be able to refuse: a value the adapter does not know.
    bogus, _ = violations(module, "no_such_format")
    assert bool(bogus) == ADAPTERS[module], (
        f"{module}: expected the checker to {'refuse' if ADAPTERS[module] else 'accept'} "
        f"an unknown wire_format, got {bogus}")
    assert not found, (f"FerryCheckpointEngine.wire_format = {value!r}, which verl's "
                       f"{module.rsplit('.', 1)[1]} adapter refuses:\n" + "\n".join(found))


def test_engine_yields_named_tensors():
    """ferry's rollout yields (name, tensor) pairs: its wire_format must be verl's name for
    that, not a name of its own."""
    assert getattr(FerryCheckpointEngine, "wire_format", NAMED_TENSORS) == NAMED_TENSORS
