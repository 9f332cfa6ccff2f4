"""The layout's rules, enforced: each stage of the core imports only the stages its package
docstring names (its `Imports:` line), no stage imports a later one, the core imports no framework
and no adapter, and the adapters use only the core's public surface.

Read from the source (ast), so it holds for imports inside functions and for modules named by
string to `importlib.import_module`, and needs no framework installed."""
from __future__ import annotations

import ast
import os
import re
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The stages in dependency order: a stage may import only stages before it (docs/design.md).
STAGES = ["precdbg.errors", "precdbg.version", "precdbg.records", "precdbg.config",
          "precdbg.storage", "precdbg.capture", "precdbg.check", "precdbg.compare.align",
          "precdbg.compare.judge", "precdbg.compare.localize", "precdbg.compare.report",
          "precdbg.compare", "precdbg.scan", "precdbg.weights"]
# modules above every stage: the command (a package: precdbg.cli.*) and the package's lazy
# public names
TOP = {"precdbg", "precdbg.__main__", "precdbg.cli"}


def _top(module: str) -> bool:
    return module in TOP or module.startswith("precdbg.cli.")
FRAMEWORKS = {"torch", "torch_npu", "mindspore", "mindtorch", "msadapter", "triton",
              "precdbg_pt", "precdbg_ms", "precdbg_examples"}
ADAPTERS = ("precdbg_pt", "precdbg_ms")
# what an adapter may import of the core: these packages, by the names in their __all__
ADAPTER_SURFACE = ("precdbg", "precdbg.errors", "precdbg.records", "precdbg.capture",
                   "precdbg.weights")


def _modules(package: str) -> Iterator[Tuple[str, str]]:
    """(dotted module name, file path) of every .py file of a top-level package."""
    root = os.path.join(REPO, package)
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
            yield (rel[:-len(".__init__")] if rel.endswith(".__init__") else rel), path


def _imports(module: str, path: str) -> List[Tuple[str, List[str], int]]:
    """(imported module, names taken from it, line) for every import in a file, at any depth,
    with relative imports resolved; `importlib.import_module("x")` and `__import__("x")`
    count as imports of x."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found: List[Tuple[str, List[str], int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, [], node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((target, [alias.name for alias in node.names], node.lineno))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__"):
                found.append((node.args[0].value, [], node.lineno))
    return found


def _stage_of(module: str) -> Optional[str]:
    """The stage a core module belongs to: the longest stage name it is inside."""
    best = None
    for stage in STAGES:
        if (module == stage or module.startswith(stage + ".")) and \
                (best is None or len(stage) > len(best)):
            best = stage
    return best


def _declared(stage: str) -> Set[str]:
    """The stages a stage's package docstring names on its `Imports:` line."""
    path = os.path.join(REPO, *stage.split("."))
    path = os.path.join(path, "__init__.py") if os.path.isdir(path) else path + ".py"
    with open(path, encoding="utf-8") as handle:
        doc = ast.get_docstring(ast.parse(handle.read())) or ""
    match = re.search(r"^Imports: (.*)$", doc, re.M)
    if match is None:
        return set()
    return {name.strip() for name in match.group(1).split(",") if name.strip()}


def _imported_module(target: str, names: List[str]) -> List[str]:
    """The modules an import statement loads: `from precdbg.capture import batch` loads the
    module precdbg.capture.batch when batch is one."""
    out = [target]
    for name in names:
        candidate = f"{target}.{name}"
        base = os.path.join(REPO, *candidate.split("."))
        if os.path.isdir(base) or os.path.isfile(base + ".py"):
            out.append(candidate)
    return out


def test_every_stage_says_its_job_and_what_it_may_import():
    for stage in STAGES:
        if stage in ("precdbg.errors", "precdbg.version"):
            continue
        init = os.path.join(REPO, *stage.split("."), "__init__.py")
        with open(init, encoding="utf-8") as handle:
            doc = ast.get_docstring(ast.parse(handle.read())) or ""
        assert len(doc.split("\n")[0]) > 20, f"{stage}: no docstring saying its job"
        assert re.search(r"^Imports: ", doc, re.M), f"{stage}: no 'Imports:' line"


def test_no_stage_declares_a_later_one():
    for stage in STAGES:
        for other in _declared(stage):
            assert other in STAGES, f"{stage}: declares {other}, which is no stage"
            assert STAGES.index(other) < STAGES.index(stage), \
                f"{stage} may import {other}, a later stage"


def test_each_core_module_imports_only_what_its_stage_declares():
    wrong: List[str] = []
    for module, path in _modules("precdbg"):
        stage = _stage_of(module)
        for target, names, line in _imports(module, path):
            top = target.split(".")[0]
            if top in FRAMEWORKS:
                wrong.append(f"{module}:{line} imports {target} (the core imports no framework)")
                continue
            if top != "precdbg" or _top(module):
                continue
            for loaded in _imported_module(target, names):
                other = _stage_of(loaded)
                if _top(loaded) or loaded == "precdbg":
                    wrong.append(f"{module}:{line} imports {loaded}, above every stage")
                elif other is None:
                    wrong.append(f"{module}:{line} imports {loaded}, in no stage")
                elif other != stage and other not in _declared(stage):
                    wrong.append(f"{module}:{line} ({stage}) imports {loaded} ({other}), "
                                 f"which {stage} does not declare")
    assert not wrong, "\n".join(wrong)


def _public_names(path: str) -> Set[str]:
    """The names in the `__all__` of the module at `path`."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__"
                                                for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def _surface_file(package: str) -> str:
    path = os.path.join(REPO, *package.split("."))
    return os.path.join(path, "__init__.py") if os.path.isdir(path) else path + ".py"


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_adapters_use_only_the_core_public_surface(adapter):
    other = [a for a in ADAPTERS if a != adapter]
    wrong: List[str] = []
    public: Dict[str, Set[str]] = {p: _public_names(_surface_file(p)) for p in ADAPTER_SURFACE}
    for module, path in _modules(adapter):
        for target, names, line in _imports(module, path):
            top = target.split(".")[0]
            if top in other:
                wrong.append(f"{module}:{line} imports the other adapter ({target})")
            if top != "precdbg":
                continue
            if target not in ADAPTER_SURFACE:
                wrong.append(f"{module}:{line} imports {target}: not the core's public surface "
                             f"({', '.join(ADAPTER_SURFACE)})")
                continue
            hidden = [n for n in names if n not in public[target] and n != "__version__"]
            if hidden:
                wrong.append(f"{module}:{line} imports {hidden} from {target}, not in its "
                             "__all__")
    assert not wrong, "\n".join(wrong)
