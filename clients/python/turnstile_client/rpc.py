"""google.rpc's Status and error details, which carry the details of a failed call's status.

googleapis-common-protos' (the top-level google.rpc package that grpcio-status
and Google's client libraries use) when it is installed, else the package's own
copy (turnstile_client._rpc). Only one of the two is ever loaded in a process, so
the default descriptor pool never holds two google/rpc/status.proto: their
versions differ, and protobuf refuses a second, different file of the same
name with a TypeError at import.
"""

from __future__ import annotations

import importlib.util


def _common_protos() -> bool:
    """Reports whether googleapis-common-protos' google.rpc is importable."""
    try:
        return all(importlib.util.find_spec(f"google.rpc.{m}") is not None for m in ("status_pb2", "error_details_pb2"))
    except ImportError:  # no google.rpc package at all
        return False


if _common_protos():
    from google.rpc import error_details_pb2, status_pb2
else:
    from ._rpc import error_details_pb2, status_pb2  # type: ignore[no-redef]

__all__ = ["error_details_pb2", "status_pb2"]
