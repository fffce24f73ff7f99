"""When an answer's last byte arrived, from the kernel's ``tcp_info``.

The kernel's times are in jiffies, which run behind on a busy node: a "how long ago" it
gives may be longer than the real one by several ticks. The moment worked out from it
must never be earlier than the real arrival (a host's gap counts from it), so the pod
counts from its own read unless the kernel says the answer came well before.
"""

from __future__ import annotations

import socket
import struct
import time

import pytest

from trove_fetcher import transport
from trove_fetcher.transport import AnswerTime


class Socket:
    """A socket whose kernel says when data last went each way (ms ago)."""

    def __init__(self, sent_ago: int, received_ago: int) -> None:
        self.info = bytearray(transport._TCP_INFO_LEN)
        struct.pack_into("=I", self.info, transport._LAST_DATA_SENT, sent_ago)
        struct.pack_into("=I", self.info, transport._LAST_DATA_RECV, received_ago)

    def getsockopt(self, level: int, option: int, length: int) -> bytes:
        assert (level, option, length) == (
            socket.IPPROTO_TCP,
            transport._TCP_INFO,
            transport._TCP_INFO_LEN,
        )
        return bytes(self.info)


@pytest.mark.parametrize("received_ago", [0, 20, 50])
def test_an_answer_read_soon_after_it_came_counts_from_the_read(received_ago: int) -> None:
    # Up to 50 ms "ago" may be jiffies that ran behind while the answer came.
    answer = AnswerTime(Socket(sent_ago=received_ago + 100, received_ago=received_ago))
    before = time.time()
    answer.read(whole=True)
    assert answer.received_at is not None
    assert answer.received_at >= before
    assert answer.seconds == pytest.approx(0.1)


def test_an_answer_read_long_after_it_came_counts_from_its_arrival() -> None:
    # A pod that read it two seconds late (a stalled event loop): the host rested then.
    answer = AnswerTime(Socket(sent_ago=2300, received_ago=2000))
    before = time.time()
    answer.read(whole=True)
    after = time.time()
    assert answer.received_at is not None
    assert before - 2.0 < answer.received_at <= after - 1.9


def test_an_answer_not_read_to_its_end_has_no_arrival() -> None:
    answer = AnswerTime(Socket(sent_ago=300, received_ago=200))
    answer.read()
    assert answer.received_at is None
    assert answer.seconds == pytest.approx(0.1)
