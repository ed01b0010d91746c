//! `RemoteFile`: KvikIO's remote file (S3 signed or public, HTTP, presigned S3 URLs, WebHDFS), over
//! [`gpumap::remote::RemoteFile`].

use std::time::Duration;

use gpumap::remote::{EndpointKind, RemoteFile as Remote, RemoteOptions, RemoteUrl, S3Credentials};
use gpumap::sync::Mutex;
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
    pub(crate) s3_credentials: Option<S3Credentials>,
}

impl RemoteSettings {
    /// The options these settings make, `gpumapio.defaults` filling what is not given.
    pub(crate) fn options(&self) -> gpumap::Result<RemoteOptions> {
        let mut o = RemoteOptions::from_config(&crate::defaults::current()?)?;
        o.known_len(self.nbytes).s3_endpoint(self.s3_endpoint.clone());
        o.s3_region(self.s3_region.clone()).s3_credentials(self.s3_credentials.clone());
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

    /// Opens `url` as an endpoint of `kind` ([`Remote::open_as`]).
    fn open_as(&self, py: Python<'_>, url: &str, kind: EndpointKind) -> PyResult<RemoteFile> {
        let options = check(py, self.options())?;
        let text = url.to_owned();
        let file = nogil(py, move || Remote::open_as(&text, kind, &options))?;
        Ok(RemoteFile { file: Mutex::new(Some(file)) })
    }
}

/// A read-only remote file: an S3, GCS or Azure object or an HTTP(S) URL, read with parallel
/// ranged GETs into host or device memory. Open it with one of the constructors (`open_http`,
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
            s3_credentials: None,
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
    /// endpoint from the arguments, else the AWS environment variables and files (KvikIO's
    /// arguments, in its order; `aws_region` is gpumapio's own name for `aws_region_name`).
    #[staticmethod]
    #[pyo3(signature = (bucket_name, object_name, nbytes = None, aws_region_name = None, aws_access_key_id = None, aws_secret_access_key = None, aws_endpoint_url = None, aws_session_token = None, *, aws_region = None, http_max_attempts = None, http_status_codes = None, http_timeout = None, max_in_flight = None, request_size = None))]
    #[allow(clippy::too_many_arguments)]
    fn open_s3(
        py: Python<'_>,
        bucket_name: &str,
        object_name: &str,
        nbytes: Option<u64>,
        aws_region_name: Option<String>,
        aws_access_key_id: Option<String>,
        aws_secret_access_key: Option<String>,
        aws_endpoint_url: Option<String>,
        aws_session_token: Option<String>,
        aws_region: Option<String>,
        http_max_attempts: Option<u32>,
        http_status_codes: Option<StatusCodes>,
        http_timeout: Option<f64>,
        max_in_flight: Option<usize>,
        request_size: Option<u64>,
    ) -> PyResult<RemoteFile> {
        let url = check(py, RemoteUrl::s3(bucket_name, object_name))?;
        let mut settings = settings!(
            nbytes,
            http_max_attempts,
            http_status_codes,
            http_timeout,
            max_in_flight,
            request_size,
            aws_endpoint_url,
            one_region(aws_region_name, aws_region)?
        );
        settings.s3_credentials =
            credentials(aws_access_key_id, aws_secret_access_key, aws_session_token)?;
        settings.open(py, url)
    }

    /// Opens an S3 object by its URL: `s3://bucket/key` (its endpoint as `open_s3`'s), or an
    /// `http(s)://` URL, on an AWS host in one of S3's forms
    /// (`https://bucket.s3.us-east-2.amazonaws.com/key`, `https://s3.us-east-2.amazonaws.com/bucket/key`,
    /// and the legacy ones) or on any other host path style (`http://127.0.0.1:9000/bucket/key`,
    /// MinIO, moto), requests going to that host, signed as KvikIO's `open_s3_url` signs them.
    #[staticmethod]
    #[pyo3(signature = (url, nbytes = None, aws_region_name = None, aws_access_key_id = None, aws_secret_access_key = None, aws_endpoint_url = None, aws_session_token = None, *, aws_region = None, http_max_attempts = None, http_status_codes = None, http_timeout = None, max_in_flight = None, request_size = None))]
    #[allow(clippy::too_many_arguments)]
    fn open_s3_url(
        py: Python<'_>,
        url: &str,
        nbytes: Option<u64>,
        aws_region_name: Option<String>,
        aws_access_key_id: Option<String>,
        aws_secret_access_key: Option<String>,
        aws_endpoint_url: Option<String>,
        aws_session_token: Option<String>,
        aws_region: Option<String>,
        http_max_attempts: Option<u32>,
        http_status_codes: Option<StatusCodes>,
        http_timeout: Option<f64>,
        max_in_flight: Option<usize>,
        request_size: Option<u64>,
    ) -> PyResult<RemoteFile> {
        let mut settings = settings!(
            nbytes,
            http_max_attempts,
            http_status_codes,
            http_timeout,
            max_in_flight,
            request_size,
            aws_endpoint_url,
            one_region(aws_region_name, aws_region)?
        );
        settings.s3_credentials =
            credentials(aws_access_key_id, aws_secret_access_key, aws_session_token)?;
        settings.open_as(py, url, EndpointKind::S3)
    }

    /// Opens an S3 object anyone may read (KvikIO's `open_s3_public`): `url` as `open_s3_url`
    /// takes it, requests sent unsigned, no credentials looked for.
    #[staticmethod]
    #[pyo3(signature = (url, nbytes = None, *, aws_region = None, aws_endpoint_url = None, http_max_attempts = None, http_status_codes = None, http_timeout = None, max_in_flight = None, request_size = None))]
    #[allow(clippy::too_many_arguments)]
    fn open_s3_public(
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
        .open_as(py, url, EndpointKind::S3Public)
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

    /// Opens `url` as KvikIO's `open` does. With `remote_endpoint_type` `AUTO` (or `None`),
    /// the kinds of `allow_list` (default: `S3`, `S3_PUBLIC`, `S3_PRESIGNED_URL`, `WEBHDFS`,
    /// `HTTP`, then gpumap's own `GCS`, `GCS_PUBLIC`, `AZURE` and `AZURE_PUBLIC`) are tried in
    /// its order and the first whose form the URL has is taken; an S3 (or GCS, or Azure) object
    /// is then read signed or unsigned, the other way tried after a refusal, where `S3_PUBLIC`
    /// (`GCS_PUBLIC`, `AZURE_PUBLIC`) is allowed
    /// ([`Remote::open_auto`], `docs/remote.md`). A kind named must be in `allow_list` where
    /// one is given, and the URL must have its form. Kinds are `RemoteEndpointType` members or
    /// their names.
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
        let asked = remote_endpoint_type.map(endpoint_kind).transpose()?.flatten();
        let allowed = match allow_list {
            Some(list) => list
                .iter()
                .map(|item| {
                    endpoint_kind(item)?.ok_or_else(|| {
                        PyValueError::new_err("AUTO is not an endpoint type an allow list holds")
                    })
                })
                .collect::<PyResult<Vec<_>>>()?,
            None => EndpointKind::ALL.to_vec(),
        };
        let settings = settings!(
            nbytes,
            http_max_attempts,
            http_status_codes,
            http_timeout,
            max_in_flight,
            request_size,
            aws_endpoint_url,
            aws_region
        );
        let Some(kind) = asked else {
            if EndpointKind::infer(url, &allowed).is_none() {
                let shown = parse(py, url)?.redacted();
                let names: Vec<&str> = allowed.iter().map(|k| k.name()).collect();
                return Err(PyValueError::new_err(format!(
                    "{shown} is not a URL of any endpoint type in the allow list {names:?}"
                )));
            }
            let options = check(py, settings.options())?;
            let text = url.to_owned();
            let file = nogil(py, move || Remote::open_auto(&text, &allowed, &options))?;
            return Ok(RemoteFile::wrap(file));
        };
        if !allowed.contains(&kind) {
            let names: Vec<&str> = allowed.iter().map(|k| k.name()).collect();
            return Err(PyValueError::new_err(format!(
                "the endpoint type {kind} is not in the allow list {names:?}"
            )));
        }
        if !kind.accepts(url) {
            let shown = parse(py, url)?.redacted();
            return Err(PyValueError::new_err(format!("{shown} is not a {kind} endpoint")));
        }
        settings.open_as(py, url, kind)
    }

    /// How the file is read, as a `RemoteEndpointType` (KvikIO's `remote_endpoint_type()`).
    fn remote_endpoint_type<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let kind = self.file()?.endpoint_kind();
        py.import("gpumapio.remote_file")?.getattr("RemoteEndpointType")?.get_item(kind.name())
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

/// The kind a `RemoteEndpointType` member (its `.name`) or a name given as a string names
/// (`None`: `AUTO`).
fn endpoint_kind(kind: &Bound<'_, PyAny>) -> PyResult<Option<EndpointKind>> {
    let name: String = match kind.getattr("name") {
        Ok(name) => name.extract()?,
        Err(_) => kind.extract()?,
    };
    let name = name.to_ascii_uppercase();
    if name == "AUTO" {
        return Ok(None);
    }
    EndpointKind::from_name(&name).map(Some).ok_or_else(|| {
        PyValueError::new_err(format!(
            "{name:?} is not an endpoint type (AUTO, S3, S3_PUBLIC, S3_PRESIGNED_URL, WEBHDFS, \
             HTTP, GCS, GCS_PUBLIC, AZURE, AZURE_PUBLIC)"
        ))
    })
}

/// The kind KvikIO's `open` would take `url` as with `AUTO` (KvikIO's
/// `infer_remote_endpoint_type`), by its form alone; `ValueError` naming the URL (as it may
/// be shown) where no kind of `allow_list` (default: all) fits.
#[pyfunction]
#[pyo3(signature = (url, allow_list = None))]
pub(crate) fn infer_endpoint_kind(
    py: Python<'_>,
    url: &str,
    allow_list: Option<Vec<Bound<'_, PyAny>>>,
) -> PyResult<&'static str> {
    let allowed = match allow_list {
        Some(list) => list
            .iter()
            .filter_map(|k| endpoint_kind(k).transpose())
            .collect::<PyResult<Vec<_>>>()?,
        None => EndpointKind::ALL.to_vec(),
    };
    match EndpointKind::infer(url, &allowed) {
        Some(kind) => Ok(kind.name()),
        None => Err(PyValueError::new_err(format!(
            "{} is not a URL of any remote endpoint type",
            parse(py, url)?.redacted()
        ))),
    }
}

/// The region given under KvikIO's name (`aws_region_name`) or gpumapio's (`aws_region`).
fn one_region(kvikio: Option<String>, ours: Option<String>) -> PyResult<Option<String>> {
    match (kvikio, ours) {
        (Some(a), Some(b)) if a != b => Err(PyValueError::new_err(format!(
            "aws_region_name {a:?} and aws_region {b:?} disagree; give one"
        ))),
        (a, b) => Ok(a.or(b)),
    }
}

/// The credentials KvikIO's arguments give, where any is given: the missing one of the key
/// pair from `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`. None given: the environment's and
/// the AWS files', looked up when the file opens.
fn credentials(
    access_key_id: Option<String>,
    secret_access_key: Option<String>,
    session_token: Option<String>,
) -> PyResult<Option<S3Credentials>> {
    if access_key_id.is_none() && secret_access_key.is_none() && session_token.is_none() {
        return Ok(None);
    }
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let key_id = access_key_id.or_else(|| env("AWS_ACCESS_KEY_ID")).ok_or_else(|| {
        PyValueError::new_err("aws_access_key_id is needed (or AWS_ACCESS_KEY_ID)")
    })?;
    let secret = secret_access_key.or_else(|| env("AWS_SECRET_ACCESS_KEY")).ok_or_else(|| {
        PyValueError::new_err("aws_secret_access_key is needed (or AWS_SECRET_ACCESS_KEY)")
    })?;
    S3Credentials::new(key_id, secret, session_token)
        .map(Some)
        .map_err(|e| PyValueError::new_err(e.to_string()))
}
