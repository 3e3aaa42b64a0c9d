"""The S3 test server (`scripts/s3-test-server.sh`, SeaweedFS) through obstore.

Besides plain object operations, the conditional writes stratad's leases rely
on: a create-only PUT (``If-None-Match: *``) and a compare-and-swap PUT
(``If-Match: <e-tag>``) must fail once the object exists / has changed, and of
concurrent conditional PUTs exactly one may win.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING

import obstore
import pytest
from obstore.exceptions import (
    AlreadyExistsError,
    PermissionDeniedError,
    PreconditionError,
)

if TYPE_CHECKING:
    from conftest import S3Server


def test_put_get_list_delete(s3_server: S3Server) -> None:
    store = s3_server.store()
    put = obstore.put(store, "dir/a.txt", b"alpha")
    obstore.put(store, "dir/b.txt", b"bravo")
    obstore.put(store, "top.txt", b"top")

    got = obstore.get(store, "dir/a.txt")
    assert bytes(got.bytes()) == b"alpha"
    assert got.meta["size"] == 5
    assert got.meta["e_tag"] == put["e_tag"]

    listed = sorted(meta["path"] for batch in obstore.list(store) for meta in batch)
    assert listed == ["dir/a.txt", "dir/b.txt", "top.txt"]
    under_dir = obstore.list_with_delimiter(store, "dir")
    assert sorted(meta["path"] for meta in under_dir["objects"]) == ["dir/a.txt", "dir/b.txt"]
    top = obstore.list_with_delimiter(store)
    assert top["common_prefixes"] == ["dir"]
    assert [meta["path"] for meta in top["objects"]] == ["top.txt"]

    obstore.delete(store, "dir/a.txt")
    with pytest.raises(FileNotFoundError):
        obstore.get(store, "dir/a.txt")
    listed = sorted(meta["path"] for batch in obstore.list(store) for meta in batch)
    assert listed == ["dir/b.txt", "top.txt"]


def test_signed_requests_need_the_right_secret(s3_server: S3Server) -> None:
    wrong = dataclasses.replace(s3_server, secret_key="not-the-secret").store()
    with pytest.raises(PermissionDeniedError, match="SignatureDoesNotMatch"):
        obstore.put(wrong, "x", b"x")


def test_create_only_put_fails_when_the_object_exists(s3_server: S3Server) -> None:
    store = s3_server.store()
    obstore.put(store, "lease", b"first", mode="create")
    with pytest.raises(AlreadyExistsError):
        obstore.put(store, "lease", b"second", mode="create")
    assert bytes(obstore.get(store, "lease").bytes()) == b"first"


def test_put_with_a_stale_etag_fails(s3_server: S3Server) -> None:
    store = s3_server.store()
    first = obstore.put(store, "lease", b"v1", mode="create")
    assert first["e_tag"]
    second = obstore.put(store, "lease", b"v2", mode={"e_tag": first["e_tag"]})
    assert second["e_tag"] != first["e_tag"]
    with pytest.raises(PreconditionError):
        obstore.put(store, "lease", b"v3", mode={"e_tag": first["e_tag"]})
    assert bytes(obstore.get(store, "lease").bytes()) == b"v2"
    # No object to match: S3 answers 404, obstore reports a failed precondition.
    with pytest.raises(PreconditionError):
        obstore.put(store, "missing", b"x", mode={"e_tag": first["e_tag"]})


def test_concurrent_conditional_puts_have_one_winner(s3_server: S3Server) -> None:
    store = s3_server.store()
    # SeaweedFS serializes conditional writes to one key on a lock whose
    # waiters poll once a second: each round takes about writers / 3 seconds.
    writers = 8

    async def race() -> None:
        async def create(i: int) -> int | None:
            try:
                await obstore.put_async(store, "lease", f"create-{i}".encode(), mode="create")
            except AlreadyExistsError:
                return None
            return i

        async def swap(i: int, e_tag: str) -> int | None:
            try:
                await obstore.put_async(store, "lease", f"swap-{i}".encode(), mode={"e_tag": e_tag})
            except PreconditionError:
                return None
            return i

        created = [i for i in await asyncio.gather(*map(create, range(writers))) if i is not None]
        assert len(created) == 1, created
        current = await obstore.get_async(store, "lease")
        assert bytes(await current.bytes_async()) == f"create-{created[0]}".encode()

        e_tag = current.meta["e_tag"]
        assert e_tag is not None
        swaps = [swap(i, e_tag) for i in range(writers)]
        swapped = [i for i in await asyncio.gather(*swaps) if i is not None]
        assert len(swapped) == 1, swapped
        current = await obstore.get_async(store, "lease")
        assert bytes(await current.bytes_async()) == f"swap-{swapped[0]}".encode()

    asyncio.run(race())
