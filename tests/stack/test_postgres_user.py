"""Stacks started at once as root (test workers, a host's pods) agree on the one user
Postgres runs as: each reads the uid the user keeps."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import pwd
import subprocess
from collections.abc import Iterator
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier

import pytest

from trove_schema.errors import StackError
from trove_stack import postgres

STARTS = 6


def _start(name: str, barrier: Barrier, views: Queue[int | str]) -> None:
    """One start's view: the uid it would hand the data folder to, or its error."""
    barrier.wait(timeout=30)
    try:
        postgres._system_user(name)
    except StackError as exc:
        views.put(str(exc))
    else:
        views.put(pwd.getpwnam(name).pw_uid)


@pytest.fixture
def new_user_name() -> Iterator[str]:
    name = f"trove-t{os.getpid()}"
    yield name
    if os.geteuid() == 0:
        # Under the stacks' lock: userdel rewrites /etc/passwd as useradd does, and one
        # beside another worker's useradd of the Postgres user could undo it.
        with postgres.USER_LOCK.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            subprocess.run(["userdel", name], capture_output=True, check=False)


def test_starts_at_once_agree_on_the_postgres_users_uid(new_user_name: str) -> None:
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(STARTS)
    views: Queue[int | str] = context.Queue()
    starts = [
        context.Process(target=_start, args=(new_user_name, barrier, views)) for _ in range(STARTS)
    ]
    for start in starts:
        start.start()
    seen = [views.get(timeout=60) for _ in starts]
    for start in starts:
        start.join(timeout=10)
    if os.geteuid() != 0:
        # Without root no user is made, and each start says why rather than going on.
        assert all(isinstance(s, str) and new_user_name in s for s in seen), seen
        return
    kept = pwd.getpwnam(new_user_name).pw_uid
    assert seen == [kept] * STARTS
