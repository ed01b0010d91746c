// The same for GPU memory: a CudaView cannot outlive its CudaBuffer (the hole the old
// `DeviceRegion` had: `fh.read_device(buf.region(), 0)` compiled after `buf` was dropped).
use gpumap::io::FileHandle;
use gpumap::memory::cuda::{CudaBuffer, CudaDevice};

fn main() {
    let fh = FileHandle::open("data.bin", "r").unwrap();
    let device = CudaDevice::new(0).unwrap();
    let mut buffer = CudaBuffer::alloc(&device, 4096).unwrap();
    let view = buffer.view_mut();
    drop(buffer);
    fh.read_device(view, 0).unwrap();
}
