//! Token streams (`data: tokens(path: ...)`): one flat file of token ids —
//! nanoGPT's `.bin` (little-endian `uint16`, or `uint32` for vocabularies
//! over 65,535) or a 1-D `.npy` of integers — read by position, never whole
//! and never as floats: a run holds the windows of its batch, whatever the
//! file's size. Windows of `seq + 1` ids give the inputs (the first `seq`) and
//! the targets (the same shifted by one), as nanoGPT's `get_batch` slices
//! them. Reads are positioned (`pread`), not a memory map, so a file cut
//! short while a run reads it is an error naming it, not a SIGBUS.

use crate::arrays::npy;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

/// How the ids are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Item {
    U16,
    U32,
    /// A `.npy` integer dtype.
    Npy(npy::Dtype),
}

impl Item {
    fn size(self) -> usize {
        match self {
            Item::U16 => 2,
            Item::U32 => 4,
            Item::Npy(d) => d.size,
        }
    }

    fn id(self, c: &[u8]) -> i64 {
        match self {
            Item::U16 => i64::from(u16::from_le_bytes([c[0], c[1]])),
            Item::U32 => i64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            Item::Npy(d) => d.integer(c).unwrap_or(-1),
        }
    }

    /// The dtype's name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Item::U16 => "uint16",
            Item::U32 => "uint32",
            Item::Npy(d) => d.name(),
        }
    }
}

/// Why a token stream cannot be used.
#[derive(Debug)]
pub enum StreamError {
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    /// A `.bin` whose size is not a whole number of ids (cut short).
    Ragged {
        path: PathBuf,
        bytes: u64,
        item: Item,
    },
    NotNpy {
        path: PathBuf,
        why: String,
    },
    /// A `.npy` that is not a flat array of integers.
    NotTokens {
        path: PathBuf,
        why: String,
    },
    /// An id that is negative or not below the vocabulary, at `index` (the
    /// `index`-th id, at byte `byte` of the file).
    BadId {
        path: PathBuf,
        id: i64,
        index: u64,
        byte: u64,
        vocab: usize,
    },
    /// The file was replaced or changed while a run read it.
    Changed {
        path: PathBuf,
        what: String,
    },
    /// A `tokenizer.json` that does not parse (or fails to encode).
    Tokenizer {
        path: PathBuf,
        why: String,
    },
    /// A parquet or Arrow source that does not hold token ids.
    Table {
        path: PathBuf,
        problem: TableProblem,
    },
    /// An id outside the vocabulary in a converted source, at `place` in
    /// `path`; the `index`-th id of the converted stream.
    BadIdIn {
        path: PathBuf,
        id: i64,
        place: Place,
        index: u64,
        vocab: usize,
    },
    /// A text that is not UTF-8, or holds a NUL byte.
    Text {
        path: PathBuf,
        error: super::TextError,
    },
    /// A stream (converted on `run`) too short for one window.
    Short {
        path: PathBuf,
        short: Short,
    },
}

/// Where in a converted source an id was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Row `row` of a table (from 0, across its record batches), the
    /// `position`-th id of a list.
    Row { row: u64, position: u64 },
    /// The piece of text starting at this byte.
    Byte(u64),
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Row { row, position } => write!(f, "row {row}, position {position}"),
            Place::Byte(b) => write!(f, "the text from byte {b}"),
        }
    }
}

/// Why a parquet or Arrow source holds no token ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TableProblem {
    /// The column named (or none of the defaults) is not there.
    NoColumn {
        want: Option<String>,
        has: Vec<String>,
    },
    /// A column of another type.
    Type { column: String, ty: String },
    /// A string column, without a tokenizer.
    NeedsTokenizer(String),
    /// Ids (a column, or a flat id file) with a tokenizer.
    IdsWithTokenizer(Option<String>),
    /// A text file (by its extension) without a tokenizer.
    TextWithoutTokenizer,
    /// A null id in a row (and list position).
    Null { row: u64, position: Option<u64> },
    /// A directory with no `.arrow` or `.parquet` files.
    EmptyDir,
    /// A `datasets` `state.json` that names no shards.
    State(String),
    /// The reader's own error.
    Read(String),
}

impl std::fmt::Display for TableProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |h: &[String]| {
            h.iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            TableProblem::NoColumn { want: Some(w), has } => {
                write!(f, "has no column `{w}`; it has {}", list(has))
            }
            TableProblem::NoColumn { want: None, has } => write!(
                f,
                "has columns {}; name one with `column: \"...\"` (without it: `input_ids`, `tokens` or `text`)",
                list(has)
            ),
            TableProblem::Type { column, ty } => write!(
                f,
                "column `{column}` is {ty}; a token column holds integers or lists of integers (or strings, with a `tokenizer`)"
            ),
            TableProblem::NeedsTokenizer(c) => write!(
                f,
                "column `{c}` holds text; name a `tokenizer: \"tokenizer.json\"` to turn it into ids"
            ),
            TableProblem::IdsWithTokenizer(Some(c)) => write!(
                f,
                "column `{c}` already holds token ids; leave out `tokenizer`"
            ),
            TableProblem::IdsWithTokenizer(None) => {
                write!(f, "holds token ids already; leave out `tokenizer`")
            }
            TableProblem::TextWithoutTokenizer => write!(
                f,
                "is text, not token ids; name a `tokenizer: \"tokenizer.json\"` to turn it into ids (or use `text(path: ...)` for word ids)"
            ),
            TableProblem::Null { row, position: Some(p) } => {
                write!(f, "holds a null id in row {row}, position {p}")
            }
            TableProblem::Null { row, position: None } => write!(f, "holds a null id in row {row}"),
            TableProblem::EmptyDir => write!(
                f,
                "holds no `.arrow` or `.parquet` files (a `datasets` directory from `save_to_disk`, or parquet shards)"
            ),
            TableProblem::State(why) => write!(f, "is not a `datasets` state file: {why}"),
            TableProblem::Read(why) => write!(f, "cannot be read as a table: {why}"),
        }
    }
}

/// A stream too short for one window: what part, how many ids, how many needed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Short {
    pub part: &'static str,
    pub ids: u64,
    pub need: u64,
}

impl std::fmt::Display for Short {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "its {} holds {} ids, too few for one window of {} (`seq` + 1)",
            self.part, self.ids, self.need
        )
    }
}

impl std::fmt::Display for StreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StreamError::Io { path, error } => write!(f, "cannot read `{}`: {error}", path.display()),
            StreamError::Ragged { path, bytes, item } => write!(
                f,
                "`{}` holds {bytes} bytes, not a whole number of {} ids ({} bytes each): cut short?",
                path.display(),
                item.name(),
                item.size()
            ),
            StreamError::NotNpy { path, why } => write!(f, "`{}`: {why}", path.display()),
            StreamError::NotTokens { path, why } => {
                write!(f, "`{}` is not a flat array of token ids: {why}", path.display())
            }
            StreamError::BadId {
                path,
                id,
                index,
                byte,
                vocab,
            } => write!(
                f,
                "`{}`: id {id} at token {index} (byte {byte}) is outside the vocabulary of {vocab}",
                path.display()
            ),
            StreamError::Changed { path, what } => write!(
                f,
                "`{}` changed while the run read it ({what}); its batches would not be the ones it started with",
                path.display()
            ),
            StreamError::Tokenizer { path, why } => {
                write!(f, "`{}` is not a usable tokenizer: {why}", path.display())
            }
            StreamError::Table { path, problem } => write!(f, "`{}` {problem}", path.display()),
            StreamError::BadIdIn {
                path,
                id,
                place,
                index,
                vocab,
            } => write!(
                f,
                "`{}`: id {id} at {place} (token {index} of the stream) is outside the vocabulary of {vocab}",
                path.display()
            ),
            StreamError::Text { path, error } => write!(f, "`{}`: {error}", path.display()),
            StreamError::Short { path, short } => write!(f, "`{}`: {short}", path.display()),
        }
    }
}

impl std::error::Error for StreamError {}

pub(crate) type Res<T> = Result<T, StreamError>;

/// What identifies a file's contents for change detection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    len: u64,
    ino: u64,
    mtime: i64,
    mtime_ns: i64,
}

fn stamp(m: &std::fs::Metadata) -> Stamp {
    Stamp {
        len: m.len(),
        ino: m.ino(),
        mtime: m.mtime(),
        mtime_ns: m.mtime_nsec(),
    }
}

/// An opened token file.
#[derive(Debug)]
pub struct TokenFile {
    pub path: PathBuf,
    file: std::fs::File,
    /// Where the ids start.
    start: u64,
    /// How many ids it holds.
    pub len: u64,
    pub item: Item,
    stamp: Stamp,
    /// Bytes this process has read of it (the id scan and the windows).
    read: std::sync::atomic::AtomicU64,
}

impl TokenFile {
    /// Open a `.npy` (by its extension) or a raw `.bin` of `uint16` ids
    /// (`uint32` with `wide`).
    pub fn open(path: &Path, wide: bool) -> Res<TokenFile> {
        let io = |error| StreamError::Io {
            path: path.to_path_buf(),
            error,
        };
        let file = crate::files::open_regular(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        let bytes = meta.len();
        let (item, start) = if path.extension().is_some_and(|e| e == "npy") {
            let mut prefix = vec![0u8; bytes.min(1 << 16) as usize];
            file.read_exact_at(&mut prefix, 0).map_err(io)?;
            let (head, start) = npy::header(&prefix).map_err(|e| StreamError::NotNpy {
                path: path.to_path_buf(),
                why: e.phrase(false),
            })?;
            let not = |why: String| StreamError::NotTokens {
                path: path.to_path_buf(),
                why,
            };
            if head.shape.len() != 1 {
                return Err(not(format!(
                    "its shape is {:?}; a token stream is 1-D",
                    head.shape
                )));
            }
            if !head.dtype.is_int() {
                return Err(not(format!("its dtype is {}", head.dtype.name())));
            }
            npy::verify_size(
                &head.shape,
                head.dtype.size,
                head.dtype.name(),
                bytes - start as u64,
            )
            .map_err(|e| StreamError::NotNpy {
                path: path.to_path_buf(),
                why: e.phrase(false),
            })?;
            (Item::Npy(head.dtype), start as u64)
        } else {
            let item = if wide { Item::U32 } else { Item::U16 };
            if bytes % item.size() as u64 != 0 {
                return Err(StreamError::Ragged {
                    path: path.to_path_buf(),
                    bytes,
                    item,
                });
            }
            (item, 0)
        };
        Ok(TokenFile {
            path: path.to_path_buf(),
            len: (bytes - start) / item.size() as u64,
            file,
            start,
            item,
            stamp: stamp(&meta),
            read: Default::default(),
        })
    }

    /// `n` ids from the `at`-th, each checked against `vocab`.
    pub fn read(&self, at: u64, n: usize, vocab: usize, out: &mut Vec<i64>) -> Res<()> {
        let mut buf = Vec::new();
        self.fetch(at, n, &mut buf)?;
        self.each(&buf, at, vocab, |id| out.push(id))
    }

    /// The bytes of `n` ids from the `at`-th, into `buf`.
    fn fetch(&self, at: u64, n: usize, buf: &mut Vec<u8>) -> Res<()> {
        let size = self.item.size();
        buf.resize(n * size, 0);
        self.read
            .fetch_add(buf.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.file
            .read_exact_at(buf, self.start + at * size as u64)
            .map_err(|error| StreamError::Io {
                path: self.path.clone(),
                error,
            })
    }

    /// Each id of `buf` (ids from the `at`-th) to `f`, stopping at the first
    /// outside `vocab`.
    fn each(&self, buf: &[u8], at: u64, vocab: usize, mut f: impl FnMut(i64)) -> Res<()> {
        for (k, c) in buf.chunks_exact(self.item.size()).enumerate() {
            let id = self.item.id(c);
            if id < 0 || id as u64 >= vocab as u64 {
                return Err(StreamError::BadId {
                    path: self.path.clone(),
                    id,
                    index: at + k as u64,
                    byte: self.start + (at + k as u64) * self.item.size() as u64,
                    vocab,
                });
            }
            f(id);
        }
        Ok(())
    }

    /// Bytes this process has read of the file so far.
    pub fn bytes_read(&self) -> u64 {
        self.read.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The file's size in bytes.
    pub fn bytes(&self) -> u64 {
        self.stamp.len
    }

    /// Every id of `range` in turn, a megabyte at a time, stopping at the
    /// first outside the vocabulary; `progress` sees the ids done so far.
    pub fn scan(&self, range: (u64, u64), vocab: usize, progress: &mut dyn FnMut(u64)) -> Res<()> {
        let chunk = ((1 << 20) / self.item.size()) as u64;
        let mut buf = Vec::new();
        let (mut at, end) = (range.0, range.1.min(self.len));
        while at < end {
            let n = chunk.min(end - at) as usize;
            self.fetch(at, n, &mut buf)?;
            self.each(&buf, at, vocab, |_| {})?;
            at += n as u64;
            progress(at - range.0);
        }
        Ok(())
    }

    /// Ids at `k` evenly spread places (the first and the last among them),
    /// checked against `vocab`: what `shardc check` reads.
    pub fn sample(&self, k: u64, vocab: usize) -> Res<()> {
        if self.len == 0 {
            return Ok(());
        }
        let mut out = Vec::new();
        let k = k.min(self.len).max(1);
        for j in 0..k {
            let at = if k == 1 {
                0
            } else {
                j * (self.len - 1) / (k - 1)
            };
            out.clear();
            self.read(at, 1, vocab, &mut out)?;
        }
        Ok(())
    }

    /// Whether the file at the path is no longer the one opened.
    pub fn changed(&self) -> Res<()> {
        let now = std::fs::metadata(&self.path).map_err(|error| StreamError::Io {
            path: self.path.clone(),
            error,
        })?;
        let now = stamp(&now);
        if now == self.stamp {
            return Ok(());
        }
        let what = if now.ino != self.stamp.ino {
            "it was replaced by another file".to_string()
        } else if now.len != self.stamp.len {
            format!("its size went from {} to {} bytes", self.stamp.len, now.len)
        } else {
            "it was written to".to_string()
        };
        Err(StreamError::Changed {
            path: self.path.clone(),
            what,
        })
    }
}

/// The window starts: where each of a step's examples starts, in `0..span`
/// (a function of the seed, the step and the example only, so a resumed run
/// continues with exactly the next windows). `scripts/token_fixtures.py`
/// computes the same.
pub fn window(
    seed: u64,
    step: usize,
    example: usize,
    span: u64,
    sequential: bool,
    seq: usize,
    batch: usize,
) -> u64 {
    if span == 0 {
        return 0;
    }
    if sequential {
        return ((step as u64 * batch as u64 + example as u64) * seq as u64) % span;
    }
    let z = seed
        ^ (step as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (example as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
    splitmix64(z) % span
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A training stream: the file, the ids of the training part and of the
/// held-out part (the tail of the same file, or another file).
#[derive(Debug)]
pub struct Stream {
    pub train: std::sync::Arc<TokenFile>,
    /// `[lo, hi)` of the training ids.
    pub train_range: (u64, u64),
    pub eval: std::sync::Arc<TokenFile>,
    pub eval_range: (u64, u64),
    pub seq: usize,
    pub sequential: bool,
    /// Ids must be below it.
    pub vocab: usize,
}

impl Stream {
    /// Its files: the training stream, and the held-out one when it is its own.
    pub fn files(&self) -> Vec<&TokenFile> {
        let mut v = vec![self.train.as_ref()];
        if !std::sync::Arc::ptr_eq(&self.train, &self.eval) {
            v.push(self.eval.as_ref());
        }
        v
    }

    /// A step's inputs and targets (per position, or the id after each
    /// window for a classifier): `batch` windows of `seq + 1` ids. Examples
    /// `want` leaves out (another process's) are zeros, not read.
    pub fn batch(
        &self,
        seed: u64,
        step: usize,
        batch: usize,
        per_position: bool,
        held_out: bool,
        want: Option<&[bool]>,
    ) -> Res<(Vec<f64>, Vec<f64>)> {
        let (file, (lo, hi)) = if held_out {
            (&self.eval, self.eval_range)
        } else {
            (&self.train, self.train_range)
        };
        file.changed()?;
        let span = (hi - lo).saturating_sub(self.seq as u64);
        let mut x = Vec::with_capacity(batch * self.seq);
        let mut y = Vec::with_capacity(batch * self.seq);
        let mut ids = Vec::with_capacity(self.seq + 1);
        let salt = if held_out {
            seed ^ 0x0048_454c_444f_5554
        } else {
            seed
        };
        for b in 0..batch {
            let at = lo + window(salt, step, b, span, self.sequential, self.seq, batch);
            ids.clear();
            if want.is_none_or(|w| w.get(b).copied().unwrap_or(true)) {
                file.read(at, self.seq + 1, self.vocab, &mut ids)?;
            } else {
                ids.resize(self.seq + 1, 0);
            }
            x.extend(ids[..self.seq].iter().map(|i| *i as f64));
            if per_position {
                y.extend(ids[1..].iter().map(|i| *i as f64));
            } else {
                y.push(ids[self.seq] as f64);
            }
        }
        Ok((x, y))
    }
}

/// The ranges of a stream's training and held-out ids: the whole of each
/// file when the held-out stream is its own, else the last `fraction` of the
/// one file held out.
pub fn split(train: u64, eval: Option<u64>, fraction: f64) -> ((u64, u64), (u64, u64)) {
    match eval {
        Some(n) => ((0, train), (0, n)),
        None => {
            let held = ((train as f64) * fraction).round() as u64;
            let cut = train - held.min(train);
            ((0, cut), (cut, train))
        }
    }
}

/// Whether a part is too short for one window of `seq + 1` ids (the held-out
/// part only when `eval` reads it).
pub fn short(train: (u64, u64), eval: (u64, u64), seq: usize, need_eval: bool) -> Option<Short> {
    let need = seq as u64 + 1;
    let too = |r: (u64, u64), part| {
        (r.1 - r.0 < need).then_some(Short {
            part,
            ids: r.1 - r.0,
            need,
        })
    };
    too(train, "training part").or_else(|| need_eval.then(|| too(eval, "held-out part")).flatten())
}

impl Stream {
    /// The stream over opened files, checked to hold a window in each part.
    pub fn assemble(
        train: std::sync::Arc<TokenFile>,
        eval: Option<std::sync::Arc<TokenFile>>,
        fraction: f64,
        seq: usize,
        sequential: bool,
        vocab: usize,
        need_eval: bool,
    ) -> Result<Stream, Short> {
        let (train_range, eval_range) = split(train.len, eval.as_ref().map(|e| e.len), fraction);
        if let Some(s) = short(train_range, eval_range, seq, need_eval) {
            return Err(s);
        }
        Ok(Stream {
            eval: eval.unwrap_or_else(|| train.clone()),
            train,
            train_range,
            eval_range,
            seq,
            sequential,
            vocab,
        })
    }
}

/// One part of a token source as `check` leaves it: opened, or to convert on
/// `run`, with the ids its metadata counts when it counts them.
enum Opened {
    File(std::sync::Arc<TokenFile>),
    Convert(Box<super::convert::Recipe>, Option<u64>),
}

impl Opened {
    fn ids(&self) -> Option<u64> {
        match self {
            Opened::File(f) => Some(f.len),
            Opened::Convert(_, n) => *n,
        }
    }
    fn part(self) -> super::convert::Part {
        match self {
            Opened::File(f) => super::convert::Part::File(f),
            Opened::Convert(r, _) => super::convert::Part::Convert(r),
        }
    }
}

/// What a token source's parts share.
struct Common<'a> {
    uint32: bool,
    vocab: usize,
    column: Option<&'a str>,
    tok: Option<&'a super::convert::Tok>,
}

impl super::Cx<'_> {
    /// `data: tokens(...)`: open the stream (and the held-out one), check its
    /// dtype and length against `seq`, and ids at 4,096 places against the
    /// model's vocabulary, without reading it whole; a parquet, Arrow or text
    /// source's schema, column and tokenizer, to convert on `run`.
    pub(super) fn tokens(&mut self, model: &str, data: &crate::spec::Data, shape: &super::Shapes) {
        let crate::spec::Data::Tokens {
            path,
            written,
            path_span,
            eval_path,
            seq,
            uint32,
            sequential,
            eval,
            column,
            tokenizer,
        } = data
        else {
            return;
        };
        let vocab = shape
            .input_vocab
            .iter()
            .flatten()
            .copied()
            .chain([shape.classes])
            .min()
            .unwrap_or(1)
            .max(1);
        let seq = (*seq).max(1);
        let tok = match tokenizer {
            Some((p, w, span)) => match self.tokenizer(p, w, *span, vocab) {
                Some(t) => Some(t),
                None => return,
            },
            None => None,
        };
        let common = Common {
            uint32: *uint32,
            vocab,
            column: column.as_ref().map(|c| c.0.as_str()),
            tok: tok.as_ref(),
        };
        let Some(train) = self.token_part(path, written, *path_span, &common) else {
            return;
        };
        let held = match eval_path {
            Some((p, w, s)) => match self.token_part(p, w, *s, &common) {
                Some(e) => Some(e),
                None => return,
            },
            None => None,
        };
        let need_eval = shape.eval.is_some();
        // Lengths `check` knows: a flat file's, or a parquet file's metadata.
        let counted = train
            .ids()
            .zip(held.as_ref().map_or(Some(None), |h| h.ids().map(Some)));
        if let Some((t, e)) = counted {
            let (tr, er) = split(t, e, *eval);
            if let Some(short) = short(tr, er, seq, need_eval) {
                self.problems.push(crate::diag::Problem::DataMismatch {
                    span: *path_span,
                    path: written.clone(),
                    label: "data named here",
                    message: short.to_string(),
                    help: Some(
                        "use a longer stream, a shorter `seq`, or another `eval` fraction".into(),
                    ),
                });
                return;
            }
        }
        let data = match (train, held) {
            (Opened::File(t), None) => {
                Stream::assemble(t, None, *eval, seq, *sequential, vocab, need_eval)
                    .map(|s| super::Loaded::Stream(std::sync::Arc::new(s)))
            }
            (Opened::File(t), Some(Opened::File(e))) => {
                Stream::assemble(t, Some(e), *eval, seq, *sequential, vocab, need_eval)
                    .map(|s| super::Loaded::Stream(std::sync::Arc::new(s)))
            }
            (t, e) => Ok(super::Loaded::Pending(std::sync::Arc::new(
                super::convert::Pending {
                    train: t.part(),
                    eval: e.map(Opened::part),
                    fraction: *eval,
                    seq,
                    sequential: *sequential,
                    vocab,
                    need_eval,
                },
            ))),
        };
        // (Lengths were checked above.)
        if let Ok(data) = data {
            self.loaded.push(super::TrainData {
                model: model.to_string(),
                data,
            });
        }
    }

    /// A `tokenizer.json`, parsed, whose ids fit the model.
    fn tokenizer(
        &mut self,
        path: &Path,
        written: &str,
        span: crate::source::Span,
        vocab: usize,
    ) -> Option<super::convert::Tok> {
        self.read.push(path.to_path_buf());
        let loaded = match self.files.on_disk(path) {
            Some(p) => super::convert::Tok::load(&p),
            None => Err(not_on_disk(path)),
        };
        match loaded {
            Ok(t) if t.ids > vocab => {
                self.problems.push(crate::diag::Problem::DataOutOfRange {
                    span,
                    message: format!(
                        "`{written}` gives ids up to {}, but the model has a vocabulary of {vocab}",
                        t.ids - 1
                    ),
                    label: format!("{} ids", t.ids),
                    help: format!("widen the model's vocabulary to at least {}", t.ids),
                });
                None
            }
            Ok(t) => Some(t),
            Err(e) => self.unreadable(span, written, &e),
        }
    }

    /// One part of a token source: a flat id file opened and sampled, or a
    /// table or text inspected.
    fn token_part(
        &mut self,
        path: &Path,
        written: &str,
        span: crate::source::Span,
        c: &Common<'_>,
    ) -> Option<Opened> {
        self.read.push(path.to_path_buf());
        let vocab = c.vocab;
        let opened = match self.files.on_disk(path) {
            Some(p) => match super::convert::origin(&p, c.tok.is_some()) {
                Ok(None) => TokenFile::open(&p, c.uint32)
                    .and_then(|f| f.sample(4096, vocab).map(|_| f))
                    .map(|f| Opened::File(std::sync::Arc::new(f))),
                Ok(Some(origin)) => {
                    let r = super::convert::Recipe {
                        origin,
                        column: c.column.map(str::to_string),
                        tokenizer: c.tok.cloned(),
                    };
                    r.inspect().and_then(|seen| {
                        let bad = seen
                            .max
                            .filter(|m| *m >= vocab as i64)
                            .or(seen.min.filter(|m| *m < 0));
                        match bad {
                            Some(id) => Err(StreamError::BadIdIn {
                                path: p.clone(),
                                id,
                                place: super::stream::Place::Row {
                                    row: 0,
                                    position: 0,
                                },
                                index: 0,
                                vocab,
                            }),
                            None => Ok(Opened::Convert(Box::new(r), seen.ids)),
                        }
                    })
                }
                Err(e) => Err(e),
            },
            None => Err(not_on_disk(path)),
        };
        // Where the bad id is, as far as `check` knows it.
        let bad = match &opened {
            Err(StreamError::BadId {
                id, index, byte, ..
            }) => Some((*id, format!(" at token {index} (byte {byte})"))),
            Err(StreamError::BadIdIn { id, .. }) => Some((*id, " (its statistics say)".into())),
            _ => None,
        };
        if let Some((id, at)) = bad {
            self.problems.push(crate::diag::Problem::DataOutOfRange {
                span,
                message: format!(
                    "`{written}` holds id {id}{at}, outside the model's vocabulary of {vocab}"
                ),
                label: format!("ids below {vocab} expected"),
                help: format!("tokenize with a vocabulary of at most {vocab}, or widen the model"),
            });
            return None;
        }
        match opened {
            Ok(o) => Some(o),
            Err(e) => self.unreadable(span, written, &e),
        }
    }
}

impl super::Cx<'_> {
    /// E0304 for a part of a token source that cannot be used.
    fn unreadable<T>(
        &mut self,
        span: crate::source::Span,
        written: &str,
        e: &StreamError,
    ) -> Option<T> {
        self.problems.push(crate::diag::Problem::DataUnreadable {
            span,
            path: written.to_string(),
            reason: e.to_string(),
        });
        None
    }
}

fn not_on_disk(path: &Path) -> StreamError {
    StreamError::Io {
        path: path.to_path_buf(),
        error: std::io::Error::other(
            "a token stream is read from the disk, and this file is not on it",
        ),
    }
}
