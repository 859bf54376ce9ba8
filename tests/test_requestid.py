"""Generated request ids: 32 hex characters, never repeated, not even by a forked worker."""

from __future__ import annotations

import os
import re

from app.core.http.requestid import accept_or_generate


def test_generated_ids_are_unique_hex_of_uuid_length() -> None:
    ids = [accept_or_generate(None) for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert accept_or_generate(b"\x01bad") != accept_or_generate(b"\x01bad")  # refused ids are replaced


def test_a_forked_process_does_not_repeat_its_parents_ids() -> None:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report one id and leave without running pytest's teardown
        os.write(write_end, accept_or_generate(None).encode())
        os._exit(0)
    os.close(write_end)
    child = os.read(read_end, 64).decode()
    os.close(read_end)
    os.waitpid(pid, 0)
    parent = accept_or_generate(None)
    assert len(child) == 32 and child[:16] != parent[:16]
