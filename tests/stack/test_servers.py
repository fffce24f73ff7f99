"""A server of the embedded stack that dies is noticed, not waited for in silence."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import StackUrls
from trove_schema.errors import StackError
from trove_stack.stack import Stack


def test_a_dead_nats_server_is_said_with_its_last_log_lines(
    tmp_path: Path, stack: StackUrls
) -> None:
    # The OOM killer took it: the services would wait for it for ever.
    local = Stack(state_dir=tmp_path, database_url=stack.database_url).start()
    try:
        local.check_servers()  # both there: nothing to say
        assert local.nats is not None
        local.nats._child.proc.kill()  # type: ignore[union-attr]
        local.nats._child.proc.wait(10)  # type: ignore[union-attr]
        with pytest.raises(StackError, match=r"nats-server exited \(code -9: .*"):
            local.check_servers()
    finally:
        local.stop()
