"""An import-linter contract type of this project's (pyproject.toml, ``contract_types``):
``acyclic_modules``, no import circle between the modules of the packages it names.

import-linter's own ``acyclic_siblings`` compares packages (a package stands for everything
under it); this one follows module to module, as Python loads them: a circle is a set of
modules each of which reaches the others through imports. Imports inside functions and under
TYPE_CHECKING count (the graph import-linter builds has them): an import moved into a
function to dodge a circle is still one.
"""

from __future__ import annotations

from grimp import ImportGraph
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


def circles(graph: ImportGraph, packages: set[str]) -> list[list[str]]:
    """Every set of two or more modules under ``packages`` that import each other (the
    strongly connected components of the import graph, Tarjan's algorithm), sorted."""
    mods = sorted(m for m in graph.modules
                  if any(m == p or m.startswith(p + ".") for p in packages))
    inside = set(mods)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m) & inside) for m in mods}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in mods:
        if root in index:
            continue
        # iterative, so a long chain of imports cannot exhaust Python's recursion limit
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on_stack.add(v)
            if i < len(edges[v]):
                work.append((v, i + 1))
                w = edges[v][i]
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return sorted(found)


class AcyclicModulesContract(Contract):
    """``packages``: the packages whose modules may not import each other in a circle."""

    type_name = "acyclic_modules"
    packages = fields.ListField(subfield=fields.StringField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        found = circles(graph, set(self.packages))  # type: ignore[call-overload]
        edges = []
        for comp in found:
            inside = set(comp)
            for a in comp:
                for b in sorted(graph.find_modules_directly_imported_by(a) & inside):
                    for d in graph.get_import_details(importer=a, imported=b):
                        edges.append((a, b, d["line_number"], d["line_contents"]))
        return ContractCheck(kept=not found, metadata={"circles": found, "edges": edges})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for comp in check.metadata["circles"]:
            output.print_error(f"{len(comp)} modules import each other: {', '.join(comp)}")
            inside = set(comp)
            for a, b, line, text in check.metadata["edges"]:
                if a in inside:
                    output.print(f"    {a}:{line} imports {b}: {text}")
            output.new_line()
