"""Config loading: precedence, the file format and validation of every value."""

from __future__ import annotations

from pathlib import Path

import pytest

from stratad.config import OPTIONS, Config, ConfigError, load_config
from stratad.errors import InvalidArgumentError


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "stratad.toml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    config = load_config()
    assert config == Config()
    assert config.listen == "127.0.0.1:50051"
    assert config.data_dir == Path("./stratad-data")
    assert config.log_level == "info"
    assert config.log_format == "text"
    assert config.grace_period == 10.0
    assert config.max_message_bytes == 64 * 1024 * 1024
    assert config.durability == "fsync"
    assert config.fsync_interval_ms == 100


def test_precedence_flags_over_env_over_file_over_defaults(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        'listen = "127.0.0.1:1001"\nlog_level = "warning"\ngrace_period = 3\n',
    )
    env = {"STRATAD_LISTEN": "127.0.0.1:1002", "STRATAD_LOG_LEVEL": "error"}
    flags = {"listen": "127.0.0.1:1003", "log_level": None, "grace_period": None}

    config = load_config(flags, env, path)

    assert config.listen == "127.0.0.1:1003"  # flag beats env and file
    assert config.log_level == "error"  # env beats file
    assert config.grace_period == 3.0  # file beats default
    assert config.durability == "fsync"  # default


@pytest.mark.parametrize("layer", ["file", "env", "flag"])
def test_each_layer_alone_sets_every_option(tmp_path: Path, layer: str) -> None:
    values = {
        "listen": "unix:/run/stratad.sock",
        "listen_unix": "/run/stratad/local.sock",
        "front": "python",
        "data_dir": "/var/lib/stratad",
        "log_level": "debug",
        "log_format": "json",
        "grace_period": "2.5",
        "max_message_bytes": "1024",
        "max_concurrent_rpcs": "8",
        "max_inflight_bytes": "1048576",
        "max_connections": "64",
        "max_streams_per_connection": "32",
        "connection_idle_timeout": "12.5",
        "max_header_bytes": "8192",
        "max_tenant_stored_bytes": "4096",
        "max_tenant_sessions": "3",
        "max_session_checkpoints": "7",
        "durability": "interval",
        "fsync_interval_ms": "50",
        "metrics_listen": "localhost:9090",
        "metrics_stats_interval": "5",
        "metrics_tenant_labels": "10",
        "replication": "sync",
        "remote_url": "s3://bucket/prefix",
        "replication_lag_ms": "250",
        "replication_lease_ms": "5000",
        "replication_gc_grace_seconds": "600",
        "node_id": "pod-1",
        "tls_cert_file": "/etc/stratad/tls/tls.crt",
        "tls_key_file": "/etc/stratad/tls/tls.key",
        "tls_client_ca_file": "/etc/stratad/tls/ca.crt",
        "allow_insecure": "true",
        "auth": "token_or_mtls",
        "auth_tokens_file": "/etc/stratad/auth/tokens.toml",
        "reflection": "false",
        "encryption": "on",
        "encryption_key_file": "/etc/stratad/keys/master.key",
        "encryption_old_key_files": "/etc/stratad/keys/old1.key,/etc/stratad/keys/old2.key",
        "inspector_listen": "localhost:8080",
        "session_idle_ttl": "3600",
        "lifecycle_sweep_interval": "30",
        "gc_interval": "600",
        "tracing": "console",
        "otlp_endpoint": "https://collector:4317",
        "otlp_insecure": "true",
        "trace_sample_ratio": "0.5",
        "trace_service_name": "agents",
    }
    assert set(values) == {option.name for option in OPTIONS}, "new option: add it here"
    if layer == "file":
        toml = "".join(f'{k} = "{v}"\n' for k, v in values.items() if not v[0].isdigit())
        toml += "".join(f"{k} = {v}\n" for k, v in values.items() if v[0].isdigit())
        config = load_config(config_file=write_toml(tmp_path, toml))
    elif layer == "env":
        config = load_config(environ={f"STRATAD_{k.upper()}": v for k, v in values.items()})
    else:
        config = load_config(flags=values)

    assert config == Config(
        listen="unix:/run/stratad.sock",
        listen_unix="unix:/run/stratad/local.sock",
        front="python",
        data_dir=Path("/var/lib/stratad"),
        log_level="debug",
        log_format="json",
        grace_period=2.5,
        max_message_bytes=1024,
        max_concurrent_rpcs=8,
        max_inflight_bytes=1048576,
        max_connections=64,
        max_streams_per_connection=32,
        connection_idle_timeout=12.5,
        max_header_bytes=8192,
        max_tenant_stored_bytes=4096,
        max_tenant_sessions=3,
        max_session_checkpoints=7,
        durability="interval",
        fsync_interval_ms=50,
        metrics_listen="localhost:9090",
        metrics_stats_interval=5.0,
        metrics_tenant_labels=10,
        replication="sync",
        remote_url="s3://bucket/prefix",
        replication_lag_ms=250,
        replication_lease_ms=5000,
        replication_gc_grace_seconds=600.0,
        node_id="pod-1",
        tls_cert_file="/etc/stratad/tls/tls.crt",
        tls_key_file="/etc/stratad/tls/tls.key",
        tls_client_ca_file="/etc/stratad/tls/ca.crt",
        allow_insecure=True,
        auth="token_or_mtls",
        auth_tokens_file="/etc/stratad/auth/tokens.toml",
        reflection=False,
        encryption="on",
        encryption_key_file="/etc/stratad/keys/master.key",
        encryption_old_key_files=("/etc/stratad/keys/old1.key", "/etc/stratad/keys/old2.key"),
        inspector_listen="localhost:8080",
        session_idle_ttl=3600.0,
        lifecycle_sweep_interval=30.0,
        gc_interval=600.0,
        tracing="console",
        otlp_endpoint="https://collector:4317",
        otlp_insecure=True,
        trace_sample_ratio=0.5,
        trace_service_name="agents",
    )


def test_encryption_old_keys_need_encryption_on_and_accept_a_toml_list(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs encryption = on"):
        load_config(environ={"STRATAD_ENCRYPTION_OLD_KEY_FILES": "/k/old.key"})
    path = write_toml(tmp_path, 'encryption = "on"\nencryption_old_key_files = ["/a", "/b"]\n')
    assert load_config(config_file=path).encryption_old_key_files == ("/a", "/b")


def test_replication_needs_a_remote_url() -> None:
    with pytest.raises(ConfigError, match="remote_url"):
        load_config(environ={"STRATAD_REPLICATION": "async"})


def test_config_file_from_environment(tmp_path: Path) -> None:
    path = write_toml(tmp_path, 'durability = "none"\n')
    assert load_config(environ={"STRATAD_CONFIG": str(path)}).durability == "none"


def test_explicit_config_file_beats_environment_variable(tmp_path: Path) -> None:
    env_file = write_toml(tmp_path, 'durability = "none"\n')
    flag_file = tmp_path / "other.toml"
    flag_file.write_text('durability = "interval"\n')
    config = load_config(environ={"STRATAD_CONFIG": str(env_file)}, config_file=flag_file)
    assert config.durability == "interval"


def test_unknown_key_in_file_is_an_error_naming_the_key(tmp_path: Path) -> None:
    path = write_toml(tmp_path, 'listen = "127.0.0.1:1"\nlisten_adress = "x"\n')
    with pytest.raises(ConfigError, match="listen_adress") as excinfo:
        load_config(config_file=path)
    assert str(path) in excinfo.value.message


def test_tables_in_file_are_unknown_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'server'"):
        load_config(config_file=write_toml(tmp_path, '[server]\nlisten = "127.0.0.1:1"\n'))


def test_unknown_stratad_environment_variables_are_ignored() -> None:
    # Clients share the prefix (e.g. an SDK's STRATAD_TENANT).
    assert load_config(environ={"STRATAD_TENANT": "acme"}) == Config()


def test_empty_environment_variable_means_unset() -> None:
    assert load_config(environ={"STRATAD_LISTEN": ""}).listen == "127.0.0.1:50051"


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(config_file=tmp_path / "absent.toml")


def test_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(config_file=write_toml(tmp_path, "listen = \n"))


def test_config_error_is_an_invalid_argument_error() -> None:
    assert issubclass(ConfigError, InvalidArgumentError)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("listen", "localhost"),
        ("listen", ":50051"),
        ("listen", "127.0.0.1:65536"),
        ("listen", "127.0.0.1:-1"),
        ("listen", "127.0.0.1:http"),
        ("listen", "::1:50051"),
        ("listen", "unix:"),
        ("log_level", "loud"),
        ("log_format", "xml"),
        ("grace_period", "-1"),
        ("grace_period", "nan"),
        ("grace_period", "inf"),
        ("grace_period", "soon"),
        ("max_message_bytes", "0"),
        ("max_message_bytes", str(2**31)),
        ("max_message_bytes", "1.5"),
        ("max_concurrent_rpcs", "-1"),
        ("durability", "sometimes"),
        ("fsync_interval_ms", "0"),
        ("listen_unix", "unix:"),
        ("listen_unix", "/"),
        ("metrics_listen", "9464"),
        ("metrics_listen", "unix:/tmp/m.sock"),
        ("metrics_listen", "127.0.0.1:99999"),
        ("metrics_stats_interval", "-1"),
        ("allow_insecure", "maybe"),
        ("reflection", "2"),
        ("auth", "password"),
        ("session_idle_ttl", "-1"),
        ("session_idle_ttl", "5y"),
        ("session_idle_ttl", "soon"),
        ("gc_interval", "nan"),
        ("lifecycle_sweep_interval", "0"),
    ],
)
@pytest.mark.parametrize("layer", ["flag", "env", "file"])
def test_invalid_values_name_the_key_and_source(
    tmp_path: Path, layer: str, key: str, value: str
) -> None:
    flags: dict[str, object | None] = {}
    environ: dict[str, str] = {}
    path: Path | None = None
    if layer == "flag":
        flags, source = {key: value}, f"--{key.replace('_', '-')}"
    elif layer == "env":
        source = f"STRATAD_{key.upper()}"
        environ = {source: value}
    else:
        path = write_toml(tmp_path, f"{key} = {value!r}\n")
        source = str(path)
    with pytest.raises(ConfigError) as excinfo:
        load_config(flags, environ, path)
    assert key in excinfo.value.message
    assert source in excinfo.value.message


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("grace_period = true", "grace_period"),
        ("max_message_bytes = 1.5", "max_message_bytes"),
        ("listen = 50051", "listen"),
        ("data_dir = []", "data_dir"),
    ],
)
def test_wrongly_typed_toml_values(tmp_path: Path, toml: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        load_config(config_file=write_toml(tmp_path, toml + "\n"))


@pytest.mark.parametrize(
    "listen",
    ["127.0.0.1:0", "0.0.0.0:65535", "[::1]:50051", "[::]:0", "localhost:50051", "unix:/tmp/s"],
)
def test_valid_listen_addresses(listen: str) -> None:
    flags = {"listen": listen, "allow_insecure": "true"}
    assert load_config(flags=flags).listen == listen


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [("0", 0.0), ("off", 0.0), ("90", 90.0), ("90s", 90.0), ("30m", 1800.0),
     ("1.5h", 5400.0), ("7d", 604800.0), (" 12H ", 43200.0)],
)  # fmt: skip
def test_durations_take_a_unit(raw: str, seconds: float) -> None:
    assert load_config(flags={"session_idle_ttl": raw}).session_idle_ttl == seconds
    assert load_config(environ={"STRATAD_GC_INTERVAL": raw}).gc_interval == seconds


def test_durations_in_toml_are_numbers_or_strings(tmp_path: Path) -> None:
    path = write_toml(tmp_path, 'session_idle_ttl = "2d"\ngc_interval = 3600\n')
    config = load_config(config_file=path)
    assert (config.session_idle_ttl, config.gc_interval) == (172800.0, 3600.0)


def test_choices_are_case_insensitive() -> None:
    assert load_config(environ={"STRATAD_LOG_LEVEL": "DEBUG"}).log_level == "debug"


def test_toml_integer_for_float_option(tmp_path: Path) -> None:
    assert load_config(config_file=write_toml(tmp_path, "grace_period = 5\n")).grace_period == 5.0


def test_direct_construction_is_validated_too() -> None:
    with pytest.raises(ConfigError, match="fsync_interval_ms"):
        Config(fsync_interval_ms=0)
    assert Config(data_dir="/x").data_dir == Path("/x")  # type: ignore[arg-type]


def test_empty_data_dir_is_invalid(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="data_dir"):
        load_config(flags={"data_dir": ""})
    with pytest.raises(ConfigError, match="data_dir"):
        load_config(config_file=write_toml(tmp_path, 'data_dir = ""\n'))


def test_unknown_flag_name_is_rejected() -> None:
    with pytest.raises(ConfigError, match="bogus"):
        load_config(flags={"bogus": "1"})


@pytest.mark.parametrize("off", ["", "off", "OFF", "none"])
def test_optional_listeners_can_be_turned_off(off: str) -> None:
    config = load_config({"metrics_listen": off, "listen_unix": off})
    assert config.metrics_listen == ""
    assert config.listen_unix == ""


def test_off_through_the_environment() -> None:
    # An empty variable means "not set", so the environment says "off".
    env = {"STRATAD_METRICS_LISTEN": "off"}
    assert load_config(environ=env).metrics_listen == ""
    assert load_config(environ={"STRATAD_METRICS_LISTEN": ""}).metrics_listen == "127.0.0.1:9464"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("/run/stratad/s.sock", "unix:/run/stratad/s.sock"),
        ("unix:/run/s.sock", "unix:/run/s.sock"),
        ("unix:///run/s.sock", "unix:/run/s.sock"),
        ("relative.sock", "unix:relative.sock"),
    ],
)
def test_listen_unix_is_normalized_to_a_unix_address(raw: str, expected: str) -> None:
    assert load_config({"listen_unix": raw}).listen_unix == expected
    assert Config(listen_unix=expected).listen_unix == expected  # idempotent


# --- TLS, auth and plaintext exposure ---------------------------------------------------


@pytest.mark.parametrize("listen", ["0.0.0.0:50051", "[::]:50051", "10.1.2.3:1", "stratad:50051"])
def test_plaintext_beyond_loopback_needs_allow_insecure(listen: str) -> None:
    with pytest.raises(ConfigError, match="allow_insecure") as excinfo:
        load_config(flags={"listen": listen})
    assert listen in excinfo.value.message
    assert load_config(flags={"listen": listen, "allow_insecure": "yes"}).plaintext_exposed
    tls = {"tls_cert_file": "/c.pem", "tls_key_file": "/k.pem"}
    assert not load_config(flags={"listen": listen, **tls}).plaintext_exposed


@pytest.mark.parametrize(
    "listen", ["127.0.0.1:50051", "127.9.9.9:1", "[::1]:50051", "localhost:50051", "unix:/s"]
)
def test_plaintext_on_loopback_and_unix_sockets_is_the_default(listen: str) -> None:
    assert not load_config(flags={"listen": listen}).plaintext_exposed


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"tls_cert_file": "/c.pem"}, "tls_key_file"),
        ({"tls_key_file": "/k.pem"}, "tls_cert_file"),
        ({"tls_client_ca_file": "/ca.pem"}, "tls_cert_file"),
        ({"auth": "token"}, "auth_tokens_file"),
        ({"auth": "mtls", "auth_tokens_file": "/t.toml"}, "tls_client_ca_file"),
        ({"auth": "token_or_mtls", "auth_tokens_file": "/t.toml"}, "tls_client_ca_file"),
    ],
)
def test_security_keys_that_need_each_other(fields: dict[str, str], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        Config(**fields)  # type: ignore[arg-type]


def test_security_defaults() -> None:
    config = Config()
    assert (config.tls, config.auth, config.allow_insecure, config.reflection) == (
        False,
        "off",
        False,
        True,
    )
    assert Config(tls_cert_file="off", auth_tokens_file="none").tls_cert_file == ""
