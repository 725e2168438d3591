"""Test-session database selection: ``SQLQUEUE_TEST_DB=sqlite`` (default), ``postgres``, ``tds``
(Babelfish, see tests/babelfish.py) or ``mssql`` (a real SQL Server, see tests/mssql_env.py).

Loaded as a pytest plugin (``-p tests.sessiondb`` in pyproject's addopts) so that it runs before
pytest-django imports the settings: a conftest.py would run too late.

For PostgreSQL, a throwaway cluster is started on loopback (as the ``postgres`` OS user when run as
root) before Django reads its settings, unless ``SQLQUEUE_DATABASE_URL`` already points at a server.
The cluster object is available to tests through the ``pg_cluster`` fixture (restart tests use it).
"""

from __future__ import annotations

import atexit
import os
import tempfile

_CLUSTER = None
_TEST_DB = os.environ.get("SQLQUEUE_TEST_DB", "sqlite")

if _TEST_DB == "postgres" and not os.environ.get("SQLQUEUE_DATABASE_URL"):
    from tests.pgcluster import PgCluster

    _CLUSTER = PgCluster().start()
    atexit.register(_CLUSTER.destroy)
    # SQLQUEUE_PG_OPTIONS: Django backend options for the session, as a URL query (testproject/settings.py),
    # e.g. "server_side_binding=true"
    _options = os.environ.get("SQLQUEUE_PG_OPTIONS", "")
    os.environ["SQLQUEUE_DATABASE_URL"] = _CLUSTER.url + (f"?{_options}" if _options else "")
elif _TEST_DB == "sqlite" and not os.environ.get("SQLQUEUE_DATABASE_URL"):
    # A file database (threads and worker processes need to share it), in a fresh temp dir.
    _tmp = tempfile.mkdtemp(prefix="sqlqueue-test-")
    import shutil

    atexit.register(shutil.rmtree, _tmp, True)
    os.environ["SQLQUEUE_DATABASE_URL"] = f"sqlite:///{_tmp}/db.sqlite3"
    os.environ["SQLQUEUE_SQLITE_TEST_NAME"] = f"{_tmp}/test.sqlite3"
elif _TEST_DB == "mssql" and not os.environ.get("SQLQUEUE_DATABASE_URL"):
    from tests.mssql_env import mssql_url

    url = mssql_url()
    if url is None:
        raise SystemExit("SQLQUEUE_TEST_DB=mssql needs SQLQUEUE_MSSQL_HOST, _PORT, _USER, _PASSWORD and _NAME")
    os.environ["SQLQUEUE_DATABASE_URL"] = url
elif _TEST_DB == "tds":
    # Babelfish (a TDS endpoint that runs T-SQL, not SQL Server): the SQL Server code path end to end,
    # one claimer at a time. Tests that need locking semantics skip themselves (conftest: needs_locking).
    from tests import babelfish

    if not os.environ.get("SQLQUEUE_DATABASE_URL"):
        if babelfish.kit() is None:
            raise SystemExit("SQLQUEUE_TEST_DB=tds needs the Babelfish kit (../shared/babelfish)")
        os.environ["SQLQUEUE_DATABASE_URL"] = babelfish.create_database(babelfish.start(), "sqlqueue")
    for _key, _value in babelfish.ENV.items():
        os.environ.setdefault(_key, _value)
    # A test database of this session's own: two sessions on one endpoint never drop each other's.
    os.environ.setdefault("SQLQUEUE_MSSQL_TEST_NAME", f"test_sqlqueue_{os.getpid()}")
    # No driver-side connection pool in this session (mssql-python pools by default): a connection the
    # harness closes must really close. Pooled, the "fresh" connection conftest opens once the test
    # database exists could be the very one that created it, which keeps Babelfish's name resolution
    # of the database it first logged in to (its foreign key checks then look for
    # '<db>_<db>_dbo.<table>'). It showed only in a session that had opened more connections first
    # (the whole suite), never in one of a few files.
    import mssql_python

    mssql_python.pooling(enabled=False)
elif _TEST_DB not in ("sqlite", "postgres", "mssql"):
    raise SystemExit(f"SQLQUEUE_TEST_DB must be sqlite, postgres, mssql or tds, not {_TEST_DB!r}")


def get_cluster():
    """The PgCluster this session started, or None."""
    return _CLUSTER
