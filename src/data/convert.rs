//! Token sources that are not flat id files: parquet files, Arrow IPC files and
//! streams (a Hugging Face `datasets` directory from `save_to_disk`), and text
//! turned into ids by a Hugging Face `tokenizer.json`. `shardc check` reads
//! their schemas, metadata and tokenizer only; `shardc run` converts each once
//! into a flat little-endian `uint32` stream under the run directory's
//! `tokens/`, a record batch or a few hundred kilobytes of text at a time, and
//! then reads it by position like any `.bin`. The stream is named by a hash of
//! the sources (path, size, inode, modification time), the column and the
//! tokenizer's bytes, so a changed source is converted again and an unchanged
//! one is reused. A conversion that fails leaves nothing behind.

use super::stream::{Place, Res, StreamError, TableProblem, TokenFile};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::Array;
use arrow_schema::{DataType, Schema};
use sha2::Digest;
use std::io::{Read, Seek, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a converted source's ids come from.
#[derive(Clone, Debug)]
pub enum Origin {
    /// Parquet files, read in order.
    Parquet(Vec<PathBuf>),
    /// Arrow IPC files or streams (a `datasets` directory's shards), in order.
    Arrow(Vec<PathBuf>),
    /// A UTF-8 text file (needs a tokenizer).
    Text(PathBuf),
}

/// The conversion format; a new one is a new name for every cached stream.
const FORMAT: &str = "shardc tokens 1";
/// Text is tokenized in pieces of about this many bytes, each cut after a
/// newline that a non-space character follows.
const PIECE: usize = 256 << 10;
/// A piece with no such newline is cut at a character boundary past this.
const MAX_PIECE: usize = 16 << 20;
/// Pieces (or rows) tokenized together, in parallel.
const PIECES: usize = 8;
/// Rows of a parquet file per record batch.
const ROWS: usize = 8192;
/// The largest `tokenizer.json` read.
const TOKENIZER_CAP: u64 = 1 << 30;

/// A Hugging Face tokenizer, loaded, and the hash of its file.
#[derive(Clone)]
pub struct Tok {
    pub path: PathBuf,
    pub tokenizer: Arc<tokenizers::Tokenizer>,
    /// One more than the largest id it gives (added tokens included).
    pub ids: usize,
    digest: [u8; 32],
}

impl std::fmt::Debug for Tok {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tok({}, {} ids)", self.path.display(), self.ids)
    }
}

impl Tok {
    /// Read and parse a `tokenizer.json`.
    pub fn load(path: &Path) -> Res<Tok> {
        let bytes =
            crate::files::read_regular(path, TOKENIZER_CAP).map_err(|error| StreamError::Io {
                path: path.to_path_buf(),
                error,
            })?;
        let tokenizer =
            tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| StreamError::Tokenizer {
                path: path.to_path_buf(),
                why: e.to_string(),
            })?;
        let ids = tokenizer
            .get_vocab(true)
            .values()
            .max()
            .map_or(0, |m| *m as usize + 1);
        Ok(Tok {
            path: path.to_path_buf(),
            tokenizer: Arc::new(tokenizer),
            ids,
            digest: sha2::Sha256::digest(&bytes).into(),
        })
    }

    /// `texts` as ids, without special tokens (nanoGPT's `encode_ordinary`),
    /// tokenized in parallel, in order.
    fn encode(&self, texts: Vec<&str>, sink: &mut Sink, place: Place) -> Res<()> {
        let encoded = self
            .tokenizer
            .encode_batch_fast(texts, false)
            .map_err(|e| StreamError::Tokenizer {
                path: self.path.clone(),
                why: e.to_string(),
            })?;
        for e in encoded {
            for id in e.get_ids() {
                sink.id(i64::from(*id), || place)?;
            }
        }
        Ok(())
    }
}

/// A source converted on `run`.
#[derive(Clone, Debug)]
pub struct Recipe {
    pub origin: Origin,
    pub column: Option<String>,
    pub tokenizer: Option<Tok>,
}

/// What `check` learns of a recipe without converting it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Inspected {
    /// Ids the parquet metadata counts (an upper bound: empty lists count one).
    pub ids: Option<u64>,
    /// The largest and the smallest id the parquet statistics record.
    pub max: Option<i64>,
    pub min: Option<i64>,
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> StreamError + '_ {
    move |error| StreamError::Io {
        path: path.to_path_buf(),
        error,
    }
}

fn table(path: &Path, problem: TableProblem) -> StreamError {
    StreamError::Table {
        path: path.to_path_buf(),
        problem,
    }
}

/// Which source `path` is: `None` for a flat id file (`.bin`, `.npy`), read
/// as it is.
pub fn origin(path: &Path, tokenizer: bool) -> Res<Option<Origin>> {
    let meta = std::fs::metadata(path).map_err(io(path))?;
    if meta.is_dir() {
        return dir_origin(path).map(Some);
    }
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    Ok(match ext.as_str() {
        "parquet" => Some(Origin::Parquet(vec![path.to_path_buf()])),
        "arrow" | "feather" | "ipc" => Some(Origin::Arrow(vec![path.to_path_buf()])),
        "bin" | "npy" if tokenizer => {
            return Err(table(path, TableProblem::IdsWithTokenizer(None)));
        }
        _ if tokenizer => Some(Origin::Text(path.to_path_buf())),
        // Text read as raw ids would train on its bytes in pairs.
        "txt" | "text" | "md" | "json" | "jsonl" | "csv" | "tsv" => {
            return Err(table(path, TableProblem::TextWithoutTokenizer));
        }
        _ => None,
    })
}

/// A directory: `datasets`' `save_to_disk` (its `state.json` names the
/// shards in order), or `.arrow` or `.parquet` files in name order.
fn dir_origin(dir: &Path) -> Res<Origin> {
    let state = dir.join("state.json");
    if state.is_file() {
        let bytes = crate::files::read_regular(&state, 64 << 20).map_err(io(&state))?;
        let v: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| table(&state, TableProblem::State(e.to_string())))?;
        let names: Option<Vec<&str>> = v["_data_files"]
            .as_array()
            .map(|a| a.iter().filter_map(|f| f["filename"].as_str()).collect());
        let names = names
            .filter(|n| !n.is_empty())
            .ok_or_else(|| table(&state, TableProblem::State("no `_data_files`".into())))?;
        let mut files = Vec::new();
        for n in names {
            // Only files of the directory itself.
            if n.contains('/') || n.starts_with('.') {
                return Err(table(&state, TableProblem::State(format!("names `{n}`"))));
            }
            files.push(dir.join(n));
        }
        return Ok(Origin::Arrow(files));
    }
    let mut all: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    all.sort();
    let with = |ext: &str| -> Vec<PathBuf> {
        all.iter()
            .filter(|p| p.extension().is_some_and(|e| e == ext))
            .cloned()
            .collect()
    };
    let arrow = with("arrow");
    if !arrow.is_empty() {
        return Ok(Origin::Arrow(arrow));
    }
    let parquet = with("parquet");
    if !parquet.is_empty() {
        return Ok(Origin::Parquet(parquet));
    }
    Err(table(dir, TableProblem::EmptyDir))
}

/// What a column holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Ids,
    Lists,
    Strings,
}

fn kind(dt: &DataType) -> Option<Kind> {
    match dt {
        d if d.is_integer() => Some(Kind::Ids),
        DataType::List(f) | DataType::LargeList(f) if f.data_type().is_integer() => {
            Some(Kind::Lists)
        }
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Some(Kind::Strings),
        _ => None,
    }
}

/// A column type as pyarrow writes it: `list<float64>`, `int64`, `string`.
fn type_name(dt: &DataType) -> String {
    match dt {
        DataType::List(f) | DataType::LargeList(f) => format!("list<{}>", type_name(f.data_type())),
        DataType::Utf8 => "string".into(),
        other => other.to_string().to_lowercase(),
    }
}

/// The column to read: the one named, or the only one, or `input_ids`,
/// `tokens` or `text`; its index and what it holds.
fn pick(schema: &Schema, want: Option<&str>, tok: bool, path: &Path) -> Res<(usize, Kind)> {
    let names: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
    let found = match want {
        Some(w) => names.iter().position(|n| n == w),
        None if names.len() == 1 => Some(0),
        None => ["input_ids", "tokens", "text"]
            .iter()
            .find_map(|w| names.iter().position(|n| n == w)),
    };
    let Some(i) = found else {
        return Err(table(
            path,
            TableProblem::NoColumn {
                want: want.map(str::to_string),
                has: names,
            },
        ));
    };
    let field = &schema.fields()[i];
    let k = kind(field.data_type()).ok_or_else(|| {
        table(
            path,
            TableProblem::Type {
                column: field.name().clone(),
                ty: type_name(field.data_type()),
            },
        )
    })?;
    match (k, tok) {
        (Kind::Strings, false) => Err(table(
            path,
            TableProblem::NeedsTokenizer(field.name().clone()),
        )),
        (Kind::Ids | Kind::Lists, true) => Err(table(
            path,
            TableProblem::IdsWithTokenizer(Some(field.name().clone())),
        )),
        _ => Ok((i, k)),
    }
}

fn parquet_builder(
    path: &Path,
) -> Res<parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder<std::fs::File>> {
    let f = crate::files::open_regular(path).map_err(io(path))?;
    parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
        .map_err(|e| table(path, TableProblem::Read(e.to_string())))
}

/// Counts the bytes an Arrow stream has read, for the progress bar.
struct Counting<R> {
    inner: R,
    read: Arc<std::sync::atomic::AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(n)
    }
}

type Batches = Box<dyn Iterator<Item = Result<arrow_array::RecordBatch, String>>>;

/// An Arrow IPC file (`ARROW1` magic) or stream: its schema and batches.
fn arrow_reader(
    path: &Path,
    read: Arc<std::sync::atomic::AtomicU64>,
) -> Res<(Arc<Schema>, Batches)> {
    let mut f = crate::files::open_regular(path).map_err(io(path))?;
    let mut magic = [0u8; 6];
    let n = f.read(&mut magic).map_err(io(path))?;
    f.rewind().map_err(io(path))?;
    let bad = |e: arrow_schema::ArrowError| table(path, TableProblem::Read(e.to_string()));
    if n == 6 && &magic == b"ARROW1" {
        let r = arrow_ipc::reader::FileReader::try_new(std::io::BufReader::new(f), None)
            .map_err(bad)?;
        let schema = r.schema();
        return Ok((schema, Box::new(r.map(|b| b.map_err(|e| e.to_string())))));
    }
    let counted = Counting { inner: f, read };
    let r = arrow_ipc::reader::StreamReader::try_new(std::io::BufReader::new(counted), None)
        .map_err(bad)?;
    let schema = r.schema();
    Ok((schema, Box::new(r.map(|b| b.map_err(|e| e.to_string())))))
}

/// `f`, with a panic of a reader on a malformed file (the parquet and Arrow
/// crates assert some invariants of what they decode) as an error naming the
/// file instead of the end of shardc.
fn guarded<T>(path: &Path, f: impl FnOnce() -> Res<T>) -> Res<T> {
    // The panic becomes the error: the default hook's message is not printed
    // for it (other threads' panics still are).
    static HOOK: std::sync::Once = std::sync::Once::new();
    thread_local!(static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    HOOK.call_once(|| {
        let before = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(std::cell::Cell::get) {
                before(info);
            }
        }));
    });
    QUIET.with(|q| q.set(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET.with(|q| q.set(false));
    r.unwrap_or_else(|p| {
        let why = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "its reader failed".into());
        Err(table(path, TableProblem::Read(format!("malformed: {why}"))))
    })
}

impl Recipe {
    /// The first file, for messages about the whole source.
    fn first(&self) -> &Path {
        match &self.origin {
            Origin::Parquet(f) | Origin::Arrow(f) => {
                f.first().map_or(Path::new(""), PathBuf::as_path)
            }
            Origin::Text(p) => p,
        }
    }

    /// What `check` reads: each file's schema (and parquet metadata), the
    /// column's type; nothing of the data.
    pub fn inspect(&self) -> Res<Inspected> {
        guarded(self.first(), || self.inspect_unguarded())
    }

    fn inspect_unguarded(&self) -> Res<Inspected> {
        let tok = self.tokenizer.is_some();
        let mut out = Inspected::default();
        match &self.origin {
            Origin::Text(p) => {
                crate::files::open_regular(p).map_err(io(p))?;
            }
            Origin::Arrow(files) => {
                for p in files {
                    let (schema, _) = arrow_reader(p, Default::default())?;
                    pick(&schema, self.column.as_deref(), tok, p)?;
                }
            }
            Origin::Parquet(files) => {
                let mut ids = 0u64;
                for p in files {
                    let b = parquet_builder(p)?;
                    let (i, k) = pick(b.schema(), self.column.as_deref(), tok, p)?;
                    let name = b.schema().fields()[i].name().clone();
                    for rg in b.metadata().row_groups() {
                        for c in rg.columns() {
                            if c.column_path().parts().first() != Some(&name) {
                                continue;
                            }
                            ids += c.num_values().max(0) as u64;
                            if k == Kind::Strings {
                                continue;
                            }
                            use parquet::file::statistics::Statistics as S;
                            let (lo, hi) = match c.statistics() {
                                Some(S::Int32(s)) => (
                                    s.min_opt().map(|v| i64::from(*v)),
                                    s.max_opt().map(|v| i64::from(*v)),
                                ),
                                Some(S::Int64(s)) => (s.min_opt().copied(), s.max_opt().copied()),
                                _ => (None, None),
                            };
                            out.max = out.max.max(hi);
                            out.min = match (out.min, lo) {
                                (Some(a), Some(b)) => Some(a.min(b)),
                                (a, b) => a.or(b),
                            };
                        }
                    }
                }
                // A string column's values are rows, not ids.
                let strings = files.first().and_then(|p| {
                    let b = parquet_builder(p).ok()?;
                    pick(b.schema(), self.column.as_deref(), tok, p)
                        .ok()
                        .map(|(_, k)| k == Kind::Strings)
                });
                out.ids = (strings != Some(true)).then_some(ids);
            }
        }
        Ok(out)
    }

    /// The sources' identity: what names the converted stream.
    fn key(&self) -> Res<String> {
        let mut h = sha2::Sha256::new();
        h.update(FORMAT.as_bytes());
        let files: Vec<&PathBuf> = match &self.origin {
            Origin::Parquet(f) | Origin::Arrow(f) => f.iter().collect(),
            Origin::Text(p) => vec![p],
        };
        for p in files {
            let m = std::fs::metadata(p).map_err(io(p))?;
            let abs = std::fs::canonicalize(p).map_err(io(p))?;
            h.update(abs.as_os_str().as_encoded_bytes());
            for v in [m.len(), m.ino(), m.mtime() as u64, m.mtime_nsec() as u64] {
                h.update(v.to_le_bytes());
            }
        }
        h.update(self.column.as_deref().unwrap_or("").as_bytes());
        h.update([0]);
        if let Some(t) = &self.tokenizer {
            h.update(t.digest);
        }
        let d = h.finalize();
        Ok(d.iter().take(8).map(|b| format!("{b:02x}")).collect())
    }

    /// What the source is called: its file, or the directory of its shards.
    pub fn source(&self) -> &Path {
        match &self.origin {
            Origin::Parquet(f) | Origin::Arrow(f) if f.len() > 1 => {
                f[0].parent().unwrap_or(Path::new("tokens"))
            }
            Origin::Parquet(f) | Origin::Arrow(f) => {
                f.first().map_or(Path::new("tokens"), PathBuf::as_path)
            }
            Origin::Text(p) => p.as_path(),
        }
    }

    /// The source's name for the stream's file.
    fn stem(&self) -> String {
        let s: String = self
            .source()
            .file_stem()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .take(64)
            .collect();
        if s.is_empty() {
            "tokens".into()
        } else {
            s
        }
    }

    /// The converted stream under `dir/tokens/`: reused when a complete one
    /// of the same sources is there, else written (to a temporary file that
    /// replaces nothing until it is whole). `progress` sees (done, all) of
    /// the sources' bytes, or rows for parquet. Ids at or above `vocab`
    /// stop the conversion with their place.
    pub fn convert(
        &self,
        dir: &Path,
        vocab: usize,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Res<(TokenFile, bool)> {
        let tokens = dir.join("tokens");
        std::fs::create_dir_all(&tokens).map_err(io(&tokens))?;
        let name = format!("{}-{}", self.stem(), self.key()?);
        let out = tokens.join(format!("{name}.bin"));
        let note = tokens.join(format!("{name}.json"));
        if let Some(n) = complete(&out, &note) {
            let f = TokenFile::open(&out, true)?;
            if f.len == n {
                return Ok((f, true));
            }
        }
        let tmp = tokens.join(format!(".{name}.{}.partial", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(io(&tmp))?;
        let mut sink = Sink {
            out: std::io::BufWriter::with_capacity(1 << 20, file),
            n: 0,
            vocab,
            path: PathBuf::new(),
            tmp: tmp.clone(),
        };
        let written =
            guarded(self.first(), || self.write(&mut sink, progress)).and_then(|_| sink.finish());
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::rename(&tmp, &out)
            .map_err(io(&out))
            .inspect_err(|_| {
                let _ = std::fs::remove_file(&tmp);
            })?;
        let about = serde_json::json!({
            "ids": sink.n,
            "format": FORMAT,
            "column": self.column,
            "tokenizer": self.tokenizer.as_ref().map(|t| t.path.display().to_string()),
        });
        crate::files::write_replace(&note, about.to_string().as_bytes()).map_err(io(&note))?;
        Ok((TokenFile::open(&out, true)?, false))
    }

    fn write(&self, sink: &mut Sink, progress: &mut dyn FnMut(u64, u64)) -> Res<()> {
        match &self.origin {
            Origin::Text(p) => {
                let tok = self
                    .tokenizer
                    .as_ref()
                    .ok_or_else(|| table(p, TableProblem::NeedsTokenizer(String::new())))?;
                sink.path = p.clone();
                text(p, tok, sink, progress)
            }
            Origin::Parquet(files) => {
                let mut all = 0u64;
                for p in files {
                    all += parquet_builder(p)?
                        .metadata()
                        .file_metadata()
                        .num_rows()
                        .max(0) as u64;
                }
                let mut done = 0u64;
                for p in files {
                    sink.path = p.clone();
                    let b = parquet_builder(p)?;
                    let (i, k) = pick(
                        b.schema(),
                        self.column.as_deref(),
                        self.tokenizer.is_some(),
                        p,
                    )?;
                    let mask = parquet::arrow::ProjectionMask::roots(b.parquet_schema(), [i]);
                    let reader = b
                        .with_projection(mask)
                        .with_batch_size(ROWS)
                        .build()
                        .map_err(|e| table(p, TableProblem::Read(e.to_string())))?;
                    let mut row = 0u64;
                    for batch in reader {
                        let batch =
                            batch.map_err(|e| table(p, TableProblem::Read(e.to_string())))?;
                        let col = batch.column(0);
                        rows(col.as_ref(), k, row, self.tokenizer.as_ref(), sink)?;
                        row += batch.num_rows() as u64;
                        done += batch.num_rows() as u64;
                        progress(done, all);
                    }
                }
                Ok(())
            }
            Origin::Arrow(files) => {
                let mut all = 0u64;
                for p in files {
                    all += std::fs::metadata(p).map_err(io(p))?.len();
                }
                let mut before = 0u64;
                for p in files {
                    sink.path = p.clone();
                    let read: Arc<std::sync::atomic::AtomicU64> = Default::default();
                    let (schema, batches) = arrow_reader(p, read.clone())?;
                    let (i, k) =
                        pick(&schema, self.column.as_deref(), self.tokenizer.is_some(), p)?;
                    let mut row = 0u64;
                    for batch in batches {
                        let batch = batch.map_err(|e| table(p, TableProblem::Read(e)))?;
                        rows(
                            batch.column(i).as_ref(),
                            k,
                            row,
                            self.tokenizer.as_ref(),
                            sink,
                        )?;
                        row += batch.num_rows() as u64;
                        progress(
                            before + read.load(std::sync::atomic::Ordering::Relaxed),
                            all,
                        );
                    }
                    before += std::fs::metadata(p).map_err(io(p))?.len();
                }
                Ok(())
            }
        }
    }
}

/// One part of a token source: a flat id file, or a source to convert.
#[derive(Clone, Debug)]
pub enum Part {
    File(Arc<TokenFile>),
    Convert(Box<Recipe>),
}

/// A token source with a part to convert before the run reads it.
#[derive(Clone, Debug)]
pub struct Pending {
    pub train: Part,
    /// The held-out part, when not the tail of `train`.
    pub eval: Option<Part>,
    pub fraction: f64,
    pub seq: usize,
    pub sequential: bool,
    pub vocab: usize,
    /// Whether `eval` reads the held-out part.
    pub need_eval: bool,
}

/// What a conversion in progress tells: the source, whether it is reused,
/// and (done, all) of its work.
pub enum Progress<'a> {
    Start {
        source: &'a Path,
        tokenize: bool,
    },
    Step(u64, u64),
    Done {
        stream: &'a Path,
        ids: u64,
        reused: bool,
    },
}

impl Pending {
    /// Convert what needs it into `dir/tokens/` and open the stream.
    pub fn prepare(
        &self,
        dir: &Path,
        progress: &mut dyn FnMut(Progress<'_>),
    ) -> Res<super::stream::Stream> {
        let mut open = |part: &Part| -> Res<Arc<TokenFile>> {
            match part {
                Part::File(f) => Ok(f.clone()),
                Part::Convert(r) => {
                    progress(Progress::Start {
                        source: r.source(),
                        tokenize: r.tokenizer.is_some(),
                    });
                    let (f, reused) =
                        r.convert(dir, self.vocab, &mut |d, a| progress(Progress::Step(d, a)))?;
                    progress(Progress::Done {
                        stream: &f.path,
                        ids: f.len,
                        reused,
                    });
                    Ok(Arc::new(f))
                }
            }
        };
        let train = open(&self.train)?;
        let eval = self.eval.as_ref().map(&mut open).transpose()?;
        let path = train.path.clone();
        super::stream::Stream::assemble(
            train,
            eval,
            self.fraction,
            self.seq,
            self.sequential,
            self.vocab,
            self.need_eval,
        )
        .map_err(|short| StreamError::Short { path, short })
    }
}

/// The id count a complete conversion recorded, when its stream is there.
fn complete(out: &Path, note: &Path) -> Option<u64> {
    let bytes = crate::files::read_regular(note, 1 << 20).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    if v["format"].as_str() != Some(FORMAT) || !out.is_file() {
        return None;
    }
    v["ids"].as_u64()
}

/// The converted stream being written.
struct Sink {
    out: std::io::BufWriter<std::fs::File>,
    n: u64,
    vocab: usize,
    /// The source file being read, for errors.
    path: PathBuf,
    tmp: PathBuf,
}

impl Sink {
    fn id(&mut self, id: i64, place: impl FnOnce() -> Place) -> Res<()> {
        if id < 0 || id as u64 >= self.vocab as u64 {
            return Err(StreamError::BadIdIn {
                path: self.path.clone(),
                id,
                place: place(),
                index: self.n,
                vocab: self.vocab,
            });
        }
        self.out
            .write_all(&(id as u32).to_le_bytes())
            .map_err(io(&self.tmp))?;
        self.n += 1;
        Ok(())
    }

    fn finish(&mut self) -> Res<()> {
        self.out.flush().map_err(io(&self.tmp))?;
        self.out.get_ref().sync_all().map_err(io(&self.tmp))
    }
}

/// Each integer of a primitive array to `f` (index, value; `None` a null),
/// or `None` when `a` is not an integer array.
fn each_int(a: &dyn Array, f: &mut dyn FnMut(usize, Option<i64>) -> Res<()>) -> Option<Res<()>> {
    macro_rules! try_type {
        ($($t:ty),*) => {$(
            if let Some(p) = a.as_primitive_opt::<$t>() {
                for (i, v) in p.iter().enumerate() {
                    if let Err(e) = f(i, v.map(|x| x as i64)) {
                        return Some(Err(e));
                    }
                }
                return Some(Ok(()));
            }
        )*};
    }
    try_type!(
        Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type
    );
    None
}

/// A record batch's column, rows `row0..`, into the stream.
fn rows(col: &dyn Array, k: Kind, row0: u64, tok: Option<&Tok>, sink: &mut Sink) -> Res<()> {
    let path = sink.path.clone();
    let null = |row: u64, position: Option<u64>| table(&path, TableProblem::Null { row, position });
    let unreadable = || {
        table(
            &path,
            TableProblem::Read("a column of an unexpected layout".into()),
        )
    };
    match k {
        Kind::Ids => each_int(col, &mut |i, v| {
            let row = row0 + i as u64;
            let v = v.ok_or_else(|| null(row, None))?;
            sink.id(v, || Place::Row { row, position: 0 })
        })
        .unwrap_or_else(|| Err(unreadable())),
        Kind::Lists => {
            let (offsets, values): (Vec<usize>, _) = if let Some(l) = col.as_list_opt::<i32>() {
                (
                    l.value_offsets().iter().map(|o| *o as usize).collect(),
                    l.values().clone(),
                )
            } else if let Some(l) = col.as_list_opt::<i64>() {
                (
                    l.value_offsets().iter().map(|o| *o as usize).collect(),
                    l.values().clone(),
                )
            } else {
                return Err(unreadable());
            };
            let (lo, hi) = (
                offsets.first().copied().unwrap_or(0),
                offsets.last().copied().unwrap_or(0),
            );
            let vals = values.slice(lo, hi.saturating_sub(lo));
            // The row of flat value `i` (offsets ascend).
            let row_of = |i: usize| offsets.partition_point(|o| *o <= lo + i).saturating_sub(1);
            each_int(vals.as_ref(), &mut |i, v| {
                let r = row_of(i);
                let row = row0 + r as u64;
                if col.is_null(r) {
                    return Ok(());
                }
                let position = (lo + i - offsets[r]) as u64;
                let v = v.ok_or_else(|| null(row, Some(position)))?;
                sink.id(v, || Place::Row { row, position })
            })
            .unwrap_or_else(|| Err(unreadable()))
        }
        Kind::Strings => {
            let tok =
                tok.ok_or_else(|| table(&path, TableProblem::NeedsTokenizer(String::new())))?;
            let texts: Vec<(u64, &str)> = if let Some(s) = col.as_string_opt::<i32>() {
                s.iter()
                    .enumerate()
                    .filter_map(|(i, t)| Some((i as u64, t?)))
                    .collect()
            } else if let Some(s) = col.as_string_opt::<i64>() {
                s.iter()
                    .enumerate()
                    .filter_map(|(i, t)| Some((i as u64, t?)))
                    .collect()
            } else if let Some(s) = col.as_string_view_opt() {
                s.iter()
                    .enumerate()
                    .filter_map(|(i, t)| Some((i as u64, t?)))
                    .collect()
            } else {
                return Err(unreadable());
            };
            for chunk in texts.chunks(64) {
                let row = row0 + chunk.first().map_or(0, |c| c.0);
                tok.encode(
                    chunk.iter().map(|c| c.1).collect(),
                    sink,
                    Place::Row { row, position: 0 },
                )?;
            }
            Ok(())
        }
    }
}

/// Where a piece of text may be cut: after the last newline that a
/// non-space character follows (byte-level BPE gives the same ids either
/// way), else, in a piece past [`MAX_PIECE`], at the last character boundary.
fn cut(buf: &[u8], eof: bool) -> Option<usize> {
    if eof {
        return Some(buf.len());
    }
    let after_newline = buf
        .windows(2)
        .rposition(|w| w[0] == b'\n' && !w[1].is_ascii_whitespace())
        .map(|i| i + 1);
    match after_newline {
        Some(c) if c > 0 => Some(c),
        _ if buf.len() >= MAX_PIECE => {
            let mut c = buf.len();
            while c > 0 && (buf[c - 1] & 0xC0) == 0x80 {
                c -= 1;
            }
            Some(c.saturating_sub(1).max(1))
        }
        _ => None,
    }
}

/// A text file tokenized in pieces, [`PIECES`] at a time.
fn text(path: &Path, tok: &Tok, sink: &mut Sink, progress: &mut dyn FnMut(u64, u64)) -> Res<()> {
    let mut f = crate::files::open_regular(path).map_err(io(path))?;
    let all = f.metadata().map_err(io(path))?.len();
    let text_err = |e: super::TextError| StreamError::Text {
        path: path.to_path_buf(),
        error: e,
    };
    let mut buf: Vec<u8> = Vec::new();
    let mut at = 0u64;
    let mut pieces: Vec<(u64, String)> = Vec::new();
    let mut chunk = vec![0u8; PIECE];
    loop {
        let n = f.read(&mut chunk).map_err(io(path))?;
        if let Some(i) = memchr::memchr(0, &chunk[..n]) {
            return Err(text_err(super::TextError::Nul(at + (buf.len() + i) as u64)));
        }
        buf.extend_from_slice(&chunk[..n]);
        let eof = n == 0;
        while buf.len() >= PIECE || (eof && !buf.is_empty()) {
            let Some(c) = cut(&buf, eof) else { break };
            let piece: Vec<u8> = buf.drain(..c).collect();
            let s = String::from_utf8(piece).map_err(|e| {
                text_err(super::TextError::NotUtf8(
                    at + e.utf8_error().valid_up_to() as u64,
                ))
            })?;
            pieces.push((at, s));
            at += c as u64;
            if pieces.len() == PIECES {
                flush(tok, &mut pieces, sink)?;
                progress(at, all);
            }
        }
        if eof {
            break;
        }
    }
    flush(tok, &mut pieces, sink)?;
    progress(all, all);
    Ok(())
}

fn flush(tok: &Tok, pieces: &mut Vec<(u64, String)>, sink: &mut Sink) -> Res<()> {
    let Some(first) = pieces.first().map(|p| p.0) else {
        return Ok(());
    };
    tok.encode(
        pieces.iter().map(|p| p.1.as_str()).collect(),
        sink,
        Place::Byte(first),
    )?;
    pieces.clear();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::cut;

    #[test]
    fn text_is_cut_after_a_newline_before_a_word() {
        assert_eq!(cut(b"abc\n\n  def\nghi\n", false), Some(11));
        assert_eq!(cut(b"abc\n\n", false), None);
        assert_eq!(cut(b"abc", true), Some(3));
    }
}
