//! TensorBoard event files: what TensorBoard, `tbparse`, W&B
//! (`wandb sync --sync-tensorboard`) and MLflow read. A run writes one file,
//! `events.out.tfevents.<unix time>.<host>.shardc`, in its run directory: the
//! run's configuration as text at step 0, then every step's scalars as the
//! step ends (flushed, so TensorBoard follows a run live). A resumed run
//! writes a new file holding the records up to its checkpoint and removes the
//! earlier `.shardc` files, so no step appears twice.
//!
//! The format is TensorFlow's record file of `Event` protocol buffers: each
//! record is its length (u64, little-endian), the masked CRC-32C of the
//! length, the bytes, and their masked CRC-32C. The messages are declared
//! here with `prost` (the fields of tensorflow/core/util/event.proto and
//! summary.proto that scalars and text use).

use super::report::Record;
use std::io::Write;
use std::path::{Path, PathBuf};

/// `tensorflow.Event`.
#[derive(Clone, PartialEq, prost::Message)]
struct Event {
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(string, optional, tag = "3")]
    file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    summary: Option<Summary>,
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<Value>,
}

/// `tensorflow.Summary.Value`: a scalar (`simple_value`) or a tensor with
/// the plugin that shows it (text).
#[derive(Clone, PartialEq, prost::Message)]
struct Value {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(float, optional, tag = "2")]
    simple_value: Option<f32>,
    #[prost(message, optional, tag = "8")]
    tensor: Option<TensorProto>,
    #[prost(message, optional, tag = "9")]
    metadata: Option<SummaryMetadata>,
}

/// `tensorflow.TensorProto`, as a string tensor.
#[derive(Clone, PartialEq, prost::Message)]
struct TensorProto {
    /// `DT_STRING` = 7.
    #[prost(int32, tag = "1")]
    dtype: i32,
    #[prost(message, optional, tag = "2")]
    tensor_shape: Option<TensorShape>,
    #[prost(bytes = "vec", repeated, tag = "8")]
    string_val: Vec<Vec<u8>>,
}

/// `tensorflow.TensorShapeProto` (a scalar: no dimensions).
#[derive(Clone, PartialEq, prost::Message)]
struct TensorShape {}

/// `tensorflow.SummaryMetadata`.
#[derive(Clone, PartialEq, prost::Message)]
struct SummaryMetadata {
    #[prost(message, optional, tag = "1")]
    plugin_data: Option<PluginData>,
}

/// `tensorflow.SummaryMetadata.PluginData`.
#[derive(Clone, PartialEq, prost::Message)]
struct PluginData {
    #[prost(string, tag = "1")]
    plugin_name: String,
    #[prost(bytes = "vec", tag = "2")]
    content: Vec<u8>,
}

/// What marks shardc's event files in a run directory.
const SUFFIX: &str = ".shardc";

/// TensorFlow's masked CRC-32C.
fn masked(bytes: &[u8]) -> u32 {
    let c = crc32c::crc32c(bytes);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Seconds since the Unix epoch.
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// An open event file.
pub struct Events {
    path: PathBuf,
    out: std::fs::File,
}

/// Why the event file could not be written: its path and the error.
#[derive(Debug)]
pub struct EventsError {
    pub path: PathBuf,
    pub error: std::io::Error,
}

impl std::fmt::Display for EventsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cannot write the TensorBoard log `{}`: {}",
            self.path.display(),
            self.error
        )
    }
}

impl std::error::Error for EventsError {}

impl Events {
    /// A new event file in `dir` (not following a link planted there), with
    /// the file version, `texts` (tag, markdown: the configuration, the plan)
    /// at step 0, and the `earlier` records of a resumed run; then the run's
    /// earlier event files go.
    pub fn create(
        dir: &Path,
        texts: &[(&str, String)],
        earlier: &[Record],
    ) -> Result<Events, EventsError> {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "localhost".into());
        let host: String = host
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
            .collect();
        let name = format!(
            "events.out.tfevents.{}.{host}.{}{SUFFIX}",
            now() as u64,
            std::process::id()
        );
        let path = dir.join(name);
        let err = |error| EventsError {
            path: path.clone(),
            error,
        };
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.custom_flags(libc::O_NOFOLLOW);
        }
        if std::env::var_os("SHARDC_FAULT_EVENTS_FAIL").is_some() {
            // Fault injection (tests/tensorboard.rs): a directory root can write
            // to, failing as a read-only one does for anyone else.
            return Err(err(std::io::Error::from(
                std::io::ErrorKind::PermissionDenied,
            )));
        }
        let out = opts.open(&path).map_err(err)?;
        let mut ev = Events {
            path: path.clone(),
            out,
        };
        let t = now();
        ev.event(&Event {
            wall_time: t,
            step: 0,
            file_version: Some("brain.Event:2".into()),
            summary: None,
        })
        .map_err(err)?;
        ev.event(&Event {
            wall_time: t,
            step: 0,
            file_version: None,
            summary: Some(Summary {
                value: texts.iter().map(|(tag, s)| text(tag, s)).collect(),
            }),
        })
        .map_err(err)?;
        for r in earlier {
            ev.record(r).map_err(err)?;
        }
        ev.out.flush().map_err(err)?;
        // The earlier files of this run directory: their steps are in this one.
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                let p = e.path();
                let ours = p
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("events.out.tfevents.") && n.ends_with(SUFFIX));
                if ours && p != path {
                    let _ = std::fs::remove_file(&p);
                }
            }
        }
        Ok(ev)
    }

    /// One step's scalars, flushed.
    pub fn record(&mut self, r: &Record) -> std::io::Result<()> {
        let mut value = vec![
            scalar("train/loss", r.loss),
            scalar("train/lr", r.lr),
            scalar("train/grad_norm", r.grad_norm),
            scalar("perf/step_ms", r.step_ms),
            scalar("perf/examples_per_s", r.examples_per_s),
        ];
        if let Some(e) = r.eval_loss {
            value.push(scalar("eval/loss", e));
        }
        for (name, v) in &r.metrics {
            match v {
                serde_json::Value::Array(xs) => {
                    for (i, x) in xs.iter().enumerate() {
                        if let Some(x) = x.as_f64() {
                            value.push(scalar(&format!("train/{name}/{i}"), x));
                        }
                    }
                }
                x => {
                    if let Some(x) = x.as_f64() {
                        value.push(scalar(&format!("train/{name}"), x));
                    }
                }
            }
        }
        self.event(&Event {
            wall_time: r.time.unwrap_or_else(now),
            step: r.step as i64,
            file_version: None,
            summary: Some(Summary { value }),
        })?;
        self.out.flush()
    }

    fn event(&mut self, e: &Event) -> std::io::Result<()> {
        use prost::Message;
        let data = e.encode_to_vec();
        let len = (data.len() as u64).to_le_bytes();
        let mut rec = Vec::with_capacity(data.len() + 16);
        rec.extend_from_slice(&len);
        rec.extend_from_slice(&masked(&len).to_le_bytes());
        rec.extend_from_slice(&data);
        rec.extend_from_slice(&masked(&data).to_le_bytes());
        self.out.write_all(&rec)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn scalar(tag: &str, v: f64) -> Value {
    Value {
        tag: tag.into(),
        simple_value: Some(v as f32),
        tensor: None,
        metadata: None,
    }
}

/// A text summary, as TensorBoard's text plugin reads it.
fn text(tag: &str, s: &str) -> Value {
    Value {
        tag: tag.into(),
        simple_value: None,
        tensor: Some(TensorProto {
            dtype: 7,
            tensor_shape: Some(TensorShape {}),
            string_val: vec![s.as_bytes().to_vec()],
        }),
        metadata: Some(SummaryMetadata {
            plugin_data: Some(PluginData {
                plugin_name: "text".into(),
                content: vec![],
            }),
        }),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn masked_crc_matches_tensorflow() {
        // TensorFlow's crc32c_test: the CRC-32C of "a" is 0xc1d04330; masked
        // is rotate-right 15 plus 0xa282ead8.
        assert_eq!(crc32c::crc32c(b"a"), 0xc1d0_4330);
        assert_eq!(
            super::masked(b"a"),
            0xc1d0_4330u32.rotate_right(15).wrapping_add(0xa282_ead8)
        );
    }
}
