"""rm/ is a library (issue 18): no import cycle among its modules, lazy imports inside functions
included; nothing of service/ or analysis/; DuckDB never opened; and the README's five lines of
Python train a reward model from a config object without loading any of those."""

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RM = ROOT / "rm"
FORBIDDEN = ("service", "analysis", "duckdb", "annotation")


def imports_of(path: Path) -> set[str]:
    """Every module an rm/ file imports, at the top or inside a function (`from rm import x` counts
    as `rm.x` when rm/x.py exists)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names
                         if node.module == "rm" and (RM / f"{a.name}.py").is_file())
    return found


def rm_graph() -> dict[str, set[str]]:
    modules = {f"rm.{p.stem}": p for p in RM.glob("*.py") if p.stem != "__init__"}
    return {name: {m for m in imports_of(path) if m in modules} for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle as a list of modules (first = last), or None: depth-first search with colours."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
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


def test_the_cycle_finder_finds_a_cycle_and_the_walker_sees_lazy_imports():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    # rm/train/reward.py imports rm.train.reward_data only inside a function
    assert "rm.train.reward_data" in rm_graph()["rm.train.reward"]


def test_no_import_cycle_among_rm_modules():
    assert find_cycle(rm_graph()) is None


@pytest.mark.parametrize("path", sorted(RM.glob("*.py")), ids=lambda p: p.name)
def test_rm_imports_nothing_of_the_edges_and_opens_no_store(path):
    bad = sorted(m for m in imports_of(path) if m.split(".")[0] in FORBIDDEN)
    assert not bad, f"{path.name} imports {bad}"
    text = path.read_text()
    assert not re.search(r"\bduckdb\b|\bStore\(", text), f"{path.name} mentions duckdb or Store("


def _readme_python() -> str:
    section = ROOT.joinpath("README.md").read_text().split("## Training from Python", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_python_trains_from_a_config_without_the_store(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.rm.train.test_train import synthetic_pairs

    code = _readme_python()
    assert len(code.strip().splitlines()) == 5
    rows = [{"prompt": p, "chosen": c, "rejected": r} for p, c, r in synthetic_pairs(48)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "pairs.parquet")
    probe = (code + "import json, sys\nprint(json.dumps({'metrics': metrics, 'loaded': sorted("
             f"m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})}}, default=str))\n")
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
    from rm.train.loop import TrainConfig
    from rm.train.reward import RewardRunConfig

    record = json.loads((folder / "train_config.json").read_text())
    again = RewardRunConfig.from_record(record)
    assert again == RewardRunConfig(base_model="tiny", max_length=128,
                                    train=TrainConfig(steps=20, lr=1e-3))
