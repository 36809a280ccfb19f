"""No import cycle inside :mod:`hvd_elastic.discovery`, lazy imports included.

Discovery's modules are layered (the warm path's few stdlib-only modules at the
bottom, the command line at the top); an import back up the layers, even one
deferred into a function body, makes a module's behaviour depend on what
imports it.  The graph is read from the source (:mod:`testbed.importgraph`), so imports in
function bodies and under ``if TYPE_CHECKING:`` count as much as top-level ones.
"""

from __future__ import annotations

from pathlib import Path

import hvd_elastic.discovery
from testbed import importgraph
from testbed.importgraph import find_cycle, imported

PACKAGE = "hvd_elastic.discovery"
ROOT = Path(hvd_elastic.discovery.__file__).parent


def graph() -> dict[str, set[str]]:
    return importgraph.graph(ROOT, PACKAGE)


def short(name: str) -> str:
    return name.removeprefix(PACKAGE + ".")


def test_the_walker_sees_lazy_relative_and_dotted_imports(tmp_path):
    """The walker itself: an import in a function body, a relative one and ``import a.b`` are edges."""
    src = tmp_path / "m.py"
    src.write_text("import hvd_elastic.discovery.cache\n"
                   "def f():\n    from . import jobdir\n    from .hosts import Options\n"
                   "    from hvd_elastic.discovery import watch as w\n")
    known = {PACKAGE, f"{PACKAGE}.cache", f"{PACKAGE}.jobdir", f"{PACKAGE}.hosts", f"{PACKAGE}.watch", f"{PACKAGE}.m"}
    wanted = {f"{PACKAGE}.{m}" for m in ("cache", "jobdir", "hosts", "watch")}
    assert imported(f"{PACKAGE}.m", src, known) - {PACKAGE} == wanted
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_discovery():
    edges = graph()
    cycle = find_cycle(edges)
    listing = "\n".join(f"  {short(a)} -> {', '.join(sorted(map(short, b))) or '-'}" for a, b in sorted(edges.items()))
    assert cycle is None, f"import cycle: {' -> '.join(map(short, cycle))}\nall imports:\n{listing}"
