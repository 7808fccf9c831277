//! The reason written above each decision of a chosen layout: what was
//! chosen, the runner-up (the best other choice with everything else as
//! chosen) and what it lost by — step time, or memory when it would not fit
//! — and the choices the checker refuses, by code. Only what the plan
//! computes is said, so `shardc plan --device` can check each claim.

use super::search::{Move, Outcome, Planned};
use super::sites::{Kind, Var};
use crate::plan::device::Device;
use crate::units::human_bytes;

/// A decision's choice as the reason names it: `H@tp`, `T unsharded`,
/// `shard_params(dp)`.
fn named(v: &Var, c: usize) -> String {
    let label = v.choices.get(c).map_or("?", |c| c.label.as_str());
    match v.kind {
        Kind::Dim if label.starts_with('@') => format!("{}{label}", v.key),
        Kind::Dim => format!("{} {label}", v.key),
        Kind::Fsdp | Kind::Checkpoint | Kind::Precision | Kind::Pipeline => label.to_string(),
    }
}

fn move_named(vars: &[Var], m: &Move) -> String {
    m.iter()
        .map(|&(v, c)| named(&vars[v], c))
        .collect::<Vec<_>>()
        .join(" with ")
}

pub fn seconds(t: f64) -> String {
    if t.abs() >= 1.0 {
        format!("{t:.2} s")
    } else if t.abs() >= 1e-3 {
        format!("{:.2} ms", t * 1e3)
    } else {
        format!("{:.2} µs", t * 1e6)
    }
}

fn signed(t: f64) -> String {
    if t < 0.0 {
        format!("-{}", seconds(-t))
    } else {
        format!("+{}", seconds(t))
    }
}

/// One `// shard:` line above each decision's line: (offset, offset, text)
/// insertions for [`super::sites::write_with`].
pub fn comments(
    text: &str,
    vars: &[Var],
    pick: &[usize],
    chosen: &Planned,
    alts: &[Vec<(Move, Outcome)>],
    device: &Device,
) -> Vec<(usize, usize, String)> {
    let mut out = Vec::new();
    for (i, v) in vars.iter().enumerate() {
        let reason = reason(
            vars,
            i,
            pick[i],
            chosen,
            alts.get(i).map_or(&[][..], |a| a),
            device,
        );
        let line = &text[v.line..];
        let indent: String = line
            .chars()
            .take_while(|c| *c == ' ' || *c == '\t')
            .collect();
        out.push((
            v.line,
            v.line,
            format!("{indent}{} {reason}\n", super::MARK),
        ));
    }
    out
}

fn reason(
    vars: &[Var],
    i: usize,
    c: usize,
    chosen: &Planned,
    alts: &[(Move, Outcome)],
    device: &Device,
) -> String {
    let v = &vars[i];
    let mut s = named(v, c);
    // The best other choice the plan could price.
    let mut runner: Option<(&Move, &Planned)> = None;
    for (m, o) in alts {
        if let Outcome::Planned(p) = o {
            let better = runner.is_none_or(|(_, r)| o.beats(&Outcome::Planned(r.clone())));
            if better {
                runner = Some((m, p));
            }
        }
    }
    match runner {
        None => s.push_str(": the checker refuses every other choice"),
        Some((m, p)) if !p.fits => s.push_str(&format!(
            ": runner-up {} would not fit (peak {} of the {}'s {}); memory decided",
            move_named(vars, m),
            human_bytes(p.peak),
            device.name,
            human_bytes(device.memory)
        )),
        Some((m, p)) => {
            let d = p.step - chosen.step;
            if d.abs() <= chosen.step * 1e-9 {
                s.push_str(&format!(
                    ": no other choice plans a faster step ({} ties)",
                    move_named(vars, m),
                ));
            } else {
                s.push_str(&format!(
                    ": step {}; runner-up {} is {} slower (compute {}, communication {}); memory not binding (peak {})",
                    seconds(chosen.step),
                    move_named(vars, m),
                    seconds(d),
                    signed(p.compute - chosen.compute),
                    signed(p.comm - chosen.comm),
                    human_bytes(chosen.peak)
                ));
            }
        }
    }
    let refused: Vec<(&str, &str)> = alts
        .iter()
        .filter(|(m, _)| m.len() == 1)
        .filter_map(|(m, o)| match o {
            Outcome::Refused {
                code: Some(code), ..
            } => Some((vars[m[0].0].choices[m[0].1].label.as_str(), code.as_str())),
            _ => None,
        })
        .collect();
    let refused = refusals(&refused);
    if !refused.is_empty() {
        let sep = if runner.is_none() {
            ": "
        } else {
            "; refused: "
        };
        s.push_str(&format!("{sep}{refused}"));
    }
    s
}

/// Refused choices at most this many are each named.
const NAMED: usize = 8;

/// The refused choices, each with its code (`@dp (E0213), @tp (E0201)`);
/// more than [`NAMED`] (a pipeline's stages over every axis, schedule and
/// microbatch count) are counted by code, with the first of each named.
fn refusals(refused: &[(&str, &str)]) -> String {
    if refused.len() <= NAMED {
        let each: Vec<String> = refused.iter().map(|(l, c)| format!("{l} ({c})")).collect();
        return each.join(", ");
    }
    let mut codes: Vec<(&str, &str, usize)> = Vec::new();
    for &(label, code) in refused {
        match codes.iter_mut().find(|(c, _, _)| *c == code) {
            Some((_, _, n)) => *n += 1,
            None => codes.push((code, label, 1)),
        }
    }
    let each: Vec<String> = codes
        .iter()
        .map(|(code, first, n)| match n {
            1 => format!("{first} ({code})"),
            _ => format!("{n} choices ({code}) such as {first}"),
        })
        .collect();
    each.join("; ")
}
