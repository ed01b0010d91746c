// A read view of a mapped file has no way to write: writes take `view_mut`.
use gpumap::mapped::DeviceMappedFile;

fn main() {
    let map = DeviceMappedFile::open("table.bin").unwrap();
    let view = map.view(0, 4096).unwrap();
    view.copy_from_host(0, b"no").unwrap();
}
