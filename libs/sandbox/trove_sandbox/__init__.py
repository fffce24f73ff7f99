"""A synthetic small web on 127.0.0.0/8 for the demo, the tests and the benchmarks.

``SandboxWeb`` is the deterministic model (and ground truth) of the web;
``serve_sandbox`` serves it over HTTP/1.1, one loopback IP per host, and records
every request in a ``Witness``.
"""

from trove_sandbox.response import Response
from trove_sandbox.server import RunningSandbox, Witness, WitnessRecord, serve_sandbox
from trove_sandbox.trap import TRAP_HOST
from trove_sandbox.web import Host, SandboxWeb

__all__ = [
    "TRAP_HOST",
    "Host",
    "Response",
    "RunningSandbox",
    "SandboxWeb",
    "Witness",
    "WitnessRecord",
    "serve_sandbox",
]
