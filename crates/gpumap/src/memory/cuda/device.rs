//! [`CudaDevice`]: one GPU and its retained primary context, one instance per ordinal for the
//! life of the process.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

use crate::sync::Mutex;

use crate::error::Result;
use crate::sys::cuda as sys;

/// How many ordinals [`CudaDevice::new`] finds without taking its lock; devices past them (a
/// machine with more GPUs than this) are found under it.
const LOCK_FREE_ORDINALS: usize = 64;

/// The devices made so far, by ordinal, for [`CudaDevice::new`]'s lock-free lookups.
static KNOWN: [OnceLock<CudaDevice>; LOCK_FREE_ORDINALS] =
    [const { OnceLock::new() }; LOCK_FREE_ORDINALS];

/// One CUDA device with its retained primary context. Cheap to clone; one instance per ordinal
/// is kept for the life of the process, so the context (and every allocation in it) is never
/// torn down under a user.
#[derive(Clone)]
pub struct CudaDevice {
    inner: Arc<DeviceInner>,
}

struct DeviceInner {
    ordinal: usize,
    context: sys::PrimaryContext,
    name: String,
    total_memory: usize,
    pci_bus_id: String,
}

impl fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.inner.ordinal)
            .field("name", &self.inner.name)
            .field("total_memory", &self.inner.total_memory)
            .field("pci_bus_id", &self.inner.pci_bus_id)
            .finish()
    }
}

impl CudaDevice {
    /// The device with this ordinal (`cuDeviceGet` + `cuDevicePrimaryCtxRetain`), its context
    /// bound to the calling thread. `Unavailable` when there is no driver or no such device.
    #[doc(alias = "cuDevicePrimaryCtxRetain")]
    pub fn new(ordinal: usize) -> Result<Self> {
        // Every transfer looks its device up, often from many threads at once: the devices of
        // the first ordinals are read without a lock once made.
        if let Some(device) = KNOWN.get(ordinal).and_then(OnceLock::get) {
            return Ok(device.clone());
        }
        static DEVICES: OnceLock<Mutex<HashMap<usize, CudaDevice>>> = OnceLock::new();
        let devices = DEVICES.get_or_init(|| Mutex::new(HashMap::new()));
        let mut devices = devices.lock();
        if let Some(d) = devices.get(&ordinal) {
            return Ok(d.clone());
        }
        let dev = sys::device_get(ordinal)?;
        let context = sys::PrimaryContext::retain(dev)?;
        context.bind_to_thread()?;
        let device = CudaDevice {
            inner: Arc::new(DeviceInner {
                ordinal,
                name: sys::device_name(dev)?,
                total_memory: sys::device_total_mem(dev)?,
                pci_bus_id: sys::device_pci_bus_id(dev).unwrap_or_default(),
                context,
            }),
        };
        devices.insert(ordinal, device.clone());
        if let Some(slot) = KNOWN.get(ordinal) {
            // Under the lock, so the slot is set once, with the device the map holds.
            let _ = slot.set(device.clone());
        }
        Ok(device)
    }

    /// Number of CUDA devices (`cuDeviceGetCount`); `Unavailable` when there is no driver.
    #[doc(alias = "cuDeviceGetCount")]
    pub fn count() -> Result<usize> {
        Ok(sys::driver()?.device_count)
    }

    /// The CUDA driver version (`cuDriverGetVersion`, e.g. 13000 for 13.0).
    #[doc(alias = "cuDriverGetVersion")]
    pub fn driver_version() -> Result<i32> {
        Ok(sys::driver()?.version)
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.ordinal
    }

    /// The device name (`cuDeviceGetName`), e.g. `"NVIDIA H100 PCIe"`.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Total device memory in bytes (`cuDeviceTotalMem`).
    pub fn total_memory(&self) -> usize {
        self.inner.total_memory
    }

    /// PCI bus id (`cuDeviceGetPCIBusId`), empty if the driver did not report one.
    pub fn pci_bus_id(&self) -> &str {
        &self.inner.pci_bus_id
    }

    /// Makes this device's primary context current on the calling thread (`cuCtxSetCurrent`).
    /// Cheap when it already is: call it at the top of every task that touches the device.
    #[doc(alias = "cuCtxSetCurrent")]
    pub fn bind_to_thread(&self) -> Result<()> {
        self.inner.context.bind_to_thread()
    }

    pub(crate) fn context(&self) -> &sys::PrimaryContext {
        &self.inner.context
    }
}
