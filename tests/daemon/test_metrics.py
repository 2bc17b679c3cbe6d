"""Prometheus metrics: series and labels, cold-KV gauges, the summary, the HTTP endpoint."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rung.daemon.metrics import Metrics, MetricsError


def _samples(m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(m.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.fixture
def metrics() -> Iterator[Metrics]:
    m = Metrics()
    yield m
    m.close()


def test_requests_and_histograms(metrics: Metrics) -> None:
    metrics.observe_request("st_code", "ok", total_s=1.5, ttft_s=0.2, decode_tok_s=40.0,
                            prompt_tokens=100, completion_tokens=50, cached_tokens=64,
                            ffn_skip_ratio=0.25)
    metrics.observe_request("st_code", "ok", total_s=2.5, ttft_s=0.4, prompt_tokens=10,
                            completion_tokens=5)
    metrics.observe_request("st_code", "invalid_output", total_s=3.0)
    metrics.observe_request(None, "bad_json")
    s = _samples(metrics)
    assert s[("rung_requests_total", (("outcome", "ok"), ("task", "st_code")))] == 2
    assert s[("rung_requests_total", (("outcome", "invalid_output"), ("task", "st_code")))] == 1
    assert s[("rung_requests_total", (("outcome", "bad_json"), ("task", "-")))] == 1
    assert s[("rung_request_seconds_count", (("task", "st_code"),))] == 3
    assert s[("rung_request_seconds_sum", (("task", "st_code"),))] == pytest.approx(7.0)
    assert s[("rung_ttft_seconds_count", (("task", "st_code"),))] == 2
    assert s[("rung_ttft_seconds_bucket", (("le", "0.25"), ("task", "st_code")))] == 1
    assert s[("rung_decode_tokens_per_second_count", (("task", "st_code"),))] == 1
    assert s[("rung_prompt_tokens_total", (("task", "st_code"),))] == 110
    assert s[("rung_completion_tokens_total", (("task", "st_code"),))] == 55
    assert s[("rung_cached_tokens_total", (("task", "st_code"),))] == 64
    assert s[("rung_ffn_skip_ratio", ())] == 0.25
    metrics.observe_request("st_code", "ok", ffn_skip_ratio=None)
    assert _samples(metrics)[("rung_ffn_skip_ratio", ())] == 0.25  # None keeps the last value
    assert s[("rung_up", ())] == 1


def test_gauges_mqtt_info(metrics: Metrics) -> None:
    metrics.set_queue(3, 1)
    metrics.set_mqtt(True)
    metrics.mqtt_reconnected()
    metrics.mqtt_reconnected()
    metrics.mqtt_message("in")
    metrics.mqtt_message("out")
    metrics.mqtt_message("out")
    metrics.set_journal_pending(7)
    metrics.set_info(version="0.1.0", engine="qwen-0.5b", kv_dtype="fp8")
    s = _samples(metrics)
    assert s[("rung_queue_depth", ())] == 3
    assert s[("rung_inflight", ())] == 1
    assert s[("rung_mqtt_connected", ())] == 1
    assert s[("rung_mqtt_reconnects_total", ())] == 2
    assert s[("rung_mqtt_messages_total", (("direction", "in"),))] == 1
    assert s[("rung_mqtt_messages_total", (("direction", "out"),))] == 2
    assert s[("rung_journal_pending", ())] == 7
    assert s[("rung_info", (("engine", "qwen-0.5b"), ("kv_dtype", "fp8"),
                            ("version", "0.1.0")))] == 1
    metrics.set_mqtt(False)
    assert _samples(metrics)[("rung_mqtt_connected", ())] == 0
    with pytest.raises(ValueError, match="direction"):
        metrics.mqtt_message("sideways")


def test_set_kv_sanitizes_and_updates(metrics: Metrics) -> None:
    metrics.set_kv({"entries": 4, "bytes": 1024, "hits": 10, "misses": 2, "budget_bytes": 4096})
    metrics.set_kv({"entries": 5, "Hit-Rate %": 0.8, "label": "x", "flag": True})  # type: ignore[dict-item]
    s = _samples(metrics)
    assert s[("rung_kv_cold_entries", ())] == 5
    assert s[("rung_kv_cold_bytes", ())] == 1024
    assert s[("rung_kv_cold_budget_bytes", ())] == 4096
    assert s[("rung_kv_cold_hit_rate", ())] == 0.8
    assert not any(name.startswith(("rung_kv_cold_label", "rung_kv_cold_flag"))
                   for name, _ in s)


def test_summary(metrics: Metrics) -> None:
    metrics.observe_request("diagnosis", "ok", total_s=2.0, ttft_s=0.1, prompt_tokens=30,
                            completion_tokens=20, cached_tokens=8)
    metrics.observe_request("diagnosis", "ok", total_s=4.0, ttft_s=0.3, prompt_tokens=10)
    metrics.observe_request("diagnosis", "busy")
    metrics.set_queue(2, 1)
    metrics.mqtt_reconnected()
    summary = metrics.summary()
    d = summary["tasks"]["diagnosis"]
    assert d["requests"] == 3
    assert d["outcomes"] == {"ok": 2, "busy": 1}
    assert (d["prompt_tokens"], d["completion_tokens"], d["cached_tokens"]) == (40, 20, 8)
    assert d["mean_request_s"] == pytest.approx(3.0)
    assert d["mean_ttft_s"] == pytest.approx(0.2)
    assert summary["queue_depth"] == 2
    assert summary["inflight"] == 1
    assert summary["mqtt_reconnects"] == 1
    assert summary["mqtt_connected"] is False
    assert Metrics().summary()["tasks"] == {}


def test_task_labels_are_capped(metrics: Metrics) -> None:
    for i in range(100):
        metrics.observe_request(f"t{i}", "unknown_task")
    tasks = {labels for (name, labels) in _samples(metrics) if name == "rung_requests_total"}
    assert len(tasks) == 65
    assert (("outcome", "unknown_task"), ("task", "other")) in tasks


def test_two_instances_do_not_clash() -> None:
    a, b = Metrics(), Metrics()
    a.observe_request("st_code", "ok")
    a.set_kv({"entries": 1})
    b.set_kv({"entries": 2})
    assert _samples(a)[("rung_requests_total", (("outcome", "ok"), ("task", "st_code")))] == 1
    assert not any(name == "rung_requests_total" for name, _ in _samples(b))
    assert _samples(b)[("rung_kv_cold_entries", ())] == 2


def test_serve_and_close(metrics: Metrics) -> None:
    port = _free_port()
    assert metrics.serve(port) == port
    metrics.observe_request("st_code", "ok")
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200
        assert b'rung_requests_total{outcome="ok",task="st_code"} 1.0' in resp.read()
    with pytest.raises(RuntimeError, match="already"):
        metrics.serve(_free_port())
    metrics.close()
    metrics.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=5)


def test_serve_any_port(metrics: Metrics) -> None:
    port = metrics.serve(0)
    assert port > 0
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert b"rung_up 1.0" in resp.read()


def test_a_port_in_use_names_the_part_the_address_and_the_key(metrics: Metrics) -> None:
    """The finding: a port held by another program ended ``rung serve`` with a bare
    ``OSError: [Errno 98]``. Now the error says whose address it is and which key."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(MetricsError) as err:
            metrics.serve(port)
    assert err.value.message.startswith(f"metrics: 127.0.0.1:{port} is in use "
                                        "(metrics.port)")
    assert "Errno" not in str(err.value)
    assert metrics.serve(port) == port   # let go: it serves once the port is free


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "::", "example.com"])
def test_serve_refuses_non_loopback(metrics: Metrics, host: str) -> None:
    with pytest.raises(ValueError, match="loopback"):
        metrics.serve(_free_port(), host=host)


@pytest.mark.parametrize("port", [-1, 70000, 8000.5, True])
def test_serve_refuses_bad_port(metrics: Metrics, port: object) -> None:
    with pytest.raises(ValueError, match="port"):
        metrics.serve(port)  # type: ignore[arg-type]


def test_refused_payloads_are_counted_by_part_and_kind() -> None:
    import logging

    from rung.daemon.mqtt.oversize import Oversize

    m = Metrics()
    o = Oversize(logging.getLogger("test"), 10, "sparkplug")
    o.observe = m.payload_refused
    assert not o.refuse("NCMD", "spBv1.0/g/NCMD/n", 10)
    assert o.refuse("NCMD", "spBv1.0/g/NCMD/n", 11) and o.refuse("NCMD", "t", 2**27)
    assert m.payloads_refused.labels(part="sparkplug", kind="NCMD")._value.get() == 2
