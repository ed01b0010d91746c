//! Remote objects — S3, Google Cloud Storage, Azure Blob Storage, HTTP(S) and WebHDFS — read
//! straight into host or GPU memory, and S3, GCS and Azure objects written from either as
//! multipart uploads ([`RemoteWriter`]) (the `remote` feature).
//!
//! ```no_run
//! use gpumap::remote::{RemoteFile, RemoteOptions};
//!
//! let mut options = RemoteOptions::default();
//! options.max_in_flight(Some(128))?;
//! let file = RemoteFile::open_with("s3://my-bucket/weights.bin", &options)?;
//! let mut bytes = vec![0u8; file.len() as usize];
//! file.read(&mut bytes, 0)?;
//! # Ok::<(), gpumap::Error>(())
//! ```
//!
//! - **Requests.** A read is cut into ranged GETs of `request_size` bytes (4 MiB by default),
//!   up to `max_in_flight` of them at once ([`AUTO_IN_FLIGHT`] unless set), a bound every read
//!   of the file shares, so that thousands of small reads started together take turns on a
//!   few connections rather than open one each. Each body must be exactly the bytes asked for.
//! - **Into the GPU.** Each range lands in host memory, then goes to the device through the
//!   same pinned bounce-buffer pool and per-thread stream as the local device path, one copy
//!   in flight while the next is staged.
//! - **Retries.** A request answered with one of `retry_status_codes`, or whose connection
//!   failed or broke mid-body, is retried up to `max_attempts` in all, with exponential
//!   backoff; every attempt has `timeout` to complete. Defaults are KvikIO's.
//! - **Credentials** come from the standard AWS environment (`AWS_ACCESS_KEY_ID`,
//!   `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL`,
//!   web identity, container credentials) through object_store, then from the shared AWS
//!   files (`~/.aws/credentials` and `~/.aws/config`, or `AWS_SHARED_CREDENTIALS_FILE` and
//!   `AWS_CONFIG_FILE`; profile `AWS_PROFILE`, else `default`: static keys, region and
//!   `endpoint_url`) for what the environment leaves unset. They never appear in an
//!   error: [`Error::Remote`](crate::Error::Remote) names the URL without user, password or
//!   query string.
//! - **Answers** pass through `answers`: an error's body is read to 64 KiB at most, whatever a
//!   server sends after (object_store would read all of it); a chunked 206 is taken; a ranged
//!   GET answered 204, or a redirect loop, fails as a bad answer naming it.
#![forbid(unsafe_code)]

mod answers;
mod aws_profile;
mod batched_upload;
mod client;
mod coalesce;
mod endpoint;
mod failure;
mod fetch;
mod file;
mod lanes;
mod loops;
mod options;
mod parts;
mod prefix;
mod requests;
mod retry;
mod stores;
mod upload;
mod url;
mod webhdfs;
mod writer;

pub use crate::error::RemoteErrorKind;
pub use endpoint::{EndpointKind, S3Address};
pub use file::RemoteFile;
pub use lanes::MAX_LANES;
pub use options::{
    RemoteOptions, S3Credentials, AUTO_IN_FLIGHT, DEFAULT_PART_SIZE, MAX_IN_FLIGHT,
    MAX_REQUEST_SIZE, MAX_STAGED_BYTES,
};
pub use parts::{MAX_PARTS, MAX_PART_SIZE, MIN_PART_SIZE};
pub use prefix::{RemoteEntry, RemoteListing, RemoteObjects, RemotePrefix};
pub use url::{is_remote_url, RemoteUrl, MAX_URL_LEN};
pub use writer::RemoteWriter;
