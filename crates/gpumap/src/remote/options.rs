//! [`RemoteOptions`]: how a [`RemoteFile`](super::RemoteFile) or a
//! [`RemoteWriter`](super::RemoteWriter) talks to its server.
//!
//! [`RemoteOptions::default`] holds KvikIO's built-in retry values; [`RemoteOptions::from_config`]
//! takes them from the settings table instead (`http_max_attempts`, `http_status_codes`,
//! `http_timeout`: `GPUMAP_HTTP_*`, or KvikIO's `KVIKIO_HTTP_*`), which is where
//! [`RemoteFile::open`](super::RemoteFile::open), [`RemoteWriter::create`](super::RemoteWriter::create),
//! the CLI and the Python binding start, so that code moving from KvikIO sees the same behaviour.
#![forbid(unsafe_code)]

use std::time::Duration;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::remote::parts::{MAX_PART_SIZE, MIN_PART_SIZE};

/// The most requests one read keeps in flight, whatever is asked: each holds a connection and
/// up to one request's bytes, so the bound caps both.
pub const MAX_IN_FLIGHT: usize = 1024;

/// The largest request size accepted: the bytes one ranged GET brings, held in memory until
/// they are placed.
pub const MAX_REQUEST_SIZE: u64 = 1 << 30;

/// The most host memory one read into GPU memory stages at once (each range in flight lands
/// in host memory of its own before its upload): requests in flight are lowered to fit.
pub const MAX_STAGED_BYTES: u64 = 4 << 30;

/// Requests in flight when none is asked for: object stores serve each connection far slower
/// than a NIC can take, so throughput grows with requests in flight (cuDF #23633); the bound
/// keeps a default read within `AUTO_IN_FLIGHT × request_size` bytes of memory.
pub const AUTO_IN_FLIGHT: usize = 64;

/// The bytes of one part of an upload when none is asked for: parts go out as soon as they are
/// whole, so smaller parts start sending sooner, while [`MAX_PARTS`](super::MAX_PARTS) of them bound the object
/// (156 GiB at this size).
pub const DEFAULT_PART_SIZE: u64 = 16 << 20;

/// Settings of remote reads and writes. Build with [`RemoteOptions::from_config`] (or
/// [`RemoteOptions::default`]) and the setters.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RemoteOptions {
    pub(crate) max_attempts: u32,
    pub(crate) retry_status_codes: Vec<u16>,
    pub(crate) timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) backoff_initial: Duration,
    pub(crate) backoff_max: Duration,
    pub(crate) max_in_flight: Option<usize>,
    pub(crate) request_size: u64,
    pub(crate) part_size: u64,
    pub(crate) known_len: Option<u64>,
    pub(crate) s3_endpoint: Option<String>,
    pub(crate) s3_region: Option<String>,
    pub(crate) s3_virtual_hosted: bool,
    pub(crate) unsigned: bool,
    pub(crate) s3_credentials: Option<S3Credentials>,
}

/// S3 credentials given by the caller (KvikIO's `aws_access_key_id`, `aws_secret_access_key`
/// and `aws_session_token` arguments), used instead of the environment's and the AWS files'.
/// Shown without the secret or the token.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Credentials {
    pub(crate) access_key_id: String,
    pub(crate) secret_access_key: String,
    pub(crate) session_token: Option<String>,
}

impl S3Credentials {
    /// A key pair, and the session token temporary credentials need. Where no token is given
    /// and the key is a temporary one (`ASIA...`), `AWS_SESSION_TOKEN` supplies it, as KvikIO
    /// reads it; a permanent key is sent without one.
    pub fn new(
        access_key_id: impl Into<String>,
        secret_access_key: impl Into<String>,
        session_token: Option<String>,
    ) -> Result<S3Credentials> {
        let (access_key_id, secret_access_key) = (access_key_id.into(), secret_access_key.into());
        let plain = is_plain_credential;
        if !plain(&access_key_id) || !plain(&secret_access_key) {
            return Err(Error::InvalidArgument(
                "S3 credentials: the access key id and the secret are non-empty, printable and \
                 at most 16 KiB"
                    .to_owned(),
            ));
        }
        let session_token = session_token.filter(|t| !t.is_empty());
        if session_token.as_deref().is_some_and(|t| !plain(t)) {
            return Err(Error::InvalidArgument(
                "S3 credentials: the session token is printable and at most 16 KiB".to_owned(),
            ));
        }
        Ok(S3Credentials { access_key_id, secret_access_key, session_token })
    }

    /// The access key id (not secret: it is in every signed request).
    pub fn access_key_id(&self) -> &str {
        &self.access_key_id
    }
}

/// Whether `text` can be a credential given by the caller: non-empty, at most 16 KiB, and
/// sendable ([`is_sendable_credential`]).
pub(crate) fn is_plain_credential(text: &str) -> bool {
    !text.is_empty() && text.len() <= 16 << 10 && is_sendable_credential(text)
}

/// Whether a credential can go into a request: no control character. The request signer puts
/// credentials in headers and panics on a character a header cannot hold, so no other one
/// reaches it.
pub(crate) fn is_sendable_credential(text: &str) -> bool {
    !text.chars().any(char::is_control)
}

impl std::fmt::Debug for S3Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"…")
            .field("session_token", &self.session_token.as_ref().map(|_| "…"))
            .finish()
    }
}

impl Default for RemoteOptions {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            retry_status_codes: vec![429, 500, 502, 503, 504],
            timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(4),
            max_in_flight: None,
            // One request fills one pinned bounce buffer of the default size on the way to a
            // GPU (crate::config's bounce buffer size).
            request_size: 4 << 20,
            part_size: DEFAULT_PART_SIZE,
            known_len: None,
            s3_endpoint: None,
            s3_region: None,
            s3_virtual_hosted: false,
            unsigned: false,
            s3_credentials: None,
        }
    }
}

impl RemoteOptions {
    /// The defaults with the retry settings of `config` (its `http_max_attempts`,
    /// `http_status_codes` and `http_timeout`); errors name a value out of range. A listed
    /// code that is no HTTP status (KvikIO's settings take any int) matches no answer, so it
    /// is left out rather than failing every open.
    pub fn from_config(config: &Config) -> Result<RemoteOptions> {
        let mut o = RemoteOptions::default();
        o.max_attempts(u32::try_from(config.http_max_attempts).unwrap_or(u32::MAX))?;
        let (codes, ignored): (Vec<i32>, Vec<i32>) =
            config.http_status_codes.iter().partition(|c| (100..=599).contains(*c));
        if !ignored.is_empty() {
            tracing::debug!(?ignored, "http_status_codes: not HTTP statuses, never retried");
        }
        let codes: Vec<u16> = codes.into_iter().filter_map(|c| u16::try_from(c).ok()).collect();
        o.retry_status_codes(&codes)?;
        o.timeout(Duration::from_secs(config.http_timeout))?;
        Ok(o)
    }

    /// Requests made for one range before giving up: 1 means no retry (at least 1).
    pub fn max_attempts(&mut self, attempts: u32) -> Result<&mut Self> {
        if attempts == 0 {
            return Err(Error::InvalidArgument(
                "max_attempts must be at least 1 (1: no retry)".to_owned(),
            ));
        }
        self.max_attempts = attempts;
        Ok(self)
    }

    /// The HTTP statuses that are retried (with backoff) rather than failing at once.
    pub fn retry_status_codes(&mut self, codes: &[u16]) -> Result<&mut Self> {
        if let Some(bad) = codes.iter().find(|c| !(100..=599).contains(*c)) {
            return Err(Error::InvalidArgument(format!(
                "{bad} is not an HTTP status code (100 to 599)"
            )));
        }
        self.retry_status_codes = codes.to_vec();
        Ok(self)
    }

    /// The longest one request may take, body included (above zero).
    pub fn timeout(&mut self, timeout: Duration) -> Result<&mut Self> {
        if timeout.is_zero() {
            return Err(Error::InvalidArgument("the timeout must be above zero".to_owned()));
        }
        self.timeout = timeout;
        self.connect_timeout = self.connect_timeout.min(timeout);
        Ok(self)
    }

    /// The first wait before a retry, doubled after each one up to `max` (tests shorten it).
    pub fn backoff(&mut self, initial: Duration, max: Duration) -> &mut Self {
        self.backoff_initial = initial;
        self.backoff_max = max.max(initial);
        self
    }

    /// Ranged GETs in flight at once, at most [`MAX_IN_FLIGHT`]: `None` (the default) is
    /// [`AUTO_IN_FLIGHT`]. The bound holds for every read of the file together (its clones
    /// and, for a [`RemotePrefix`](super::RemotePrefix), every file it opens): reads started
    /// beyond it wait their turn, on connections already open. For a
    /// [`RemoteWriter`](super::RemoteWriter), the parts it holds in memory (being written or
    /// sent) at most.
    pub fn max_in_flight(&mut self, requests: Option<usize>) -> Result<&mut Self> {
        if let Some(n) = requests {
            if n == 0 || n > MAX_IN_FLIGHT {
                return Err(Error::InvalidArgument(format!(
                    "max_in_flight {n} is outside 1..={MAX_IN_FLIGHT}"
                )));
            }
        }
        self.max_in_flight = requests;
        Ok(self)
    }

    /// Bytes one ranged GET asks for (at least 1, at most [`MAX_REQUEST_SIZE`]).
    pub fn request_size(&mut self, bytes: u64) -> Result<&mut Self> {
        if bytes == 0 || bytes > MAX_REQUEST_SIZE {
            return Err(Error::InvalidArgument(format!(
                "request_size {bytes} is outside 1..={MAX_REQUEST_SIZE}"
            )));
        }
        self.request_size = bytes;
        Ok(self)
    }

    /// Bytes of each part of an upload ([`RemoteWriter`](super::RemoteWriter)) but the last,
    /// within S3's limits ([`MIN_PART_SIZE`]..=[`MAX_PART_SIZE`]); an object holds
    /// [`MAX_PARTS`](super::MAX_PARTS) parts at most.
    pub fn part_size(&mut self, bytes: u64) -> Result<&mut Self> {
        if !(MIN_PART_SIZE..=MAX_PART_SIZE).contains(&bytes) {
            return Err(Error::InvalidArgument(format!(
                "part_size {bytes} is outside S3's {MIN_PART_SIZE}..={MAX_PART_SIZE}"
            )));
        }
        self.part_size = bytes;
        Ok(self)
    }

    /// The object's size, when the caller knows it: the open then asks the server nothing
    /// (KvikIO's `nbytes` argument).
    pub fn known_len(&mut self, len: Option<u64>) -> &mut Self {
        self.known_len = len;
        self
    }

    /// An S3-compatible endpoint (`http://127.0.0.1:9000`, MinIO, moto) instead of AWS's;
    /// `AWS_ENDPOINT_URL` sets it from the environment.
    pub fn s3_endpoint(&mut self, endpoint: Option<String>) -> &mut Self {
        self.s3_endpoint = endpoint;
        self
    }

    /// The S3 region, instead of `AWS_DEFAULT_REGION` / `AWS_REGION`.
    pub fn s3_region(&mut self, region: Option<String>) -> &mut Self {
        self.s3_region = region;
        self
    }

    /// Whether the [`s3_endpoint`](Self::s3_endpoint) is the bucket's own host
    /// (`https://bucket.s3.us-east-2.amazonaws.com`, virtual-hosted style) rather than the
    /// service's, the bucket first in the path (the default).
    pub fn s3_virtual_hosted(&mut self, virtual_hosted: bool) -> &mut Self {
        self.s3_virtual_hosted = virtual_hosted;
        self
    }

    /// Whether S3 and GCS requests go unsigned, for objects anyone may read (KvikIO's
    /// `S3_PUBLIC`, and `GCS_PUBLIC`): no credentials are looked for, and none are sent.
    pub fn unsigned(&mut self, unsigned: bool) -> &mut Self {
        self.unsigned = unsigned;
        self
    }

    /// Credentials to sign S3 requests with, instead of the environment's and the AWS files'.
    pub fn s3_credentials(&mut self, credentials: Option<S3Credentials>) -> &mut Self {
        self.s3_credentials = credentials;
        self
    }

    /// Requests made for one range before giving up.
    pub fn get_max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The retried HTTP statuses.
    pub fn get_retry_status_codes(&self) -> &[u16] {
        &self.retry_status_codes
    }

    /// The longest one request may take.
    pub fn get_timeout(&self) -> Duration {
        self.timeout
    }

    /// Ranged GETs in flight at most, where set (`None`: picked from each read's size).
    pub fn get_max_in_flight(&self) -> Option<usize> {
        self.max_in_flight
    }

    /// Bytes one ranged GET asks for.
    pub fn get_request_size(&self) -> u64 {
        self.request_size
    }

    /// Bytes of each part of an upload but the last.
    pub fn get_part_size(&self) -> u64 {
        self.part_size
    }

    /// Requests a file keeps in flight at most, all its reads together: `max_in_flight`, else
    /// [`AUTO_IN_FLIGHT`].
    pub(crate) fn requests_in_flight(&self) -> usize {
        self.max_in_flight.unwrap_or(AUTO_IN_FLIGHT)
    }

    /// Requests in flight for a read of `chunks` requests.
    pub(crate) fn in_flight_for(&self, chunks: usize) -> usize {
        self.requests_in_flight().min(chunks).max(1)
    }

    /// Requests in flight for a read of `chunks` requests into GPU memory: as
    /// [`in_flight_for`](Self::in_flight_for), within [`MAX_STAGED_BYTES`].
    pub(crate) fn staged_in_flight_for(&self, chunks: usize) -> usize {
        let fit = usize::try_from(MAX_STAGED_BYTES / self.request_size).unwrap_or(usize::MAX);
        self.in_flight_for(chunks).min(fit).max(1)
    }

    /// The wait before attempt `attempt + 1` (after `attempt` failed).
    pub(crate) fn backoff_after(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.saturating_sub(1)).unwrap_or(u32::MAX);
        self.backoff_initial.saturating_mul(factor).min(self.backoff_max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_kvikios() {
        let o = RemoteOptions::default();
        assert_eq!(o.max_attempts, 3);
        assert_eq!(o.retry_status_codes, [429, 500, 502, 503, 504]);
        assert_eq!(o.timeout, Duration::from_secs(60));
    }

    #[test]
    fn from_config_takes_the_retry_settings() {
        let mut c = Config::default();
        assert_eq!(RemoteOptions::from_config(&c).unwrap(), RemoteOptions::default());
        c.http_max_attempts = 7;
        c.http_status_codes = vec![503];
        c.http_timeout = 9;
        let o = RemoteOptions::from_config(&c).unwrap();
        assert_eq!(o.max_attempts, 7);
        assert_eq!(o.retry_status_codes, vec![503]);
        assert_eq!(o.timeout, Duration::from_secs(9));
        // Settings take any int, as KvikIO's do: what is no HTTP status matches no answer.
        c.http_status_codes = vec![1, 503, 70_000, -1, 99, 600];
        assert_eq!(RemoteOptions::from_config(&c).unwrap().retry_status_codes, vec![503]);
        c.http_status_codes = vec![503];
        c.http_timeout = 0;
        assert!(RemoteOptions::from_config(&c).is_err());
    }

    #[test]
    fn bad_values_are_refused() {
        let mut o = RemoteOptions::default();
        assert!(o.max_attempts(0).is_err());
        assert!(o.retry_status_codes(&[503, 99]).is_err());
        assert!(o.timeout(Duration::ZERO).is_err());
        assert!(o.max_in_flight(Some(0)).is_err());
        assert!(o.max_in_flight(Some(MAX_IN_FLIGHT + 1)).is_err());
        assert!(o.request_size(0).is_err());
        assert!(o.request_size(MAX_REQUEST_SIZE + 1).is_err());
        assert!(o.part_size(MIN_PART_SIZE - 1).is_err());
        assert!(o.part_size(MAX_PART_SIZE + 1).is_err());
        assert_eq!(o, RemoteOptions::default());
    }

    #[test]
    fn in_flight_is_bounded_by_the_work_and_the_setting() {
        let mut o = RemoteOptions::default();
        assert_eq!(o.in_flight_for(1), 1);
        assert_eq!(o.in_flight_for(0), 1);
        assert_eq!(o.in_flight_for(10_000), AUTO_IN_FLIGHT);
        o.max_in_flight(Some(256)).unwrap();
        assert_eq!(o.in_flight_for(10_000), 256);
        // Staged for a GPU: within MAX_STAGED_BYTES of host memory.
        assert_eq!(o.staged_in_flight_for(10_000), 256);
        o.request_size(MAX_REQUEST_SIZE).unwrap();
        assert_eq!(o.staged_in_flight_for(10_000), (MAX_STAGED_BYTES / MAX_REQUEST_SIZE) as usize);
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let mut o = RemoteOptions::default();
        o.backoff(Duration::from_millis(10), Duration::from_millis(50));
        let waits: Vec<_> = (1..=5).map(|a| o.backoff_after(a).as_millis()).collect();
        assert_eq!(waits, [10, 20, 40, 50, 50]);
        assert_eq!(o.backoff_after(u32::MAX), Duration::from_millis(50));
    }
}
