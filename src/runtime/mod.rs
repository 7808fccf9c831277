//! Stage 5: running the SPMD program on a mesh of virtual devices (candle tensors on
//! `std::thread`s), with exact gradients and our own optimizers.

pub mod checkpoint;
pub mod data;
pub mod exec;
pub mod fused;
pub mod init;
pub mod mesh;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod pipeline;
pub mod reload;
pub mod report;
pub mod sparse;
pub mod train;
