"""Pins every framework internal ``app.core.fences`` relies on, and keeps internals inside it.

Each test names the internal and checks the shape the fence uses (signature, dataclass fields,
attribute names, the behaviour where a shape says too little), so a release that changes one
fails here, not in production. ``pyproject.toml`` bounds each library below its next untested
release. uvicorn's fence is ``app.core.http.server``, pinned by ``tests/test_server_protocol.py``.
The last tests scan ``app/`` (and the client) for internals used anywhere else.
"""

from __future__ import annotations

import ast
import dataclasses
import gc
import inspect
from pathlib import Path
from typing import Annotated, Any

import pytest
from fastapi import APIRouter, Body, Cookie, Depends, FastAPI, Form, Header, Query, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Json

from app.core.fences import aiohttp_, fastapi_, starlette_
from tests.conftest import Backend

ROOT = Path(__file__).resolve().parent.parent


def parameters(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


# --- fastapi ------------------------------------------------------------------------------


def test_fastapi_dependant_has_exactly_the_fields_planning_knows() -> None:
    """``app.core.fast.plans`` plans an allow-list of these; a new one must be looked at."""
    from fastapi.dependencies.models import Dependant

    assert dataclasses.is_dataclass(Dependant)
    assert {f.name for f in dataclasses.fields(Dependant)} == fastapi_.DEPENDANT_FIELDS
    assert fastapi_.Dependant is Dependant


def test_fastapi_parameter_helpers_keep_their_signatures() -> None:
    from fastapi.dependencies import utils

    assert parameters(utils._get_param_model) == ["field"]
    assert parameters(utils._is_json_field) == ["field"]
    assert parameters(utils._get_param_aliases) == ["field", "convert_underscores"]
    assert parameters(utils.field_annotation_is_sequence) == ["annotation"]
    assert parameters(utils.get_missing_field_error) == ["loc"]
    assert parameters(utils.request_params_to_args) == ["fields", "received_params"]
    assert fastapi_.request_params_to_args is utils.request_params_to_args


class _Filter(__import__("pydantic").BaseModel):
    a: int = 0


async def _params(
    x_tag: Annotated[str | None, Header()] = None,
    q: Annotated[str, Query(alias="query")] = "",
    many: Annotated[list[int] | None, Query()] = None,
    raw: Annotated[Json[Any], Query()] = "{}",
    session: Annotated[str | None, Cookie()] = None,
) -> None:
    return None


async def _model(f: Annotated[_Filter, Query()]) -> None:
    return None


def test_fastapi_parameter_helpers_answer_as_planning_expects() -> None:
    from fastapi.dependencies.utils import get_dependant

    dependant = get_dependant(path="/p", call=_params)
    fields = {f.name: f for f in [*dependant.query_params, *dependant.header_params, *dependant.cookie_params]}
    assert fastapi_.request_keys(fields["x_tag"]) == ["x-tag"]  # headers: underscores converted
    assert fastapi_.request_keys(fields["q"]) == ["query"]
    assert fastapi_.annotation_is_sequence(fields["many"].field_info.annotation)
    assert not fastapi_.annotation_is_sequence(fields["q"].field_info.annotation)
    assert fastapi_.is_json_field(fields["raw"]) and not fastapi_.is_json_field(fields["q"])
    assert fastapi_.param_model(fields["q"]) is None
    assert fastapi_.param_model(get_dependant(path="/p", call=_model).query_params[0]) is _Filter
    error = fastapi_.missing_field_error(("query", "q"))
    assert error["type"] == "missing" and error["loc"] == ("query", "q")


def test_fastapi_model_field_has_what_a_plan_reads() -> None:
    from fastapi.dependencies.utils import get_dependant

    field = get_dependant(path="/p", call=_params).query_params[0]
    assert {"field_info", "name"} <= {f.name for f in dataclasses.fields(type(field))}
    assert parameters(type(field).validate) == ["self", "value", "values", "loc"]
    assert inspect.signature(type(field).validate).parameters["loc"].kind is inspect.Parameter.KEYWORD_ONLY
    assert isinstance(inspect.getattr_static(type(field), "default"), property)
    info = field.field_info
    assert info.in_.value == "query" and callable(info.is_required) and hasattr(info, "validate_default")
    assert field.validate("v", {}, loc=("query", "q")) == ("v", [])


# --- starlette ----------------------------------------------------------------------------

ROUTE_PATH_CASES = [
    {"path": "/v1/ns/kv/c"},
    {"path": "/v1/ns/kv/c", "root_path": ""},
    {"path": "/gw/v1/ns/kv/c", "root_path": "/gw"},
    {"path": "/gw", "root_path": "/gw"},
    {"path": "/gwx/v1", "root_path": "/gw"},
    {"path": "/v1/ns", "root_path": "/gw"},  # a proxy that already stripped the prefix
]


@pytest.mark.parametrize("scope", ROUTE_PATH_CASES)
def test_starlette_route_path_is_what_starlettes_router_matches(scope: dict[str, str]) -> None:
    from starlette._utils import get_route_path
    from starlette.routing import Match, Route

    assert parameters(get_route_path) == ["scope"]
    ours = starlette_.route_path(scope)
    assert ours == get_route_path(scope)  # type: ignore[arg-type]
    if ours:  # Starlette's own public matching agrees ("" is the mount point itself)
        route = Route(ours, endpoint=lambda request: None)
        assert route.matches({"type": "http", "method": "GET", **scope})[0] is Match.FULL



async def test_starlette_request_json_returns_what_set_parsed_json_handed_over() -> None:
    """FastAPI's handler reads a body model through ``request.json()``; a body parsed by
    ``app.core.http.bodies`` is handed to it there, and the body is not parsed again."""
    from starlette.requests import Request

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"not json", "more_body": False}

    request = Request({"type": "http", "method": "POST", "headers": []}, receive)
    handed = object()
    starlette_.set_parsed_json(request, handed)
    assert await request.json() is handed


class Item(BaseModel):
    x: int


class Checked(BaseModel):
    model_config = ConfigDict(revalidate_instances="always")
    x: int


def test_fastapi_single_body_model_is_the_body_fastapi_validates_as_a_whole() -> None:
    app = FastAPI()

    @app.post("/one")
    async def one(item: Item) -> None: ...

    @app.post("/embedded")
    async def embedded(item: Annotated[Item, Body(embed=True)]) -> None: ...

    @app.post("/two")
    async def two(a: Item, b: Item) -> None: ...

    @app.post("/listed")
    async def listed(items: list[Item]) -> None: ...

    @app.post("/form")
    async def form(name: Annotated[str, Form()]) -> None: ...

    @app.post("/checked")
    async def checked(item: Checked) -> None: ...

    @app.post("/none")
    async def none() -> None: ...

    routes = {r.path: r for r in app.routes if isinstance(r, APIRoute)}
    assert fastapi_.single_body_model(routes["/one"]) is Item
    for path in ("/embedded", "/two", "/listed", "/form", "/checked", "/none"):
        assert fastapi_.single_body_model(routes[path]) is None, path
    # FastAPI's own validation of that body passes an instance through as itself.
    field = routes["/one"].body_field
    assert field is not None
    item = Item(x=1)
    assert field.validate(item, {}, loc=("body",))[0] is item

# --- aiohttp ------------------------------------------------------------------------------


class _Protocol:
    """What a ``StreamReader`` calls on its connection's protocol."""

    def __init__(self) -> None:
        self.paused = 0
        self.resumed = 0

    def pause_reading(self) -> None:
        self.paused += 1

    def resume_reading(self) -> None:
        self.resumed += 1


async def test_aiohttp_stream_reader_water_marks_are_what_read_bufsize_sets() -> None:
    """``widen_read_buffer`` sets ``_low_water``/``_high_water`` as ``StreamReader(limit)`` does."""
    from aiohttp import StreamReader

    assert {"_low_water", "_high_water"} <= set(StreamReader.__slots__)
    assert parameters(StreamReader.__init__)[:3] == ["self", "protocol", "limit"]
    reader = StreamReader(_Protocol(), 3000)  # type: ignore[arg-type]
    widened = StreamReader(_Protocol(), 10)  # type: ignore[arg-type]
    aiohttp_.widen_read_buffer(widened, 3000)
    assert (widened._low_water, widened._high_water) == (reader._low_water, reader._high_water) == (3000, 6000)


async def test_aiohttp_stream_reader_pauses_above_high_water_and_resumes_below_low() -> None:
    from aiohttp import StreamReader

    protocol = _Protocol()
    reader = StreamReader(protocol, 2**16)  # type: ignore[arg-type]
    aiohttp_.widen_read_buffer(reader, 1000)
    reader.feed_data(b"x" * 1500)
    reader.feed_data(b"x" * 400)  # 1900 unread: under 2 * 1000, reading goes on
    assert protocol.paused == 0
    reader.feed_data(b"x" * 200)  # 2100: paused
    assert protocol.paused == 1
    assert await reader.readchunk() == (b"x" * 1500, False)  # 600 left, under 1000: resumed
    assert protocol.resumed >= 1


# --- sqlalchemy ---------------------------------------------------------------------------


def test_sqlalchemy_greenlet_spawn_keeps_its_signature() -> None:
    from sqlalchemy.util.concurrency import greenlet_spawn

    assert inspect.iscoroutinefunction(greenlet_spawn)
    assert parameters(greenlet_spawn) == ["fn", "args", "_require_await", "kwargs"]


def test_sqlalchemy_asyncpg_adapter_translates_errors_with_handle_exception() -> None:
    from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_connection

    assert parameters(AsyncAdapt_asyncpg_connection._handle_exception) == ["self", "error"]


@pytest.mark.postgres_only  # SQLite has no driver path
async def test_sqlalchemy_asyncpg_adapter_raises_the_dbapi_error_for_an_asyncpg_one(backend: Backend) -> None:
    import asyncpg

    from app.core.config import Database
    from app.core.db.databases import Databases
    from app.core.fast.one_statement import borrow_driver_connection
    from app.core.fences.sqlalchemy_ import close_pooled, raise_as_dbapi_error
    from tests.test_migrations import settings_for

    databases = Databases.open(settings_for(backend))
    try:
        conn = await borrow_driver_connection(databases.engine(Database.metadata))
        assert conn is not None
        dbapi = databases.engine(Database.metadata).dialect.loaded_dbapi
        with pytest.raises(dbapi.Error) as raised:
            raise_as_dbapi_error(conn, asyncpg.exceptions.UniqueViolationError("duplicate"))
        assert isinstance(raised.value, dbapi.IntegrityError)
        with pytest.raises(KeyError):
            raise_as_dbapi_error(conn, KeyError("not asyncpg's"))
        await close_pooled(conn)
        assert databases.engine(Database.metadata).sync_engine.pool.checkedout() == 0
    finally:
        await databases.close()



def test_sqlalchemy_pool_invalidate_keeps_its_signature_and_state() -> None:
    from sqlalchemy.pool import Pool
    from sqlalchemy.pool.base import _ConnectionFairy

    assert parameters(Pool._invalidate) == ["self", "connection", "exception", "_checkin"]
    assert "_pool" in _ConnectionFairy.__slots__ and "_connection_record" in _ConnectionFairy.__slots__
    assert "self._invalidate_time = time.time()" in inspect.getsource(Pool._invalidate)


@pytest.mark.postgres_only  # SQLite has no driver path
async def test_sqlalchemy_pool_invalidate_recycles_older_connections(backend: Backend) -> None:
    """``recycle_pool_generation``: a connection opened before it is not lent out again."""
    from app.core.config import Database
    from app.core.db.databases import Databases
    from app.core.fast.one_statement import borrow_driver_connection
    from app.core.fences.sqlalchemy_ import close_pooled, recycle_pool_generation
    from tests.test_migrations import settings_for

    databases = Databases.open(settings_for(backend))
    try:
        first = await borrow_driver_connection(databases.engine(Database.metadata))
        assert first is not None
        driver = first.driver_connection
        await close_pooled(first)  # back in the pool
        second = await borrow_driver_connection(databases.engine(Database.metadata))
        assert second is not None and second.driver_connection is driver  # the pool lends it again
        recycle_pool_generation(second, RuntimeError("disconnect"))
        await close_pooled(second)
        third = await borrow_driver_connection(databases.engine(Database.metadata))
        assert third is not None and third.driver_connection is not driver
        await close_pooled(third)
    finally:
        await databases.close()


def test_sqlalchemy_ddl_if_is_stored_where_the_fence_reads_it() -> None:
    from sqlalchemy import Column, Index, Integer, MetaData, Table

    from app.core.fences.sqlalchemy_ import is_dialect_conditional

    table = Table("t", MetaData(), Column("a", Integer))
    plain = Index("plain", table.c.a)
    conditional = Index("pg_only", table.c.a).ddl_if(dialect="postgresql")
    assert not is_dialect_conditional(plain) and is_dialect_conditional(conditional)
    assert conditional._ddl_if.dialect == "postgresql"


# --- asyncpg: no internal needed ----------------------------------------------------------


@pytest.mark.postgres_only  # SQLite has no driver path
async def test_asyncpg_refuses_a_value_it_cannot_encode_with_a_public_sqlstate_22_error(backend: Backend) -> None:
    """What ``app.core.fast.fixed_statements`` once told apart with the private ``asyncpg.exceptions._base
    .DataError``: asyncpg raises the public ``asyncpg.exceptions.DataError`` (a PostgresError,
    SQLSTATE 22000) before sending anything, so the connection is not suspect and stays usable."""
    import asyncpg

    from app.core.config import Database
    from app.core.db.databases import Databases
    from app.core.fast.fixed_statements import _connection_suspect
    from app.core.fast.one_statement import borrow_driver_connection
    from app.core.fences.sqlalchemy_ import close_pooled
    from tests.test_migrations import settings_for

    databases = Databases.open(settings_for(backend))
    try:
        conn = await borrow_driver_connection(databases.engine(Database.metadata))
        assert conn is not None
        with pytest.raises(asyncpg.PostgresError) as raised:
            await conn.driver_connection.fetchrow("SELECT $1::int", "not a number")
        assert type(raised.value) is asyncpg.exceptions.DataError and raised.value.sqlstate == "22000"
        assert not _connection_suspect(raised.value)
        assert (await conn.driver_connection.fetchrow("SELECT $1::int", 7))[0] == 7
        await close_pooled(conn)
    finally:
        await databases.close()


# --- no internals outside the fence --------------------------------------------------------

FENCES = {"app/core/fences", "app/core/http/server.py"}
# Not a framework: the standard library's type of ``add_subparsers()``, used as an annotation.
ALLOWED = {("app/auth/cli.py", "argparse._SubParsersAction"), ("app/quotas/cli.py", "argparse._SubParsersAction")}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _parse(source: str) -> ast.Module:
    # No garbage collection while CPython 3.11 builds the tree: a finalizer running Python code
    # in the middle (a leaked pooled connection logging) fails it with "AST constructor
    # recursion depth mismatch" (CPython gh-106905, fixed in 3.12).
    gc.collect()
    gc.disable()
    try:
        return ast.parse(source)
    finally:
        gc.enable()


def internals(source: str, own_package: str | None = None) -> list[str]:
    """Framework internals ``source`` uses: ``x._name`` on anything but ``self``/``cls``,
    ``getattr(x, "_name")`` and friends, imports from private modules or of private names."""
    found = []
    for node in ast.walk(_parse(source)):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root = _root(node.value)
            if not (isinstance(root, ast.Name) and root.id in ("self", "cls")):
                found.append(ast.unparse(node))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr", "hasattr", "delattr"):
            if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and _private(str(node.args[1].value)):
                found.append(ast.unparse(node))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if own_package and node.module.split(".")[0] == own_package:
                continue
            if any(_private(part) for part in node.module.split(".")) or any(_private(a.name) for a in node.names):
                found.append(f"from {node.module} import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if any(_private(p) for p in a.name.split("."))]
    return found


def test_the_scan_finds_each_kind_of_internal() -> None:
    source = (
        "import asyncpg.exceptions._base\nfrom starlette._utils import get_route_path\n"
        "from fastapi.routing import _effective_route_context_var\n"
        "x = conn._pool._invalidate\ny = getattr(statement, '_returning', ())\n"
        "z = self._own + self._own._also + obj.__class__\n"
    )
    assert sorted(internals(source)) == sorted([
        "import asyncpg.exceptions._base",
        "from starlette._utils import get_route_path",
        "from fastapi.routing import _effective_route_context_var",
        "conn._pool._invalidate",
        "conn._pool",
        "getattr(statement, '_returning', ())",
    ])


def test_no_framework_internal_is_used_outside_the_fence() -> None:
    outside = []
    for path in sorted((ROOT / "app").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if any(relative == fence or relative.startswith(fence + "/") for fence in FENCES):
            continue
        outside += [f"{relative}: {use}" for use in internals(path.read_text()) if (relative, use) not in ALLOWED]
    assert outside == []


def test_the_client_imports_no_private_module_of_another_package() -> None:
    """The client's own ``_``-modules are its layout; another package's private ones are not."""
    package = ROOT / "clients" / "python" / "storage_gateway_client"
    outside = []
    for path in sorted(package.rglob("*.py")):
        uses = [u for u in internals(path.read_text(), own_package="storage_gateway_client") if u.startswith(("from ", "import "))]
        outside += [f"{path.name}: {use}" for use in uses]
    assert outside == []


def test_each_fenced_library_is_bounded_above_and_installed_within_its_bounds() -> None:
    """A fresh ``pip install .`` outside the lock cannot pick a release nobody checked."""
    import tomllib
    from importlib.metadata import version

    from packaging.requirements import Requirement

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    requirements = {Requirement(r).name.lower(): Requirement(r) for r in pyproject["project"]["dependencies"]}
    for name in ("fastapi", "starlette", "sqlalchemy", "asyncpg", "uvicorn", "aiohttp"):
        specifier = requirements[name].specifier
        assert any(s.operator == "<" for s in specifier), f"{name} has no upper bound"
        assert specifier.contains(version(name)), f"{name} {version(name)} is outside {specifier}"
