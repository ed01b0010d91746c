//! [`RemoteFile`]: one remote object, opened once, read at any offset into host or device
//! memory.
#![forbid(unsafe_code)]

use std::pin::pin;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use futures_util::future::{select, Either};
use tokio::sync::OwnedSemaphorePermit;

use crate::config::Config;
use crate::error::Result;
use crate::io::pool::Help;
use crate::io::{IoFuture, IoPool};
use crate::memory::cuda::RawRegion;
use crate::memory::{DeviceViewMut, OwnedDeviceMemory};
use crate::remote::batched_upload;
use crate::remote::client::{self, Client};
use crate::remote::endpoint::{self, EndpointKind, S3Address};
use crate::remote::fetch::{self, Fetch};
use crate::remote::lanes;
use crate::remote::options::RemoteOptions;
use crate::remote::requests::Requests;
use crate::remote::upload::Landing;
use crate::remote::url::{self, RemoteUrl};

/// A read-only remote object: `s3://bucket/key`, or an `http(s)://` URL (a presigned S3 URL is
/// one). Reads are ranged GETs, many in flight; see the [module docs](crate::remote).
///
/// Cloning is cheap and clones share the connection pool.
#[derive(Debug, Clone)]
pub struct RemoteFile {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    url: RemoteUrl,
    client: Client,
    options: RemoteOptions,
    len: u64,
    /// The object's strong ETag at open, where known (see [`Fetch::etag`]).
    etag: Option<String>,
}

impl RemoteFile {
    /// Opens `url` (`s3://bucket/key`, `http://...`, `https://...`) with the options the
    /// settings give ([`RemoteOptions::from_config`] of [`Config::global`]).
    pub fn open(url: &str) -> Result<RemoteFile> {
        Self::open_with(url, &RemoteOptions::from_config(Config::global()?)?)
    }

    /// Opens `url` with `options`: the object's size comes from the options' known length, or
    /// from a HEAD request. The URL's kind is inferred as KvikIO's `open` infers it
    /// ([`open_auto`](Self::open_auto) with every kind allowed): an S3 object, `s3://` or on an
    /// AWS host, is read signed or, where the server refuses that, unsigned (a public object
    /// needs no credentials).
    pub fn open_with(url: &str, options: &RemoteOptions) -> Result<RemoteFile> {
        Self::open_auto(url, &EndpointKind::ALL, options)
    }

    /// Opens a WebHDFS file (`http(s)://namenode:port/webhdfs/v1/<path>`, or `webhdfs://` /
    /// `swebhdfs://`): its size from `GETFILESTATUS`, ranges from `OPEN` (KvikIO's
    /// `open_webhdfs`).
    pub fn open_webhdfs(url: &str, options: &RemoteOptions) -> Result<RemoteFile> {
        Self::open_url(RemoteUrl::webhdfs(url)?, options)
    }

    /// Opens the S3 object `key` of `bucket`.
    pub fn open_s3(bucket: &str, key: &str, options: &RemoteOptions) -> Result<RemoteFile> {
        Self::open_url(RemoteUrl::s3(bucket, key)?, options)
    }

    /// Opens `text` as an endpoint of `kind` (KvikIO's `open` with an endpoint type named).
    /// The S3 kinds take `s3://bucket/key` or an `http(s)://` URL of an S3 object, read as
    /// [`S3Address::of_http`] reads it (an AWS host in one of S3's forms, else path style
    /// `http://host:port/bucket/key`, as KvikIO's `open_s3_url` does), whose host, style and
    /// region then replace the options' (a region set in the options stays);
    /// [`EndpointKind::S3Public`] sends them unsigned. A presigned URL, WebHDFS and HTTP open
    /// as [`open_url`](Self::open_url) opens them, HTTP reading even a `/webhdfs/v1/` path as
    /// plain GETs. A URL that cannot be of `kind` is refused as
    /// [`RemoteErrorKind::InvalidUrl`](crate::remote::RemoteErrorKind::InvalidUrl), naming it.
    pub fn open_as(text: &str, kind: EndpointKind, options: &RemoteOptions) -> Result<RemoteFile> {
        let not_of_kind = |url: &RemoteUrl, what: &str| {
            url::invalid(&url.redacted(), format!("not {what} ({kind} endpoint)"))
        };
        match kind {
            EndpointKind::S3 | EndpointKind::S3Public => {
                let mut options = options.clone();
                options.unsigned(kind == EndpointKind::S3Public);
                let url = match RemoteUrl::parse(text)? {
                    s3 @ RemoteUrl::S3 { .. } => s3,
                    RemoteUrl::Http(_) | RemoteUrl::WebHdfs(_) => {
                        let address = S3Address::of_http(text)?;
                        if options.s3_region.is_none() {
                            options.s3_region(address.region);
                        }
                        options
                            .s3_endpoint(Some(address.endpoint))
                            .s3_virtual_hosted(address.virtual_hosted);
                        address.url
                    }
                    other @ (RemoteUrl::Gcs { .. } | RemoteUrl::Azure { .. }) => {
                        return Err(not_of_kind(&other, "s3://bucket/key or an S3 http(s):// URL"))
                    }
                };
                Self::open_url(url, &options)
            }
            EndpointKind::S3PresignedUrl => match RemoteUrl::parse(text)? {
                RemoteUrl::Http(u) if endpoint::is_presigned(&u) => {
                    Self::open_url(RemoteUrl::Http(u), options)
                }
                other => Err(not_of_kind(&other, "an http(s) URL with an S3 signature")),
            },
            EndpointKind::Gcs
            | EndpointKind::GcsPublic
            | EndpointKind::Azure
            | EndpointKind::AzurePublic => {
                let url = RemoteUrl::parse(text)?;
                if !kind.accepts(text) {
                    let form = match kind {
                        EndpointKind::Gcs | EndpointKind::GcsPublic => "a gs://bucket/object URL",
                        _ => "an az://container/blob URL",
                    };
                    return Err(not_of_kind(&url, form));
                }
                let mut options = options.clone();
                options
                    .unsigned(matches!(kind, EndpointKind::GcsPublic | EndpointKind::AzurePublic));
                Self::open_url(url, &options)
            }
            EndpointKind::WebHdfs => Self::open_url(RemoteUrl::webhdfs(text)?, options),
            EndpointKind::Http => match RemoteUrl::parse(text)? {
                RemoteUrl::Http(u) | RemoteUrl::WebHdfs(u) if EndpointKind::Http.accepts(text) => {
                    Self::open_url(RemoteUrl::Http(u), options)
                }
                other => Err(not_of_kind(&other, "an http(s):// URL with a path")),
            },
        }
    }

    /// Opens `text` as the first of `allowed` whose form it has ([`EndpointKind::infer`]),
    /// as KvikIO's `open` does with `AUTO`. An S3 object, where [`EndpointKind::S3Public`] is
    /// allowed too and the options give no credentials, is opened both ways if need be: signed
    /// first where credentials are configured (in the environment or the AWS files), unsigned
    /// first where none are, as KvikIO (which reads no instance metadata) goes straight to
    /// unsigned requests then; the other way is tried when the server refuses the first (401,
    /// 403). A GCS object likewise, where [`EndpointKind::GcsPublic`] is allowed, by whether
    /// Google credentials are configured, and an Azure blob by whether Azure credentials are
    /// (Azure refuses unsigned requests with 409 where the account allows no anonymous
    /// access). If both fail, the first's error is returned. With no credentials configured,
    /// such an open asks for the object's size (a HEAD) even where the options know it; with
    /// credentials and a known size it makes no request, so a refusal of signed requests shows
    /// at the first read, with no fall-back.
    pub fn open_auto(
        text: &str,
        allowed: &[EndpointKind],
        options: &RemoteOptions,
    ) -> Result<RemoteFile> {
        let Some(kind) = EndpointKind::infer(text, allowed) else {
            let names: Vec<&str> = allowed.iter().map(|k| k.name()).collect();
            let shown = RemoteUrl::parse(text)?.redacted();
            return Err(url::invalid(
                &shown,
                format!(
                    "not a URL of any endpoint kind of {names:?} (s3://bucket/key, \
                     gs://bucket/object, az://container/blob, or an http(s):// URL with a path)"
                ),
            ));
        };
        // Credentials given decide an S3 object's signing outright.
        let given = kind == EndpointKind::S3 && options.s3_credentials.is_some();
        let twin = kind.unsigned_twin().filter(|twin| allowed.contains(twin) && !given);
        let Some(twin) = twin else { return Self::open_as(text, kind, options) };
        let configured = match kind {
            EndpointKind::Gcs => client::gcs_credentials_configured(),
            EndpointKind::Azure => client::azure_credentials_configured(),
            _ => client::s3_credentials_configured(),
        };
        let (first, then) = if configured { (kind, twin) } else { (twin, kind) };
        // With no credentials configured the size is asked for even where it is known: the
        // unsigned open must find out here whether it is refused, while signed requests (an
        // instance's role) can still be tried. Signed first with a known size, the open asks
        // nothing, as a checkpoint's shards open, and a refusal shows at the first read.
        let mut asking = options.clone();
        if !configured {
            asking.known_len(None);
        }
        match Self::open_as(text, first, &asking) {
            Err(e) if refused(&e) => {
                tracing::debug!(error = %e, "{first} open refused; trying {then}");
                Self::open_as(text, then, &asking).map_err(|_| e)
            }
            other => other,
        }
    }

    /// Opens a parsed URL.
    pub fn open_url(url: RemoteUrl, options: &RemoteOptions) -> Result<RemoteFile> {
        let client = Client::connect(&url, options)?;
        Self::open_on(url, client, options)
    }

    /// Opens `url` through a client already made (a [`RemotePrefix`](super::RemotePrefix)'s,
    /// whose connections it shares).
    pub(crate) fn open_on(
        url: RemoteUrl,
        client: Client,
        options: &RemoteOptions,
    ) -> Result<RemoteFile> {
        let (len, etag) = match options.known_len {
            Some(len) => (len, None),
            None => {
                let fetch =
                    Fetch { client: &client, options, url: &url, object_len: None, etag: None };
                let facts = client::block_on(fetch.facts())?;
                (facts.len, facts.etag)
            }
        };
        tracing::debug!(url = %url, len, ?etag, "opened remote object");
        let inner = Inner { url, client, options: options.clone(), len, etag };
        Ok(RemoteFile { inner: Arc::new(inner) })
    }

    /// The URL, without credentials.
    pub fn url(&self) -> &RemoteUrl {
        &self.inner.url
    }

    /// How it is read (KvikIO's `remote_endpoint_type`): S3 signed or not, a presigned URL,
    /// WebHDFS or plain HTTP.
    pub fn endpoint_kind(&self) -> EndpointKind {
        match &self.inner.url {
            RemoteUrl::S3 { .. } if self.inner.options.unsigned => EndpointKind::S3Public,
            RemoteUrl::Gcs { .. } if self.inner.options.unsigned => EndpointKind::GcsPublic,
            RemoteUrl::Gcs { .. } => EndpointKind::Gcs,
            RemoteUrl::Azure { .. } if self.inner.options.unsigned => EndpointKind::AzurePublic,
            RemoteUrl::Azure { .. } => EndpointKind::Azure,
            RemoteUrl::S3 { .. } => EndpointKind::S3,
            RemoteUrl::Http(u) if endpoint::is_presigned(u) => EndpointKind::S3PresignedUrl,
            RemoteUrl::Http(_) => EndpointKind::Http,
            RemoteUrl::WebHdfs(_) => EndpointKind::WebHdfs,
        }
    }

    /// The object's size in bytes, as known at open (KvikIO's `nbytes`).
    pub fn len(&self) -> u64 {
        self.inner.len
    }

    /// Whether the object is empty.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// The options it was opened with.
    pub fn options(&self) -> &RemoteOptions {
        &self.inner.options
    }

    /// Reads `buf.len()` bytes at `offset` into host memory and returns the count. The range
    /// must lie inside the object ([`Error::OutOfRange`](crate::Error::OutOfRange) otherwise):
    /// a read is whole or an error, never short.
    pub fn read(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.read_device(DeviceViewMut::Host(buf), offset)
    }

    /// Reads `dst.len()` bytes at `offset` into GPU memory (each body received into a pinned
    /// bounce buffer and copied up from there) or host memory, as [`read`](Self::read) does.
    ///
    /// The requests are shared among up to [`MAX_LANES`](super::MAX_LANES) threads (one per
    /// core), each on a runtime and connections of its own and taking the next request as one
    /// of its own finishes: one task polling every body would copy (and stage to the GPU) on
    /// one core, far below what a parallel client reaches, and bodies received on one thread
    /// and copied on another cross cores cold.
    pub fn read_device(&self, dst: DeviceViewMut<'_>, offset: u64) -> Result<usize> {
        let len = dst.len();
        if !self.has_bytes_at(offset, len)? {
            return Ok(0);
        }
        // A task of an async runtime waiting here would hold up that runtime's worker (and on
        // the shared runtime, deadlock it).
        client::blocking_allowed()?;
        let options = &self.inner.options;
        let size = fetch::request_size(options);
        let chunks = len.div_ceil(size);
        let in_flight = match dst {
            DeviceViewMut::Host(_) => options.in_flight_for(chunks),
            DeviceViewMut::Cuda(_) => options.staged_in_flight_for(chunks),
        };
        let lanes = in_flight.min(lanes::lane_count()).max(1);
        // The requests in flight shared out exactly, so that together they stay within the bound.
        let per_lane = |lane: usize| in_flight / lanes + usize::from(lane < in_flight % lanes);
        let landings = in_flight + lanes;
        // Set by the first lane that fails: the others start no more requests.
        let failed = AtomicBool::new(false);
        // The pool future's cancel flag, where this read is one's work (a `pread`, or Python's
        // `read` interrupted by Ctrl-C): its requests are dropped once it is set.
        let cancel = crate::io::pool::current_cancel();
        let requests = Requests::new(dst, offset, size);
        if lanes == 1 {
            // One lane (a read of one request, most often): the calling thread drives it on the
            // shared runtime, with the file's own connections; a hop to a lane thread would
            // cost a small read more than it saves.
            let read = read_requests(self.fetch(), &requests, in_flight, landings, &failed);
            client::block_on(unless_cancelled(read, cancel.as_deref()))?;
            return Ok(len);
        }
        let client = &self.inner.client;
        // Every lane takes the next request as one of its own finishes (`remote/requests.rs`).
        lanes::run((0..lanes).collect(), |lane_index, _, lane| {
            let store =
                lane.store(&client.recipe.owner, || client.recipe.per_thread_store(lanes))?;
            let client = client.with_store(store);
            let fetch = self.fetch_through(&client);
            let read = read_requests(fetch, &requests, per_lane(lane_index), landings, &failed);
            lane.block_on(unless_cancelled(read, cancel.as_deref()))
        })?;
        Ok(len)
    }

    /// Starts [`read_device`](Self::read_device) into the owned `dst`; the future gives back
    /// `dst` and the count. A read of one request at most (into GPU memory, one that fits a
    /// bounce buffer) is a task of a request loop (`remote/loops.rs`), holding no thread while it
    /// waits its turn or the server, so that the file's requests in flight, not the I/O pool's
    /// threads, bound how many are served at once (into GPU memory, its body lands in a pinned
    /// bounce buffer and goes up from there); others run on the I/O pool.
    pub fn pread_device<B: OwnedDeviceMemory>(
        &self,
        mut dst: B,
        offset: u64,
    ) -> IoFuture<(B, usize)> {
        let view = dst.device_view_mut();
        let len = view.len();
        let one_request = len <= fetch::request_size(&self.inner.options);
        // Into the GPU, only what fits one bounce buffer: a larger body would land in host
        // memory of its own, and as many of those at once as the file has permits is too much.
        let staged_small = match view {
            DeviceViewMut::Host(_) => true,
            DeviceViewMut::Cuda(_) => Config::global()
                .map(|c| u64::try_from(len).is_ok_and(|n| n <= c.bounce_buffer_size))
                .unwrap_or(false),
        };
        if one_request && staged_small {
            return self.pread_one_request(dst, offset);
        }
        let file = self.clone();
        match IoPool::global() {
            Ok(pool) => pool.spawn(move || {
                let mut dst = dst;
                let n = file.read_device(dst.device_view_mut(), offset)?;
                Ok((dst, n))
            }),
            Err(e) => {
                let (future, completer) = IoFuture::pending();
                completer.complete(Err(e));
                future
            }
        }
    }

    /// [`pread_device`](Self::pread_device) of one request, on a request loop, through that
    /// loop's own connections to the object.
    fn pread_one_request<B: OwnedDeviceMemory>(
        &self,
        mut dst: B,
        offset: u64,
    ) -> IoFuture<(B, usize)> {
        let (future, completer) = IoFuture::pending();
        let len = dst.device_view_mut().len();
        let queues = match self.inner.client.queues(len) {
            Ok(queues) => queues,
            Err(e) => {
                completer.complete(Err(e));
                return future;
            }
        };
        // Cancelling the future (Ctrl-C in Python) wakes the read, which drops its request.
        let cancelled = Arc::new(tokio::sync::Notify::new());
        let wake = cancelled.clone();
        future.set_helper(Box::new(move |help| match help {
            Help::Cancel => {
                wake.notify_one();
                true
            }
            Help::Run | Help::Poll | Help::Finish => false,
        }));
        let file = self.clone();
        queues.submit(Box::new(move |store| {
            Box::pin(async move {
                let mut dst = dst;
                let view = dst.device_view_mut();
                let len = view.len();
                let outcome = match store {
                    Ok(store) => {
                        let client = file.inner.client.with_store(store);
                        let read = file.read_one_request(&client, view, offset);
                        let done = match select(pin!(read), pin!(cancelled.notified())).await {
                            Either::Left((done, _)) => done,
                            Either::Right(((), _)) => Err(crate::io::pool::cancelled()),
                        };
                        done
                    }
                    Err(e) => Err(e),
                };
                match outcome {
                    Ok(OneRead::Done(n)) => completer.complete(Ok((dst, n))),
                    // The body goes up from the upload thread, which completes the future;
                    // `dst` and the permit live until the body is in place.
                    Ok(OneRead::Landed { body, permit, region }) => {
                        let then = move |outcome: Result<()>| {
                            drop(permit);
                            completer.complete(outcome.map(|()| (dst, len)));
                        };
                        batched_upload::upload_then(body, region, Box::new(then));
                    }
                    Err(e) => completer.complete(Err(e)),
                }
            })
        }));
        future
    }

    /// Reads each `(buf, offset)` of `pieces` whole into host memory, all of them at once:
    /// pieces that follow one another in the object joined into requests
    /// ([`coalesce`](super::coalesce::coalesce)), each request a
    /// [`pread_one_request`](Self::pread_one_request) into a buffer of its own (as many bytes
    /// again as the pieces), copied into place here; a piece longer than a request as
    /// [`read`](Self::read) on this thread. For a gather's many small misses, which one
    /// blocking read after another would serve a request at a time; the file's bound on
    /// requests in flight holds across them all.
    pub(crate) fn read_pieces(&self, pieces: &mut [(&mut [u8], u64)]) -> Result<()> {
        client::blocking_allowed()?;
        for (buf, offset) in pieces.iter() {
            self.has_bytes_at(*offset, buf.len())?;
        }
        let request = fetch::request_size(&self.inner.options);
        let ranges: Vec<(u64, usize)> = pieces.iter().map(|(buf, o)| (*o, buf.len())).collect();
        let runs = super::coalesce::coalesce(&ranges, request);
        let reads: Vec<_> = runs
            .iter()
            .filter(|run| run.len <= request)
            .map(|run| (run, self.pread_one_request(vec![0u8; run.len], run.offset)))
            .collect();
        for run in runs.iter().filter(|run| run.len > request) {
            let (buf, offset) = &mut pieces[run.members[0]];
            self.read(buf, *offset)?;
        }
        for (run, read) in reads {
            let (bytes, _) = read.wait()?;
            let mut from = 0;
            for &member in &run.members {
                let buf = &mut pieces[member].0;
                buf.copy_from_slice(&bytes[from..from + buf.len()]);
                from += buf.len();
            }
        }
        Ok(())
    }

    /// One request's read into `dst`, through `client` (the file's, or a loop's own): into
    /// host memory, done; bound for GPU memory, its body landed in host memory.
    async fn read_one_request(
        &self,
        client: &Client,
        dst: DeviceViewMut<'_>,
        offset: u64,
    ) -> Result<OneRead> {
        let len = dst.len();
        if !self.has_bytes_at(offset, len)? {
            return Ok(OneRead::Done(0));
        }
        let fetch = self.fetch_through(client);
        match dst {
            DeviceViewMut::Host(bytes) => fetch.range(offset, bytes).await?,
            DeviceViewMut::Cuda(view) => {
                let region = view.raw;
                let (body, permit) = fetch::land_one(fetch, len, region.ordinal, offset).await?;
                return Ok(OneRead::Landed { body, permit, region });
            }
        }
        Ok(OneRead::Done(len))
    }

    /// `Err` where `len` bytes at `offset` pass the object's end; else whether there are any
    /// to read (an empty read makes no request).
    fn has_bytes_at(&self, offset: u64, len: usize) -> Result<bool> {
        fetch::check_range(offset, len, self.inner.len)?;
        Ok(len > 0)
    }

    fn fetch(&self) -> Fetch<'_> {
        self.fetch_through(&self.inner.client)
    }

    /// [`fetch`](Self::fetch) through `client` (a lane's or loop's own, of this file).
    fn fetch_through<'a>(&'a self, client: &'a Client) -> Fetch<'a> {
        Fetch {
            client,
            options: &self.inner.options,
            url: &self.inner.url,
            object_len: Some(self.inner.len),
            etag: self.inner.etag.as_deref(),
        }
    }
}

/// Where a read of one request stands when its request is done.
enum OneRead {
    /// Its bytes are in place: this many.
    Done(usize),
    /// Its body landed in host memory, received under `permit`, and goes up to `region`.
    Landed { body: Landing, permit: OwnedSemaphorePermit, region: RawRegion },
}

/// How often a read in flight looks at its cancel flag: a Ctrl-C is felt within this.
const CANCEL_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// `read`, unless `cancel` is set first: then its requests in flight are dropped (their
/// connections closed, a copy to the GPU in flight waited for) and the read fails as a
/// cancelled pool transfer does (kind `Interrupted`).
async fn unless_cancelled(
    read: impl std::future::Future<Output = Result<()>>,
    cancel: Option<&AtomicBool>,
) -> Result<()> {
    let Some(cancel) = cancel else { return read.await };
    let watch = async {
        while !cancel.load(std::sync::atomic::Ordering::Relaxed) {
            tokio::time::sleep(CANCEL_POLL).await;
        }
    };
    match select(pin!(read), pin!(watch)).await {
        Either::Left((done, _)) => done,
        Either::Right(((), _)) => Err(crate::io::pool::cancelled()),
    }
}

/// A lane's share of a read: `in_flight` of its requests at once, each taken from `requests`
/// as one finishes (`landings`: the bodies the whole read may hold; `failed`: shared by the
/// read's lanes, see [`fetch::read_host`]).
async fn read_requests(
    fetch: Fetch<'_>,
    requests: &Requests<'_>,
    in_flight: usize,
    landings: usize,
    failed: &AtomicBool,
) -> Result<()> {
    match requests {
        Requests::Host(queue) => {
            fetch::read_host(fetch, || queue.lock().take(), in_flight, failed).await
        }
        Requests::Cuda(queue) => {
            let next = || queue.take();
            fetch::read_cuda(fetch, queue.ordinal(), next, in_flight, landings, failed).await
        }
    }
}

/// Whether `error` is the server refusing the request (401, 403).
pub(crate) fn refused(error: &crate::Error) -> bool {
    matches!(error, crate::Error::Remote { kind: crate::remote::RemoteErrorKind::AccessDenied, .. })
}
