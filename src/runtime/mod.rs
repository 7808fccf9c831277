//! Stage 10 (runtime): running the SPMD program on a mesh of virtual devices (candle tensors on
//! `std::thread`s), or one device per MPI process, with exact gradients and our
//! own optimizers. It takes the lowered program, the typed training
//! specification ([`crate::spec`]) and the data the data stage loaded.

pub mod buffers;
pub mod checkpoint;
pub mod config;
pub mod data;
pub mod device;
pub mod error;
pub mod exec;
pub mod lock;
pub mod memory;
pub mod mesh;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod optim;
mod passes;
pub mod pieces;
pub mod pipeline;
pub mod precision;
pub mod probe;
pub mod profile;
pub mod reload;
pub mod report;
pub mod sparse;
mod split;
pub mod tensorboard;
pub mod train;
mod worker;
