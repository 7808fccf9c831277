//! shardc: a declarative language for sharded model definitions.
//!
//! Pipeline (one module per stage): [`parse`] → [`resolve`] → [`check`] → [`data`], all driven
//! by [`world::compile`]; [`diag`] holds the diagnostic model and its rendering.

pub mod arrays;
pub mod ast;
pub mod check;
pub mod cli;
pub mod data;
pub mod diag;
pub mod embed;
pub mod files;
pub mod fmt;
pub mod init;
pub mod layout;
pub mod lower;
pub mod lsp;
pub mod mesh;
pub mod parse;
pub mod plan;
pub mod prim;
pub mod resolve;
pub mod runtime;
pub mod schedule;
pub mod source;
pub mod spec;
pub mod spmd;
pub mod types;
pub mod units;
pub mod watch;
pub mod world;
