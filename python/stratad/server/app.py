"""Build, run and gracefully stop the stratad gRPC server.

`start_server` is generic: it serves whatever `registry.SERVICES` lists, plus
the standard health service and server reflection. `serve` is the daemon's
lifetime: open resources, start, wait for SIGTERM/SIGINT, drain, release.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import signal
import socket
import stat
import sys
from asyncio import FIRST_COMPLETED
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from stratad import __version__, tracing
from stratad.config import Config
from stratad.domain.lifecycle import Lifecycle
from stratad.errors import UnavailableError
from stratad.server import reflection
from stratad.server.auth import auth_interceptor
from stratad.server.front import EdgeLimits, FrontDoor, MethodRecorder, start_front
from stratad.server.inspector import Inspector, start_inspector
from stratad.server.interceptors import CallObserver, ErrorInterceptor, RequestInterceptor
from stratad.server.limits import LimitsInterceptor
from stratad.server.metrics import Metrics
from stratad.server.registry import SERVICES, Resources, ServiceRegistration, open_resources
from stratad.server.tls import CertificateFiles, certificate_files
from stratad.store.failstop import EXIT_STORAGE_FAILED, StorageFailedError

_log = logging.getLogger(__name__)

HEALTH_SERVICE_NAME: str = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
#: Server reflection is served under both names (server/reflection.py).
REFLECTION_SERVICE_NAME: str = reflection.V1ALPHA_SERVICE_NAME
REFLECTION_V1_SERVICE_NAME: str = reflection.V1_SERVICE_NAME
#: Health "service" that is SERVING while the daemon accepts writes.
WRITES_HEALTH_NAME = "stratad.writes"
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class HealthServicer(health_aio.HealthServicer):  # type: ignore[misc]
    """grpc.health.v1.Health with List, which grpcio's asyncio servicer leaves
    unimplemented: the status of every service, in one answer."""

    async def List(
        self, request: health_pb2.HealthListRequest, context: Any
    ) -> health_pb2.HealthListResponse:
        statuses = {
            name: health_pb2.HealthCheckResponse(status=status)
            for name, status in self._server_status.items()
        }
        return health_pb2.HealthListResponse(statuses=statuses)


class ServerStartError(UnavailableError):
    """The server could not start, e.g. its listen address is taken."""


class StratadServer:
    """A started server: where it listens and how to stop it."""

    def __init__(
        self,
        server: Any,
        health: health_aio.HealthServicer,
        resources: Resources,
        address: str,
        service_names: Sequence[str],
        *,
        addresses: Sequence[str] = (),
        metrics: Metrics | None = None,
        tls: CertificateFiles | None = None,
        inspector: Inspector | None = None,
        lifecycle: Lifecycle | None = None,
        front: FrontDoor | None = None,
    ) -> None:
        #: The grpc.aio server (None: the native front door serves every listener).
        self._server = server
        #: The native front door serving every listener (None: grpc.aio serves them).
        self.front = front
        #: The health servicer, for code that must change a service's status.
        self.health = health
        self._resources = resources
        #: The address clients dial: the listen address with the real port.
        self.address = address
        #: Every service served: the application services, health, reflection if on.
        self.service_names = tuple(service_names)
        #: Every address served: `address`, then the unix socket (listen_unix) if any.
        self.addresses = tuple(addresses) or (address,)
        #: The Prometheus metrics (None when metrics_listen is off).
        self.metrics = metrics
        #: The TLS files of the TCP listener (None: plaintext).
        self.tls = tls
        #: The web inspector (None when inspector_listen is off).
        self.inspector = inspector
        #: The idle-session sweep and scheduled GC (see domain/lifecycle.py).
        self.lifecycle = lifecycle
        self._on_stop: list[Callable[[], None]] = []

    @property
    def tls_reloads(self) -> int:
        """How many times changed TLS files reached new connections."""
        if self.front is not None:
            return self.front.tls_reloads
        return self.tls.reloads if self.tls is not None else 0

    @property
    def metrics_address(self) -> str:
        """HOST:PORT of the /metrics endpoint, "" when it is off."""
        return self.metrics.address if self.metrics is not None else ""

    @property
    def inspector_address(self) -> str:
        """HOST:PORT of the web inspector, "" when it is off."""
        return self.inspector.address if self.inspector is not None else ""

    async def stop(self, grace: float | None) -> None:
        """Report NOT_SERVING, refuse new calls, let in-flight ones finish for ``grace`` s."""
        # Health first, so that clients and probes stop sending work before the
        # listener closes; watchers and long streams are told via `stopping`.
        await self.health.enter_graceful_shutdown()
        self._resources.stopping.set()
        if self.lifecycle is not None:  # no expiry or GC starts while we drain
            await asyncio.to_thread(self.lifecycle.stop)
        try:
            if self.front is not None:
                await self.front.stop(grace)
            if self._server is not None:
                await self._server.stop(grace)
        finally:
            if self.metrics is not None:
                self.metrics.stop()
            if self.inspector is not None:
                await self.inspector.stop()
            for release in self._on_stop:
                release()
            self._on_stop.clear()

    def on_stop(self, release: Callable[[], None]) -> None:
        """Call ``release`` once the server has stopped (after the metrics endpoint)."""
        self._on_stop.append(release)


async def start_server(
    resources: Resources,
    services: Iterable[ServiceRegistration] = SERVICES,
    *,
    tracer_provider: Any = None,
) -> StratadServer:
    """Build the server, bind it, start it and report every service SERVING.

    Traces with ``tracer_provider`` (an OpenTelemetry SDK TracerProvider the
    caller owns, e.g. a test's) if given, else with the one the config's
    ``tracing`` asks for, which the server shuts down when it stops.
    """
    own_provider = (
        tracing.provider_from_config(resources.config) if tracer_provider is None else None
    )
    provider = tracer_provider or own_provider
    # Tracing before everything: the SERVER span covers the whole call, and
    # everything after it logs and records errors with the span current.
    traced = [_tracing_interceptor(provider)] if provider is not None else []
    try:
        server = await _start(resources, services, traced)
    except BaseException:
        _stop_tracing(bool(traced), own_provider)
        raise
    server.on_stop(lambda: _stop_tracing(bool(traced), own_provider))
    return server


def _tracing_interceptor(provider: Any) -> Any:
    # Imported only when tracing is on: it needs the otel extra.
    from stratad.server.tracing import install

    return install(provider)


def _stop_tracing(installed: bool, own_provider: Any) -> None:
    if installed:
        tracing.uninstall()
    if own_provider is not None:
        tracing.shutdown(own_provider)  # exports the spans still batched


async def _start(
    resources: Resources, services: Iterable[ServiceRegistration], first: list[Any]
) -> StratadServer:
    """`start_server` with ``first`` the interceptors to install before the others."""
    config = resources.config
    metrics = (
        Metrics(
            resources.engine,
            resources.data_dir.path,
            config.metrics_stats_interval,
            tenant_labels=config.metrics_tenant_labels,
        )
        if config.metrics_listen
        else None
    )
    observers: list[CallObserver] = [metrics] if metrics is not None else []
    # The budget first: a request it refuses is never decoded. Then requests:
    # RequestInterceptor sees the status ErrorInterceptor made of an exception.
    limits = [LimitsInterceptor(resources.budget)] if resources.budget is not None else []
    # Auth after errors: a refusal is an exception that becomes its status.
    interceptors = [
        *first,
        *limits,
        RequestInterceptor(observers),
        ErrorInterceptor(),
        auth_interceptor(config.auth, config.auth_tokens_file),
    ]
    listen = [config.listen, *([config.listen_unix] if config.listen_unix else [])]
    # The native front door serves every listener (TCP plaintext or TLS, unix
    # sockets); grpc.aio serves them only with front = python, else there is no
    # grpc.aio server: the recorder only notes the handlers (server/front.py).
    native = [a for a in listen if config.native_front]
    served_by_aio = [a for a in listen if a not in native]
    server = _grpc_aio_server(config, interceptors) if served_by_aio else None
    recorder = MethodRecorder(server)
    app_names = [_add_service(registration, resources, recorder) for registration in services]
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, recorder)
    all_names = [*app_names, HEALTH_SERVICE_NAME]
    if config.reflection:
        all_names.extend(reflection.SERVICE_NAMES)
        reflection.enable_server_reflection(all_names, recorder)
    if native and (generic_only := recorder.generic_only()):
        raise ServerStartError(
            f"{', '.join(generic_only)}: added with add_generic_rpc_handlers only; the native "
            "front door serves services added with add_registered_method_handlers too, "
            "as generated add_*_to_server functions do"
        )
    tls = certificate_files(config)
    bound = {address: _bind(server, address, tls) for address in served_by_aio}
    _warn_if_exposed(config)
    _warn_if_unguarded(config)
    if metrics is not None:
        metrics.start(config.metrics_listen)
    inspector: Inspector | None = None
    # HealthServicer starts with "" SERVING: nothing is ready until start() returns.
    await _set_status(health, ["", *app_names], _NOT_SERVING)
    front: FrontDoor | None = None
    try:
        if config.inspector_listen:
            inspector = await start_inspector(resources)
        if server is not None:
            await server.start()
        if native:
            for address in native:
                if address.startswith("unix:"):
                    _clear_unix_socket(address)
            front = _start_front(config, native, recorder, interceptors, tls)
            bound.update(zip(native, map(_served_address, native, front.ports), strict=True))
    except BaseException:
        if metrics is not None:
            metrics.stop()
        if inspector is not None:
            await inspector.stop()
        if server is not None:
            await server.stop(None)
        raise
    addresses = [bound[address] for address in listen]
    await _set_status(health, ["", *app_names], _SERVING)
    await _report_writes(health, resources)
    # Domains that hold a lock across fsyncs wait for the loop first (Runner.attach).
    resources.runner.attach(asyncio.get_running_loop())
    lifecycle = _start_lifecycle(resources, metrics)
    stratad_server = StratadServer(
        server,
        health,
        resources,
        addresses[0],
        all_names,
        addresses=addresses,
        front=front,
        metrics=metrics,
        tls=tls,
        inspector=inspector,
        lifecycle=lifecycle,
    )
    stratad_server.on_stop(resources.runner.detach)
    for address in native:
        if address.startswith("unix:"):
            stratad_server.on_stop(_unix_socket_remover(address))
    return stratad_server


def _grpc_aio_server(config: Config, interceptors: list[Any]) -> Any:
    return grpc.aio.server(
        interceptors=interceptors,
        options=server_options(config),
        maximum_concurrent_rpcs=config.max_concurrent_rpcs or None,
    )


def _start_front(
    config: Config,
    listen: list[str],
    recorder: MethodRecorder,
    interceptors: list[Any],
    tls: CertificateFiles | None,
) -> FrontDoor:
    try:
        return start_front(
            listen,
            recorder.handlers,
            interceptors,
            max_message_bytes=config.max_message_bytes + MESSAGE_HEADROOM_BYTES,
            max_concurrent_calls=config.max_concurrent_rpcs,
            limits=edge_limits(config),
            tls=tls,
        )
    except OSError as exc:
        raise ServerStartError(str(exc)) from None


#: Descriptors kept for the store (journals, objects, packs) and the rest of
#: the daemon, whatever the connections take.
RESERVED_DESCRIPTORS = 256


def edge_limits(config: Config) -> EdgeLimits:
    """The front door's limits: the config's, with connections also held to
    half of what RLIMIT_NOFILE leaves after RESERVED_DESCRIPTORS, so that
    connections alone can never exhaust descriptors the store needs."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    by_descriptors = max(16, (soft - RESERVED_DESCRIPTORS) // 2)
    configured = config.max_connections or by_descriptors
    return EdgeLimits(
        max_connections=min(configured, by_descriptors),
        max_streams_per_connection=config.max_streams_per_connection,
        idle_timeout=config.connection_idle_timeout,
        max_header_bytes=config.max_header_bytes,
        # Answers get a budget of the same size as requests (their own count).
        max_answer_bytes=config.max_inflight_bytes,
    )


def _served_address(listen: str, port: int) -> str:
    """The address clients dial: ``listen`` with the port actually bound."""
    if listen.startswith("unix:"):
        return listen
    return f"{listen.rpartition(':')[0]}:{port}"


def _start_lifecycle(resources: Resources, metrics: Metrics | None) -> Lifecycle | None:
    """The idle-session sweep and scheduled GC, if the configuration turns either on."""
    config = resources.config
    engine = resources.engine
    lifecycle = Lifecycle(
        engine.sessions,
        engine.admin,
        idle_ttl=config.session_idle_ttl,
        sweep_interval=config.lifecycle_sweep_interval,
        gc_interval=config.gc_interval,
    )
    if not lifecycle.enabled:
        return None
    if metrics is not None:
        lifecycle.observers.append(metrics)
    lifecycle.start()
    return lifecycle


#: Room on top of max_message_bytes for a message's envelope: a state of the
#: maximum size comes with metadata (up to 1 MiB) and other fields. The
#: state-size limit itself is enforced by the domain, with a message naming it,
#: and per item in a SaveStates stream.
MESSAGE_HEADROOM_BYTES = 4 << 20


def server_options(config: Config) -> list[tuple[str, int]]:
    transport_limit = config.max_message_bytes + MESSAGE_HEADROOM_BYTES
    return [
        ("grpc.max_send_message_length", transport_limit),
        ("grpc.max_receive_message_length", transport_limit),
        # gRPC sets SO_REUSEPORT by default, which lets a second daemon bind
        # the same port and silently share its traffic. One port, one daemon.
        ("grpc.so_reuseport", 0),
    ]


def _add_service(
    registration: ServiceRegistration, resources: Resources, recorder: MethodRecorder
) -> str:
    registration.add_fn(registration.servicer_factory(resources), recorder)
    return registration.name


def _bind(server: Any, listen: str, tls: CertificateFiles | None) -> str:
    """Listen on ``listen``: TLS on TCP when configured; a unix socket is always plaintext
    (who may connect is a matter of its file permissions)."""
    unix = listen.startswith("unix:")
    if unix:
        _refuse_live_unix_socket(listen)
    try:
        if tls is not None and not unix:
            port = server.add_secure_port(listen, tls.credentials())
        else:
            port = server.add_insecure_port(listen)
    except RuntimeError as exc:
        raise ServerStartError(f"cannot listen on {listen}: {exc}") from None
    if listen.startswith("unix:"):
        return listen
    host = listen.rpartition(":")[0]
    return f"{host}:{port}"


def _warn_if_unguarded(config: Config) -> None:
    if not config.native_front:
        _log.warning(
            "front = python: grpc.aio serves every listener, without the edge limits of "
            "docs/security.md (connection cap, idle and handshake timeouts, answers in flight, "
            "flood defences): one misbehaving client can stall the daemon for all. It is kept "
            "to compare against (bench/front.py), not for serving agents: use front = auto"
        )


def _warn_if_exposed(config: Config) -> None:
    # Config refuses this unless allow_insecure is set; say so at every start anyway.
    if config.plaintext_exposed:
        open_to_all = (
            ", and with auth off anyone who reaches it can read and change every tenant's state"
        )
        _log.warning(
            "serving plaintext gRPC on %s (allow_insecure = true): states and tokens "
            "cross the network unencrypted%s; see docs/security.md",
            config.listen,
            open_to_all if config.auth == "off" else "",
        )


def _unix_path(listen: str) -> str:
    path = listen.removeprefix("unix:")
    return path[2:] if path.startswith("//") else path  # unix:///abs/path


def _clear_unix_socket(listen: str) -> None:
    """Remove the socket a daemon that is gone left at ``listen``'s path (as
    gRPC does before binding), after making sure no daemon serves on it; any
    other kind of file stays, and binding then fails naming the path."""
    _refuse_live_unix_socket(listen)
    path = _unix_path(listen)
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)


def _unix_socket_remover(listen: str) -> Callable[[], None]:
    """What removes the socket file the front door bound at ``listen`` once the
    daemon stops (as grpc.aio did), unless another file has taken its place."""
    path = _unix_path(listen)
    bound = os.stat(path).st_ino

    def remove() -> None:
        with contextlib.suppress(FileNotFoundError):
            if os.lstat(path).st_ino == bound:
                os.unlink(path)

    return remove


def _refuse_live_unix_socket(listen: str) -> None:
    # gRPC unlinks whatever sits at a unix socket path before binding, which
    # would silently steal the socket of a daemon still running there.
    path = _unix_path(listen)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:  # missing, stale or not a socket: gRPC may replace it
            return
    raise ServerStartError(f"cannot listen on {listen}: another process is serving on it")


async def _report_writes(health: health_aio.HealthServicer, resources: Resources) -> None:
    """Health of WRITES_HEALTH_NAME: NOT_SERVING while the store is read-only.

    A daemon that started on a full disk serves reads (every service stays
    SERVING) but refuses writes until space returns; this name tells probes
    and clients which.
    """
    loop = asyncio.get_running_loop()
    store = resources.engine.store

    def changed(writable: bool) -> None:
        status = _SERVING if writable else _NOT_SERVING
        loop.call_soon_threadsafe(lambda: loop.create_task(health.set(WRITES_HEALTH_NAME, status)))

    store.on_writable_change(changed)
    await health.set(WRITES_HEALTH_NAME, _NOT_SERVING if store.read_only else _SERVING)


async def _set_status(health: health_aio.HealthServicer, names: Iterable[str], status: int) -> None:
    for name in names:
        await health.set(name, status)


# --- the daemon's lifetime ------------------------------------------------------


#: How long a thread may hold the GIL while another waits for it. Python's
#: default, 5 ms, is longer than a whole save: the thread that finished an
#: fsync (or gRPC's own threads) would wait that long to hand the result to
#: the event loop. Measured: a 3 KB save with fsync took 3.6 ms at 5 ms and
#: about a third of that at this setting.
GIL_SWITCH_INTERVAL = 0.0005


async def serve(config: Config) -> int:
    """Run the daemon until SIGTERM or SIGINT, then shut down gracefully; exit code."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL)
    stop_requested = _install_signal_handlers()
    async with open_resources(config) as resources:
        server = await start_server(resources)
        _log.info(
            "stratad %s serving on %s (front %s, data dir %s, durability %s, metrics %s, "
            "inspector %s, tracing %s)",
            __version__,
            " and ".join(server.addresses),
            "native" if server.front is not None else "python (grpc.aio)",
            resources.data_dir.path,
            config.durability,
            f"http://{server.metrics_address}/metrics" if server.metrics_address else "off",
            f"http://{server.inspector_address}/" if server.inspector_address else "off",
            config.tracing,
        )
        storage_failed = _storage_failure(resources)
        try:
            either: set[asyncio.Future[Any]] = {stop_requested, storage_failed}
            await asyncio.wait(either, return_when=FIRST_COMPLETED)
            if storage_failed.done():
                _log.critical("stopping after a storage failure; restart stratad to recover")
                code = EXIT_STORAGE_FAILED
            else:
                signum = stop_requested.result()
                _log.info(
                    "%s received: draining in-flight calls for up to %gs",
                    signal.Signals(signum).name,
                    config.grace_period,
                )
                code = 0
        finally:
            await server.stop(config.grace_period)
    _log.info("stratad stopped")
    return code


def _storage_failure(resources: Resources) -> asyncio.Future[None]:
    """Resolved when an fsync fails (from whichever thread sees it): fail-stop."""
    loop = asyncio.get_running_loop()
    failed: asyncio.Future[None] = loop.create_future()

    def resolve() -> None:
        if not failed.done():
            failed.set_result(None)

    def on_trip(_: StorageFailedError) -> None:
        loop.call_soon_threadsafe(resolve)

    resources.engine.store.fail_stop.on_trip(on_trip)
    return failed


def _install_signal_handlers() -> asyncio.Future[int]:
    """A future resolved with the number of the first SIGTERM/SIGINT received."""
    loop = asyncio.get_running_loop()
    received: asyncio.Future[int] = loop.create_future()

    def on_signal(signum: int) -> None:
        if received.done():
            _log.warning("%s received again: already shutting down", signal.Signals(signum).name)
        else:
            received.set_result(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    return received


__all__ = [
    "HEALTH_SERVICE_NAME",
    "REFLECTION_SERVICE_NAME",
    "REFLECTION_V1_SERVICE_NAME",
    "WRITES_HEALTH_NAME",
    "ServerStartError",
    "StratadServer",
    "serve",
    "server_options",
    "start_server",
]
