//! What `shardc run` does with its data before step 1: a parquet, Arrow or
//! tokenized text source converted into the run directory, and every id of a
//! token stream checked (each process its share), with progress bars.

use std::io::IsTerminal;

/// A bar on a terminal (none when `speak` is off or stderr is not one).
fn bar(speak: bool, template: &str) -> Option<indicatif::ProgressBar> {
    (speak && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template(template)
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    })
}

/// A token source that is converted on `run` (parquet, Arrow, text with a
/// tokenizer), converted into the run directory's `tokens/` with a bar, or
/// reused from there. Under MPI the first process (`lead`) converts while
/// the others wait at `barrier`; they then reuse its stream (or, where the
/// run directory is not shared, convert their own).
pub(super) fn prepare(
    src: crate::runtime::data::Source,
    dir: &std::path::Path,
    speak: bool,
    lead: bool,
    barrier: &dyn Fn() -> Result<(), String>,
) -> Result<crate::runtime::data::Source, String> {
    if !matches!(src, crate::runtime::data::Source::Pending(_)) {
        return Ok(src);
    }
    if !lead {
        barrier()?;
    }
    let r = convert(src, dir, speak);
    if lead && r.is_ok() {
        barrier()?;
    }
    r
}

fn convert(
    src: crate::runtime::data::Source,
    dir: &std::path::Path,
    speak: bool,
) -> Result<crate::runtime::data::Source, String> {
    use crate::data::convert::Progress;
    let mut shown: Option<indicatif::ProgressBar> = None;
    let r = src.prepare(dir, &mut |p| match p {
        Progress::Start { source, tokenize } => {
            let what = if tokenize { "tokenizing" } else { "converting" };
            shown = bar(
                speak,
                &format!(
                    "{what} {} {{bar:30}} {{percent}}%  [{{elapsed}} < {{eta}}]",
                    source.display()
                ),
            );
        }
        Progress::Step(done, all) => {
            if let Some(b) = &shown {
                b.set_length(all);
                b.set_position(done);
            }
        }
        Progress::Done {
            stream,
            ids,
            reused,
        } => {
            if let Some(b) = shown.take() {
                b.finish_and_clear();
            }
            if speak {
                let how = if reused { "reused" } else { "written" };
                eprintln!("tokens: {} ({ids} ids, {how})", stream.display());
            }
        }
    });
    if let Some(b) = shown {
        b.finish_and_clear();
    }
    r.map_err(|e| e.to_string())
}

/// A token stream's ids, every one checked before the first step (a bar on
/// a terminal for a large stream).
pub(super) fn validate(
    src: &crate::runtime::data::Source,
    share: (usize, usize),
    speak: bool,
) -> Result<(), String> {
    let bar = bar(
        speak,
        "checking token ids {bar:30} {percent}%  [{elapsed} < {eta}]",
    );
    let r = src.validate(share, &mut |done, all| {
        if let Some(b) = &bar {
            b.set_length(all);
            b.set_position(done);
        }
    });
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    r
}
