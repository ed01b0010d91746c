//! [`CudaView`] and [`CudaViewMut`]: device memory borrowed for a lifetime, to read from or to
//! write into. Raw addresses from other stacks (another CUDA library, Python's
//! `__cuda_array_interface__`, a C caller) enter through the `unsafe` `from_raw` constructors:
//! there the caller promises what borrowing proves everywhere else, and the driver still checks
//! what it can. They hold no `unsafe` block (`deny`, allowed on them alone).
#![deny(unsafe_code)]

use std::fmt;
use std::marker::PhantomData;
use std::ops::RangeBounds;

use super::pointer::validate_device_range;
use super::region::{check_range, resolve_range, RawRegion};
use crate::error::{Error, Result};
use crate::sys::cuda as sys;

/// Device memory to read from, borrowed for `'a` from whatever owns it (a `CudaBuffer`, a
/// mapped file's view, a cudarc slice): like `&'a [u8]`, and like cudarc's `CudaView<'a>`, it
/// cannot outlive its memory. `Copy`, because shared reads may overlap.
///
/// ```compile_fail
/// use gpumap::memory::cuda::{CudaBuffer, CudaDevice};
/// let device = CudaDevice::new(0).unwrap();
/// let view = {
///     let buffer = CudaBuffer::alloc(&device, 4096).unwrap();
///     buffer.view()
/// }; // `buffer` is freed here, so the view cannot be used after it
/// println!("{}", view.len());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CudaView<'a> {
    pub(crate) raw: RawRegion,
    _borrow: PhantomData<&'a [u8]>,
}

/// Device memory to write into, exclusively borrowed for `'a` (like `&'a mut [u8]`). Split it
/// ([`split_at_mut`](Self::split_at_mut), [`chunks_mut`](Self::chunks_mut)) for many disjoint
/// destinations, e.g. a batch of reads.
#[derive(PartialEq, Eq, Hash)]
pub struct CudaViewMut<'a> {
    pub(crate) raw: RawRegion,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl fmt::Debug for CudaView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaView")
            .field("ptr", &format_args!("{:#x}", self.raw.ptr))
            .field("len", &self.raw.len)
            .field("device", &self.raw.ordinal)
            .finish()
    }
}

impl fmt::Debug for CudaViewMut<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaViewMut")
            .field("ptr", &format_args!("{:#x}", self.raw.ptr))
            .field("len", &self.raw.len)
            .field("device", &self.raw.ordinal)
            .finish()
    }
}

impl<'a> CudaView<'a> {
    /// A view of memory the crate knows to be live and unwritten for `'a` (its own buffers,
    /// pinned map ranges). Not public: outside the crate, raw addresses enter only through the
    /// `unsafe` [`CudaView::from_raw`].
    pub(crate) fn assume_valid(raw: RawRegion) -> Self {
        CudaView { raw, _borrow: PhantomData }
    }

    /// Wraps device memory allocated by another CUDA stack, after checking through
    /// `cuPointerGetAttributes` that `ptr` is device (or managed) memory and that
    /// `[ptr, ptr + len)` lies inside one allocation. A host pointer is `InvalidArgument`, a
    /// range past the allocation's end `BufferTooSmall`, an unknown (e.g. freed) address
    /// `InvalidArgument`; without CUDA, `Unavailable`.
    ///
    /// # Safety
    ///
    /// The memory must stay allocated for `'a`, and nothing may write to it while gpumap reads
    /// it through this view (or a copy or slice of it). The driver's checks cannot see a free
    /// that happens later.
    #[doc(alias = "cuPointerGetAttributes")]
    #[doc(alias = "cuMemGetAddressRange")]
    #[allow(unsafe_code)] // a contract for the caller; no unsafe block
    pub unsafe fn from_raw(ptr: u64, len: usize) -> Result<CudaView<'a>> {
        Ok(CudaView::assume_valid(validate_device_range(ptr, len)?))
    }

    /// Wraps a cudarc device slice (`CudaSlice<u8>`, `CudaView<u8>`, ...), borrowing it.
    /// `stream` is the cudarc stream the slice is used on; it is synchronized here, so work
    /// cudarc queued on the memory has finished before gpumap's own streams read it.
    pub fn from_cudarc<S>(slice: &'a S, stream: &cudarc::driver::CudaStream) -> Result<Self>
    where
        S: cudarc::driver::DevicePtr<u8>,
    {
        let len = slice.num_bytes();
        let ptr = {
            let (ptr, _record) = slice.device_ptr(stream);
            ptr
        };
        synchronize_cudarc(stream)?;
        Ok(Self::assume_valid(RawRegion { ptr, len, ordinal: stream.context().ordinal() }))
    }

    /// The device address of the first byte.
    pub fn ptr(&self) -> u64 {
        self.raw.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.raw.len
    }

    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.raw.len == 0
    }

    /// The ordinal of the device the memory is on.
    pub fn device_ordinal(&self) -> usize {
        self.raw.ordinal
    }

    /// The bytes in `range`, bounds-checked (an error, never a panic).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<CudaView<'a>> {
        let (start, len) = resolve_range(range, self.raw.len)?;
        Ok(Self::assume_valid(self.raw.sub(start, len)?))
    }

    /// The view cut in two at `mid`.
    pub fn split_at(&self, mid: usize) -> Result<(CudaView<'a>, CudaView<'a>)> {
        Ok((self.slice(..mid)?, self.slice(mid..)?))
    }

    /// Copies `dst.len()` bytes at `offset` into `dst` (synchronous `cuMemcpyDtoH`).
    #[doc(alias = "cuMemcpyDtoH")]
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.raw.copy_to_host(offset, dst)
    }
}

impl<'a> CudaViewMut<'a> {
    /// A view of memory the crate knows to be live and exclusively its caller's for `'a`.
    pub(crate) fn assume_valid(raw: RawRegion) -> Self {
        CudaViewMut { raw, _borrow: PhantomData }
    }

    /// Wraps device memory allocated by another CUDA stack for writing, with the checks of
    /// [`CudaView::from_raw`].
    ///
    /// # Safety
    ///
    /// The memory must stay allocated for `'a`, and nothing else may read or write it while
    /// gpumap writes through this view (or a slice of it).
    #[doc(alias = "cuPointerGetAttributes")]
    #[allow(unsafe_code)] // a contract for the caller; no unsafe block
    pub unsafe fn from_raw(ptr: u64, len: usize) -> Result<CudaViewMut<'a>> {
        Ok(CudaViewMut::assume_valid(validate_device_range(ptr, len)?))
    }

    /// Wraps a cudarc device slice for writing, borrowing it exclusively. `stream` is
    /// synchronized first (see [`CudaView::from_cudarc`]).
    pub fn from_cudarc<S>(slice: &'a mut S, stream: &cudarc::driver::CudaStream) -> Result<Self>
    where
        S: cudarc::driver::DevicePtrMut<u8>,
    {
        let len = slice.num_bytes();
        let ptr = {
            let (ptr, _record) = slice.device_ptr_mut(stream);
            ptr
        };
        synchronize_cudarc(stream)?;
        Ok(Self::assume_valid(RawRegion { ptr, len, ordinal: stream.context().ordinal() }))
    }

    /// The device address of the first byte.
    pub fn ptr(&self) -> u64 {
        self.raw.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.raw.len
    }

    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.raw.len == 0
    }

    /// The ordinal of the device the memory is on.
    pub fn device_ordinal(&self) -> usize {
        self.raw.ordinal
    }

    /// The same memory, to read from, for as long as this view is borrowed.
    pub fn as_view(&self) -> CudaView<'_> {
        CudaView::assume_valid(self.raw)
    }

    /// A shorter-lived view of the same memory (like `&mut *slice`), leaving this one usable
    /// afterwards.
    pub fn reborrow(&mut self) -> CudaViewMut<'_> {
        CudaViewMut::assume_valid(self.raw)
    }

    /// The bytes in `range`, bounds-checked, for as long as this view is borrowed.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<CudaViewMut<'_>> {
        let (start, len) = resolve_range(range, self.raw.len)?;
        Ok(CudaViewMut::assume_valid(self.raw.sub(start, len)?))
    }

    /// The bytes in `range`, bounds-checked, consuming this view.
    pub fn into_slice(self, range: impl RangeBounds<usize>) -> Result<CudaViewMut<'a>> {
        let (start, len) = resolve_range(range, self.raw.len)?;
        Ok(CudaViewMut::assume_valid(self.raw.sub(start, len)?))
    }

    /// Two disjoint views, `[0, mid)` and `[mid, len)`.
    pub fn split_at_mut(self, mid: usize) -> Result<(CudaViewMut<'a>, CudaViewMut<'a>)> {
        check_range(0, mid, self.raw.len)?;
        let head = self.raw.sub(0, mid)?;
        let tail = self.raw.sub(mid, self.raw.len - mid)?;
        Ok((CudaViewMut::assume_valid(head), CudaViewMut::assume_valid(tail)))
    }

    /// Disjoint views of `size` bytes each (the last one shorter where `size` does not divide
    /// the length). A zero `size` is an error.
    pub fn chunks_mut(self, size: usize) -> Result<impl Iterator<Item = CudaViewMut<'a>>> {
        if size == 0 {
            return Err(Error::InvalidArgument("chunk size 0".to_owned()));
        }
        let raw = self.raw;
        Ok((0..raw.len.div_ceil(size)).map(move |i| {
            let at = i * size;
            let len = size.min(raw.len - at);
            CudaViewMut::assume_valid(RawRegion { ptr: raw.ptr + at as u64, len, ..raw })
        }))
    }

    /// Copies `src` to `offset` (`cuMemcpyHtoD`; on the device when it returns).
    #[doc(alias = "cuMemcpyHtoD")]
    pub fn copy_from_host(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        self.raw.copy_from_host(offset, src)
    }

    /// Copies `dst.len()` bytes at `offset` into `dst` (synchronous `cuMemcpyDtoH`).
    #[doc(alias = "cuMemcpyDtoH")]
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.raw.copy_to_host(offset, dst)
    }

    /// Sets every byte to `value` (`cuMemsetD8`; done when it returns).
    #[doc(alias = "cuMemsetD8")]
    pub fn fill(&mut self, value: u8) -> Result<()> {
        self.raw.fill(value)
    }
}

impl<'a> From<CudaViewMut<'a>> for CudaView<'a> {
    fn from(view: CudaViewMut<'a>) -> Self {
        CudaView::assume_valid(view.raw)
    }
}

fn synchronize_cudarc(stream: &cudarc::driver::CudaStream) -> Result<()> {
    stream.synchronize().map_err(|e| Error::Cuda {
        op: "cuStreamSynchronize",
        code: e.0 as i32,
        name: sys::error_name(e.0 as i32),
    })
}
