//! CUDA virtual memory management: [`VaRange`], reserved device addresses, and [`PhysFrame`],
//! physical memory mapped into them.
#![forbid(unsafe_code)]

use super::device::CudaDevice;
use super::region::RawRegion;
use crate::error::Result;
use crate::sys::cuda as sys;

/// Physical device memory (`cuMemCreate`) of one frame, to map into [`VaRange`]s; released when
/// dropped (the driver keeps it until it is unmapped everywhere).
pub(crate) struct PhysFrame {
    frame: sys::PhysicalFrame,
}

impl PhysFrame {
    /// `len` bytes (a multiple of the allocation granularity) on `device`.
    #[doc(alias = "cuMemCreate")]
    pub(crate) fn new(device: &CudaDevice, len: usize) -> Result<Self> {
        device.bind_to_thread()?;
        Ok(Self { frame: sys::PhysicalFrame::new(device.ordinal(), len)? })
    }
}

/// A range of device addresses (`cuMemAddressReserve`) into which [`PhysFrame`]s are mapped and
/// unmapped (CUDA virtual memory management): the whole range is reserved up front, so addresses
/// never move while memory comes and goes behind them. Whoever maps frames unmaps them before
/// dropping the range.
pub(crate) struct VaRange {
    device: CudaDevice,
    reservation: sys::AddressReservation,
}

impl VaRange {
    /// The allocation granularity of `device` (`cuMemGetAllocationGranularity`, 2 MiB on
    /// current GPUs): the unit of physical memory.
    #[doc(alias = "cuMemGetAllocationGranularity")]
    pub(crate) fn granularity(device: &CudaDevice) -> Result<usize> {
        device.bind_to_thread()?;
        sys::allocation_granularity(device.ordinal())
    }

    /// Reserves `len` bytes (a multiple of the granularity) aligned to `alignment`.
    #[doc(alias = "cuMemAddressReserve")]
    pub(crate) fn reserve(device: &CudaDevice, len: usize, alignment: usize) -> Result<Self> {
        device.bind_to_thread()?;
        Ok(Self {
            device: device.clone(),
            reservation: sys::AddressReservation::new(len, alignment)?,
        })
    }

    /// The first address.
    pub(crate) fn base(&self) -> u64 {
        self.reservation.base()
    }

    /// Maps `frame` at `offset` (`cuMemMap` + `cuMemSetAccess`).
    #[doc(alias = "cuMemMap")]
    pub(crate) fn map(&self, offset: usize, frame: &PhysFrame) -> Result<()> {
        self.device.bind_to_thread()?;
        self.reservation.map(offset, &frame.frame, self.device.ordinal())
    }

    /// Unmaps `len` bytes at `offset` (`cuMemUnmap`). The caller guarantees nothing uses them.
    #[doc(alias = "cuMemUnmap")]
    pub(crate) fn unmap(&self, offset: usize, len: usize) -> Result<()> {
        self.device.bind_to_thread()?;
        self.reservation.unmap(offset, len)
    }

    /// `[offset, offset + len)` of the range as a region (the caller keeps it mapped).
    pub(crate) fn region(&self, offset: u64, len: usize) -> RawRegion {
        RawRegion { ptr: self.base() + offset, len, ordinal: self.device.ordinal() }
    }
}
