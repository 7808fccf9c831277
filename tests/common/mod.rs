//! Helpers the process-level tests share.

use std::path::{Path, PathBuf};

/// A fresh directory `shardc-{suite}-{name}-{pid}` under the system's temp dir.
pub fn temp(suite: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("shardc-{suite}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// The losses a run wrote with `--dump-losses`.
pub fn losses(path: &Path) -> Vec<f64> {
    let text = std::fs::read_to_string(path).expect("losses written");
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    v["losses"]
        .as_array()
        .expect("losses")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}
