"""KvikIO's ``kvikio.remote_file`` names: :class:`RemoteFile` (native, see
docs/remote.md), :class:`RemoteEndpointType`, which ``RemoteFile.open`` takes and
``RemoteFile.remote_endpoint_type()`` gives, and :func:`infer_remote_endpoint_type`; and
gpumapio's own :class:`RemoteWriter` (S3, GCS and Azure objects written as multipart uploads)."""

from __future__ import annotations

import enum

from gpumapio._native import RemoteFile, RemoteWriter, infer_endpoint_kind

__all__ = ["RemoteEndpointType", "RemoteFile", "RemoteWriter", "infer_remote_endpoint_type"]


class RemoteEndpointType(enum.Enum):
    """The kinds of remote endpoint, as KvikIO names them: ``S3`` (signed requests),
    ``S3_PUBLIC`` (unsigned, for objects anyone may read), ``S3_PRESIGNED_URL``, ``WEBHDFS``
    and ``HTTP``; and gpumapio's own ``GCS`` and ``GCS_PUBLIC`` (Google Cloud Storage,
    ``gs://bucket/object``, signed or not) and ``AZURE`` and ``AZURE_PUBLIC`` (Azure Blob
    Storage, ``az://container/blob``), which KvikIO does not have. ``AUTO`` tries them in
    that order, taking the first whose form the URL has (see
    :func:`infer_remote_endpoint_type`)."""

    AUTO = 0
    S3 = 1
    S3_PUBLIC = 2
    S3_PRESIGNED_URL = 3
    WEBHDFS = 4
    HTTP = 5
    GCS = 6
    GCS_PUBLIC = 7
    AZURE = 8
    AZURE_PUBLIC = 9


def infer_remote_endpoint_type(url: str) -> RemoteEndpointType:
    """The kind ``RemoteFile.open(url)`` takes ``url`` as, by its form alone (no request is
    made): ``S3`` for ``s3://bucket/key`` and AWS S3 ``https://`` URLs (whose open falls back
    to ``S3_PUBLIC`` where signed requests are refused), ``S3_PRESIGNED_URL`` for a URL with
    an S3 signature in its query, ``WEBHDFS`` for a path under ``/webhdfs/v1/``, ``GCS`` for
    ``gs://bucket/object`` (falling back to ``GCS_PUBLIC`` likewise), ``AZURE`` for
    ``az://container/blob`` (``AZURE_PUBLIC`` likewise), else ``HTTP``.
    ``ValueError`` where the URL is of no kind."""
    return RemoteEndpointType[infer_endpoint_kind(url)]
