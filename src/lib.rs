//! shardc: a declarative language for sharded model definitions, its checker and
//! its SPMD interpreter.
//!
//! The stages, in order. A module uses only modules of its own stage or of
//! earlier ones (`tests/stages.rs` enforces this list); each stage returns one
//! typed result to the next, and [`world::compile`] drives them.
//!
//! 0. foundation: [`source`], [`diag`], [`units`], [`files`], [`access`], [`arrays`], [`heap`], [`pool`], [`kernels`], [`fault`]
//! 1. syntax: [`ast`], [`parse`], [`reparse`], [`fmt`]
//! 2. core: [`types`], [`mesh`], [`init`], [`init_fast`], [`embed`], [`vocab`], [`schedule`]
//! 3. resolve: [`resolve`]
//! 4. spec: [`spec`]
//! 5. ir: [`prim`], [`spmd`], [`optim`]
//! 6. check: [`check`]
//! 7. lower: [`lower`], [`step`]
//! 8. plan: [`plan`], [`weights`]
//! 9. data: [`data`]
//! 10. runtime: [`runtime`]
//! 11. driver: [`world`]
//! 12. show and search: [`layout`], [`autoshard`]
//! 13. editor: [`lsp`]
//! 14. watch: [`watch`]
//! 15. command line: [`cli`]
//!
//! Source text is parsed (pest) into a syntax tree, resolved into one namespace
//! of layers, constants and meshes, and its `train` and table declarations read
//! into a typed specification (their words — optimizers, schedules, data
//! sources, losses, metrics, precisions, options — from one registry,
//! [`vocab`]). The checker types every value (dtype, global
//! shape, sharding, pending reductions) with the rules of the primitives
//! ([`prim`]: one module per op holds its type rule, kernel, derivative and
//! cost) and records typed function bodies with the reshards it inserts; the
//! lowering inlines them into one SPMD program per trained model; the plan is
//! a pass over that program; the data stage reads and checks the training data;
//! the runtime trains the program on a mesh of devices.

pub mod access;
pub mod arrays;
pub mod ast;
pub mod autoshard;
pub mod check;
pub mod cli;
pub mod data;
pub mod diag;
pub mod embed;
pub mod fault;
pub mod files;
pub mod fmt;
pub mod heap;
pub mod init;
pub mod init_fast;
pub mod kernels;
pub mod layout;
pub mod lower;
pub mod lsp;
pub mod mesh;
pub mod optim;
pub mod parse;
pub mod plan;
pub mod pool;
pub mod prim;
pub mod reparse;
pub mod resolve;
pub mod runtime;
pub mod schedule;
pub mod source;
pub mod spec;
pub mod spmd;
pub mod step;
pub mod types;
pub mod units;
pub mod vocab;
pub mod watch;
pub mod weights;
pub mod world;
