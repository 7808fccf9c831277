//! Which `candle_core::Device` a run computes on (`--device cpu|cuda[:N]`),
//! and the typed reasons one cannot be opened. The executor is device-generic:
//! shardc's own CPU kernels are chosen only where tensors live on the CPU
//! (`crate::kernels`), everything else is candle's, which the CUDA backend
//! provides when shardc is built with `--features cuda`.

use std::fmt;
use std::str::FromStr;

/// A device as the command line names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeviceArg {
    #[default]
    Cpu,
    /// The GPU with this ordinal.
    Cuda(usize),
}

/// Why a device cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceError {
    /// Not a device name.
    Name(String),
    /// This binary has no CUDA backend.
    NotBuilt,
    /// The CUDA backend could not open the GPU (no driver, no such ordinal).
    Open { ordinal: usize, why: String },
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceError::Name(s) => {
                write!(f, "`{s}` is not a device: `cpu`, `cuda` or `cuda:N`")
            }
            DeviceError::NotBuilt => write!(
                f,
                "this shardc was built without CUDA: `--device cuda` needs a build with \
                 `--features cuda` (`bash scripts/build-cuda.sh` makes one from PyPI's CUDA wheels)"
            ),
            DeviceError::Open { ordinal, why } => write!(
                f,
                "cannot open CUDA device {ordinal} (is the NVIDIA driver installed, and \
                 libcublas/libcurand on LD_LIBRARY_PATH?): {why}"
            ),
        }
    }
}

impl std::error::Error for DeviceError {}

impl FromStr for DeviceArg {
    type Err = DeviceError;
    fn from_str(s: &str) -> Result<Self, DeviceError> {
        match s {
            "cpu" => Ok(DeviceArg::Cpu),
            "cuda" | "gpu" => Ok(DeviceArg::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse::<usize>().ok())
                .map(DeviceArg::Cuda)
                .ok_or_else(|| DeviceError::Name(s.to_string())),
        }
    }
}

impl fmt::Display for DeviceArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceArg::Cpu => write!(f, "cpu"),
            DeviceArg::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl DeviceArg {
    /// Open the device.
    pub fn open(self) -> Result<candle_core::Device, DeviceError> {
        match self {
            DeviceArg::Cpu => Ok(candle_core::Device::Cpu),
            DeviceArg::Cuda(n) => open_cuda(n),
        }
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(ordinal: usize) -> Result<candle_core::Device, DeviceError> {
    // One explicit stream for every virtual device of the process (threads):
    // `Device::new_cuda` gives each thread its own default stream, and then a
    // collective launched by one device could run before the kernels another
    // device launched first (seen on an H100: ids exchanged before they were
    // written, a garbage size, an out-of-memory). On one stream the work runs
    // in the order the threads submit it, which the mesh's barriers fix.
    // cudarc panics (rather than erring) when libcuda cannot be loaded at all.
    let opened = std::panic::catch_unwind(|| candle_core::Device::new_cuda_with_stream(ordinal));
    match opened {
        Ok(Ok(d)) => {
            if let candle_core::Device::Cuda(c) = &d {
                // SAFETY: every tensor of the run lives on this one stream
                // (made just above, before any allocation), so the per-buffer
                // events that order uses across streams have nothing to order.
                unsafe { c.disable_event_tracking() };
            }
            Ok(d)
        }
        Ok(Err(e)) => Err(DeviceError::Open {
            ordinal,
            // candle appends a backtrace when RUST_BACKTRACE is set.
            why: e.to_string().lines().next().unwrap_or_default().to_string(),
        }),
        Err(_) => Err(DeviceError::Open {
            ordinal,
            why: "the CUDA driver library could not be loaded".into(),
        }),
    }
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_: usize) -> Result<candle_core::Device, DeviceError> {
    Err(DeviceError::NotBuilt)
}

/// Bytes the CUDA allocator holds on this process's GPU (`--mem` on a GPU),
/// or `None` on the CPU.
#[cfg(feature = "cuda")]
pub fn gpu_bytes_used(dev: &candle_core::Device) -> Option<u64> {
    let candle_core::Device::Cuda(c) = dev else {
        return None;
    };
    let ctx = c.cuda_stream().context().clone();
    ctx.mem_get_info()
        .ok()
        .map(|(free, total)| (total - free) as u64)
}

#[cfg(not(feature = "cuda"))]
pub fn gpu_bytes_used(_: &candle_core::Device) -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!("cpu".parse::<DeviceArg>(), Ok(DeviceArg::Cpu));
        assert_eq!("cuda".parse::<DeviceArg>(), Ok(DeviceArg::Cuda(0)));
        assert_eq!("cuda:3".parse::<DeviceArg>(), Ok(DeviceArg::Cuda(3)));
        assert!(matches!(
            "tpu".parse::<DeviceArg>(),
            Err(DeviceError::Name(_))
        ));
        assert!(matches!(
            "cuda:x".parse::<DeviceArg>(),
            Err(DeviceError::Name(_))
        ));
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_not_built() {
        assert_eq!(DeviceArg::Cuda(0).open().err(), Some(DeviceError::NotBuilt));
    }
}
