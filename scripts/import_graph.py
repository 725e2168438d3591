"""The package's import graph in numbers: circles, imports that run back up the floors, largest modules.

    .venv/bin/python scripts/import_graph.py            # the report
    .venv/bin/python scripts/import_graph.py --edges    # and every import between wings, with its line

Counts every import grimp sees (the graph under import-linter): module level and inside functions,
so an import kept "loadable" by moving it into a function still counts. Imports under
``if TYPE_CHECKING:`` are counted apart: they never run, so they cannot tie a load-order knot, but the
report gives the circle they would close too (the managers' ``-> Job`` annotations: Django's own
models <-> managers shape). The floors below are the ones docs/architecture.md draws and the
``[tool.importlinter]`` contracts in pyproject.toml enforce; an import from a lower floor to a higher
one "runs back up".
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "django_sqlqueue"

#: Top first. A name is a module or a package (every module under it). Names on one floor are peers.
FLOORS: list[list[str]] = [
    ["apps", "management"],                      # wiring (AppConfig.ready fills the hooks), commands
    ["admin", "worker"],                         # the operator's pages; the worker processes
    ["ops"],                                     # checks, metrics, tracing, the one diagnosis (health)
    ["schedules"],                               # features: schedules enqueue tasks,
    ["tasks"],                                   #   tasks (Django's Tasks backend) may wait on workflows,
    ["workflows", "limits"],                     #   workflows and limits stand on the queue alone
    ["models"],                                  # the tables; their manager is the queue wing
    ["queue"],                                   # enqueue, claim, finish (modify), cancel, housekeeping
    ["fields", "jobtypes", "handlers"],
    ["dialects"],                                # per-vendor SQL
    ["conf"],
    ["bounds", "states", "exceptions", "sensitive", "signals", "hooks"],
]


def floor_of(module: str) -> int | None:
    """The floor index of ``module`` (0 = top), or None for the package itself and the migrations."""
    rest = module[len(PACKAGE) + 1:]
    for i, names in enumerate(FLOORS):
        for name in names:
            if rest == name or rest.startswith(name + "."):
                return i
    return None


def strongly_connected(graph: grimp.ImportGraph, modules: list[str]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative): the import circles, biggest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
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
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
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
                found.append(sorted(component))
    return sorted(found, key=len, reverse=True)


def build(type_checking: bool) -> grimp.ImportGraph:
    return grimp.build_graph(PACKAGE, cache_dir=None, exclude_type_checking_imports=not type_checking)


def report(show_edges: bool) -> int:
    sys.path.insert(0, str(ROOT))  # this checkout's package, not an installed one
    graph = build(type_checking=False)
    modules = sorted(m for m in graph.modules if ".migrations" not in m)
    circles = [c for c in strongly_connected(graph, modules) if len(c) > 1]
    print("Import circles (module level + inside functions):")
    for c in circles or [[]]:
        print(f"  {len(c)} files: {', '.join(m[len(PACKAGE) + 1:] for m in c)}" if c else "  none")
    typed = [c for c in strongly_connected(build(type_checking=True), modules) if len(c) > 1]
    print("Import circles counting TYPE_CHECKING imports too (annotations only, never run):")
    for c in typed:
        print(f"  {len(c)} files: {', '.join(m[len(PACKAGE) + 1:] for m in c)}")

    back_up: list[str] = []
    unplaced: set[str] = set()
    between = Counter()
    for importer in modules:
        low = floor_of(importer)
        if low is None:
            if importer != PACKAGE:
                unplaced.add(importer)
            continue
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            high = floor_of(imported)
            if high is None:
                continue
            if high != low:
                between[(FLOORS[low][0] if len(FLOORS[low]) == 1 else importer.split(".")[1],
                         FLOORS[high][0] if len(FLOORS[high]) == 1 else imported.split(".")[1])] += 1
            if high < low:
                lines = [f"L{d['line_number']}" for d in graph.get_import_details(importer=importer, imported=imported)]
                back_up.append(f"{importer} -> {imported} ({', '.join(lines)})")
    print(f"Imports running back up the floors: {len(back_up)}")
    for line in back_up:
        print(f"  {line}")
    if unplaced:
        print(f"Modules on no floor (add them to FLOORS): {', '.join(sorted(unplaced))}")

    sizes = sorted(((sum(1 for _ in p.open()), p.relative_to(ROOT)) for p in (ROOT / PACKAGE).rglob("*.py")
                    if "migrations" not in p.parts), reverse=True)
    print("Largest modules (lines): " + ", ".join(f"{p} {n}" for n, p in sizes[:5]))
    if show_edges:
        print("Imports between floors (importer floor -> imported floor: count of module pairs):")
        for (a, b), n in sorted(between.items()):
            print(f"  {a} -> {b}: {n}")
    return 1 if unplaced else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", action="store_true", help="also list the imports between floors")
    sys.exit(report(parser.parse_args().edges))
