//! Views of a mapped file: [`View`] (read-only) and [`ViewMut`], ranges made resident and
//! pinned until dropped; their device memory for kernels, and copies to and from host memory
//! on either backend.
#![forbid(unsafe_code)]

use std::sync::Arc;

use super::engine::{self, Home, Pins};
use super::handle::OpenFile;
#[cfg(doc)]
use super::DeviceMappedFile;
use crate::error::{Error, Result};
use crate::memory::cuda::{CudaView, CudaViewMut, RawRegion};

/// A resident, pinned, read-only range of a [`DeviceMappedFile`]; unpinned when dropped. It
/// cannot be written through: writes take a [`ViewMut`].
///
/// ```compile_fail
/// # fn f(map: gpumap::mapped::DeviceMappedFile) -> gpumap::Result<()> {
/// let view = map.view(0, 4096)?;
/// view.copy_from_host(0, b"no")?; // a read view has no way to write
/// # Ok(()) }
/// ```
pub struct View {
    file: Arc<OpenFile>,
    offset: u64,
    len: u64,
    pins: Pins,
}

impl std::fmt::Debug for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("View").field("offset", &self.offset).field("len", &self.len).finish()
    }
}

impl View {
    /// A view of `[offset, offset + len)` of `file`, pinned by `pins`.
    pub(crate) fn new(file: Arc<OpenFile>, offset: u64, len: u64, pins: Pins) -> View {
        View { file, offset, len, pins }
    }

    /// File offset of the view's first byte.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes in the view.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where byte `at` of the view is.
    fn home(&self, at: u64) -> Home<'_> {
        let offset = self.offset + at;
        match self.pins {
            Pins::Slot(slot) => Home::Slot(slot, offset % self.file.engine.geometry.extent),
            Pins::Frames(_) | Pins::Nothing | Pins::ZeroCopy => {
                Home::Frame(&self.file.entry.memory, offset)
            }
        }
    }

    fn raw(&self) -> Option<RawRegion> {
        if self.len == 0 {
            return None;
        }
        if let (Pins::ZeroCopy, Some(file)) = (&self.pins, &self.file.zero_copy) {
            return file.region(self.offset, self.len as usize);
        }
        self.file.engine.store.region(self.home(0), self.len as usize)
    }

    /// The view's GPU memory, for kernels: valid while the view lives (the borrow says so).
    /// `None` on the host backend (and for an empty view).
    ///
    /// Work queued on a stream does not hold the pin: synchronise the stream (or an event after
    /// the last kernel that reads this memory) before dropping the view, because once it is
    /// dropped the memory may be evicted and reused for other data. The address works in the
    /// device's primary context, which gpumap and cudarc's `CudaContext::new` both use.
    pub fn device(&self) -> Option<CudaView<'_>> {
        self.raw().map(CudaView::assume_valid)
    }

    /// Copies `dst.len()` bytes from `at` (relative to the view) into `dst`.
    pub fn copy_to_host(&self, at: u64, dst: &mut [u8]) -> Result<()> {
        if let (Pins::ZeroCopy, Some(file)) = (&self.pins, &self.file.zero_copy) {
            self.check_within(at, dst.len() as u64)?;
            return file.read_at(self.offset + at, dst);
        }
        self.pieces(at, dst.len() as u64, |home, range| {
            self.file.engine.store.copy_out(home, &mut dst[range])
        })
    }

    /// `OutOfView` unless `[at, at + len)` lies within the view.
    fn check_within(&self, at: u64, len: u64) -> Result<()> {
        match at.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::OutOfView {
                offset: at,
                len,
                view_offset: self.offset,
                view_len: self.len,
            }),
        }
    }

    /// Calls `f(home, range of the caller's buffer)` for each piece of `[at, at + len)` of the
    /// view that lies in one frame (host frames are separate allocations).
    fn pieces(
        &self,
        at: u64,
        len: u64,
        mut f: impl FnMut(Home<'_>, std::ops::Range<usize>) -> Result<()>,
    ) -> Result<()> {
        self.check_within(at, len)?;
        let frame = self.file.engine.geometry.frame;
        let mut done = 0u64;
        while done < len {
            let offset = self.offset + at + done;
            let n = (frame - offset % frame).min(len - done);
            f(self.home(at + done), done as usize..(done + n) as usize)?;
            done += n;
        }
        Ok(())
    }
}

impl Drop for View {
    fn drop(&mut self) {
        if self.file.is_inherited() {
            return; // a parent's view: its pins are the parent's books (see `is_inherited`)
        }
        let extents = self.file.engine.geometry.extents_covering(self.offset, self.len);
        engine::unpin_view(&self.file.engine, &self.file.entry, &self.pins, extents, false);
    }
}

/// A resident, pinned, writable range of a [`DeviceMappedFile`] (see
/// [`DeviceMappedFile::view_mut`]); its bytes are written back after it is dropped.
pub struct ViewMut {
    view: View,
}

impl std::fmt::Debug for ViewMut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ViewMut")
            .field("offset", &self.view.offset)
            .field("len", &self.view.len)
            .finish()
    }
}

impl ViewMut {
    /// A writable view (its pins were taken for writing).
    pub(crate) fn new(view: View) -> ViewMut {
        ViewMut { view }
    }

    /// File offset of the view's first byte.
    pub fn offset(&self) -> u64 {
        self.view.offset
    }

    /// Bytes in the view.
    pub fn len(&self) -> u64 {
        self.view.len
    }

    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.view.len == 0
    }

    /// The view's GPU memory, to read.
    pub fn device(&self) -> Option<CudaView<'_>> {
        self.view.device()
    }

    /// The view's GPU memory, for kernels that write it: valid while this borrow lives. `None`
    /// on the host backend.
    pub fn device_mut(&mut self) -> Option<CudaViewMut<'_>> {
        self.view.raw().map(CudaViewMut::assume_valid)
    }

    /// Copies `dst.len()` bytes from `at` (relative to the view) into `dst`.
    pub fn copy_to_host(&self, at: u64, dst: &mut [u8]) -> Result<()> {
        self.view.copy_to_host(at, dst)
    }

    /// Copies `src` to `at` (relative to the view).
    pub fn copy_from_host(&mut self, at: u64, src: &[u8]) -> Result<()> {
        let store = &self.view.file.engine.store;
        self.view.pieces(at, src.len() as u64, |home, range| store.copy_in(home, &src[range]))
    }
}

impl Drop for ViewMut {
    fn drop(&mut self) {
        let view = &mut self.view;
        if view.file.is_inherited() {
            return;
        }
        let extents = view.file.engine.geometry.extents_covering(view.offset, view.len);
        engine::unpin_view(&view.file.engine, &view.file.entry, &view.pins, extents, true);
        // The inner view must not unpin again.
        view.pins = Pins::Nothing;
    }
}
