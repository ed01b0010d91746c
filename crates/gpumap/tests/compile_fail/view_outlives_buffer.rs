// A view borrows its buffer: it cannot be used after the buffer is dropped.
use gpumap::memory::{Device, DeviceBuffer};

fn main() {
    let view = {
        let mut buffer = DeviceBuffer::zeroed(&Device::Host, 4096).unwrap();
        buffer.view_mut()
    };
    let _ = view.len();
}
