"""Configuration: a TOML --config file is honoured, flags override it, bad configuration gives a
clear one-line error and exit code 2; anonymous access only when allowed."""

import subprocess
import sys

import pytest

from ..procs import ROOT, BrokerProcess
from .helpers import V5, V311, Client, connect
from .raw import RawClient


def run_brokerd(*args, timeout=15) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "brokerd", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def write(tmp_path, text: str, name="brokerd.toml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


BASE = 'listen = ["mqtt://127.0.0.1:0"]\nallow_anonymous = true\n'


def test_config_file_is_honoured(tmp_path, client_id):
    cfg = write(tmp_path, BASE + "max_inflight = 3\ntopic_alias_maximum = 7\nmax_packet_size = 2048\n"
                                 "max_keepalive = 40\nnode_id = \"cfgnode\"\n")
    with BrokerProcess("--config", cfg, listen=(), anonymous=False) as b:
        assert [u.split(":")[0] for u in b.urls] == ["mqtt"]
        c = connect(b.port(), "", V5, keepalive=100)
        p = c.connack_props
        assert (p.ReceiveMaximum, p.TopicAliasMaximum, p.MaximumPacketSize, p.ServerKeepAlive) == (3, 7, 2048, 40)
        assert p.AssignedClientIdentifier.startswith("auto-cfgnode-")
        c.disconnect()


def test_flags_override_config_file(tmp_path, client_id):
    cfg = write(tmp_path, BASE + "max_inflight = 3\ntopic_alias_maximum = 7\n")
    with BrokerProcess("--config", cfg, "--max-inflight", "5", listen=("mqtt://127.0.0.1:0", "ws://127.0.0.1:0/mqtt"),
                       anonymous=False) as b:
        assert sorted(u.split(":")[0] for u in b.urls) == ["mqtt", "ws"]      # --listen replaced the file's list
        c = connect(b.port(), client_id, V5)
        assert (c.connack_props.ReceiveMaximum, c.connack_props.TopicAliasMaximum) == (5, 7)
        c.disconnect()


def test_config_keys_may_use_dashes_and_single_listen(tmp_path, client_id):
    cfg = write(tmp_path, 'listen = "mqtt://127.0.0.1:0"\nallow-anonymous = true\nmax-inflight = 9\n')
    with BrokerProcess("--config", cfg, listen=(), anonymous=False) as b:
        c = connect(b.port(), client_id, V5)
        assert c.connack_props.ReceiveMaximum == 9
        c.disconnect()


def test_anonymous_refused_unless_allowed(tmp_path, client_id):
    """Without --allow-anonymous: v5 CONNACK 0x87 Not authorized, 3.1.1 return code 5."""
    with BrokerProcess(anonymous=False) as b:
        with RawClient(b.port()) as c:
            assert c.connect(client_id, version=5).code == 0x87
            c.expect_closed()
        with RawClient(b.port()) as c:
            assert c.connect(client_id, version=4).body == b"\x00\x05"
            c.expect_closed()
        p = Client(client_id, V311)
        p.connect(b.port(), wait=False)
        assert str(p.connack_result()[1]) == "Not authorized"
        p.stop_loop()


BAD_CONFIGS = {
    "unknown-key": ("max_inflights = 4\n", "max_inflights"),
    "toml-syntax": ("max_inflight = = 4\n", "cannot read"),
    "inflight-zero": ("max_inflight = 0\n", "--max-inflight"),
    "packet-size-too-small": ("max_packet_size = 10\n", "--max-packet-size"),
    "bad-listener-scheme": ('listen = ["http://127.0.0.1:0"]\n', "scheme"),
    "path-on-tcp-listener": ('listen = ["mqtt://127.0.0.1:0/mqtt"]\n', "path"),
    "tls-without-cert": ('listen = ["mqtts://127.0.0.1:0"]\n', "--tls-cert"),
    "verify-client-without-ca": ('tls_verify_client = "required"\n', "--tls-ca"),
    "bad-strategy": ('shared_subscription_strategy = "first"\n', "round_robin"),
}


@pytest.mark.parametrize("name", sorted(BAD_CONFIGS))
def test_bad_config_file_exits_2_with_clear_error(tmp_path, name):
    text, hint = BAD_CONFIGS[name]
    cfg = write(tmp_path, text)
    proc = run_brokerd("--config", cfg)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("brokerd: ") and hint in proc.stderr
    assert "brokerd ready" not in proc.stdout


def test_missing_config_file(tmp_path):
    proc = run_brokerd("--config", str(tmp_path / "nope.toml"))
    assert proc.returncode == 2 and proc.stderr.startswith("brokerd: ") and "nope.toml" in proc.stderr


@pytest.mark.parametrize("args", [["--max-inflight", "0"], ["--listen", "tcp://127.0.0.1:1"], ["--max-inflight", "x"],
                                  ["--tls-verify-client", "maybe"], ["--no-such-flag"]])
def test_bad_flags_exit_2(args):
    proc = run_brokerd(*args)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("text", ['max_inflight = "many"\n', 'sys_interval = "often"\n', 'max_connections = "10"\n'])
def test_wrong_type_in_config_file_exits_2(tmp_path, text):
    """Regression: a string for a number used to crash with a TypeError traceback, exit 1
    (found by this suite; fixed in f2407e3)."""
    cfg = write(tmp_path, 'listen = ["mqtt://127.0.0.1:0"]\n' + text)
    proc = run_brokerd("--config", cfg)
    assert proc.returncode == 2, proc.stderr[-300:]
    assert "Traceback" not in proc.stderr


def test_port_in_use_exits_2(broker):
    proc = run_brokerd("--listen", f"mqtt://127.0.0.1:{broker.port()}")
    assert proc.returncode == 2
    assert "cannot listen" in proc.stderr


def test_help_lists_the_flags():
    proc = run_brokerd("--help")
    assert proc.returncode == 0
    for flag in ("--config", "--max-inflight", "--max-queued", "--connect-timeout", "--sys-interval"):
        assert flag in proc.stdout


def test_quoted_number_in_config_is_refused_or_works(tmp_path):
    """A quoted number is a common TOML mistake. Either refuse it at start (exit 2) or honour it.
    Regression: brokerd used to start and then fail every housekeeping sweep ("housekeeping
    failed"): no connect timeout, keepalive, will delay or session expiry (fixed in f2407e3)."""
    cfg = write(tmp_path, 'connect_timeout = "1"\n')
    b = BrokerProcess("--config", cfg)
    try:
        b.start()
    except RuntimeError:
        assert b.proc.returncode == 2
        return
    try:
        with RawClient(b.port()) as c:
            c.expect_closed(timeout=3)
    finally:
        b.stop()


# ------------------------------------------------------------------ environment (docker/compose.yaml)

def test_environment_variables_set_every_flag(tmp_path, client_id):
    """``BROKERD_<FLAG>`` works like the flag (the container image configures nodes this way); the
    environment wins over the TOML file, flags win over the environment."""
    cfg = write(tmp_path, BASE + "max_inflight = 3\ntopic_alias_maximum = 7\n")
    env = {"BROKERD_CONFIG": cfg, "BROKERD_LISTEN": "mqtt://127.0.0.1:0, ws://127.0.0.1:0/mqtt",
           "BROKERD_ALLOW_ANONYMOUS": "true", "BROKERD_TOPIC_ALIAS_MAXIMUM": "11", "BROKERD_MAX_INFLIGHT": "4",
           "BROKERD_MAX_KEEPALIVE": "40", "BROKERD_NODE_ID": "envnode"}
    with BrokerProcess("--max-inflight", "6", listen=(), anonymous=False, env=env) as b:
        assert sorted(u.split(":")[0] for u in b.urls) == ["mqtt", "ws"]
        c = connect(b.port(), "", V5, keepalive=100)
        p = c.connack_props
        assert (p.ReceiveMaximum, p.TopicAliasMaximum, p.ServerKeepAlive) == (6, 11, 40)
        assert p.AssignedClientIdentifier.startswith("auto-envnode-")
        c.disconnect()


@pytest.mark.parametrize("var, value, message", [
    ("BROKERD_MAX_INFLIGHT", "many", "$BROKERD_MAX_INFLIGHT: expected int, not 'many'"),
    ("BROKERD_ALLOW_ANONYMOUS", "perhaps", "$BROKERD_ALLOW_ANONYMOUS: expected true/false"),
    ("BROKERD_SERVER_REFERENCE", "nowhere", "--server-reference must be HOST:PORT"),
    ("BROKERD_CLUSTER_CLAIM_GAP", "5", "--cluster-claim-gap 5.0: seconds, 0 to 1"),
])
def test_bad_environment_variable_exits_2(var, value, message):
    import os

    proc = subprocess.run([sys.executable, "-m", "brokerd"], cwd=ROOT, capture_output=True, text=True, timeout=15,
                          env=dict(os.environ, **{var: value}))
    assert proc.returncode == 2
    assert message in proc.stderr
