//! [`RemoteWriter`]: an S3 object written at any offsets, from host or GPU memory, as a
//! multipart upload. The object appears whole when [`RemoteWriter::finish`] returns, or not at
//! all: S3 shows no part of an upload until it is completed, and a failed or abandoned upload
//! is aborted.
#![forbid(unsafe_code)]

mod books;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::sync::Arc;

use crate::sync::{Condvar, Mutex};
use futures_util::{StreamExt, TryStreamExt};
use object_store::multipart::PartId;
use object_store::path::Path as StorePath;
use object_store::{MultipartId, ObjectStoreExt, PutPayload};

use crate::config::Config;
use crate::error::{Error, RemoteErrorKind, Result};
use crate::memory::DeviceView;
use crate::remote::client::{self, WriteStore};
use crate::remote::failure::Failure;
use crate::remote::options::{RemoteOptions, MAX_STAGED_BYTES};
use crate::remote::parts::{self, Coverage, Piece};
use crate::remote::retry::{Attempts, GaveUp};
use crate::remote::url::RemoteUrl;
use books::{Filling, Phase, UploadBooks};

/// Bytes of GPU memory copied down at a time, outside any lock, before they are placed in
/// their part: a write from the GPU holds at most this much host memory besides the parts.
const STAGE_BYTES: usize = 4 << 20;

/// A new S3, GCS or Azure object written with [`pwrite`](Self::pwrite) at any offsets, from
/// any threads, and made visible by [`finish`](Self::finish).
///
/// - **Parts.** Byte `b` belongs to part `b / part_size` ([`RemoteOptions::part_size`]). A part
///   is uploaded as soon as all its bytes are written, while other writes go on; the last part
///   goes at `finish`. A write into a part already sent is refused, naming its first byte.
/// - **Memory.** Parts being filled or sent are held in host memory: at most `max_in_flight`
///   of them (64 by default), fewer where that many would pass 4 GiB
///   ([`MAX_STAGED_BYTES`](super::MAX_STAGED_BYTES); one part at least). A write that needs
///   one more waits for a part in flight to be sent; it is refused when no part can be sent
///   for want of bytes no other write in progress is writing (write each part whole, in
///   order, or raise `max_in_flight`), which fails the writer, as any failed write does. A
///   part grows with what is written to it, so a small object takes little memory. Writes
///   from GPU memory stage up to 4 MiB more each.
/// - **All or nothing.** `finish` checks that every byte below the highest written was
///   written (a hole is refused, naming its first byte), then completes the upload. Any
///   failure — a part refused after its retries, a hole, a `pwrite` that failed (its bytes
///   are missing, and the thread that finishes may not know it), [`abort`](Self::abort), or
///   dropping the writer unfinished — aborts the upload, and no object is written. `finish`
///   waits for the `pwrite` calls in progress, so each is in the object whole or fails it.
///   An object small enough for one part is written by a single PUT. (A completion whose
///   answer is lost after the store acted on it, by a timeout or a broken connection, is the
///   one case that leaves an object behind an error; the error says that the object may
///   exist.)
/// - **Retries** as for reads: the options' status codes, attempts, backoff and timeout.
/// - **Blocking.** Every call blocks; from inside an async runtime (`spawn_blocking` included)
///   they are refused: call them from a thread of its own. Dropping an unfinished writer waits
///   for its parts in flight and aborts the upload; inside an async runtime, it leaves that to
///   the remote runtime.
///
/// ```no_run
/// use gpumap::remote::RemoteWriter;
///
/// let writer = RemoteWriter::create("s3://my-bucket/out.bin")?;
/// writer.pwrite(&[1u8; 1 << 20], 0)?;
/// writer.pwrite(&[2u8; 1 << 20], 1 << 20)?;
/// assert_eq!(writer.finish()?, 2 << 20);
/// # Ok::<(), gpumap::Error>(())
/// ```
#[derive(Debug)]
pub struct RemoteWriter {
    shared: Arc<Shared>,
}

/// What the writer and its parts' upload tasks share.
#[derive(Debug)]
struct Shared {
    url: RemoteUrl,
    store: Arc<dyn WriteStore>,
    path: StorePath,
    options: RemoteOptions,
    runtime: Arc<tokio::runtime::Runtime>,
    part_size: usize,
    /// Parts held in memory (filling or sending) at most.
    max_held: usize,
    books: Mutex<UploadBooks>,
    /// Signalled whenever a part is sent or fails, a copy or a write ends, or the phase changes.
    changed: Condvar,
    /// The multipart upload, created when the first part goes out.
    upload: tokio::sync::OnceCell<MultipartId>,
}

/// The refusal of a write to a URL that is not an S3, GCS or Azure object.
fn not_writable(url: &RemoteUrl) -> Error {
    let reason = "writes go to s3://, gs:// and az:// objects only (an HTTP or WebHDFS server \
                  takes no multipart upload)";
    Failure::new(RemoteErrorKind::InvalidUrl, None, reason).into_error(url, "write to", 0)
}

impl RemoteWriter {
    /// Starts writing the object at `url` (`s3://bucket/key`, `gs://bucket/object`,
    /// `az://container/blob`) with the
    /// options the settings
    /// give ([`RemoteOptions::from_config`] of [`Config::global`]).
    pub fn create(url: &str) -> Result<RemoteWriter> {
        Self::create_with(url, &RemoteOptions::from_config(Config::global()?)?)
    }

    /// Starts writing the object at `url` with `options` (endpoint, region, retries, part size,
    /// parts held).
    pub fn create_with(url: &str, options: &RemoteOptions) -> Result<RemoteWriter> {
        Self::create_url(RemoteUrl::parse(url)?, options)
    }

    /// Starts writing the S3 object `key` of `bucket`.
    pub fn create_s3(bucket: &str, key: &str, options: &RemoteOptions) -> Result<RemoteWriter> {
        Self::create_url(RemoteUrl::s3(bucket, key)?, options)
    }

    /// Starts writing the object at a parsed URL. Nothing is sent until a part is whole (or
    /// until `finish`, for an object of one part).
    pub fn create_url(url: RemoteUrl, options: &RemoteOptions) -> Result<RemoteWriter> {
        let Some(store) = client::bucket_store(&url, options)? else {
            return Err(not_writable(&url));
        };
        Self::create_on(url, store, options)
    }

    /// Starts writing the object at `url` through a store already made (a
    /// [`RemotePrefix`](super::RemotePrefix)'s, whose connections it shares).
    pub(crate) fn create_on(
        url: RemoteUrl,
        store: Arc<dyn WriteStore>,
        options: &RemoteOptions,
    ) -> Result<RemoteWriter> {
        let key = match &url {
            RemoteUrl::S3 { key, .. }
            | RemoteUrl::Gcs { key, .. }
            | RemoteUrl::Azure { key, .. } => key,
            RemoteUrl::Http(_) | RemoteUrl::WebHdfs(_) => return Err(not_writable(&url)),
        };
        let path = RemoteUrl::store_path(key)?;
        let part_size = usize::try_from(options.part_size).map_err(|_| {
            Error::InvalidArgument(format!(
                "part_size {} does not fit this machine's address space",
                options.part_size
            ))
        })?;
        let fit = usize::try_from(MAX_STAGED_BYTES / options.part_size).unwrap_or(usize::MAX);
        let max_held = options.in_flight_for(usize::MAX).min(fit).max(1);
        tracing::debug!(url = %url, part_size, max_held, "remote writer created");
        let books = UploadBooks {
            phase: Phase::Open,
            filling: HashMap::new(),
            sending: BTreeSet::new(),
            sent: BTreeMap::new(),
            copying: 0,
            writers: 0,
            waiting: 0,
            end: 0,
            gave_up: None,
            failed_write: None,
        };
        let shared = Shared {
            store,
            path,
            options: options.clone(),
            runtime: client::runtime()?,
            part_size,
            max_held,
            books: Mutex::new(books),
            changed: Condvar::new(),
            upload: tokio::sync::OnceCell::new(),
            url,
        };
        Ok(RemoteWriter { shared: Arc::new(shared) })
    }

    /// The URL, without credentials.
    pub fn url(&self) -> &RemoteUrl {
        &self.shared.url
    }

    /// One past the highest byte written so far: the object's size if finished now.
    pub fn len(&self) -> u64 {
        self.shared.books.lock().end
    }

    /// Whether nothing has been written yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of each part but the last.
    pub fn part_size(&self) -> u64 {
        self.shared.part_size as u64
    }

    /// Parts held in host memory at most (being written or sent).
    pub fn max_parts_held(&self) -> usize {
        self.shared.max_held
    }

    /// Writes `src` at `offset` and returns its length. The bytes are the caller's again when
    /// this returns (copied into the parts held); see the type's docs for when they are sent.
    pub fn pwrite(&self, src: &[u8], offset: u64) -> Result<usize> {
        self.pwrite_device(DeviceView::Host(src), offset)
    }

    /// Writes `src` (GPU or host memory) at `offset`, as [`pwrite`](Self::pwrite) does: GPU
    /// bytes are copied down into the parts they belong to.
    ///
    /// A write that fails (refused, or failing part-way) fails the writer: every later call
    /// returns its error, and no object is written.
    pub fn pwrite_device(&self, src: DeviceView<'_>, offset: u64) -> Result<usize> {
        let shared = &self.shared;
        let pieces = match parts::pieces(offset, src.len(), shared.part_size) {
            Ok(pieces) => pieces,
            Err(e) => {
                shared.fail_writes(offset, src.len(), &e);
                return Err(e);
            }
        };
        // Refused here only when the writer takes no more writes: no write of it has failed.
        let _writer = WriterGuard::enter(shared)?;
        let written = self.write_pieces(&src, offset, pieces);
        if let Err(e) = &written {
            // Booked while this call still counts among the writers, so that a `finish`
            // waiting for them sees it.
            shared.fail_writes(offset, src.len(), e);
        }
        written
    }

    fn write_pieces(&self, src: &DeviceView<'_>, offset: u64, pieces: Vec<Piece>) -> Result<usize> {
        let shared = &self.shared;
        for piece in pieces {
            let at = offset + piece.in_source.start as u64;
            let bytes = shared.begin_copy(piece.part, at)?;
            let copied = shared.copy_piece(src, &piece, &bytes);
            shared.end_copy(piece.part, piece.in_part, copied.is_ok());
            copied?;
        }
        Ok(src.len())
    }

    /// Sends what remains and completes the upload: the object, of [`len`](Self::len) bytes,
    /// exists when this returns `Ok` with its size. Waits for the parts in flight. On any
    /// failure, or where a byte below the end was never written, the upload is aborted and no
    /// object is written — except where the request that completes the upload got no answer
    /// (a broken connection, a timeout): the store may have completed it, and the error says
    /// that the object may exist. Writes after this are refused.
    pub fn finish(&self) -> Result<u64> {
        client::blocking_allowed()?;
        let shared = &self.shared;
        let (end, rest) = {
            let mut books = shared.books.lock();
            if books.phase != Phase::Open {
                return Err(books.closed(&shared.url));
            }
            books.phase = Phase::Finishing;
            shared.changed.notify_all();
            // A write in progress ends whole, or fails the writer: its later pieces are
            // refused once the writer is finishing.
            while !books.sending.is_empty() || books.copying > 0 || books.writers > 0 {
                shared.changed.wait(&mut books);
            }
            let rest = match (books.gave_up.clone(), &books.failed_write) {
                (Some(gave_up), _) => Err(gave_up.into_error(&shared.url)),
                (None, Some(_)) => Err(books.write_failed(&shared.url)),
                (None, None) => books.take_rest(shared.part_size, &shared.url),
            };
            if rest.is_err() {
                books.phase = Phase::Aborted;
                books.filling.clear();
            }
            (books.end, rest)
        };
        let outcome = match rest {
            Ok(rest) => client::block_on(async {
                shared.complete(rest).await.map_err(|g| g.into_error(&shared.url))
            }),
            Err(e) => Err(e),
        };
        match outcome {
            Ok(()) => {
                shared.set_phase(Phase::Finished);
                tracing::debug!(url = %shared.url, bytes = end, "remote object written");
                Ok(end)
            }
            Err(e) => {
                shared.set_phase(Phase::Aborted);
                tracing::warn!(url = %shared.url, error = %e, "remote write failed; aborting the upload");
                shared.abort_quietly();
                Err(e)
            }
        }
    }

    /// Abandons the upload: parts in flight are waited for, then the upload is aborted, and no
    /// object is written. Writes after this are refused; aborting again does nothing.
    pub fn abort(&self) -> Result<()> {
        client::blocking_allowed()?;
        let shared = &self.shared;
        {
            let mut books = shared.books.lock();
            match books.phase {
                Phase::Open => books.phase = Phase::Aborted,
                Phase::Finished | Phase::Finishing => return Err(books.closed(&shared.url)),
                Phase::Aborted | Phase::Dropped => return Ok(()),
            }
            books.filling.clear();
            shared.changed.notify_all();
            while !books.sending.is_empty() || books.copying > 0 {
                shared.changed.wait(&mut books);
            }
        }
        tracing::debug!(url = %shared.url, "remote write aborted");
        client::block_on(async {
            shared.abort_upload().await.map_err(|g| g.into_error(&shared.url))
        })
    }
}

impl Drop for RemoteWriter {
    fn drop(&mut self) {
        let shared = &self.shared;
        let blocking = client::blocking_allowed().is_ok();
        {
            let mut books = shared.books.lock();
            if books.phase != Phase::Open {
                return;
            }
            books.phase = if blocking { Phase::Aborted } else { Phase::Dropped };
            books.filling.clear();
            shared.changed.notify_all();
            tracing::warn!(url = %shared.url, "remote writer dropped unfinished: the upload is aborted and no object is written");
            if blocking {
                while !books.sending.is_empty() {
                    shared.changed.wait(&mut books);
                }
            } else if !books.sending.is_empty() {
                // The last part in flight aborts the upload when it ends.
                return;
            }
        }
        if blocking {
            shared.abort_quietly();
        } else {
            Arc::clone(shared).abort_in_background();
        }
    }
}

/// Counts one `pwrite` call in progress while it lives, whatever way the call ends.
struct WriterGuard<'a> {
    shared: &'a Shared,
}

impl<'a> WriterGuard<'a> {
    fn enter(shared: &'a Shared) -> Result<WriterGuard<'a>> {
        let mut books = shared.books.lock();
        books.check_open(&shared.url)?;
        books.writers += 1;
        Ok(WriterGuard { shared })
    }
}

impl Drop for WriterGuard<'_> {
    fn drop(&mut self) {
        let mut books = self.shared.books.lock();
        books.writers -= 1;
        // A writer waiting for room may now be the only one left, and must not wait forever.
        self.shared.changed.notify_all();
    }
}

impl Shared {
    fn set_phase(&self, phase: Phase) {
        self.books.lock().phase = phase;
        self.changed.notify_all();
    }

    /// Books the failure of a `pwrite` of `len` bytes at `offset`, if the writer was still
    /// taking writes or finishing: the first one fails every later call, `finish` included.
    /// Parts stop going out.
    fn fail_writes(&self, offset: u64, len: usize, e: &Error) {
        let mut books = self.books.lock();
        let live = matches!(books.phase, Phase::Open | Phase::Finishing);
        if !live || books.gave_up.is_some() || books.failed_write.is_some() {
            return;
        }
        let failed = format!("the write of {len} bytes at byte {offset} failed ({e})");
        tracing::warn!(url = %self.url, offset, len, error = %e, "a remote write failed; the upload will be aborted");
        books.failed_write = Some(failed);
        self.changed.notify_all();
    }

    /// Counts a copy into `part` (for a write's byte `at`) and returns the part's bytes. Waits
    /// for room while the parts held are at their bound and another write or a send may make
    /// some; refuses when none can.
    fn begin_copy(&self, part: usize, at: u64) -> Result<Arc<Mutex<Vec<u8>>>> {
        let mut books = self.books.lock();
        loop {
            books.check_open(&self.url)?;
            if books.sent.contains_key(&part) || books.sending.contains(&part) {
                return Err(Error::InvalidArgument(format!(
                    "byte {at} of {} falls in part {} (bytes {}..{}), already sent: a part goes \
                     out once all its bytes are written, and is not written again",
                    self.url.redacted(),
                    part + 1,
                    part as u64 * self.part_size as u64,
                    (part as u64 + 1) * self.part_size as u64,
                )));
            }
            let held = books.filling.len() + books.sending.len();
            if books.filling.contains_key(&part) || held < self.max_held {
                let filling = books.filling.entry(part).or_insert_with(|| Filling {
                    bytes: Arc::new(Mutex::new(Vec::new())),
                    written: Coverage::default(),
                    copying: 0,
                });
                filling.copying += 1;
                let bytes = Arc::clone(&filling.bytes);
                books.copying += 1;
                return Ok(bytes);
            }
            // This writer is one of `writers`; if every other one waits too and nothing is in
            // flight, no part will ever be whole.
            if books.sending.is_empty() && books.waiting + 1 >= books.writers {
                return Err(Error::InvalidArgument(format!(
                    "byte {at} of {} needs a part beyond the {held} held (of {} bytes each), \
                     and none of those can be sent: each still misses bytes that no write in \
                     progress is writing; write each part whole before starting many others, \
                     or raise max_in_flight",
                    self.url.redacted(),
                    self.part_size
                )));
            }
            books.waiting += 1;
            self.changed.wait(&mut books);
            books.waiting -= 1;
        }
    }

    /// Copies one piece of `src` into its part's `bytes`: host memory under the part's lock
    /// (a memory copy), GPU memory first into a stage of its own, outside any lock.
    fn copy_piece(
        &self,
        src: &DeviceView<'_>,
        piece: &Piece,
        bytes: &Mutex<Vec<u8>>,
    ) -> Result<()> {
        if let DeviceView::Host(host) = src {
            let mut bytes = bytes.lock();
            self.grow(&mut bytes, piece.in_part.end)?;
            bytes[piece.in_part.clone()].copy_from_slice(&host[piece.in_source.clone()]);
            return Ok(());
        }
        let mut stage = vec![0u8; piece.in_source.len().min(STAGE_BYTES)];
        let mut done = 0;
        while done < piece.in_source.len() {
            let n = (piece.in_source.len() - done).min(stage.len());
            src.copy_to_host(piece.in_source.start + done, &mut stage[..n])?;
            let at = piece.in_part.start + done;
            let mut bytes = bytes.lock();
            self.grow(&mut bytes, at + n)?;
            bytes[at..at + n].copy_from_slice(&stage[..n]);
            done += n;
        }
        Ok(())
    }

    /// Grows a part's bytes to at least `len` (zeros), its capacity never past the part's size,
    /// refusing rather than aborting the process when memory runs out.
    fn grow(&self, bytes: &mut Vec<u8>, len: usize) -> Result<()> {
        if bytes.len() >= len {
            return Ok(());
        }
        if bytes.capacity() < len {
            let want = len.max(bytes.capacity().saturating_mul(2)).min(self.part_size);
            bytes.try_reserve_exact(want - bytes.len()).map_err(|e| Error::Unavailable {
                what: "host memory for a part of a remote write",
                reason: format!("{want} bytes: {e}"),
            })?;
        }
        bytes.resize(len, 0);
        Ok(())
    }

    /// Ends a copy into `part` (of `range`, if it succeeded); sends the part if it is now whole.
    fn end_copy(self: &Arc<Self>, part: usize, range: Range<usize>, ok: bool) {
        let mut books = self.books.lock();
        books.copying -= 1;
        let part_end = part as u64 * self.part_size as u64 + range.end as u64;
        if ok {
            books.end = books.end.max(part_end);
        }
        let Some(filling) = books.filling.get_mut(&part) else {
            // Aborted or dropped meanwhile: the part was let go.
            self.changed.notify_all();
            return;
        };
        filling.copying -= 1;
        if ok {
            filling.written.insert(range);
        }
        if filling.copying == 0 && filling.written.is_empty() {
            // A failed copy into a part nothing else was written to: it holds no room.
            books.filling.remove(&part);
            self.changed.notify_all();
            return;
        }
        let whole = filling.copying == 0 && filling.written.covers(self.part_size);
        let sending = matches!(books.phase, Phase::Open | Phase::Finishing);
        if whole && sending && books.gave_up.is_none() && books.failed_write.is_none() {
            if let Some(filling) = books.filling.remove(&part) {
                let bytes = std::mem::take(&mut *filling.bytes.lock());
                books.sending.insert(part);
                let shared = Arc::clone(self);
                self.runtime.spawn(async move { shared.send_whole_part(part, bytes).await });
            }
        }
        self.changed.notify_all();
    }

    /// Sends one whole part while writes go on, and books the outcome.
    async fn send_whole_part(self: Arc<Self>, part: usize, bytes: Vec<u8>) {
        let sent = self.send_part(part, bytes).await;
        let last_of_dropped = {
            let mut books = self.books.lock();
            books.sending.remove(&part);
            match sent {
                Ok(id) => {
                    books.sent.insert(part, id);
                }
                Err(gave_up) => {
                    tracing::warn!(url = %self.url, part = part + 1, reason = %gave_up.failure.reason, "a part of the upload failed for good; the upload will be aborted");
                    books.gave_up.get_or_insert(gave_up);
                }
            }
            self.changed.notify_all();
            books.phase == Phase::Dropped && books.sending.is_empty()
        };
        if last_of_dropped {
            self.abort_quietly_async().await;
        }
    }

    /// The upload's id, creating the upload at the first call.
    async fn upload_id(&self) -> std::result::Result<&MultipartId, GaveUp> {
        self.upload
            .get_or_try_init(|| async {
                self.attempts()
                    .run("create a multipart upload of", || async {
                        self.store.create_multipart(&self.path).await.map_err(|e| self.failure(&e))
                    })
                    .await
                    .map_err(|mut gave_up| {
                        // An upload whose id never arrived cannot be aborted by it. It holds no
                        // part, since parts go only to an upload whose id was read.
                        if let RemoteErrorKind::Connection
                        | RemoteErrorKind::Timeout
                        | RemoteErrorKind::BadResponse = gave_up.failure.kind
                        {
                            gave_up.failure.reason.push_str(
                                "; the store may have created the upload without its answer \
                                 arriving, and such an upload cannot be aborted by this writer: \
                                 it holds no data, and a lifecycle rule \
                                 (AbortIncompleteMultipartUpload) removes it",
                            );
                        }
                        gave_up
                    })
            })
            .await
    }

    async fn send_part(&self, part: usize, bytes: Vec<u8>) -> std::result::Result<PartId, GaveUp> {
        let id = self.upload_id().await?;
        let payload = PutPayload::from(bytes);
        let op = format!("PUT part {} ({} bytes) of", part + 1, payload.content_length());
        self.attempts()
            .run(&op, || async {
                let payload = payload.clone();
                self.store
                    .put_part(&self.path, id, part, payload)
                    .await
                    .map_err(|e| self.failure(&e))
            })
            .await
    }

    /// Sends the parts `finish` holds and completes the upload; an object with no part sent
    /// and at most one to send goes as one PUT.
    async fn complete(&self, rest: Vec<(usize, Vec<u8>)>) -> std::result::Result<(), GaveUp> {
        let sent_any = !self.books.lock().sent.is_empty();
        if !sent_any && self.upload.get().is_none() && rest.len() <= 1 {
            let bytes = rest.into_iter().next().map(|(_, b)| b).unwrap_or_default();
            let payload = PutPayload::from(bytes);
            let op = format!("PUT ({} bytes)", payload.content_length());
            return self
                .attempts()
                .run(&op, || async {
                    let payload = payload.clone();
                    self.store
                        .put(&self.path, payload)
                        .await
                        .map(drop)
                        .map_err(|e| self.failure(&e))
                })
                .await;
        }
        let sends = rest.into_iter().map(|(part, bytes)| async move {
            self.send_part(part, bytes).await.map(|id| (part, id))
        });
        let last: Vec<(usize, PartId)> =
            futures_util::stream::iter(sends).buffer_unordered(self.max_held).try_collect().await?;
        let ids: Vec<PartId> = {
            let mut books = self.books.lock();
            books.sent.extend(last);
            books.sent.values().cloned().collect()
        };
        let id = self.upload_id().await?;
        let op = format!("complete the upload ({} parts) of", ids.len());
        self.attempts()
            .run(&op, || async {
                self.store
                    .complete_multipart(&self.path, id, ids.clone())
                    .await
                    .map(drop)
                    .map_err(|e| self.failure(&e))
            })
            .await
            .map_err(|mut gave_up| {
                // The request may have reached the store and its answer been lost, or the
                // store may have completed the upload and sent an answer that cannot be read:
                // the object may then exist, and the caller must not be told that it does not.
                match gave_up.failure.kind {
                    RemoteErrorKind::Connection | RemoteErrorKind::Timeout => {
                        gave_up.failure.reason.push_str(
                            "; its answer was lost, so the store may have completed the \
                             upload: the object may exist, whole",
                        );
                    }
                    RemoteErrorKind::BadResponse => {
                        gave_up.failure.reason.push_str(
                            "; the store's answer could not be read, so it may have completed \
                             the upload: the object may exist, whole",
                        );
                    }
                    _ => {}
                }
                gave_up
            })
    }

    /// Aborts the upload, if one was created.
    async fn abort_upload(&self) -> std::result::Result<(), GaveUp> {
        let Some(id) = self.upload.get() else { return Ok(()) };
        self.attempts()
            .run("abort the multipart upload of", || async {
                self.store.abort_multipart(&self.path, id).await.map_err(|e| self.failure(&e))
            })
            .await
    }

    async fn abort_quietly_async(&self) {
        if let Err(gave_up) = self.abort_upload().await {
            let e = gave_up.into_error(&self.url);
            tracing::warn!(url = %self.url, error = %e, "could not abort the multipart upload; the store's lifecycle rules remove it");
        }
    }

    /// Aborts from a blocking caller, logging a failure (the caller's error is the first one).
    fn abort_quietly(&self) {
        let aborted = client::block_on(async {
            self.abort_quietly_async().await;
            Ok(())
        });
        if let Err(e) = aborted {
            tracing::warn!(url = %self.url, error = %e, "could not abort the multipart upload");
        }
    }

    /// Aborts on the runtime, for a `Drop` inside an async runtime, which must not block.
    fn abort_in_background(self: Arc<Self>) {
        let runtime = Arc::clone(&self.runtime);
        runtime.spawn(async move { self.abort_quietly_async().await });
    }

    fn attempts(&self) -> Attempts<'_> {
        Attempts::new(&self.options, &self.url)
    }

    fn failure(&self, e: &object_store::Error) -> Failure {
        Failure::from_store(e, &self.url)
    }
}
