"""Daemon config: the example loads, defaults hold, and every bad config names its key."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from rung.daemon.config import (
    Config,
    ConfigError,
    TLSConfig,
    apply_override,
    load_config,
    parse_config,
    physical_memory_mb,
)

EXAMPLE = Path(str(resources.files("rung.configs") / "rung.yaml"))
SECRET = "s3cret-Pa55"
NO_ENV: dict[str, str] = {}


def _parse(data: dict[str, Any], base: Path, env: dict[str, str] | None = None,
           overrides: tuple[str, ...] = ()) -> Config:
    data = {"engine": {"path": "engine"}, **data}
    return parse_config(data, base, overrides, NO_ENV if env is None else env)


def test_example_loads() -> None:
    cfg = load_config(EXAMPLE, env=NO_ENV)
    assert cfg.source == EXAMPLE
    assert cfg.engine.path == Path("/opt/rung/engines/edge-tiny")
    assert cfg.mqtt.base_topic == "v1/acme/plant1/press-line/rung/node1"
    assert cfg.mqtt.protocol == "5" and cfg.mqtt.tls is None and cfg.mqtt.password is None
    assert cfg.metrics.port == 9464 and cfg.state_dir == Path("/var/lib/rung")
    assert cfg.plcs == () and cfg.tasks_dir is None


def test_defaults(tmp_path: Path) -> None:
    cfg = _parse({}, tmp_path)
    assert cfg.engine.path == tmp_path / "engine"  # relative to the config folder
    assert (cfg.engine.threads, cfg.engine.max_batch) == (0, 1)
    assert (cfg.mqtt.host, cfg.mqtt.port, cfg.mqtt.protocol) == ("127.0.0.1", 1883, "5")
    assert cfg.mqtt.keepalive_s == 30 and cfg.mqtt.session_expiry_s == 86400
    assert cfg.queue.max_pending == 16 and cfg.queue.request_timeout_s == 300.0
    assert cfg.metrics.port == 0 and cfg.kv.ram_mb == 256.0 and cfg.kv.disk_mb == 2048.0
    assert cfg.journal.retention_s == 604800.0 and cfg.log.level == "info"
    assert cfg.state_dir == Path("/var/lib/rung") and cfg.source is None


def test_normalization(tmp_path: Path) -> None:
    (tmp_path / "tasks").mkdir()
    cfg = _parse({"mqtt": {"protocol": "3.1.1", "reconnect_min_s": 1, "tls": {}},
                  "log": {"level": "DEBUG"}, "metrics": {"host": "::1", "port": 9464},
                  "kv": {"disk_mb": 0}, "tasks_dir": "tasks", "state_dir": "state",
                  "queue": None}, tmp_path)
    assert cfg.mqtt.protocol == "3.1.1" and cfg.mqtt.reconnect_min_s == 1.0
    assert cfg.mqtt.tls == TLSConfig()  # present, even empty = TLS on
    assert cfg.log.level == "debug" and cfg.kv.disk_mb == 0.0
    assert cfg.tasks_dir == tmp_path / "tasks" and cfg.state_dir == tmp_path / "state"
    assert not cfg.state_dir.exists()  # the daemon creates it, not the loader
    assert cfg.queue.max_pending == 16


def test_credentials_and_password_file(tmp_path: Path) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "mqtt-password").write_text(SECRET + "\n")
    (creds / "key").write_text("KEY")
    (tmp_path / "ca.pem").write_text("CA")
    (tmp_path / "cert.pem").write_text("CERT")
    cfg = _parse({"mqtt": {"username": "u", "password_file": "credential:mqtt-password",
                           "tls": {"ca_file": "ca.pem", "cert_file": "cert.pem",
                                   "key_file": "credential:key"}}},
                 tmp_path, env={"CREDENTIALS_DIRECTORY": str(creds)})
    assert cfg.mqtt.password == SECRET  # one trailing newline stripped
    assert cfg.mqtt.tls is not None and cfg.mqtt.tls.key_file == creds / "key"
    assert cfg.mqtt.tls.ca_file == tmp_path / "ca.pem"


def test_retries_mode(tmp_path: Path) -> None:
    from rung.daemon.tasks.runner import RETRY_MODES, RetryPolicy

    assert _parse({}, tmp_path).retries.mode == RetryPolicy().mode
    for mode in RETRY_MODES:
        assert _parse({"retries": {"mode": mode.upper()}}, tmp_path).retries.mode == mode


def _yaml_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rung.yaml"
    path.write_text(text)
    return path


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("unknown key", {"mqtt": {"prot": 1884}},
     "mqtt.prot: unknown key; known keys here: host, port"),
    ("unknown top key", {"metric": {}}, "metric: unknown key; known keys here: engine, mqtt"),
    ("wrong type", {"mqtt": {"port": "abc"}},
     "mqtt.port: expected an integer 1..65535, got 'abc'"),
    ("bool is not an int", {"queue": {"max_pending": True}}, "queue.max_pending: expected"),
    ("port out of range", {"mqtt": {"port": 70000}}, "mqtt.port: expected an integer 1..65535"),
    ("section not a mapping", {"mqtt": 5}, "mqtt: expected a mapping"),
    ("wildcard topic", {"mqtt": {"base_topic": "rung/#"}}, "mqtt.base_topic: expected a topic"),
    ("leading slash topic", {"mqtt": {"base_topic": "/rung"}}, "mqtt.base_topic: expected"),
    ("empty client id", {"mqtt": {"client_id": ""}}, "mqtt.client_id: expected a non-empty"),
    ("protocol 4", {"mqtt": {"protocol": "4"}}, "mqtt.protocol: expected one of 5, 3.1.1, got '4'"),
    ("reconnect max < min", {"mqtt": {"reconnect_min_s": 5, "reconnect_max_s": 1}},
     "mqtt.reconnect_max_s: must be >= mqtt.reconnect_min_s (5)"),
    ("metrics not loopback", {"metrics": {"host": "0.0.0.0"}},
     "metrics.host: '0.0.0.0' is not a loopback address"),
    ("bad log level", {"log": {"level": "verbose"}}, "log.level: expected one of debug, info"),
    ("timeout not > 0", {"queue": {"request_timeout_s": 0}}, "queue.request_timeout_s: expected"),
    ("nan is not a number", {"kv": {"ram_mb": float("nan")}}, "kv.ram_mb: expected a number"),
    ("password and password_file", {"mqtt": {"password": SECRET, "password_file": "pw"}},
     "mqtt.password_file: give either mqtt.password or mqtt.password_file, not both"),
    ("missing password_file", {"mqtt": {"password_file": "nope"}},
     "mqtt.password_file: cannot read"),
    ("password type hidden", {"mqtt": {"password": 12345678}},
     "mqtt.password: expected a string of at most 65535 bytes, got a int"),
    ("3.1.1 password without username", {"mqtt": {"protocol": "3.1.1", "password": SECRET}},
     "mqtt.password: MQTT 3.1.1 sends a password only with a username"),
    ("credential without systemd", {"mqtt": {"password_file": "credential:mqtt-password"}},
     "mqtt.password_file: 'credential:mqtt-password' needs systemd's LoadCredential="),
    ("credential on a plain path", {"state_dir": "credential:x"}, "state_dir: credential:NAME"),
    ("missing tls file", {"mqtt": {"tls": {"ca_file": "ca.pem"}}},
     "mqtt.tls.ca_file: {tmp}/ca.pem is not an existing file"),
    ("tls key without cert", {"mqtt": {"tls": {"key_file": "pw"}}},
     "mqtt.tls.key_file: needs mqtt.tls.cert_file"),
    ("missing plcs file", {"plcs": ["pw", "press.yaml"]},
     "plcs[1]: {tmp}/press.yaml is not an existing file"),
    ("plcs not a list", {"plcs": "press.yaml"}, "plcs: expected a list"),
    ("missing tasks_dir", {"tasks_dir": "tasks"}, "tasks_dir: {tmp}/tasks is not an existing dir"),
    ("state_dir is a file", {"state_dir": "pw"}, "state_dir: {tmp}/pw exists and is not a dir"),
    ("engine.path missing", {"engine": {"threads": 2}}, "engine.path: required"),
    ("engine.path empty section", {"engine": None}, "engine.path: required"),
    ("unknown backend", {"engine": {"path": "e", "backend": "tensorrt"}},
     "engine.backend: expected one of onnx, trt, got 'tensorrt'"),
    ("unknown provider", {"engine": {"path": "e", "provider": "rocm"}},
     "engine.provider: expected one of cpu, cuda, got 'rocm'"),
    ("provider with trt", {"engine": {"path": "e", "backend": "trt", "provider": "cuda"}},
     "engine.provider: applies to engine.backend onnx only"),
    ("unknown retry mode", {"retries": {"mode": "reprompt"}},
     "retries.mode: expected one of resample, feedback, got 'reprompt'"),
    ("retry mode not a string", {"retries": {"mode": True}},
     "retries.mode: expected one of resample, feedback, got True"),
]


@pytest.mark.parametrize(("case", "data", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_config_names_the_key(tmp_path: Path, case: str, data: dict[str, Any],
                                  message: str) -> None:
    (tmp_path / "pw").write_text("pw\n")
    path = _yaml_file(tmp_path, json.dumps({"engine": {"path": "e"}, **data}))
    with pytest.raises(ConfigError) as e:
        load_config(path, env=NO_ENV)
    assert e.value.message.startswith(message.format(tmp=tmp_path))
    assert str(path) in e.value.message  # the file, for a key that came from it
    assert SECRET not in str(e.value)


def test_unknown_key_suggests_the_close_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        _parse({"mqtt": {"base_topik": "x"}}, tmp_path)
    assert e.value.hint == "did you mean 'base_topic'?"


def test_credential_hint_names_load_credential(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        _parse({"mqtt": {"tls": {"key_file": "credential:k"}}}, tmp_path)
    assert e.value.message.startswith("mqtt.tls.key_file:")
    assert e.value.hint is not None and "LoadCredential=k:" in e.value.hint


FILE_ERRORS = [
    ("engine:\n  path: e\nmqtt:\n  port: [1\n", "invalid YAML at line 5"),
    ("engine:\n  path: e\nmqtt:\n  port: 1\n  port: 2\n", "invalid YAML at line 5"),
    ("- engine\n- mqtt\n", "the top level must be a mapping of keys, got a list"),
]


@pytest.mark.parametrize(("text", "message"), FILE_ERRORS)
def test_bad_file_names_the_file(tmp_path: Path, text: str, message: str) -> None:
    path = _yaml_file(tmp_path, text)
    with pytest.raises(ConfigError, match=f"^{path}: {message}"):
        load_config(path, env=NO_ENV)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path)


def test_overrides(tmp_path: Path) -> None:
    path = _yaml_file(tmp_path, "engine:\n  path: e\nmqtt:\n  port: 1883\n")
    cfg = load_config(path, ["mqtt.port=1884", "mqtt.protocol=3.1.1", "metrics.port=9464",
                             "queue.request_timeout_s=10", "mqtt.tls={}"], env=NO_ENV)
    assert cfg.mqtt.port == 1884 and cfg.mqtt.protocol == "3.1.1" and cfg.metrics.port == 9464
    assert cfg.queue.request_timeout_s == 10.0 and cfg.mqtt.tls == TLSConfig()
    cfg = load_config(None, ["engine.path=/opt/e"], env=NO_ENV)  # no file at all
    assert cfg.engine.path == Path("/opt/e") and cfg.source is None
    with pytest.raises(ConfigError, match=r"^mqtt\.port: expected an integer 1\.\.65535, "
                                          r"got 'abc' \[--set\]"):
        load_config(path, ["mqtt.port=abc"], env=NO_ENV)
    with pytest.raises(ConfigError, match=r"^mqtt\.prot: unknown key"):
        load_config(path, ["mqtt.prot=1"], env=NO_ENV)


def test_apply_override() -> None:
    data: dict[str, Any] = {"mqtt": {"port": 1883}, "kv": None}
    apply_override(data, "mqtt.tls.insecure=true")
    apply_override(data, "kv.ram_mb = 0")
    apply_override(data, "plcs=[a.yaml, b.yaml]")
    apply_override(data, "mqtt.host=a=b")
    assert data == {"mqtt": {"port": 1883, "tls": {"insecure": True}, "host": "a=b"},
                    "kv": {"ram_mb": 0}, "plcs": ["a.yaml", "b.yaml"]}
    for item, message in [("mqtt.port", "--set mqtt.port: expected KEY=VALUE"),
                          ("=5", "--set =5: expected KEY=VALUE"),
                          ("mqtt..port=1", "--set mqtt..port: expected KEY=VALUE"),
                          ("mqtt.port.x=1", "--set mqtt.port.x: mqtt.port is not a mapping"),
                          (f"mqtt.password=[{SECRET}", "--set mqtt.password: the value is not")]:
        with pytest.raises(ConfigError) as e:
            apply_override(data, item)
        assert e.value.message.startswith(message) and SECRET not in str(e.value)


def test_password_never_shown(tmp_path: Path) -> None:
    cfg = _parse({"mqtt": {"username": "u", "password": SECRET}}, tmp_path)
    assert cfg.mqtt.password == SECRET
    assert SECRET not in repr(cfg) and SECRET not in str(cfg)


def test_engine_backend_and_provider(tmp_path: Path) -> None:
    cfg = _parse({}, tmp_path)
    assert (cfg.engine.backend, cfg.engine.provider) == ("onnx", None)
    cfg = _parse({"engine": {"path": "e", "backend": "TRT"}}, tmp_path)
    assert (cfg.engine.backend, cfg.engine.provider) == ("trt", None)
    cfg = _parse({"engine": {"path": "e", "provider": "cuda"}}, tmp_path)
    assert (cfg.engine.backend, cfg.engine.provider) == ("onnx", "cuda")
    cfg = _parse({}, tmp_path, overrides=("engine.backend=trt",))
    assert cfg.engine.backend == "trt"


# -- upper bounds and broker-safe strings -----------------------------------------------
YEAR = 365 * 86400
RAM_MB = physical_memory_mb()
# (section, key, the largest accepted, the smallest refused, the message it gets)
BOUNDS: list[tuple[str, str, float, float, str]] = [
    ("engine", "max_batch", 64, 10**9, "expected an integer 1..64, got 1000000000"),
    ("engine", "threads", 1024, 1025, "expected an integer 0..1024, got 1025"),
    ("engine", "load_parts", 2, 3, "expected an integer 0..2, got 3"),
    ("queue", "max_pending", 100_000, 100_001, "expected an integer 1..100000, got 100001"),
    ("queue", "request_timeout_s", YEAR, YEAR + 1,
     "expected a number > 0 and <= 31536000 (one year), got 31536001"),
    ("queue", "request_timeout_s", YEAR, float("inf"), "expected a number > 0 and <= "),
    ("kv", "ram_mb", RAM_MB, RAM_MB * 1.01,
     f"expected a number >= 0 and <= {RAM_MB:.0f} (this machine's physical memory)"),
    ("kv", "disk_mb", 1e7, 1e7 + 1, "expected a number >= 0 and <= 10000000 (10 TB)"),
    ("journal", "retention_s", YEAR, 1e300, "expected a number > 0 and <= 31536000"),
    ("modbus", "job_timeout_s", YEAR, YEAR * 2, "expected a number > 0 and <= 31536000"),
    ("modbus", "reconnect_max_s", 86400, 86401,
     "expected a number > 0 and <= 86400 (one day), got 86401"),
    ("mqtt", "reconnect_max_s", 86400, float("inf"), "expected a number > 0 and <= 86400"),
]


@pytest.mark.parametrize(("section", "key", "top", "over", "message"), BOUNDS,
                         ids=[f"{b[0]}.{b[1]}={b[3]:g}" for b in BOUNDS])
def test_upper_bounds_name_the_key(tmp_path: Path, section: str, key: str, top: float,
                                   over: float, message: str) -> None:
    base = {"path": "e"} if section == "engine" else {}
    cfg = _parse({section: {**base, key: top}}, tmp_path)
    assert getattr(getattr(cfg, section), key) == top
    with pytest.raises(ConfigError) as e:
        _parse({section: {**base, key: over}}, tmp_path)
    assert e.value.message.startswith(f"{section}.{key}: {message}"), e.value.message


def test_absurd_batch_from_the_command_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^engine\.max_batch: expected an integer 1\.\.64, "
                                          r"got 1000000000 \[--set\]"):
        _parse({}, tmp_path, overrides=("engine.max_batch=1000000000",))


BAD_TOPICS = [
    ("a/\u0001/b", "contains a control character (U+0001)"),
    ("rung\u007f", "contains a control character (U+007F)"),
    ("rung/\u0085", "contains a control character (U+0085)"),
    ("rung/\ufdd0", "contains a Unicode non-character (U+FDD0)"),
    ("rung/\U0001fffe", "contains a Unicode non-character (U+1FFFE)"),
    ("rung/\ud800", "contains a lone surrogate (U+D800)"),
    ("$SYS/x", "starts with '$'"),
    ("a//b", "has an empty level ('//')"),
    ("/rung", "starts or ends with '/'"),
    ("rung/", "starts or ends with '/'"),
    ("rung/+/x", "contains a wildcard (+ or #)"),
    ("", "is empty"),
    ("r" * 65536, "is longer than 65535 bytes"),
]


@pytest.mark.parametrize(("topic", "why"), BAD_TOPICS, ids=[t[1] for t in BAD_TOPICS])
def test_base_topic_follows_the_broker(tmp_path: Path, topic: str, why: str) -> None:
    with pytest.raises(ConfigError) as e:
        _parse({"mqtt": {"base_topic": topic}}, tmp_path)
    assert e.value.message.startswith("mqtt.base_topic: expected a topic without wildcards")
    assert f", which {why}" in e.value.message, e.value.message


def test_base_topic_accepted(tmp_path: Path) -> None:
    for topic in ("v1/acme/plant1/press-line/rung/node1", "Öl/Presse 3/rung", "a"):
        assert _parse({"mqtt": {"base_topic": topic}}, tmp_path).mqtt.base_topic == topic


@pytest.mark.parametrize("key", ["client_id", "username", "host"])
@pytest.mark.parametrize(("value", "why"), [("node\u00011", "a control character (U+0001)"),
                                            ("node\ufffe", "a Unicode non-character (U+FFFE)")])
def test_mqtt_strings_follow_the_broker(tmp_path: Path, key: str, value: str,
                                        why: str) -> None:
    with pytest.raises(ConfigError) as e:
        _parse({"mqtt": {key: value}}, tmp_path)
    assert e.value.message.startswith(f"mqtt.{key}: expected a non-empty")
    assert e.value.message.endswith(f", which contains {why}"), e.value.message


def test_mqtt_string_lengths(tmp_path: Path) -> None:
    assert _parse({"mqtt": {"client_id": "c" * 65535}}, tmp_path).mqtt.client_id == "c" * 65535
    with pytest.raises(ConfigError, match=r"^mqtt\.client_id: .*, which is longer than 65535"):
        _parse({"mqtt": {"client_id": "é" * 32768}}, tmp_path)
    with pytest.raises(ConfigError, match=r"^mqtt\.host: .*, which is longer than 255 bytes"):
        _parse({"mqtt": {"host": "h" * 256}}, tmp_path)
    long_secret = SECRET * 6000
    with pytest.raises(ConfigError) as e:
        _parse({"mqtt": {"username": "u", "password": long_secret}}, tmp_path)
    assert e.value.message == "mqtt.password: expected a string of at most 65535 bytes, got a str"
