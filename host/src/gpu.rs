//! The GPU handle: driver, context, the embedded PTX module and its kernels.
use crate::error::{AttnError, Result};
use common::{Algo, DType, KERNELS, KernelEntry};
use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use std::sync::Arc;

/// The kernels of `kernels-gpu`, built to PTX by `build.rs` and embedded here.
pub static PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels.ptx"));

/// What the host learned about the GPU.
#[derive(Clone, Debug)]
pub struct GpuInfo {
    pub ordinal: usize,
    pub name: String,
    pub major: i32,
    pub minor: i32,
    pub sm_count: u32,
    /// Largest dynamic shared memory a CTA may opt into, bytes.
    pub max_smem_per_block: u32,
    pub driver_version: i32,
}

/// An sm_90 GPU with the attention kernels loaded. Cheap to share (`&Gpu`).
pub struct Gpu {
    ctx: Arc<CudaContext>,
    _module: Arc<CudaModule>,
    functions: Vec<(KernelEntry, CudaFunction)>,
    info: GpuInfo,
}

/// Whether `libcuda` can be loaded at all (false on machines without a driver).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

impl Gpu {
    /// Opens GPU `ordinal`, checks it is a Hopper (sm_90) part and loads the kernels.
    pub fn new(ordinal: usize) -> Result<Self> {
        if !driver_present() {
            return Err(AttnError::NoDriver);
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| AttnError::NoDevice { ordinal, detail: e.to_string() })?;
        let (major, minor) = ctx.compute_capability()?;
        let name = ctx.name()?;
        // The PTX targets sm_90a, which only sm_90 parts run.
        if (major, minor) != (9, 0) {
            return Err(AttnError::UnsupportedGpu { name, major, minor });
        }
        let attr = |a| ctx.attribute(a).map_err(AttnError::from);
        let info = GpuInfo {
            ordinal,
            name,
            major,
            minor,
            sm_count: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
            max_smem_per_block: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?
                as u32,
            driver_version: driver_version(),
        };
        let module = ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(PTX))
            .map_err(|e| AttnError::KernelLoad(e.to_string()))?;
        let mut functions = Vec::with_capacity(KERNELS.len());
        for k in KERNELS {
            let f = module.load_function(k.name).map_err(|e| AttnError::KernelLoad(format!("{}: {e}", k.name)))?;
            let smem = crate::plan::smem_bytes(&k);
            if smem > info.max_smem_per_block {
                return Err(AttnError::KernelLoad(format!(
                    "{} needs {smem} B of shared memory, the GPU allows {}",
                    k.name, info.max_smem_per_block
                )));
            }
            f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)?;
            functions.push((k, f));
        }
        Ok(Gpu { ctx, _module: module, functions, info })
    }

    pub fn info(&self) -> &GpuInfo {
        &self.info
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// A new non-default stream on this GPU.
    pub fn new_stream(&self) -> Result<Arc<CudaStream>> {
        Ok(self.ctx.new_stream()?)
    }

    pub(crate) fn function(&self, algo: Algo, hdim: u32, dtype: DType) -> Option<&CudaFunction> {
        self.functions
            .iter()
            .find(|(k, _)| k.algo == algo && k.hdim == hdim && k.dtype == dtype)
            .map(|(_, f)| f)
    }
}

fn driver_version() -> i32 {
    let mut v = 0;
    // SAFETY: writes one int; the driver is loaded and initialised by now.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    v
}
