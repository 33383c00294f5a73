"""The layer rules of docs/ARCHITECTURE.md, checked on the source (AST only: nothing is imported).

The layer table is read from docs/ARCHITECTURE.md itself, so the page and this test cannot drift apart.
Rules:

1. every module under src/seqwarm belongs to a layer of the table;
2. a module imports seqwarm modules of lower layers only, or of its own layer without a cycle
   (imports inside functions and under ``TYPE_CHECKING`` count too: hiding an upward import in a
   function does not make it right);
3. no module imports the package facade ``seqwarm`` (``seqwarm/__init__.py`` sits above everything);
4. only the CLI layer (the table's ``cli`` row) imports ``argparse`` or ``seqwarm.cli.commands``;
5. an import inside a function is allowed only for a heavy dependency: an optional package (torch,
   deepspeed, matplotlib, ...), a seqwarm module whose own top-level imports (or its parent package's)
   bring one in, or a lazy facade (a package with a module-level ``__getattr__``).

The install boundary (docs/ARCHITECTURE.md, "The library and the train extra"; the extra's packages are
``TRAIN_EXTRA`` of ``seqwarm.cli``, read from its source):

6. no module imports a package of the ``train`` extra at module level, only inside functions;
7. the library modules (the ``<!-- library -->`` list), and every seqwarm module they import, at the top or
   inside a function, and its parent packages, import none of them at all.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "seqwarm"
HEAVY = (
    "torch",
    "deepspeed",
    "matplotlib",
    "transformers",
    "tensorboard",
    "tqdm",
    "numpy",
    "tokenizers",
    "safetensors",
    "datasets",
    "pyarrow",
    "wandb",
    "megatron",
    "accelerate",
    "lightning",
    "pytorch_lightning",
)
"""Packages slow to import or optional: the only reason to import inside a function."""
CLI_ONLY = ("argparse",)


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. seqwarm.trainer.loop
    target: str  # what it imports: a seqwarm module, "seqwarm" (the facade) or an outside top-level name
    line: int
    nested: bool  # inside a function or under TYPE_CHECKING: not run when the module is imported
    type_only: bool = False  # under TYPE_CHECKING: never run at all


def read_layers(doc: Path) -> dict[str, int]:
    """``name -> layer`` from the ``<!-- layers -->`` block of ARCHITECTURE.md (``N  name name ...``)."""
    text = doc.read_text(encoding="utf-8")
    match = re.search(r"<!-- layers -->\s*```\w*\n(.*?)```", text, re.S)
    assert match, f"{doc} has no <!-- layers --> block"
    layers: dict[str, int] = {}
    for line in match.group(1).splitlines():
        m = re.match(r"\s*(\d+)\s+(.*?)\s*(?:#.*)?$", line)
        if not m:
            continue
        for name in m.group(2).split():
            assert name not in layers, f"{name} is in two layers of {doc}"
            layers[name] = int(m.group(1))
    return layers


def module_names(src: Path, package: str) -> dict[str, Path]:
    """Every module of the package: dotted name -> file (``pkg.sub`` for ``pkg/sub/__init__.py``)."""
    out = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(name: str, path: Path, modules: dict[str, Path], package: str) -> list[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[Import] = []
    is_pkg = path.name == "__init__.py"

    def resolve(node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = name.split(".") if is_pkg else name.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def add(target: str, line: int, nested: bool, type_only: bool) -> None:
        if target == package or target.startswith(package + "."):
            while target not in modules and "." in target:  # seqwarm.config.load_config -> seqwarm.config
                target = target.rsplit(".", 1)[0]
        else:
            target = target.split(".")[0]
        found.append(Import(name, target, line, nested, type_only))

    def visit(node: ast.AST, nested: bool, type_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            checking = isinstance(child, ast.If) and _is_type_checking(child)
            inner = nested or checking or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, child.lineno, nested, type_only)
            elif isinstance(child, ast.ImportFrom):
                base = resolve(child)
                for (
                    alias
                ) in child.names:  # `from seqwarm.trainer import plots` imports the module seqwarm.trainer.plots
                    sub = f"{base}.{alias.name}"
                    add(sub if sub in modules else base, child.lineno, nested, type_only)
            visit(child, inner, type_only or checking)

    visit(tree, False, False)
    return found


def _defines_getattr(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body)


def layer_of(module: str, layers: dict[str, int], package: str) -> int | None:
    parts = module.split(".")[1:]  # drop the package name
    for i in range(len(parts), 0, -1):
        key = ".".join(parts[:i])
        if key in layers:
            return layers[key]
    return None


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def check_layers(src: Path, package: str, doc: Path) -> list[str]:
    """Every violation of the rules above, one readable line each (empty: all is well)."""
    layers = read_layers(doc)
    modules = module_names(src, package)
    problems: list[str] = []
    all_imports = {m: imports_of(m, p, modules, package) for m, p in modules.items()}
    rel = {m: p.relative_to(src) for m, p in modules.items()}
    for m in modules:
        if m != package and layer_of(m, layers, package) is None:
            problems.append(f"{rel[m]}: module {m} is in no layer of {doc.name}; add it to the table")
    # which modules bring in a heavy dependency at import time (through their top-level imports)
    top = {m: {i.target for i in imps if not i.nested} for m, imps in all_imports.items()}
    lazy = {m for m, p in modules.items() if _defines_getattr(p)}  # a lazy facade defers heavy imports
    heavy: dict[str, bool] = {}

    def is_heavy(m: str, seen: frozenset = frozenset()) -> bool:
        if m not in modules:
            return m.split(".")[0] in HEAVY
        if m in lazy:
            return True
        if m not in heavy:  # importing pkg.sub runs pkg/__init__.py first
            parent = m.rsplit(".", 1)[0] if "." in m else None
            heavy[m] = any(is_heavy(t, seen | {m}) for t in top[m] if t not in seen and t != m) or (
                parent is not None and parent not in seen and is_heavy(parent, seen | {m})
            )
        return heavy[m]

    graph: dict[str, set[str]] = {m: set() for m in modules}
    cli_layer = layers.get("cli", max(layers.values()))  # the CLI's row (shims of old names may sit above it)
    for m, imps in all_imports.items():
        if m == package:
            continue  # the facade re-exports the public API from every layer
        mine = layer_of(m, layers, package)
        cli = (mine is not None and mine == cli_layer) or m.endswith("__main__")
        for imp in imps:
            where = f"{rel[m]}:{imp.line}"
            if imp.target == package:
                problems.append(
                    f"{where}: {m} imports the package facade {package!r}; import the module "
                    "that defines the name instead"
                )
                continue
            if imp.target in CLI_ONLY or imp.target.startswith(f"{package}.cli.commands"):
                if not cli and not m.startswith(f"{package}.cli.commands"):
                    problems.append(f"{where}: {m} imports {imp.target}, which only the CLI layer may import")
            if imp.nested and not imp.type_only and not is_heavy(imp.target) and imp.target != m:
                problems.append(
                    f"{where}: {m} imports {imp.target} inside a function, but it is light; "
                    "import it at the top of the module"
                )
            if imp.target not in modules or imp.target == m:
                continue
            graph[m].add(imp.target)
            theirs = layer_of(imp.target, layers, package)
            if mine is not None and theirs is not None and theirs > mine:
                problems.append(f"{where}: {m} (layer {mine}) imports {imp.target} (layer {theirs}), a higher layer")
    for comp in _cycles(graph):
        problems.append(f"import cycle: {' -> '.join(comp)}")
    return problems


def read_library(doc: Path) -> list[str]:
    """The library modules: the names of the ``<!-- library -->`` block of ARCHITECTURE.md."""
    text = doc.read_text(encoding="utf-8")
    match = re.search(r"<!-- library -->\s*```\w*\n(.*?)```", text, re.S)
    assert match, f"{doc} has no <!-- library --> block"
    return [name for line in match.group(1).splitlines() for name in line.split("#")[0].split()]


def train_extra(cli_init: Path) -> set[str]:
    """The import names of the ``train`` extra: the values of ``TRAIN_EXTRA`` in the CLI's source."""
    tree = ast.parse(cli_init.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "TRAIN_EXTRA" for t in node.targets):
            return set(ast.literal_eval(node.value).values())
    raise AssertionError(f"{cli_init} defines no TRAIN_EXTRA")


def check_library(src: Path, package: str, doc: Path, extra: set[str]) -> list[str]:
    """Every break of rules 6 and 7, one line each (empty: a library install runs without the extra)."""
    modules = module_names(src, package)
    problems: list[str] = []
    imps = {m: [i for i in imports_of(m, p, modules, package) if not i.type_only] for m, p in modules.items()}
    rel = {m: p.relative_to(src) for m, p in modules.items()}
    for m, found in imps.items():
        for i in found:
            if i.target in extra and not i.nested:
                problems.append(
                    f"{rel[m]}:{i.line}: {m} imports {i.target} (the train extra) at module level; "
                    "import it inside the function that needs it"
                )
    roots = []
    for name in read_library(doc):
        full = f"{package}.{name}"
        covered = [m for m in modules if m == full or m.startswith(full + ".")]
        if not covered:
            problems.append(f"{doc.name}: library module {name} is no module of {package}")
        roots += covered
    via: dict[str, str | None] = dict.fromkeys(roots)
    todo = list(roots)
    while todo:
        m = todo.pop()
        parent = m.rsplit(".", 1)[0] if "." in m else None
        for target in [i.target for i in imps[m]] + ([parent] if parent in modules else []):
            if target in modules and target not in via:
                via[target] = m
                todo.append(target)
    for m in sorted(via):
        for i in imps[m]:
            if i.target in extra:
                chain = [m]
                while via[chain[-1]] is not None:
                    chain.append(via[chain[-1]])
                problems.append(
                    f"{rel[m]}:{i.line}: {m} imports {i.target} (the train extra), and the library reaches it: "
                    f"{' <- '.join(chain)}; move it out of the library's imports"
                )
    return problems


def test_the_source_keeps_the_layers_of_architecture_md():
    problems = check_layers(ROOT / "src", PACKAGE, ROOT / "docs" / "ARCHITECTURE.md")
    assert not problems, "\n".join(problems)


def test_the_library_imports_nothing_of_the_train_extra():
    extra = train_extra(ROOT / "src" / PACKAGE / "cli" / "__init__.py")
    assert {"tokenizers", "tqdm", "matplotlib"} <= extra
    problems = check_library(ROOT / "src", PACKAGE, ROOT / "docs" / "ARCHITECTURE.md", extra)
    assert not problems, "\n".join(problems)


def _plant(tmp_path: Path, files: dict[str, str], table: str) -> list[str]:
    for rel, text in files.items():
        path = tmp_path / "src" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    doc = tmp_path / "ARCHITECTURE.md"
    doc.write_text(f"# layers\n<!-- layers -->\n```\n{table}```\n")
    return check_layers(tmp_path / "src", "pkg", doc)


def test_a_planted_clean_package_passes(tmp_path):
    problems = _plant(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.low import x\n",
            "pkg/low.py": "x = 1\n",
            "pkg/mid/__init__.py": "from pkg.low import x\nimport json\n",
            "pkg/mid/part.py": "from pkg import low\n\ndef f():\n    import torch\n    return torch\n",
            "pkg/cli.py": "import argparse\nfrom pkg.mid import part\n",
        },
        "1  low\n2  mid\n3  cli\n",
    )
    assert problems == []


def test_the_cli_row_not_the_top_row_may_import_argparse(tmp_path):
    """A shim of old names may sit above the CLI (``core``): the CLI keeps argparse, the shim does not get it."""
    files = {
        "pkg/__init__.py": "x = 1\n",
        "pkg/low.py": "",
        "pkg/cli.py": "import argparse\nfrom pkg import low\n",
        "pkg/shim.py": "import argparse\n",
    }
    problems = _plant(tmp_path, files, "1  low\n2  cli\n3  shim\n")
    assert problems == [p for p in problems if "pkg/shim.py" in p] and len(problems) == 1, problems
    assert "only the CLI layer" in problems[0]


@pytest.mark.parametrize(
    "files, expected",
    [
        ({"pkg/low.py": "from pkg.mid import y\n", "pkg/mid.py": "y = 1\n"}, "(layer 1) imports pkg.mid (layer 2)"),
        ({"pkg/low.py": "def f():\n    from pkg.mid import y\n", "pkg/mid.py": "y = 1\n"}, "inside a function"),
        (
            {
                "pkg/low.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.mid import y\n",
                "pkg/mid.py": "y = 1\n",
            },
            "a higher layer",
        ),
        (
            {
                "pkg/low.py": "from pkg.other import z\nx = 1\n",
                "pkg/other.py": "from pkg.low import x\nz = 2\n",
                "pkg/mid.py": "",
            },
            "import cycle: pkg.low -> pkg.other",
        ),
        ({"pkg/low.py": "import argparse\n", "pkg/mid.py": ""}, "only the CLI layer"),
        ({"pkg/low.py": "from pkg import x\n", "pkg/mid.py": ""}, "the package facade"),
        ({"pkg/low.py": "", "pkg/mid.py": "", "pkg/stray.py": ""}, "pkg.stray is in no layer"),
    ],
)
def test_a_planted_violation_is_caught(tmp_path, files, expected):
    files = {"pkg/__init__.py": "x = 1\n", **files}
    problems = _plant(tmp_path, files, "1  low other\n2  mid\n3  cli\n")
    assert any(expected in p for p in problems), problems


def _plant_library(tmp_path: Path, files: dict[str, str], library: str = "core") -> list[str]:
    files = {"pkg/__init__.py": "", "pkg/trainer.py": "", **files}
    if not any(rel.startswith("pkg/core") for rel in files):
        files["pkg/core.py"] = "import json\n"
    for rel, text in files.items():
        path = tmp_path / "src" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    doc = tmp_path / "ARCHITECTURE.md"
    doc.write_text(f"# library\n<!-- library -->\n```\n{library}   # the library\n```\n")
    return check_library(tmp_path / "src", "pkg", doc, {"tqdm"})


def test_a_planted_library_that_keeps_the_boundary_passes(tmp_path):
    problems = _plant_library(
        tmp_path,
        {
            "pkg/core.py": "def f():\n    from pkg import trainer\n",
            "pkg/trainer.py": "import json\n",
            "pkg/cli.py": "def g():\n    import tqdm\n",  # outside the library, inside a function: fine
        },
    )
    assert problems == []


@pytest.mark.parametrize(
    "files, expected",
    [
        ({"pkg/core.py": "import tqdm\n"}, "pkg.core imports tqdm (the train extra) at module level"),
        ({"pkg/cli.py": "from tqdm import auto\n"}, "pkg.cli imports tqdm (the train extra) at module level"),
        ({"pkg/core.py": "def f():\n    import tqdm\n"}, "the library reaches it: pkg.core;"),
        (
            {"pkg/core.py": "def f():\n    from pkg import trainer\n", "pkg/trainer.py": "def g():\n    import tqdm\n"},
            "the library reaches it: pkg.trainer <- pkg.core;",
        ),
        ({"pkg/core/__init__.py": "", "pkg/core/a.py": "def f():\n    import tqdm\n"}, "reaches it: pkg.core.a;"),
        ({"pkg/__init__.py": "def f():\n    import tqdm\n"}, "reaches it: pkg <- pkg.core;"),  # a parent runs too
    ],
)
def test_a_planted_break_of_the_library_boundary_is_caught(tmp_path, files, expected):
    problems = _plant_library(tmp_path, files)
    assert any(expected in p for p in problems), problems


def test_a_library_entry_that_names_no_module_is_caught(tmp_path):
    problems = _plant_library(tmp_path, {}, library="core nosuch")
    assert any("library module nosuch is no module of pkg" in p for p in problems), problems
