"""The named SQL statements and the code around them do not drift apart.

- every status literal a statement compares or sets belongs to the status enum of a
  table the statement names;
- every named statement is used somewhere outside its own definition.

No database: the statements are read as text.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path
from types import ModuleType

import pytest

from agents_app.models import EmbeddingJobStatus, MessageStatus
from task_queue.models import DeliveryStatus, TaskStatus

REPO = Path(__file__).resolve().parent.parent
APPS = ["task_queue", "agents_app", "workflows", "automechanica"]

STATUS_ENUMS = {
    "tasks": TaskStatus,
    "task_counts": TaskStatus,  # the running totals of tasks by status
    "task_finish_counts": TaskStatus,  # and of the tasks finished lately
    "embedding_jobs": EmbeddingJobStatus,
    "agent_messages": MessageStatus,
    "agent_publication_deliveries": MessageStatus,
    "alert_deliveries": DeliveryStatus,
}

# `status = 'x'`, `t.status <> 'x'`; `status IN ('a', 'b')`; `status = CASE ... END`;
# `CASE status WHEN 'x'`. (`to_status` and `from_status` are other columns.)
COMPARED = re.compile(r"\b(?:\w+\.)?status\s*(?:=|<>|!=)\s*'(\w+)'")
LISTED = re.compile(r"\b(?:\w+\.)?status\s+(?:NOT\s+)?IN\s*\(([^)]*)\)", re.IGNORECASE)
CASE_SET = re.compile(r"\bstatus\s*=\s*CASE\b(.*?)\bEND\b", re.DOTALL)
CASE_ON = re.compile(r"\bCASE\s+(?:\w+\.)?status\s+WHEN\s+'(\w+)'")
TABLES = re.compile(r"\b(?:FROM|UPDATE|INTO|JOIN)\s+(\w+)", re.IGNORECASE)


def sql_modules() -> list[ModuleType]:
    modules = [importlib.import_module("task_queue.bench.sql")]
    for package in ("task_queue.sql", "agents_app.sql"):
        root = importlib.import_module(package)
        modules += [
            importlib.import_module(f"{package}.{info.name}")
            for info in pkgutil.iter_modules(root.__path__)
        ]
    return modules


def named_statements() -> list[tuple[ModuleType, str, str]]:
    """(module, name, text) of every module-level upper-case string constant that
    reads as SQL."""
    found = []
    for module in sql_modules():
        for name, value in vars(module).items():
            if (
                name.isupper()
                and isinstance(value, str)
                and re.search(r"\b(SELECT|UPDATE|INSERT|DELETE|WITH|ANALYZE|SET)\b", value)
            ):
                found.append((module, name, value))
    return found


def status_literals(sql: str) -> set[str]:
    literals = set(COMPARED.findall(sql)) | set(CASE_ON.findall(sql))
    for listed in LISTED.findall(sql):
        literals |= set(re.findall(r"'(\w+)'", listed))
    for case in CASE_SET.findall(sql):
        literals |= set(re.findall(r"\b(?:THEN|ELSE)\s+'(\w+)'", case))
    return literals


def test_every_status_literal_belongs_to_a_named_tables_enum():
    checked = 0
    problems = []
    for module, name, sql in named_statements():
        literals = status_literals(sql)
        if not literals:
            continue
        enums = {STATUS_ENUMS[t] for t in TABLES.findall(sql) if t in STATUS_ENUMS}
        allowed = {value for enum in enums for value in enum.values}
        for literal in sorted(literals - allowed):
            problems.append(f"{module.__name__}.{name}: status {literal!r} not in {enums}")
        checked += len(literals)
    assert not problems, "\n".join(problems)
    assert checked > 40  # the patterns still find the statements' statuses


def test_the_check_catches_a_status_from_another_table():
    sql = "UPDATE tasks SET status = 'delivered' WHERE status IN ('pending', 'acked')"
    assert status_literals(sql) == {"delivered", "pending", "acked"}
    assert status_literals(sql) - set(TaskStatus.values) == {"delivered", "acked"}


def _names_used(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            used.add(node.id)
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            used |= {alias.name for alias in node.names}
    return used


@pytest.fixture(scope="module")
def names_used_in_code() -> set[str]:
    used: set[str] = set()
    for app in APPS:
        for path in (REPO / app).rglob("*.py"):
            if "migrations" not in path.parts:
                used |= _names_used(path)
    return used


def test_every_named_statement_is_used(names_used_in_code):
    statements = named_statements()
    unused = [f"{m.__name__}.{name}" for m, name, _ in statements if name not in names_used_in_code]
    assert not unused, f"named statements nothing runs: {unused}"
    assert len(statements) > 60  # every module was read
