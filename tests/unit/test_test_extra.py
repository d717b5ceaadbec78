"""Every module the tests import is declared: the project's own requirements or the test extra
(setup.cfg), so a fresh `pip install -e '.[test]'` runs the suite (issue 20)."""

from __future__ import annotations

import ast
import configparser
import importlib.metadata
import sys

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support import PROJECT_ROOT

FIRST_PARTY = {
    "app",
    "tests",
    "modelforge_node_agent",
    "modelforge_agent_acquire",
    "modelforge_agent_runtime",
    "modelforge_agent_artifacts",
    "modelforge_agent_gguf",
    "modelforge_runtime_worker",
    "pynvml",
    "wsgi",
}


def imported_top_levels(source: str) -> set[str]:
    """The top-level module names `source` imports, at any depth (lazy imports inside functions too)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def declared_distributions() -> set[str]:
    parser = configparser.ConfigParser()
    parser.read(PROJECT_ROOT / "setup.cfg")
    lines = parser["options"]["install_requires"].splitlines() + parser["options.extras_require"]["test"].splitlines()
    return {canonicalize_name(Requirement(line).name) for line in lines if line.strip() and not line.startswith("#")}


def undeclared(modules: set[str]) -> dict[str, list[str]]:
    """Third-party modules among `modules` whose distribution setup.cfg does not name."""
    providers = importlib.metadata.packages_distributions()
    declared = declared_distributions()
    missing = {}
    for module in sorted(modules - FIRST_PARTY - set(sys.stdlib_module_names)):
        distributions = sorted({canonicalize_name(name) for name in providers.get(module, [])})
        if not set(distributions) & declared:
            missing[module] = distributions
    return missing


def test_every_module_the_tests_import_is_declared_in_setup_cfg():
    modules = set()
    for path in (PROJECT_ROOT / "tests").rglob("*.py"):
        modules |= imported_top_levels(path.read_text(encoding="utf-8"))
    assert undeclared(modules) == {}


def test_the_check_sees_an_undeclared_module_and_a_lazy_import():
    source = "import json\n\ndef later():\n    import pandas.io\n    from tests.support import ADMIN\n"
    assert imported_top_levels(source) == {"json", "pandas", "tests"}
    assert "pandas" in undeclared({"json", "pandas", "tests"})
