//! Named arrays on disk: `.safetensors`, `.npz`, and directories of `.npy` files.
//! One reader for training data and FDO statistics, and one decoder of safetensors
//! views shared with checkpoints and `--init`. Values keep their stored type
//! ([`Values`]: ids as integers, f16 and f32 features as f32); only a step's
//! batch is widened to f64.
//!
//! Every reader verifies before it allocates: files are read only if they are
//! regular files of at most a cap ([`crate::files::read_regular`]), a `.npy`
//! header's shape must account for exactly the bytes that follow it (checked
//! arithmetic, [`npy`]), an `.npz` entry's declared size must fit in the archive
//! before it is read, and safetensors offsets are checked against the buffer by
//! the `safetensors` crate. A file that lies about its size is an [`ArrayError`]
//! naming it, never a panic, a huge allocation or a hang.

pub mod npy;

use safetensors::tensor::{Dtype, TensorView};
use std::io::Read;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq)]
pub struct Array {
    pub name: String,
    pub shape: Vec<usize>,
    /// Stored as an integer type (ids, labels).
    pub int: bool,
    /// The element type as stored, for messages (`int32`, `float32`, ...).
    pub dtype: &'static str,
    pub values: Values,
}

/// An array's elements in the type they are stored in, or the narrowest that
/// holds it exactly: 8-, 16-bit and int32 integers and booleans as `I32`,
/// uint32 and 64-bit integers as `I64` (a uint64 past `i64::MAX` saturates),
/// float16 and float32 as `F32`, float64 as `F64`. A data file costs its own
/// size in memory, not 8 bytes an element.
#[derive(Clone, Debug, PartialEq)]
pub enum Values {
    I32(Vec<i32>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
}

impl Values {
    pub fn len(&self) -> usize {
        match self {
            Values::I32(v) => v.len(),
            Values::I64(v) => v.len(),
            Values::F32(v) => v.len(),
            Values::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements `range` widened to f64 (exact for every stored type but
    /// 64-bit integers past 2^53), or `None` past the end.
    pub fn to_f64(&self, range: std::ops::Range<usize>) -> Option<Vec<f64>> {
        Some(match self {
            Values::I32(v) => v.get(range)?.iter().map(|x| f64::from(*x)).collect(),
            Values::I64(v) => v.get(range)?.iter().map(|x| *x as f64).collect(),
            Values::F32(v) => v.get(range)?.iter().map(|x| f64::from(*x)).collect(),
            Values::F64(v) => v.get(range)?.to_vec(),
        })
    }

    /// Every element widened to f64, in order.
    pub fn iter(&self) -> Box<dyn Iterator<Item = f64> + '_> {
        match self {
            Values::I32(v) => Box::new(v.iter().map(|x| f64::from(*x))),
            Values::I64(v) => Box::new(v.iter().map(|x| *x as f64)),
            Values::F32(v) => Box::new(v.iter().map(|x| f64::from(*x))),
            Values::F64(v) => Box::new(v.iter().copied()),
        }
    }

    /// The elements reordered: element `i` of the result is `self[order[i]]`.
    fn permuted(&self, order: &[usize]) -> Values {
        fn pick<T: Copy>(v: &[T], order: &[usize]) -> Vec<T> {
            order.iter().filter_map(|i| v.get(*i).copied()).collect()
        }
        match self {
            Values::I32(v) => Values::I32(pick(v, order)),
            Values::I64(v) => Values::I64(pick(v, order)),
            Values::F32(v) => Values::F32(pick(v, order)),
            Values::F64(v) => Values::F64(pick(v, order)),
        }
    }
}

/// Why an array file was not read: the file (and, for a directory's `.npy` or an
/// archive's entry, the member) and the problem.
#[derive(Clone, Debug, PartialEq)]
pub struct ArrayError {
    pub path: PathBuf,
    /// The `.npy` file of a directory, or the entry of an `.npz` archive.
    pub member: Option<String>,
    /// Boxed: a `Result` of this error stays small.
    pub problem: Box<Problem>,
}

/// What is wrong with an array file.
#[derive(Clone, Debug, PartialEq)]
pub enum Problem {
    /// It could not be read: missing, not a regular file (a FIFO, a device), too big.
    Io(String),
    /// A lone `.npy` names no array.
    LoneNpy,
    /// Neither `.safetensors`, `.npz` nor a directory.
    NotArrays,
    /// A directory without `.npy` files.
    EmptyDir,
    /// Not a zip archive the reader understands.
    NotNpz(String),
    /// An archive entry compressed with a method other than stored or deflated.
    Compressed(String),
    /// An archive entry declares more bytes than the archive could hold.
    EntryTooBig {
        declared: u64,
        cap: u64,
    },
    /// An archive entry ends before its declared size, or fails its checksum.
    EntryShort {
        declared: u64,
        got: u64,
    },
    EntryRead(String),
    /// A `.npy` whose prefix or header is malformed.
    NotNpy(String),
    /// An element type shardc does not read.
    Dtype(String),
    /// The shape's byte count (None: past 2^128) is not the data's.
    SizeMismatch {
        shape: Vec<u64>,
        dtype: &'static str,
        declared: Option<u128>,
        holds: u64,
    },
    /// An empty array whose other dimensions multiply past what a file may hold.
    EmptyTooBig {
        shape: Vec<u64>,
        dtype: &'static str,
    },
    NotSafetensors(String),
    /// A tensor of a type shardc does not read.
    Unsupported(String),
    /// Two arrays of one name.
    Duplicate(String),
}

impl ArrayError {
    fn new(path: &Path, problem: Problem) -> ArrayError {
        ArrayError {
            path: path.to_path_buf(),
            member: None,
            problem: Box::new(problem),
        }
    }
    fn member(path: &Path, member: &str, problem: Problem) -> ArrayError {
        ArrayError {
            path: path.to_path_buf(),
            member: Some(member.to_string()),
            problem: Box::new(problem),
        }
    }
    /// What is wrong, naming the member but not the file (for callers whose
    /// message names the file already).
    pub fn reason(&self) -> String {
        match &self.member {
            Some(m) => format!("`{m}` {}", self.problem.phrase(true)),
            None => self.problem.phrase(false),
        }
    }
}

impl std::fmt::Display for ArrayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.member {
            Some(_) => write!(f, "`{}`: {}", self.path.display(), self.reason()),
            None => write!(f, "`{}` {}", self.path.display(), self.problem.phrase(true)),
        }
    }
}

impl std::error::Error for ArrayError {}

impl Problem {
    /// The problem as a predicate of the file or member (`subject`: it follows its
    /// name), or standing alone.
    pub fn phrase(&self, subject: bool) -> String {
        let is = |s: &str| {
            if subject {
                format!("is {s}")
            } else {
                s.to_string()
            }
        };
        match self {
            Problem::Io(e) if subject => format!("cannot be read: {e}"),
            Problem::Io(e) => e.clone(),
            Problem::LoneNpy if subject => "is a single `.npy` file, which holds one unnamed array".into(),
            Problem::LoneNpy => "a single `.npy` file holds one unnamed array; put `x.npy` and `y.npy` in a directory and name the directory, or use `.npz`".into(),
            Problem::NotArrays if subject => "is not a `.safetensors` or `.npz` file or a directory of `.npy` files".into(),
            Problem::NotArrays => "expected a `.safetensors` or `.npz` file, or a directory of `.npy` files".into(),
            Problem::EmptyDir if subject => "holds no `.npy` files".into(),
            Problem::EmptyDir => "the directory holds no `.npy` files".into(),
            Problem::NotNpz(e) => is(&format!("not a readable .npz file ({e})")),
            Problem::Compressed(m) => is(&format!("compressed with {m}; shardc reads entries stored (numpy's `savez`) or deflated (`savez_compressed`)")),
            Problem::EntryTooBig { declared, cap } => format!(
                "declares {declared} bytes, more than the {cap} bytes the archive could hold"
            ),
            Problem::EntryShort { declared, got } => format!(
                "declares {declared} bytes, but the archive holds {got} of them"
            ),
            Problem::EntryRead(e) => format!("cannot be read from the archive: {e}"),
            Problem::NotNpy(why) => is(&format!("not a readable .npy file: {why}")),
            Problem::Dtype(d) => format!(
                "has the element type `{d}`; shardc reads floats (`<f2`, `<f4`, `<f8`), integers and booleans"
            ),
            Problem::SizeMismatch {
                shape,
                dtype,
                declared,
                holds,
            } => {
                let size = match declared {
                    Some(b) => format!(" = {}", human(*b)),
                    None => ", more bytes than can be counted".into(),
                };
                format!(
                    "declares shape {} of {dtype}{size}, but the file holds {holds} bytes of data",
                    tuple(shape)
                )
            }
            Problem::EmptyTooBig { shape, dtype } => format!(
                "declares shape {} of {dtype}: an empty array whose other dimensions multiply past the {} limit",
                tuple(shape),
                human(u128::from(crate::files::DATA_CAP))
            ),
            Problem::NotSafetensors(e) => is(&format!("not a safetensors file ({e})")),
            Problem::Unsupported(e) => e.clone(),
            Problem::Duplicate(n) => format!("holds two arrays named `{n}`"),
        }
    }
}

/// A shape as Python writes it: `(3, 4)`, `(5,)`, `()`.
fn tuple(shape: &[u64]) -> String {
    match shape {
        [d] => format!("({d},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// A byte count in decimal units: `120 bytes`, `24 TB`.
fn human(n: u128) -> String {
    const UNITS: [&str; 8] = ["kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"];
    if n < 1000 {
        return format!("{n} bytes");
    }
    let mut v = n as f64 / 1000.0;
    let mut unit = UNITS[0];
    for u in &UNITS[1..] {
        if v < 1000.0 {
            break;
        }
        v /= 1000.0;
        unit = u;
    }
    if v < 10.0 {
        format!("{v:.1} {unit}")
    } else {
        format!("{v:.0} {unit}")
    }
}

fn io_problem(e: &std::io::Error) -> Problem {
    Problem::Io(match e.kind() {
        std::io::ErrorKind::NotFound => "no such file or directory".into(),
        _ => e.to_string(),
    })
}

/// Every array in `path` of a file system: a `.safetensors` or `.npz` file, or
/// a directory whose `NAME.npy` files are the arrays. Errors say what is wrong
/// with the file (without repeating its name, which the caller's message holds).
pub fn read(files: &dyn crate::files::Files, path: &Path) -> Result<Vec<Array>, String> {
    let disk = files.on_disk(path);
    let bytes = |p: &Path| files.read(p);
    read_with(path, disk.as_deref(), &bytes, crate::files::DATA_CAP).map_err(|e| e.reason())
}

/// Every array in `path` on the disk (as [`read`]), each file at most `cap` bytes.
pub fn read_file(path: &Path, cap: u64) -> Result<Vec<Array>, ArrayError> {
    let bytes = |p: &Path| crate::files::read_regular(p, cap);
    read_with(path, Some(path), &bytes, cap)
}

type Bytes<'a> = dyn Fn(&Path) -> std::io::Result<Vec<u8>> + 'a;

fn read_with(
    path: &Path,
    disk: Option<&Path>,
    bytes: &Bytes,
    cap: u64,
) -> Result<Vec<Array>, ArrayError> {
    let err = |p| ArrayError::new(path, p);
    let ext = path
        .extension()
        .map(|x| x.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    if let Some(disk) = disk {
        // `metadata` does not open the file: a FIFO is not waited on here.
        let meta = std::fs::metadata(disk).map_err(|e| err(io_problem(&e)))?;
        if meta.is_dir() {
            return npy_dir(disk, cap);
        }
        match ext.as_str() {
            "safetensors" | "npz" => {}
            "npy" => return Err(err(Problem::LoneNpy)),
            _ => return Err(err(Problem::NotArrays)),
        }
    }
    // Only files on the disk can be directories; others are decoded from bytes.
    let buf = bytes(path).map_err(|e| err(io_problem(&e)))?;
    match ext.as_str() {
        "npz" => npz_arrays(path, &buf, cap),
        _ => safetensors_arrays(path, &buf),
    }
}

/// A directory's `NAME.npy` files, by name.
fn npy_dir(dir: &Path, cap: u64) -> Result<Vec<Array>, ArrayError> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| ArrayError::new(dir, io_problem(&e)))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "npy"))
        .collect();
    entries.sort();
    if entries.is_empty() {
        return Err(ArrayError::new(dir, Problem::EmptyDir));
    }
    let mut out = Vec::with_capacity(entries.len());
    for p in entries {
        let member = p
            .file_name()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default();
        let fail = |problem| ArrayError::member(dir, &member, problem);
        // A FIFO or device named `x.npy` is refused before it is opened for reading.
        let buf = crate::files::read_regular(&p, cap).map_err(|e| fail(io_problem(&e)))?;
        let name = p
            .file_stem()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default();
        out.push(npy_array(name, &buf).map_err(fail)?);
    }
    Ok(out)
}

/// One verified `.npy` file's array.
fn npy_array(name: String, bytes: &[u8]) -> Result<Array, Problem> {
    let parsed = npy::parse(bytes)?;
    let shape = parsed
        .shape
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<Vec<usize>, _>>()
        .map_err(|_| Problem::EmptyTooBig {
            shape: parsed.shape.clone(),
            dtype: parsed.dtype.name(),
        })?;
    Ok(Array {
        name,
        shape,
        int: parsed.dtype.is_int(),
        dtype: parsed.dtype.name(),
        values: npy::decode(&parsed),
    })
}

/// The most bytes deflate can expand one byte into (a 258-byte match per two
/// bits, with the stream's overhead): a deflated entry declaring more than
/// this many times its compressed size lies about its size.
const DEFLATE_RATIO: u64 = 1032;

/// The arrays of an `.npz` archive's bytes (numpy's `savez`: one stored `NAME.npy`
/// entry per array; `savez_compressed`: deflated), sorted by name. Each entry's
/// declared size is checked against the archive (and deflate's largest ratio)
/// before it is read, at most that many bytes are inflated, and its `.npy` is
/// verified.
pub fn npz_arrays(path: &Path, buf: &[u8], cap: u64) -> Result<Vec<Array>, ArrayError> {
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(buf))
        .map_err(|e| ArrayError::new(path, Problem::NotNpz(e.to_string())))?;
    let mut out: Vec<Array> = Vec::new();
    for i in 0..zip.len() {
        // The entry's metadata first, without decompressing anything.
        let (entry, size, limit) = {
            let raw = zip
                .by_index_raw(i)
                .map_err(|e| ArrayError::new(path, Problem::NotNpz(e.to_string())))?;
            let entry = String::from_utf8_lossy(raw.name_raw()).into_owned();
            if raw.is_dir() {
                continue;
            }
            // A stored entry cannot hold more than the archive; a deflated one
            // no more than deflate's ratio times its compressed bytes.
            let packed = raw.compressed_size().min(buf.len() as u64);
            let limit = match raw.compression() {
                zip::CompressionMethod::Stored => buf.len() as u64,
                zip::CompressionMethod::Deflated => packed.saturating_mul(DEFLATE_RATIO),
                other => {
                    let m = format!("{other:?}").to_lowercase();
                    return Err(ArrayError::member(path, &entry, Problem::Compressed(m)));
                }
            };
            (entry, raw.size(), limit.min(cap))
        };
        let fail = |problem| ArrayError::member(path, &entry, problem);
        if size > limit {
            return Err(fail(Problem::EntryTooBig {
                declared: size,
                cap: limit,
            }));
        }
        let mut file = zip
            .by_index(i)
            .map_err(|e| fail(Problem::EntryRead(e.to_string())))?;
        let mut data = Vec::new();
        data.try_reserve_exact(size as usize).map_err(|_| {
            fail(Problem::EntryTooBig {
                declared: size,
                cap: limit,
            })
        })?;
        // One byte past the declared size reaches the end, where the checksum is checked.
        (&mut file)
            .take(size + 1)
            .read_to_end(&mut data)
            .map_err(|e| fail(Problem::EntryRead(e.to_string())))?;
        if data.len() as u64 != size {
            return Err(fail(Problem::EntryShort {
                declared: size,
                got: data.len() as u64,
            }));
        }
        let name = entry.strip_suffix(".npy").unwrap_or(&entry).to_string();
        out.push(npy_array(name, &data).map_err(fail)?);
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(w) = out.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(ArrayError::new(path, Problem::Duplicate(w[0].name.clone())));
    }
    Ok(out)
}

/// An uncompressed `.npz` of one-dimensional int32 arrays.
pub fn npz_of_i32(arrays: &[(String, Vec<i32>)]) -> Result<Vec<u8>, String> {
    let shaped: Vec<(String, Vec<usize>, Ints)> = arrays
        .iter()
        .map(|(n, v)| (n.clone(), vec![v.len()], Ints::I32(v.clone())))
        .collect();
    npz_of_ints(&shaped)
}

/// The integer data of one `.npz` member, in C order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ints {
    I32(Vec<i32>),
    I64(Vec<i64>),
}

/// An uncompressed `.npz` (what `numpy.savez` writes) of integer arrays, each
/// with its shape (`[]` for a scalar); a shape that does not hold its data is
/// an error.
pub fn npz_of_ints(arrays: &[(String, Vec<usize>, Ints)]) -> Result<Vec<u8>, String> {
    use std::io::Write;
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, shape, values) in arrays {
        let (descr, len, data): (&str, usize, Vec<u8>) = match values {
            Ints::I32(v) => (
                "<i4",
                v.len(),
                v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ),
            Ints::I64(v) => (
                "<i8",
                v.len(),
                v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ),
        };
        if shape.iter().product::<usize>() != len {
            return Err(format!("`{name}` has {len} values, not shape {shape:?}"));
        }
        let bytes = npy::write(descr, shape, &data);
        w.start_file(format!("{name}.npy"), opts)
            .map_err(|e| e.to_string())?;
        w.write_all(&bytes).map_err(|e| e.to_string())?;
    }
    Ok(w.finish().map_err(|e| e.to_string())?.into_inner())
}

/// The arrays of a safetensors file's bytes, sorted by name. The `safetensors`
/// crate checks every tensor's offsets and size against the buffer.
pub fn safetensors_arrays(path: &Path, buf: &[u8]) -> Result<Vec<Array>, ArrayError> {
    let err = |p| ArrayError::new(path, p);
    let st = safetensors::SafeTensors::deserialize(buf)
        .map_err(|e| err(Problem::NotSafetensors(e.to_string())))?;
    let mut names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
    names.sort();
    names
        .into_iter()
        .map(|n| {
            let v = st
                .tensor(&n)
                .map_err(|e| err(Problem::NotSafetensors(e.to_string())))?;
            let (values, int, dtype) =
                decode_values(&v, &n).map_err(|e| err(Problem::Unsupported(e)))?;
            let shape: Vec<u64> = v.shape().iter().map(|&d| d as u64).collect();
            let itemsize = v.dtype().bitsize() / 8;
            npy::verify_size(&shape, itemsize, dtype, v.data().len() as u64)
                .map_err(|p| ArrayError::member(path, &n, p))?;
            Ok(Array {
                shape: v.shape().to_vec(),
                name: n,
                int,
                dtype,
                values,
            })
        })
        .collect()
}

/// A safetensors view's values in their stored type (training data).
fn decode_values(v: &TensorView, name: &str) -> Result<(Values, bool, &'static str), String> {
    let d = v.data();
    let four = |c: &[u8]| [c[0], c[1], c[2], c[3]];
    let eight = |c: &[u8]| [c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]];
    Ok(match v.dtype() {
        Dtype::F32 => (
            Values::F32(
                d.chunks_exact(4)
                    .map(|c| f32::from_le_bytes(four(c)))
                    .collect(),
            ),
            false,
            "float32",
        ),
        Dtype::F64 => (
            Values::F64(
                d.chunks_exact(8)
                    .map(|c| f64::from_le_bytes(eight(c)))
                    .collect(),
            ),
            false,
            "float64",
        ),
        Dtype::I32 => (
            Values::I32(
                d.chunks_exact(4)
                    .map(|c| i32::from_le_bytes(four(c)))
                    .collect(),
            ),
            true,
            "int32",
        ),
        Dtype::I64 => (
            Values::I64(
                d.chunks_exact(8)
                    .map(|c| i64::from_le_bytes(eight(c)))
                    .collect(),
            ),
            true,
            "int64",
        ),
        other => {
            return Err(format!(
                "tensor `{name}` has dtype {other:?}; expected F32, F64, I32 or I64"
            ))
        }
    })
}

/// A safetensors view's values as f64, whether it is stored as a float (F32, F64)
/// or an integer (I32, I64) type, with that type's name.
pub fn decode_any(v: &TensorView, name: &str) -> Result<(Vec<f64>, bool, &'static str), String> {
    let (values, int, ty) = decode_values(v, name)?;
    Ok((values.iter().collect(), int, ty))
}

/// A stored parameter's values: floats only (checkpoints and `--init`).
pub fn decode_float(v: &TensorView, name: &str) -> Result<Vec<f64>, String> {
    match decode_any(v, name)? {
        (vals, false, _) => Ok(vals),
        (_, true, ty) => Err(format!(
            "tensor `{name}` is {ty}; parameters are stored as F32 or F64"
        )),
    }
}
