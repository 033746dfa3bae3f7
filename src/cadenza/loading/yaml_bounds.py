"""How big a YAML document becomes once its aliases are expanded, measured on the node graph before construction.

Untrusted YAML (a model's config, a training config) can be a "billion laughs": a few lines whose aliases (``*a``)
expand to billions of values. ``expanded_size`` counts what the document stands for with one visit per distinct node
(sizes are memoised), and refuses too many nodes, too deep a nesting, or an alias that contains itself.
"""

from __future__ import annotations

import yaml


class YamlTooLarge(ValueError):
    """The document expands past the bounds (the message says which); callers turn it into their own error."""


def expanded_size(root: yaml.Node, max_nodes: int, max_depth: int) -> int:
    """Nodes ``root`` stands for with every alias expanded; ``YamlTooLarge`` past ``max_nodes`` / ``max_depth``."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node, depth: int) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise YamlTooLarge("an alias refers to a node that contains it (a recursive structure)")
        if depth > max_depth:
            raise YamlTooLarge(f"it nests deeper than {max_depth} levels")
        active.add(key)
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [item for pair in node.value for item in pair]
        else:
            children = []
        total = 1
        for child in children:
            total += size(child, depth + 1)
            if total > max_nodes:
                raise YamlTooLarge(f"it expands to more than {max_nodes:,} nodes (YAML aliases): an alias bomb?")
        active.discard(key)
        sizes[key] = total
        return total

    return size(root, 0)
