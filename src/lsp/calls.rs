//! The call hierarchy of layers: who instantiates a layer (incoming: the
//! layers and models with a sublayer of its type, or a `repeat` of it) and
//! what a layer or model is built of (outgoing: the layers its declaration
//! names). Editors show it as a tree (VS Code's "Show Call Hierarchy",
//! Neovim's `vim.lsp.buf.incoming_calls`). Read from the same indexes as
//! references: every open buffer's compilation, and for incoming calls every
//! `.shard` file of the workspace that names the layer.

use super::index::{Def, Index, Kind, Target};
use super::nav;
use super::state::State;
use lsp_types::{
    CallHierarchyIncomingCall, CallHierarchyIncomingCallsParams, CallHierarchyItem,
    CallHierarchyOutgoingCall, CallHierarchyOutgoingCallsParams, CallHierarchyPrepareParams,
    SymbolKind,
};
use std::path::PathBuf;

/// The declarations a call hierarchy is made of.
const NODES: [Kind; 2] = [Kind::Layer, Kind::Model];

/// A layer or model as an item; `data` finds it again: its file and where
/// its name starts in the text that file was analysed in.
fn item(st: &State, ix: &Index, d: usize) -> Option<CallHierarchyItem> {
    let def = ix.defs.get(d)?;
    let f = ix.files.get(def.file)?;
    let name = nav::location(st, ix, def.file, def.name_span.0, def.name_span.1)?;
    let full = nav::location(st, ix, def.file, def.full.0, def.full.1)?;
    Some(CallHierarchyItem {
        name: def.name.clone(),
        kind: SymbolKind::CLASS,
        tags: None,
        detail: Some(format!("{} in {}", def.kind.word(), f.name)),
        uri: name.uri,
        range: full.range,
        selection_range: name.range,
        data: Some(serde_json::json!({
            "key": f.key.to_string_lossy(),
            "start": def.name_span.0,
            "name": def.name,
        })),
    })
}

pub fn prepare(st: &State, p: CallHierarchyPrepareParams) -> Option<Vec<CallHierarchyItem>> {
    let at = nav::at(
        st,
        &p.text_document_position_params.text_document.uri,
        p.text_document_position_params.position,
    )?;
    let Target::Def(d) = at.occ()?.target else {
        return None;
    };
    let def = at.ix.defs.get(d)?;
    if !NODES.contains(&def.kind) {
        return None;
    }
    Some(vec![item(st, at.ix, d)?])
}

/// The declaration an item names: (file key, name start, name).
fn named(it: &CallHierarchyItem) -> Option<(PathBuf, usize, String)> {
    let data = it.data.as_ref()?;
    Some((
        PathBuf::from(data.get("key")?.as_str()?),
        usize::try_from(data.get("start")?.as_u64()?).ok()?,
        data.get("name")?.as_str()?.to_string(),
    ))
}

/// Every index that may hold the item's declaration or its uses: the open
/// buffers' compilations, then (`workspace`) the workspace files that name
/// it and no open compilation read.
fn indexes(st: &State, name: &str, workspace: bool) -> Vec<std::sync::Arc<Index>> {
    let mut keys: Vec<&PathBuf> = st.analyses.keys().collect();
    keys.sort();
    let mut out: Vec<std::sync::Arc<Index>> = keys
        .into_iter()
        .map(|k| st.analyses[k].index.clone())
        .collect();
    if workspace {
        out.extend(nav::others(st, name));
    }
    out
}

/// The innermost layer or model whose declaration holds a byte of a file.
fn container(ix: &Index, file: usize, at: usize) -> Option<usize> {
    ix.enclosing(file, at, &NODES)
}

/// Where one caller's or callee's ranges are gathered, keyed by the
/// declaration's file and name start (each once across indexes).
type Groups = Vec<((PathBuf, usize), CallHierarchyItem, Vec<lsp_types::Range>)>;

fn gather(
    groups: &mut Groups,
    key: (PathBuf, usize),
    it: impl FnOnce() -> Option<CallHierarchyItem>,
    range: lsp_types::Range,
) {
    match groups.iter_mut().find(|g| g.0 == key) {
        Some(g) => {
            if !g.2.contains(&range) {
                g.2.push(range);
            }
        }
        None => {
            if let Some(it) = it() {
                groups.push((key, it, vec![range]));
            }
        }
    }
}

fn def_key(ix: &Index, def: &Def) -> Option<(PathBuf, usize)> {
    Some((ix.files.get(def.file)?.key.clone(), def.name_span.0))
}

pub fn incoming(
    st: &State,
    p: CallHierarchyIncomingCallsParams,
) -> Option<Vec<CallHierarchyIncomingCall>> {
    let (key, start, name) = named(&p.item)?;
    let mut groups: Groups = Vec::new();
    for ix in indexes(st, &name, true) {
        let Some(d) = ix.def_at(&key, start) else {
            continue;
        };
        for o in ix.occs_of(Target::Def(d)).filter(|o| !o.is_def) {
            let Some(c) = container(&ix, o.file, o.start) else {
                continue;
            };
            let (Some(ck), Some(at)) = (
                ix.defs.get(c).and_then(|cd| def_key(&ix, cd)),
                nav::location(st, &ix, o.file, o.start, o.end),
            ) else {
                continue;
            };
            gather(&mut groups, ck, || item(st, &ix, c), at.range);
        }
    }
    groups.sort_by(|a, b| a.0.cmp(&b.0));
    Some(
        groups
            .into_iter()
            .map(|(_, from, from_ranges)| CallHierarchyIncomingCall { from, from_ranges })
            .collect(),
    )
}

pub fn outgoing(
    st: &State,
    p: CallHierarchyOutgoingCallsParams,
) -> Option<Vec<CallHierarchyOutgoingCall>> {
    let (key, start, name) = named(&p.item)?;
    let mut groups: Groups = Vec::new();
    // The declaration is in an open compilation, or a workspace file.
    let mut ixs = indexes(st, &name, false);
    if !ixs.iter().any(|ix| ix.def_at(&key, start).is_some()) {
        ixs = indexes(st, &name, true);
    }
    let Some(ix) = ixs.into_iter().find(|ix| ix.def_at(&key, start).is_some()) else {
        return Some(Vec::new());
    };
    let d = ix.def_at(&key, start)?;
    let def = ix.defs.get(d)?;
    for o in ix
        .occs
        .iter()
        .filter(|o| o.file == def.file && !o.is_def && def.full.0 <= o.start && o.end <= def.full.1)
    {
        let Target::Def(t) = o.target else { continue };
        let Some(td) = ix.defs.get(t).filter(|td| NODES.contains(&td.kind)) else {
            continue;
        };
        // Only the calls made by this declaration, not by one nested in it.
        if t == d || container(&ix, o.file, o.start) != Some(d) {
            continue;
        }
        let (Some(tk), Some(at)) = (
            def_key(&ix, td),
            nav::location(st, &ix, o.file, o.start, o.end),
        ) else {
            continue;
        };
        gather(&mut groups, tk, || item(st, &ix, t), at.range);
    }
    Some(
        groups
            .into_iter()
            .map(|(_, to, from_ranges)| CallHierarchyOutgoingCall { to, from_ranges })
            .collect(),
    )
}
