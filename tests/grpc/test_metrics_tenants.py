"""Tenant names in metrics are opt-in and bounded (metrics_tenant_labels)."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client.parser import text_string_to_metric_families

from stratad.api.v1 import admin_pb2
from stratad.server.metrics import OTHER_TENANTS, TenantLabels

if TYPE_CHECKING:
    from conftest import Api


def tenant_values(address: str) -> dict[str, float]:
    """tenant label value -> stratad_verify_runs_total."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        sample.labels["tenant"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "stratad_verify_runs_total"
    }


def verify_as(api: Api, *tenants: str) -> None:
    for tenant in tenants:
        as_tenant = api.as_tenant(tenant)
        as_tenant.call(as_tenant.admin.Verify, admin_pb2.VerifyRequest())


def test_only_the_first_n_existing_tenants_are_named(start_api: Callable[..., Api]) -> None:
    api = start_api(metrics_listen="127.0.0.1:0", metrics_tenant_labels=2)
    for tenant in ("a", "b", "c"):
        api.as_tenant(tenant).create("s")
    # Made-up tenants (they do not exist) never take a name.
    verify_as(api, "ghost1", "ghost2", "a", "b", "c", "a")
    assert tenant_values(api.server.server.metrics_address) == {
        "a": 2,
        "b": 1,
        OTHER_TENANTS: 3,  # ghost1, ghost2, c
    }


def test_by_default_no_tenant_is_named(start_api: Callable[..., Api]) -> None:
    api = start_api(metrics_listen="127.0.0.1:0")
    api.create("s")
    verify_as(api, "default", "other")
    assert tenant_values(api.server.server.metrics_address) == {OTHER_TENANTS: 2}


def test_tenant_labels_are_bounded() -> None:
    labels = TenantLabels(3)
    values = {labels(f"t{i}") for i in range(1000)}
    assert values == {"t0", "t1", "t2", OTHER_TENANTS}
