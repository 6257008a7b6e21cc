"""The shape of the code, read from the source with `ast` (nothing is imported): no import cycles among the
project's modules, Ray only in the cluster module, the layers of ``actors/`` (below), no module over 600 lines.

The layers: an actor package (``actors/env``, ``rollout``, ``reward``, ``replay``, ``learner``, ``league``) imports
only ``streams``, ``envs``, ``algos``, ``actors.models`` and itself, save the exceptions declared in
``ACTOR_EXCEPTIONS`` with their reasons; ``actors.models`` only ``streams``, ``envs``, ``algos`` and itself; and
nothing below ``actors.runs`` (the actor packages, ``models``, ``observe``) imports ``runs``, ``observe`` or ``cli``
(``observe`` may read the actors' files, not the run that drives them).

An import inside a function counts as an edge like any other: deferring an import to call time hides a cycle
from Python, not from a reader, and that is how cycles were hidden before.

Edges go to the deepest project module named: ``from actors.runs import driver`` is an edge to
``actors.runs.driver``, ``from streams.wire import Kind`` one to ``streams.wire``, and relative imports are
resolved against the importing module's package. A package an import only passes through (``actors.runs``
above) is no edge of its own; a package is one where a name is taken from it (``from envs import make``).
"""

from __future__ import annotations

import ast
import pickle
import subprocess
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("actors", "streams", "algos", "envs")  # the system: every rule holds here
SCRIPTS = ("benchmarks", "research", "tests/support")  # scripts and the test support they run: they import the
# system and each other, and are checked for cycles too
MAX_LINES = 600  # a tripwire, not a target: a module is as long as its one concept needs
RAY_MODULES = {"actors.runs.ray_cluster"}  # the only module that may know Ray: actors are plain classes
ACTOR_PACKAGES = ("actors.env", "actors.rollout", "actors.reward", "actors.replay", "actors.learner", "actors.league")
GROUND = ("streams", "envs", "algos")  # what every layer of actors/ may import
ABOVE = ("actors.runs", "actors.observe", "actors.cli")  # what nothing below actors.runs imports
ACTOR_EXCEPTIONS = {  # (importing package, imported module): why the one actor needs the other's code
    ("actors.env", "actors.league.matchmaking"): "an env actor deals a league's matches itself, by the league's PFSP "
                                                 "weighting, between the league actor's assignments",
}


@dataclass(frozen=True)
class Import:
    target: str  # the project module imported
    path: Path  # the importing file
    line: int
    in_function: bool

    def __str__(self) -> str:
        where = " (inside a function)" if self.in_function else ""
        return f"{self.path.relative_to(ROOT)}:{self.line}{where} imports {self.target}"


_PARSE_IN_CHILD = "import ast, pickle, sys; sys.stdout.buffer.write(pickle.dumps(ast.parse(open(sys.argv[1]).read(), sys.argv[1])))"


def parse(path: Path) -> ast.AST:
    """``path``'s syntax tree. CPython 3.11 can refuse every later ``ast.parse`` in a process where a
    RecursionError was raised and caught before ("AST constructor recursion depth mismatch": a fuzz test of deep
    nesting does that): then the file is parsed in a fresh interpreter."""
    try:
        return ast.parse(path.read_text(), filename=str(path))
    except SystemError:
        child = subprocess.run([sys.executable, "-c", _PARSE_IN_CHILD, str(path)], capture_output=True, check=True)
        return pickle.loads(child.stdout)


def find_modules(root: Path, packages) -> dict[str, Path]:
    """Every module under ``packages``, by dotted name (a package by its own name, for its ``__init__``)."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _deepest_known(name: str, known) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


class _ImportVisitor(ast.NodeVisitor):
    """The project modules a module imports, wherever in the module the import stands."""

    def __init__(self, module: str, path: Path, known):
        self.module, self.known = module, known
        self.package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        self.depth = 0  # how many functions the visitor is inside
        self.found: list[tuple[str, int, bool]] = []  # (the module imported, line, inside a function)

    def _function(self, node) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def _add(self, name: str, node) -> None:
        target = _deepest_known(name, self.known)
        if target is not None and target != self.module:
            self.found.append((target, node.lineno, self.depth > 0))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:  # relative: level 1 is this module's package, each further level one package up
            package = self.package.split(".")
            anchor = package[: len(package) - (node.level - 1)]
            base = ".".join(anchor + ([base] if base else []))
        for alias in node.names:  # `from pkg import module` imports the module; `from module import name`, module
            qualified = f"{base}.{alias.name}" if base else alias.name
            self._add(qualified if qualified in self.known else base, node)


def imports_of(modules: dict[str, Path]) -> dict[str, list[Import]]:
    """Every module's imports of the others, in the order they stand."""
    graph = {}
    for module, path in modules.items():
        visitor = _ImportVisitor(module, path, modules)
        visitor.visit(parse(path))
        found = dict.fromkeys(visitor.found)  # `from m import a, b` is one import of m
        graph[module] = [Import(target, path, line, in_function) for target, line, in_function in found]
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module, each sorted, in sorted order
    (Tarjan's algorithm, iterative so that a deep graph cannot exhaust the stack)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.get(successor, ())))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
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
    return sorted(found)


def shortest_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One shortest way round a cycle of ``component``, from its first module back to it."""
    start, members = component[0], set(component)
    came_from = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for successor in sorted(graph[node] & members):
            if successor == start:
                path = [node]
                while came_from[path[-1]] is not None:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if successor not in came_from:
                came_from[successor] = node
                queue.append(successor)
    raise AssertionError(f"{component} is not a cycle")


def describe_cycle(imports: dict[str, list[Import]], graph: dict[str, set[str]], component: list[str]) -> str:
    """The cycle's modules, one shortest way round it, and the import lines that make each step."""
    path = shortest_cycle(graph, component)
    lines = [f"import cycle among {', '.join(component)}:", "    " + " -> ".join(path)]
    for here, there in zip(path, path[1:]):
        lines += [f"      {i}" for i in imports[here] if i.target == there]
    return "\n".join(lines)


def test_no_import_cycles():
    imports = imports_of(find_modules(ROOT, PACKAGES + SCRIPTS))
    graph = {module: {i.target for i in found} for module, found in imports.items()}
    problems = [describe_cycle(imports, graph, component) for component in cycles(graph)]
    assert not problems, (
        "modules that import each other (directly or round a loop; a function-local import counts). Move what "
        "both need to a module of its own, or pass it in, so that the imports go one way:\n\n" + "\n\n".join(problems)
    )


def ray_imports(path: Path) -> list[tuple[int, str]]:
    """Where ``path`` imports Ray or any part of it (inside functions too): (line, what)."""
    found = []
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        found += [(node.lineno, name) for name in names if name.partition(".")[0] == "ray"]
    return found


def test_ray_is_imported_only_by_the_cluster_module():
    offenders = [f"{path.relative_to(ROOT)}:{line} imports {name}"
                 for module, path in find_modules(ROOT, PACKAGES).items() if module not in RAY_MODULES
                 for line, name in ray_imports(path)]
    assert not offenders, (
        f"Ray imported outside {', '.join(sorted(RAY_MODULES))}: actors and streams are plain classes that the "
        "launcher wraps with ray.remote at the edge (STYLE.md, 4):\n    " + "\n    ".join(offenders)
    )


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def layering_problems(imports: dict[str, list[Import]], root: Path = ROOT) -> list[str]:
    """Every import that breaks a rule of the module's docstring, as 'file:line imports module (rule)'."""
    problems = []

    def say(i: Import, rule: str) -> None:
        where = " (inside a function)" if i.in_function else ""
        problems.append(f"{i.path.relative_to(root)}:{i.line}{where} imports {i.target} ({rule})")

    for module, found in imports.items():
        own = next((p for p in ACTOR_PACKAGES if _within(module, p)), None)
        for i in found:
            if own is not None:
                allowed = (*GROUND, "actors.models", own)
                if not any(_within(i.target, a) for a in allowed) and not any(
                        own == importer and _within(i.target, imported) for importer, imported in ACTOR_EXCEPTIONS):
                    say(i, f"an actor package imports only {', '.join(allowed)}")
            elif _within(module, "actors.models") and not any(_within(i.target, a) for a in (*GROUND, "actors.models")):
                say(i, f"actors.models imports only {', '.join(GROUND)} and itself")
            below_runs = own is not None or _within(module, "actors.models") or _within(module, "actors.observe")
            above = [a for a in ABOVE if _within(i.target, a) and not _within(module, a)]
            if below_runs and above:
                say(i, f"nothing below actors.runs imports {', '.join(ABOVE)}")
    return sorted(set(problems))


def test_actor_packages_import_only_what_is_below_them():
    problems = layering_problems(imports_of(find_modules(ROOT, PACKAGES)))
    assert not problems, (
        "imports across the layers of actors/ (move what both sides need down to actors.models or streams, or "
        "declare the exception with its reason in ACTOR_EXCEPTIONS):\n    " + "\n    ".join(problems))


def test_every_actor_package_has_its_actor_module():
    for package in ACTOR_PACKAGES:
        path = ROOT.joinpath(*package.split("."), "actor.py")
        assert path.exists(), f"{package} has no actor.py (the actor's class and its config)"


def test_no_test_module_imports_another():
    """What two tests share lives in ``tests/factories.py`` (or another module not named ``test_*``)."""
    imports = imports_of(find_modules(ROOT, ("tests",) + PACKAGES))
    offenders = [str(i) for module, found in imports.items() if module.startswith("tests")
                 for i in found if i.target.rpartition(".")[2].startswith("test_")]
    assert not offenders, "tests importing test modules (move what they share to tests/factories.py):\n    " + \
        "\n    ".join(offenders)


def test_no_module_is_over_600_lines():
    lengths = {path: len(path.read_text().splitlines()) for path in find_modules(ROOT, PACKAGES).values()}
    over = sorted(((n, path) for path, n in lengths.items() if n > MAX_LINES), reverse=True)
    assert not over, (
        f"modules over {MAX_LINES} lines (usually two ideas share the file: split it along them; STYLE.md, "
        "'Size'):\n    " + "\n    ".join(f"{path.relative_to(ROOT)}: {n} lines" for n, path in over)
    )


# -- the checks themselves: they can fail ------------------------------------------------------------------

def test_the_cycle_finder_finds_each_cycle_and_nothing_else():
    graph = {
        "a": {"b"}, "b": {"c"}, "c": {"a", "d"},  # a -> b -> c -> a
        "d": {"e"}, "e": set(),  # hangs off the cycle, in none
        "x": {"y"}, "y": {"x"},  # a second, separate cycle
        "f": {"f"},  # a module importing itself is no cycle between modules
    }
    assert cycles(graph) == [["a", "b", "c"], ["x", "y"]]
    assert shortest_cycle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]
    assert cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []  # a diamond is not a cycle
    chain = {str(i): {str(i + 1)} for i in range(5000)} | {"5000": {"0"}}  # deeper than the recursion limit
    assert cycles(chain) == [sorted(chain)]


def test_imports_are_resolved_to_the_modules_they_name(tmp_path):
    files = {
        "pkg/__init__.py": "",
        "pkg/sub/__init__.py": "",
        "pkg/sub/one.py": "from . import two\nfrom .two import thing\n",
        "pkg/sub/two.py": "def later():\n    from ..top import name\n",  # function-local and two levels up
        "pkg/top.py": "import pkg.sub.one\nfrom pkg.sub import two\nfrom pkg import sub\nimport os, ray\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    modules = find_modules(tmp_path, ("pkg",))
    assert set(modules) == {"pkg", "pkg.sub", "pkg.sub.one", "pkg.sub.two", "pkg.top"}
    edges = {m: [(i.target, i.line, i.in_function) for i in found] for m, found in imports_of(modules).items()}
    assert edges["pkg.sub.one"] == [("pkg.sub.two", 1, False), ("pkg.sub.two", 2, False)]
    assert edges["pkg.sub.two"] == [("pkg.top", 2, True)]
    assert edges["pkg.top"] == [("pkg.sub.one", 1, False), ("pkg.sub.two", 2, False), ("pkg.sub", 3, False)]
    graph = {m: {target for target, _, _ in found} for m, found in edges.items()}
    assert cycles(graph) == [["pkg.sub.one", "pkg.sub.two", "pkg.top"]]
    assert ray_imports(modules["pkg.top"]) == [(4, "ray")]
    (tmp_path / "pkg/sub/two.py").write_text("def f():\n    from ray.util import x\nimport rayon\n")
    assert ray_imports(modules["pkg.sub.two"]) == [(2, "ray.util")]


def test_the_layering_check_finds_each_kind_of_crossing(tmp_path):
    files = {
        "actors/__init__.py": "", "actors/cli.py": "", "actors/models/__init__.py": "",
        "actors/models/base.py": "from actors.runs import config\n",  # models reaching up
        "actors/runs/__init__.py": "", "actors/runs/config.py": "from actors.env import actor\n",  # runs may
        "actors/observe/__init__.py": "", "actors/observe/log.py": "import actors.cli\n",  # observe reaching up
        "actors/env/__init__.py": "",
        "actors/env/actor.py": "from actors.models import base\nfrom actors.league import matchmaking\n"
                               "import streams\n",  # all allowed: models, the declared exception, the ground
        "actors/league/__init__.py": "", "actors/league/matchmaking.py": "",
        "actors/league/actor.py": "from actors.replay import buffer\n",  # one actor importing another
        "actors/replay/__init__.py": "", "actors/replay/buffer.py": "def f():\n    from actors.observe import log\n",
        "streams/__init__.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    problems = layering_problems(imports_of(find_modules(tmp_path, ("actors", "streams"))), tmp_path)
    where = sorted(p.split(" imports ")[0].split(":")[0] for p in problems)
    assert where == ["actors/league/actor.py", "actors/models/base.py", "actors/models/base.py",
                     "actors/observe/log.py", "actors/replay/buffer.py", "actors/replay/buffer.py"], problems

