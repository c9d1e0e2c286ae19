"""The web view's HTTP side: a Starlette application of a page, its files, a JSON API and one
stream of server-sent events.

==========================================  ====================================================
``GET /``                                   the page (``static/index.html``); opened with the
                                            token, it sets the token's cookie
``GET /static/...``                         its script, styles (shipped in the wheel, no CDN)
``GET /api/info``                           version, read-only, whether this request holds the
                                            token
``GET /api/jobs``                           the jobs table (``elsewhere jobs --json``, and more)
``GET /api/jobs/{id}``                      one job: summary, settings, cluster data, scripts
``GET /api/jobs/{id}/timeline``             every record's lane and times (the Gantt, the plots;
                                            binary, see ``columns.py``)
``GET /api/jobs/{id}/tasks?offset&limit&``  one page of the task table, sorted and filtered
``sort&desc&state&host``
``GET /api/jobs/{id}/tasks/{i}``            one task: its row, output and error
``POST /api/jobs/{id}/{verb}``              cancel, retry, purge (``actions.py``)
``POST /api/jobs/{id}/tasks/{i}/{verb}``    cancel-task, retry-task
``GET /api/peers``                          the peers view (``peers.py``)
``GET /api/bench``                          the benchmark figures (``benchfigures.py``)
``GET /api/events?job={id}&peers=1``        server-sent events: ``jobs`` (the table), ``job``
                                            (the summary of the job followed), ``peers``
==========================================  ====================================================

Reading a job folder is blocking file work: the handlers are plain functions (Starlette
runs them in its thread pool) and the event stream does its reading in a thread too. The
event stream looks every :data:`TICK_S` and sends only what changed, so a page sees a
change within a second without polling, and a server that no page follows reads nothing.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ...util.errors import ConfigError, ElsewhereError, JobNotFound, NoSuchTask, StateError
from .. import jsonout
from . import actions
from .access import AccessMiddleware, Rules
from .benchfigures import BenchFigures
from .board import JobBoard, stable
from .columns import SORTS
from .peers import PeerBoard

STATIC = Path(__file__).resolve().parent / "static"
TICK_S = 0.25  # how often the event stream looks for changes
_PING_S = 15.0  # a comment line this often keeps proxies and browsers from closing the stream
_SECURITY = {
    "content-security-policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; "
                               "script-src 'self'; connect-src 'self'; frame-ancestors 'none'",
    "referrer-policy": "no-referrer", "x-content-type-options": "nosniff", "x-frame-options": "DENY",
}  # fmt: skip


def _json(value: Any, status: int = 200) -> Response:
    return Response(jsonout.dumps(value, indent=None), status_code=status, media_type="application/json",
                    headers={"cache-control": "no-store"})  # fmt: skip


def _error(exc: BaseException) -> Response:
    if isinstance(exc, (JobNotFound, NoSuchTask)):
        status = 404
    elif isinstance(exc, (ConfigError, StateError, ValueError)):
        status = 400
    elif isinstance(exc, ElsewhereError):
        status = 409
    else:
        status = 500
    return _json({"error": f"{type(exc).__name__}: {exc}" if status == 500 else str(exc)}, status)


class WebApp:
    """The application: its boards, its access rules and its routes (``.asgi``: what the
    server runs)."""

    def __init__(self, rules: Rules, *, board: JobBoard | None = None, peers: PeerBoard | None = None,
                 bench: BenchFigures | None = None) -> None:  # fmt: skip
        self.rules = rules
        self.board = board or JobBoard()
        self.peers = peers or PeerBoard()
        self.bench = bench or BenchFigures()
        self.stopping = False
        self._jobs_json: tuple[int, str] = (-1, "")
        routes = [
            Route("/", self.index),
            Route("/api/info", self.info),
            Route("/api/jobs", self.jobs),
            Route("/api/jobs/{job}", self.job),
            Route("/api/jobs/{job}/timeline", self.timeline),
            Route("/api/jobs/{job}/tasks", self.tasks),
            Route("/api/jobs/{job}/tasks/{task:int}", self.task),
            Route("/api/jobs/{job}/tasks/{task:int}/{verb}", self.act_task, methods=["POST"]),
            Route("/api/jobs/{job}/{verb}", self.act, methods=["POST"]),
            Route("/api/peers", self.peer_table),
            Route("/api/bench", self.bench_figures),
            Route("/api/events", self.events),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ]
        app = Starlette(routes=routes)
        self.asgi = AccessMiddleware(_Headers(app), rules)

    # -- the page ------------------------------------------------------------------------------
    def index(self, request: Request) -> Response:
        resp = FileResponse(STATIC / "index.html", headers={"cache-control": "no-store"})
        if request.scope.get("state", {}).get("token_in_query"):
            resp.set_cookie(self.rules.cookie, self.rules.token, httponly=True, samesite="strict")
        return resp

    def info(self, request: Request) -> Response:
        from ...util.version import __version__

        return _json({"version": __version__, "read_only": self.rules.read_only, "loopback": self.rules.loopback,
                      "token_ok": bool(request.scope.get("state", {}).get("token_ok")), "now": time.time()})  # fmt: skip

    # -- jobs ---------------------------------------------------------------------------------------
    def jobs(self, request: Request) -> Response:
        try:
            return _json({"jobs": self.board.rows(), "version": self.board.version})
        except Exception as exc:
            return _error(exc)

    def job(self, request: Request) -> Response:
        try:
            with self.board.lock:
                return _json(self.board.watch(request.path_params["job"]).detail())
        except Exception as exc:
            return _error(exc)

    def timeline(self, request: Request) -> Response:
        packed = "gzip" in request.headers.get("accept-encoding", "")
        try:
            with self.board.lock:
                w = self.board.watch(request.path_params["job"])
                body = w.timeline()
                if packed and len(body) > 4096:
                    body = w.timeline(gzipped=True)
                else:
                    packed = False
        except Exception as exc:
            return _error(exc)
        headers = {"cache-control": "no-store"}
        if packed:
            headers["content-encoding"] = "gzip"
        return Response(body, media_type="application/octet-stream", headers=headers)

    def tasks(self, request: Request) -> Response:
        q = request.query_params
        try:
            sort = q.get("sort", "task")
            if sort not in SORTS:
                raise ConfigError(f"sort must be one of {', '.join(SORTS)}, not {sort!r}")
            state = q.get("state") or None
            if state is not None and state not in (
                "pending",
                "queued",
                "running",
                "finished",
                "failed",
                "cancelled",
            ):
                raise ConfigError(f"no task state {state!r}")
            offset, limit = (
                max(0, int(q.get("offset", 0))),
                min(500, max(1, int(q.get("limit", 100)))),
            )
            with self.board.lock:
                page = self.board.watch(request.path_params["job"]).task_page(
                    offset=offset, limit=limit, sort=sort, desc=q.get("desc") in ("1", "true"),
                    state=state, host=q.get("host") or None)  # fmt: skip
            return _json(page)
        except Exception as exc:
            return _error(exc)

    def task(self, request: Request) -> Response:
        try:
            with self.board.lock:
                w = self.board.watch(request.path_params["job"])
                return _json(w.task_detail(request.path_params["task"]))
        except Exception as exc:
            return _error(exc)

    # -- actions (the access rules let only requests with the token get here) ----------------------------
    def act(self, request: Request) -> Response:
        return self._act(request, request.path_params["verb"], None)

    def act_task(self, request: Request) -> Response:
        verb = request.path_params["verb"]
        return self._act(
            request, verb if verb.endswith("-task") else f"{verb}-task", request.path_params["task"]
        )

    def _act(self, request: Request, verb: str, task: int | None) -> Response:
        if self.rules.read_only:  # (refused before: kept here too, so that no route forgets it)
            return _json({"error": "this view is read-only"}, 403)
        try:
            return _json(actions.act(self.board, request.path_params["job"], verb, task))
        except Exception as exc:
            return _error(exc)

    # -- peers ----------------------------------------------------------------------------------------
    def peer_table(self, request: Request) -> Response:
        try:
            return _json(self.peers.table())
        except Exception as exc:
            return _error(exc)

    # -- benchmarks -----------------------------------------------------------------------------------
    def bench_figures(self, request: Request) -> Response:
        try:
            return _json(self.bench.table())
        except Exception as exc:
            return _error(exc)

    # -- events ---------------------------------------------------------------------------------------
    def events(self, request: Request) -> Response:
        job = request.query_params.get("job") or None
        peers = request.query_params.get("peers") == "1"
        return StreamingResponse(self._stream(job, peers), media_type="text/event-stream",
                                 headers={"cache-control": "no-store", "x-accel-buffering": "no"})  # fmt: skip

    async def _stream(self, job: str | None, peers: bool) -> AsyncIterator[str]:
        sent: dict[str, str] = {}
        last = time.monotonic()
        yield "retry: 1000\n\n"
        while not self.stopping:
            news = await anyio.to_thread.run_sync(self._look, job, peers)
            for event, data in news.items():
                if sent.get(event) != data:
                    sent[event] = data
                    last = time.monotonic()
                    yield f"event: {event}\ndata: {data}\n\n"
            if time.monotonic() - last > _PING_S:
                last = time.monotonic()
                yield ": ping\n\n"
            await anyio.sleep(TICK_S)

    def _look(self, job: str | None, peers: bool) -> dict[str, str]:
        """What a page following ``job`` (and the peers) is shown now, each as JSON text (rows
        without elapsed and eta, which move with the clock alone: the page counts those on)."""
        out: dict[str, str] = {}
        try:
            self.board.refresh(max_age_s=TICK_S * 0.8)
            with self.board.lock:
                version = self.board.version
                if self._jobs_json[0] != version:
                    rows = [stable(r) for r in self.board.rows()]
                    self._jobs_json = (
                        version,
                        jsonout.dumps({"jobs": rows, "version": version}, indent=None),
                    )
                out["jobs"] = self._jobs_json[1]
        except Exception as exc:
            out["jobs"] = jsonout.dumps({"error": str(exc)}, indent=None)
        if job:
            try:
                with self.board.lock:
                    out["job"] = jsonout.dumps(stable(self.board.watch(job).summary()), indent=None)
            except JobNotFound as exc:
                out["gone"] = jsonout.dumps({"id": job, "message": str(exc)}, indent=None)
            except Exception as exc:
                out["job"] = jsonout.dumps({"id": job, "error": str(exc)}, indent=None)
        if peers:
            try:
                out["peers"] = jsonout.dumps(self.peers.table(), indent=None)
            except Exception as exc:
                out["peers"] = jsonout.dumps({"error": str(exc)}, indent=None)
        else:
            self.peers.idle()
        return out


class _Headers:
    """ASGI middleware: the security headers on every response (no inline script, no frames,
    no referrer: the token in the page's URL goes nowhere)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(k.encode(), v.encode()) for k, v in _SECURITY.items()]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send=with_headers)


__all__ = ["STATIC", "TICK_S", "WebApp"]
