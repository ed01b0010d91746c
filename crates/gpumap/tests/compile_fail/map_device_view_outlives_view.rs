// The device memory of a map view is pinned only while the view lives: the device view
// borrows it.
use gpumap::mapped::DeviceMappedFile;

fn main() {
    let map = DeviceMappedFile::open("table.bin").unwrap();
    let device = {
        let view = map.view(0, 4096).unwrap();
        view.device()
    };
    println!("{:?}", device.map(|d| d.ptr()));
}
