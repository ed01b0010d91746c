//! What kind of memory an address is ([`classify_pointer`]), which GPU holds it
//! ([`device_ordinal_of`]), and the driver's check that a range is device memory inside one
//! allocation.
#![forbid(unsafe_code)]

use super::region::RawRegion;
use crate::error::{Error, Result};
use crate::sys::cuda as sys;

/// Validates, through `cuPointerGetAttributes`, that `[ptr, ptr + len)` is device (or managed)
/// memory inside one allocation. A host pointer is `InvalidArgument`, a range past the
/// allocation's end `BufferTooSmall`, an unknown (e.g. freed) address `InvalidArgument`; without
/// CUDA, `Unavailable`.
pub(crate) fn validate_device_range(ptr: u64, len: usize) -> Result<RawRegion> {
    let attrs = sys::pointer_attributes(ptr)?;
    match attrs.memory_type {
        sys::MEMORYTYPE_DEVICE | sys::MEMORYTYPE_UNIFIED => {}
        sys::MEMORYTYPE_HOST => {
            return Err(Error::InvalidArgument(format!(
                "{ptr:#x} is pinned host memory, not device memory"
            )))
        }
        0 => {
            return Err(Error::InvalidArgument(format!(
                "{ptr:#x} is not memory CUDA knows (pageable host memory, or freed)"
            )))
        }
        other => {
            return Err(Error::InvalidArgument(format!(
                "{ptr:#x} has CUDA memory type {other}, not device memory"
            )))
        }
    }
    let ordinal = usize::try_from(attrs.device_ordinal)
        .map_err(|_| Error::InvalidArgument(format!("{ptr:#x} reports no device ordinal")))?;
    let (base, size) = if attrs.range_size > 0 {
        (attrs.range_start, attrs.range_size)
    } else {
        let (base, size) = sys::mem_get_address_range(ptr, attrs.context)?;
        (base, size as u64)
    };
    let end_of_allocation = base.saturating_add(size);
    let available = end_of_allocation.saturating_sub(ptr);
    if ptr < base || (len as u64) > available {
        return Err(Error::BufferTooSmall { needed: len as u64, available });
    }
    Ok(RawRegion { ptr, len, ordinal })
}

/// The GPU holding the device (or managed) memory at `ptr`, through `cuPointerGetAttributes`:
/// which device's context work on another stack's memory belongs in. Nothing is read or
/// written. Errors as [`CudaView::from_raw`](super::CudaView::from_raw) gives them for one
/// byte at `ptr`: a host or unknown (e.g. freed) address is `InvalidArgument`; without CUDA,
/// `Unavailable`.
#[doc(alias = "cuPointerGetAttributes")]
pub fn device_ordinal_of(ptr: u64) -> Result<usize> {
    validate_device_range(ptr, 1).map(|region| region.ordinal)
}

/// What kind of memory an address points to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum PointerKind {
    /// Device memory (`cuMemAlloc` and friends).
    Device {
        /// The device it lives on.
        ordinal: usize,
    },
    /// Page-locked host memory known to CUDA (`cuMemHostAlloc`, `cuMemHostRegister`).
    PinnedHost,
    /// Managed (unified) memory, accessible from host and device.
    Managed,
    /// Ordinary host memory, or anything CUDA does not know (including freed device memory).
    PageableHost,
}

/// Classifies `addr` through `cuPointerGetAttributes`. Without CUDA, or if the query fails,
/// the answer is [`PointerKind::PageableHost`]: the host path is always the safe fallback.
#[doc(alias = "cuPointerGetAttributes")]
pub fn classify_pointer(addr: usize) -> PointerKind {
    let Ok(attrs) = sys::pointer_attributes(addr as u64) else {
        return PointerKind::PageableHost;
    };
    if attrs.is_managed {
        return PointerKind::Managed;
    }
    match attrs.memory_type {
        sys::MEMORYTYPE_DEVICE => match usize::try_from(attrs.device_ordinal) {
            Ok(ordinal) => PointerKind::Device { ordinal },
            Err(_) => PointerKind::PageableHost,
        },
        sys::MEMORYTYPE_UNIFIED => PointerKind::Managed,
        sys::MEMORYTYPE_HOST => PointerKind::PinnedHost,
        _ => PointerKind::PageableHost,
    }
}
