//! Transfers between a file and host memory: in parallel tasks on the handle's pool, on the
//! calling thread alone, and as futures; each task's piece buffered, or with its aligned
//! middle through `O_DIRECT` where the policy (`direct`) says so.
#![forbid(unsafe_code)]

use std::sync::Arc;

use crate::align::{checked_end, split_tasks};
use crate::error::Result;
use crate::io::direct::{self, ReadPlan};
use crate::io::handle_state::HandleState;
use crate::io::pool::IoFuture;
use crate::io::writes_in_flight::spawn_counted;
use crate::sys::posix;

/// Reads into `buf` from `offset`, in parallel; the count read (short where the file ends).
pub(super) fn read(state: &HandleState, buf: &mut [u8], offset: u64) -> Result<usize> {
    state.check_read()?;
    checked_end(offset, buf.len() as u64)?;
    let tasks = split_tasks(offset, buf.len() as u64, state.settings.task_size);
    let plan = direct::read_plan(state, offset, buf.len() as u64);
    state.pool.run_split(&tasks, buf, |task, piece| read_piece(state, piece, task.offset, plan))
}

/// Writes all of `buf` at `offset`, in parallel.
pub(super) fn write(state: &HandleState, buf: &[u8], offset: u64) -> Result<usize> {
    state.check_positional_write()?;
    checked_end(offset, buf.len() as u64)?;
    let tasks = split_tasks(offset, buf.len() as u64, state.settings.task_size);
    state.pool.run_split_ref(&tasks, buf, |task, piece| write_piece(state, piece, task.offset))
}

/// Appends all of `buf` to the end of the file (`O_APPEND`: one piece).
pub(super) fn append(state: &HandleState, buf: &[u8]) -> Result<usize> {
    if !state.flags.append {
        return Err(state.access_error("append (open with \"a\" or \"a+\")"));
    }
    posix::append_all(&state.file, &state.path, buf)
}

/// Reads into `buf` from `offset` on the calling thread only.
pub(super) fn read_at(state: &HandleState, buf: &mut [u8], offset: u64) -> Result<usize> {
    state.check_read()?;
    checked_end(offset, buf.len() as u64)?;
    let plan = direct::read_plan(state, offset, buf.len() as u64);
    read_piece(state, buf, offset, plan)
}

/// Writes all of `buf` at `offset` on the calling thread only.
pub(super) fn write_at(state: &HandleState, buf: &[u8], offset: u64) -> Result<usize> {
    state.check_positional_write()?;
    checked_end(offset, buf.len() as u64)?;
    write_piece(state, buf, offset)
}

/// [`read`] of the owned `buf` on the pool; the future gives back the buffer and the count.
pub(super) fn pread<B>(state: &Arc<HandleState>, mut buf: B, offset: u64) -> IoFuture<(B, usize)>
where
    B: AsMut<[u8]> + Send + 'static,
{
    let shared = Arc::clone(state);
    state.pool.spawn(move || {
        let n = read(&shared, buf.as_mut(), offset)?;
        Ok((buf, n))
    })
}

/// [`write`] of the owned `buf` on the pool; the future gives back the buffer and the count.
pub(super) fn pwrite<B>(state: &Arc<HandleState>, buf: B, offset: u64) -> IoFuture<(B, usize)>
where
    B: AsRef<[u8]> + Send + 'static,
{
    let shared = Arc::clone(state);
    spawn_counted(&state.writes, &state.pool, move || {
        let n = write(&shared, buf.as_ref(), offset)?;
        Ok((buf, n))
    })
}

/// One task's read: buffered, or head buffered + middle direct + tail buffered, as `plan`
/// says.
pub(super) fn read_piece(
    state: &HandleState,
    buf: &mut [u8],
    offset: u64,
    plan: ReadPlan,
) -> Result<usize> {
    let len = buf.len() as u64;
    let direct = direct::piece_goes_direct(state, plan, offset, len);
    let file = state.thread_files.for_read(&state.file, buf.len());
    let path = &state.path;
    let Some((direct, mid_off, mid_len)) =
        direct::direct_middle(state, direct, buf.as_ptr() as usize, offset, len)
    else {
        return posix::pread_full(file, path, buf, offset);
    };
    let head = (mid_off - offset) as usize;
    let mid_end = head + mid_len as usize;
    let got = posix::pread_full(file, path, &mut buf[..head], offset)?;
    if got < head {
        return Ok(got);
    }
    let got = posix::pread_full(direct, path, &mut buf[head..mid_end], mid_off)?;
    if got < mid_len as usize {
        return Ok(head + got);
    }
    let tail = posix::pread_full(file, path, &mut buf[mid_end..], mid_off + mid_len)?;
    Ok(mid_end + tail)
}

/// One task's write: buffered, or head buffered + middle direct + tail buffered.
pub(super) fn write_piece(state: &HandleState, buf: &[u8], offset: u64) -> Result<usize> {
    let len = buf.len() as u64;
    let (file, path) = (&state.file, &state.path);
    let enabled = state.settings.direct_io_write;
    let Some((direct, mid_off, mid_len)) =
        direct::direct_middle(state, enabled, buf.as_ptr() as usize, offset, len)
    else {
        return posix::pwrite_all(file, path, buf, offset);
    };
    let head = (mid_off - offset) as usize;
    let mid_end = head + mid_len as usize;
    posix::pwrite_all(file, path, &buf[..head], offset)?;
    posix::pwrite_all(direct, path, &buf[head..mid_end], mid_off)?;
    posix::pwrite_all(file, path, &buf[mid_end..], mid_off + mid_len)?;
    Ok(buf.len())
}
