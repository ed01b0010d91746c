//! The books of a [`RemoteWriter`](super::RemoteWriter): which parts are filling, sending or
//! sent, the writes and copies in progress, and why the writer stopped taking writes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use crate::sync::Mutex;
use object_store::multipart::PartId;

use crate::error::{Error, Result};
use crate::remote::parts::Coverage;
use crate::remote::retry::GaveUp;
use crate::remote::url::RemoteUrl;

/// Where the writer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Open,
    Finishing,
    Finished,
    Aborted,
    /// Dropped unfinished inside an async runtime: the last part in flight aborts the upload.
    Dropped,
}

/// The writer's state, under [`Shared::books`](super::Shared::books). Its lock is never held
/// across a request, a copy of the caller's bytes or a wait on another lock's holder.
#[derive(Debug)]
pub(super) struct UploadBooks {
    pub(super) phase: Phase,
    pub(super) filling: HashMap<usize, Filling>,
    pub(super) sending: BTreeSet<usize>,
    pub(super) sent: BTreeMap<usize, PartId>,
    /// Copies into parts in progress (a part is not sent while one into it runs).
    pub(super) copying: usize,
    /// `pwrite` calls in progress, and how many of them wait for room: when all of them wait
    /// and nothing is being sent, none ever gets room, so the last to wait is refused.
    pub(super) writers: usize,
    pub(super) waiting: usize,
    /// One past the highest byte written.
    pub(super) end: u64,
    /// The first request that failed for good: every later call fails with it.
    pub(super) gave_up: Option<GaveUp>,
    /// The first `pwrite` that failed while the writer was open: every later call fails with
    /// it, since the object would lack its bytes.
    pub(super) failed_write: Option<String>,
}

/// A part being written: its bytes so far (grown as written, up to the part's size) and which
/// of them are written.
#[derive(Debug)]
pub(super) struct Filling {
    pub(super) bytes: Arc<Mutex<Vec<u8>>>,
    pub(super) written: Coverage,
    pub(super) copying: usize,
}

impl UploadBooks {
    /// `Ok` while writes are taken; else why not.
    pub(super) fn check_open(&self, url: &RemoteUrl) -> Result<()> {
        if let Some(gave_up) = &self.gave_up {
            return Err(gave_up.clone().into_error(url));
        }
        if self.failed_write.is_some() {
            return Err(self.write_failed(url));
        }
        match self.phase {
            Phase::Open => Ok(()),
            _ => Err(self.closed(url)),
        }
    }

    /// The error of a call made after a `pwrite` failed.
    pub(super) fn write_failed(&self, url: &RemoteUrl) -> Error {
        let failed = self.failed_write.as_deref().unwrap_or("a write failed");
        Error::InvalidArgument(format!(
            "the writer of {} takes no more calls: {failed}; the object would lack its bytes, \
             so the upload is aborted and no object is written",
            url.redacted()
        ))
    }

    /// The error of a call made after the writer stopped taking writes.
    pub(super) fn closed(&self, url: &RemoteUrl) -> Error {
        let state = match self.phase {
            Phase::Open => "open",
            Phase::Finishing => "finishing on another thread",
            Phase::Finished => "finished: the object is written",
            Phase::Aborted | Phase::Dropped => "aborted: no object is written",
        };
        Error::InvalidArgument(format!("the writer of {} is {state}", url.redacted()))
    }

    /// The parts `finish` still sends, each cut to the object's end, after checking that every
    /// byte below the end was written (refusing the first hole).
    pub(super) fn take_rest(
        &mut self,
        part_size: usize,
        url: &RemoteUrl,
    ) -> Result<Vec<(usize, Vec<u8>)>> {
        let size = part_size as u64;
        let parts = usize::try_from(self.end.div_ceil(size)).unwrap_or(usize::MAX);
        for part in 0..parts {
            if self.sent.contains_key(&part) {
                continue;
            }
            let len = (self.end - part as u64 * size).min(size) as usize;
            let gap = match self.filling.get(&part) {
                Some(filling) => filling.written.first_gap(len),
                None => Some(0),
            };
            if let Some(gap) = gap {
                return Err(Error::InvalidArgument(format!(
                    "byte {} of the {} bytes written to {} was never written (an object has no \
                     holes); the upload is aborted and no object is written",
                    part as u64 * size + gap as u64,
                    self.end,
                    url.redacted()
                )));
            }
        }
        let mut rest = Vec::new();
        for part in 0..parts {
            if let Some(filling) = self.filling.remove(&part) {
                let len = (self.end - part as u64 * size).min(size) as usize;
                let mut bytes = std::mem::take(&mut *filling.bytes.lock());
                bytes.truncate(len);
                rest.push((part, bytes));
            }
        }
        Ok(rest)
    }
}
