"""Starting Ray for a run, or attaching to a cluster: on loopback unless told otherwise.

:func:`ensure_ray` is the one way mecsim starts Ray, for ``mecsim run`` and for the
service's worker alike: a Ray instance of our own listens on 127.0.0.1 only, and an
``execution.ray_address`` (or ``--ray-address``) attaches to an existing cluster, with a
token-authentication refusal turned into one clear line.
"""

from __future__ import annotations

import logging
import os
from typing import Any

#: Ray's switch for "this machine is not part of a cluster": Ray then takes the loopback
#: address as the node's address, and its GCS, raylet, object manager, workers and agents
#: listen on 127.0.0.1 only (checked with psutil in tests/e2e/test_ray_security.py).
RAY_SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class RayAttachError(ValueError):
    """The Ray cluster named by ``execution.ray_address`` refused us (bad input: a setting)."""


def attach(ray, kwargs: dict[str, Any], address: str) -> None:
    """``ray.init`` on an existing cluster; a token-authentication refusal becomes one
    clear line instead of Ray's chained tracebacks."""
    try:
        if _is_loopback_address(address):
            init_on_loopback(ray, kwargs)
        else:
            ray.init(**kwargs)
    except ConnectionError as exc:
        # Ray wraps the refusal (AuthenticationError: InvalidAuthToken) in a RuntimeError's
        # text, inside the ConnectionError
        chain: list[str] = []
        cause: BaseException | None = exc
        while cause is not None and len(chain) < 10:
            chain.append(f"{type(cause).__name__}: {cause}")
            cause = cause.__cause__ or cause.__context__
        if not any("InvalidAuthToken" in text or "AuthenticationError" in text for text in chain):
            raise
        raise RayAttachError(
            f"execution.ray_address: the Ray cluster at {address} refused the connection "
            "(InvalidAuthToken): it uses token authentication; set RAY_AUTH_MODE=token and "
            "give this process the cluster's token (RAY_AUTH_TOKEN_PATH=FILE, RAY_AUTH_TOKEN, "
            "or ~/.ray/auth_token); see docs/cluster.md, Commands"
        ) from None


def _is_loopback_address(address: str) -> bool:
    """Is ``[ray://]HOST:PORT`` on this machine's loopback interface?"""
    import ipaddress
    import socket

    host = address.removeprefix("ray://").rpartition(":")[0].strip("[]")
    try:
        infos = socket.getaddrinfo(host, None)
        return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)
    except (OSError, ValueError):
        return False


def init_on_loopback(ray, kwargs: dict[str, Any]) -> None:
    """``ray.init`` for a Ray instance of our own, reachable from this machine only (or
    attaching to one on loopback: Ray would otherwise rewrite 127.0.0.1 to the machine's
    network address and look for the head there)."""
    from ray._private import ray_constants

    saved_env = os.environ.get(RAY_SINGLE_MACHINE_ENV)
    saved_const = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    os.environ[RAY_SINGLE_MACHINE_ENV] = "0"  # inherited by the processes Ray starts
    ray_constants.ENABLE_RAY_CLUSTER = False  # read when this process picks its address
    try:
        ray.init(**kwargs)
    finally:  # later attaches from this process to a real cluster are unaffected
        if saved_env is None:
            os.environ.pop(RAY_SINGLE_MACHINE_ENV, None)
        else:
            os.environ[RAY_SINGLE_MACHINE_ENV] = saved_env
        if saved_const is not None:
            ray_constants.ENABLE_RAY_CLUSTER = saved_const


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Ray for this process: nothing when it is already initialised (returns False), else
    attach to ``address`` or start an instance of our own on loopback with ``num_cpus``
    CPUs (returns True: the caller owns it and shuts it down)."""
    import ray  # deferred: Ray takes ~1 s to import and the in-process backend never needs it

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    kwargs: dict[str, Any] = dict(
        include_dashboard=False,
        logging_level=logging.WARNING,
        configure_logging=False,
        log_to_driver=True,
    )
    if address:
        kwargs["address"] = address
        attach(ray, kwargs, address)
    else:
        kwargs["num_cpus"] = num_cpus or os.cpu_count() or 1
        init_on_loopback(ray, kwargs)
    return True
