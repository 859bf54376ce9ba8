"""Sample files and requests for the shared tests (``app.core.samples``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from app.core.samples import Samples

if TYPE_CHECKING:
    from httpx import AsyncClient


class FilesSamples(Samples):
    path_params: ClassVar[dict[str, str]] = {"collection": "c1", "file_id": "f1"}

    async def seed(self, http: AsyncClient, ns: str) -> None:
        self.ok(await http.put(f"/v1/{ns}/files/c1/f1", content=b"file-bytes"))

    async def snapshot(self, http: AsyncClient, ns: str) -> Any:
        file = await http.get(f"/v1/{ns}/files/c1/f1")
        listed = await http.get(f"/v1/{ns}/files/c1")
        collections = await http.get(f"/v1/{ns}/files")
        return (
            file.status_code, file.content, file.headers.get("etag"),
            listed.status_code, listed.json(), collections.status_code, collections.json(),
        )

    async def same_names(self, http: AsyncClient, a: str, b: str) -> None:
        self.ok(await http.put(f"/v1/{a}/files/c1/f1", content=b"only-a"))
        self.ok(await http.post(f"/v1/{a}/files/c1", files={"file": ("f1", b"only-a", "text/plain")}))
        self.expect((await http.get(f"/v1/{b}/files/c1/f1")).content == b"file-bytes", "b's f1 unchanged")
        self.ok(await http.delete(f"/v1/{a}/files/c1/f1"))
        self.expect((await http.get(f"/v1/{b}/files/c1/f1")).content == b"file-bytes", "b's f1 kept")

    async def workload(self, http: AsyncClient, ns: str) -> None:
        self.ok(await http.put(f"/v1/{ns}/files/f/a.txt", content=b"hello"))
        self.ok(await http.get(f"/v1/{ns}/files/f/a.txt", headers={"Range": "bytes=1-2"}))
        self.ok(await http.head(f"/v1/{ns}/files/f/a.txt"))
        self.ok(await http.post(f"/v1/{ns}/files/f", files={"file": ("b.txt", b"multi", "text/plain")}))
        self.ok(await http.get(f"/v1/{ns}/files/f"))
        self.ok(await http.get(f"/v1/{ns}/files"))
        self.ok(await http.delete(f"/v1/{ns}/files/f/a.txt"))

    async def cursors(self, http: AsyncClient, ns: str) -> dict[str, dict[str, str]]:
        for key in ("a", "b"):
            self.ok(await http.put(f"/v1/{ns}/files/c/{key}", content=b"x", headers={"Content-Type": "text/plain"}))
        page = self.ok(await http.get(f"/v1/{ns}/files/c", params={"limit": 1})).json()
        return {"GET /v1/{namespace}/files/{collection}": {"query.cursor": page["next_cursor"]}}


SAMPLES = FilesSamples()
