//! A checkpoint's tensors written one at a time, as the devices gather them,
//! and read back the same way.
//!
//! A checkpoint holds every parameter and both of Adam's slots as global
//! arrays: three times the model. Gathering them all first and then handing
//! safetensors one buffer per tensor held that much in f64 on device 0, plus
//! its bytes, plus the whole file read back and decoded to verify it: about
//! six times the model's f32 size beside the run (18 GiB for the full GPT-J's
//! 1 GiB of parameters, on a 23 GiB machine). Here safetensors' serializer
//! asks for each tensor's bytes when it reaches it (its `View` is lazy, as
//! for tensors on a GPU); device 0 gathers them in that order and hands each
//! over a channel of one, so at most a few tensors are held at once, and the
//! file's write overlaps the next gather. The read-back hashes the file a
//! piece at a time against the header safetensors parses.
//!
//! The order is the serializer's: by name, every tensor being of one dtype
//! ([`order`]); every device gathers in it, so the collectives stay in step
//! whatever device 0's writing does. A tensor that arrives out of order, or a
//! writer that stops early, fails the save: the file is never renamed into
//! place.

use super::{CheckpointError, Manifest, Res};
use safetensors::tensor::{Dtype, Metadata, View};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::OnceLock;

/// The order a checkpoint's tensors are made and written in: indices into
/// `manifest.tensors`, by name (the serializer's order for tensors of one
/// dtype). Every device calls it and gathers in this order.
pub fn order(manifest: &Manifest) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..manifest.tensors.len()).collect();
    idx.sort_by(|a, b| manifest.tensors[*a].name.cmp(&manifest.tensors[*b].name));
    idx
}

/// Where device 0 puts each tensor's values, in [`order`].
pub struct Sink {
    tx: Option<SyncSender<(usize, Vec<u8>)>>,
    f64: bool,
}

impl Sink {
    /// Tensor `k` of the manifest, converted to the file's dtype (`v as f32`
    /// from f64 for an f32 file, as before; an f32 through f64 is exact).
    pub fn put<T: candle_core::WithDType>(&mut self, k: usize, values: &[T]) {
        let bytes: Vec<u8> = if self.f64 {
            values
                .iter()
                .flat_map(|x| x.to_f64().to_le_bytes())
                .collect()
        } else {
            values
                .iter()
                .flat_map(|x| (x.to_f64() as f32).to_le_bytes())
                .collect()
        };
        // A writer that has stopped has said why; what follows is dropped.
        if let Some(tx) = &self.tx {
            if tx.send((k, bytes)).is_err() {
                self.tx = None;
            }
        }
    }
}

pub(super) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// One tensor of the file, whose bytes arrive when the serializer asks.
struct Pending<'a> {
    k: usize,
    shape: Vec<usize>,
    dtype: Dtype,
    len: usize,
    rx: &'a Receiver<(usize, Vec<u8>)>,
    wrong: &'a AtomicBool,
    /// Its checksum, taken by the writer (beside device 0's next gather).
    sha: &'a OnceLock<String>,
}

impl View for Pending<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        match self.rx.recv() {
            Ok((k, b)) if k == self.k && b.len() == self.len => {
                let _ = self.sha.set(hex(&Sha256::digest(&b)));
                Cow::Owned(b)
            }
            // Out of order, the wrong size, or no more coming: the save fails,
            // and the serializer finishes the file without writing the rest.
            _ => {
                self.wrong.store(true, Ordering::Relaxed);
                Cow::Borrowed(&[])
            }
        }
    }
    fn data_len(&self) -> usize {
        self.len
    }
}

/// Writes `file` from the tensors `fill` puts into its [`Sink`] in
/// [`order`]; returns their checksums (taken on the writer's thread, beside
/// the next gather), by manifest index. `Err(E)`: `fill`
/// failed (the file is unfinished); `Ok(Err(_))`: the file was not written.
pub fn stream<E>(
    file: &Path,
    manifest: &Manifest,
    f64: bool,
    meta: HashMap<String, String>,
    fill: impl FnOnce(&[usize], &mut Sink) -> Result<(), E>,
) -> Result<Res<Vec<String>>, E> {
    let werr = |e: &dyn std::fmt::Display| CheckpointError::Write {
        path: file.to_path_buf(),
        error: e.to_string(),
    };
    let (dtype, size) = if f64 {
        (Dtype::F64, 8)
    } else {
        (Dtype::F32, 4)
    };
    let order = order(manifest);
    let (tx, rx) = sync_channel::<(usize, Vec<u8>)>(1);
    let wrong = AtomicBool::new(false);
    let sums: Vec<OnceLock<String>> = manifest.tensors.iter().map(|_| OnceLock::new()).collect();
    let (filled, written) = std::thread::scope(|s| {
        let (ord, wrong, sums) = (&order, &wrong, &sums);
        // The receiver is the writer's: when it stops, early or not, a
        // tensor put after that is not waited for.
        let writer = s.spawn(move || {
            let rx = rx;
            let views: Vec<(String, Pending)> = ord
                .iter()
                .map(|&k| {
                    let t = &manifest.tensors[k];
                    let n: usize = t.shape.iter().product();
                    let view = Pending {
                        k,
                        shape: t.shape.clone(),
                        dtype,
                        len: n * size,
                        rx: &rx,
                        wrong,
                        sha: &sums[k],
                    };
                    (t.name.clone(), view)
                })
                .collect();
            safetensors::tensor::serialize_to_file(views, Some(meta), file)
        });
        // The sender lives in this scope: however `fill` ends (a panic
        // too), a writer still waiting then gets nothing more and stops.
        let mut sink = Sink { tx: Some(tx), f64 };
        let filled = fill(ord, &mut sink);
        drop(sink);
        (filled, writer.join())
    });
    filled?;
    let done = match written {
        Ok(Ok(())) if wrong.load(Ordering::Relaxed) => Err(werr(
            &"the tensors did not arrive in the order the file is written in",
        )),
        Ok(Ok(())) => Ok(sums
            .into_iter()
            .map(|s| s.into_inner().unwrap_or_default())
            .collect()),
        Ok(Err(e)) => Err(werr(&e)),
        Err(_) => Err(werr(&"the writer stopped")),
    };
    Ok(done)
}

/// Pieces of at most this many bytes are read back at a time.
const PIECE: usize = 8 << 20;
/// A header larger than this is not one shardc wrote.
const HEADER_CAP: u64 = 100 << 20;

/// Reads `file` back as [`stream`] wrote it: safetensors' own parse of the
/// header, the file's length, each listed tensor's shape and checksum (read a
/// piece at a time), and nothing unlisted.
pub fn verify(file: &Path, manifest: &Manifest) -> Res<()> {
    let io = |e: std::io::Error| CheckpointError::Io {
        path: file.to_path_buf(),
        error: e.to_string(),
    };
    let corrupt = |e: &dyn std::fmt::Display| CheckpointError::Corrupt {
        path: file.to_path_buf(),
        error: e.to_string(),
    };
    let mut f = std::fs::File::open(file).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    let mut n = [0u8; 8];
    f.read_exact(&mut n).map_err(io)?;
    let n = u64::from_le_bytes(n);
    if n > HEADER_CAP || n + 8 > len {
        return Err(corrupt(&format!("a header of {n} bytes")));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).map_err(io)?;
    let meta: Metadata = serde_json::from_slice(&header).map_err(|e| corrupt(&e))?;
    let infos = meta.tensors();
    let end = infos.values().map(|t| t.data_offsets.1).max().unwrap_or(0);
    if 8 + n + end as u64 != len {
        return Err(corrupt(&format!(
            "{len} bytes, where the header says {}",
            8 + n + end as u64
        )));
    }
    if let Some(name) = infos
        .keys()
        .find(|name| !manifest.tensors.iter().any(|t| t.name == **name))
    {
        return Err(CheckpointError::Unlisted {
            path: file.to_path_buf(),
            tensor: name.clone(),
        });
    }
    let mut buf = vec![0u8; PIECE];
    for t in &manifest.tensors {
        let Some(info) = infos.get(&t.name) else {
            return Err(CheckpointError::Missing {
                path: file.to_path_buf(),
                tensor: t.name.clone(),
            });
        };
        if info.shape != t.shape {
            return Err(CheckpointError::Shape {
                path: file.to_path_buf(),
                tensor: t.name.clone(),
                file: info.shape.clone(),
                manifest: t.shape.clone(),
            });
        }
        let (from, to) = info.data_offsets;
        f.seek(SeekFrom::Start(8 + n + from as u64)).map_err(io)?;
        let mut left = to - from;
        let mut h = Sha256::new();
        while left > 0 {
            let piece = &mut buf[..left.min(PIECE)];
            f.read_exact(piece).map_err(io)?;
            h.update(&*piece);
            left -= piece.len();
        }
        if hex(&h.finalize()) != t.sha256 {
            return Err(CheckpointError::Checksum {
                path: file.to_path_buf(),
                tensor: t.name.clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{load, save, Manifest, TensorInfo, FORMAT};
    use super::*;

    fn manifest(step: usize) -> Manifest {
        // Listed out of name order: the file is written by name.
        let t = |name: &str, shape: &[usize]| TensorInfo {
            name: name.into(),
            shape: shape.to_vec(),
            layout: String::new(),
            sha256: String::new(),
        };
        Manifest {
            format: FORMAT.into(),
            model: "M".into(),
            run: "r".into(),
            step,
            seed: 0,
            rng: String::new(),
            data_position: 0,
            mesh: vec![],
            dtype: "f32".into(),
            optimizer: "adam".into(),
            tensors: vec![
                t("param/w", &[2, 3]),
                t("opt_m/w", &[2, 3]),
                t("param/b", &[3]),
            ],
        }
    }

    fn values(k: usize, m: &Manifest) -> Vec<f64> {
        let n: usize = m.tensors[k].shape.iter().product();
        (0..n).map(|i| (k * 10 + i) as f64 + 0.25).collect()
    }

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("shardc-ckw-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn tensors_streamed_in_name_order_load_back_equal() {
        let (d, m) = (dir("ok"), manifest(3));
        let saved = save(&d, 1, &m, false, |order, sink| {
            assert_eq!(order, [1, 2, 0]);
            for &k in order {
                sink.put(k, &values(k, &m));
            }
            Ok::<(), ()>(())
        });
        let path = match saved {
            Ok(Ok(p)) => p,
            other => panic!("{other:?}"),
        };
        let (back, arrays) = load(&path).expect("load");
        for (k, t) in m.tensors.iter().enumerate() {
            let a = arrays.iter().find(|a| a.0 == t.name).expect("tensor");
            assert_eq!(a.2, values(k, &m), "{}", t.name);
            assert!(!back.tensors[k].sha256.is_empty());
        }
        // A flipped byte is found by the piecewise read-back.
        let file = path.join("tensors.safetensors");
        let mut bytes = std::fs::read(&file).expect("file");
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&file, bytes).expect("write");
        assert!(matches!(
            verify(&file, &back),
            Err(CheckpointError::Checksum { .. })
        ));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn out_of_order_or_failed_gathers_leave_nothing_behind() {
        let (d, m) = (dir("bad"), manifest(4));
        let saved = save(&d, 1, &m, false, |order, sink| {
            for &k in order.iter().rev() {
                sink.put(k, &values(k, &m));
            }
            Ok::<(), ()>(())
        });
        assert!(matches!(saved, Ok(Err(CheckpointError::Write { .. }))));
        let failed = save(&d, 1, &m, false, |order, sink| {
            sink.put(order[0], &values(order[0], &m));
            Err("the gather failed")
        });
        assert!(matches!(failed, Err("the gather failed")));
        let left: Vec<_> = std::fs::read_dir(&d).expect("dir").collect();
        assert!(left.is_empty(), "{left:?}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
