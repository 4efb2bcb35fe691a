#![deny(missing_docs)]
//! FlashAttention for NVIDIA Hopper, with the GPU kernels written in Rust.
//!
//! ```no_run
//! use flash_attn3::{AttnOptions, DeviceTensor, DType, Gpu, flash_attn_func};
//! # fn main() -> Result<(), flash_attn3::AttnError> {
//! let gpu = Gpu::new(0)?;
//! let stream = gpu.new_stream()?;
//! let (b, s, h, d) = (2, 1024, 16, 128);
//! let data = vec![0.5f32; b * s * h * d];
//! let q = DeviceTensor::from_f32(&stream, DType::BF16, [b, s, h, d], &data)?;
//! let k = DeviceTensor::from_f32(&stream, DType::BF16, [b, s, h, d], &data)?;
//! let v = DeviceTensor::from_f32(&stream, DType::BF16, [b, s, h, d], &data)?;
//! let res = flash_attn_func(&gpu, &stream, &q.as_ref(), &k.as_ref(), &v.as_ref(),
//!                           &AttnOptions::default().causal(true))?;
//! let o: Vec<f32> = res.out.to_f32(&stream)?;
//! # Ok(()) }
//! ```
pub mod api;
pub mod bench;
pub mod check;
pub mod documents;
pub mod error;
pub mod fp8;
pub mod gpu;
pub mod plan;
pub mod plan_bwd;
pub mod plot;
pub mod reference;
pub mod sparse;
pub mod tensor;
pub mod tma;
pub mod variant;

pub use api::{AttnOutput, Grads, flash_attn_backward, flash_attn_backward_into, flash_attn_backward_raw, flash_attn_func, flash_attn_func_into, flash_attn_raw};
pub use common::fa3::Techniques;
pub use common::{Algo, DType};
pub use documents::{DocsDesc, DocumentMask};
pub use error::{Arg, AttnError, Result};
pub use gpu::{Gpu, GpuInfo, driver_present};
pub use plan::{AlibiDesc, AlibiSlopes, AttnOptions, DeviceVec, Schedule, TensorDesc, Window, plan_forward};
pub use plan_bwd::{BwdTensors, backward_workspace_bytes, plan_backward};
pub use tensor::{DeviceTensor, Element, Layout, TensorMut, TensorRef, round_to};
pub use sparse::{BlockMask, BlockMaskShape};
pub use variant::{UserVariant, VariantDesc, VariantModule};
