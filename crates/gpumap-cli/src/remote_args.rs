//! The options of `gpumap read` and `gpumap write` that only URLs take, and which of the two
//! ways a path goes: a local file, or an `s3://` / `gs://` / `az://` / `http(s)://`
//! object.

use std::path::Path;
use std::time::Duration;

use clap::Args;

use gpumap::remote::RemoteOptions;

use crate::units::size_arg;

/// The URL `file` names, where it names a remote object rather than a local file.
pub(crate) fn remote_url(file: &Path) -> Option<&str> {
    file.to_str().filter(|f| gpumap::remote::is_remote_url(f))
}

/// The retry options of every request to a URL, read or write (each defaults to its setting
/// in the settings table).
#[derive(Args, Debug)]
pub struct HttpArgs {
    /// Requests made for one range or part before giving up (default: the http_max_attempts
    /// setting, GPUMAP_HTTP_MAX_ATTEMPTS or KVIKIO_HTTP_MAX_ATTEMPTS; 3 as KvikIO's).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    http_max_attempts: Option<u32>,
    /// Seconds one request may take, body included (default: the http_timeout setting; 60 as
    /// KvikIO's).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    http_timeout: Option<u64>,
    /// HTTP statuses retried, comma-separated (default: the http_status_codes setting;
    /// 429,500,502,503,504 as KvikIO's).
    #[arg(long, value_delimiter = ',')]
    http_status_codes: Option<Vec<u16>>,
}

impl HttpArgs {
    /// The first of these options given.
    fn given_flag(&self) -> Option<&'static str> {
        [
            (self.http_max_attempts.is_some(), "--http-max-attempts"),
            (self.http_timeout.is_some(), "--http-timeout"),
            (self.http_status_codes.is_some(), "--http-status-codes"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }

    /// The settings' options with these given ones put over them.
    fn options(&self) -> gpumap::Result<RemoteOptions> {
        let mut options = RemoteOptions::from_config(gpumap::config::Config::global()?)?;
        if let Some(n) = self.http_max_attempts {
            options.max_attempts(n)?;
        }
        if let Some(seconds) = self.http_timeout {
            options.timeout(Duration::from_secs(seconds))?;
        }
        if let Some(codes) = &self.http_status_codes {
            options.retry_status_codes(codes)?;
        }
        Ok(options)
    }
}

/// Options of reads from `s3://`, `gs://`, `az://` and `http(s)://` URLs (ignored for local
/// files).
#[derive(Args, Debug)]
pub struct RemoteArgs {
    /// Ranged GETs in flight at once, 1 to 1024 (default: picked from the read's size).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=gpumap::remote::MAX_IN_FLIGHT as u64))]
    pub(crate) max_in_flight: Option<u64>,
    /// Bytes one ranged GET asks for, e.g. 8MiB (default: 4 MiB).
    #[arg(long, value_parser = size_arg)]
    request_size: Option<u64>,
    #[command(flatten)]
    http: HttpArgs,
}

impl RemoteArgs {
    pub(crate) fn options(&self) -> gpumap::Result<RemoteOptions> {
        let mut options = self.http.options()?;
        options.max_in_flight(self.max_in_flight.map(|n| n as usize))?;
        if let Some(bytes) = self.request_size {
            options.request_size(bytes)?;
        }
        Ok(options)
    }
}

/// Options of writes to `s3://`, `gs://` and `az://` URLs (refused for local files).
#[derive(Args, Debug)]
pub struct RemoteWriteArgs {
    /// Bytes of each part of the upload but the last, 5MiB to 5GiB (default: 16 MiB); an
    /// object holds 10,000 parts at most.
    #[arg(long, value_parser = size_arg)]
    part_size: Option<u64>,
    /// Parts held in memory and sent at once, 1 to 1024 (default: 64, within 4 GiB).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=gpumap::remote::MAX_IN_FLIGHT as u64))]
    max_in_flight: Option<u64>,
    #[command(flatten)]
    http: HttpArgs,
}

impl RemoteWriteArgs {
    /// The first of these options given, for refusing it with a local file.
    pub(crate) fn given_flag(&self) -> Option<&'static str> {
        [
            (self.part_size.is_some(), "--part-size"),
            (self.max_in_flight.is_some(), "--max-in-flight"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
        .or_else(|| self.http.given_flag())
    }

    pub(crate) fn options(&self) -> gpumap::Result<RemoteOptions> {
        let mut options = self.http.options()?;
        if let Some(bytes) = self.part_size {
            options.part_size(bytes)?;
        }
        options.max_in_flight(self.max_in_flight.map(|n| n as usize))?;
        Ok(options)
    }
}
