"""No import circle among Tripwire's modules (issue 12): import-linter's layers contract forbids
upward imports, but modules of one layer may import each other; this checks that no set of modules
imports itself round, annotation-only imports under TYPE_CHECKING included (issue 20): a module
that needs another's type only for annotations names what it uses with a Protocol instead."""

from __future__ import annotations

import pytest

# import-linter's graph builder; in the dev environment (the others run only their marked tests)
grimp = pytest.importorskip("grimp")


def cycles(adjacency: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(adjacency):
        if root in index:
            continue
        work = [(root, iter(sorted(adjacency[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(adjacency[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycles_finds_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_proxy_viewer_addons() -> None:
    graph = grimp.build_graph("proxy", "viewer", "addons", exclude_type_checking_imports=False)
    modules = set(graph.modules)
    adjacency = {m: set(graph.find_modules_directly_imported_by(m)) & modules for m in modules}
    assert cycles(adjacency) == []


def test_the_layers_contract_names_every_module() -> None:
    """Issue 20: a module the layers contract does not name is checked by none of its rules."""
    import pkgutil
    import tomllib
    from pathlib import Path

    import proxy

    config = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    (layers,) = [
        c
        for c in config["tool"]["importlinter"]["contracts"]
        if "containers" not in c and c["type"] == "layers"
    ]
    named = {part.strip() for layer in layers["layers"] for part in layer.replace("|", ":").split(":")}
    modules = {f"proxy.{m.name}" for m in pkgutil.iter_modules(proxy.__path__)}
    assert sorted(modules - named) == []
    assert {"viewer", "addons"} <= named
