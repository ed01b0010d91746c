//! Ranged GETs of one object: each range with its retries and timeout, many ranges in flight
//! at once (bounded), into host memory, or into pinned bounce buffers and on to GPU memory.
//!
//! A range's body is written where it belongs as it arrives, and must be exactly the bytes
//! asked for: a short, long or misplaced answer fails the range (no partial buffer is ever
//! reported as complete). The first range that fails for good ends the read, cancelling the
//! requests still in flight.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures_util::{StreamExt, TryStreamExt};
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt};

use crate::error::{Error, RemoteErrorKind, Result};
use crate::memory::cuda::RawRegion;
use crate::remote::client::Client;
use crate::remote::failure::Failure;
use crate::remote::options::RemoteOptions;
use crate::remote::retry::Attempts;
use crate::remote::upload::{self, Uploader};
use crate::remote::url::RemoteUrl;

/// What a read needs to make its requests.
#[derive(Clone, Copy)]
pub(crate) struct Fetch<'a> {
    pub(crate) client: &'a Client,
    pub(crate) options: &'a RemoteOptions,
    pub(crate) url: &'a RemoteUrl,
    /// The object's size when it was opened, where known: an answer that gives another (in its
    /// `Content-Range`) fails the range, so that no read mixes bytes of two versions.
    pub(crate) object_len: Option<u64>,
    /// The object's strong ETag when it was opened, where the server gave one: each GET asks
    /// `If-Match` it, so that a version of the same size replacing it fails the read (412)
    /// rather than mix its bytes with the old one's.
    pub(crate) etag: Option<&'a str>,
}

/// What a HEAD (or a GET of byte 0) tells of an object.
pub(crate) struct ObjectFacts {
    pub(crate) len: u64,
    /// Its strong ETag, where it has one (a weak one, `W/"…"`, cannot be matched by `If-Match`).
    pub(crate) etag: Option<String>,
}

fn strong(etag: Option<String>) -> Option<String> {
    etag.filter(|tag| !tag.starts_with("W/"))
}

impl<'a> Fetch<'a> {
    /// The object's size, with retries: a HEAD request, or a GET of its first byte, whose
    /// `Content-Range` gives the size, for a URL with a query string (a presigned URL, signed
    /// for GET alone) and for a server that refuses HEAD (405 or 501). A GET answered 416
    /// (`bytes=0-0` not satisfiable) is an empty object.
    pub(crate) async fn facts(self) -> Result<ObjectFacts> {
        let presigned = matches!(self.url, RemoteUrl::Http(url) if url.query().is_some());
        let store = self.client.store()?;
        if !presigned {
            let head = || async {
                let answer = store.head(&self.client.path).await;
                answer
                    .map(|meta| ObjectFacts { len: meta.size, etag: strong(meta.e_tag) })
                    .map_err(|e| Failure::from_store(&e, self.url))
            };
            match self.attempts().run("HEAD", head).await {
                Err(gave_up) if !matches!(gave_up.failure.status, Some(405 | 501)) => {
                    return Err(gave_up.into_error(self.url));
                }
                Err(_) => {}
                Ok(facts) => return Ok(facts),
            }
        }
        let first_byte = || async {
            let first =
                GetOptions { range: Some(GetRange::Bounded(0..1)), ..GetOptions::default() };
            match store.get_opts(&self.client.path, first).await {
                Ok(answer) => {
                    Ok(ObjectFacts { len: answer.meta.size, etag: strong(answer.meta.e_tag) })
                }
                Err(e) => match Failure::from_store(&e, self.url) {
                    empty if empty.status == Some(416) => Ok(ObjectFacts { len: 0, etag: None }),
                    failure => Err(failure),
                },
            }
        };
        let op = "GET bytes 0-0 of";
        self.attempts().run(op, first_byte).await.map_err(|gave_up| gave_up.into_error(self.url))
    }

    /// `dst.len()` bytes from `offset` into `dst`, with retries.
    pub(crate) async fn range(self, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.range_with(offset, dst, true).await
    }

    /// One of the client's request permits, waited for; held, it lets the holder make one
    /// request (see [`range_holding_permit`](Self::range_holding_permit)).
    pub(crate) async fn permit(self) -> Result<tokio::sync::OwnedSemaphorePermit> {
        self.client.requests()?.acquire_owned().await.map_err(|_| {
            let why = "the client's request permits were closed";
            Failure::new(RemoteErrorKind::Connection, None, why).into_error(self.url, "GET", 0)
        })
    }

    /// [`range`](Self::range) by a caller that holds one of the client's permits for the whole
    /// call (so that what it sets aside for the body, before asking, stays within the bound).
    pub(crate) async fn range_holding_permit(self, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.range_with(offset, dst, false).await
    }

    async fn range_with(self, offset: u64, dst: &mut [u8], take_permits: bool) -> Result<()> {
        let store = self.client.store()?;
        let mut attempts = self.attempts();
        loop {
            // A permit per attempt, taken before its timeout starts and held until its body is
            // in: waiting for one is no timeout, and a retry's backoff holds none.
            let permit = match take_permits {
                true => Some(self.permit().await?),
                false => None,
            };
            let outcome = attempts.attempt(self.range_once(&*store, offset, dst)).await;
            drop(permit);
            let failure = match outcome {
                Ok(()) => return Ok(()),
                Err(failure) => failure,
            };
            let op = format!("GET bytes {offset}-{} of", offset + dst.len() as u64 - 1);
            attempts.retry_after(failure, &op).await.map_err(|g| g.into_error(self.url))?;
        }
    }

    fn attempts(self) -> Attempts<'a> {
        Attempts::new(self.options, self.url)
    }

    async fn range_once(
        self,
        store: &dyn ObjectStore,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), Failure> {
        let want = offset..offset + dst.len() as u64;
        let request = GetOptions {
            range: Some(GetRange::Bounded(want.clone())),
            if_match: self.etag.map(str::to_owned),
            ..GetOptions::default()
        };
        let answer =
            store.get_opts(&self.client.path, request).await.map_err(
                |e| match Failure::from_store(&e, self.url) {
                    changed if changed.status == Some(412) => Failure::new(
                        RemoteErrorKind::BadResponse,
                        Some(412),
                        "the object changed since it was opened (its ETag no longer matches); \
                     open it again",
                    ),
                    failure => failure,
                },
            )?;
        if answer.range != want {
            return Err(Failure::new(
                RemoteErrorKind::BadResponse,
                None,
                format!("the server sent bytes {:?} for bytes {want:?}", answer.range),
            ));
        }
        // WebHDFS answers give no size (its store reports the range's end).
        let sized = !matches!(self.url, RemoteUrl::WebHdfs(_));
        if let Some(len) = self.object_len.filter(|&len| sized && answer.meta.size != len) {
            return Err(Failure::new(
                RemoteErrorKind::BadResponse,
                None,
                format!(
                    "the server gives the object's size as {} bytes, not the {len} it had when \
                     opened (it changed since, or nbytes was wrong); open it again",
                    answer.meta.size
                ),
            ));
        }
        let mut body = answer.into_stream();
        let mut filled = 0usize;
        while let Some(piece) = body.next().await {
            let piece = piece.map_err(|e| Failure::from_store(&e, self.url))?;
            let Some(room) = dst.get_mut(filled..filled + piece.len()) else {
                return Err(Failure::new(
                    RemoteErrorKind::BadResponse,
                    None,
                    format!("the body runs past the {} bytes asked for", dst.len()),
                ));
            };
            room.copy_from_slice(&piece);
            filled += piece.len();
        }
        if filled != dst.len() {
            // The connection closed early: a server dying mid-body, or a proxy cutting it.
            return Err(Failure::new(
                RemoteErrorKind::Connection,
                None,
                format!("the body ended after {filled} of {} bytes", dst.len()),
            ));
        }
        Ok(())
    }
}

/// Reads the requests `next` hands out (each an object offset and where its bytes go) into host
/// memory, up to `in_flight` at once, taking the next as one finishes.
///
/// `failed` is shared by the lanes of one read: a lane that fails sets it, and a lane that
/// finds it set starts no more requests and returns `Ok` with its requests unread, which is
/// sound only because the lane that set it returns its error (so the read as a whole fails).
pub(crate) async fn read_host<'d>(
    fetch: Fetch<'_>,
    next: impl FnMut() -> Option<(u64, &'d mut [u8])>,
    in_flight: usize,
    failed: &AtomicBool,
) -> Result<()> {
    tracing::debug!(url = %fetch.url, in_flight, "remote read into host memory");
    let requests = std::iter::from_fn(next)
        .take_while(|_| !failed.load(Ordering::Relaxed))
        .map(|(offset, piece)| fetch.range(offset, piece));
    let outcome =
        futures_util::stream::iter(requests).buffer_unordered(in_flight).try_collect::<()>().await;
    mark_failure(outcome, failed)
}

/// `outcome`, with `failed` set where it is an error.
fn mark_failure(outcome: Result<()>, failed: &AtomicBool) -> Result<()> {
    if outcome.is_err() {
        failed.store(true, Ordering::Relaxed);
    }
    outcome
}

/// Reads the requests `next` hands out (each an object offset and the region of GPU `ordinal`
/// its bytes go to), up to `in_flight` at once: each body lands in a pinned bounce buffer where
/// one is free (else in memory of its own), then goes up, one copy in flight while the next
/// body is received. `landings` is how many bodies the whole read (all its lanes) may hold at
/// once. Host memory held is bounded by the requests in flight (the caller keeps them within
/// [`MAX_STAGED_BYTES`](crate::remote::MAX_STAGED_BYTES)). `failed` as for [`read_host`].
pub(crate) async fn read_cuda(
    fetch: Fetch<'_>,
    ordinal: usize,
    next: impl FnMut() -> Option<Result<(u64, RawRegion)>>,
    in_flight: usize,
    landings: usize,
    failed: &AtomicBool,
) -> Result<()> {
    let outcome: Result<()> = async {
        tracing::debug!(url = %fetch.url, ordinal, in_flight, "remote read into GPU memory");
        let mut uploader = Uploader::new(ordinal, landings)?;
        let pool = uploader.pool();
        let requests = std::iter::from_fn(next)
            .take_while(|_| !failed.load(Ordering::Relaxed))
            .map(|request| {
                let pool = Arc::clone(&pool);
                async move {
                    let (offset, region) = request?;
                    let mut body = upload::landing(&pool, region.len)?;
                    fetch.range(offset, body.bytes_mut()).await.map(|()| (region, body))
                }
            });
        let mut done = futures_util::stream::iter(requests).buffer_unordered(in_flight);
        while let Some(landed) = done.next().await {
            let (region, body) = landed?;
            uploader.upload(body, region)?;
        }
        uploader.finish()
    }
    .await;
    mark_failure(outcome, failed)
}

/// Receives the `len` bytes (one request at most) at `offset` bound for GPU `ordinal`, from a
/// task of a request loop: a permit first, then a pinned bounce buffer to receive the body
/// (else memory of its own). The body comes back with the permit, which the caller holds
/// until the body is in place, so that the bodies held stay within the file's bound.
pub(crate) async fn land_one(
    fetch: Fetch<'_>,
    len: usize,
    ordinal: usize,
    offset: u64,
) -> Result<(upload::Landing, tokio::sync::OwnedSemaphorePermit)> {
    let permit = fetch.permit().await?;
    let landings = fetch.options.requests_in_flight();
    let pool = upload::landing_pool(ordinal, landings)?;
    let mut body = upload::landing(&pool, len)?;
    fetch.range_holding_permit(offset, body.bytes_mut()).await?;
    Ok((body, permit))
}

/// The request size as a `usize` (options cap it far below `usize::MAX`).
pub(crate) fn request_size(options: &RemoteOptions) -> usize {
    usize::try_from(options.request_size).unwrap_or(usize::MAX)
}

/// Checks that `[offset, offset + len)` lies inside an object of `object_len` bytes.
pub(crate) fn check_range(offset: u64, len: usize, object_len: u64) -> Result<()> {
    let end = offset.checked_add(len as u64).ok_or(Error::Overflow { offset, len: len as u64 })?;
    if end > object_len {
        return Err(Error::OutOfRange { offset, len: len as u64, file_len: object_len });
    }
    Ok(())
}
