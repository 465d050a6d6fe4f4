"""broker.conf handling: unknown keys, invalid values, precedence, address validation."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rmqbroker import config
from rmqbroker.config import ConfigError, build_settings, env_name

CONF = "brokerName=b1\nlistenPort=11000\n"


@pytest.fixture(autouse=True)
def _fresh_unknown_log(monkeypatch: pytest.MonkeyPatch) -> None:
    # "logged once" is per process: each test starts as a fresh process would.
    monkeypatch.setattr(config, "_warned_unknown", set())


def _unknown_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == config.__name__ and "unknown key" in r.getMessage()]


# ---------------------------------------------------------------- unknown keys
def test_unknown_keys_are_logged_once_and_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=config.__name__)
    conf = CONF + "noSuchKey=1\nnoSuchKey=2\n"
    env = {"RMQ_BROKER_NO_SUCH_ENV": "x", "OTHER_VAR": "y"}
    for _ in range(3):  # built repeatedly (as the operator does): still one warning per key
        s = build_settings(conf, env=env, overrides={"noSuchSet": "1"})
        assert s.listenPort == 11000 and s.brokerName == "b1"
    warnings = _unknown_warnings(caplog)
    assert len(warnings) == 3, warnings
    assert any("broker.conf" in w and "'noSuchKey'" in w for w in warnings)
    assert any("environment" in w and "'RMQ_BROKER_NO_SUCH_ENV'" in w for w in warnings)
    assert any("--set" in w and "'noSuchSet'" in w for w in warnings)
    assert not any("OTHER_VAR" in w for w in warnings)  # only RMQ_BROKER_* names are the broker's


def test_known_keys_are_not_reported(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=config.__name__)
    build_settings(CONF, env={env_name("flushDiskType"): "SYNC_FLUSH"}, overrides={"brokerId": "0"})
    assert _unknown_warnings(caplog) == []


def test_env_names_map_back_to_one_key_each() -> None:
    assert len(config._ENV_KEYS) == len(config._FIELDS)
    assert env_name("listenPort") == "RMQ_BROKER_LISTEN_PORT"


# ---------------------------------------------------------------- precedence
def test_precedence_conf_env_cli() -> None:
    conf = CONF + "defaultTopicQueueNums=2\nslaveReadEnable=true\nnamesrvAddr=conf:1\n"
    env = {"RMQ_BROKER_DEFAULT_TOPIC_QUEUE_NUMS": "3", "RMQ_BROKER_SLAVE_READ_ENABLE": "false",
           "NAMESRV_ADDR": "envplain:2"}
    s = build_settings(conf, env=env)
    assert (s.defaultTopicQueueNums, s.slaveReadEnable, s.namesrvAddr) == (3, False, "envplain:2")
    assert s.listenPort == 11000  # untouched by env: the conf value stays

    # RMQ_BROKER_NAMESRV_ADDR is the more specific name and wins over RocketMQ's NAMESRV_ADDR.
    s = build_settings(conf, env={**env, "RMQ_BROKER_NAMESRV_ADDR": "envrmq:3"})
    assert s.namesrvAddr == "envrmq:3"

    s = build_settings(conf, env={**env, "RMQ_BROKER_NAMESRV_ADDR": "envrmq:3"},
                       overrides={"defaultTopicQueueNums": "4", "namesrvAddr": "cli:4"})
    assert (s.defaultTopicQueueNums, s.slaveReadEnable, s.namesrvAddr) == (4, False, "cli:4")


def test_defaults_without_any_source() -> None:
    s = build_settings(None, env={})
    assert (s.listenPort, s.brokerRole, s.flushDiskType, s.namesrvAddr) == (10911, "ASYNC_MASTER", "ASYNC_FLUSH", "")


def test_the_vip_channel_is_listen_port_minus_two_unless_moved_or_off() -> None:
    assert build_settings(CONF, env={}).fast_port == 10998
    assert build_settings(CONF + "fastListenPort=12000\n", env={}).fast_port == 12000
    assert build_settings(CONF + "fastListenPort=0\n", env={}).fast_port == 0
    with pytest.raises(ConfigError, match=r"^fastListenPort: "):
        build_settings("listenPort=2\n", env={})


def test_an_invalid_env_value_is_fatal_even_if_the_cli_does_not_set_it() -> None:
    with pytest.raises(ConfigError, match=r"^listenPort: "):
        build_settings(CONF, env={"RMQ_BROKER_LISTEN_PORT": "ten"})


def test_cli_overrides_an_invalid_conf_value() -> None:
    # Values are converted after merging: only the effective value has to be valid.
    assert build_settings(CONF + "brokerIP1=999.1.1.1\n", env={}, overrides={"brokerIP1": "10.0.0.1"}).brokerIP1 \
        == "10.0.0.1"


# ---------------------------------------------------------------- invalid values
@pytest.mark.parametrize(("key", "value"), [
    ("listenPort", "ten"),
    ("listenPort", "70000"),
    ("haListenPort", "-1"),
    ("fastListenPort", "-2"),
    ("fastListenPort", "65536"),
    ("fastListenPort", "11001"),  # the HA port (listenPort + 1)
    ("autoCreateTopicEnable", "yes"),
    ("brokerRole", "MASTER"),
    ("flushDiskType", "FAST"),
    ("brokerName", "a.b"),
    ("mappedFileSizeConsumeQueue", "21"),
    ("messageDelayLevel", "1x"),
    ("brokerIP1", "999.1.1.1"),
    ("brokerIP1", "10.0.0"),
    ("brokerIP1", "10.0.0.1:10911"),
    ("brokerIP1", "bad_host"),
    ("brokerIP1", "-leading.example.com"),
    ("brokerIP1", "::1"),
    ("brokerIP2", "256.0.0.1"),
    ("brokerIP2", "a..b"),
    ("haMasterAddress", "10.0.0.1"),
    ("haMasterAddress", "10.0.0.1:"),
    ("haMasterAddress", "10.0.0.1:0"),
    ("haMasterAddress", "10.0.0.1:65536"),
    ("haMasterAddress", "10.0.0.1:port"),
    ("haMasterAddress", "999.0.0.1:10912"),
    ("haMasterAddress", ":10912"),
    ("namesrvAddr", "ns1:9876,ns2:9876"),
    ("namesrvAddr", "ns1:9876;ns2"),
    ("namesrvAddr", "ns1:9876;300.1.1.1:9876"),
    ("namesrvAddr", ";"),
    ("deleteWhen", "4am"),
    ("deleteWhen", "24"),
    ("fileReservedTime", "0"),
    ("diskMaxUsedSpaceRatio", "96"),
    ("diskMaxUsedSpaceRatio", "9"),
    ("diskSpaceWarningLevelRatio", "0"),
    ("diskSpaceCleanForciblyRatio", "101"),
    ("diskSpaceCleanForciblyRatio", "95"),
    ("cleanResourceInterval", "0"),
    ("statsSamplingInterval", "0"),
    ("cleanFileForciblyEnable", "1"),
])
def test_invalid_values_are_fatal_and_name_the_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{key}: "):
        build_settings(CONF + f"{key}={value}\n", env={})
    # The same through the environment and the command line.
    with pytest.raises(ConfigError, match=rf"^{key}: "):
        build_settings(CONF, env={env_name(key): value})
    with pytest.raises(ConfigError, match=rf"^{key}: "):
        build_settings(CONF, env={}, overrides={key: value})


@pytest.mark.parametrize(("key", "value"), [
    ("brokerIP1", "10.1.2.3"),
    ("brokerIP1", "broker-a-0"),
    ("brokerIP1", "broker-a-0.broker-a-headless.prod.svc.cluster.local."),
    ("brokerIP2", "127.0.0.1"),
    ("haMasterAddress", "broker-a-0.broker-a-headless.prod.svc:10912"),
    ("haMasterAddress", "127.0.0.1:10912"),
    ("namesrvAddr", "127.0.0.1:9876"),
    ("namesrvAddr", "ns-0.ns.svc:9876;ns-1.ns.svc:9876"),
    ("namesrvAddr", " 10.0.0.1:9876 ; 10.0.0.2:9876 ;"),  # spaces and a trailing ';' as RocketMQ allows
    ("namesrvAddr", ""),
])
def test_valid_addresses_are_accepted(key: str, value: str) -> None:
    s = build_settings(CONF, env={}, overrides={key: value})
    assert getattr(s, key) == value.strip()


# ---------------------------------------------------------------- the real process
@pytest.mark.parametrize(("source", "key"), [("conf", "haMasterAddress"), ("cli", "brokerIP1")])
def test_rmq_broker_refuses_an_invalid_value_with_exit_status_2(tmp_path: Path, source: str, key: str) -> None:
    conf = tmp_path / "broker.conf"
    store = tmp_path / "store"
    lines = [f"storePathRootDir={store}", "listenHost=127.0.0.1", "someFutureKey=1"]
    args = [sys.executable, "-m", "rmqbroker.main", "-c", str(conf)]
    if source == "conf":
        lines.append("haMasterAddress=127.0.0.1:99999")
    else:
        args += ["--set", "brokerIP1=999.1.1.1"]
    conf.write_text("\n".join(lines) + "\n")
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False,
                         env={k: v for k, v in os.environ.items() if not k.startswith("RMQ_BROKER_")})
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"invalid configuration: {key}:" in out.stderr
    assert "'someFutureKey' ignored" in out.stderr  # unknown keys are logged, not the failure
    assert not store.exists()  # refused before anything was started
