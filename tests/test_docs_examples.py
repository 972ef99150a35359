"""Every ``manage.py`` example in README.md and docs/*.md runs and does what its page says.

An example is a ``manage.py`` command line in a fenced ``sh`` block. A page's examples
build on each other as a reader follows them, so each runs on the emptied test
database after the page's earlier examples that write have run again; it must exit
with status 0 and leave the effect its check (tests/docs_checks.py) looks for.
``<!-- example: KIND, ... -->`` on the line right before a block says what its
commands need (docs/testing.md): ``until-stopped`` (run as a process, given work,
then stopped with SIGTERM), ``needs-server`` (a server at http://127.0.0.1:8000 and
``$TOKEN``), ``needs-broker`` (NATS or RabbitMQ) and ``heavy`` (run with small
figures). An unmarked command that cannot run as written, or one without a check,
fails.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import io
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.core.management import call_command, get_commands, load_command_class
from django.db import connection

from automechanica.api.tokens import create_token
from tests.docs_checks import CHECKS, Check, Run
from tests.support.database import database_url
from tests.support.processes import REPO, manage_env
from tests.support.server import LiveServer
from tests.support.waiting import wait_for

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_BLOCKS = {"sh", "bash", "shell", "console"}
KINDS = {"until-stopped", "needs-server", "needs-broker", "heavy"}
MARKER_START, MARKER_END = "<!-- example:", "-->"
# Environment assignments that pick a database: the test database replaces them.
DATABASE_VARIABLES = {"DATABASE_URL", "AUTOMECHANICA_DB_NAME"}
# Commands that run until stopped unless given one of these options.
UNBOUNDED = {
    "up": (),
    "runworker": ("--burst", "--max-tasks"),
    "runmaintenance": ("--once",),
    "runembedder": ("--once",),
    "relay_events": ("--once",),
    "runorchestrator": ("--once",),
}
HEAVY_BOUNDS = {
    "queue_bench": ["--tasks", "200", "--workers", "1", "--latency-samples", "5"],
    "seed_tasks": ["--count", "2000"],
    "dashboard_bench": ["--repeat", "2"],
    "enqueue_bench": ["--requests", "2", "--batch", "10", "--count", "20", "--repeat", "1"],
}
# Options a heavy example is bounded in only where it gives them (--rounds needs --remote).
HEAVY_OPTION_BOUNDS = {"queue_bench": {"--rounds": "2"}}
# Commands that leave nothing later examples build on: not replayed (page_so_far).
LEAVE_NOTHING = {
    "queue_stats", "embedded_db", "export_events", "dashboard_bench", "migrate", "queue_bench",
    "enqueue_bench",
}  # fmt: skip
SERVER_URL = "http://127.0.0.1:8000"
BROKERS = {
    "nats": ("nats", 4222, "nats_namespace"),
    "amqp": ("aio_pika", 5672, "rabbitmq_namespace"),
}


@dataclass(frozen=True)
class Example:
    page: str
    line: int
    env: tuple[tuple[str, str], ...]
    argv: tuple[str, ...]
    kinds: frozenset[str]

    def __str__(self) -> str:
        return f"{self.page}:{self.line} {' '.join(self.argv)}"[:90]


def parse_command(text: str) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]] | None:
    """(env assignments, the arguments after ``manage.py``) of a shell line, or None."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    tokens = list(lexer)
    if "manage.py" not in tokens:
        return None
    start = tokens.index("manage.py")
    argv = []
    for token in tokens[start + 1 :]:
        if set(token) <= set("|&;()<>"):
            break  # a pipe or a redirection: the example is the command before it
        argv.append(token)
    env = []
    for token in tokens[:start]:
        name, equals, value = token.partition("=")
        if not (equals and name.isidentifier()):
            break
        env.append((name, value))
    return tuple(env), tuple(argv)


def marker_kinds(line: str) -> frozenset[str]:
    line = line.strip()
    if not (line.startswith(MARKER_START) and line.endswith(MARKER_END)):
        return frozenset()
    kinds = line[len(MARKER_START) : -len(MARKER_END)].split(",")
    return frozenset(kind.strip() for kind in kinds)


def page_examples(path: Path, name: str) -> list[Example]:
    """The page's examples in order; a marker covers the block right after it."""
    found: list[Example] = []
    lines = path.read_text().splitlines()
    block, kinds, pending, start = None, frozenset[str](), "", 0
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            opening = block is None
            block = line[3:].strip() if opening else None
            kinds = marker_kinds(lines[number - 2]) if opening and number > 1 else frozenset()
            continue
        if block not in SHELL_BLOCKS:
            continue
        start = start if pending else number
        pending += line.removesuffix("\\")
        if line.endswith("\\"):
            continue
        if parsed := parse_command(pending):
            found.append(Example(name, start, *parsed, kinds))
        pending = ""
    return found


EXAMPLES = [ex for page in PAGES for ex in page_examples(page, str(page.relative_to(REPO)))]


def problems(example: Example) -> list[str]:
    """Why the example cannot run as written, unmarked (empty: it can)."""
    command, args = example.argv[0] if example.argv else "", set(example.argv)
    found = [f"unknown kind {kind!r}" for kind in sorted(example.kinds - KINDS)]
    if command not in get_commands():
        found.append(f"{command!r} is not a manage.py command")
    if command not in CHECKS:
        found.append(f"no check for {command!r} in tests/docs_checks.py: add one")
    unbounded = command in UNBOUNDED and not args & set(UNBOUNDED[command])
    if (unbounded or "--follow" in args) and "until-stopped" not in example.kinds:
        found.append("runs until stopped: mark it until-stopped")
    if "heavy" in example.kinds and command not in HEAVY_BOUNDS:
        found.append(f"marked heavy, but no small figures for {command!r} here")
    uses_server = any(SERVER_URL in a or "$TOKEN" in a for a in args | {v for _, v in example.env})
    if uses_server and "needs-server" not in example.kinds:
        found.append("talks to a server: mark it needs-server")
    if command == "relay_events" and "needs-broker" not in example.kinds:
        found.append("needs a broker: mark it needs-broker")
    return found


def options(argv: list[str]) -> dict[str, Any]:
    """The example's options, parsed by the command's own parser."""
    command = load_command_class(get_commands()[argv[0]], argv[0])
    return vars(command.create_parser("manage.py", argv[0]).parse_args(argv[1:]))


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A directory that reads like the repository (``@workflows/…`` resolves) but takes
    what examples write (``var/events.jsonl``) away from it."""
    root = tmp_path_factory.mktemp("docs-examples")
    for entry in REPO.iterdir():
        if entry.name not in ("var", ".git"):
            (root / entry.name).symlink_to(entry)
    (root / "var").mkdir()
    return root


@pytest.fixture(scope="module")
def docs_server(django_db_setup, tmp_path_factory) -> Iterator[LiveServer]:
    server = LiveServer(manage_env(), tmp_path_factory.mktemp("server") / "daphne.log", REPO)
    try:
        wait_for(server.ready, timeout=60, what="daphne to answer")
        yield server
    finally:
        server.stop()


# ------------------------------------------------------------------ running


def run_in_process(
    argv: list[str], env: dict[str, str], workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> Run:
    """Through call_command on the test database's connection, from ``workdir``."""
    out, raw = io.StringIO(), io.BytesIO()
    stdout = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)  # sys.stdout.buffer
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    with monkeypatch.context() as patch, contextlib.redirect_stdout(stdout):
        for name, value in env.items():
            patch.setenv(name, value)
        patch.setenv("DATABASE_URL", database_url())  # for the processes it starts
        patch.chdir(workdir)
        try:
            call_command(*argv, stdout=out, stderr=io.StringIO())
        finally:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
            gc.collect()  # closes what the command's threads left open (a LISTEN connection)
    return Run(out.getvalue() + raw.getvalue().decode(), workdir)


def run_as_process(argv: list[str], env: dict[str, str], workdir: Path) -> Run:
    """To its end, in a process of its own (a relay keeps connections in its threads)."""
    done = subprocess.run(
        [sys.executable, "manage.py", *argv],
        cwd=workdir,
        env=manage_env() | env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"exit status {done.returncode}:\n{done.stderr}"
    return Run(done.stdout, workdir)


def run_until_stopped(
    argv: list[str], env: dict[str, str], workdir: Path, check: Check, opts: dict, state: Any
) -> None:
    """Start it, give it work, wait for the effect, then SIGTERM: it must exit with 0."""
    log_path = workdir / f"{argv[0]}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "manage.py", *argv],
            cwd=workdir,
            env=manage_env() | env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    run = Run("", workdir, process.pid)

    def done() -> bool:
        run.output = log_path.read_text(errors="replace")
        assert process.poll() is None, f"exited with {process.returncode}:\n{run.output}"
        try:
            check.verify(opts, state, run)
        except AssertionError:
            return False
        return True

    try:
        check.poke(opts)
        try:
            wait_for(done, timeout=60, what=f"the effect of {' '.join(argv)}")
        except AssertionError:
            check.verify(opts, state, run)  # the check's own words
            raise
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, log_path.read_text(errors="replace")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def broker_namespace(argv: list[str], request: pytest.FixtureRequest) -> str:
    """Skip without the broker or its client; otherwise a namespace cleaned up after."""
    url = argv[argv.index("--to" if "--to" in argv else "--dispatch") + 1]
    module, port, fixture = BROKERS[urlsplit(url).scheme]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"the {module} client is not installed (uv sync --extra nats --extra amqp)")
    with socket.socket() as probe:
        probe.settimeout(1)
        if probe.connect_ex((urlsplit(url).hostname or "127.0.0.1", port)) != 0:
            pytest.skip(f"no broker listening at {url}")
    return request.getfixturevalue(fixture)


@pytest.fixture
def page_so_far(example: Example, transactional_db, workdir: Path, monkeypatch) -> None:
    """A page's examples build on each other (enqueue, then run): on the emptied test
    database, replay the ones before this example that write, unchecked."""
    assert connection.settings_dict["NAME"].startswith("test_"), "not the test database"
    for earlier in EXAMPLES[: EXAMPLES.index(example)]:
        if earlier.page == example.page and replayed(earlier):
            run_in_process(*bounded(earlier), workdir, monkeypatch)


def replayed(example: Example) -> bool:
    runs_apart = example.kinds & {"until-stopped", "needs-server", "needs-broker"}
    return not (runs_apart or problems(example) or example.argv[0] in LEAVE_NOTHING)


def bounded(example: Example) -> tuple[list[str], dict[str, str]]:
    """The arguments with the small figures of a heavy example, and the environment
    without the assignments that pick a database."""
    heavy: list[str] = []
    if "heavy" in example.kinds:
        heavy = [*HEAVY_BOUNDS.get(example.argv[0], [])]
        options = HEAVY_OPTION_BOUNDS.get(example.argv[0], {})
        given = {arg.split("=")[0] for arg in example.argv}  # --rounds 5 or --rounds=5
        heavy += [part for option in options if option in given
                  for part in (option, options[option])]  # fmt: skip
    env = {name: value for name, value in example.env if name not in DATABASE_VARIABLES}
    return [*example.argv, *heavy], env


# ------------------------------------------------------------------ the tests


def _param(example: Example) -> Any:
    starts_processes = example.kinds & {"until-stopped", "needs-server", "needs-broker"} or (
        example.argv[:1] == ("queue_bench",)
    )
    return pytest.param(example, id=str(example), marks=[pytest.mark.slow] * bool(starts_processes))


@pytest.mark.parametrize("example", [_param(example) for example in EXAMPLES])
def test_example_does_what_its_page_says(
    example: Example, page_so_far, workdir: Path, monkeypatch, request
) -> None:
    assert not problems(example), f"{example}: {'; '.join(problems(example))} (docs/testing.md)"
    argv, env = bounded(example)
    if "needs-server" in example.kinds:
        server = request.getfixturevalue("docs_server")
        argv = [arg.replace(SERVER_URL, server.url) for arg in argv]
        secret = create_token("docs example", "write")[1]
        env = {name: value.replace("$TOKEN", secret) for name, value in env.items()}
    if "needs-broker" in example.kinds:
        argv += ["--namespace", broker_namespace(argv, request)]
    unfilled = [arg for arg in [*argv, *env.values()] if "$" in arg]
    assert not unfilled, f"{example}: shell variables the test cannot fill: {unfilled}"
    check, opts = CHECKS[argv[0]], options(argv)
    state = check.setup(opts)
    if "until-stopped" in example.kinds:
        run_until_stopped(argv, env, workdir, check, opts, state)
    elif "needs-broker" in example.kinds:
        check.verify(opts, state, run_as_process(argv, env, workdir))
    else:
        check.verify(opts, state, run_in_process(argv, env, workdir, monkeypatch))


def test_the_pages_have_examples_of_every_kind() -> None:
    assert len(EXAMPLES) >= 20
    assert set().union(*(example.kinds for example in EXAMPLES)) == KINDS
    fitment = [e for e in EXAMPLES if e.argv[:2] == ("enqueue", "FitmentAgent")]
    assert fitment and fitment[0].page == "docs/queue.md"


def test_a_marker_covers_the_next_block_only_and_lines_continue(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- example: until-stopped -->\n```sh\nuv run python manage.py runworker A \\\n"
        "    --concurrency 2   # a comment\n```\n\n```sh\n"
        "X=1 uv run python manage.py export_events --since 3 | jq .kind\n```\n"
        "```python\nmanage.py enqueue not-shell\n```\n"
    )
    first, second = page_examples(page, "page.md")
    assert (first.line, first.argv, first.kinds) == (
        3, ("runworker", "A", "--concurrency", "2"), {"until-stopped"},
    )  # fmt: skip
    assert (second.env, second.argv, second.kinds) == (
        (("X", "1"),), ("export_events", "--since", "3"), frozenset(),
    )  # fmt: skip


def test_an_example_that_cannot_run_as_written_must_be_marked() -> None:
    def example(text: str, *kinds: str) -> Example:
        env, argv = parse_command(text) or ((), ())
        return Example("page.md", 1, env, argv, frozenset(kinds))

    assert problems(example("manage.py runworker FitmentAgent")) == [
        "runs until stopped: mark it until-stopped"
    ]
    assert not problems(example("manage.py runworker FitmentAgent --burst"))
    assert problems(example("manage.py export_events --follow"))
    assert problems(example(f"manage.py runorchestrator --api {SERVER_URL} --once"))
    assert problems(example("manage.py relay_events --to nats://x --once"))
    assert problems(example("manage.py nope"))
    assert problems(example("manage.py queue_stats", "fast"))
