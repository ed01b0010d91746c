//! Virtual memory management: address ranges reserved up front, physical frames mapped into
//! them (a cache's memory).
#![deny(unsafe_op_in_unsafe_fn)]

use std::ffi::c_int;

use cudarc::driver::sys as cu;

use super::driver::{api, check, release_failed, CUDA_SUCCESS};
use crate::error::{Error, Result};

/// Physical memory on device `ordinal`, pinned (not migratable), no shareable handle.
fn allocation_prop(ordinal: c_int) -> cu::CUmemAllocationProp {
    cu::CUmemAllocationProp {
        type_: cu::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: cu::CUmemLocation {
            type_: cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: ordinal,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: cu::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// The unit of physical device memory for virtual memory management on device `ordinal`
/// (`cuMemGetAllocationGranularity`, minimum granularity; 2 MiB on current GPUs).
pub(crate) fn allocation_granularity(ordinal: usize) -> Result<usize> {
    let prop = allocation_prop(ordinal as c_int);
    let mut granularity = 0usize;
    // SAFETY: both pointers are valid for the call; option 0 = CU_MEM_ALLOC_GRANULARITY_MINIMUM.
    check("cuMemGetAllocationGranularity", unsafe {
        (api()?.cuMemGetAllocationGranularity)(&mut granularity, &prop, 0)
    })?;
    Ok(granularity)
}

/// A range of device virtual addresses (`cuMemAddressReserve`) with no memory behind it until
/// [`PhysicalFrame`]s are mapped into it; released on drop (`cuMemAddressFree`). Everything
/// mapped must be unmapped first: the owner does that before dropping it.
pub(crate) struct AddressReservation {
    base: cu::CUdeviceptr,
    len: usize,
}

impl AddressReservation {
    /// Reserves `len` bytes (a multiple of the allocation granularity) aligned to `alignment`;
    /// the caller has bound a context.
    pub(crate) fn new(len: usize, alignment: usize) -> Result<Self> {
        let mut base: cu::CUdeviceptr = 0;
        // SAFETY: `base` is a valid out-pointer; no fixed address is requested.
        check("cuMemAddressReserve", unsafe {
            (api()?.cuMemAddressReserve)(&mut base, len, alignment, 0, 0)
        })?;
        Ok(Self { base, len })
    }

    /// The first address.
    pub(crate) fn base(&self) -> u64 {
        self.base
    }

    /// Maps all of `frame` at `offset` into the reservation and makes it readable and writable
    /// from device `ordinal` (`cuMemMap` + `cuMemSetAccess`).
    pub(crate) fn map(&self, offset: usize, frame: &PhysicalFrame, ordinal: usize) -> Result<()> {
        self.check_inside(offset, frame.len)?;
        let api = api()?;
        let at = self.base + offset as u64;
        // SAFETY: `[at, at + frame.len)` lies inside our reservation (checked above); the
        // handle is live; the driver refuses a range that is already mapped.
        check("cuMemMap", unsafe { (api.cuMemMap)(at, frame.len, 0, frame.handle, 0) })?;
        let access = cu::CUmemAccessDesc {
            location: cu::CUmemLocation {
                type_: cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: ordinal as c_int,
            },
            flags: cu::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range was just mapped; `access` is one valid descriptor.
        let rc = unsafe { (api.cuMemSetAccess)(at, frame.len, &access, 1) };
        if rc != CUDA_SUCCESS {
            // SAFETY: undoes the map above; nothing can have used the inaccessible range.
            unsafe { (api.cuMemUnmap)(at, frame.len) };
            return check("cuMemSetAccess", rc);
        }
        Ok(())
    }

    /// Unmaps `len` bytes at `offset` (`cuMemUnmap`). The caller guarantees that no copy or
    /// kernel still uses the range.
    pub(crate) fn unmap(&self, offset: usize, len: usize) -> Result<()> {
        self.check_inside(offset, len)?;
        // SAFETY: the range lies inside our reservation; the caller guarantees it is idle.
        check("cuMemUnmap", unsafe { (api()?.cuMemUnmap)(self.base + offset as u64, len) })
    }

    fn check_inside(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::OutOfRange {
                offset: offset as u64,
                len: len as u64,
                file_len: self.len as u64,
            }),
        }
    }
}

impl Drop for AddressReservation {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: freed exactly once; the owner unmapped every frame before dropping it.
            let rc = unsafe { (api.cuMemAddressFree)(self.base, self.len) };
            if rc != CUDA_SUCCESS {
                release_failed(api, "cuMemAddressFree", rc);
            }
        }
    }
}

/// Physical device memory (`cuMemCreate`) to map into an [`AddressReservation`]; released on
/// drop (`cuMemRelease`; the driver keeps it alive while it is still mapped somewhere).
pub(crate) struct PhysicalFrame {
    handle: cu::CUmemGenericAllocationHandle,
    len: usize,
}

impl PhysicalFrame {
    /// `len` bytes (a multiple of the allocation granularity) on device `ordinal`.
    pub(crate) fn new(ordinal: usize, len: usize) -> Result<Self> {
        let prop = allocation_prop(ordinal as c_int);
        let mut handle: cu::CUmemGenericAllocationHandle = 0;
        // SAFETY: `handle` and `prop` are valid for the call; flags must be 0.
        check("cuMemCreate", unsafe { (api()?.cuMemCreate)(&mut handle, len, &prop, 0) })?;
        Ok(Self { handle, len })
    }
}

impl Drop for PhysicalFrame {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: released exactly once.
            let rc = unsafe { (api.cuMemRelease)(self.handle) };
            if rc != CUDA_SUCCESS {
                release_failed(api, "cuMemRelease", rc);
            }
        }
    }
}
