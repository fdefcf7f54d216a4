"""Database URLs: one host or several (a highly available PostgreSQL), as SQLAlchemy and raw asyncpg take them."""

from __future__ import annotations

import pytest
from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect
from sqlalchemy.engine import make_url

from mainspring.store.urls import hosts_of, normalize_url, plain_dsn

MULTI = "postgresql://app:s%40cret@db1.internal:5433,db2.internal/mainspring?target_session_attrs=read-write"


def test_a_single_host_url_is_unchanged_but_for_the_driver() -> None:
    assert normalize_url("postgresql://app@db:5433/ms") == "postgresql+asyncpg://app@db:5433/ms"
    assert plain_dsn(normalize_url("postgresql://app:pw@db/ms")) == "postgresql://app:pw@db/ms"
    assert normalize_url("sqlite:///tmp/x.db") == "sqlite+pysqlite:///tmp/x.db"


def test_a_multi_host_url_reaches_asyncpg_as_a_host_list_with_its_session_attrs() -> None:
    _args, kwargs = asyncpg_dialect().create_connect_args(make_url(normalize_url(MULTI)))
    assert kwargs["host"] == ["db1.internal", "db2.internal"]
    assert kwargs["port"] == [5433, 5432]  # the default port where none is written
    assert kwargs["target_session_attrs"] == "read-write"
    assert kwargs["user"] == "app"
    assert kwargs["password"] == "s@cret"
    assert kwargs["database"] == "mainspring"


def test_the_listen_connection_gets_the_libpq_multi_host_form() -> None:
    dsn = plain_dsn(normalize_url(MULTI), application_name="mainspring-listen")
    assert dsn == (
        "postgresql://app:s%40cret@db1.internal:5433,db2.internal:5432/mainspring"
        "?target_session_attrs=read-write&application_name=mainspring-listen"
    )


def test_asyncpg_parses_the_listen_dsn_into_every_host_in_order() -> None:
    from asyncpg.connect_utils import _parse_connect_dsn_and_args

    addrs, params = _parse_connect_dsn_and_args(
        dsn=plain_dsn(normalize_url(MULTI)), host=None, port=None, user=None, password=None, passfile=None,
        database=None, ssl=None, service=None, servicefile=None, direct_tls=False, server_settings=None,
        target_session_attrs=None, krbsrvname=None, gsslib=None,
    )
    assert addrs == [("db1.internal", 5433), ("db2.internal", 5432)]
    assert params.target_session_attrs.value == "read-write"
    assert params.password == "s@cret"


def test_hosts_are_listed_in_the_order_they_are_tried() -> None:
    assert hosts_of(MULTI) == ["db1.internal:5433", "db2.internal:5432"]
    assert hosts_of("postgresql://db/ms") == ["db:5432"]
    assert hosts_of("postgresql://u@/ms?host=a:1&host=b:2") == ["a:1", "b:2"]  # SQLAlchemy's own spelling


def test_a_socket_directory_is_not_taken_for_a_host_list() -> None:
    url = normalize_url("postgresql://u@/ms?host=/run/postgresql")
    assert plain_dsn(url) == "postgresql://u@/ms?host=%2Frun%2Fpostgresql"


def test_an_empty_host_in_a_list_is_refused() -> None:
    with pytest.raises(ValueError, match="empty host"):
        normalize_url("postgresql://u@a:1,,b:2/ms")
