//! Stream-ordered cuFile reads and writes (`cuFileReadAsync` / `cuFileWriteAsync`).

use super::*;

/// The values `cuFileReadAsync`/`cuFileWriteAsync` read and write through pointers when the
/// stream reaches the operation; boxed so their addresses are stable until it completed.
struct AsyncState {
    size: usize,
    file_offset: libc::off_t,
    buf_offset: libc::off_t,
    bytes_done: isize,
}

/// A stream-ordered cuFile read or write in flight. Owns the parameter block, the registration
/// and the stream until the recorded event completed; dropping it waits (and leaks the block if
/// completion cannot be confirmed).
pub(crate) struct PendingFileIo {
    state: Option<Box<AsyncState>>,
    event: RawEvent,
    stream: Arc<RawStream>,
    reg: Arc<FileRegistration>,
    op: &'static str,
    file_offset: u64,
}

impl PendingFileIo {
    /// Enqueues `cuFileReadAsync` (`write == false`) or `cuFileWriteAsync` on `stream`; the
    /// caller has bound the stream's context and range-checked the device memory.
    pub(crate) fn start(
        reg: &Arc<FileRegistration>,
        stream: &Arc<RawStream>,
        write: bool,
        base: u64,
        base_offset: usize,
        len: usize,
        file_offset: u64,
    ) -> Result<Self> {
        let api = api()?;
        let (op, f) = if write {
            ("cuFileWriteAsync", optional(&api.cuFileWriteAsync)?)
        } else {
            ("cuFileReadAsync", optional(&api.cuFileReadAsync)?)
        };
        let mut state = Box::new(AsyncState {
            size: len,
            file_offset: to_off(file_offset, len as u64)?,
            buf_offset: to_off(base_offset as u64, len as u64)?,
            bytes_done: 0,
        });
        let event = RawEvent::new()?;
        let s: &mut AsyncState = &mut state;
        // SAFETY: the four pointers point into the boxed state, which this guard keeps (or
        // leaks) until the stream passed the operation; the handle and stream are kept alive by
        // the Arcs held below.
        let st = unsafe {
            f(
                reg.handle,
                base as *mut c_void,
                &mut s.size,
                &mut s.file_offset,
                &mut s.buf_offset,
                &mut s.bytes_done,
                stream.handle(),
            )
        };
        check(op, st, Some(&reg.path), Some(file_offset))?;
        let pending = Self {
            state: Some(state),
            event,
            stream: Arc::clone(stream),
            reg: Arc::clone(reg),
            op,
            file_offset,
        };
        pending.event.record(stream)?;
        Ok(pending)
    }

    /// Blocks until the operation completed; returns the bytes transferred.
    pub(crate) fn wait(mut self) -> Result<usize> {
        self.event.synchronize()?;
        let state = self
            .state
            .take()
            .ok_or_else(|| Error::InvalidArgument("async I/O already waited".to_owned()))?;
        match state.bytes_done {
            n if n >= 0 => Ok(n as usize),
            n => {
                let code = if n == -1 { 5044 } else { -(n as i64) };
                Err(Error::CuFile {
                    op: self.op,
                    code,
                    name: op_error_name(code).to_owned(),
                    path: Some(self.reg.path().to_path_buf()),
                    offset: Some(self.file_offset),
                })
            }
        }
    }
}

impl Drop for PendingFileIo {
    fn drop(&mut self) {
        let Some(state) = self.state.take() else { return };
        if self.event.synchronize().is_ok() || self.stream.synchronize().is_ok() {
            return;
        }
        tracing::warn!("could not confirm a cuFile async I/O finished; leaking its state");
        std::mem::forget(state);
    }
}
