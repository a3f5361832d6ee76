"""The architecture's rules, checked from the source alone (docs/architecture.md): the import
rules between layers, no import circle, no import of the package root or of another module's
private names, no branch on a family's class or name outside families/, no module over 400 lines, every ``stanvi.*`` import resolvable, every citation
resolvable to a file (and section) of the repository.  AST and text only: nothing is imported, so this runs in about a second.

Known violations that the consolidation (issue T3-3, part 2) has yet to remove are listed in
``KNOWN``, each with the reason; a listed violation that no longer occurs fails the test too, so
the list only shrinks.  ``test_each_rule_fails_on_a_planted_violation`` plants one violation of
each rule in a copy of the tree and checks that the rule's check reports it.
"""

from __future__ import annotations

import ast
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400

#: Layers by module path (the first prefix that matches; docs/architecture.md#layers)
LAYERS: list[tuple[str, str]] = [
    ("stanvi/jax_config.py", "config"),
    ("stanvi/stan/", "toolchain"),
    ("stanvi/targets/", "targets"),
    ("stanvi/families/", "families"),
    ("stanvi/discrete/", "discrete"),
    ("stanvi/optim/", "optim"),
    ("stanvi/estimators/", "estimators"),
    ("stanvi/methods/", "methods"),
    ("stanvi/gp/", "gp"),
    ("stanvi/reference/", "reference"),
    ("stanvi/evaluation/", "evaluation"),
    ("stanvi/batch/", "batch"),
    ("stanvi/bench/", "bench"),
    ("stanvi/output/", "output"), ("stanvi/diagnostics/", "output"),
    ("stanvi/fit.py", "fit"), ("stanvi/fit_inputs.py", "fit"), ("stanvi/fit_result.py", "fit"),
    ("stanvi/saved.py", "fit"),
    ("stanvi/cli.py", "face"), ("stanvi/__init__.py", "face"), ("stanvi/demo.py", "face"),
    ("stanvi/errors.py", "common"), ("stanvi/log.py", "common"), ("stanvi/lazy_jax.py", "common"),
    ("stanvi/progress.py", "common"), ("stanvi/version.py", "common"),
]

#: The layers from the bottom up: a module imports only its own layer and those below
ORDER = ["common", "discrete", "toolchain", "config", "targets", "families", "optim",
         "estimators", "methods", "output", "gp", "reference", "fit", "evaluation", "batch", "bench", "face"]

#: (importing layer, imported layer, why it must not) — docs/architecture.md#import-rules
NEVER: list[tuple[str, str, str]] = [
    ("methods", "toolchain", "a method sees only a Target"),
    ("families", "targets", "a family knows no model"),
    ("families", "estimators", "a family names its estimator by string"),
    ("toolchain", "methods", "the toolchain knows no algorithm"),
    ("targets", "methods", "a target never knows who calls it"),
    ("estimators", "toolchain", "estimators see only a Target"),
    ("estimators", "methods", "an estimator knows no method"),
    ("optim", "estimators", "solvers see vectors and operators only"),
    ("methods", "fit", "a method returns a MethodResult"),
    ("gp", "fit", "gp returns its own GPFit"),
    ("reference", "methods", "Stan's algorithms share no code with stanvi's"),
    ("output", "face", "output takes the version from package metadata"),
    ("output", "methods", "output reads a Fit, not a method"),
    ("batch", "bench", "a production run imports no benchmark"),
]

#: Violations still present, with the reason, to be removed by the consolidation (the test fails
#: when one of them no longer occurs: the list only shrinks).  Keys: (rule, where).
KNOWN: dict[tuple[str, str], str] = {
}


@dataclass(frozen=True)
class Import:
    """One ``stanvi`` import: the importing file, its line, the module imported and the names
    taken from it (``from M import a, b``; empty for ``import M``)."""

    path: str
    line: int
    module: str
    names: tuple[str, ...]


def layer_of(path: str) -> str | None:
    for prefix, layer in LAYERS:
        if path == prefix or (prefix.endswith("/") and path.startswith(prefix)):
            return layer
    return None


def python_files(root: Path, folder: str) -> list[Path]:
    return sorted(p for p in (root / folder).rglob("*.py") if "__pycache__" not in p.parts)


def module_name(root: Path, path: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def stanvi_imports(root: Path, path: Path) -> list[Import]:
    """Every import of ``stanvi`` or a submodule in the file, module level or inside functions,
    relative imports resolved."""
    rel = str(path.relative_to(root))
    tree = ast.parse(path.read_text(), filename=rel)
    package = module_name(root, path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "stanvi" or alias.name.startswith("stanvi."):
                    found.append(Import(rel, node.lineno, alias.name, ()))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module == "stanvi" or module.startswith("stanvi."):
                found.append(Import(rel, node.lineno, module,
                                    tuple(a.name for a in node.names)))
    return found


def module_file(root: Path, module: str) -> Path | None:
    base = root / Path(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def top_level_names(path: Path) -> set[str]:
    """Names a module defines at its top level (functions, classes, assignments, imports,
    also inside top-level if/try blocks)."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            names.add(n.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    names.add((a.asname or a.name).split(".")[0])
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                visit(node.body)
                for extra in (getattr(node, "orelse", []), getattr(node, "finalbody", [])):
                    visit(extra)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
    visit(tree.body)
    return names


# ------------------------------------------------------------------ the checks (return problems)
def layer_violations(root: Path) -> list[tuple[str, str]]:
    """(rule, 'file:line imports module') for each import a NEVER rule forbids, and each
    module that belongs to no layer."""
    never = {(a, b): why for a, b, why in NEVER}
    out = []
    for path in python_files(root, "stanvi"):
        rel = str(path.relative_to(root))
        src = layer_of(rel)
        if src is None:
            out.append(("no layer", rel))
        for imp in stanvi_imports(root, path):
            target = module_file(root, imp.module)
            dst = layer_of(str(target.relative_to(root))) if target else None
            if src is None or dst is None:
                continue
            if (src, dst) in never or ORDER.index(dst) > ORDER.index(src):
                out.append((f"{src} -> {dst}", f"{rel}:{imp.line} imports {imp.module}"))
    return out


def root_imports(root: Path) -> list[tuple[str, str]]:
    """Imports of the package root's own names (``import stanvi``, ``from stanvi import
    fit``); ``from stanvi import errors`` (a submodule) is not one."""
    out = []
    for path in python_files(root, "stanvi"):
        rel = str(path.relative_to(root))
        for imp in stanvi_imports(root, path):
            if imp.module != "stanvi":
                continue
            if not imp.names or any(module_file(root, f"stanvi.{n}") is None
                                    for n in imp.names):
                out.append(("package root", f"{rel}:{imp.line}"))
    return out


def private_imports(root: Path) -> list[tuple[str, str]]:
    """Imports of another module's private names (``from stanvi.m import _x``) in the package: a
    name two modules use is public, in the module that owns the concept."""
    out = []
    for path in python_files(root, "stanvi"):
        rel = str(path.relative_to(root))
        for imp in stanvi_imports(root, path):
            for name in imp.names:
                if name.startswith("_") and not name.startswith("__"):
                    out.append(("private name", f"{rel}:{imp.line} {imp.module}.{name}"))
    return out


_FAMILY_CLASSES = {"MeanField", "FullRank", "GaussianMixture"}


def _names_a_family(node: ast.AST) -> bool:
    """``family.name``, ``est.family.name``, ``getattr(self.family, "name", ...)``: a family
    object's name (a ``family`` *string* argument, the user's choice, is not one)."""
    if isinstance(node, ast.Attribute) and node.attr in ("name", "family_name"):
        return "family" in ast.unparse(node.value)
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "getattr" and len(node.args) >= 2
            and "family" in ast.unparse(node.args[0])
            and isinstance(node.args[1], ast.Constant) and node.args[1].value == "name")


def family_switches(root: Path) -> list[tuple[str, str]]:
    """Branches on a variational family's class or name outside ``families/`` (and gp's own
    families): what a family does differently is the family's to say
    (stanvi/families/protocol.py), so a new family is one module every method can use."""
    out = []
    for path in python_files(root, "stanvi"):
        rel = str(path.relative_to(root))
        if rel.startswith(("stanvi/families/", "stanvi/gp/")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            hit = False
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "isinstance" and len(node.args) == 2):
                classes = node.args[1].elts if isinstance(node.args[1], ast.Tuple) \
                    else [node.args[1]]
                hit = any(isinstance(c, ast.Name) and c.id in _FAMILY_CLASSES for c in classes)
            elif isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                hit = any(_names_a_family(x) for x in sides)
            if hit:
                out.append(("family switch", f"{rel}:{node.lineno}"))
    return out


def long_modules(root: Path) -> list[tuple[str, str]]:
    out = []
    for path in python_files(root, "stanvi"):
        n = len(path.read_text().splitlines())
        if n > MAX_LINES:
            out.append(("over 400 lines", f"{path.relative_to(root)} ({n})"))
    return out


def unresolved_imports(root: Path, folders=("stanvi", "tests", "stan_models")
                       ) -> list[tuple[str, str]]:
    """``stanvi.*`` imports whose module, or a name taken from it, does not exist."""
    out = []
    names_of: dict[Path, set[str]] = {}
    for folder in folders:
        if not (root / folder).is_dir():
            continue
        for path in python_files(root, folder):
            rel = str(path.relative_to(root))
            for imp in stanvi_imports(root, path):
                target = module_file(root, imp.module)
                if target is None:
                    out.append(("unresolved", f"{rel}:{imp.line} {imp.module}"))
                    continue
                if target not in names_of:
                    names_of[target] = top_level_names(target)
                for name in imp.names:
                    if name != "*" and name not in names_of[target] and module_file(
                            root, f"{imp.module}.{name}") is None:
                        out.append(("unresolved", f"{rel}:{imp.line} {imp.module}.{name}"))
    return out


_CITATION = re.compile(
    r"(?<![\w/.-])((?:docs|tests|stanvi|stan_models|specs)/[\w./-]+\.(?:md|py|stan|json)"
    r"|[\w-]+\.md)(#[\w-]+)?")


def anchors(path: Path) -> set[str]:
    """The sections a Markdown file can be cited by: explicit ``<a id>`` anchors and GitHub's
    heading slugs."""
    text = path.read_text()
    found = set(re.findall(r'<a id="([^"]+)"', text))
    for heading in re.findall(r"^#+\s+(.+)$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


#: A section of a specification outside the repository ("spec §2.4", "specs/mlmcvi.md 2.9",
#: "rao_blackwellized_discrete.md §5a")
_SPEC_SECTION = re.compile(r"\bspecs?\s*(?:§|\d)|\bspec's\s*§|(?<![/\w])\w+\.md\s*§")


#: The folders whose Python files' citations are checked (this file's own examples aside)
CITING = ("stanvi", "tests", "stan_models")


def broken_citations(root: Path) -> list[tuple[str, str]]:
    """Citations of repository files (docs/..., tests/..., DESIGN.md, specs/...) in the
    Python files of :data:`CITING` whose file, or section, is not in the repository, and citations of a
    specification's sections (which are not in it)."""
    out = []
    cache: dict[Path, set[str]] = {}
    files = [p for folder in CITING if (root / folder).is_dir()
             for p in python_files(root, folder) if p.name != Path(__file__).name]
    for path in files:
        rel = str(path.relative_to(root))
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if _SPEC_SECTION.search(line):
                out.append(("citation", f"{rel}:{lineno} a specification's section"))
            for cited, section in _CITATION.findall(line):
                cited = cited.rstrip(".")
                target = root / cited
                if "/" not in cited and not target.is_file():   # a page named alone
                    target = root / "docs" / cited
                if not target.is_file():
                    out.append(("citation", f"{rel}:{lineno} {cited}"))
                    continue
                if section and target.suffix == ".md":
                    if target not in cache:
                        cache[target] = anchors(target)
                    if section[1:] not in cache[target]:
                        out.append(("citation", f"{rel}:{lineno} {cited}{section}"))
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module → the stanvi modules it imports (anywhere in it).  ``from P import m`` where m is
    a submodule is an edge to m only (P's ``__init__`` runs first, but that is not a circle
    of this module's making)."""
    graph: dict[str, set[str]] = {}
    for path in python_files(root, "stanvi"):
        name = module_name(root, path)
        deps: set[str] = set()
        for imp in stanvi_imports(root, path):
            subs = [f"{imp.module}.{n}" for n in imp.names
                    if module_file(root, f"{imp.module}.{n}") is not None]
            if not imp.names or len(subs) < len(imp.names):
                if module_file(root, imp.module) is not None:
                    deps.add(imp.module)
            deps.update(subs)
        deps.discard(name)
        graph[name] = deps
    return graph


def import_circles(root: Path) -> list[tuple[str, str]]:
    """Groups of modules that import each other, directly or round a circle (Tarjan's strongly
    connected components of :func:`import_graph`)."""
    graph = import_graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[tuple[str, str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(("circle", " <-> ".join(sorted(group))))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


CHECKS = {"layers": layer_violations, "circles": import_circles, "private": private_imports,
          "families": family_switches, "root": root_imports, "size": long_modules,
          "imports": unresolved_imports, "citations": broken_citations}


def _against_known(check: str, problems: list[tuple[str, str]]) -> list[str]:
    """Problems not in KNOWN, and KNOWN entries of this check that no longer occur."""
    known = {k for k in KNOWN if k[0].startswith(check + ":")}
    seen = {(f"{check}:{rule}", where) for rule, where in problems}
    new = [f"{rule}: {where}" for rule, where in problems
           if (f"{check}:{rule}", where) not in known]
    gone = [f"KNOWN entry no longer occurs (remove it): {k}" for k in known - seen]
    return new + gone


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_architecture_rule(check):
    problems = _against_known(check, CHECKS[check](ROOT))
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------ each rule can fail
_PLANTS = {
    "families": [("stanvi/methods/_planted.py",
                  "def f(family):\n    return family.name == 'meanfield'\n"),
                 ("stanvi/estimators/_planted.py",
                  "def f(est):\n    return getattr(est.family, 'name', '') == 'fullrank'\n")],
    "private": ("stanvi/methods/_planted.py", "from stanvi.methods.base import _private\n"),
    "circles": [("stanvi/optim/_planted.py", "from stanvi.optim import _planted2\n"),
                ("stanvi/optim/_planted2.py", "from stanvi.optim._planted import x\nx = 1\n")],
    "layers": ("stanvi/estimators/_planted.py", "from stanvi.methods.base import iterate\n"),
    "root": ("stanvi/batch/_planted.py", "import stanvi\n"),
    "size": ("stanvi/optim/_planted.py", "x = 1\n" * (MAX_LINES + 1)),
    "imports": ("stanvi/targets/_planted.py", "from stanvi.targets.base import no_such_name\n"),
    "citations": ("stanvi/families/_planted.py",
                  '"""See docs/algorithms.md#no-such-section, specs/gone.md and spec §2."""\n'),
}


@pytest.mark.parametrize("check", sorted(_PLANTS))
def test_each_rule_fails_on_a_planted_violation(check, tmp_path):
    tree = tmp_path / "repo"
    for folder in ("stanvi", "docs"):
        shutil.copytree(ROOT / folder, tree / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.o"))
    clean = CHECKS[check](tree)
    plants = _PLANTS[check] if isinstance(_PLANTS[check], list) else [_PLANTS[check]]
    for rel, text in plants:
        (tree / rel).write_text(text)
    planted = [p for p in CHECKS[check](tree) if p not in clean]
    assert planted and all("_planted" in where for _, where in planted), planted
