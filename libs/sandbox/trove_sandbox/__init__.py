"""A synthetic small web on 127.0.0.0/8 for the demo, the tests and the benchmarks.

``SandboxWeb`` is the deterministic model (and ground truth) of the web;
``serve_sandbox`` serves it over HTTP/1.1, one loopback IP per host, and records
every request in a ``Witness``. ``FediverseInstance`` is a Mastodon-like
instance whose posts share the web's pages; ``serve_instance`` serves it.
"""

from trove_sandbox.fediverse import (
    INSTANCE_HOST,
    FediverseInstance,
    RunningInstance,
    serve_instance,
)
from trove_sandbox.response import Response
from trove_sandbox.server import RunningSandbox, Witness, WitnessRecord, serve_sandbox
from trove_sandbox.trap import TRAP_HOST
from trove_sandbox.web import Host, SandboxWeb

__all__ = [
    "INSTANCE_HOST",
    "TRAP_HOST",
    "FediverseInstance",
    "Host",
    "Response",
    "RunningInstance",
    "RunningSandbox",
    "SandboxWeb",
    "Witness",
    "WitnessRecord",
    "serve_instance",
    "serve_sandbox",
]
