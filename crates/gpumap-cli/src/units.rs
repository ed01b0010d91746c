//! Sizes and rates as the command reads and prints them: size options with `dd` suffixes, rates
//! in GB/s, byte counts in binary units.

use gpumap::config::parse_size;

/// A byte count with `dd` suffixes (`4096`, `4K`, `4KiB`, `4KB`, `1GiB`; see
/// [`gpumap::config::parse_size`]), for every size option of every command.
pub(crate) fn size_arg(text: &str) -> std::result::Result<u64, String> {
    parse_size(text)
}

/// A rate in GB/s (10^9 bytes a second), the unit of every rate gpumap prints: results,
/// progress bars, bench tables.
pub(crate) fn rate_text(bytes_per_second: f64) -> String {
    format!("{:.2} GB/s", bytes_per_second / 1e9)
}

/// `4 MiB`, `1 GiB`, or bytes where no binary unit divides evenly.
pub(crate) fn human(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] =
        [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in UNITS {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{} {unit}", bytes / size);
        }
    }
    format!("{bytes} B")
}
