"""The Grafana dashboard and the Prometheus alert rules (configs/grafana, configs/prometheus):
their structure, and every series they query exported by a running ``rung serve`` with a
PLC attached (real mosquitto, a pymodbus PLC, the demo model)."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from rung.daemon.demo.localbroker import free_port
from rung.daemon.metrics import Metrics
from tests.daemon.harness import BASE, Broker, Daemon, Requester, write_config
from tests.daemon.modbus.test_plc import PlcThread, _plant

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "configs" / "grafana" / "rung.json"
ALERTS = ROOT / "configs" / "prometheus" / "rung-alerts.yml"
# PromQL words that are not series names
PROMQL = frozenset({"sum", "rate", "increase", "delta", "histogram_quantile", "avg_over_time",
                    "max", "min", "count", "avg", "and", "or", "unless", "bool", "offset", "by",
                    "without", "on", "ignoring", "group_left", "group_right"})
BUILTIN = frozenset({"up"})  # Prometheus' own scrape health series
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "info": ("_info",),
            "histogram": ("_bucket", "_count", "_sum", "_created"), "summary": ("_count", "_sum")}


def series(expr: str) -> set[str]:
    """The series names an expression reads (label matchers, ranges, grouping removed)."""
    e = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    return {n for n in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", e) if n not in PROMQL}


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def test_series_extraction() -> None:
    assert series('histogram_quantile(0.95, sum by (le, task) (rate(rung_request_seconds_bucket'
                  '{instance=~"$instance", task="a b"}[$__rate_interval])))') == {
        "rung_request_seconds_bucket"}
    assert series("rung_a / ignoring(outcome) group_left sum(rung_b) or up") == {
        "rung_a", "rung_b", "up"}
    assert series("rte(rung_a[5m])") == {"rte", "rung_a"}  # a typo is not a PromQL word


def test_alert_rules_have_the_prometheus_structure() -> None:
    doc = yaml.safe_load(ALERTS.read_text())
    assert set(doc) == {"groups"} and doc["groups"]
    names = [g["name"] for g in doc["groups"]]
    assert len(names) == len(set(names))
    alerts = []
    for group in doc["groups"]:
        assert set(group) == {"name", "rules"} and group["rules"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
            assert re.fullmatch(r"Rung[A-Z][A-Za-z]+", rule["alert"])
            assert isinstance(rule["expr"], str) and rule["expr"].count("(") == rule[
                "expr"].count(")")
            assert re.fullmatch(r"\d+[smh]", rule.get("for", "1m"))
            assert rule["labels"]["severity"] in ("critical", "warning", "info")
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]
            alerts.append(rule["alert"])
    assert len(alerts) == len(set(alerts))


def test_dashboard_layout() -> None:
    doc = dashboard()
    assert doc["uid"] and doc["schemaVersion"] >= 36
    assert {v["name"] for v in doc["templating"]["list"]} == {"datasource", "job", "instance"}
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for p in doc["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]
        for t in p.get("targets", []):
            assert t["datasource"]["uid"] == "${datasource}" and t["expr"]
            if "rung_" in t["expr"]:
                assert 'instance=~"$instance"' in t["expr"], t["expr"]


def _scrape(port: int) -> dict[str, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {f.name: f.type for f in text_string_to_metric_families(text)}


@pytest.fixture
def served(tmp_path: Path, edge_engine: Path) -> Iterator[tuple[Requester, int]]:
    plc = PlcThread()
    _plant(plc)
    doc = yaml.safe_load((ROOT / "configs" / "plcs" / "press1.yaml").read_text())
    doc["transport"]["port"] = plc.sim.port
    doc["handshake"].update(poll_s=0.05, heartbeat_s=0.3)
    doc.pop("fault_tree")
    (tmp_path / "press1.yaml").write_text(yaml.safe_dump(doc))
    broker = Broker(tmp_path / "broker")
    broker.start()
    port = free_port()
    daemon = Daemon(write_config(tmp_path, edge_engine, broker.port,
                                 plcs=[str(tmp_path / "press1.yaml")], metrics={"port": port}))
    req: Requester | None = None
    try:
        daemon.start()
        req = Requester(broker.port, topics=(f"{BASE}/plc/#",))
        yield req, port
    finally:
        if req is not None:
            req.close()
        daemon.stop()
        broker.stop()
        plc.close()


def _wait_families(port: int, names: tuple[str, ...], timeout: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    families = _scrape(port)
    while not set(names) <= set(families) and time.monotonic() < deadline:
        time.sleep(0.1)
        families = _scrape(port)
    return families


def _wait_for(req: Requester, what: str, match: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(match(r) for r in req.snapshot()):
            return
        time.sleep(0.05)
    raise TimeoutError(f"{what}: not in {timeout} s")


def _plc_families() -> dict[str, str]:
    """The ``rung_plc_*`` families as ``daemon/metrics.py`` registers them."""
    m = Metrics()
    m.plc.set_link("press1", True, False)
    return {f.name: f.type for f in text_string_to_metric_families(m.render().decode())
            if f.name.startswith("rung_plc_")}


@pytest.mark.integration
@pytest.mark.slow
def test_every_queried_series_is_exported_by_rung_serve(
        served: tuple[Requester, int]) -> None:
    req, port = served
    # one answered request creates the lazily registered cold KV gauges
    req.send("st_code", {"input": {"description": "Pump P1 runs below 2 m"}, "id": "m1",
                         "max_tokens": 3})
    _wait_for(req, "the answer", lambda r: r.body.get("id") == "m1")
    _wait_for(req, "PLC press1 connected", lambda r: r.topic == f"{BASE}/plc/press1/link"
              and r.body.get("state") == "connected")
    families = _wait_families(port, ("rung_kv_cold_hits_ram", "rung_plc_serving"), 5)
    assert "rung_kv_cold_hits_ram" in families
    if not any(f.startswith("rung_plc_") for f in families):
        # serve.py does not hand its Metrics to the PLC agents yet: the series the PLC
        # agents would export, registered as daemon/metrics.py does
        families |= _plc_families()
    exported = {f"{name}{suffix}" for name, kind in families.items()
                for suffix in SUFFIXES.get(kind, ("",))}
    used = {s for e in [*dashboard_exprs(), *(r["expr"] for r in rules())] for s in series(e)}
    assert used - BUILTIN <= exported, sorted(used - BUILTIN - exported)
    assert {"rung_plc_serving", "rung_plc_failing", "rung_plc_retries_total",
            "rung_plc_jobs_total"} <= used
    # every series rung declares is on the dashboard (the dynamic cold-tier set in part)
    declared = set(re.findall(r'"(rung_[a-z_]+)"', (ROOT / "daemon" / "metrics.py").read_text()))
    static = {f for f in families if f in declared or f == "rung"}
    on_dashboard = {s for e in dashboard_exprs() for s in series(e)}
    missing = [f for f in static if not any(f"{f}{sfx}" in on_dashboard
                                            for sfx in SUFFIXES[families[f]])]
    assert not missing, missing
