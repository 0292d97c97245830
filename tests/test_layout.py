"""The package's folders are layers and imports flow one way, down: the command line and the
server use the engine, the engine uses speculation (drafters, controllers, verification),
which uses sampling and the models, which use the kernels. A module may import its own layer
and any lower one, never a higher one (a lazy import inside a function counts too)."""
import ast
from pathlib import Path

import specdec

PACKAGE = Path(specdec.__file__).parent
# lowest first; modules at the package's root (errors, extras, stats) are shared by all
LAYERS = [["errors", "extras", "stats"], ["kernels"], ["models"], ["sampling"], ["chat"], ["data"], ["spec"],
          ["engine"], ["train"], ["server"], ["bench", "cli"]]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def part_of(module: str) -> str:
    """The layer name of a dotted module under specdec ("specdec.spec.verify" -> "spec")."""
    return module.split(".")[1]


def imported(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specdec."):
            out.append((node.module, node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.startswith("specdec.")]
    return out


def test_every_folder_and_root_module_has_a_layer():
    names = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())}
    assert names == set(RANK), f"unplaced: {sorted(names - set(RANK))}; gone: {sorted(set(RANK) - names)}"


def test_imports_flow_down():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        if rel.parts == ("__init__",):  # the public API re-exports from every layer
            continue
        own = RANK[rel.parts[0]]
        for module, line in imported(path):
            if RANK[part_of(module)] > own:
                upward.append(f"specdec/{path.relative_to(PACKAGE)}:{line} imports {module}")
    assert not upward, "imports against the layers:\n" + "\n".join(upward)
