"""compose/: Prometheus scrapes the processor and the worker; Grafana shows a dashboard.

Docker does not run in the test environment, so the files are checked as data:
the compose services and their mounts, the scrape targets, the provisioning, and
every panel's queries against the metrics the package defines.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML (the dev extra) parses the compose files")

COMPOSE = Path(__file__).resolve().parents[2] / "compose"
DASHBOARD = COMPOSE / "grafana" / "dashboards" / "processor.json"
#: Where the metrics are defined (the prometheus_client objects and the scrape-time
#: collectors); names in the source as the registry gets them.
METRIC_SOURCES = (
    COMPOSE.parent / "processor" / "telemetry" / "metrics.py",
    COMPOSE.parent / "processor" / "web" / "collector.py",
)
_SERIES_SUFFIXES = ("_total", "_bucket", "_sum", "_count")


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _services() -> dict[str, Any]:
    services: dict[str, Any] = _yaml(COMPOSE / "docker-compose.yml")["services"]
    return services


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> host path (relative to compose/) of a service's bind mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        if source.startswith("./"):
            mounts[target] = source
    return mounts


def test_prometheus_scrapes_the_processor_and_the_worker() -> None:
    services = _services()
    prometheus = services["prometheus"]
    mounts = _mounts(prometheus)
    config_path = mounts["/etc/prometheus/prometheus.yml"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    config = _yaml(COMPOSE / config_path)
    targets = {
        (job["metrics_path"], target)
        for job in config["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    }
    assert targets == {("/metrics", "processor:8700"), ("/metrics", "worker:8701")}
    # The targets are the compose services, serving on every interface of their container.
    for name, port in (("processor", "8700"), ("worker", "8701")):
        service = services[name]
        assert service["environment"]["PROCESSOR_HTTP_HOST"] == "0.0.0.0"
        assert f"127.0.0.1:{port}:{port}" in service["ports"]
    assert {"processor", "worker"} <= set(prometheus["depends_on"])


def test_grafana_is_provisioned_with_prometheus_and_the_dashboard() -> None:
    grafana = _services()["grafana"]
    mounts = _mounts(grafana)
    provisioning = COMPOSE / mounts["/etc/grafana/provisioning"]
    (source,) = _yaml(provisioning / "datasources" / "prometheus.yml")["datasources"]
    assert (source["type"], source["url"]) == ("prometheus", "http://prometheus:9090")
    (provider,) = _yaml(provisioning / "dashboards" / "processor.yml")["providers"]
    dashboards_dir = provider["options"]["path"]
    assert (COMPOSE / mounts[dashboards_dir]).resolve() == DASHBOARD.parent.resolve()
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{dashboards_dir}/{DASHBOARD.name}"
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["panels"]
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == source["uid"], panel["title"]
        assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def _dashboard_metrics() -> set[str]:
    """Every ``processor_*`` metric a panel queries, as the source names it."""
    dashboard = json.loads(DASHBOARD.read_text())
    names = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            names.update(map(_metric_of, re.findall(r"\bprocessor_[a-z_]+", target["expr"])))
    return names


def _metric_of(series: str) -> str:
    """The metric a series belongs to: ``x_total`` and ``x_bucket`` are ``x``'s."""
    for suffix in _SERIES_SUFFIXES:
        series = series.removesuffix(suffix)
    return series


def test_the_dashboard_queries_only_metrics_the_package_defines() -> None:
    sources = [path for path in METRIC_SOURCES if path.exists()]
    if not sources:
        pytest.skip("no metrics defined yet (processor/telemetry/metrics.py)")
    defined = {
        name for path in sources for name in re.findall(r'"(processor_[a-z_]+)"', path.read_text())
    }
    used = _dashboard_metrics()
    assert len(used) >= 10
    assert used - defined == set()


def test_compose_ships_no_working_placeholder_secret() -> None:
    """Each secret of the processor must be given (``${VAR:?...}``): compose refuses to
    start without it, naming the variable, instead of starting with a known value."""
    secret_names = ("PROCESSOR_RESUME_SECRET", "PROCESSOR_HTTP_TOKEN")
    for name, service in _services().items():
        environment = service.get("environment", {})
        for variable, value in environment.items():
            if variable.startswith("PROCESSOR_") and variable.endswith(
                ("SECRET", "SECRETS", "TOKEN")
            ):
                required = re.fullmatch(rf"\$\{{{variable}:\?(.*)\}}", str(value))
                assert required is not None, f"{name}: {variable}={value}"
                assert "openssl rand" in required.group(1), "the message says how to make one"
        if name in ("processor", "worker"):
            assert set(secret_names) <= set(environment), name
