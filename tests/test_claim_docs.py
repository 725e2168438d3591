"""docs/claim-sql.md shows the statements the code sends (issue 19).

Each vendor's claim is run through its dialect, as the manager runs it (``write_transaction``, then
``complete_and_claim``), against a cursor that records what it is sent: the dialects render over real
Django backends (PostgreSQL, SQLite, mssql-django) that never connect, so every stage checks all three.
The request is the one the page names: a batch of 10 with a queue filter (``-q emails``), stuck jobs
included. The page's ```sql blocks are then matched against those statements after this normalisation:

* the doc's SQL comments (``-- ...`` to the end of the line) are dropped;
* whitespace, both sides: every run of it becomes one space, none after ``(`` or before ``)``, none at
  the ends, and a final ``;`` is dropped;
* SQLite's statements are shown as Django's sqlite3 backend hands them to the driver (``%s`` -> ``?``,
  ``%%`` -> ``%``); statements sent one after another are joined with ``"; "``;
* in the doc, ``...`` stands for any text (an elision), and ``<name>`` for any text that is the same
  wherever the same name appears in one block; two names are checked against the code as well:
  ``<job columns>`` (the returned columns in ``JOB_COLUMNS`` order, all with the same table prefix or
  none) and ``<common filters>`` (the filters every candidate branch shares: the text must be what the
  block shows in full in its first branch).

Everything else in a block must be the code's text, in order, from its start to its end, so a changed
word on either side fails. How much of each statement the doc shows literally is asserted too, so the
page cannot pass by eliding everything.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from django_sqlqueue.dialects import JOB_COLUMNS, ClaimRequest, Dialect

PAGE = Path(__file__).resolve().parent.parent / "docs" / "claim-sql.md"
#: "The statements below are rendered by the code for a batch of 10 with a queue filter (`-q emails`)".
REQUEST = ClaimRequest("host:1/0", 10, queues=("emails",))

_SETTINGS = {"NAME": "render", "USER": "", "PASSWORD": "", "HOST": "", "PORT": "", "OPTIONS": {},
             "TIME_ZONE": None, "CONN_MAX_AGE": 0, "CONN_HEALTH_CHECKS": False, "AUTOCOMMIT": True,
             "ATOMIC_REQUESTS": False, "TEST": {}}


def _dialect(vendor: str) -> Dialect:
    """The vendor's dialect over its real Django backend, never connected (rendering only)."""
    if vendor == "postgresql":
        from django.db.backends.postgresql.base import DatabaseWrapper

        from django_sqlqueue.dialects.postgresql import PostgresDialect as cls
        settings: dict[str, Any] = {**_SETTINGS, "ENGINE": "django.db.backends.postgresql"}
    elif vendor == "sqlite":
        from django.db.backends.sqlite3.base import DatabaseWrapper

        from django_sqlqueue.dialects.sqlite import SqliteDialect as cls
        settings = {**_SETTINGS, "ENGINE": "django.db.backends.sqlite3"}
    else:
        from mssql.base import DatabaseWrapper

        from django_sqlqueue.dialects.mssql import MssqlDialect as cls
        settings = {**_SETTINGS, "ENGINE": "mssql", "OPTIONS": {"python_driver": "mssql_python"}}
    wrapper = DatabaseWrapper(settings, f"render-{vendor}")
    # A claim alone, outside any atomic(): what a worker's idle slot sends (asking a real connection
    # would connect).
    wrapper.get_autocommit = lambda: True  # type: ignore[method-assign]
    return cls(wrapper)


class Recorder:
    """A cursor that records the statements it is sent and returns one claimed row."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def execute(self, sql: str, params: Any = None) -> None:
        self.sent.append(sql)

    def executemany(self, sql: str, param_list: Any) -> None:
        self.sent.append(sql)  # one statement, run once per claimed row

    def setinputsizes(self, sizes: Any) -> None:
        pass

    def fetchall(self) -> list[tuple[Any, ...]]:
        return [tuple(1 for _ in JOB_COLUMNS)]

    def nextset(self) -> None:
        pass


def sent_claim(vendor: str, req: ClaimRequest = REQUEST) -> tuple[str, Dialect]:
    """The claim as the manager sends it (see ``JobManager.complete_and_claim``), normalised."""
    dialect = _dialect(vendor)
    cursor = Recorder()
    with dialect.write_transaction(cursor, 0, True):  # type: ignore[arg-type]
        dialect.complete_and_claim(cursor, [], req)  # type: ignore[arg-type]
    sent = cursor.sent
    if vendor == "sqlite":
        from django.db.backends.sqlite3.base import SQLiteCursorWrapper

        sent = [SQLiteCursorWrapper.convert_query(None, s) for s in sent]  # type: ignore[arg-type]
    return "; ".join(normalise(s) for s in sent), dialect


def normalise(sql: str) -> str:
    sql = re.sub(r"\s+", " ", sql).strip()
    sql = re.sub(r"\(\s+", "(", sql)
    sql = re.sub(r"\s+\)", ")", sql)
    return sql.removesuffix(";").rstrip()


# ----- the page -------------------------------------------------------------------------------------
SECTION = re.compile(r"^## (.+)$", re.M)
SQL_BLOCK = re.compile(r"^```sql\n(.*?)^```", re.S | re.M)
#: An elision (``...``) or a named placeholder (``<job columns>``); ``< now()`` and ``<>`` are SQL.
PLACEHOLDER = re.compile(r"\.\.\.|<([A-Za-z][^<>]*)>")


def sql_blocks() -> dict[str, list[str]]:
    """The ```sql blocks of each ``##`` section (the part before the first section under "")."""
    text = PAGE.read_text(encoding="utf-8")
    starts = [(0, "")] + [(m.start(), m.group(1).strip()) for m in SECTION.finditer(text)]
    out: dict[str, list[str]] = {}
    for (start, title), (end, _) in zip(starts, [*starts[1:], (len(text), "")], strict=True):
        out[title] = SQL_BLOCK.findall(text, start, end)
    return out


def blocks_of(prefix: str) -> list[str]:
    """The ```sql blocks of the section whose title starts with ``prefix`` ("" is the page's head)."""
    [found] = [b for title, b in sql_blocks().items() if title.startswith(prefix) and bool(title) == bool(prefix)]
    return found


@dataclass
class DocPattern:
    """A doc block as a regular expression over the normalised statement."""

    regex: re.Pattern[str]
    pieces: list[tuple[str, str]]  # (regex, the doc's literal text or "" for a placeholder), in order
    groups: dict[str, str]  # placeholder name -> group name

    @property
    def literal_chars(self) -> int:
        return sum(len(text) for _, text in self.pieces)


def doc_pattern(block: str) -> DocPattern:
    text = normalise(re.sub(r"--[^\n]*", "", block))
    pieces: list[tuple[str, str]] = []
    groups: dict[str, str] = {}
    pos = 0
    for m in [*PLACEHOLDER.finditer(text), None]:
        literal = text[pos:m.start() if m else len(text)].strip()
        if literal:
            pieces.append((re.escape(literal), literal))
        if m is None:
            break
        name = m.group(1)
        if name is None:
            pieces.append((r"\s?.*?\s?", ""))
        elif name in groups:
            pieces.append((rf"\s?(?P={groups[name]})\s?", ""))
        else:
            groups[name] = f"g{len(groups)}"
            pieces.append((rf"\s?(?P<{groups[name]}>.+?)\s?", ""))
        pos = m.end()
    return DocPattern(re.compile("".join(p for p, _ in pieces), re.S), pieces, groups)


def match_block(block: str, sent: str, checks: dict[str, Callable[[str], None]] | None = None
                ) -> tuple[re.Match[str], int]:
    """Match a doc block against what the code sent (fail saying where they part); return the match and
    how many characters of the statement the block shows: its literal text and the placeholders checked
    against the code."""
    pattern = doc_pattern(block)
    m = pattern.regex.fullmatch(sent)
    if m is None:
        pytest.fail(_where_they_part(pattern, sent))
    shown = pattern.literal_chars
    for name, group in pattern.groups.items():
        check = (checks or {}).get(name)
        if check is not None:
            check(m.group(group))
            # every occurrence of the name matched the same text
            shown += len(m.group(group)) * sum(1 for p, _ in pattern.pieces if f"<{group}>" in p or f"={group})" in p)
    return m, shown


def _where_they_part(pattern: DocPattern, sent: str) -> str:
    """Where the doc block and the code's statement first differ."""
    for k, (_, literal) in enumerate(pattern.pieces):
        head = "".join(p for p, _ in pattern.pieces[:k + 1])
        if re.compile(head + ".*", re.S).fullmatch(sent):
            continue
        done = re.compile("".join(p for p, _ in pattern.pieces[:k]), re.S).match(sent)
        at = done.end() if done else 0
        if not literal:  # a name used twice
            return f"a <name> used twice in the doc block stands for other text here: {sent[at:at + 200]!r}"
        if k and not pattern.pieces[k - 1][1]:  # after a placeholder: the text is nowhere further on
            return f"docs/claim-sql.md shows {literal[:200]!r}, which the code does not send here:\n  {sent[at:at + 200]!r}"
        i = next((i for i, (a, b) in enumerate(zip(literal, sent[at:], strict=False)) if a != b),
                 min(len(literal), len(sent) - at))
        return (f"docs/claim-sql.md and the code part here:\n"
                f"  doc:  ...{literal[max(0, i - 60):i + 100]!r}\n"
                f"  code: ...{sent[at + max(0, i - 60):at + i + 100]!r}")
    return f"the code's statement goes on after the doc block ends: {sent[-300:]!r}"


def job_columns(dialect: Dialect) -> Callable[[str], None]:
    """``<job columns>``: JOB_COLUMNS in order, each with the same table prefix (or none)."""
    def check(text: str) -> None:
        listed = [c.strip() for c in text.split(",")]
        prefix = listed[0][:len(listed[0]) - len(dialect.n.job_columns[0])]
        assert listed == [prefix + c for c in dialect.n.job_columns], text
    return check


def shown_in(block: str) -> Callable[[str], None]:
    """``<common filters>`` stands for the filters the block shows in full in its first branch."""
    def check(text: str) -> None:
        assert text and text in normalise(block), f"{text!r} is not what the first branch shows"
    return check


# ----- the tests ------------------------------------------------------------------------------------
def test_the_page_has_the_blocks_this_test_reads() -> None:
    """A block added to the page is a block this test must learn to check."""
    counts = {title: len(b) for title, b in sql_blocks().items()}
    assert counts == {"": 1, "PostgreSQL": 1, "SQL Server (mssql-django, vendor `microsoft`)": 2, "SQLite": 1}
    text = PAGE.read_text(encoding="utf-8")
    assert "for a batch of 10 with a queue filter (`-q emails`)" in " ".join(text.split())
    [columns] = re.findall(r"the\s+(\d+)\s+returned\s+columns\s+are\s+abbreviated\s+as\s+`<job columns>`", text)
    assert int(columns) == len(JOB_COLUMNS)


def test_postgresql_claim() -> None:
    sent, dialect = sent_claim("postgresql")
    [block] = blocks_of("PostgreSQL")
    _, shown = match_block(block, sent, {"job columns": job_columns(dialect)})
    assert shown > 0.95 * len(sent)


def test_sql_server_claim_batch() -> None:
    """The batch every write is wrapped in, then the claim's statements inside it."""
    sent, dialect = sent_claim("microsoft")
    wrapper, statements = blocks_of("SQL Server")
    m, shown = match_block(wrapper, sent, {"job columns": job_columns(dialect)})
    inner = m.group(doc_pattern(wrapper).groups["the statements: see below"])
    _, shown_inner = match_block(statements, inner, {"common filters": shown_in(statements)})
    assert shown + shown_inner > 0.7 * len(sent)  # the column lists and the time arithmetic left out


def test_sqlite_claim() -> None:
    sent, dialect = sent_claim("sqlite")
    [block] = blocks_of("SQLite")
    _, shown = match_block(block, sent, {"job columns": job_columns(dialect),
                                         "common filters": shown_in(block)})
    assert shown > 0.95 * len(sent)


def test_claim_indexes() -> None:
    """The indexes the page lists are the models' (as Django renders them, quotes dropped)."""
    from django_sqlqueue.models import Job

    dialect = _dialect("sqlite")
    editor = dialect.connection.schema_editor()
    rendered = {i.name: normalise(str(i.create_sql(Job, editor)).replace('"', "")) for i in Job._meta.indexes}
    [block] = blocks_of("")
    shown = [normalise(s) for s in re.sub(r"--[^\n]*", "", block).split(";") if s.strip()]
    assert shown, block
    for statement in shown:
        name = statement.split()[2]
        assert statement == rendered.get(name), f"{statement!r}: the model says {rendered.get(name)!r}"


@pytest.mark.parametrize("vendor", ["postgresql", "microsoft", "sqlite"])
def test_a_changed_word_is_caught(vendor: str) -> None:
    """The matching bites both ways: a word changed in what the code sends, or in the doc, fails."""
    sent, _ = sent_claim(vendor)
    title = {"postgresql": "PostgreSQL", "microsoft": "SQL Server", "sqlite": "SQLite"}[vendor]
    block = blocks_of(title)[-1]
    if vendor == "microsoft":
        sent = sent[sent.index("UPDATE j SET"):sent.index("; IF @sqlqueue_own = 1 COMMIT")]
    assert doc_pattern(block).regex.fullmatch(sent)
    for word, other in (("DESC", "ASC"), ("priority", "priorty"), ("UPDATE", "UPSERT")):
        assert word in sent and word in block
        assert not doc_pattern(block).regex.fullmatch(sent.replace(word, other)), f"code: {word}"
        assert not doc_pattern(block.replace(word, other, 1)).regex.fullmatch(sent), f"doc: {word}"
