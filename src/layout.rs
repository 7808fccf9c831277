//! The sharding of a tensor drawn as a grid of devices (like JAX's
//! `visualize_array_sharding`): `shardc show`. Rows are the pieces of the first
//! dimension, columns the pieces of the others; each cell lists the devices that
//! hold that piece.

use crate::mesh::Topology;
use crate::spmd::{Op, Program};
use crate::types::TType;
use std::collections::BTreeMap;

/// The pipeline axis and the stage holding a staged layer's parameter.
type Stage<'a> = Option<(&'a str, usize)>;

/// One tensor to draw: its name, (stored) type, the type a FSDP parameter is
/// gathered to for use, and its pipeline stage.
struct Item<'a> {
    name: String,
    t: TType,
    used: Option<TType>,
    stage: Stage<'a>,
}

/// Grids with more columns or rows than these are summarised instead of drawn.
const MAX_COLUMNS: usize = 16;
const MAX_ROWS: usize = 64;

/// `0-3`, `0,2,4,6`, or `0,2,…,14` for long lists.
fn ranks_text(r: &[usize]) -> String {
    if r.len() > 1 && r.windows(2).all(|w| w[1] == w[0] + 1) {
        return format!("{}-{}", r[0], r[r.len() - 1]);
    }
    if r.len() <= 4 {
        return r
            .iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(",");
    }
    let step = r[1] - r[0];
    if r.windows(2).all(|w| w[1] - w[0] == step) {
        return format!("{},{},…,{}", r[0], r[1], r[r.len() - 1]);
    }
    format!("{},{},…,{} ({})", r[0], r[1], r[r.len() - 1], r.len())
}

/// The devices holding each piece: (row, column) → ranks.
fn pieces(
    t: &TType,
    topo: &Topology,
    stage: Stage,
) -> (usize, usize, BTreeMap<(usize, usize), Vec<usize>>) {
    let count = |axes: &[String]| axes.iter().map(|a| topo.size(a)).product::<usize>();
    let (rows, cols) = match t.dims.len() {
        0 => (1, 1),
        1 => (1, count(&t.dims[0].axes)),
        _ => (
            count(&t.dims[0].axes),
            t.dims[1..].iter().map(|d| count(&d.axes)).product(),
        ),
    };
    let mut cells: BTreeMap<(usize, usize), Vec<usize>> = BTreeMap::new();
    for r in 0..topo.devices() {
        // A pipeline stage's parameters live on that stage's devices only.
        if stage.is_some_and(|(axis, s)| topo.coord(r, axis) != s) {
            continue;
        }
        let idx: Vec<(usize, usize)> = t
            .dims
            .iter()
            .map(|d| topo.shard_index(r, &d.axes))
            .collect();
        let cell = match idx.as_slice() {
            [] => (0, 0),
            [(i, _)] => (0, *i),
            [(i, _), rest @ ..] => (*i, rest.iter().fold(0, |acc, (j, n)| acc * n + j)),
        };
        cells.entry(cell).or_default().push(r);
    }
    (rows, cols, cells)
}

/// A tensor's layout over `topo`: its type, per-device shape, what is replicated
/// or still owed, and the grid. `stage`: the pipeline axis and the stage that
/// holds it, for a staged layer's parameter.
pub fn draw(name: &str, t: &TType, topo: &Topology, stage: Stage) -> String {
    let local = format!(
        "{}[{}]",
        t.dtype.name(),
        t.local_shape(&|a| topo.size(a) as i64).join(", ")
    );
    let mut out = format!("{name}  {t}   per device {local}\n");
    if let Some((axis, s)) = stage {
        out += &format!("  on pipeline stage {s} (the devices with {axis} = {s})\n");
    }
    let (rep, copies) = topo.replication(t, stage.map(|x| x.0));
    if copies > 1 {
        out += &format!(
            "  replicated over {} ({copies} copies of each piece)\n",
            rep.join(", ")
        );
    }
    if !t.pending.is_empty() {
        let axes: Vec<&str> = t.pending.keys().map(String::as_str).collect();
        out += &format!(
            "  partial over {}: each device holds an addend of its piece\n",
            axes.join(", ")
        );
    }
    let (rows, cols, cells) = pieces(t, topo, stage);
    if cols > MAX_COLUMNS || rows > MAX_ROWS {
        out += &format!("  {rows} × {cols} pieces: too many to draw\n");
        return out;
    }
    let labels: BTreeMap<(usize, usize), String> = cells
        .iter()
        .map(|(k, v)| (*k, format!("dev {}", ranks_text(v))))
        .collect();
    let w = labels
        .values()
        .map(|l| l.chars().count())
        .max()
        .unwrap_or(3)
        + 4;
    let rule = |l: char, m: char, r: char| -> String {
        let mut s = format!("  {l}");
        for c in 0..cols {
            s += &"─".repeat(w);
            s.push(if c + 1 == cols { r } else { m });
        }
        s + "\n"
    };
    out += &rule('┌', '┬', '┐');
    for row in 0..rows {
        let mut line = "  │".to_string();
        for col in 0..cols {
            let l = labels.get(&(row, col)).map_or("", String::as_str);
            line += &format!("{l:^w$}│");
        }
        out += &line;
        out += "\n";
        out += &if row + 1 == rows {
            rule('└', '┴', '┘')
        } else {
            rule('├', '┼', '┤')
        };
    }
    out
}

/// `shardc show`: every parameter (and input and output) of `prog` whose name is
/// one of `names` (a whole dotted path or its last parts, e.g. `w1` for
/// `blocks.3.w1`), or all of them. Repeated layers' copies with one layout are
/// drawn once, as `blocks.*.w1`.
pub fn show(prog: &Program, names: &[String]) -> String {
    let topo = Topology::of(&prog.mesh);
    let wanted = |n: &str| {
        names.is_empty()
            || names
                .iter()
                .any(|w| n == w || n.ends_with(&format!(".{w}")) || n.starts_with(&format!("{w}.")))
    };
    let mut items: Vec<Item> = Vec::new();
    for (i, n) in prog.nodes.iter().enumerate() {
        if let Op::Input(k) = n.op {
            // Named as `forward` names it; `input` selects every input.
            let param = prog.input_names.get(k).cloned().unwrap_or_default();
            let name = if param.is_empty() {
                format!("input {k}")
            } else {
                format!("input {param}")
            };
            if names.is_empty() || names.iter().any(|w| w == "input" || *w == param) {
                items.push(Item {
                    name,
                    t: n.ty.clone(),
                    used: None,
                    stage: None,
                });
            }
        }
        if Some(i as u32) == prog.output
            && (names.is_empty() || names.iter().any(|w| w == "output"))
        {
            items.push(Item {
                name: "output".into(),
                t: n.ty.clone(),
                used: None,
                stage: None,
            });
        }
    }
    let stages = crate::runtime::pipeline::Stages::of(prog).ok().flatten();
    let stage_of = |i: usize| -> Stage {
        let st = stages.as_ref()?;
        Some((st.axis.as_str(), (*st.param_stage.get(i)?)?))
    };
    // Parameters, grouped by their path with layer indices as `*`.
    // (path with `*`, stored, used, stage, the parameters' names)
    let mut groups: Vec<(String, TType, TType, Stage, Vec<String>)> = Vec::new();
    for (i, p) in prog
        .params
        .iter()
        .enumerate()
        .filter(|(_, p)| wanted(&p.name))
    {
        let key: String = p
            .name
            .split('.')
            .map(|s| {
                if s.chars().all(|c| c.is_ascii_digit()) {
                    "*"
                } else {
                    s
                }
            })
            .collect::<Vec<_>>()
            .join(".");
        let stage = stage_of(i);
        match groups
            .iter_mut()
            .find(|g| g.0 == key && g.1 == p.stored && g.2 == p.used && g.3 == stage)
        {
            Some(g) => g.4.push(p.name.clone()),
            None => groups.push((
                key,
                p.stored.clone(),
                p.used.clone(),
                stage,
                vec![p.name.clone()],
            )),
        }
    }
    for (key, stored, used, stage, names) in groups {
        let name = match names.as_slice() {
            [one] => one.clone(),
            _ => format!("{key} ({} layers)", names.len()),
        };
        let used = (used != stored).then_some(used);
        items.push(Item {
            name,
            t: stored,
            used,
            stage,
        });
    }
    let mut out = String::new();
    for Item {
        name,
        t,
        used,
        stage,
    } in items
    {
        out += &draw(&name, &t, &topo, stage);
        if let Some(u) = used {
            out +=
                &format!("  used as {u}: gathered for each use, its gradient reduce-scattered\n");
        }
        out += "\n";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::ranks_text;

    #[test]
    fn device_lists() {
        assert_eq!(ranks_text(&[0, 1, 2, 3]), "0-3");
        assert_eq!(ranks_text(&[0, 2, 4, 6]), "0,2,4,6");
        assert_eq!(ranks_text(&[1, 3, 5, 7, 9, 11]), "1,3,…,11");
        assert_eq!(ranks_text(&[5]), "5");
    }
}
