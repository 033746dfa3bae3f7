"""Read a CosyVoice ``cosyvoice2.yaml`` (HyperPyYAML) as plain data.

The released file binds weights to python import paths through tags such as
``!new:cosyvoice.flow.flow.CausalMaskedDiffWithXvec``. We never import or call
anything named by a tag: a tagged mapping becomes a plain ``dict`` with the tag
kept under ``"__tag__"``, ``!ref <name>`` is resolved against the top-level
keys (with the simple arithmetic HyperPyYAML allows, e.g. ``<a> * <b>``), and
``!apply:`` entries (global seeding side effects) are dropped.
"""

from __future__ import annotations

import ast
import operator
import re
from pathlib import Path
from typing import Any

import yaml

from cadenza.errors import CheckpointError

_REF = re.compile(r"<([A-Za-z_][A-Za-z0-9_.]*)>")


class _Ref(str):
    """An unresolved ``!ref`` expression."""


class _TagTolerantLoader(yaml.SafeLoader):
    pass


def _construct_tagged(loader: yaml.SafeLoader, tag_suffix: str, node: yaml.Node) -> Any:
    tag = node.tag
    if tag == "!ref":
        return _Ref(loader.construct_scalar(node))
    if isinstance(node, yaml.MappingNode):
        value = loader.construct_mapping(node, deep=True)
        value = dict(value)
        if tag.endswith("DictConfig") and set(value) == {"content"}:
            return value["content"]
        value["__tag__"] = tag
        return value
    if isinstance(node, yaml.SequenceNode):
        return {"__tag__": tag, "__args__": loader.construct_sequence(node, deep=True)}
    return {"__tag__": tag, "__value__": loader.construct_scalar(node)}


_TagTolerantLoader.add_multi_constructor("!", _construct_tagged)

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
}


def _eval_arith(expr: str) -> Any:
    """Evaluate a numeric expression of literals and + - * / //, nothing else."""

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError(f"unsupported expression {expr!r}")

    return ev(ast.parse(expr, mode="eval"))


def _resolve(value: Any, top: dict[str, Any], depth: int = 0) -> Any:
    if depth > 20:
        raise ValueError("!ref nesting too deep (cycle?)")
    if isinstance(value, _Ref):
        names = _REF.findall(value)
        if len(names) == 1 and value.strip() == f"<{names[0]}>":
            return _resolve(_lookup(top, names[0]), top, depth + 1)
        substituted = _REF.sub(lambda m: repr(_resolve(_lookup(top, m.group(1)), top, depth + 1)), value)
        return _eval_arith(substituted)
    if isinstance(value, dict):
        return {k: _resolve(v, top, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, top, depth + 1) for v in value]
    return value


def _lookup(top: dict[str, Any], dotted: str) -> Any:
    node: Any = top
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ValueError(f"!ref <{dotted}> names no entry of the file")
        node = node[part]
    return node


def read_hyperpyyaml(path: str | Path) -> dict[str, Any]:
    """Parse a HyperPyYAML file into nested dicts/lists of numbers and strings."""
    path = Path(path)
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_TagTolerantLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path} is not a YAML mapping")
    raw = {k: v for k, v in raw.items() if not (isinstance(v, dict) and str(v.get("__tag__", "")).startswith("!apply:"))}
    # Resolve lazily per entry: sections we never read (training data pipeline) may hold refs we don't care about.
    out: dict[str, Any] = {}
    for key, value in raw.items():
        try:
            out[key] = _resolve(value, raw)
        except ValueError:
            out[key] = None
    return out
