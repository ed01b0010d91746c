//! Where bytes live: device memory — a CUDA GPU's, or host memory standing in for it — pinned
//! bounce buffers, and the views through which transfers reach them.
//!
//! [`DeviceBuffer`] is the one buffer type a program needs: on a machine with a GPU it is GPU
//! memory, without one it is host memory, and every transfer, batch and map accepts either. A
//! [`DeviceView`] or [`DeviceViewMut`] borrows the memory it points to, like `&[u8]` and
//! `&mut [u8]`, so a view cannot outlive its buffer:
//!
//! ```compile_fail
//! use gpumap::memory::{Device, DeviceBuffer};
//! let view = {
//!     let mut buffer = DeviceBuffer::zeroed(&Device::auto(), 4096).unwrap();
//!     buffer.view_mut()
//! }; // the buffer is freed here
//! let _ = view.len();
//! ```
//!
//! The CUDA side alone is in [`cuda`] ([`cuda::CudaBuffer`], [`cuda::CudaView`], streams,
//! pinned memory); raw addresses from other stacks enter only through the `unsafe`
//! [`cuda::CudaView::from_raw`] and [`cuda::CudaViewMut::from_raw`].
// Each module below forbids `unsafe` but cuda/view.rs and stream_ref.rs, which hold the
// `from_raw` constructors.
#![deny(unsafe_code)]

pub mod bounce;
pub mod cuda;
pub mod host;
pub(crate) mod kernels;
pub(crate) mod registered;
mod stream_ref;

use std::fmt;
use std::ops::RangeBounds;

pub use host::HostBuffer;
pub use stream_ref::StreamRef;

use crate::error::{Error, Result};
use cuda::{resolve_range, CudaBuffer, CudaDevice, CudaView, CudaViewMut};

/// Where device memory comes from: a CUDA GPU, or host memory standing in for one (CI,
/// laptops, machines whose GPU is busy). Cheap to clone.
#[derive(Clone)]
pub enum Device {
    /// A CUDA GPU.
    Cuda(CudaDevice),
    /// Host memory standing in for a GPU: the same transfers, batches and maps, with
    /// [`DeviceView::Host`] / [`DeviceViewMut::Host`] views.
    Host,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

impl Device {
    /// GPU 0 where there is one, else host memory. Why there is no GPU is logged (`tracing`,
    /// debug level) and answered by `Capabilities::cuda_reason`.
    pub fn auto() -> Device {
        match CudaDevice::new(0) {
            Ok(device) => Device::Cuda(device),
            Err(e) => {
                tracing::debug!("no GPU, host memory stands in: {e}");
                Device::Host
            }
        }
    }

    /// The CUDA GPU with this ordinal; `Unavailable` when there is no such device.
    pub fn cuda(ordinal: usize) -> Result<Device> {
        Ok(Device::Cuda(CudaDevice::new(ordinal)?))
    }

    /// Whether this is host memory standing in for a GPU.
    pub fn is_host(&self) -> bool {
        matches!(self, Device::Host)
    }

    /// The GPU's ordinal; `None` for host memory.
    pub fn ordinal(&self) -> Option<usize> {
        match self {
            Device::Cuda(d) => Some(d.ordinal()),
            Device::Host => None,
        }
    }

    /// The CUDA device, if this is one.
    pub fn as_cuda(&self) -> Option<&CudaDevice> {
        match self {
            Device::Cuda(d) => Some(d),
            Device::Host => None,
        }
    }

    /// `"GPU 0 (NVIDIA H100 PCIe)"` or `"host memory"`.
    pub fn describe(&self) -> String {
        match self {
            Device::Cuda(d) => format!("GPU {} ({})", d.ordinal(), d.name()),
            Device::Host => "host memory".to_owned(),
        }
    }
}

/// An owned buffer of device memory — GPU memory, or host memory where the [`Device`] is
/// [`Device::Host`] — freed on drop.
///
/// ```
/// use gpumap::memory::{Device, DeviceBuffer};
/// let mut buffer = DeviceBuffer::zeroed(&Device::auto(), 8192)?; // GPU 0, or host memory
/// buffer.copy_from_host(4096, b"hello")?;
/// let mut back = [0u8; 5];
/// buffer.copy_to_host(4096, &mut back)?;
/// assert_eq!(&back, b"hello");
/// # Ok::<(), gpumap::Error>(())
/// ```
#[derive(Debug)]
pub enum DeviceBuffer {
    /// GPU memory.
    Cuda(CudaBuffer),
    /// Host memory standing in for it (page-aligned, so `O_DIRECT` can reach it).
    Host(HostBuffer),
}

impl DeviceBuffer {
    /// `len` bytes on `device`; contents undefined on a GPU, zero on the host.
    pub fn alloc(device: &Device, len: usize) -> Result<DeviceBuffer> {
        Ok(match device {
            Device::Cuda(d) => DeviceBuffer::Cuda(CudaBuffer::alloc(d, len)?),
            Device::Host => DeviceBuffer::Host(HostBuffer::new(len)?),
        })
    }

    /// `len` zeroed bytes on `device`.
    pub fn zeroed(device: &Device, len: usize) -> Result<DeviceBuffer> {
        Ok(match device {
            Device::Cuda(d) => DeviceBuffer::Cuda(CudaBuffer::zeroed(d, len)?),
            Device::Host => DeviceBuffer::Host(HostBuffer::new(len)?),
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            DeviceBuffer::Cuda(b) => b.len(),
            DeviceBuffer::Host(b) => b.len(),
        }
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the buffer lives.
    pub fn device(&self) -> Device {
        match self {
            DeviceBuffer::Cuda(b) => Device::Cuda(b.device().clone()),
            DeviceBuffer::Host(_) => Device::Host,
        }
    }

    /// The whole buffer, to read from.
    pub fn view(&self) -> DeviceView<'_> {
        match self {
            DeviceBuffer::Cuda(b) => DeviceView::Cuda(b.view()),
            DeviceBuffer::Host(b) => DeviceView::Host(b),
        }
    }

    /// The whole buffer, to write into.
    pub fn view_mut(&mut self) -> DeviceViewMut<'_> {
        match self {
            DeviceBuffer::Cuda(b) => DeviceViewMut::Cuda(b.view_mut()),
            DeviceBuffer::Host(b) => DeviceViewMut::Host(b),
        }
    }

    /// Copies `src` into the buffer at `offset` (done when it returns).
    pub fn copy_from_host(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        self.view_mut().copy_from_host(offset, src)
    }

    /// Copies `dst.len()` bytes at `offset` into `dst`.
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.view().copy_to_host(offset, dst)
    }

    /// The whole buffer as a `Vec` in host memory.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.len()];
        self.copy_to_host(0, &mut out)?;
        Ok(out)
    }

    /// Sets every byte to `value`.
    pub fn fill(&mut self, value: u8) -> Result<()> {
        self.view_mut().fill(value)
    }
}

impl From<CudaBuffer> for DeviceBuffer {
    fn from(buffer: CudaBuffer) -> Self {
        DeviceBuffer::Cuda(buffer)
    }
}

impl From<HostBuffer> for DeviceBuffer {
    fn from(buffer: HostBuffer) -> Self {
        DeviceBuffer::Host(buffer)
    }
}

/// Device memory to read from (a GPU's, or host memory standing in), borrowed for `'a`.
#[derive(Debug, Clone, Copy)]
pub enum DeviceView<'a> {
    /// GPU memory.
    Cuda(CudaView<'a>),
    /// Host memory.
    Host(&'a [u8]),
}

/// Device memory to write into (a GPU's, or host memory standing in), exclusively borrowed for
/// `'a`. Split it ([`split_at_mut`](Self::split_at_mut), [`chunks_mut`](Self::chunks_mut)) for
/// many disjoint destinations.
#[derive(Debug)]
pub enum DeviceViewMut<'a> {
    /// GPU memory.
    Cuda(CudaViewMut<'a>),
    /// Host memory.
    Host(&'a mut [u8]),
}

impl<'a> DeviceView<'a> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            DeviceView::Cuda(v) => v.len(),
            DeviceView::Host(b) => b.len(),
        }
    }

    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The GPU's ordinal; `None` for host memory.
    pub fn device_ordinal(&self) -> Option<usize> {
        match self {
            DeviceView::Cuda(v) => Some(v.device_ordinal()),
            DeviceView::Host(_) => None,
        }
    }

    /// The bytes in `range`, bounds-checked (an error, never a panic).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceView<'a>> {
        let (start, len) = resolve_range(range, self.len())?;
        Ok(match *self {
            DeviceView::Cuda(v) => DeviceView::Cuda(v.slice(start..start + len)?),
            DeviceView::Host(b) => DeviceView::Host(&b[start..start + len]),
        })
    }

    /// Copies `dst.len()` bytes at `offset` into `dst`.
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        match self {
            DeviceView::Cuda(v) => v.copy_to_host(offset, dst),
            DeviceView::Host(b) => {
                let (start, len) =
                    resolve_range(offset..offset.saturating_add(dst.len()), b.len())?;
                dst.copy_from_slice(&b[start..start + len]);
                Ok(())
            }
        }
    }
}

impl<'a> DeviceViewMut<'a> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            DeviceViewMut::Cuda(v) => v.len(),
            DeviceViewMut::Host(b) => b.len(),
        }
    }

    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The GPU's ordinal; `None` for host memory.
    pub fn device_ordinal(&self) -> Option<usize> {
        match self {
            DeviceViewMut::Cuda(v) => Some(v.device_ordinal()),
            DeviceViewMut::Host(_) => None,
        }
    }

    /// The same memory, to read from, while this view is borrowed.
    pub fn as_view(&self) -> DeviceView<'_> {
        match self {
            DeviceViewMut::Cuda(v) => DeviceView::Cuda(v.as_view()),
            DeviceViewMut::Host(b) => DeviceView::Host(b),
        }
    }

    /// A shorter-lived view of the same memory, leaving this one usable afterwards.
    pub fn reborrow(&mut self) -> DeviceViewMut<'_> {
        match self {
            DeviceViewMut::Cuda(v) => DeviceViewMut::Cuda(v.reborrow()),
            DeviceViewMut::Host(b) => DeviceViewMut::Host(b),
        }
    }

    /// The bytes in `range`, bounds-checked, consuming this view.
    pub fn into_slice(self, range: impl RangeBounds<usize>) -> Result<DeviceViewMut<'a>> {
        let (start, len) = resolve_range(range, self.len())?;
        Ok(match self {
            DeviceViewMut::Cuda(v) => DeviceViewMut::Cuda(v.into_slice(start..start + len)?),
            DeviceViewMut::Host(b) => DeviceViewMut::Host(&mut b[start..start + len]),
        })
    }

    /// Two disjoint views, `[0, mid)` and `[mid, len)`.
    pub fn split_at_mut(self, mid: usize) -> Result<(DeviceViewMut<'a>, DeviceViewMut<'a>)> {
        if mid > self.len() {
            return Err(Error::OutOfRange {
                offset: mid as u64,
                len: 0,
                file_len: self.len() as u64,
            });
        }
        Ok(match self {
            DeviceViewMut::Cuda(v) => {
                let (a, b) = v.split_at_mut(mid)?;
                (DeviceViewMut::Cuda(a), DeviceViewMut::Cuda(b))
            }
            DeviceViewMut::Host(b) => {
                let (a, b) = b.split_at_mut(mid);
                (DeviceViewMut::Host(a), DeviceViewMut::Host(b))
            }
        })
    }

    /// Disjoint views of `size` bytes each (the last one shorter where `size` does not divide
    /// the length). A zero `size` is an error.
    pub fn chunks_mut(self, size: usize) -> Result<Vec<DeviceViewMut<'a>>> {
        Ok(match self {
            DeviceViewMut::Cuda(v) => v.chunks_mut(size)?.map(DeviceViewMut::Cuda).collect(),
            DeviceViewMut::Host(_) if size == 0 => {
                return Err(Error::InvalidArgument("chunk size 0".to_owned()))
            }
            DeviceViewMut::Host(b) => b.chunks_mut(size).map(DeviceViewMut::Host).collect(),
        })
    }

    /// Disjoint views of the byte ranges `(offset, len)` of this view, in the order given: the
    /// destinations of a batch at arbitrary places in one buffer. Ranges that overlap or run
    /// past the end are an error naming them.
    pub fn carve(self, ranges: &[(usize, usize)]) -> Result<Vec<DeviceViewMut<'a>>> {
        let total = self.len();
        let mut order: Vec<usize> = (0..ranges.len()).collect();
        order.sort_by_key(|&i| ranges[i].0);
        let mut pieces: Vec<Option<DeviceViewMut<'a>>> = (0..ranges.len()).map(|_| None).collect();
        let mut rest = self;
        let mut consumed = 0usize;
        for i in order {
            let (offset, len) = ranges[i];
            match offset.checked_add(len) {
                Some(end) if end <= total => {}
                Some(end) => {
                    return Err(Error::InvalidArgument(format!(
                        "destination range {offset}..{end} runs past the end of the buffer of \
                         {total} bytes"
                    )))
                }
                None => {
                    return Err(Error::InvalidArgument(format!(
                        "destination range of {len} bytes at {offset} passes the largest address"
                    )))
                }
            }
            if offset < consumed {
                return Err(Error::InvalidArgument(format!(
                    "destination range {offset}..{} overlaps another one ending at {consumed}",
                    offset + len
                )));
            }
            let (_, tail) = rest.split_at_mut(offset - consumed)?;
            let (piece, tail) = tail.split_at_mut(len)?;
            pieces[i] = Some(piece);
            rest = tail;
            consumed = offset + len;
        }
        Ok(pieces.into_iter().flatten().collect())
    }

    /// Copies `src` to `offset` (done when it returns).
    pub fn copy_from_host(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        match self {
            DeviceViewMut::Cuda(v) => v.copy_from_host(offset, src),
            DeviceViewMut::Host(b) => {
                let (start, len) =
                    resolve_range(offset..offset.saturating_add(src.len()), b.len())?;
                b[start..start + len].copy_from_slice(src);
                Ok(())
            }
        }
    }

    /// Copies `dst.len()` bytes at `offset` into `dst`.
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.as_view().copy_to_host(offset, dst)
    }

    /// Sets every byte to `value`.
    pub fn fill(&mut self, value: u8) -> Result<()> {
        match self {
            DeviceViewMut::Cuda(v) => v.fill(value),
            DeviceViewMut::Host(b) => {
                b.fill(value);
                Ok(())
            }
        }
    }
}

impl<'a> From<CudaView<'a>> for DeviceView<'a> {
    fn from(view: CudaView<'a>) -> Self {
        DeviceView::Cuda(view)
    }
}

impl<'a> From<&'a [u8]> for DeviceView<'a> {
    fn from(bytes: &'a [u8]) -> Self {
        DeviceView::Host(bytes)
    }
}

impl<'a> From<&'a DeviceBuffer> for DeviceView<'a> {
    fn from(buffer: &'a DeviceBuffer) -> Self {
        buffer.view()
    }
}

impl<'a> From<&'a CudaBuffer> for DeviceView<'a> {
    fn from(buffer: &'a CudaBuffer) -> Self {
        DeviceView::Cuda(buffer.view())
    }
}

impl<'a> From<DeviceViewMut<'a>> for DeviceView<'a> {
    fn from(view: DeviceViewMut<'a>) -> Self {
        match view {
            DeviceViewMut::Cuda(v) => DeviceView::Cuda(v.into()),
            DeviceViewMut::Host(b) => DeviceView::Host(b),
        }
    }
}

impl<'a> From<CudaViewMut<'a>> for DeviceViewMut<'a> {
    fn from(view: CudaViewMut<'a>) -> Self {
        DeviceViewMut::Cuda(view)
    }
}

impl<'a> From<&'a mut [u8]> for DeviceViewMut<'a> {
    fn from(bytes: &'a mut [u8]) -> Self {
        DeviceViewMut::Host(bytes)
    }
}

impl<'a> From<&'a mut DeviceBuffer> for DeviceViewMut<'a> {
    fn from(buffer: &'a mut DeviceBuffer) -> Self {
        buffer.view_mut()
    }
}

impl<'a> From<&'a mut CudaBuffer> for DeviceViewMut<'a> {
    fn from(buffer: &'a mut CudaBuffer) -> Self {
        DeviceViewMut::Cuda(buffer.view_mut())
    }
}

/// Memory a transfer can run into in the background: owned (or borrowed for `'static`), so that
/// nothing else can reach it until the I/O layer's `IoFuture` hands it back. Implemented for
/// [`DeviceBuffer`], [`CudaBuffer`], [`HostBuffer`], `Vec<u8>`, `Box<[u8]>` and
/// `DeviceViewMut<'static>` (what `unsafe` raw views from other stacks become).
pub trait OwnedDeviceMemory: Send + 'static {
    /// The memory, to write into.
    fn device_view_mut(&mut self) -> DeviceViewMut<'_>;
}

/// Memory a transfer can run from in the background (see [`OwnedDeviceMemory`]).
pub trait OwnedDeviceSource: Send + 'static {
    /// The memory, to read from.
    fn device_view(&self) -> DeviceView<'_>;
}

impl OwnedDeviceMemory for DeviceBuffer {
    fn device_view_mut(&mut self) -> DeviceViewMut<'_> {
        self.view_mut()
    }
}

impl OwnedDeviceMemory for CudaBuffer {
    fn device_view_mut(&mut self) -> DeviceViewMut<'_> {
        DeviceViewMut::Cuda(self.view_mut())
    }
}

impl OwnedDeviceMemory for HostBuffer {
    fn device_view_mut(&mut self) -> DeviceViewMut<'_> {
        DeviceViewMut::Host(self)
    }
}

impl OwnedDeviceMemory for Vec<u8> {
    fn device_view_mut(&mut self) -> DeviceViewMut<'_> {
        DeviceViewMut::Host(self)
    }
}

impl OwnedDeviceMemory for Box<[u8]> {
    fn device_view_mut(&mut self) -> DeviceViewMut<'_> {
        DeviceViewMut::Host(self)
    }
}

impl OwnedDeviceMemory for DeviceViewMut<'static> {
    fn device_view_mut(&mut self) -> DeviceViewMut<'_> {
        self.reborrow()
    }
}

impl OwnedDeviceSource for DeviceBuffer {
    fn device_view(&self) -> DeviceView<'_> {
        self.view()
    }
}

impl OwnedDeviceSource for CudaBuffer {
    fn device_view(&self) -> DeviceView<'_> {
        DeviceView::Cuda(self.view())
    }
}

impl OwnedDeviceSource for HostBuffer {
    fn device_view(&self) -> DeviceView<'_> {
        DeviceView::Host(self)
    }
}

impl OwnedDeviceSource for Vec<u8> {
    fn device_view(&self) -> DeviceView<'_> {
        DeviceView::Host(self)
    }
}

impl OwnedDeviceSource for Box<[u8]> {
    fn device_view(&self) -> DeviceView<'_> {
        DeviceView::Host(self)
    }
}

impl OwnedDeviceSource for DeviceView<'static> {
    fn device_view(&self) -> DeviceView<'_> {
        *self
    }
}

impl OwnedDeviceSource for DeviceViewMut<'static> {
    fn device_view(&self) -> DeviceView<'_> {
        self.as_view()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carved_ranges_past_the_buffer_name_the_buffer() {
        let mut bytes = vec![0u8; 1000];
        let carve = |bytes: &mut [u8], ranges: &[(usize, usize)]| {
            DeviceViewMut::Host(bytes).carve(ranges).map(|v| v.len()).map_err(|e| e.to_string())
        };
        assert_eq!(carve(&mut bytes, &[(10, 5), (0, 10)]), Ok(2));
        let past = carve(&mut bytes, &[(0, 1010)]).unwrap_err();
        assert_eq!(
            past,
            "invalid argument: destination range 0..1010 runs past the end of the buffer of 1000 \
             bytes"
        );
        let far = carve(&mut bytes, &[(usize::MAX, 2)]).unwrap_err();
        assert!(far.contains("passes the largest address"), "{far}");
        let overlap = carve(&mut bytes, &[(0, 10), (5, 10)]).unwrap_err();
        assert!(overlap.contains("overlaps"), "{overlap}");
    }
}
