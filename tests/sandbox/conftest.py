"""Fixtures for the sandbox tests: a generated web, its server and an HTTP client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from trove_sandbox import RunningSandbox, SandboxWeb, serve_sandbox


@pytest.fixture
def web() -> SandboxWeb:
    return SandboxWeb.generate(with_trap=True)


@pytest.fixture
async def running(web: SandboxWeb) -> AsyncIterator[RunningSandbox]:
    async with serve_sandbox(web) as served:
        yield served


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    # trust_env=False: never route sandbox traffic through a proxy from the environment.
    async with httpx.AsyncClient(trust_env=False, timeout=10.0) as http:
        yield http
