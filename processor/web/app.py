"""The HTTP app: health, metrics, the JSON API and the inspector page.

``create_app(context)`` builds it for a running processor (every route) or, when
``context.deployment`` is None, for a worker (/healthz, /readyz, /metrics). The
routes and their shapes are in README.md, "HTTP API and metrics"; the OpenAPI
document is at /openapi.json, its pages at /docs: Swagger UI from the files the
swagger-ui-bundle-v2 package installs, served here, so that they show on a machine
without Internet access (FastAPI's default page loads them from a CDN).
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from swagger_ui_bundle import swagger_ui_path

from processor.telemetry.metrics import REGISTRY
from processor.web.api import api_router
from processor.web.context import WebContext
from processor.web.errors import ApiError, install_error_handlers
from processor.web.models import ErrorBody, Health, Ready

__all__ = ["DOCS_ASSETS", "create_app"]

#: Where /docs finds Swagger UI's files.
DOCS_ASSETS = "/docs/assets"


def create_app(context: WebContext) -> FastAPI:
    """The FastAPI app of one process (see the module doc)."""
    app = FastAPI(
        title="processor",
        summary="Durable, event-sourced pipelines on Kafka: runs, their history, "
        "pending requests, rejected input and dead letters",
        responses={401: {"model": ErrorBody}, 422: {"model": ErrorBody}},
        docs_url=None,  # served by _serve_docs, from local files
        redoc_url=None,  # ReDoc has no local files: /docs only
    )
    install_error_handlers(app)
    _serve_docs(app)
    app.include_router(_health_router(context))
    if context.deployment is not None:
        app.include_router(api_router(context), prefix="/api")
        app.include_router(_page_router(context))
        if context.static_dir.is_dir():
            app.mount("/static", StaticFiles(directory=context.static_dir), name="static")
    return app


def _serve_docs(app: FastAPI) -> None:
    """/docs: Swagger UI on the app's OpenAPI document, with its files served here."""
    app.mount(DOCS_ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon-32x32.png",
            oauth2_redirect_url=None,  # the API takes a bearer token, not OAuth2
        )


def _health_router(context: WebContext) -> APIRouter:
    router = APIRouter(tags=["health"])

    @router.get("/healthz", summary="Alive", response_model=Health)
    def healthz() -> Health:
        return Health(status="ok")

    @router.get(
        "/readyz",
        summary="Partitions assigned and caught up (503 while restoring a store)",
        response_model=Ready,
        responses={503: {"model": Ready}},
    )
    def readyz() -> JSONResponse:
        state = context.readiness()
        if state.ready:
            ready = {"ready": True, "partitions": state.partitions}
            held = {"quarantined": state.quarantined, "skipped": state.skipped}
            return JSONResponse(ready | held)
        return JSONResponse({"ready": False, "reason": state.reason}, 503)

    @router.get("/metrics", summary="Prometheus metrics (text format)", response_class=Response)
    def metrics() -> Response:
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    return router


def _page_router(context: WebContext) -> APIRouter:
    router = APIRouter(tags=["page"])

    @router.get("/", summary="The run inspector page", response_class=FileResponse)
    def page() -> FileResponse:
        index = context.static_dir / "index.html"
        if not index.is_file():
            raise ApiError(404, "no_page", "the inspector page is not installed here")
        return FileResponse(index, media_type="text/html")

    return router
