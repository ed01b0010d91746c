// Two writable views of the same memory cannot be alive at once.
use gpumap::memory::{Device, DeviceBuffer};

fn main() {
    let mut buffer = DeviceBuffer::zeroed(&Device::Host, 4096).unwrap();
    let a = buffer.view_mut();
    let b = buffer.view_mut();
    drop((a, b));
}
