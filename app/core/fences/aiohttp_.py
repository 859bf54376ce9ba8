"""How much of a response body aiohttp reads ahead before it stops reading the socket.

aiohttp's ``StreamReader`` pauses its connection once more than ``2 * limit`` bytes wait unread
and resumes it below ``limit`` (``_high_water`` / ``_low_water``, set from the session's
``read_bufsize``, 64 KiB by default). aiobotocore builds its ``ClientSession`` itself and offers
no way to pass ``read_bufsize`` (``AioConfig.connector_args`` is checked against a fixed list),
so an S3 download through it reads at most 128 KiB ahead: less than one socket read (the event
loop reads up to 256 KiB), so the S3 socket stops after every read and the download alternates
between filling from S3 and draining to the client instead of doing both at once.

``widen_read_buffer`` sets the two water marks of one response's reader, which is what
``read_bufsize`` would have done for it. ``tests/test_fences.py`` pins the attributes and the
pause/resume behaviour they drive.
"""

from __future__ import annotations

from aiohttp import StreamReader


def widen_read_buffer(content: StreamReader, limit: int) -> None:
    """Let ``content`` buffer up to ``2 * limit`` unread bytes (resuming below ``limit``)."""
    content._low_water = limit
    content._high_water = 2 * limit
