"""TorchRL's `AsyncBatchedCollector` arguments that aiocollect's design answers in its own way.

TorchRL's class takes options for its own machinery (transports, server processes, message
chunking, structured configs). A script written for it must run here with the import line
changed, so each is accepted where it means something aiocollect does (the structured
configs map onto the plain arguments; CPU affinity is applied to the env worker processes
and the collector's thread), and refused with the reason where it asks for machinery
aiocollect does not have. Nothing is silently dropped. Everything is checked before anything
is built.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .._core._validate import check_int, check_seconds

__all__ = ["TorchRLArgs", "check_affinity_masks", "resolve_torchrl_args"]

_TRANSPORTS = (None, "auto", "driver", "thread")


@dataclass
class TorchRLArgs:
    """The plain arguments after TorchRL's structured ones were folded in."""

    max_batch_size: int | None
    min_batch_size: int | None
    server_timeout: float | None
    device: Any
    storing_device: Any
    policy_version: int
    model_id: str
    verbose: bool
    driver_affinity: list[int] | None
    worker_affinity: Sequence[Sequence[int]] | Callable[[int], Sequence[int]] | None


def resolve_torchrl_args(
    *,
    transport: Any,
    policy_backend: Any,
    env_exchange: Any,
    transition_chunk_size: Any,
    server_config: Any,
    device_config: Any,
    max_batch_size: int | None,
    min_batch_size: int | None,
    server_timeout: float | None,
    device: Any,
    storing_device: Any,
    policy_version: Any,
    weight_sync_model_id: Any,
    verbose: Any,
    driver_affinity: Any,
    worker_affinity: Any,
    env_backend: str,
) -> TorchRLArgs:
    """Check TorchRL's extra arguments and fold its structured configs into the plain ones.

    Raises:
        TypeError, ValueError: An argument asks for machinery aiocollect does not have, or
            contradicts another; the message says what to pass instead.
    """
    if not (transport is None or isinstance(transport, str)) or transport not in _TRANSPORTS:
        raise TypeError(
            f"transport must be None, 'auto' or 'driver', got {transport!r}: aiocollect's AsyncBatchedCollector runs "
            "the policy on its own thread and exchanges with env workers through shared memory; drop the transport"
        )
    if policy_backend not in (None, "threading"):
        raise ValueError(
            f"policy_backend must be None or 'threading', got {policy_backend!r}: the policy runs on the collector's "
            "thread; for a policy served elsewhere (a process, Ray, a model server), pass a coroutine policy that "
            "calls it"
        )
    if env_exchange not in ("auto", "shm"):
        raise ValueError(
            f"env_exchange must be 'auto' or 'shm', got {env_exchange!r}: aiocollect's env workers always exchange "
            "observations and actions through shared memory"
        )
    if transition_chunk_size != "auto":
        raise ValueError(
            f"transition_chunk_size must be 'auto', got {transition_chunk_size!r}: it sizes TorchRL's "
            "ProcessSlotTransport messages, and aiocollect's env workers hand each step's rows over at once; drop it"
        )
    if server_config is not None:
        max_batch_size, min_batch_size, server_timeout = _server_config(
            server_config, max_batch_size, min_batch_size, server_timeout
        )
    if device_config is not None:
        device, storing_device = _device_config(device_config, device, storing_device)
    version = check_int("policy_version", policy_version, minimum=0)
    if not isinstance(weight_sync_model_id, str) or not weight_sync_model_id:
        raise TypeError(f"weight_sync_model_id must be a non-empty str, got {weight_sync_model_id!r}")
    if not isinstance(verbose, bool):
        raise TypeError(f"verbose must be True or False, got {verbose!r}")
    driver = None if driver_affinity is None else _mask("driver_affinity", driver_affinity)
    if worker_affinity is not None:
        if env_backend != "multiprocessing":
            raise ValueError(
                "worker_affinity places env worker processes on CPUs and applies to env_backend='multiprocessing' "
                "only; drop it, or use driver_affinity for the collector's own thread"
            )
        if not callable(worker_affinity):
            if isinstance(worker_affinity, (str, bytes)) or not isinstance(worker_affinity, Sequence):
                raise TypeError(
                    "worker_affinity must be one CPU list per env worker or a callable worker -> CPU list, got "
                    f"{worker_affinity!r}"
                )
            worker_affinity = [_mask(f"worker_affinity[{w}]", m) for w, m in enumerate(worker_affinity)]
    return TorchRLArgs(
        max_batch_size, min_batch_size, server_timeout, device, storing_device, version, weight_sync_model_id,
        verbose, driver, worker_affinity,
    )  # fmt: skip


def _server_config(cfg: Any, max_b: int | None, min_b: int | None, timeout: float | None) -> tuple[int, int, float]:
    if any(v is not None for v in (max_b, min_b, timeout)):
        raise ValueError(
            "server_config and max_batch_size/min_batch_size/server_timeout both set the batching; give one of them"
        )
    backend = getattr(cfg, "service_backend", "thread")
    if backend != "thread":
        raise ValueError(
            f"server_config.service_backend must be 'thread', got {backend!r}: the policy runs on the collector's "
            "thread; for a policy served elsewhere, pass a coroutine policy that calls it"
        )
    if getattr(cfg, "static_batch_size", None) is not None:
        raise ValueError(
            "server_config.static_batch_size (CUDA-graph padding) is not supported: forward passes take the ready "
            "envs as they are; set it to None"
        )
    per_env = getattr(cfg, "max_inflight_per_env", None)
    if per_env is not None and check_int("server_config.max_inflight_per_env", per_env) != 1:
        raise ValueError(
            f"server_config.max_inflight_per_env must be 1 or None here, got {per_env!r}: each env has at most one "
            "request in flight (its next action waits for its step)"
        )
    return (
        check_int("server_config.max_batch_size", getattr(cfg, "max_batch_size", 64)),
        check_int("server_config.min_batch_size", getattr(cfg, "min_batch_size", 1)),
        check_seconds("server_config.timeout", getattr(cfg, "timeout", 0.01)),
    )


def _device_config(cfg: Any, device: Any, storing_device: Any) -> tuple[Any, Any]:
    if device is not None:
        raise ValueError("device_config and device both place the policy; give one of them")
    for name in ("env_device", "output_device"):
        value = getattr(cfg, name, None)
        if value is not None and torch.device(value).type != "cpu":
            raise ValueError(
                f"device_config.{name} must be None or 'cpu', got {value!r}: envs step on the host and read their "
                "actions there (the policy's device is device_config.policy_device)"
            )
    stored = getattr(cfg, "storing_device", None)
    if stored is not None and storing_device is not None:
        raise ValueError("device_config.storing_device and storing_device are both set; give one of them")
    return getattr(cfg, "policy_device", None), stored if stored is not None else storing_device


def _mask(name: str, cpus: Any) -> list[int]:
    if isinstance(cpus, (str, bytes)) or not isinstance(cpus, Sequence) or not cpus:
        raise TypeError(f"{name} must be a non-empty list of CPU numbers, got {cpus!r}")
    mask = [check_int(name, c, minimum=0) for c in cpus]
    if not hasattr(os, "sched_getaffinity"):  # pragma: no cover - not Linux
        raise RuntimeError(f"{name} sets CPU affinity, which needs Linux (os.sched_setaffinity); drop it")
    allowed = os.sched_getaffinity(0)
    outside = sorted(set(mask) - allowed)
    if outside:
        raise ValueError(f"{name} names CPUs {outside} this process may not run on (it may use {sorted(allowed)})")
    return mask


def check_affinity_masks(affinity: Any, workers: int) -> list[list[int]] | None:
    """One CPU list per env worker from ``worker_affinity`` (a list of them, or a callable), checked."""
    if affinity is None:
        return None
    if callable(affinity):
        return [_mask(f"worker_affinity({w})", affinity(w)) for w in range(workers)]
    if len(affinity) != workers:
        raise ValueError(
            f"worker_affinity gives {len(affinity)} CPU lists for {workers} env workers; give one per worker "
            "(envs_per_worker sets how many workers there are)"
        )
    return [list(m) for m in affinity]
