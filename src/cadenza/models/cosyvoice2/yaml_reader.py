"""Read a CosyVoice ``cosyvoice2.yaml`` (HyperPyYAML) as plain data.

The released file binds weights to python import paths through tags such as
``!new:cosyvoice.flow.flow.CausalMaskedDiffWithXvec``. We never import or call
anything named by a tag: a tagged mapping becomes a plain ``dict`` with the tag
kept under ``"__tag__"``, ``!ref <name>`` is resolved against the top-level
keys (with the simple arithmetic HyperPyYAML allows, e.g. ``<a> * <b>``), and
``!apply:`` entries (global seeding side effects) are dropped.

The file is untrusted input: its size, nesting depth and the number of nodes after YAML alias (``*a``) and
``!ref`` expansion are bounded, so a "billion laughs" file fails in milliseconds instead of exhausting memory.
A ``!ref`` that cannot be resolved becomes an ``Unresolved`` value in place (sections of the file we never read,
such as the training data pipeline, may hold refs we do not care about); the config reader reports it when it
needs that value.
"""

from __future__ import annotations

import ast
import operator
import re
from pathlib import Path
from typing import Any

import yaml

from cadenza.errors import CheckpointError
from cadenza.loading.files import read_text
from cadenza.loading.yaml_bounds import YamlTooLarge, expanded_size

_REF = re.compile(r"<([A-Za-z_][A-Za-z0-9_.]*)>")
# The release's file has well under a thousand nodes and nests 6 deep; these bounds leave ample room.
MAX_NODES = 20_000  # nodes after alias and !ref expansion
MAX_DEPTH = 64
MAX_EXPRESSION_CHARS = 256  # a !ref arithmetic expression after substitution


class Unresolved:
    """A ``!ref`` that could not be resolved; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"Unresolved({self.reason!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Unresolved) and other.reason == self.reason

    def __hash__(self) -> int:
        return hash(self.reason)


class _Ref(str):
    """An unresolved ``!ref`` expression."""


class _TooLarge(Exception):
    pass


def _check_node_graph(root: yaml.Node) -> None:
    """Refuse a document whose alias-expanded size exceeds ``MAX_NODES`` (or nests deeper than ``MAX_DEPTH``, or
    contains itself), before it is constructed."""
    try:
        expanded_size(root, MAX_NODES, MAX_DEPTH)
    except YamlTooLarge as exc:
        raise _TooLarge(str(exc)) from None


class _TagTolerantLoader(yaml.SafeLoader):
    _depth = 0

    def compose_node(self, parent, index):  # type: ignore[override]
        # Stop at MAX_DEPTH while composing: PyYAML recurses per level, and a deep "[[[[..." would otherwise
        # run into Python's recursion limit slowly (seconds for a 10 KB file).
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _TooLarge(f"it nests deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> yaml.Node:  # type: ignore[override]
        node = super().compose_document()
        if node is not None:
            _check_node_graph(node)  # before construction: the constructed data is what expands
        return node


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
    if len(expr) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"!ref expression longer than {MAX_EXPRESSION_CHARS} characters")

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError(f"unsupported !ref expression {expr!r}")

    try:
        return ev(ast.parse(expr, mode="eval"))
    except (SyntaxError, ArithmeticError, RecursionError, MemoryError) as exc:
        raise ValueError(f"cannot evaluate !ref expression {expr!r}: {exc}") from exc


class _Resolver:
    """Resolves ``!ref`` values against the top-level mapping, counting every node it produces."""

    def __init__(self, top: dict[Any, Any]) -> None:
        self.top = top
        self.nodes = 0

    def resolve(self, value: Any, chain: tuple[str, ...] = (), depth: int = 0) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise _TooLarge(f"it expands to more than {MAX_NODES:,} nodes (!ref)")
        if depth > MAX_DEPTH:
            raise _TooLarge(f"it nests deeper than {MAX_DEPTH} levels (!ref)")
        if isinstance(value, _Ref):
            try:
                return self._resolve_ref(value, chain, depth)
            except ValueError as exc:
                return Unresolved(str(exc))
        if isinstance(value, dict):
            return {k: self.resolve(v, chain, depth + 1) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v, chain, depth + 1) for v in value]
        return value

    def _resolve_ref(self, ref: _Ref, chain: tuple[str, ...], depth: int) -> Any:
        names = _REF.findall(ref)
        if not names:
            raise ValueError(f"!ref {str(ref)!r} names no entry (expected <name>)")

        def value_of(name: str) -> Any:
            if name in chain:
                raise ValueError(f"!ref cycle: {' -> '.join((*chain, name))}")
            resolved = self.resolve(self._lookup(name), (*chain, name), depth + 1)
            if isinstance(resolved, Unresolved):
                raise ValueError(resolved.reason)
            return resolved

        if len(names) == 1 and ref.strip() == f"<{names[0]}>":
            return value_of(names[0])
        substituted = _REF.sub(lambda m: repr(value_of(m.group(1))), ref)
        return _eval_arith(substituted)

    def _lookup(self, dotted: str) -> Any:
        node: Any = self.top
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                raise ValueError(f"!ref <{dotted}> names no entry of the file")
            node = node[part]
        return node


def read_hyperpyyaml(path: str | Path) -> dict[str, Any]:
    """Parse a HyperPyYAML file into nested dicts/lists of numbers and strings (``Unresolved`` where a ``!ref``
    cannot be resolved). Raises ``CheckpointError`` naming the file for anything that is not such a file."""
    path = Path(path)
    text = read_text(path)
    try:
        raw = yaml.load(text, Loader=_TagTolerantLoader)
    except _TooLarge as exc:
        raise CheckpointError(f"{path} is refused: {exc}") from exc
    except RecursionError as exc:
        raise CheckpointError(f"{path} is refused: it nests too deeply") from exc
    except Exception as exc:  # noqa: BLE001 - PyYAML raises YAMLError, ValueError, TypeError... for a bad file
        raise CheckpointError(f"cannot read {path} as YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path} is not a YAML mapping")
    raw = {k: v for k, v in raw.items() if not (isinstance(v, dict) and str(v.get("__tag__", "")).startswith("!apply:"))}
    resolver = _Resolver(raw)
    try:
        return {key: resolver.resolve(value) for key, value in raw.items()}
    except _TooLarge as exc:
        raise CheckpointError(f"{path} is refused: {exc}") from exc
    except RecursionError as exc:
        raise CheckpointError(f"{path} is refused: it nests too deeply") from exc
