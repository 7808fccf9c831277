//! `text(...)`'s word ids, now counted in one streamed pass (`data::Words`,
//! `data::words_from`), against the whole-text reference they replaced:
//! lowercase the text, split on anything that is not an ASCII letter, rank by
//! count (ties alphabetical). The ids must be the same for any text and any
//! way the reader cuts it, characters split across reads included.

use shardc::data::{words, words_from, MAX_WORD, SHAKESPEARE};
use std::collections::HashMap;
use std::io::Read;

/// The whole-text tokenizer `text(...)` used before it streamed.
fn reference(text: &str, vocab: usize) -> Vec<u32> {
    let text = text.to_lowercase();
    let words: Vec<&str> = text
        .split(|c: char| !c.is_ascii_alphabetic())
        .filter(|w| !w.is_empty())
        .collect();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for w in &words {
        *counts.entry(w).or_default() += 1;
    }
    let mut by_freq: Vec<(&str, usize)> = counts.into_iter().collect();
    by_freq.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let ids: HashMap<&str, u32> = by_freq
        .iter()
        .take(vocab.saturating_sub(1))
        .enumerate()
        .map(|(i, (w, _))| (*w, i as u32 + 1))
        .collect();
    words
        .iter()
        .map(|w| ids.get(w).copied().unwrap_or(0))
        .collect()
}

/// A reader that hands out at most `n` bytes per read (1, 2, 3, ... cycling).
struct Trickle<'a> {
    bytes: &'a [u8],
    n: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.n = self.n % 5 + 1;
        let k = self.n.min(buf.len()).min(self.bytes.len());
        buf[..k].copy_from_slice(&self.bytes[..k]);
        self.bytes = &self.bytes[k..];
        Ok(k)
    }
}

#[test]
fn streamed_word_ids_equal_the_whole_text_reference() {
    // Unicode whose lowercase is ASCII (the Kelvin sign is `k`), a capital
    // sigma (context-dependent lowercase, never a letter here), a dotted
    // capital I (two characters lowercased), letters split by digits.
    let unicode = "The KELVIN sign: \u{212A}elvin. ΣΑΣ Σ İstanbul ﬁne a1b2c3 café CAFÉ the the";
    for text in [SHAKESPEARE, unicode, "", "   ", "a"] {
        for vocab in [1, 2, 50, 2048, 100_000] {
            let want = reference(text, vocab);
            assert_eq!(words(text, vocab), want, "whole, vocab {vocab}");
            let mut r = Trickle {
                bytes: text.as_bytes(),
                n: 0,
            };
            let streamed = words_from(&mut r).expect("reads").finish(vocab);
            assert_eq!(streamed, want, "streamed, vocab {vocab}");
        }
    }
}

#[test]
fn a_word_longer_than_the_limit_is_unknown() {
    let long = "x".repeat(MAX_WORD + 1);
    let text = format!("b {long} a b {long} {}", "y".repeat(MAX_WORD));
    // `b` (twice) is 1, then `a` and the longest allowed word by name; the
    // over-long word is never ranked, however often it occurs.
    assert_eq!(words(&text, 10), vec![1, 0, 2, 1, 0, 3]);
}

#[test]
fn bad_bytes_are_refused_with_their_offset() {
    let mut nul = Trickle {
        bytes: b"abc def\0ghi",
        n: 0,
    };
    let e = words_from(&mut nul).err().expect("a NUL byte").to_string();
    assert_eq!(e, "not text: a NUL byte at byte 7");
    let mut latin1 = Trickle {
        bytes: b"caf\xe9 au lait",
        n: 0,
    };
    let e = words_from(&mut latin1)
        .err()
        .expect("not UTF-8")
        .to_string();
    assert_eq!(e, "not UTF-8 text (byte 3)");
    let mut cut = Trickle {
        bytes: "café".as_bytes().split_last().expect("bytes").1,
        n: 0,
    };
    let e = words_from(&mut cut).err().expect("cut").to_string();
    assert_eq!(e, "not UTF-8 text (byte 3)");
}
