"""``stratad mcp``: the command line of the MCP server.

    stratad mcp [--address ADDR] [--tenant T] [--token-file F] [--tls ...]      (stdio)
    stratad mcp --transport http [--listen 127.0.0.1:8765] [--path /mcp]
                [--http-auth bearer] [--http-tls-cert F --http-tls-key F]

`add_mcp_parser` adds the subcommand to the ``stratad`` parser and `run_mcp`
runs it. This module only builds the parser (``stratad --version`` stays
fast); the server (stratad.mcp.server, the MCP SDK) is imported when it runs.

The daemon connection options are the SDK's and ``stratad ctl``'s: flags first,
then STRATAD_ADDRESS, STRATAD_TENANT, STRATAD_TOKEN / STRATAD_TOKEN_FILE,
STRATAD_TLS, STRATAD_TLS_CA, STRATAD_TLS_CERT, STRATAD_TLS_KEY,
STRATAD_TLS_SERVER_NAME (`stratad.sdk.connection`).

Streamable HTTP listens on loopback unless it has TLS (``--http-tls-cert`` and
``--http-tls-key``) and authentication (``--http-auth bearer``), the rule of
the daemon's own port; ``--allow-insecure`` overrides it for a network that
is otherwise closed.

Exit codes: 0 after a clean shutdown, 1 when it cannot start (the address is
taken), 2 for usage and configuration errors (including the refusals above).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from stratad.sdk.constants import (
    ADDRESS_ENV,
    DEFAULT_ADDRESS,
    TENANT_ENV,
    TLS_CA_ENV,
    TLS_CERT_ENV,
    TLS_ENV,
    TLS_KEY_ENV,
    TLS_SERVER_NAME_ENV,
    TOKEN_ENV,
    TOKEN_FILE_ENV,
)

EXIT_OK = 0
EXIT_START_FAILED = 1
EXIT_USAGE = 2

DEFAULT_LISTEN = "127.0.0.1:8765"
DEFAULT_PATH = "/mcp"
#: tools.DEFAULT_MAX_STATE_BYTES, not imported: the parser stays light.
DEFAULT_MAX_STATE_BYTES = 1 << 20

DESCRIPTION = """\
Serve the daemon's state to AI agents over the Model Context Protocol: tools (cognitive \
state, crystals, checkpoints, tasks), resources (a session's persistent context, cognitive \
state, open errors, checkpoints) with change notifications, and the crystal prompt \
'similar_past_success'. Over stdio (an MCP host starts this command) or streamable HTTP \
(--transport http). The tenant and token come from the options below (stdio, HTTP without \
auth) or from each HTTP request's Authorization: Bearer token (--http-auth bearer), never \
from a tool argument. See docs/mcp.md."""


def add_mcp_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``mcp`` and its options to the ``stratad`` subcommands."""
    parser = commands.add_parser(
        "mcp",
        help="serve the daemon's state to AI agents over MCP (stdio or streamable HTTP)",
        description=DESCRIPTION,
    )
    add_arguments(parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    serving = parser.add_argument_group("serving")
    serving.add_argument(
        "--transport",
        choices=("stdio", "http"),
        default="stdio",
        help="stdio: one client on stdin/stdout (an MCP host runs this command); http: "
        "streamable HTTP at --listen (default: stdio)",
    )
    serving.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"HTTP: the address to listen on; anything but loopback needs --http-tls-cert, "
        f"--http-tls-key and --http-auth bearer (default: {DEFAULT_LISTEN})",
    )
    serving.add_argument(
        "--path",
        default=DEFAULT_PATH,
        help=f"HTTP: the endpoint's path (default: {DEFAULT_PATH})",
    )
    serving.add_argument(
        "--http-auth",
        choices=("none", "bearer"),
        default="none",
        help="HTTP: 'bearer' requires an Authorization: Bearer token on every request, checks "
        "it with the daemon and acts with it (the daemon's tenants and roles apply; an "
        "X-Stratad-Tenant header may name the tenant); 'none' acts with --tenant and the "
        "configured token (default: none)",
    )
    serving.add_argument(
        "--http-tls-cert",
        default="",
        metavar="FILE",
        help="HTTP: serve TLS with this certificate chain (PEM)",
    )
    serving.add_argument(
        "--http-tls-key",
        default="",
        metavar="FILE",
        help="HTTP: the certificate's private key (PEM)",
    )
    serving.add_argument(
        "--allow-insecure",
        action="store_true",
        help="HTTP: listen beyond loopback without TLS and authentication (a network that is "
        "otherwise closed, e.g. a pod behind a NetworkPolicy); logs a warning",
    )
    serving.add_argument(
        "--max-state-bytes",
        type=_positive_int,
        default=DEFAULT_MAX_STATE_BYTES,
        metavar="N",
        help="the largest checkpoint state passed through MCP, saved or loaded (default: "
        "%(default)s, 1 MiB)",
    )
    serving.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="warning",
        help="log level on stderr (default: warning)",
    )
    daemon = parser.add_argument_group("the daemon (flags, else the STRATAD_* variables)")
    daemon.add_argument(
        "--address",
        default=None,
        metavar="ADDR",
        help=f"the daemon: HOST:PORT or unix:/path (env: {ADDRESS_ENV}; "
        f"default: {DEFAULT_ADDRESS})",
    )
    daemon.add_argument(
        "--tenant",
        default=None,
        help=f"act in this tenant (env: {TENANT_ENV}; default: the daemon's 'default', or with "
        "auth on the token's own tenant); not used with --http-auth bearer",
    )
    daemon.add_argument(
        "--token-file",
        default=None,
        metavar="FILE",
        help=f"read the daemon token from FILE (env: {TOKEN_FILE_ENV}, or the token itself in "
        f"{TOKEN_ENV}); not used with --http-auth bearer",
    )
    daemon.add_argument(
        "--tls",
        action="store_true",
        default=None,
        help="connect to the daemon with TLS, trusting the system's CAs unless --tls-ca "
        f"(env: {TLS_ENV})",
    )
    for flag, env, text in (
        ("--tls-ca", TLS_CA_ENV, "PEM CA file that signed the daemon's certificate"),
        ("--tls-cert", TLS_CERT_ENV, "client certificate (PEM) for mTLS to the daemon"),
        ("--tls-key", TLS_KEY_ENV, "the client certificate's key (PEM)"),
        (
            "--tls-server-name",
            TLS_SERVER_NAME_ENV,
            "name to verify the daemon's certificate for, if not the host dialed",
        ),
    ):
        daemon.add_argument(
            flag,
            default=None,
            metavar="NAME" if "name" in flag else "FILE",
            help=f"{text}; implies --tls (env: {env})",
        )
    daemon.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="deadline of each call to the daemon (default: 30)",
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


class ConfigError(Exception):
    """What is wrong with the options (exit code 2)."""


def settings_of(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Any:
    """The server's `Settings` for these options (the environment fills in the rest)."""
    from stratad.mcp.server import Settings
    from stratad.mcp.tools import Limits
    from stratad.sdk.connection import Connection, TLSConfig

    env = dict(os.environ if environ is None else environ)
    tls: TLSConfig | bool | None = args.tls
    try:
        if any((args.tls_ca, args.tls_cert, args.tls_key, args.tls_server_name)):
            base = TLSConfig.from_env(env) or TLSConfig()
            tls = TLSConfig(
                args.tls_ca or base.ca_file,
                args.tls_cert or base.cert_file,
                args.tls_key or base.key_file,
                args.tls_server_name or base.server_name,
            )
        token = Path(args.token_file).read_text().strip() if args.token_file else None
        connection = Connection.resolve(
            args.address, tenant=args.tenant, token=token, tls=tls, environ=env
        )
    except (OSError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    if connection.tenant:
        from stratad.errors import InvalidArgumentError
        from stratad.ids import validate_id

        try:
            validate_id(connection.tenant, "tenant")
        except InvalidArgumentError as exc:
            raise ConfigError(exc.message) from None
    if args.http_auth == "bearer":
        # The caller's credentials replace the server's own: never mix them.
        connection = Connection(connection.address, tls=connection.tls)
    if not args.timeout > 0:
        raise ConfigError("--timeout must be positive")
    return Settings(
        connection=connection,
        timeout=args.timeout,
        limits=Limits(max_state_bytes=args.max_state_bytes),
        http_auth=args.http_auth,
    )


def http_settings_of(args: argparse.Namespace) -> Any:
    """The HTTP listener for these options; ConfigError when it may not start."""
    from stratad.config import is_loopback
    from stratad.mcp.server import HttpSettings

    host, sep, port_text = args.listen.rpartition(":")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(f"--listen {args.listen!r}: expected HOST:PORT, e.g. {DEFAULT_LISTEN}")
    if bool(args.http_tls_cert) != bool(args.http_tls_key):
        raise ConfigError("TLS needs both --http-tls-cert and --http-tls-key")
    if args.http_tls_cert:
        _check_tls_files(args.http_tls_cert, args.http_tls_key)
    if not args.path.startswith("/"):
        raise ConfigError(f"--path {args.path!r} must start with /")
    tls = bool(args.http_tls_cert)
    auth = args.http_auth == "bearer"
    if not is_loopback(args.listen) and not (tls and auth):
        missing = " and ".join(
            what
            for what, have in (
                ("TLS (--http-tls-cert, --http-tls-key)", tls),
                ("authentication (--http-auth bearer)", auth),
            )
            if not have
        )
        if not args.allow_insecure:
            raise ConfigError(
                f"--listen {args.listen} would serve MCP beyond this host without {missing}: "
                "anyone who reaches the port could read and change the daemon's state. Listen "
                f"on 127.0.0.1, add {missing}, or give --allow-insecure if the network is "
                "otherwise closed"
            )
        logging.getLogger("stratad.mcp").warning(
            "serving MCP on %s without %s (--allow-insecure)", args.listen, missing
        )
    return HttpSettings(
        host=host.removeprefix("[").removesuffix("]"),
        port=int(port_text),
        path=args.path,
        tls_cert=args.http_tls_cert,
        tls_key=args.http_tls_key,
        log_level=args.log_level,
    )


def _check_stdio(args: argparse.Namespace) -> None:
    """Refuse HTTP-only options on stdio rather than ignore them."""
    http_only = [
        flag
        for flag, given in (
            ("--http-auth bearer", args.http_auth != "none"),
            ("--http-tls-cert", bool(args.http_tls_cert)),
            ("--http-tls-key", bool(args.http_tls_key)),
            ("--allow-insecure", args.allow_insecure),
            ("--listen", args.listen != DEFAULT_LISTEN),
            ("--path", args.path != DEFAULT_PATH),
        )
        if given
    ]
    if http_only:
        raise ConfigError(f"{', '.join(http_only)}: only with --transport http")


def _check_tls_files(cert: str, key: str) -> None:
    import ssl

    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"cannot use --http-tls-cert {cert} / --http-tls-key {key}: {exc}"
        ) from None


def run_mcp(args: argparse.Namespace) -> int:
    """Run ``stratad mcp`` as parsed by `add_mcp_parser`; returns the exit code."""
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        from stratad.mcp import server
    except ImportError as exc:  # the mcp extra is not installed
        return _fail(
            f"the MCP SDK is not installed ({exc}): pip install 'stratad[mcp]'", EXIT_USAGE
        )
    _stop_on_sigterm()
    try:
        if args.transport == "stdio":
            _check_stdio(args)
        settings = settings_of(args)
        if args.transport == "stdio":
            server.run_stdio(settings)
            return EXIT_OK
        http = http_settings_of(args)
        server.run_http(settings, http)
    except ConfigError as exc:
        return _fail(f"config error: {exc}", EXIT_USAGE)
    except server.StartError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except KeyboardInterrupt:
        return EXIT_OK
    except SystemExit as exc:  # uvicorn exits when it cannot start (the address is taken)
        if exc.code in (None, 0):
            return EXIT_OK
        return _fail(f"cannot serve on {args.listen} (the error is above)", EXIT_START_FAILED)
    return EXIT_OK


def _stop_on_sigterm() -> None:
    """SIGTERM stops the server as Ctrl-C does (exit 0): uvicorn handles both while it
    serves, then raises the signal again, which lands here instead of killing."""
    import signal
    import threading

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)


def _fail(message: str, code: int) -> int:
    print(f"stratad mcp: {message}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    """``python -m stratad.mcp``: the same command without the ``stratad`` in front."""
    parser = argparse.ArgumentParser(prog="stratad mcp", description=DESCRIPTION)
    add_arguments(parser)
    return run_mcp(parser.parse_args(argv))


__all__ = ["add_mcp_parser", "main", "run_mcp"]
