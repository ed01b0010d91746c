//! Transfers ordered on a CUDA stream ([`StreamTransfer`]): `cuFileReadAsync` /
//! `cuFileWriteAsync` on the cuFile path; on the POSIX path the stream is synchronized and
//! the transfer runs before the call returns, as in KvikIO's compatibility mode.
#![forbid(unsafe_code)]

use std::marker::PhantomData;

use crate::align::checked_end;
use crate::error::{Error, Result};
use crate::io::device_io;
use crate::io::gds::AsyncIo;
use crate::io::handle_state::HandleState;
use crate::memory::cuda::{RawRegion, Stream};

/// A stream-ordered transfer started by [`FileHandle::read_async`] or
/// [`FileHandle::write_async`]; it borrows the device memory until it is waited for (dropping
/// it waits too).
///
/// [`FileHandle::read_async`]: super::FileHandle::read_async
/// [`FileHandle::write_async`]: super::FileHandle::write_async
#[derive(Debug)]
#[must_use = "wait() gives the count (and the error, if any)"]
pub struct StreamTransfer<'a> {
    state: StreamState,
    _memory: PhantomData<&'a mut [u8]>,
}

#[derive(Debug)]
enum StreamState {
    /// The POSIX path ran in stream order before the call returned.
    Done(usize),
    /// `cuFileReadAsync`/`cuFileWriteAsync` queued on the stream.
    CuFile(AsyncIo<'static>),
}

impl StreamTransfer<'_> {
    /// Blocks until the stream has carried out the transfer; returns the bytes moved.
    pub fn wait(self) -> Result<usize> {
        match self.state {
            StreamState::Done(n) => Ok(n),
            StreamState::CuFile(io) => io.wait(),
        }
    }
}

/// A transfer between `region` and the file at `offset` (a write when `write`), ordered on
/// `stream`. The caller ties the result's lifetime to the memory `region` came from.
pub(super) fn stream_ordered<'a>(
    state: &HandleState,
    region: RawRegion,
    offset: u64,
    stream: &Stream,
    write: bool,
) -> Result<StreamTransfer<'a>> {
    if write {
        state.check_positional_write()?;
    } else {
        state.check_read()?;
    }
    checked_end(offset, region.len as u64)?;
    if region.ordinal != stream.device().ordinal() {
        return Err(Error::InvalidArgument(format!(
            "memory is on device {} but the stream on device {}",
            region.ordinal,
            stream.device().ordinal()
        )));
    }
    let state = if let Some(gds) = state.cufile_for(region.len) {
        StreamState::CuFile(gds.start_async(stream, write, region, 0, region.len, offset)?)
    } else {
        stream.synchronize()?;
        StreamState::Done(if write {
            device_io::write_cuda(state, region, offset)?
        } else {
            device_io::read_cuda(state, region, offset)?
        })
    };
    Ok(StreamTransfer { state, _memory: PhantomData })
}
