//! Fuzzing the array readers (and the FDO loader on top of them): random bytes,
//! `.npy` files with generated headers (shapes up to 2^64, real and bogus dtypes,
//! every format version, data of the wrong length) and byte-level mutations of
//! them, and mutated `.npz` and safetensors files, each written to a file and read
//! through the public readers. No case may panic, and each must finish within a
//! 10 s hang guard; files with consistent headers must read back exactly.
//!
//! `cargo test` runs 256 cases per target; a long campaign sets the count:
//! `SHARDC_FUZZ_CASES=100000 cargo test --release --test fuzz_arrays`
//! (`scripts/fuzz.sh` runs that for every fuzz target).

use proptest::prelude::*;
use shardc::arrays;
use shardc::files::DATA_CAP;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn cases() -> u32 {
    std::env::var("SHARDC_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A directory of this target's own (targets run in parallel).
fn dir(target: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "shardc-fuzz-arrays-{target}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// Equal arrays, NaN included (random bytes decode to NaNs).
fn same(a: &[arrays::Array], b: &[arrays::Array]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            (&x.name, &x.shape, x.int, x.dtype) == (&y.name, &y.shape, y.int, y.dtype)
                && x.values.len() == y.values.len()
                && x.values
                    .iter()
                    .zip(y.values.iter())
                    .all(|(u, v)| u.to_bits() == v.to_bits())
        })
}

/// Read `path` through every public reader on its own thread: a panic or no
/// answer within 10 s fails the case. Returns whether the readers accepted it.
fn read_guarded(path: &Path) -> Result<Option<Vec<arrays::Array>>, TestCaseError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.to_path_buf();
    std::thread::spawn(move || {
        let direct = arrays::read_file(&p, DATA_CAP);
        let through = arrays::read(&shardc::files::Disk, &p);
        // Both paths agree; every error names its file and says something.
        let agree = match (&direct, &through) {
            (Ok(a), Ok(b)) => same(a, b),
            (Err(e), Err(r)) => {
                e.to_string().contains(&format!("`{}`", p.display())) && !r.is_empty()
            }
            _ => false,
        };
        let _ = tx.send((direct.ok(), agree));
    });
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok((arrays, true)) => Ok(arrays),
        Ok((_, false)) => Err(TestCaseError::fail(format!(
            "{}: the readers disagree, or an error does not name the file",
            path.display()
        ))),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(TestCaseError::fail(format!(
            "{}: no answer within 10 s",
            path.display()
        ))),
        Err(_) => Err(TestCaseError::fail(format!(
            "{}: the reader panicked",
            path.display()
        ))),
    }
}

/// The FDO loader over a directory holding one (fuzzed) statistics file.
fn load_fdo_guarded(dir: &Path) -> Result<(), TestCaseError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let d = dir.to_path_buf();
    std::thread::spawn(move || {
        let _ = shardc::embed::load(&d);
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(()) => Ok(()),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(TestCaseError::fail(
            "the FDO loader gave no answer within 10 s",
        )),
        Err(_) => Err(TestCaseError::fail("the FDO loader panicked")),
    }
}

const DESCRS: [&str; 16] = [
    "<f4", "<f8", "<f2", ">f8", "<i8", "<i4", "|i1", "<i2", "|u1", "<u4", ">u8", "|b1", "<U5",
    "|O", "<c8", "<f16",
];

/// Dimensions: mostly small, sometimes huge (the campaign's 2^62 and 10^12).
fn dim() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => 0u64..6,
        1 => Just(1u64 << 62),
        1 => Just(1_000_000_000_000u64),
        1 => Just(u64::MAX),
        1 => any::<u64>(),
    ]
}

/// A `.npy` header as numpy writes one: (version, dict text).
#[derive(Clone, Debug)]
struct Head {
    version: u8,
    descr: &'static str,
    fortran: bool,
    shape: Vec<u64>,
}

fn head() -> impl Strategy<Value = Head> {
    (
        prop_oneof![Just(1u8), Just(2u8), Just(3u8), any::<u8>()],
        proptest::sample::select(DESCRS.to_vec()),
        any::<bool>(),
        proptest::collection::vec(dim(), 0..4),
    )
        .prop_map(|(version, descr, fortran, shape)| Head {
            version,
            descr,
            fortran,
            shape,
        })
}

impl Head {
    fn itemsize(&self) -> Option<usize> {
        self.descr[2..].parse().ok()
    }
    /// The data size the header declares, if it is small enough to write.
    fn data_len(&self) -> Option<usize> {
        let n = self
            .shape
            .iter()
            .try_fold(self.itemsize()? as u64, |a, &d| a.checked_mul(d))?;
        (n <= 4096).then_some(n as usize)
    }
    fn bytes(&self, data: &[u8]) -> Vec<u8> {
        let shape = match self.shape.as_slice() {
            [d] => format!("({d},)"),
            s => format!(
                "({})",
                s.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
            ),
        };
        let f = if self.fortran { "True" } else { "False" };
        let mut h = format!(
            "{{'descr': '{}', 'fortran_order': {f}, 'shape': {shape}, }}",
            self.descr
        );
        let prefix = if self.version == 1 { 10 } else { 12 };
        h.push_str(&" ".repeat((64 - (prefix + h.len() + 1) % 64) % 64));
        h.push('\n');
        let mut out = b"\x93NUMPY".to_vec();
        out.extend_from_slice(&[self.version, 0]);
        if self.version == 1 {
            out.extend_from_slice(&(h.len() as u16).to_le_bytes());
        } else {
            out.extend_from_slice(&(h.len() as u32).to_le_bytes());
        }
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(data);
        out
    }
}

/// A byte-level mutation: flip a byte, overwrite four bytes with a number
/// (sizes, lengths), or cut the file.
#[derive(Clone, Debug)]
enum Mutation {
    Flip(usize, u8),
    Word(usize, u32),
    Cut(usize),
}

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    proptest::collection::vec(
        prop_oneof![
            (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
            (
                any::<usize>(),
                prop_oneof![Just(u32::MAX), Just(0xffff_fff0), Just(0), any::<u32>()]
            )
                .prop_map(|(i, w)| Mutation::Word(i, w)),
            any::<usize>().prop_map(Mutation::Cut),
        ],
        0..4,
    )
}

fn mutate(mut bytes: Vec<u8>, ms: &[Mutation]) -> Vec<u8> {
    for m in ms {
        if bytes.is_empty() {
            break;
        }
        let n = bytes.len();
        match *m {
            Mutation::Flip(i, b) => bytes[i % n] ^= b.max(1),
            Mutation::Word(i, w) => {
                let i = i % n;
                for (d, s) in bytes[i..].iter_mut().zip(w.to_le_bytes()) {
                    *d = s;
                }
            }
            Mutation::Cut(i) => bytes.truncate(i % n),
        }
    }
    bytes
}

fn npz(entries: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, bytes) in entries {
        w.start_file(name.as_str(), opts).expect("entry");
        w.write_all(bytes).expect("write");
    }
    w.finish().expect("zip").into_inner()
}

/// A safetensors file of one tensor whose header says anything.
fn safetensors(dtype: &str, shape: &[u64], offsets: (u64, u64), data: &[u8]) -> Vec<u8> {
    let shape = shape
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let header = format!(
        "{{\"x\":{{\"dtype\":\"{dtype}\",\"shape\":[{shape}],\"data_offsets\":[{},{}]}}}}",
        offsets.0, offsets.1
    );
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

proptest! {
    #![proptest_config(config())]

    /// Random bytes as a directory's `.npy`, as an `.npz` and as safetensors.
    #[test]
    fn random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let d = dir("random");
        let npy_dir = d.join("n");
        std::fs::create_dir_all(&npy_dir).expect("dir");
        for path in [npy_dir.join("x.npy"), d.join("d.npz"), d.join("d.safetensors")] {
            std::fs::write(&path, &bytes).expect("write");
        }
        read_guarded(&npy_dir)?;
        read_guarded(&d.join("d.npz"))?;
        read_guarded(&d.join("d.safetensors"))?;
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Generated `.npy` headers with data of the declared length or not, then
    /// mutated. Consistent, unmutated ones must read back exactly.
    #[test]
    fn npy_headers(h in head(), extra in -3i64..4, seed in any::<u8>(), ms in mutations()) {
        let d = dir("npy");
        let declared = h.data_len();
        let len = (declared.unwrap_or(64) as i64 + extra).max(0) as usize;
        let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
        let bytes = mutate(h.bytes(&data), &ms);
        let n = d.join("n");
        std::fs::create_dir_all(&n).expect("dir");
        std::fs::write(n.join("x.npy"), &bytes).expect("write");
        let got = read_guarded(&n)?;
        let supported = !matches!(h.descr, "<U5" | "|O" | "<c8" | "<f16");
        // An empty array's other dimensions must stay within what a file may hold.
        let spread = h.shape.iter().filter(|&&x| x != 0).try_fold(h.itemsize().unwrap_or(1) as u64, |a, &x| a.checked_mul(x));
        let consistent = declared == Some(len)
            && (1..=3).contains(&h.version)
            && supported
            && spread.is_some_and(|b| b <= DATA_CAP);
        if consistent && ms.is_empty() {
            let a = got.as_ref().ok_or_else(|| TestCaseError::fail(format!("{h:?}: a consistent file was refused")))?;
            let count = h.shape.iter().try_fold(1u64, |a, &x| a.checked_mul(x)).unwrap_or(u64::MAX);
            prop_assert_eq!(a[0].values.len() as u64, count);
            prop_assert_eq!(a[0].shape.iter().map(|&x| x as u64).collect::<Vec<_>>(), h.shape.clone());
        }
        if declared != Some(len) {
            // Data that does not match the header is never accepted.
            prop_assert!(got.is_none() || !ms.is_empty(), "{:?} with {} bytes was accepted", h, len);
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    /// `.npz` archives of generated entries, mutated at the byte level (sizes
    /// in the zip headers included); the FDO loader reads the same bytes.
    #[test]
    fn npz_archives(
        heads in proptest::collection::vec(head(), 1..3),
        short in any::<bool>(),
        ms in mutations(),
    ) {
        let d = dir("npz");
        let entries: Vec<(String, Vec<u8>)> = heads
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let len = h.data_len().unwrap_or(16).saturating_sub(usize::from(short));
                (format!("s{i}_max_ids.npy"), h.bytes(&vec![1u8; len]))
            })
            .collect();
        let bytes = mutate(npz(&entries), &ms);
        std::fs::write(d.join("d.npz"), &bytes).expect("write");
        read_guarded(&d.join("d.npz"))?;
        let fdo = d.join("fdo");
        let _ = std::fs::remove_dir_all(&fdo);
        std::fs::create_dir_all(&fdo).expect("dir");
        std::fs::write(fdo.join("fdo_stats_0_1.npz"), &bytes).expect("write");
        load_fdo_guarded(&fdo)?;
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Safetensors headers with any dtype, shape and offsets, then mutated.
    #[test]
    fn safetensors_headers(
        dtype in proptest::sample::select(vec!["F32", "F64", "I32", "I64", "F16", "BF16", "U8", "BOOL", "F4"]),
        shape in proptest::collection::vec(dim(), 0..4),
        offsets in (0u64..256, prop_oneof![0u64..256, Just(u64::MAX), Just(24_000_000_000_000u64)]),
        data_len in 0usize..256,
        ms in mutations(),
    ) {
        let d = dir("st");
        let bytes = mutate(safetensors(dtype, &shape, offsets, &vec![0u8; data_len]), &ms);
        std::fs::write(d.join("d.safetensors"), &bytes).expect("write");
        read_guarded(&d.join("d.safetensors"))?;
        let _ = std::fs::remove_dir_all(&d);
    }
}
