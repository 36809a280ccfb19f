"""The site's reference pages, generated from the code on every build (docs/hooks.py calls :func:`pages`).

Nothing here is committed as Markdown, so a reference page can never be stale: the
command line comes from the argparse parsers (:func:`hvd_elastic.cli.build_parser`),
the Python API from the docstrings, the metrics from the exporters' own collectors,
the event-log schema from :mod:`hvd_elastic.training.events`, and the environment
variables from a scan of the package's source.  What the code cannot say by itself
(what a variable that no flag reads means, the exit codes of each command) is written
in the tables below, and the generator REFUSES to build when they and the code
disagree: a variable the source reads that has no row, a row for a variable the
source no longer reads, a command without exit codes, an event the schema table
misses, a public API member without a docstring.  Each refusal names what to fix.

    .venv/bin/python docs/gen_reference.py --out /tmp/ref   # write the pages to look at them
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import os
import re
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "hvd_elastic"
ENV_RE = re.compile(r"HVD_ELASTIC_[A-Z0-9_]+")


class ReferenceError(Exception):
    """The code and the hand-written tables here disagree; the message says what to fix."""


# ----------------------------------------------------------------------------------------------- environment

def scrubbed_environment() -> None:
    """Defaults in --help are read from the environment: build from none of ours, at a fixed width."""
    for name in list(os.environ):
        if name.startswith(("HVD_ELASTIC_", "CONSUL_")):
            del os.environ[name]
    os.environ["COLUMNS"] = "100"
    # The node agent's and the demo's help name this machine nowhere, but a standby socket dir might.
    os.environ.pop("XDG_RUNTIME_DIR", None)


def variables_in_source() -> dict[str, list[str]]:
    """Every ``HVD_ELASTIC_*`` name in hvd_elastic/, with the modules that name it."""
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        for name in ENV_RE.findall(path.read_text()):
            found.setdefault(name, set()).add(module.removesuffix(".__init__"))
    return {name: sorted(mods) for name, mods in sorted(found.items())}


#: Variables no flag reads (or read beside their flag elsewhere): what each means, its default, who reads it.
#: Every entry must name a variable the source reads; every variable the source reads must be here or be
#: the documented default of a flag (found by the parsers).  Facts from the modules named.
VARIABLES: dict[str, str] = {
    "HVD_ELASTIC_ALLOW_EXPOSED_TOKEN": (
        "A boolean. True lets discovery run under horovodrun with the ACL token in `CONSUL_HTTP_TOKEN` or "
        "`--token`, accepting that horovodrun copies it onto every remote worker's ssh command line. Default "
        "false: discovery refuses, exit 2 with one line naming the risk and the fix. Outside horovodrun the "
        "variable and the flag work as in Consul's own tools."),
    "HVD_ELASTIC_CHECKPOINT_WRITE_DELAY": (
        "Fault injection for tests: seconds the checkpoint writer sleeps after the payload's bytes are in the "
        "temporary file and before it is made durable, so a test can kill a job in the middle of a write. "
        "Default 0 (no delay)."),
    "HVD_ELASTIC_DISCOVERY_STATE_DIR": (
        "Where discovery keeps each job's state (the host cache, its watcher's log, the first-call marker): "
        "`<dir>/<horovodrun pid>-<start>/`. Default `$XDG_RUNTIME_DIR/hvd-elastic`, else "
        "`/tmp/hvd-elastic-<uid>`; it must be private (0700) to the user."),
    "HVD_ELASTIC_DRIVER": (
        "Read at the start of every interpreter of the environment (the `hvd_elastic_horovodrun.pth` line): "
        "`0` (or false/off) keeps hvd-elastic's hook out of horovodrun's own process altogether; otherwise the "
        "hook loads its rules when horovodrun imports its elastic launcher (`hvd_elastic/horovodrun/`)."),
    "HVD_ELASTIC_HEALTH_REAP": (
        "A boolean, default on, read by the job's discovery watcher on the launch host: it ends horovodrun's "
        "ssh sessions to a lost host whose sshd no longer greets. `0` turns it off."),
    "HVD_ELASTIC_LAUNCH_ATTEMPT": (
        "Not read: written by `hvd-elastic launch` into the environment of the command it runs, `0` the first "
        "time and one more at each relaunch."),
    "HVD_ELASTIC_STANDBY_DIR": (
        "The warm standby's socket directory, for `hvd-elastic standby` and `hvd-elastic exec`. Default "
        "`$XDG_RUNTIME_DIR/hvd-elastic`, else `/tmp/hvd-elastic-<uid>`."),
    "HVD_ELASTIC_STANDBY_TIMEOUT": (
        "Seconds `hvd-elastic exec` waits for the standby's answer before it runs the command itself: a "
        "number in (0, 60], default 0.5."),
    "HVD_ELASTIC_SERVICE": (
        "Also read by the training workers' health cut, with `HVD_ELASTIC_TAGS`, `HVD_ELASTIC_FILTER` and "
        "`HVD_ELASTIC_HOST_NAME`: give discovery its options through these variables, not flags, so workers "
        "name hosts as horovodrun does."),
}



def worker_variables() -> dict[str, str]:
    """The training process's variables, described from their table (:mod:`hvd_elastic.training.settings`)."""
    from hvd_elastic.training import settings

    return {v.name: f"{v.check.expected[0].upper()}{v.check.expected[1:]}, default "
                    f"{f'`{v.default}`' if v.default else 'unset'}, read once where a job starts (`TrainingState()`, "
                    f"or `@hvd_elastic.run` for Horovod's own states): {v.meaning}" for v in settings.VARIABLES}


def worker_table() -> list[str]:
    from hvd_elastic.training import settings

    return [f"| `{v.name}` | `{v.field}` | {v.check.expected} | {f'`{v.default}`' if v.default else 'unset'} |"
            for v in settings.VARIABLES]


#: Variables a flag reads, found by setting each one and rebuilding every parser: (command, flag) pairs.
def flags_reading(names: list[str]) -> dict[str, list[tuple[str, argparse.Action]]]:
    from hvd_elastic import cli

    def defaults() -> dict[tuple[str, str], object]:
        out = {}
        for command, parser in parsers(cli):
            for action in parser._actions:
                if action.option_strings:
                    out[(command, action.option_strings[-1])] = repr(action.default)
        return out

    base = defaults()
    linked: dict[str, list[tuple[str, argparse.Action]]] = {}
    for name in names:
        os.environ[name] = "sentinel_value"
        try:
            changed = {key for key, value in defaults().items() if base.get(key) != value}
        finally:
            del os.environ[name]
        for command, parser in parsers(cli):
            for action in parser._actions:
                if not action.option_strings:
                    continue
                mentioned = re.search(rf"\benv {name}\b", action.help or "")
                if (command, action.option_strings[-1]) in changed or mentioned:
                    linked.setdefault(name, []).append((command, action))
    return linked


def parsers(cli) -> list[tuple[str, argparse.ArgumentParser]]:
    """("hvd-elastic", top parser) and ("hvd-elastic NAME", its parser) for every command, in --help order."""
    out = []
    for name in cli.COMMANDS:
        top = cli.build_parser(only=name)
        if not out:
            out.append(("hvd-elastic", top))
        out.append((f"hvd-elastic {name}", subparser(top, name)))
    return out


def subparser(top: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    (group,) = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    return group.choices[name]


def expanded_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help:
        return ""
    return " ".join(parser._get_formatter()._expand_help(action).split())


def environment_page() -> str:
    scanned = variables_in_source()
    described = {**VARIABLES, **worker_variables()}
    stale = sorted(set(described) - set(scanned))
    if stale:
        raise ReferenceError(f"docs/gen_reference.py VARIABLES describes {', '.join(stale)}, which hvd_elastic/ no "
                             f"longer names: remove the rows")
    from hvd_elastic import envvars

    linked = flags_reading(list(scanned))
    missing = sorted(set(scanned) - set(described) - set(linked))
    if missing:
        raise ReferenceError(f"hvd_elastic/ reads {', '.join(missing)}, which no flag's help names (env NAME) and "
                             f"docs/gen_reference.py VARIABLES does not describe: add a row for each")
    lines = [
        "# Environment variables",
        "",
        f"Every `HVD_ELASTIC_*` variable the package names ({len(scanned)}), found by scanning `hvd_elastic/`. A "
        "variable that is the default of a flag is shown with that flag's own help (a flag always wins over its "
        "variable); the others are described from the modules that read them. A boolean is read as Consul "
        f"reads its own (Go's `strconv.ParseBool`): {words(envvars.TRUE)} are true, {words(envvars.FALSE)} "
        "false; an empty variable is unset. The `CONSUL_*` variables are Consul's own: see "
        "[TLS and ACLs](../howto/tls-acls.md).",
        "",
        "## A training process's settings",
        "",
        "Read once where a job starts into one typed object (`hvd_elastic.training.settings.WorkerSettings`), "
        "which the library passes down; each is described with the others below.",
        "",
        "| variable | setting | type | default |",
        "|---|---|---|---|",
        *worker_table(),
        "",
        "## Variables of the package",
        "",
    ]
    from hvd_elastic import cli

    by_command = dict(parsers(cli))
    for name, modules in scanned.items():
        via, meaning = [], []
        seen_help = set()
        for command, action in linked.get(name, []):
            flag = action.option_strings[-1]
            via.append(f"`{command} {flag}`")
            text = expanded_help(by_command[command], action)
            if text not in seen_help:
                seen_help.add(text)
                meaning.append(cell(text))
        if name in described:
            meaning.append(cell(described[name]))
        kind = "the default of" if via else "read by"
        via = via or [f"`{m}`" for m in modules]
        lines += [f"### `{name}`", "", f"*{kind}* {', '.join(dict.fromkeys(via))}", ""]
        lines += [f"{text}\n" for text in meaning]
    lines += ["## Variables of the scripts", "",
              "Read by the shell scripts and units under `scripts/` (not by the package), each described where it "
              "is read.", "", "| variable | where, and what |", "|---|---|"]
    for name, uses in script_variables(set(scanned)).items():
        lines.append(f"| `{name}` | {'<br>'.join(f'`{path}`: {cell(text)}' for path, text in uses)} |")
    return "\n".join(lines) + "\n"


def script_variables(known: set[str]) -> dict[str, list[tuple[str, str]]]:
    """``HVD_ELASTIC_*`` names in scripts/ that the package does not read: (file, the comment that describes
    it, else the line that reads it) per file."""
    found: dict[str, list[tuple[str, str]]] = {}
    for path in sorted((REPO / "scripts").rglob("*")):
        if not path.is_file() or path.suffix in (".json", ".yaml"):
            continue
        try:
            lines = path.read_text().splitlines()
        except UnicodeDecodeError:
            continue
        for name in dict.fromkeys(ENV_RE.findall("\n".join(lines))):
            if name in known:
                continue
            at = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("#") and name in ln), None)
            comment = None
            if at is not None:  # the comment line, and the next ones while a parenthesis is open
                comment = lines[at].lstrip("# ").strip()
                while comment.count("(") > comment.count(")") and at + 1 < len(lines) \
                        and lines[at + 1].lstrip().startswith("#"):
                    at += 1
                    comment += " " + lines[at].lstrip("# ").strip()
            text = comment or next(ln.strip() for ln in lines if name in ln)
            text = text.split(name, 1)[1].strip(" :=,") if comment and text.startswith(name) else text
            found.setdefault(name, []).append((str(path.relative_to(REPO)), text))
    return dict(sorted(found.items()))


def words(values) -> str:
    return ", ".join(f"`{v}`" for v in sorted(values, key=lambda v: (v.lower(), v)))


def cell(text: str) -> str:
    """Text for one Markdown table cell: no pipes, no newlines, angle brackets shown."""
    text = " ".join(text.split()).replace("|", "\\|")
    return escape_angles(text)


def escape_angles(text: str) -> str:
    """``<`` outside backtick spans as ``&lt;``, so ``<workdir>`` is shown, not taken for an HTML tag."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(p if p.startswith("`") else p.replace("<", "&lt;") for p in parts)


# ----------------------------------------------------------------------------------------------- command line

def cli_page() -> str:
    from hvd_elastic import cli
    from hvd_elastic.commands import exec as launch

    lines = [
        "# Command line",
        "",
        "Generated from the parsers `hvd-elastic` itself builds (`hvd_elastic/cli.py` and each command's "
        "module in `hvd_elastic/commands/`), with no `HVD_ELASTIC_*` or `CONSUL_*` variable set: a variable "
        "that a flag reads changes that flag's default (see [environment variables](environment.md)). Exit codes "
        "are on [their own page](exit-codes.md).",
        "",
    ]
    for command, parser in parsers(cli):
        name = command.split(" ", 1)[1] if " " in command else None
        lines += [f"## `{command}`", ""]
        if name is None:
            lines += [escape_angles(parser.description or ""), "", "| command | what it does |", "|---|---|"]
            lines += [f"| [`{c}`](#hvd-elastic-{c}) | {cell(what)} |" for c, what in cli.COMMANDS.items()]
            lines += ["", "Global options come before the command: `hvd-elastic --log-level DEBUG status`.", ""]
        else:
            lines += [escape_angles(cli.COMMANDS[name][0].upper() + cli.COMMANDS[name][1:]) + ".", ""]
        if name == "exec":
            # hvd-elastic exec parses its own argv (stdlib only, every worker start): its --help is this text.
            lines += ["```text", launch.HELP, "```", ""]
            continue
        lines += ["```text", parser.format_usage().strip(), "```", ""]
        if name == "discover":
            lines += ["`discovery/consul_hosts` (installed as `consul_hosts`), the script for `horovodrun "
                      "--host-discovery-script`, takes exactly these flags.", ""]
        for group in parser._action_groups:
            actions = [a for a in group._group_actions if a.help != argparse.SUPPRESS and a.dest != "help"
                       and not isinstance(a, argparse._SubParsersAction)]
            if not actions:
                continue
            lines += [f"**{escape_angles(group.title[0].upper() + group.title[1:])}**", "",
                      "| option | meaning |", "|---|---|"]
            for action in actions:
                lines.append(f"| {option_cell(action)} | {cell(expanded_help(parser, action))} |")
            lines.append("")
        if name is not None and parser.epilog:
            lines += ["```text", textwrap.dedent(parser.epilog).strip(), "```", ""]
    return "\n".join(lines)


def option_cell(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    if action.nargs == 0:
        return ", ".join(f"`{o}`" for o in action.option_strings)
    metavar = action.metavar or (("{" + ",".join(map(str, action.choices)) + "}") if action.choices
                                 else action.dest.upper())
    if action.nargs == "?":
        metavar = f"[{metavar}]"
    return ", ".join(f"`{o} {metavar}`" for o in action.option_strings)


# ----------------------------------------------------------------------------------------------- exit codes

#: Each command's exit codes, as its module states them (docstring or --help epilog).  A command missing
#: here, or a row for a command that no longer exists, stops the build.
EXIT_CODES: dict[str, list[tuple[str, str]]] = {
    "hvd-elastic (every command)": [
        ("0", "success"), ("1", "the operation failed"), ("2", "bad usage or bad input: one stderr line naming "
                                                           "the value and what was expected"),
        ("130", "interrupted (Ctrl-C)")],
    "doctor": [("0", "every required check passed (optional ones may warn)"),
               ("1", "a required check failed; its line says how to fix it"),
               ("2", "bad input: a setting that failed a required check (a bad `--http-addr`/`CONSUL_HTTP_ADDR`, an "
                     "unreadable token file), or a `--hosts` entry that is no host name (refused before any ssh)")],
    "consul-dev": [("0", "clean stop (SIGTERM or SIGINT)"),
                   ("1", "could not start (port in use, unreadable certificate)"), ("2", "bad arguments")],
    "discover": [("0", "stdout holds the complete host list (possibly empty) and nothing else"),
                 ("1", "Consul was unreachable, refused access (403, ACL-hidden results), failed (5xx), timed out "
                       "or answered garbage; stdout is empty, one stderr line says why"),
                 ("2", "bad flag or environment value; also a token in `CONSUL_HTTP_TOKEN` or `--token` under "
                       "horovodrun without `HVD_ELASTIC_ALLOW_EXPOSED_TOKEN=1`")],
    "node-agent": [("0", "stopped by SIGTERM or SIGINT, after draining (with `--leave-timeout`) and "
                         "deregistering"),
                   ("1", "what waiting cannot heal: Consul refusing the first registration (HTTP 400, 403), or the "
                         "service ID kept by another live node agent of this host"),
                   ("2", "bad input; Consul being unreachable is not fatal (retried and logged)")],
    "drain": [("0", "done (and, with `--wait`, the job has left)"),
              ("1", "Consul failed, or no such service on this agent"), ("2", "bad input"),
              ("3", "`--wait` ran out while Horovod workers still ran on this node")],
    "undrain": [("0", "done"), ("1", "Consul failed, or no such service on this agent"), ("2", "bad input"),
                ("3", "never: undrain does not wait (its module, shared with drain, names `drain --wait`'s 3)")],
    "status": [("0", "shown"), ("1", "Consul failed"), ("2", "bad input")],
    "standby": [("0", "after a stop"), ("1", "cannot start (a preload fails, the socket is taken)"),
                ("2", "bad input")],
    "exec": [("the worker's", "the worker's exit code, or this process dies of the worker's signal"),
             ("1", "the standby died while the worker ran: the worker's status is lost, so it is terminated"),
             ("2", "bad usage"), ("127", "the command cannot be run")],
    "launch": [("0", "the command exited 0"),
               ("the command's last", "its last exit code once no restart remains (128 + N after signal N); "
                                      "a usage error (2) is never relaunched"),
               ("127", "the command cannot be started")],
    "demo": [("0", "every check held (exactly-once, accuracy)"), ("1", "a check failed or a phase timed out"),
             ("2", "bad input, such as a schedule that cannot work"), ("130", "interrupted (Ctrl-C or SIGTERM)")],
    "report": [("0", "the report was printed (skipped lines are warned about on stderr)"),
               ("1", "the picture could not be drawn or written (without matplotlib, it says so and how to get "
                     "it)"),
               ("2", "the run directory or its event log is missing")],
}


def exit_statements(name: str) -> list[str]:
    """The sentences of a command's module docstring and --help that speak of exit codes."""
    from hvd_elastic import cli
    from hvd_elastic.commands import exec as launch

    module = importlib.import_module(cli.module_name(name))
    texts = [module.__doc__ or "", subparser(cli.build_parser(only=name), name).epilog or ""]
    texts += [launch.HELP] if name == "exec" else []
    flat = " ".join(" ".join(texts).split())
    return [s for s in re.split(r"(?<=[.;])\s+", flat) if re.search(r"\b[Ee]xit", s)]


def exit_codes_in(sentences: list[str]) -> set[int]:
    """Exit codes named in ``sentences``: numbers 0-255 that are no duration, version, issue or HTTP status."""
    found = set()
    for sentence in sentences:
        for number in re.findall(r"(?<![\w.#-])(\d{1,3})(?![\w.%-]|\s*s\b|\s*seconds)", sentence):
            if int(number) <= 255:
                found.add(int(number))
    return found


def exit_codes_page() -> str:
    from hvd_elastic import cli

    named = {k for k in EXIT_CODES if not k.startswith("hvd-elastic")}
    missing, stale = sorted(set(cli.COMMANDS) - named), sorted(named - set(cli.COMMANDS))
    if missing or stale:
        raise ReferenceError(f"docs/gen_reference.py EXIT_CODES: no row for {', '.join(missing) or '-'}; rows for "
                             f"commands that no longer exist: {', '.join(stale) or '-'}")
    lines = ["# Exit codes", "",
             "The conventions of every `hvd-elastic` command (`hvd_elastic/cli.py`), then what each command adds "
             "or means by them. Under each table, the sentences of the command's module and `--help` that speak "
             "of exit codes, quoted from the code; the build stops when they name a code the table lacks. "
             "`discovery/consul_hosts` exits as `hvd-elastic discover`.", ""]
    for command, rows in EXIT_CODES.items():
        title = command if command.startswith("hvd-elastic") else f"hvd-elastic {command}"
        lines += [f"## `{title}`" if "(" not in title else f"## {title}", "", "| exit | when |", "|---|---|"]
        lines += [f"| {code} | {cell(when)} |" for code, when in rows]
        lines.append("")
        if command.startswith("hvd-elastic"):
            continue
        said = exit_statements(command)
        listed = {int(n) for code, when in rows for n in re.findall(r"\b\d{1,3}\b", f"{code} {when}")}
        unlisted = sorted(exit_codes_in(said) - listed)
        if unlisted:
            raise ReferenceError(f"hvd-elastic {command}'s code speaks of exit {', '.join(map(str, unlisted))}, which "
                                 f"docs/gen_reference.py EXIT_CODES[{command!r}] does not list")
        if said:
            lines += ["??? quote \"In the code's words\"", ""]
            lines += [f"    - {rst_inline(sentence)}" for sentence in said]
            lines.append("")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- metrics

def metrics_page() -> str:
    from prometheus_client import CollectorRegistry

    from hvd_elastic.metrics.job import JobMetrics
    from hvd_elastic.metrics.nodeagent import NodeAgentMetrics
    from hvd_elastic.discovery.watch_metrics import WatcherMetrics

    job = JobMetrics()
    job.on_checkpoint(True, 1.0, 5)  # the checkpoint gauges appear once one was written
    job.on_pace({"gpu-a": 1.0}, 0)  # a host's speed appears once a straggler window closed
    job_registry = CollectorRegistry()
    job_registry.register(job)
    node = NodeAgentMetrics()
    node.on_maintenance("horovod", False)  # a labelled child appears once set
    with tempfile.TemporaryDirectory() as tmp:
        watcher = WatcherMetrics(os.path.join(tmp, "hosts"))
        exporters = [
            ("The job", "rank 0 of `@hvd_elastic.run`, at `RunConfig(metrics_addr=...)` or "
                        "`HVD_ELASTIC_METRICS_ADDR`", job_registry),
            ("Each node agent", "`hvd-elastic node-agent --metrics-addr` or `HVD_ELASTIC_NODE_METRICS_ADDR`; the "
                                "bound port is advertised as `Meta.metrics_port`", node.registry),
            ("The discovery watcher", "`hvd-elastic discover --watch --cache-file PATH --metrics-addr` or "
                                      "`HVD_ELASTIC_DISCOVERY_METRICS_ADDR`", watcher.registry),
        ]
        lines = ["# Prometheus metrics", "",
                 "Every series the three exporters serve, read from their collectors (`hvd_elastic/metrics/`). "
                 "Each serves only when given an address, on loopback unless a host is written out. How to "
                 "scrape them and the Grafana dashboard: [metrics and the dashboard](../howto/metrics.md).", ""]
        for title, where, registry in exporters:
            lines += [f"## {title}", "", f"Served by {where}.", "",
                      "| series | type | labels | meaning |", "|---|---|---|---|"]
            for family in registry.collect():
                labels: dict[str, set[str]] = {}
                for sample in family.samples:
                    for key, value in sample.labels.items():
                        if key not in ("le", "quantile"):
                            labels.setdefault(key, set()).add(value)
                shown = "<br>".join(f"`{k}`: {', '.join(f'`{v}`' for v in sorted(vals))}" if k != "service_id"
                                    else f"`{k}`" for k, vals in labels.items()) or "-"
                suffix = "_total" if family.type == "counter" else ""
                lines.append(f"| `{family.name}{suffix}` | {family.type} | {shown} | "
                             f"{cell(family.documentation)} |")
            lines.append("")
    lines += ["Histograms also give `_bucket{le}`, `_sum` and `_count`. The phases of a reset: `detection` is, "
              "for a change of hosts, from rank 0's first host notification to the interrupt and, for a failure, "
              "from the last commit to the error; `reinit` runs to the start of the sync (Horovod's shutdown, "
              "rendezvous, the newcomers' start-up, `hvd.init`); then the `sync`; `first_step` ends at the first "
              "commit. `recovery_seconds` is their sum, observed once per reset.", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- event log

def events_page() -> str:
    from hvd_elastic.training import events

    rows = rst_table(events.__doc__ or "")
    names = [name.strip("`") for name, _ in rows]
    missing = [e for e in events.EVENTS if e not in names]
    extra = [n for n in names if n not in events.EVENTS]
    if missing or extra:
        raise ReferenceError(f"hvd_elastic/training/events.py: the docstring's table and EVENTS differ (not in the "
                             f"table: {', '.join(missing) or '-'}; not in EVENTS: {', '.join(extra) or '-'})")
    intro = events.__doc__.split("\n\n")[2]  # "Every record has time and event; the decorator adds ..."
    lines = ["# Event log", "",
             "`@hvd_elastic.run(event_log=PATH)` has rank 0 append one JSON object per line to `PATH` "
             "(`hvd-elastic report RUN_DIR` reads `RUN_DIR/events.jsonl`). Generated from "
             "`hvd_elastic/training/events.py`.", "",
             rst_to_markdown(intro.split("Events written")[0]), "",
             "| event | fields and meaning |", "|---|---|"]
    for name, text in rows:
        lines.append(f"| `{name.strip('`')}` | {cell(rst_inline(text))} |")
    lines += ["", "A progress log (`run(progress_log=PATH)`) is a second JSON-lines file: one row per commit "
              "with `time`, `size`, `commit_count`, `step` (the state's `step` value, else the commit count) "
              "and every other number among the state's user values.", ""]
    return "\n".join(lines)


def rst_table(doc: str) -> list[tuple[str, str]]:
    """The rows of the first simple reST table (``=== ===`` rules) in ``doc``: (first column, rest joined)."""
    lines = doc.splitlines()
    rules = [i for i, line in enumerate(lines) if re.fullmatch(r"=+ +=+", line.strip())]
    if len(rules) < 2:
        raise ReferenceError("no reST table found")
    start, end = rules[0], rules[1]
    rows: list[list[str]] = []
    for line in lines[start + 1:end]:
        if line[:1].strip():  # a new row: its name, then the text (a long name runs into the second column)
            head, _, rest = line.partition(" ")
            rows.append([head, rest.strip()])
        elif rows:
            rows[-1][1] += " " + line.strip()
    return [(h, r) for h, r in rows]


# ----------------------------------------------------------------------------------------------- Python API

#: The public API, in reading order: what ``import hvd_elastic`` exports, then the errors it raises.
API = [
    ("hvd_elastic.training.runner", "run"),
    ("hvd_elastic.training.runner", "RunConfig"),
    ("hvd_elastic.training.state", "TrainingState"),
    ("hvd_elastic.training.sampler", "ExactlyOnceSampler"),
    ("hvd_elastic.training.batching", "BatchPolicy"),
    ("hvd_elastic.errors", "HvdElasticError"),
    ("hvd_elastic.training._internal.shared_dir", "SharedDirError"),
    ("hvd_elastic.training.checkpoint", "UnreadableCheckpoints"),
]
#: Members inherited from Horovod's State and documented there (the semantics are Horovod's).
HOROVOD_STATE = {"on_reset", "on_hosts_updated", "register_reset_callbacks"}


def api_page() -> str:
    import hvd_elastic

    exported = set(hvd_elastic._LAZY)
    documented = {name for _, name in API}
    if exported - documented:
        raise ReferenceError(f"hvd_elastic exports {', '.join(sorted(exported - documented))}, which "
                             f"docs/gen_reference.py API does not list")
    undocumented: list[str] = []
    lines = ["# Python API", "",
             "Generated from the docstrings. `import hvd_elastic` exports `run`, `RunConfig`, `TrainingState`, "
             "`ExactlyOnceSampler` and `BatchPolicy` (lazily: importing the package loads neither torch nor "
             "horovod); the errors below come from the modules named, and every error hvd-elastic raises "
             "derives from `HvdElasticError`. How the pieces fit in a training loop: "
             "[writing the training loop](../training-loop.md).", ""]
    for module_name, name in API:
        obj = getattr(importlib.import_module(module_name), name)
        public = f"hvd_elastic.{name}" if name in exported else f"{module_name}.{name}"
        kind = "class " if inspect.isclass(obj) else ""
        lines += [f"## `{public}`", "", "```python", wrapped(f"{kind}{name}", signature(obj)), "```", ""]
        if not inspect.getdoc(obj):
            undocumented.append(public)
        lines += [docstring(obj), ""]
        if inspect.isclass(obj):
            for member, value in members(obj):
                target = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
                doc = inspect.getdoc(target)
                if not doc:
                    undocumented.append(f"{public}.{member}")
                    continue
                label = ("classmethod " if isinstance(value, classmethod) else
                         "staticmethod " if isinstance(value, staticmethod) else
                         "property " if isinstance(value, property) else "")
                sig = "" if isinstance(value, property) else signature(target, drop_self=True)
                lines += [f"### `{name}.{member}`", "", "```python", wrapped(f"{label}{member}", sig), "```", "",
                          docstring(target), ""]
    if undocumented:
        raise ReferenceError(f"public API without a docstring: {', '.join(undocumented)}")
    return "\n".join(lines)


def members(cls) -> list[tuple[str, object]]:
    """Public methods and properties the class itself defines (not inherited), in source order."""
    out = []
    for member, value in vars(cls).items():
        if member.startswith("_") or member in HOROVOD_STATE:
            continue
        if isinstance(value, (property, classmethod, staticmethod)) or inspect.isfunction(value):
            out.append((member, value))
    return out


def signature(obj, drop_self: bool = False) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    if drop_self:
        params = list(sig.parameters.values())
        if params and params[0].name in ("self", "cls"):
            sig = sig.replace(parameters=params[1:])
    return str(sig)


def wrapped(head: str, sig: str, width: int = 100) -> str:
    """``head(sig)`` on one line when it fits, else one parameter per line."""
    if len(head) + len(sig) <= width or not sig.startswith("("):
        return head + sig
    inner, _, tail = sig[1:].rpartition(")")
    params, depth, current = [], 0, ""
    for char in inner:  # split at the commas outside brackets and quotes of annotations
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        if char == "," and depth == 0:
            params.append(current.strip())
            current = ""
        else:
            current += char
    params.append(current.strip())
    return head + "(\n" + "".join(f"    {p},\n" for p in params if p) + ")" + tail


def docstring(obj) -> str:
    return rst_to_markdown(inspect.getdoc(obj) or "")


SECTION_RE = re.compile(r"^(Args|Arguments|Attributes|Returns|Raises|Yields):\s*$")


def rst_to_markdown(doc: str) -> str:
    """The docstring dialect of this package (reST roles, ``::`` blocks, Google sections) as Markdown."""
    out: list[str] = []
    lines = doc.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        # A reST heading: a line underlined with - or =.
        if i + 1 < len(lines) and line.strip() and re.fullmatch(r"[-=~]{3,}", lines[i + 1].strip()) \
                and len(lines[i + 1].strip()) >= len(line.strip()):
            out += [f"#### {rst_inline(line.strip())}", ""]
            i += 2
            continue
        # A literal block: a paragraph ending in ``::``, then an indented block.
        if line.rstrip().endswith("::"):
            text = line.rstrip()[:-1] if not line.strip() == "::" else ""
            text = text.rstrip(":") + ":" if text.rstrip().endswith(":") else text
            if text.strip():
                out.append(rst_inline(text))
            i += 1
            block: list[str] = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
                block.append(lines[i])
                i += 1
            out += ["", "```python", textwrap.dedent("\n".join(block)).strip("\n"), "```", ""]
            continue
        # A Google-style section: a bullet per entry.
        match = SECTION_RE.match(line)
        if match:
            out += ["", f"**{match.group(1)}:**", ""]
            i += 1
            items: list[str] = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith(" ")):
                entry = lines[i]
                head = re.match(r"^ {4}(\*{0,2}[\w, *]+?)( \([^)]*\))?: (.*)$", entry)
                if head and not entry.startswith("     "):
                    items.append(f"- `{head.group(1)}`{head.group(2) or ''}: {head.group(3)}")
                elif entry.strip() and items:
                    items[-1] += " " + entry.strip()
                elif entry.strip():
                    items.append(f"- {entry.strip()}")
                i += 1
            out += [rst_inline(item) for item in items] + [""]
            continue
        # A simple reST table: a preformatted block.
        if re.fullmatch(r"=+( +=+)+", line.strip()):
            block = [line]
            i += 1
            rules = 1
            while i < len(lines) and rules < 3:
                block.append(lines[i])
                rules += bool(re.fullmatch(r"=+( +=+)+", lines[i].strip()))
                i += 1
            out += ["", "```text", *block, "```", ""]
            continue
        # An indented paragraph (a definition's body): as a plain paragraph.
        if line.startswith("    ") and line.strip() and not line.lstrip().startswith(("* ", "- ")):
            out.append(rst_inline(line.strip()))
            i += 1
            continue
        out.append(rst_inline(line))
        i += 1
    text = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def rst_inline(text: str) -> str:
    """``code`` -> `code`; :role:`~a.b.C` -> `C`; :role:`a.b` -> `a.b`; ``<`` shown outside code."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", lambda m: "`" + (m.group(1).split(".")[-1] if m.group(0).count("~")
                                                           else m.group(1)) + "`", text)
    text = re.sub(r"``([^`]+)``", r"`\1`", text)
    text = text.replace("\\\\", "\\")
    # A bare "* " bullet is Markdown already; an asterisk inside prose must not start emphasis.
    parts = re.split(r"(`[^`]*`)", text)
    parts = [p if p.startswith("`") else re.sub(r"(?<=\S)\*(?=\S)", r"\\*", p) for p in parts]
    return escape_angles("".join(parts))


# ----------------------------------------------------------------------------------------------- the contract

def discovery_page() -> str:
    """discovery/README.md, the discovery contract, as a reference page (its title one level down)."""
    text = (REPO / "discovery" / "README.md").read_text()
    return text.replace("# Consul host discovery for horovodrun", "# Discovery contract", 1)


# ----------------------------------------------------------------------------------------------- all of it

@contextlib.contextmanager
def clean_environment() -> Iterator[None]:
    """No ``HVD_ELASTIC_*``/``CONSUL_*`` variable and a fixed width while inside; the environment restored after."""
    saved = dict(os.environ)
    scrubbed_environment()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


#: Every generated page, by its path under docs/ (mkdocs.yml's nav names each).
PAGES: dict[str, Callable[[], str]] = {
    "reference/cli.md": cli_page,
    "reference/api.md": api_page,
    "reference/environment.md": environment_page,
    "reference/metrics.md": metrics_page,
    "reference/events.md": events_page,
    "reference/exit-codes.md": exit_codes_page,
    "reference/discovery.md": discovery_page,
}


def pages() -> dict[str, str]:
    """{path under docs/: Markdown} of every generated page; raises ReferenceError when code and tables differ."""
    with clean_environment():
        return {path: make() for path, make in PAGES.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder to write the pages into")
    args = parser.parse_args(argv)
    try:
        generated = pages()
    except ReferenceError as exc:
        print(f"gen_reference: {exc}", file=sys.stderr)
        return 1
    for path, text in generated.items():
        target = args.out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print(target)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
