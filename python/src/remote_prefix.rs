//! `RemotePrefix`: the objects under one S3 prefix as a directory — listed, sized, opened,
//! written and deleted through one client — over [`gpumap::remote::RemotePrefix`].

use gpumap::remote::{RemoteObjects as Objects, RemotePrefix as Prefix};
use gpumap::sync::Mutex;
use pyo3::prelude::*;

use crate::errors::{check, nogil};
use crate::remote::{RemoteFile, RemoteSettings, StatusCodes};
use crate::remote_writer::RemoteWriter;

/// The objects under `s3://bucket/prefix/`, `gs://bucket/prefix/` or `az://container/prefix/`
/// (credentials, region and endpoint from the AWS, Google or Azure environment;
/// `aws_endpoint_url` and `aws_region` override S3's endpoint and region). `unsigned=True`
/// sends requests unsigned (a public bucket), `False` signs them; left out, the prefix is
/// signed where credentials are configured, and otherwise unsigned if the bucket lists it to
/// an unsigned request, signed (an instance's role) if not. Names are keys relative to the
/// prefix; one that could leave it (`..`, an empty segment) is a `ValueError` before any
/// request. Every method releases the GIL while it waits for the server.
#[pyclass(module = "gpumapio", name = "RemotePrefix", frozen)]
pub struct RemotePrefix {
    prefix: Prefix,
}

#[pymethods]
impl RemotePrefix {
    #[new]
    #[pyo3(signature = (url, *, unsigned = None, aws_region = None, aws_endpoint_url = None, http_max_attempts = None, http_status_codes = None, http_timeout = None, max_in_flight = None, request_size = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        url: &str,
        unsigned: Option<bool>,
        aws_region: Option<String>,
        aws_endpoint_url: Option<String>,
        http_max_attempts: Option<u32>,
        http_status_codes: Option<StatusCodes>,
        http_timeout: Option<f64>,
        max_in_flight: Option<usize>,
        request_size: Option<u64>,
    ) -> PyResult<RemotePrefix> {
        let settings = RemoteSettings {
            http_max_attempts,
            http_status_codes: http_status_codes.map(StatusCodes::into_codes),
            http_timeout,
            max_in_flight,
            request_size,
            s3_endpoint: aws_endpoint_url,
            s3_region: aws_region,
            ..RemoteSettings::default()
        };
        let mut options = check(py, settings.options())?;
        let url = url.to_owned();
        let prefix = match unsigned {
            None => nogil(py, move || Prefix::open_auto(&url, &options))?,
            Some(unsigned) => {
                options.unsigned(unsigned);
                nogil(py, move || Prefix::open_with(&url, &options))?
            }
        };
        Ok(RemotePrefix { prefix })
    }

    /// Whether its requests go unsigned.
    #[getter]
    fn unsigned(&self) -> bool {
        self.prefix.is_unsigned()
    }

    /// `s3://bucket/prefix/`.
    #[getter]
    fn url(&self) -> String {
        self.prefix.url().to_string()
    }

    /// The URL of the object `name`.
    fn url_of(&self, py: Python<'_>, name: &str) -> PyResult<String> {
        Ok(check(py, self.prefix.url_of(name))?.to_string())
    }

    /// Opens the object `name` as a `RemoteFile` sharing this prefix's connections; `nbytes`,
    /// where known, spares the HEAD request.
    #[pyo3(signature = (name, nbytes = None))]
    fn open(&self, py: Python<'_>, name: &str, nbytes: Option<u64>) -> PyResult<RemoteFile> {
        let prefix = self.prefix.clone();
        let name = name.to_owned();
        let file = nogil(py, move || prefix.open_file(&name, nbytes))?;
        Ok(RemoteFile::wrap(file))
    }

    /// Starts writing the object `name` as a `RemoteWriter` (made visible whole by `finish`,
    /// replacing any object of that name).
    #[pyo3(signature = (name, *, part_size = None))]
    fn create(&self, py: Python<'_>, name: &str, part_size: Option<u64>) -> PyResult<RemoteWriter> {
        let mut options = self.prefix.options().clone();
        if let Some(bytes) = part_size {
            check(py, options.part_size(bytes).map(drop))?;
        }
        let prefix = self.prefix.clone();
        let name = name.to_owned();
        let writer = nogil(py, move || prefix.create_file(&name, Some(&options)))?;
        Ok(RemoteWriter::wrap(writer))
    }

    /// The size of the object `name`, or `None` where there is none.
    fn size(&self, py: Python<'_>, name: &str) -> PyResult<Option<u64>> {
        let prefix = self.prefix.clone();
        let name = name.to_owned();
        nogil(py, move || prefix.len_of(&name))
    }

    /// `(name, size)` of every object under `under` (`""`: the whole prefix), in key order, an
    /// iterator that asks for one page at a time.
    #[pyo3(signature = (under = ""))]
    fn list(&self, py: Python<'_>, under: &str) -> PyResult<RemoteObjects> {
        let objects = check(py, self.prefix.list(under))?;
        Ok(RemoteObjects { objects: Mutex::new(objects) })
    }

    /// One level under `under`: `([(name, size), ...], [dir name, ...])`, names relative to the
    /// prefix, dirs without a trailing `/`.
    #[pyo3(signature = (under = ""))]
    #[allow(clippy::type_complexity)]
    fn list_dir(&self, py: Python<'_>, under: &str) -> PyResult<(Vec<(String, u64)>, Vec<String>)> {
        let prefix = self.prefix.clone();
        let under = under.to_owned();
        let listing = nogil(py, move || prefix.list_dir(&under))?;
        let objects = listing.objects.into_iter().map(|e| (e.name, e.len)).collect();
        Ok((objects, listing.dirs))
    }

    /// Deletes the objects `names` (a thousand to a request); names with no object are no
    /// error. Every name is checked before anything is deleted.
    fn delete(&self, py: Python<'_>, names: Vec<String>) -> PyResult<()> {
        let prefix = self.prefix.clone();
        nogil(py, move || prefix.delete(&names))
    }

    fn __repr__(&self) -> String {
        format!("<gpumapio.RemotePrefix {}>", self.prefix.url())
    }
}

/// The objects under a level of a `RemotePrefix`: `(name, size)` pairs in key order.
#[pyclass(module = "gpumapio", name = "RemoteObjects", frozen)]
pub struct RemoteObjects {
    objects: Mutex<Objects>,
}

#[pymethods]
impl RemoteObjects {
    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<(String, u64)>> {
        let objects = &self.objects;
        let next = nogil(py, move || objects.lock().next().transpose())?;
        Ok(next.map(|e| (e.name, e.len)))
    }
}
