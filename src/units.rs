//! Bytes and FLOPs as people read them (`1.5 MiB`, `92.92 GFLOP`): one format for
//! diagnostics, plans and run reports.

pub fn human_bytes(b: f64) -> String {
    const U: &[&str] = &["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"];
    let mut v = b;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

pub fn human_flops(f: f64) -> String {
    const U: &[&str] = &["", "K", "M", "G", "T", "P", "E"];
    let mut v = f;
    let mut i = 0;
    while v >= 1000.0 && i + 1 < U.len() {
        v /= 1000.0;
        i += 1;
    }
    format!("{v:.2} {}FLOP", U[i])
}
