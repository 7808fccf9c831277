//! Stage 9 (data): the training data. Each `train` names a data source; the files it reads
//! (`arrays(path)`, `text(path)`, or `--data PATH`) are read here, once, and checked
//! against the lowered program's input and label types, so a wrong shape, dtype or
//! an id outside the vocabulary is a diagnostic from `shardc check`, not a crash
//! (or a silent zero embedding) in step 1. `shardc run` trains on exactly what this
//! stage loaded.

pub mod convert;
pub mod stream;

use crate::arrays::Array;
use crate::diag::{Diagnostic, Problem};
use crate::files::Files;
use crate::source::Span;
use crate::spec::{self, Spec};
use crate::spmd::{self, Op};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The built-in corpus (public domain), shipped inside the binary.
pub const SHAKESPEARE: &str = include_str!("../data/tinyshakespeare.txt");

/// Word-level tokens as seed 000's loader forms them: lowercase, split on
/// non-letters; vocabulary = the V−1 most frequent words (ties alphabetical) plus
/// id 0 for everything else.
pub fn shakespeare_words(vocab: usize) -> Vec<u32> {
    words(SHAKESPEARE, vocab)
}

/// Word ids of any text, formed as [`shakespeare_words`] forms them.
pub fn words(text: &str, vocab: usize) -> Vec<u32> {
    let mut w = Words::default();
    w.feed(text);
    w.finish(vocab)
}

/// The longest word kept as itself; a longer run of letters is the unknown word
/// (id 0), so one enormous "word" (a file of one line) costs no memory.
pub const MAX_WORD: usize = 256;
/// The largest text `text(...)` reads: its word ids are held in memory (4 bytes
/// a word). Bigger corpora belong in array files.
pub const TEXT_CAP: u64 = 2 << 30;
/// How much of a text is read at a time.
const CHUNK: usize = 1 << 20;

/// Words counted as the text goes by, in one pass: each distinct word's index
/// (first seen first), its count, and the text as those indices.
#[derive(Default)]
pub struct Words {
    index: HashMap<String, u32>,
    counts: Vec<usize>,
    seq: Vec<u32>,
    word: String,
    long: bool,
}

/// A word longer than [`MAX_WORD`], in `Words::seq`.
const LONG: u32 = u32::MAX;

impl Words {
    /// More text: lowercased as `str::to_lowercase` does it, split on anything
    /// that is not an ASCII letter. A word may continue into the next call.
    pub fn feed(&mut self, text: &str) {
        for c in text.chars() {
            if c.is_ascii() {
                self.letter(c);
            } else {
                for l in c.to_lowercase() {
                    self.letter(l);
                }
            }
        }
    }

    fn letter(&mut self, c: char) {
        if !c.is_ascii_alphabetic() {
            self.end();
        } else if self.word.len() < MAX_WORD {
            self.word.push(c.to_ascii_lowercase());
        } else {
            self.long = true;
        }
    }

    fn end(&mut self) {
        if self.long {
            self.seq.push(LONG);
        } else if !self.word.is_empty() {
            let i = match self.index.get(self.word.as_str()) {
                Some(i) => *i,
                None => {
                    let i = self.counts.len() as u32;
                    self.index.insert(self.word.clone(), i);
                    self.counts.push(0);
                    i
                }
            };
            self.counts[i as usize] += 1;
            self.seq.push(i);
        }
        self.word.clear();
        self.long = false;
    }

    /// The ids: the `vocab − 1` most frequent words (ties alphabetical) are
    /// 1, 2, …; every other word is 0.
    pub fn finish(mut self, vocab: usize) -> Vec<u32> {
        self.end();
        let mut words: Vec<(&str, u32)> =
            self.index.iter().map(|(w, i)| (w.as_str(), *i)).collect();
        let counts = &self.counts;
        words.sort_by(|a, b| {
            counts[b.1 as usize]
                .cmp(&counts[a.1 as usize])
                .then(a.0.cmp(b.0))
        });
        let mut id = vec![0u32; counts.len()];
        for (rank, (_, i)) in words.iter().take(vocab.saturating_sub(1)).enumerate() {
            id[*i as usize] = rank as u32 + 1;
        }
        drop(words);
        let mut seq = self.seq;
        for x in &mut seq {
            *x = if *x == LONG { 0 } else { id[*x as usize] };
        }
        seq
    }
}

/// Why a text corpus could not be read.
#[derive(Debug)]
pub enum TextError {
    Io(std::io::Error),
    /// Bytes that are not UTF-8, at this offset.
    NotUtf8(u64),
    /// A NUL byte, at this offset: a binary file (or a sparse one), not text.
    Nul(u64),
    TooBig(u64),
}

impl std::fmt::Display for TextError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TextError::Io(e) if e.kind() == std::io::ErrorKind::NotFound => {
                write!(f, "no such file")
            }
            TextError::Io(e) => write!(f, "{e}"),
            TextError::NotUtf8(at) => write!(f, "not UTF-8 text (byte {at})"),
            TextError::Nul(at) => write!(f, "not text: a NUL byte at byte {at}"),
            TextError::TooBig(n) => write!(
                f,
                "{n} bytes, more than the {} GiB `text(...)` reads (it holds every word's id in memory); save bigger corpora as token arrays for `arrays(...)`",
                TEXT_CAP >> 30
            ),
        }
    }
}

/// The words of a text read in pieces of [`CHUNK`] bytes: the text itself is
/// never held, only its distinct words and the text as their indices.
pub fn words_from(r: &mut dyn std::io::Read) -> Result<Words, TextError> {
    let mut w = Words::default();
    let mut buf = vec![0u8; CHUNK];
    let (mut held, mut at) = (0usize, 0u64);
    loop {
        let n = r.read(&mut buf[held..]).map_err(TextError::Io)?;
        if at + (held + n) as u64 > TEXT_CAP {
            return Err(TextError::TooBig(at + (held + n) as u64));
        }
        if let Some(i) = memchr::memchr(0, &buf[held..held + n]) {
            return Err(TextError::Nul(at + (held + i) as u64));
        }
        let end = held + n;
        let upto = match std::str::from_utf8(&buf[..end]) {
            Ok(t) => {
                w.feed(t);
                end
            }
            // A character cut at the end of this piece waits for the next.
            Err(e) if e.error_len().is_none() && n > 0 => {
                let ok = e.valid_up_to();
                w.feed(std::str::from_utf8(&buf[..ok]).unwrap_or_default());
                ok
            }
            Err(e) => return Err(TextError::NotUtf8(at + e.valid_up_to() as u64)),
        };
        buf.copy_within(upto..end, 0);
        held = end - upto;
        at += upto as u64;
        if n == 0 {
            return Ok(w);
        }
    }
}

/// Character ids: the index of each character among the corpus's distinct
/// characters in code-point order (65 of them, as in nanoGPT's character model).
pub fn shakespeare_chars() -> Vec<u32> {
    let vocab = char_vocab(SHAKESPEARE);
    SHAKESPEARE
        .chars()
        .map(|c| vocab.binary_search(&c).map_or(0, |i| i as u32))
        .collect()
}

/// Distinct characters of the built-in corpus: the vocabulary of `shakespeare_chars`.
pub fn char_vocab(text: &str) -> Vec<char> {
    let mut v: Vec<char> = text.chars().collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Inputs in forward-parameter order, labels, and the held-out pair for `eval`.
#[derive(Clone, Debug)]
pub struct ArrayData {
    pub inputs: Vec<Array>,
    pub labels: Array,
    /// The loss function's weights, when it takes them (the array named
    /// after its third parameter).
    pub weights: Option<Array>,
    /// The held-out inputs, labels and weights.
    pub eval: Option<(Vec<Array>, Array, Option<Array>)>,
}

/// What one `train` reads from files.
#[derive(Clone, Debug)]
pub enum Loaded {
    Arrays(Box<ArrayData>),
    /// Word ids of a text file (as `shakespeare_words`) and the window length.
    Text {
        ids: Vec<u32>,
        seq: usize,
    },
    /// A token stream, opened and checked (`data: tokens(...)`).
    Stream(std::sync::Arc<stream::Stream>),
    /// A token source converted on `run` (parquet, Arrow, text with a tokenizer).
    Pending(std::sync::Arc<convert::Pending>),
}

#[derive(Clone, Debug)]
pub struct TrainData {
    pub model: String,
    pub data: Loaded,
}

/// Check every `train`'s data; `flag` is `--data PATH`, which replaces the files'
/// `data:` sources. Returns the diagnostics, what was loaded, and the files read.
pub fn check(
    spec: &Spec,
    programs: &[spmd::Program],
    flag: Option<&Path>,
    files: &dyn Files,
) -> (Vec<Diagnostic>, Vec<TrainData>, Vec<PathBuf>) {
    let mut cx = Cx {
        files,
        problems: vec![],
        loaded: vec![],
        read: vec![],
    };
    for t in &spec.trains {
        // Without a lowered program (the file has errors) there is nothing to fit.
        let Some(prog) = programs.iter().find(|p| p.model == t.model) else {
            continue;
        };
        let shape = Shapes::of(t, prog);
        cx.train(t, &shape, flag);
    }
    let diags = cx.problems.into_iter().map(|p| p.diagnostic()).collect();
    (diags, cx.loaded, cx.read)
}

/// The global shapes the data must have, with the batch at its full size.
struct Shapes {
    /// Forward parameter names and global shapes (dim 0 the batch).
    inputs: Vec<(String, Vec<usize>, bool)>,
    /// Rows the embedding consuming each integer input has (its vocabulary).
    input_vocab: Vec<Option<usize>>,
    /// Inputs a `lookup` reads, where negative ids pad ragged samples.
    padded: Vec<bool>,
    labels: Vec<usize>,
    classes: usize,
    /// `loss: mse` or `sigmoid_binary_cross_entropy`: the labels are targets
    /// shaped like the output.
    regression: bool,
    loss: String,
    eval: Option<Span>,
    /// The loss's `ignore_index`: a label that may lie outside the classes.
    ignore: Option<i64>,
    /// The loss function's weights: its name for them and their shape.
    weights: Option<(String, Vec<usize>)>,
}

/// Whether array `a` holds integers (uint8 pixels) for an input the model
/// declares as floats (`int` false), reported (E0305): integers feed only an
/// input declared as integers, which the model casts and scales itself.
fn ints_for_floats(
    cx: &mut Cx<'_>,
    a: &Array,
    int: bool,
    (name, full): (&str, &str),
    (span, shown): (Span, &str),
) -> bool {
    if !a.int || int {
        return false;
    }
    cx.problems.push(Problem::DataMismatch {
        span,
        path: shown.to_string(),
        message: format!(
            "has `{full}` as {}, but the model reads floats from it",
            a.dtype
        ),
        label: "data named here",
        help: Some(format!(
            "declare the input `{name}: i32[...]` and cast it in the model (`cast({name}, f32) / 255.0` scales 8-bit pixels to [0, 1]), or store floats"
        )),
    });
    true
}

/// The ids outside `[0, limit)` an array may still hold.
#[derive(Clone, Copy)]
enum Beyond {
    Nothing,
    /// Any negative id (a lookup's padding).
    Negatives,
    /// This one (the loss's `ignore_index`).
    Id(i64),
}

impl Beyond {
    fn allows(self, v: f64) -> bool {
        match self {
            Beyond::Nothing => false,
            Beyond::Negatives => v < 0.0,
            Beyond::Id(i) => v == i as f64,
        }
    }
}

impl Shapes {
    fn of(t: &spec::Train, prog: &spmd::Program) -> Shapes {
        let batch = t.batch.unwrap_or(1).max(1);
        let size = |d: &crate::types::Dim| {
            d.size
                .substitute(&prog.bound)
                .and_then(|p| p.as_const())
                .unwrap_or(1)
                .max(0) as usize
        };
        let full = |dims: &[crate::types::Dim]| -> Vec<usize> {
            dims.iter()
                .enumerate()
                .map(|(i, d)| if i == 0 { batch } else { size(d) })
                .collect()
        };
        let mut inputs = Vec::new();
        let mut input_vocab = Vec::new();
        let mut padded = Vec::new();
        for (id, n) in prog.nodes.iter().enumerate() {
            let Op::Input(i) = n.op else { continue };
            // One input is `x`, as in seeds 000 and 003; several go by their names.
            let name = prog
                .input_names
                .get(i)
                .cloned()
                .unwrap_or_else(|| format!("x{i}"));
            inputs.push((name, full(&n.ty.dims), !n.ty.dtype.is_float()));
            // The rows of the embedding or table that reads this input as ids.
            let reader = prog
                .nodes
                .iter()
                .find(|m| m.op.reads_ids() && m.args.get(1) == Some(&(id as u32)));
            input_vocab.push(reader.and_then(|m| {
                m.args
                    .first()
                    .and_then(|w| prog.nodes.get(*w as usize))
                    .and_then(|w| w.ty.dims.first())
                    .map(size)
            }));
            padded.push(
                prog.nodes
                    .iter()
                    .any(|m| m.op.lookup_table().is_some() && m.args.get(1) == Some(&(id as u32))),
            );
        }
        if inputs.len() == 1 {
            inputs[0].0 = "x".into();
        }
        let out = prog.output.and_then(|o| prog.nodes.get(o as usize));
        let targets = prog.targets(t.loss);
        let regression = targets.as_ref().is_some_and(|x| !x.classes);
        let (labels, classes) = match (out, targets) {
            (Some(_), Some(x)) if regression => (full(&x.ty.dims), 1),
            (Some(o), Some(x)) => (full(&x.ty.dims), o.ty.dims.last().map(size).unwrap_or(1)),
            _ => (vec![batch], 1),
        };
        Shapes {
            inputs,
            input_vocab,
            padded,
            labels,
            classes,
            regression,
            loss: t.loss_name(),
            ignore: t.loss_ignore,
            eval: t.eval_span,
            weights: prog.weights().map(|(n, ty)| (n, full(&ty.dims))),
        }
    }
}

struct Cx<'f> {
    files: &'f dyn Files,
    problems: Vec<Problem>,
    loaded: Vec<TrainData>,
    read: Vec<PathBuf>,
}

impl Cx<'_> {
    fn train(&mut self, t: &spec::Train, shape: &Shapes, flag: Option<&Path>) {
        let model = t.model.clone();
        let span = t.data_span.unwrap_or(t.model_span);
        if let Some(path) = flag {
            let shown = format!("--data {}", path.display());
            if let Some(data) = self.arrays(path, &shown, span, shape) {
                self.loaded.push(TrainData { model, data });
            }
            return;
        }
        let Some(data) = &t.data else {
            return;
        };
        if shape.regression && data.is_tokens() {
            self.problems.push(Problem::DataMismatch {
                span,
                path: data.name().to_string(),
                label: "data named here",
                message: format!(
                    "gives token ids as labels, but `loss: {}` needs targets shaped like the output, {}",
                    shape.loss,
                    dims(&shape.labels)
                ),
                help: Some("train with `data: arrays(path: ...)` holding those targets as `y`, or with `loss: softmax_cross_entropy`".into()),
            });
            return;
        }
        match data {
            spec::Data::Tokens { .. } => self.tokens(&model, data, shape),
            spec::Data::Arrays {
                path,
                written,
                path_span,
            } => {
                if let Some(data) = self.arrays(path, written, *path_span, shape) {
                    self.loaded.push(TrainData { model, data });
                }
            }
            spec::Data::Text {
                path,
                written,
                path_span,
                seq,
                vocab,
                vocab_span,
            } => {
                self.read.push(path.clone());
                let size = self.files.on_disk(path).and_then(|p| p.metadata().ok());
                let read = match size.map(|m| m.len()).filter(|n| *n > TEXT_CAP) {
                    Some(n) => Err(TextError::TooBig(n)),
                    None => self.files.reader(path).map_err(TextError::Io),
                };
                let read = read.and_then(|mut r| words_from(&mut r));
                let words = match read {
                    Ok(w) => w,
                    Err(err) => {
                        self.problems.push(Problem::DataUnreadable {
                            span: *path_span,
                            path: written.clone(),
                            reason: err.to_string(),
                        });
                        return;
                    }
                };
                let vocab = vocab.unwrap_or(shape.classes).max(1);
                let seq = (*seq).max(1);
                if !self.vocab_fits(vocab, vocab_span.unwrap_or(span), shape, true) {
                    return;
                }
                let ids = words.finish(vocab);
                // Training windows come from the first 90%: it must hold one.
                if ids.len() * 9 / 10 < seq + 2 {
                    self.problems.push(Problem::DataMismatch {
                        span: *path_span,
                        path: written.clone(),
                        label: "data named here",
                        message: format!(
                            "holds {} words, too few for windows of {seq} (the first 90% must hold {} words)",
                            ids.len(),
                            seq + 2
                        ),
                        help: Some("use a longer text or a shorter `seq`".into()),
                    });
                    return;
                }
                self.loaded.push(TrainData {
                    model,
                    data: Loaded::Text { ids, seq },
                });
            }
            spec::Data::ShakespeareWords {
                vocab: Some(v),
                vocab_span,
                ..
            } => {
                self.vocab_fits(*v, vocab_span.unwrap_or(span), shape, true);
            }
            spec::Data::Synthetic {
                classes,
                classes_span,
                vocab,
                vocab_span,
            } => {
                // Synthetic ids are inputs only; its labels are below `classes`.
                if let Some(v) = vocab {
                    self.vocab_fits(*v, vocab_span.unwrap_or(span), shape, false);
                }
                if let Some(c) = classes.filter(|c| *c > shape.classes && !shape.regression) {
                    self.problems.push(Problem::DataOutOfRange {
                        span: classes_span.unwrap_or(span),
                        message: format!(
                            "this source gives labels up to {}, but the model has {} output classes",
                            c - 1,
                            shape.classes
                        ),
                        label: format!("{c} classes"),
                        help: format!(
                            "use `classes: {}` or fewer, or widen the model's output",
                            shape.classes
                        ),
                    });
                }
            }
            spec::Data::Clicks { vocab, vocab_span } => {
                if let Some(v) = vocab {
                    self.vocab_fits(*v, vocab_span.unwrap_or(span), shape, false);
                }
            }
            spec::Data::ShakespeareChars { .. } => {
                let n = char_vocab(SHAKESPEARE).len();
                self.vocab_fits(n, span, shape, true);
            }
            spec::Data::ShakespeareWords { vocab: None, .. } => {}
        }
    }

    /// Ids below `vocab` must be valid embedding rows (and labels, when the
    /// source's labels are ids too).
    fn vocab_fits(&mut self, vocab: usize, span: Span, shape: &Shapes, labels: bool) -> bool {
        let rows = shape.input_vocab.iter().flatten().min().copied();
        let (limit, what) = match rows {
            Some(r) if r < shape.classes || !labels => (r, "embedding rows"),
            None if !labels => return true,
            _ => (shape.classes, "output classes"),
        };
        if vocab > limit {
            self.problems.push(Problem::DataOutOfRange {
                span,
                message: format!(
                    "this source gives ids up to {}, but the model has {limit} {what}",
                    vocab - 1
                ),
                label: format!("{vocab} ids"),
                help: format!("use a vocabulary of at most {limit}, or widen the model"),
            });
            return false;
        }
        true
    }

    fn arrays(&mut self, path: &Path, shown: &str, span: Span, shape: &Shapes) -> Option<Loaded> {
        self.read.push(path.to_path_buf());
        let all = match crate::arrays::read(self.files, path) {
            Ok(a) => a,
            Err(reason) => {
                self.problems.push(Problem::DataUnreadable {
                    span,
                    path: shown.to_string(),
                    reason,
                });
                return None;
            }
        };
        let names: Vec<&str> = all.iter().map(|a| a.name.as_str()).collect();
        let holds = format!("it holds {}", quote_list(&names));
        let mut ok = true;
        // The batches of the training arrays, and apart from them the held-out
        // ones (`eval.steps` may read fewer or more; they wrap around).
        let mut steps: [Option<(usize, String)>; 2] = [None, None];
        let mut get = |cx: &mut Cx<'_>,
                       name: &str,
                       want: &[usize],
                       int: bool,
                       vocab: Option<(usize, &str, Beyond)>|
         -> Option<Array> {
            let Some(a) = all.iter().find(|a| a.name == name) else {
                cx.problems.push(Problem::DataMismatch {
                    span,
                    path: shown.to_string(),
                    message: format!("has no array `{name}`"),
                    label: "data named here",
                    help: Some(holds.clone()),
                });
                return None;
            };
            let stepped = a.shape.len() == want.len() + 1 && a.shape[1..] == *want;
            if a.shape != want && !stepped {
                cx.problems.push(Problem::DataMismatch {
                    span,
                    path: shown.to_string(),
                    label: "data named here",
                    message: format!(
                        "has `{name}` shaped {}, but the model needs {} (one batch, reused every step) or [steps, {}]",
                        dims(&a.shape),
                        dims(want),
                        dims(want).trim_matches(['[', ']'])
                    ),
                    help: None,
                });
                return None;
            }
            if stepped {
                let steps = &mut steps[usize::from(name.ends_with("_eval"))];
                match steps {
                    Some((n, other)) if *n != a.shape[0] => {
                        cx.problems.push(Problem::DataMismatch {
                            span,
                            path: shown.to_string(),
                            label: "data named here",
                            message: format!(
                                "has {} batches in `{name}` but {n} in `{other}`",
                                a.shape[0]
                            ),
                            help: Some(if name.ends_with("_eval") {
                                "every held-out array must hold the same number of batches".into()
                            } else {
                                "every training array must hold the same number of batches".into()
                            }),
                        });
                        return None;
                    }
                    None => *steps = Some((a.shape[0], name.to_string())),
                    _ => {}
                }
            }
            if int && !a.int {
                cx.problems.push(Problem::DataMismatch {
                    span,
                    path: shown.to_string(),
                    message: format!(
                        "has `{name}` as {}, but the model reads integer ids from it",
                        a.dtype
                    ),
                    label: "data named here",
                    help: Some("store ids as int32 or int64".into()),
                });
                return None;
            }
            if let Some((limit, what, beyond)) = vocab {
                if let Some((i, v)) = a
                    .values
                    .iter()
                    .enumerate()
                    .find(|(_, v)| (*v < 0.0 || *v >= limit as f64) && !beyond.allows(*v))
                {
                    cx.problems.push(Problem::DataOutOfRange {
                        span,
                        message: format!(
                            "`{name}` holds the id {v} at {}, outside the model's {limit} {what}",
                            index(i, &a.shape)
                        ),
                        label: format!("from {shown}"),
                        help: match beyond {
                            // A negative label is a masked target, as
                            // Hugging Face writes them.
                            Beyond::Nothing if what == "classes" && v < 0.0 => format!(
                                "{what} are 0 to {}; for targets that must not count, write `loss: softmax_cross_entropy(ignore_index: {v})`",
                                limit.saturating_sub(1)
                            ),
                            _ => format!("{what} are 0 to {}", limit.saturating_sub(1)),
                        },
                    });
                    return None;
                }
            }
            Some(a.clone())
        };
        type Taken = (Vec<Array>, Array, Option<Array>);
        let mut take = |cx: &mut Cx<'_>, suffix: &str| -> Option<Taken> {
            let mut inputs = Vec::new();
            for (k, (name, want, int)) in shape.inputs.iter().enumerate() {
                let vocab = shape.input_vocab.get(k).copied().flatten();
                let pad = shape.padded.get(k).copied().unwrap_or(false);
                let full = format!("{name}{suffix}");
                let a = get(
                    cx,
                    &full,
                    want,
                    *int,
                    vocab.map(|v| {
                        let beyond = if pad {
                            Beyond::Negatives
                        } else {
                            Beyond::Nothing
                        };
                        (v, "embedding rows", beyond)
                    }),
                );
                let a = a.filter(|a| !ints_for_floats(cx, a, *int, (name, &full), (span, shown)));
                inputs.push(a);
            }
            // Class ids for a classifier; any numbers for a regression.
            let y = match shape.regression {
                true => get(cx, &format!("y{suffix}"), &shape.labels, false, None),
                false => get(
                    cx,
                    &format!("y{suffix}"),
                    &shape.labels,
                    true,
                    Some((
                        shape.classes,
                        "classes",
                        shape.ignore.map_or(Beyond::Nothing, Beyond::Id),
                    )),
                ),
            };
            // Any numbers, as the loss function reads them.
            let w = match &shape.weights {
                Some((name, want)) => {
                    let full = format!("{name}{suffix}");
                    if !all.iter().any(|a| a.name == full) {
                        cx.problems.push(Problem::DataMismatch {
                            span,
                            path: shown.to_string(),
                            message: format!("has no array `{full}`"),
                            label: "data named here",
                            help: Some(format!(
                                "the loss function's third parameter `{name}` reads its weights from the array `{full}`, shaped like it with the batch first; {holds}"
                            )),
                        });
                        return None;
                    }
                    Some(get(cx, &full, want, false, None)?)
                }
                None => None,
            };
            let inputs: Option<Vec<Array>> = inputs.into_iter().collect();
            Some((inputs?, y?, w))
        };
        let main = take(self, "");
        ok &= main.is_some();
        let mut eval = None;
        if let Some(espan) = shape.eval {
            if all.iter().any(|a| a.name.ends_with("_eval")) {
                eval = take(self, "_eval");
                ok &= eval.is_some();
            } else {
                self.problems.push(Problem::DataMismatch {
                    span: espan,
                    path: shown.to_string(),
                    message: "has no held-out arrays for `eval`".into(),
                    label: "asks for held-out data",
                    help: Some(format!(
                        "add {} with the same shapes, or remove `eval`",
                        quote_list(
                            &shape
                                .inputs
                                .iter()
                                .map(|i| format!("{}_eval", i.0))
                                .chain(["y_eval".to_string()])
                                .chain(shape.weights.iter().map(|w| format!("{}_eval", w.0)))
                                .collect::<Vec<_>>()
                                .iter()
                                .map(String::as_str)
                                .collect::<Vec<_>>()
                        )
                    )),
                });
                ok = false;
            }
        }
        let (inputs, labels, weights) = main?;
        ok.then(|| {
            Loaded::Arrays(Box::new(ArrayData {
                inputs,
                labels,
                weights,
                eval,
            }))
        })
    }
}

fn dims(s: &[usize]) -> String {
    let v: Vec<String> = s.iter().map(|d| d.to_string()).collect();
    format!("[{}]", v.join(", "))
}

/// The multi-index of flat element `i` in row-major `shape`.
fn index(mut i: usize, shape: &[usize]) -> String {
    let mut idx = vec![0; shape.len()];
    for (k, d) in shape.iter().enumerate().rev() {
        let d = (*d).max(1);
        idx[k] = i % d;
        i /= d;
    }
    dims(&idx)
}

fn quote_list(names: &[&str]) -> String {
    let q: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match q.len() {
        0 => "nothing".into(),
        1 => q[0].clone(),
        n => format!("{} and {}", q[..n - 1].join(", "), q[n - 1]),
    }
}
