"""KvikIO's ``kvikio.remote_file`` names: :class:`RemoteFile` (native, see
docs/remote.md) and :class:`RemoteEndpointType`, which ``RemoteFile.open`` takes; and
gpumapio's own :class:`RemoteWriter` (S3 objects written as multipart uploads)."""

from __future__ import annotations

import enum

from gpumapio._native import RemoteFile, RemoteWriter

__all__ = ["RemoteEndpointType", "RemoteFile", "RemoteWriter"]


class RemoteEndpointType(enum.Enum):
    """The kinds of remote endpoint, as KvikIO names them. gpumapio reads ``S3``,
    ``S3_PRESIGNED_URL``, ``WEBHDFS`` and ``HTTP``; ``AUTO`` infers the kind from the URL
    (WebHDFS where the path starts with ``/webhdfs/v1/``); ``S3_PUBLIC`` is refused with
    ``ValueError``."""

    AUTO = 0
    S3 = 1
    S3_PUBLIC = 2
    S3_PRESIGNED_URL = 3
    WEBHDFS = 4
    HTTP = 5
