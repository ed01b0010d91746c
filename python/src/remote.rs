//! `RemoteFile`: KvikIO's remote file (S3, HTTP, presigned S3 URLs), over
//! [`gpumap::remote::RemoteFile`].

use std::time::Duration;

use gpumap::remote::{RemoteFile as Remote, RemoteOptions, RemoteUrl};
use parking_lot::Mutex;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::buffers::destination;
use crate::errors::{check, nogil, wait_interruptibly};
use crate::future::IOFuture;

/// The settings every constructor takes as keywords, beyond KvikIO's `nbytes`: the retry
/// settings (`None`: `gpumapio.defaults`' `http_max_attempts`, `http_status_codes` and
/// `http_timeout` when the file opens) and gpumap's own (requests in flight, request size, S3
/// endpoint and region).
#[derive(Default)]
pub(crate) struct RemoteSettings {
    pub(crate) nbytes: Option<u64>,
    pub(crate) http_max_attempts: Option<u32>,
    pub(crate) http_status_codes: Option<Vec<u16>>,
    pub(crate) http_timeout: Option<f64>,
    pub(crate) max_in_flight: Option<usize>,
    pub(crate) request_size: Option<u64>,
    pub(crate) s3_endpoint: Option<String>,
    pub(crate) s3_region: Option<String>,
}

impl RemoteSettings {
    /// The options these settings make, `gpumapio.defaults` filling what is not given.
    pub(crate) fn options(&self) -> gpumap::Result<RemoteOptions> {
        let mut o = RemoteOptions::from_config(&crate::defaults::current()?)?;
        o.known_len(self.nbytes).s3_endpoint(self.s3_endpoint.clone());
        o.s3_region(self.s3_region.clone());
        if let Some(n) = self.http_max_attempts {
            o.max_attempts(n)?;
        }
        if let Some(codes) = &self.http_status_codes {
            o.retry_status_codes(codes)?;
        }
        if let Some(seconds) = self.http_timeout {
            let timeout = Duration::try_from_secs_f64(seconds).map_err(|_| {
                gpumap::Error::InvalidArgument(format!("http_timeout {seconds} is not a duration"))
            })?;
            o.timeout(timeout)?;
        }
        o.max_in_flight(self.max_in_flight)?;
        if let Some(bytes) = self.request_size {
            o.request_size(bytes)?;
        }
        Ok(o)
    }

    fn open(&self, py: Python<'_>, url: RemoteUrl) -> PyResult<RemoteFile> {
        let options = check(py, self.options())?;
        let file = nogil(py, move || Remote::open_url(url, &options))?;
        Ok(RemoteFile { file: Mutex::new(Some(file)) })
    }
}

/// A read-only remote file: an S3 object or an HTTP(S) URL, read with parallel ranged GETs
/// into host or device memory. Open it with one of the constructors (`open_http`,
/// `open_s3`, `open_s3_url`, `open_s3_presigned_url`, `open`).
#[pyclass(module = "gpumapio", name = "RemoteFile", frozen)]
pub struct RemoteFile {
    /// `None` once closed.
    file: Mutex<Option<Remote>>,
}

impl RemoteFile {
    /// An open file, as the Python object (a `RemotePrefix`'s files are opened by it).
    pub(crate) fn wrap(file: Remote) -> RemoteFile {
        RemoteFile { file: Mutex::new(Some(file)) }
    }
}

fn parse(py: Python<'_>, url: &str) -> PyResult<RemoteUrl> {
    check(py, RemoteUrl::parse(url))
}

/// The `http_status_codes` keyword: the HTTP statuses to retry. An item that is not a status
/// (a bool, a float, a number past a `u16`) is named in the error, as a status outside 100 to
/// 599 is by [`RemoteOptions::retry_status_codes`].
pub(crate) struct StatusCodes(Vec<u16>);

impl<'a, 'py> FromPyObject<'a, 'py> for StatusCodes {
    type Error = PyErr;

    fn extract(ob: pyo3::Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let items = ob.try_iter().map_err(|_| {
            PyTypeError::new_err(format!(
                "http_status_codes has incorrect type (expected a list of int, got {})",
                ob.get_type().name().map(|n| n.to_string()).unwrap_or_default()
            ))
        })?;
        let mut codes = Vec::new();
        for item in items {
            let item = item?;
            let code = match item.is_instance_of::<pyo3::types::PyBool>() {
                true => None,
                false => item.extract::<i64>().ok().and_then(|c| u16::try_from(c).ok()),
            };
            match code {
                Some(code) => codes.push(code),
                None => {
                    return Err(PyValueError::new_err(format!(
                        "http_status_codes: {} is not an HTTP status code (100 to 599)",
                        item.repr()?
                    )))
                }
            }
        }
        Ok(StatusCodes(codes))
    }
}

impl StatusCodes {
    pub(crate) fn into_codes(self) -> Vec<u16> {
        self.0
    }
}

macro_rules! settings {
    ($nbytes:expr, $a:expr, $c:expr, $t:expr, $f:expr, $r:expr, $e:expr, $g:expr) => {
        RemoteSettings {
            nbytes: $nbytes,
            http_max_attempts: $a,
            http_status_codes: $c.map(StatusCodes::into_codes),
            http_timeout: $t,
            max_in_flight: $f,
            request_size: $r,
            s3_endpoint: $e,
            s3_region: $g,
        }
    };
}

#[pymethods]
impl RemoteFile {
    /// Opens an `http://` or `https://` URL.
    #[staticmethod]
    #[pyo3(signature = (url, nbytes = None, *, http_max_attempts = None, http_status_codes = None, http_timeout = None, max_in_flight = None, request_size = None))]
    #[allow(clippy::too_many_arguments)]
    fn open_http(
        py: Python<'_>,
        url: &str,
        nbytes: Option<u64>,
        http_max_attempts: Option<u32>,
        http_status_codes: Option<StatusCodes>,
        http_timeout: Option<f64>,
        max_in_flight: Option<usize>,
        request_size: Option<u64>,
    ) -> PyResult<RemoteFile> {
        // Asked for as plain HTTP, a URL is read as plain HTTP, whatever its path looks like.
        let parsed = match parse(py, url)? {
            RemoteUrl::WebHdfs(u) => RemoteUrl::Http(u),
            RemoteUrl::Http(u) => RemoteUrl::Http(u),
            other => {
                return Err(PyValueError::new_err(format!("{other} is not an http(s):// URL")))
            }
        };
        settings!(
            nbytes,
            http_max_attempts,
            http_status_codes,
            http_timeout,
            max_in_flight,
            request_size,
            None,
            None
        )
        .open(py, parsed)
    }

    /// Opens a WebHDFS file: `http(s)://namenode:port/webhdfs/v1/<path>` (its query, such as
    /// `user.name`, goes with every request), or `webhdfs://host:port/<path>`. The size comes
    /// from `GETFILESTATUS`, ranges from `OPEN` (through the datanode it redirects to).
    #[staticmethod]
    #[pyo3(signature = (url, nbytes = None, *, http_max_attempts = None, http_status_codes = None, http_timeout = None, max_in_flight = None, request_size = None))]
    #[allow(clippy::too_many_arguments)]
    fn open_webhdfs(
        py: Python<'_>,
        url: &str,
        nbytes: Option<u64>,
        http_max_attempts: Option<u32>,
        http_status_codes: Option<StatusCodes>,
        http_timeout: Option<f64>,
        max_in_flight: Option<usize>,
        request_size: Option<u64>,
    ) -> PyResult<RemoteFile> {
        let parsed = check(py, RemoteUrl::webhdfs(url))?;
        settings!(
            nbytes,
            http_max_attempts,
            http_status_codes,
            http_timeout,
            max_in_flight,
            request_size,
            None,
            None
        )
        .open(py, parsed)
    }

    /// Opens the S3 object `object_name` of `bucket_name`, with credentials, region and
    /// endpoint from the AWS environment variables (`aws_endpoint_url` and `aws_region`
    /// override the last two).
    #[staticmethod]
    #[pyo3(signature = (bucket_name, object_name, nbytes = None, *, aws_region = None, aws_endpoint_url = None, http_max_attempts = None, http_status_codes = None, http_timeout = None, max_in_flight = None, request_size = None))]
    #[allow(clippy::too_many_arguments)]
    fn open_s3(
        py: Python<'_>,
        bucket_name: &str,
        object_name: &str,
        nbytes: Option<u64>,
        aws_region: Option<String>,
        aws_endpoint_url: Option<String>,
        http_max_attempts: Option<u32>,
        http_status_codes: Option<StatusCodes>,
        http_timeout: Option<f64>,
        max_in_flight: Option<usize>,
        request_size: Option<u64>,
    ) -> PyResult<RemoteFile> {
        let url = check(py, RemoteUrl::s3(bucket_name, object_name))?;
        settings!(
            nbytes,
            http_max_attempts,
            http_status_codes,
            http_timeout,
            max_in_flight,
            request_size,
            aws_endpoint_url,
            aws_region
        )
        .open(py, url)
    }

    /// Opens an `s3://bucket/key` URL, as `open_s3` does.
    #[staticmethod]
    #[pyo3(signature = (url, nbytes = None, *, aws_region = None, aws_endpoint_url = None, http_max_attempts = None, http_status_codes = None, http_timeout = None, max_in_flight = None, request_size = None))]
    #[allow(clippy::too_many_arguments)]
    fn open_s3_url(
        py: Python<'_>,
        url: &str,
        nbytes: Option<u64>,
        aws_region: Option<String>,
        aws_endpoint_url: Option<String>,
        http_max_attempts: Option<u32>,
        http_status_codes: Option<StatusCodes>,
        http_timeout: Option<f64>,
        max_in_flight: Option<usize>,
        request_size: Option<u64>,
    ) -> PyResult<RemoteFile> {
        let parsed = parse(py, url)?;
        if !matches!(parsed, RemoteUrl::S3 { .. }) {
            return Err(PyValueError::new_err(format!(
                "{parsed} is not an s3:// URL (https S3 URLs: use open_s3(bucket, key) or \
                 open_http for a presigned one)"
            )));
        }
        settings!(
            nbytes,
            http_max_attempts,
            http_status_codes,
            http_timeout,
            max_in_flight,
            request_size,
            aws_endpoint_url,
            aws_region
        )
        .open(py, parsed)
    }

    /// Opens a presigned S3 URL: plain HTTPS whose query string carries the signature (never
    /// shown in messages).
    #[staticmethod]
    #[pyo3(signature = (presigned_url, nbytes = None, *, http_max_attempts = None, http_status_codes = None, http_timeout = None, max_in_flight = None, request_size = None))]
    #[allow(clippy::too_many_arguments)]
    fn open_s3_presigned_url(
        py: Python<'_>,
        presigned_url: &str,
        nbytes: Option<u64>,
        http_max_attempts: Option<u32>,
        http_status_codes: Option<StatusCodes>,
        http_timeout: Option<f64>,
        max_in_flight: Option<usize>,
        request_size: Option<u64>,
    ) -> PyResult<RemoteFile> {
        Self::open_http(
            py,
            presigned_url,
            nbytes,
            http_max_attempts,
            http_status_codes,
            http_timeout,
            max_in_flight,
            request_size,
        )
    }

    /// Opens `url`, its kind inferred from the scheme: `s3://` (signed with the environment's
    /// credentials) or `http(s)://` (a presigned URL among them). `remote_endpoint_type` (a
    /// `RemoteEndpointType` or its name; `None` or `AUTO`: inferred) must agree with the URL,
    /// and the kind must be in `allow_list` where one is given.
    #[staticmethod]
    #[pyo3(signature = (url, remote_endpoint_type = None, allow_list = None, nbytes = None, *, aws_region = None, aws_endpoint_url = None, http_max_attempts = None, http_status_codes = None, http_timeout = None, max_in_flight = None, request_size = None))]
    #[allow(clippy::too_many_arguments)]
    fn open(
        py: Python<'_>,
        url: &str,
        remote_endpoint_type: Option<&Bound<'_, PyAny>>,
        allow_list: Option<Vec<Bound<'_, PyAny>>>,
        nbytes: Option<u64>,
        aws_region: Option<String>,
        aws_endpoint_url: Option<String>,
        http_max_attempts: Option<u32>,
        http_status_codes: Option<StatusCodes>,
        http_timeout: Option<f64>,
        max_in_flight: Option<usize>,
        request_size: Option<u64>,
    ) -> PyResult<RemoteFile> {
        let parsed = parse(py, url)?;
        let inferred = match &parsed {
            RemoteUrl::S3 { .. } => "S3",
            RemoteUrl::WebHdfs(_) => "WEBHDFS",
            RemoteUrl::Http(u) if u.query().is_some_and(|q| q.contains("X-Amz-Signature")) => {
                "S3_PRESIGNED_URL"
            }
            _ => "HTTP",
        };
        let asked = match remote_endpoint_type {
            Some(kind) => endpoint_name(kind)?,
            None => "AUTO".to_owned(),
        };
        // A presigned URL is also a plain HTTP URL: either name accepts it.
        let agrees =
            |name: &str| name == inferred || (inferred == "S3_PRESIGNED_URL" && name == "HTTP");
        if asked != "AUTO" && !agrees(&asked) {
            return Err(PyValueError::new_err(format!(
                "{parsed} is not a {asked} endpoint (gpumapio reads S3, S3_PRESIGNED_URL, \
                 WEBHDFS and HTTP endpoints)"
            )));
        }
        if let Some(allowed) = allow_list {
            let names = allowed.iter().map(endpoint_name).collect::<PyResult<Vec<_>>>()?;
            if !names.iter().any(|n| agrees(n)) {
                return Err(PyValueError::new_err(format!(
                    "{parsed} is a {inferred} endpoint, not in the allow list {names:?}"
                )));
            }
        }
        settings!(
            nbytes,
            http_max_attempts,
            http_status_codes,
            http_timeout,
            max_in_flight,
            request_size,
            aws_endpoint_url,
            aws_region
        )
        .open(py, parsed)
    }

    /// The object's size in bytes.
    fn nbytes(&self) -> PyResult<u64> {
        Ok(self.file()?.len())
    }

    /// The URL, without credentials or query string.
    #[getter]
    fn url(&self) -> PyResult<String> {
        Ok(self.file()?.url().to_string())
    }

    /// Reads `size` bytes (default: the buffer's size) at `file_offset` into `buf` (host or
    /// device memory) and returns the count; the range must lie inside the object.
    #[pyo3(signature = (buf, size = None, file_offset = 0))]
    fn read(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        size: Option<usize>,
        file_offset: u64,
    ) -> PyResult<usize> {
        let file = self.file()?;
        let dst = destination(py, buf, size, 0)?;
        let (dst, n) = wait_interruptibly(py, file.pread_device(dst, file_offset))?;
        drop(dst);
        Ok(n)
    }

    /// Starts [`read`](Self::read) in the background; returns an `IOFuture` whose `get()`
    /// gives the count.
    #[pyo3(signature = (buf, size = None, file_offset = 0))]
    fn pread(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        size: Option<usize>,
        file_offset: u64,
    ) -> PyResult<IOFuture> {
        let file = self.file()?;
        let dst = destination(py, buf, size, 0)?;
        Ok(IOFuture::pending(Box::new(file.pread_device(dst, file_offset))))
    }

    /// Closes the file; reads in flight finish.
    fn close(&self) {
        self.file.lock().take();
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) {
        self.close();
    }

    fn __repr__(&self) -> String {
        match self.file.lock().as_ref() {
            Some(f) => format!("<gpumapio.RemoteFile {} ({} bytes)>", f.url(), f.len()),
            None => "<gpumapio.RemoteFile (closed)>".to_owned(),
        }
    }
}

impl RemoteFile {
    fn file(&self) -> PyResult<Remote> {
        self.file
            .lock()
            .clone()
            .ok_or_else(|| PyValueError::new_err("I/O operation on a closed RemoteFile"))
    }
}

/// The name of a `RemoteEndpointType` member (its `.name`), or the name given as a string.
fn endpoint_name(kind: &Bound<'_, PyAny>) -> PyResult<String> {
    let name: String = match kind.getattr("name") {
        Ok(name) => name.extract()?,
        Err(_) => kind.extract()?,
    };
    Ok(name.to_ascii_uppercase())
}
