"""``trim_records_before(collection, "")`` is a no-op (issue 19): nothing is below the empty key.

The RecordStore trait says "delete keys strictly below the cutoff"; no key is below ``""``, so the
client answers 0 without asking the server (which refuses an empty ``before`` as a key).
"""

from __future__ import annotations

from storage_gateway_client import GatewayClient


async def test_trim_before_the_empty_key_deletes_nothing(gw: GatewayClient) -> None:
    await gw.records.upsert_records("c", {"a": 1, "b": 2})
    assert await gw.records.trim_records_before("c", "") == 0
    assert await gw.records.trim_records_before("never-written", "") == 0
    assert await gw.records.get_ordered_records("c") == [("a", 1), ("b", 2)]
    assert await gw.records.trim_records_before("c", "b") == 1
    assert await gw.records.get_ordered_records("c") == [("b", 2)]
