//! What `/proc` says about this process and machine: effective capabilities, fields of
//! `/proc/self/status`, and the memory available.
#![forbid(unsafe_code)]

/// Whether bit `capability` is set in the process's effective capabilities (`CapEff` in
/// `/proc/self/status`); `false` where that cannot be read.
pub(super) fn has_capability(capability: u32) -> bool {
    proc_status_field("CapEff:")
        .and_then(|hex| u64::from_str_radix(&hex, 16).ok())
        .is_some_and(|caps| caps & (1 << capability) != 0)
}

/// The value of a `/proc/self/status` line (`"VmLck:"` gives `"0 kB"`), trimmed.
pub(super) fn proc_status_field(name: &str) -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|line| line.strip_prefix(name)).map(|v| v.trim().to_owned())
}

/// A `"123 kB"` value of `/proc/self/status` or `/proc/meminfo`, in bytes.
pub(super) fn kib_value(text: &str) -> Option<u64> {
    text.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?.checked_mul(1024)
}

/// `MemAvailable` and `MemTotal` of `/proc/meminfo`, in bytes.
pub(super) fn memory_available_and_total() -> Option<(u64, u64)> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field =
        |name: &str| meminfo.lines().find_map(|line| line.strip_prefix(name)).and_then(kib_value);
    Some((field("MemAvailable:")?, field("MemTotal:")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_values_parse() {
        assert_eq!(kib_value("  8 kB"), Some(8192));
        assert_eq!(kib_value("0 kB"), Some(0));
        assert_eq!(kib_value("8"), None);
        let (available, total) = memory_available_and_total().unwrap();
        assert!(available > 0 && available <= total);
        assert!(proc_status_field("VmLck:").and_then(|v| kib_value(&v)).is_some());
    }
}
