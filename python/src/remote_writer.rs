//! `RemoteWriter`: a new S3, GCS or Azure object written from host or device memory as a
//! multipart upload,
//! over [`gpumap::remote::RemoteWriter`] (docs/remote.md).

use std::sync::Arc;

use gpumap::remote::{RemoteUrl, RemoteWriter as Writer};
use gpumap::sync::Mutex;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::buffers::source;
use crate::errors::{check, nogil};
use crate::remote::{RemoteSettings, StatusCodes};

/// A new S3, GCS or Azure object, written with `write(buf, file_offset=...)` at any offsets (from any
/// threads: each call releases the GIL) and made visible, whole, by `finish()`. Any failure,
/// `abort()`, `close()` before `finish()`, or leaving a `with` block by an exception aborts
/// the upload: no object is written — but for a completion whose answer was lost (a timeout,
/// a broken connection, an answer that cannot be read), whose error says that the object may
/// exist. A writer collected unfinished aborts too, waiting for its parts in flight without
/// the GIL.
#[pyclass(module = "gpumapio", name = "RemoteWriter", frozen)]
pub struct RemoteWriter {
    /// `None` once closed. Shared so that writes from many threads run at once, the lock held
    /// only to take a reference.
    writer: Mutex<Option<Arc<Writer>>>,
}

impl Drop for RemoteWriter {
    fn drop(&mut self) {
        let Some(writer) = self.writer.get_mut().take() else { return };
        // SAFETY: a plain query, valid at any time.
        if unsafe { pyo3::ffi::Py_IsInitialized() } == 0 {
            return drop(writer);
        }
        // An unfinished writer's drop aborts its upload, waiting on the network: without the
        // GIL, so that other threads (an in-process server among them) run meanwhile.
        Python::attach(|py| py.detach(move || drop(writer)));
    }
}

#[pymethods]
impl RemoteWriter {
    /// Starts writing the object at `url` (`s3://bucket/key`), with credentials, region and
    /// endpoint from the AWS environment (`aws_endpoint_url` and `aws_region` override the
    /// last two). Nothing is sent until a part of `part_size` bytes is whole.
    #[new]
    #[pyo3(signature = (url, *, part_size = None, max_in_flight = None, aws_region = None, aws_endpoint_url = None, http_max_attempts = None, http_status_codes = None, http_timeout = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        url: &str,
        part_size: Option<u64>,
        max_in_flight: Option<usize>,
        aws_region: Option<String>,
        aws_endpoint_url: Option<String>,
        http_max_attempts: Option<u32>,
        http_status_codes: Option<StatusCodes>,
        http_timeout: Option<f64>,
    ) -> PyResult<RemoteWriter> {
        let parsed = check(py, RemoteUrl::parse(url))?;
        let settings = RemoteSettings {
            http_max_attempts,
            http_status_codes: http_status_codes.map(StatusCodes::into_codes),
            http_timeout,
            max_in_flight,
            s3_endpoint: aws_endpoint_url,
            s3_region: aws_region,
            ..RemoteSettings::default()
        };
        let mut options = check(py, settings.options())?;
        if let Some(bytes) = part_size {
            check(py, options.part_size(bytes).map(drop))?;
        }
        let writer = nogil(py, move || Writer::create_url(parsed, &options))?;
        Ok(RemoteWriter { writer: Mutex::new(Some(Arc::new(writer))) })
    }

    /// Writes `size` bytes (default: the buffer's size) of `buf` (host or device memory) at
    /// `file_offset` and returns the count; the bytes are copied before it returns.
    #[pyo3(signature = (buf, size = None, file_offset = 0))]
    fn write(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        size: Option<usize>,
        file_offset: u64,
    ) -> PyResult<usize> {
        let writer = self.writer()?;
        let src = source(py, buf, size, 0)?;
        let n = nogil(py, || writer.pwrite_device(src.view(), file_offset));
        drop(src);
        n
    }

    /// Sends what remains and completes the upload; returns the object's size. A hole (a
    /// byte below the end never written) is a `ValueError` naming its offset, and aborts.
    fn finish(&self, py: Python<'_>) -> PyResult<u64> {
        let writer = self.writer()?;
        nogil(py, move || writer.finish())
    }

    /// Abandons the upload: no object is written.
    fn abort(&self, py: Python<'_>) -> PyResult<()> {
        let writer = self.writer()?;
        nogil(py, move || writer.abort())
    }

    /// One past the highest byte written so far.
    fn nbytes(&self) -> PyResult<u64> {
        Ok(self.writer()?.len())
    }

    /// Bytes of each part but the last.
    #[getter]
    fn part_size(&self) -> PyResult<u64> {
        Ok(self.writer()?.part_size())
    }

    /// The URL, without credentials.
    #[getter]
    fn url(&self) -> PyResult<String> {
        Ok(self.writer()?.url().to_string())
    }

    /// Lets the writer go: an unfinished upload is aborted (waiting for its parts in flight).
    fn close(&self, py: Python<'_>) {
        let writer = self.writer.lock().take();
        py.detach(move || drop(writer));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Finishes the upload when the block ends normally; aborts it when it ends by an
    /// exception (which goes on).
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: &Bound<'_, PyAny>,
        _exc: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let finished = if exc_type.is_none() {
            self.writer().and_then(|writer| nogil(py, move || writer.finish()).map(drop))
        } else {
            Ok(())
        };
        self.close(py);
        finished.map(|()| false)
    }

    fn __repr__(&self) -> String {
        match self.writer.lock().as_ref() {
            Some(w) => format!("<gpumapio.RemoteWriter {} ({} bytes written)>", w.url(), w.len()),
            None => "<gpumapio.RemoteWriter (closed)>".to_owned(),
        }
    }
}

impl RemoteWriter {
    /// A writer started elsewhere (a `RemotePrefix`'s), as the Python object.
    pub(crate) fn wrap(writer: Writer) -> RemoteWriter {
        RemoteWriter { writer: Mutex::new(Some(Arc::new(writer))) }
    }

    fn writer(&self) -> PyResult<Arc<Writer>> {
        self.writer
            .lock()
            .clone()
            .ok_or_else(|| PyValueError::new_err("I/O operation on a closed RemoteWriter"))
    }
}
