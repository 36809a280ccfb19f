"""The package's layers: every import points down the table, lazy imports included.

A unit is a subpackage (``hvd_elastic.discovery``) or a top-level module
(``hvd_elastic.envvars``).  A unit imports only units in lower layers; units of
one layer are peers and never import each other, so discovery, the node
agent, the standby and training each stand on the shared layers below them and
none reaches another through its command.  Training runs inside the user's
process and reads no command line: it imports neither argparse nor the
command-line kit (:mod:`hvd_elastic.options`).  The graph is read from the sources
(:mod:`testbed.importgraph`): an import in a function body counts.

:data:`DEBT` and :data:`COMMAND_LINE_DEBT` list the edges that still break
these rules, each by the importing module and why; an entry that no longer
exists fails too, so the lists only shrink.
"""

from __future__ import annotations

from pathlib import Path

import hvd_elastic
from testbed import importgraph

PACKAGE = "hvd_elastic"
ROOT = Path(hvd_elastic.__file__).parent

#: Lowest first.  What each layer is for:
LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(layer.split()) for layer in (
    "errors gotypes hostnames fds sdnotify procfs",  # leaves: stdlib only
    "envvars",  # reading the environment: booleans, durations, HOROVOD_HOSTNAME
    "consul",  # the one Consul client
    "health",  # the service's health, read and judged: stdlib only, no command line
    "options metrics horovodrun",  # the command-line kit; Prometheus exporters; the driver's rules and store keys
    "discovery standby devagent training torchrun",  # the roles: each on the layers below, never on each other
    "nodeagent local",  # the node agent (starts through a standby); local clusters of dev agents
    "report",  # reading a job's evidence
    "demo",  # the demo's scenario and training job, on the local clusters
    "commands cli",  # one module per subcommand, and their registry
    "entry",  # the command's top: answers discovery's warm path before loading the registry
))

#: (importing module, imported unit): the edges issue 46 has yet to remove.
DEBT: dict[tuple[str, str], str] = {}
COMMAND_LINE_DEBT: dict[tuple[str, str], str] = {}


#: Units loaded into the user's training process, and what they never import: a command line is the script's.
LIBRARY = {"training", "torchrun"}
COMMAND_LINE = {"argparse", "hvd_elastic.options"}


def unit(module: str) -> str:
    """``hvd_elastic.discovery.watch`` -> ``discovery``; ``hvd_elastic`` itself -> ``hvd_elastic``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_of(name: str) -> int:
    for index, layer in enumerate(LAYERS):
        if name in layer:
            return index
    return len(LAYERS)  # the package's own __init__: the top


def upward_edges(root: Path = ROOT) -> dict[tuple[str, str], str]:
    """(module, imported unit) -> the imported module, for each import that does not point down."""
    found = {}
    for module, targets in importgraph.graph(root, PACKAGE).items():
        mine = unit(module)
        for target in targets:
            theirs = unit(target)
            if theirs != mine and layer_of(theirs) >= layer_of(mine):
                found[(module, theirs)] = target
    return found


def test_every_unit_of_the_package_has_a_layer():
    units = {unit(module) for module in importgraph.modules(ROOT, PACKAGE)} - {PACKAGE}
    placed = set().union(*LAYERS)
    assert units - placed == set(), f"units with no layer in LAYERS: {sorted(units - placed)}"
    assert placed - units == set(), f"LAYERS names units that do not exist: {sorted(placed - units)}"


def test_every_import_points_down_the_layers():
    edges = upward_edges()
    new = {edge: target for edge, target in edges.items() if edge not in DEBT}
    listing = "\n".join(f"  {module} imports {target} ({theirs}: layer {layer_of(theirs)}, "
                        f"{unit(module)}: layer {layer_of(unit(module))})"
                        for (module, theirs), target in sorted(new.items()))
    assert not new, f"imports up or across the layers of tests/test_layers.py:\n{listing}"
    paid = sorted(f"{module} -> {theirs}" for module, theirs in DEBT if (module, theirs) not in edges)
    assert not paid, f"DEBT lists edges that no longer exist (remove them): {paid}"


def test_training_reads_no_command_line():
    found = set()
    for module, path in importgraph.modules(ROOT, PACKAGE).items():
        if unit(module) in LIBRARY:
            for target in importgraph.imported(module, path, COMMAND_LINE):
                found.add((module, unit(target)))
    new = found - set(COMMAND_LINE_DEBT)
    assert not new, f"training modules that import a command-line parser: {sorted(new)}"
    paid = sorted(f"{module} -> {theirs}" for module, theirs in COMMAND_LINE_DEBT if (module, theirs) not in found)
    assert not paid, f"DEBT lists edges that no longer exist (remove them): {paid}"


def test_the_table_catches_an_import_up_the_layers(tmp_path):
    """The check itself: a leaf importing a role, through a lazy import, is an upward edge."""
    package = tmp_path / "hvd_elastic"
    (package / "discovery").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "discovery" / "__init__.py").write_text("")
    (package / "errors.py").write_text("def f():\n    from hvd_elastic.discovery import x\n")
    (package / "discovery" / "x.py").write_text("from hvd_elastic import errors\n")
    assert list(upward_edges(package)) == [("hvd_elastic.errors", "discovery")]
