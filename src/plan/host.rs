//! What the shardc process itself holds beside the devices' tensors: the code
//! and read-only data mapped from its binary and shared libraries. A run of a
//! small model is mostly this, so the plan for the process counts it.
//!
//! Read from `/proc/self/maps` of the process that plans, which runs the same
//! binary as the run it plans. Pages are resident only once touched, so the
//! mapped size is an upper bound on what they add to the resident set. A run
//! sets its peak resident set (`/proc/self/status`) beside it (`--mem`).

/// Bytes of read-only, file-backed mappings (code, read-only data) of this
/// process; `None` where `/proc/self/maps` cannot be read (not Linux).
pub fn shardc_code() -> Option<f64> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    Some(maps.lines().filter_map(read_only_file_bytes).sum())
}

/// The most bytes this process has held resident so far (`VmHWM`); `None`
/// where `/proc/self/status` cannot be read.
pub fn peak_resident() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    kib_field(&status, "VmHWM:").map(|k| k * 1024.0)
}

/// A `/proc/<pid>/status` field given in kB (`VmHWM:    7757324 kB`).
fn kib_field(status: &str, key: &str) -> Option<f64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

/// The size of one `/proc/<pid>/maps` line's mapping when it is backed by a
/// file and not writable (`start-end perms offset dev inode path`).
fn read_only_file_bytes(line: &str) -> Option<f64> {
    let mut f = line.split_whitespace();
    let (range, perms) = (f.next()?, f.next()?);
    let path = f.nth(3)?;
    if !path.starts_with('/') || perms.as_bytes().get(1) != Some(&b'-') {
        return None;
    }
    let (a, b) = range.split_once('-')?;
    let (a, b) = (
        u64::from_str_radix(a, 16).ok()?,
        u64::from_str_radix(b, 16).ok()?,
    );
    Some(b.saturating_sub(a) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_read_only_file_mappings_only() {
        let line = |s: &str| read_only_file_bytes(s);
        assert_eq!(
            line("55f2fc799000-55f2fd0dd000 r-xp 00311000 103:02 123 /usr/bin/shardc"),
            Some((0x55f2fd0dd000u64 - 0x55f2fc799000) as f64)
        );
        assert_eq!(
            line("7fa4-7fa5 rw-p 00000000 103:02 12 /usr/lib/libc.so.6"),
            None
        );
        assert_eq!(line("7ffe-7fff rw-p 00000000 00:00 0 [stack]"), None);
        assert_eq!(line("7ffe-7fff r-xp 00000000 00:00 0 [vdso]"), None);
        assert_eq!(line("7ffe-7fff ---p 00000000 00:00 0"), None);
        // This process maps its own code.
        assert!(shardc_code().is_some_and(|b| b > 0.0) || !cfg!(target_os = "linux"));
    }

    #[test]
    fn reads_the_peak_resident_set() {
        let status = "Name:\tshardc\nVmPeak:\t  100 kB\nVmHWM:\t    7757324 kB\nVmRSS:\t 12 kB\n";
        assert_eq!(kib_field(status, "VmHWM:"), Some(7757324.0));
        assert_eq!(kib_field(status, "VmSwap:"), None);
        assert_eq!(kib_field("VmHWM:\tlots kB\n", "VmHWM:"), None);
        assert!(peak_resident().is_some_and(|b| b > 0.0) || !cfg!(target_os = "linux"));
    }
}
