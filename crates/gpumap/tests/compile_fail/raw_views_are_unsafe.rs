// Raw device addresses enter only through an `unsafe` constructor with a documented contract.
use gpumap::memory::cuda::CudaViewMut;

fn main() {
    let _ = CudaViewMut::from_raw(0x7000_0000, 4096);
}
