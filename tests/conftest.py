"""Shared fixtures: job types, worker processes' environment, the PostgreSQL cluster handle."""

from __future__ import annotations

import os

import pytest
from django.db import connection

from django_sqlqueue import jobtypes
from django_sqlqueue.models import JobType

VENDOR_DB = os.environ.get("SQLQUEUE_TEST_DB", "sqlite")


@pytest.fixture
def pg_cluster():
    """The throwaway PostgreSQL cluster (skips on other databases)."""
    from tests.sessiondb import get_cluster

    cluster = get_cluster()
    if cluster is None:
        pytest.skip("needs the test session's own PostgreSQL cluster (SQLQUEUE_TEST_DB=postgres)")
    return cluster


@pytest.fixture(autouse=True)
def _fresh_type_cache():
    jobtypes.clear_cache()
    yield
    jobtypes.clear_cache()


@pytest.fixture
def noop_type(db):
    return JobType.objects.create(name="Noop")


@pytest.fixture
def make_type(db):
    def make(name: str, **kwargs):
        return JobType.objects.create(name=name, **kwargs)

    return make


def is_postgres() -> bool:
    return connection.vendor == "postgresql"
