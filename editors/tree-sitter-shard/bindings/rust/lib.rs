//! The shard tree-sitter grammar for the `tree-sitter` crate:
//! `parser.set_language(&tree_sitter_shard::LANGUAGE.into())`. The parser is
//! generated from `grammar.js` (which mirrors `grammar/shard.pest`) and
//! committed, so building needs only a C compiler.

use tree_sitter_language::LanguageFn;

extern "C" {
    fn tree_sitter_shard() -> *const ();
}

/// The grammar.
pub const LANGUAGE: LanguageFn = unsafe { LanguageFn::from_raw(tree_sitter_shard) };

/// `node-types.json`: the node kinds and their fields.
pub const NODE_TYPES: &str = include_str!("../../src/node-types.json");

/// The highlight queries (nvim-treesitter capture names).
pub const HIGHLIGHTS_QUERY: &str = include_str!("../../queries/highlights.scm");
