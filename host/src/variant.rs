//! User-defined variants: a module of the library's kernels compiled for a user's
//! `common::variant::Variant` types (FlexAttention's `score_mod` / `mask_mod` in Rust),
//! and the buffer their functions read.
//!
//! A user crate builds the module from its `build.rs` with
//! `ptx_builder::build_variant_module` (see `common::variant` for the contract and
//! `examples/variants` for a complete crate), loads it once with [`VariantModule::load`],
//! and passes one of its variants with [`AttnOptions::variant`](crate::AttnOptions::variant),
//! forward and backward:
//!
//! ```no_run
//! # use flash_attn3::{AttnOptions, Gpu, VariantModule};
//! # fn f(gpu: &Gpu, ptx: &str, table: &cudarc::driver::CudaSlice<f32>) -> flash_attn3::Result<()> {
//! let module = VariantModule::load(gpu, ptx, &["rel_bias"])?;
//! let opts = AttnOptions::default().causal(true).variant(module.variant("rel_bias")?.data_f32(table));
//! # Ok(()) }
//! ```
use crate::error::{Arg, AttnError, Result};
use crate::gpu::Gpu;
use common::KernelEntry;
use common::variant::{SEPARATOR, VariantArgs};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, SyncOnDrop};
use std::fmt;
use std::sync::Arc;

/// A loaded variant module: for each variant name, the kernels of
/// `common::variant::KERNELS` (exported as `{name}__{kernel}`).
pub struct VariantModule {
    /// Unique per load (what a block mask records of the module it was built with).
    id: u64,
    ctx: Arc<CudaContext>,
    _module: Arc<CudaModule>,
    names: Vec<String>,
    /// `(variant index, kernel, function)`.
    functions: Vec<(usize, &'static KernelEntry, CudaFunction)>,
}

impl VariantModule {
    /// Loads `ptx` (a variant crate's module) into `gpu`'s context and looks up the
    /// kernels of the variants `names`. A missing kernel (a name the crate did not pass
    /// to `variant_kernels!`) or a kernel whose parameter block is not this library's
    /// (a module built against another version) is [`AttnError::KernelLoad`].
    pub fn load(gpu: &Gpu, ptx: &str, names: &[&str]) -> Result<Self> {
        // Checked before the driver compiles the module.
        let entries: Vec<(usize, &'static KernelEntry, String)> = names
            .iter()
            .enumerate()
            .flat_map(|(i, name)| common::variant::KERNELS.iter().map(move |k| (i, k, symbol(name, k))))
            .collect();
        for (_, k, symbol) in &entries {
            check_params(ptx, symbol, (k.tma_param_bytes > 0) as usize, k.params_bytes())?;
        }
        let ctx = gpu.context().clone();
        let module = ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx)).map_err(|e| AttnError::KernelLoad(format!("variant module: {e}")))?;
        let mut functions = Vec::with_capacity(entries.len());
        for (i, k, symbol) in entries {
            let f = module.load_function(&symbol).map_err(|e| AttnError::KernelLoad(format!("{symbol}: {e}")))?;
            gpu.prepare_function(k, &f)?;
            functions.push((i, k, f));
        }
        static LOADS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let id = LOADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(VariantModule { id, ctx, _module: module, names: names.iter().map(|n| n.to_string()).collect(), functions })
    }

    /// Variant `name` of this module, without data (see [`UserVariant::data_f32`]).
    pub fn variant(&self, name: &str) -> Result<UserVariant<'_>> {
        let index = self.names.iter().position(|n| n == name).ok_or_else(|| {
            AttnError::InvalidVariant(format!("no variant {name:?} in this module (loaded: {:?})", self.names))
        })?;
        Ok(UserVariant { module: self, index, data: None })
    }

    /// The variants' names, as loaded.
    pub fn names(&self) -> &[String] {
        &self.names
    }
}

/// The exported name of `kernel` (of `common::variant::KERNELS`) for variant `name`.
fn symbol(name: &str, kernel: &KernelEntry) -> String {
    format!("{name}{SEPARATOR}{}", kernel.name)
}

/// Checks that entry `symbol` of `ptx` takes a parameter block of `bytes` bytes as its
/// parameter `index` (1 after the tensor maps, else 0): the layout this library
/// launches with.
fn check_params(ptx: &str, symbol: &str, index: usize, bytes: usize) -> Result<()> {
    let decl = format!(" {symbol}_param_{index}[");
    let found = ptx.find(&decl).and_then(|i| ptx[i + decl.len()..].split(']').next()).and_then(|n| n.parse::<usize>().ok());
    match found {
        Some(n) if n == bytes => Ok(()),
        Some(n) => Err(AttnError::KernelLoad(format!(
            "{symbol} takes a {n}-byte parameter block, this library passes {bytes}: rebuild the variant module with this version"
        ))),
        None => Err(AttnError::KernelLoad(format!("{symbol}: not in the module (is it among the names given to variant_kernels!?)"))),
    }
}

/// One variant of a [`VariantModule`] and the buffer its functions read (none: every
/// read yields 0).
#[derive(Clone, Copy)]
pub struct UserVariant<'a> {
    module: &'a VariantModule,
    index: usize,
    data: Option<VariantBuffer<'a>>,
}

/// The device buffer of a variant, in 4-byte words.
#[derive(Clone, Copy)]
enum VariantBuffer<'a> {
    F32(&'a CudaSlice<f32>),
    U32(&'a CudaSlice<u32>),
}

impl fmt::Debug for UserVariant<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let words = self.data.map(|d| match d {
            VariantBuffer::F32(s) => s.len(),
            VariantBuffer::U32(s) => s.len(),
        });
        f.debug_struct("UserVariant").field("name", &self.name()).field("data_words", &words).finish()
    }
}

impl<'a> UserVariant<'a> {
    /// Reads `data` (f32 words; `VariantData::f32_at`).
    pub fn data_f32(mut self, data: &'a CudaSlice<f32>) -> Self {
        self.data = Some(VariantBuffer::F32(data));
        self
    }

    /// Reads `data` (u32 words; `VariantData::u32_at`).
    pub fn data_u32(mut self, data: &'a CudaSlice<u32>) -> Self {
        self.data = Some(VariantBuffer::U32(data));
        self
    }

    /// Which load of a module this variant is of (with [`UserVariant::index`], its
    /// identity).
    pub(crate) fn module_id(&self) -> u64 {
        self.module.id
    }

    /// Its index among the module's variants.
    pub(crate) fn index(&self) -> usize {
        self.index
    }

    /// Whether a buffer was given.
    pub fn has_data(&self) -> bool {
        self.data.is_some()
    }

    /// The variant's name in its module.
    pub fn name(&self) -> &'a str {
        &self.module.names[self.index]
    }

    /// The kernels' view of the buffer, and the guard that orders the launch after its
    /// last write (held until the launch is queued).
    pub(crate) fn desc(&self, stream: &'a Arc<CudaStream>) -> (VariantDesc, Option<SyncOnDrop<'a>>) {
        let (data, words, sync) = match self.data {
            None => (0, 0, None),
            Some(VariantBuffer::F32(s)) => {
                let (p, sync) = s.device_ptr(stream);
                (p, s.len(), Some(sync))
            }
            Some(VariantBuffer::U32(s)) => {
                let (p, sync) = s.device_ptr(stream);
                (p, s.len(), Some(sync))
            }
        };
        (VariantDesc { data, words }, sync)
    }

    /// The loaded function of `kernel` (of `common::variant::KERNELS`), if this variant's
    /// module lives in `gpu`'s context.
    pub(crate) fn function(&self, gpu: &Gpu, kernel: &KernelEntry) -> Result<&'a CudaFunction> {
        if !Arc::ptr_eq(&self.module.ctx, gpu.context()) {
            return Err(AttnError::InvalidVariant(format!("variant {:?} was loaded with another Gpu handle", self.name())));
        }
        self.module
            .functions
            .iter()
            .find(|(i, k, _)| *i == self.index && k.name == kernel.name)
            .map(|(_, _, f)| f)
            .ok_or_else(|| AttnError::KernelLoad(format!("{} is not loaded", symbol(self.name(), kernel))))
    }
}

/// A variant's buffer as the planners take it: device address and length in 4-byte words
/// (0, 0: none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VariantDesc {
    /// Device address of word 0.
    pub data: u64,
    /// Words in the buffer.
    pub words: usize,
}

impl VariantDesc {
    /// The kernels' parameters, after checking the buffer (4-byte aligned, at most
    /// `u32::MAX` words, non-null when not empty).
    pub(crate) fn check(&self) -> Result<VariantArgs> {
        if self.words == 0 {
            return Ok(VariantArgs::default());
        }
        if self.words > u32::MAX as usize {
            return Err(AttnError::TooLarge(format!("variant data of {} words", self.words)));
        }
        if self.data == 0 || self.data % 4 != 0 {
            return Err(AttnError::Misaligned { arg: Arg::VariantData, detail: format!("address {:#x} is null or not 4-byte aligned", self.data) });
        }
        Ok(VariantArgs { data: self.data, words: self.words as u32, _pad: 0 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_module_with_another_parameter_block_is_refused() {
        let ptx = ".visible .entry v__k(\n\t.param .align 128 .b8 v__k_param_0[512],\n\t.param .align 8 .b8 v__k_param_1[416]\n)";
        assert!(check_params(ptx, "v__k", 1, 416).is_ok());
        assert!(matches!(check_params(ptx, "v__k", 1, 432), Err(AttnError::KernelLoad(m)) if m.contains("416-byte")));
        assert!(matches!(check_params(ptx, "w__k", 1, 416), Err(AttnError::KernelLoad(m)) if m.contains("not in the module")));
        // A kernel without tensor maps takes its block first.
        let ptx = ".visible .entry v__b(\n\t.param .align 8 .b8 v__b_param_0[96]\n)";
        assert!(check_params(ptx, "v__b", 0, 96).is_ok());
    }

    #[test]
    fn variant_data_is_checked() {
        assert_eq!(VariantDesc::default().check().unwrap(), VariantArgs::default(), "no data: reads yield 0");
        let ok = VariantDesc { data: 0x1000, words: 7 }.check().unwrap();
        assert_eq!((ok.data, ok.words), (0x1000, 7));
        for bad in [VariantDesc { data: 0x1002, words: 7 }, VariantDesc { data: 0, words: 7 }] {
            assert!(matches!(bad.check(), Err(AttnError::Misaligned { arg: Arg::VariantData, .. })), "{bad:?}");
        }
        assert!(matches!(VariantDesc { data: 0x1000, words: 1 << 33 }.check(), Err(AttnError::TooLarge(_))));
    }
}
