"""The packages' layering: no import cycle anywhere, and no upward dependency.

Every module of annotation/, analysis/, rm/ and service/ is parsed; an edge is an import at the top
or inside a function, `from pkg import name` where `name` is a module, or a string constant that
names a module of ours ("rm.verify.worker", "service.x:func"): what `importlib`, a worker or an entry
point would load. Allowed directions (shared/DESIGN.md): service may import anything; analysis.report
reads annotation.store; otherwise rm, annotation and analysis import only themselves.
"""

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("annotation", "analysis", "rm", "service")
MODULE_STRING = re.compile(r"^((?:annotation|analysis|rm|service)(?:\.\w+)+)(?::\w+)?$")
ALLOWED = {  # package -> the packages it may import
    "rm": {"rm"},
    "annotation": {"annotation"},
    "analysis": {"analysis"},
    "service": set(PACKAGES),
}
EXCEPTIONS = {("analysis.report", "annotation.store"),  # the one module that reads the store
              ("analysis.report", "annotation.outputs")}  # and writes its files as exports are written


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules(root: Path = ROOT) -> dict[str, Path]:
    return {module_name(p, root): p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))
            if "tests" not in p.parts}


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ours that a file imports, by statement or by string, resolved to the longest
    known module name (`rm.verify.rules.run_verifier` -> `rm.verify.rules`)."""
    named = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            named.add(node.module)
            named.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if match := MODULE_STRING.match(node.value.strip()):
                named.add(match.group(1))
    found = set()
    for name in named:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> modules it imports; a package's own `__init__` is not an edge of its submodules
    (Python runs it first, whatever they import)."""
    modules = all_modules(root)
    graph = {}
    for name, path in modules.items():
        parents = {name.rsplit(".", k)[0] for k in range(1, name.count(".") + 1)}
        graph[name] = imports_of(path, modules) - parents - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle as a list of modules (first = last), or None: depth-first search with colours."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def upward(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in graph.items():
        allowed = ALLOWED[module.split(".")[0]]
        bad += [f"{module} -> {t}" for t in sorted(targets)
                if t.split(".")[0] not in allowed and (module, t) not in EXCEPTIONS]
    return bad


def test_the_checks_catch_a_cycle_an_upward_import_and_a_string(tmp_path):
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "rm" / "a.py").write_text("def f():\n    from rm import b\n")
    (tmp_path / "rm" / "b.py").write_text("WORKER = 'service.x:run'\nimport rm.a\n")
    (tmp_path / "service" / "x.py").write_text("from rm.a import f\n")
    graph = import_graph(tmp_path)
    assert graph["rm.a"] == {"rm.b"} and graph["rm.b"] == {"rm.a", "service.x"}
    assert find_cycle(graph) == ["rm.a", "rm.b", "rm.a"]
    assert upward(graph) == ["rm.b -> service.x"]


def test_no_import_cycle_anywhere():
    assert find_cycle(import_graph()) is None


def test_no_upward_dependency_even_by_string():
    assert upward(import_graph()) == []


@pytest.mark.parametrize("path", sorted((ROOT / "rm").rglob("*.py")), ids=lambda p: module_name(p))
def test_rm_opens_no_store(path):
    assert not re.search(r"\bduckdb\b|\bStore\(", path.read_text()), f"{path} mentions duckdb or Store("


def test_public_api_names_resolve():
    import rm

    assert rm.__all__ == sorted(rm.__all__) and "train_reward_model" in rm.__all__
    missing = [name for name in rm.__all__ if getattr(rm, name, None) is None]
    assert missing == []
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        rm.nope  # noqa: B018


def _manual_python() -> str:
    """The first Python block of the manual's "Training from Python" page."""
    return re.search(r"```python\n(.*?)```", ROOT.joinpath("docs/python.md").read_text(), re.S).group(1)


def test_manual_python_trains_and_scores_through_the_public_api(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.rm.train.test_train import synthetic_pairs

    code = _manual_python()
    imports = re.findall(r"^\s*(?:from|import)\s+([\w.]+)", code, re.M)
    assert imports and set(imports) <= {"rm", "pyarrow", "pyarrow.parquet"}, imports
    rows = [{"prompt": p, "chosen": c, "rejected": r} for p, c, r in synthetic_pairs(48)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "pairs.parquet")
    forbidden = ("service", "analysis", "annotation", "duckdb")
    probe = (code + "import json, sys\nprint(json.dumps({'metrics': metrics, 'scores': scores, "
             "'loaded': sorted(m for m in sys.modules if m.split('.')[0] in "
             f"{forbidden!r})}}, default=str))\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                               "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["loaded"] == []
    metrics = out["metrics"]
    assert metrics["steps"] == 20 and metrics["n_pairs"] == 48
    folder = tmp_path / "models" / "my-rm"
    assert Path(metrics["path"]) == folder and (folder / "model.safetensors").is_file()
    assert len(out["scores"]) == 2 and all(isinstance(s, float) for s in out["scores"])
    from rm import RewardRunConfig, TrainConfig

    record = json.loads((folder / "train_config.json").read_text())
    assert RewardRunConfig.from_record(record) == RewardRunConfig(
        base_model="tiny", max_length=128, train=TrainConfig(steps=20, lr=1e-3))
