"""The Python SDK: `Client` (blocking) and `AsyncClient` (asyncio).

Both connect as `stratad.sdk.connection` resolves: the address, tenant, bearer
token and TLS settings given, else the STRATAD_ADDRESS, STRATAD_TENANT,
STRATAD_TOKEN(_FILE) and STRATAD_TLS* variables.

Both speak the stratad.api.v1 services and return their protobuf messages.
Every call has a deadline (`timeout`, overridable per call); gRPC retries
calls that fail with UNAVAILABLE before reaching the daemon (a service-config
retry policy with exponential backoff); failures are raised as the
`stratad.errors` class of their status code. Large states are uploaded in
chunks the daemon lacks (see sdk/upload.py).

This module is where the SDK is imported from; it is made of:

- sdk/sync_client.py: `Client`;
- sdk/async_client.py: `AsyncClient`;
- sdk/messages.py: the requests both build the same way (`save_request`,
  `struct`, `put_writes_request`, ...), the options of a save (`SaveOptions`)
  and the retries of a chunked save;
- sdk/rpc.py: the channel options (`channel_options`) and failed calls as
  `stratad.errors` (`to_error`, `error_info`);
- sdk/constants.py: the names every client shares (the tenant header, the
  STRATAD_* variables, the default address).

tests/unit/test_sdk_surface.py keeps the twins alike and complete: every field
of every request of the services they wrap can be set through the method that
sends it, and both have the same methods with the same parameters.
"""

from __future__ import annotations

from stratad.sdk.async_client import AsyncClient
from stratad.sdk.connection import TLSConfig
from stratad.sdk.constants import DEFAULT_ADDRESS, TENANT_HEADER
from stratad.sdk.messages import MAX_METADATA_DEPTH as MAX_METADATA_DEPTH
from stratad.sdk.messages import SaveOptions as SaveOptions
from stratad.sdk.messages import check_depth as check_depth
from stratad.sdk.messages import delete_checkpoints_request as delete_checkpoints_request
from stratad.sdk.messages import prune_strategy as prune_strategy
from stratad.sdk.messages import put_writes_request as put_writes_request
from stratad.sdk.messages import save_request as save_request
from stratad.sdk.messages import struct as struct
from stratad.sdk.rpc import channel_options as channel_options
from stratad.sdk.rpc import error_info, to_error
from stratad.sdk.sync_client import Client

__all__ = [
    "DEFAULT_ADDRESS",
    "TENANT_HEADER",
    "AsyncClient",
    "Client",
    "TLSConfig",
    "error_info",
    "to_error",
]
