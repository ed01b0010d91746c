//! How settings' texts are read: sizes with suffixes, switches, thread counts.

/// The most threads an I/O pool may have. Each thread of the POSIX path to device memory
/// keeps two pinned bounce buffers (4 MiB each by default), so 1024 threads already pin 8 GiB.
pub const MAX_THREADS: usize = 1024;

/// Checks a thread count: an error outside `1..=`[`MAX_THREADS`]; a warning (`Ok(Some(..))`)
/// above four threads per CPU, where threads contend for cores and each still holds its
/// buffers; `Ok(None)` otherwise.
pub fn check_nthreads(n: usize) -> std::result::Result<Option<String>, String> {
    if n == 0 || n > MAX_THREADS {
        return Err(format!("expected a thread count from 1 to {MAX_THREADS}"));
    }
    let cpus = crate::tuning_facts::cpus();
    Ok((n > 4 * cpus).then(|| {
        format!(
            "{n} threads for {cpus} CPUs: more than four a CPU rarely helps, and each thread of \
             the device path pins its own bounce buffers"
        )
    }))
}

/// Parses a count (of threads): decimal digits only, as `--threads` takes it. Not a size:
/// with `dd` suffixes `1K` would be 1024 threads and `8B` eight.
pub(crate) fn parse_count(text: &str) -> std::result::Result<usize, String> {
    let digits = text.trim();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("expected a whole number of threads from 1 to {MAX_THREADS}"));
    }
    Ok(digits.parse().unwrap_or(usize::MAX)) // only too many digits fail: check_nthreads refuses
}

/// Parses a byte count the way `dd` reads one: decimal digits, then an optional suffix.
///
/// | suffix | multiplier |
/// |---|---|
/// | none, `B` | 1 |
/// | `K`, `KiB` | 1024 |
/// | `KB` | 1000 |
/// | `M`, `MiB` / `MB` | 1024² / 1000² |
/// | `G`, `T`, `P`, `E` (with `iB` or `B`) | likewise |
///
/// Suffixes are case-insensitive (`4k`, `4kib` and `4KiB` are all 4096; `4mb` and `4MB` are
/// both 4,000,000); a space between number and suffix is allowed. Unlike `dd`, a lone `B`
/// means bytes, not 512-byte blocks. Signs, fractions and results above `u64::MAX` are
/// rejected.
pub fn parse_size(text: &str) -> std::result::Result<u64, String> {
    let text = text.trim();
    let digits_end = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, suffix) = text.split_at(digits_end);
    if digits.is_empty() {
        return Err(
            "expected a non-negative whole number, optionally with a suffix such as 4MiB".into()
        );
    }
    let number: u64 = digits.parse().map_err(|_| "number too large".to_string())?;
    let multiplier = size_multiplier(suffix.trim())?;
    number.checked_mul(multiplier).ok_or_else(|| "size too large (above 2^64 - 1 bytes)".into())
}

/// The multiplier of a size suffix (see [`parse_size`]).
fn size_multiplier(suffix: &str) -> std::result::Result<u64, String> {
    let unknown = || {
        format!(
            "unknown size suffix {suffix:?}: use K, M, G, T, P or E for powers of 1024 (KiB, \
             MiB, ... alike) and KB, MB, ... for powers of 1000, in any case"
        )
    };
    let lower = suffix.to_ascii_lowercase();
    let mut chars = lower.chars();
    let power = match chars.next() {
        None | Some('b') if lower.len() <= 1 => return Ok(1),
        Some('k') => 1,
        Some('m') => 2,
        Some('g') => 3,
        Some('t') => 4,
        Some('p') => 5,
        Some('e') => 6,
        _ => return Err(unknown()),
    };
    let base: u64 = match chars.as_str() {
        "" | "ib" => 1024,
        "b" => 1000,
        _ => return Err(unknown()),
    };
    Ok(base.pow(power))
}

/// Parses a boolean the way KvikIO does: `true/false`, `on/off`, `yes/no`, `1/0`, any case.
pub fn parse_bool(text: &str) -> std::result::Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "on" | "yes" | "1" => Ok(true),
        "false" | "off" | "no" | "0" => Ok(false),
        _ => Err("expected true/false, on/off, yes/no or 1/0".into()),
    }
}
