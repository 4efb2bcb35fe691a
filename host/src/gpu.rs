//! The GPU handle: driver, context, the embedded PTX module and its kernels.
use crate::error::{AttnError, Result};
use common::{KERNELS, KernelEntry};
use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig,
};
use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex};

/// The kernels of `kernels-gpu`, built to PTX by `build.rs` and embedded here.
pub static PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels.ptx"));

/// What the host learned about the GPU.
#[derive(Clone, Debug)]
pub struct GpuInfo {
    /// The device ordinal it was opened with.
    pub ordinal: usize,
    /// The device's name, as the driver reports it.
    pub name: String,
    /// Compute capability, major version (9 on Hopper).
    pub major: i32,
    /// Compute capability, minor version (0 on Hopper).
    pub minor: i32,
    /// Streaming multiprocessors; a persistent grid launches at most one CTA per SM.
    pub sm_count: u32,
    /// Largest dynamic shared memory a CTA may opt into, bytes.
    pub max_smem_per_block: u32,
    /// CUDA driver version as `cuDriverGetVersion` gives it: `1000 * major + 10 * minor`
    /// (12040 for 12.4).
    pub driver_version: i32,
}

/// An sm_90 GPU with the attention kernels loaded. Cheap to share (`&Gpu`).
pub struct Gpu {
    ctx: Arc<CudaContext>,
    _module: Arc<CudaModule>,
    /// Each kernel, and for cluster kernels how many CTAs can run at once (whole clusters).
    functions: Vec<(KernelEntry, CudaFunction, Option<u32>)>,
    info: GpuInfo,
    /// The dynamic schedule's tile counters.
    counters: Mutex<TileCounters>,
}

/// The tile counters, one per stream (launches on one stream run in order, so they can
/// share one), most recently used last, and the private stream that allocates and frees
/// them.
#[derive(Default)]
struct TileCounters {
    /// Created with the first counter. A counter's allocation and free are never enqueued
    /// on a user's stream: that stream may be capturing a graph on another thread by the
    /// time its counter is evicted, and the free would land in the graph. What a user
    /// stream does get is ordering only, and only while it launches (not capturing): a
    /// wait for the zeroing when its counter is created, and an event record after each
    /// launch (with cudarc's event tracking on, also cudarc's own waits and record).
    ///
    /// Created lazily because making a stream switches cudarc's context to multi-stream
    /// mode (event tracking on every buffer); by the time a cached counter is needed the
    /// user has a stream of their own, so the mode is already on, unless all their
    /// streams are wrapped foreign handles: then cudarc synchronizes the context once.
    private: Option<Arc<CudaStream>>,
    cached: Vec<TileCounter>,
    /// Evicted counters whose stream may still be running a launch that uses them. They
    /// are freed once their `done` event has completed, so the private stream never
    /// waits on a user stream's pending work: a new counter's zeroing queued behind such
    /// a wait would tie a new stream's first launch to an unrelated stream's last one.
    retired: Vec<TileCounter>,
}

/// A stream's tile counter and its value once the launches issued so far have run.
struct TileCounter {
    /// The user stream's driver id.
    stream: u64,
    /// Allocated on the private stream, freed there by `drop` (leaked if the free could
    /// not be ordered after its last use).
    buf: ManuallyDrop<CudaSlice<u32>>,
    /// `buf`'s address, taken once: the launches use it without cudarc's per-call event
    /// waits and records, since the handle's own events already order the zeroing before
    /// the stream's first launch and the free after its last.
    ptr: u64,
    next_base: u32,
    /// Recorded on the user stream after each launch that used `buf`: the private stream
    /// waits for it before the free. Explicit, so that it holds with cudarc's event
    /// tracking turned off, as graph users do.
    done: CudaEvent,
}

impl Drop for TileCounter {
    fn drop(&mut self) {
        // The free is stream-ordered on the private stream: after `done` there, or, if that
        // wait cannot be enqueued, after `done` on the host. Errors can only be reported
        // through the context, as cudarc does for its frees.
        let stream = self.buf.stream().clone();
        let ordered = stream.wait(&self.done).or_else(|_| self.done.synchronize());
        match ordered {
            // SAFETY: dropped once, here; not used after.
            Ok(()) => unsafe { ManuallyDrop::drop(&mut self.buf) },
            // A kernel may still increment it: leak 4 bytes rather than free it early.
            Err(e) => stream.context().record_err(Err::<(), _>(e)),
        }
    }
}

/// Streams whose counters are kept; past this, the least recently used one is dropped
/// (freed on the private stream once its last launch has run).
pub const MAX_TILE_COUNTERS: usize = 8;

/// Whether `libcuda` can be loaded at all (false on machines without a driver).
#[cfg(feature = "dynamic-loading")]
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether `libcuda` can be loaded at all: always, when CUDA is linked at build time
/// (the process could not have started without it).
#[cfg(not(feature = "dynamic-loading"))]
pub fn driver_present() -> bool {
    true
}

impl Gpu {
    /// Opens GPU `ordinal`, checks it is a Hopper (sm_90) part and loads the kernels.
    pub fn new(ordinal: usize) -> Result<Self> {
        if !driver_present() {
            return Err(AttnError::NoDriver);
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| AttnError::NoDevice { ordinal, detail: e.to_string() })?;
        Self::with_context(ctx)
    }

    /// Loads the kernels into a context someone else made (candle's device, for one), so
    /// that the attention calls take that context's streams; checks it is a Hopper (sm_90)
    /// part.
    pub fn with_context(ctx: Arc<CudaContext>) -> Result<Self> {
        let ordinal = ctx.ordinal();
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
            prepare_function(&info, &k, &f)?;
            let smem = crate::plan::smem_bytes(&k);
            // A persistent grid must not ask for more clusters than fit at once (the rest
            // would wait for whole clusters to finish).
            let resident = if k.cluster > 1 {
                let cfg = LaunchConfig {
                    grid_dim: (k.cluster * info.sm_count, 1, 1),
                    block_dim: (crate::plan::block_threads(&k), 1, 1),
                    shared_mem_bytes: smem,
                };
                // An opt-in kernel: if the driver cannot say, launch at most one cluster so
                // the rest of the library still loads.
                Some(f.occupancy_max_active_clusters(cfg, &ctx.default_stream()).map_or(k.cluster, |c| c * k.cluster))
            } else {
                None
            };
            functions.push((k, f, resident));
        }
        Ok(Gpu { ctx, _module: module, functions, info, counters: Mutex::new(TileCounters::default()) })
    }

    /// What was learned about the GPU when it was opened.
    pub fn info(&self) -> &GpuInfo {
        &self.info
    }

    /// The CUDA context the kernels are loaded in; the streams given to the attention
    /// calls must belong to it (see [`Gpu::new_stream`]).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// A new non-default stream on this GPU.
    pub fn new_stream(&self) -> Result<Arc<CudaStream>> {
        Ok(self.ctx.new_stream()?)
    }

    /// For a cluster kernel, the most of its CTAs that run at once (the driver's
    /// occupancy answer, in whole clusters); `None` for other kernels.
    pub fn resident_ctas(&self, entry: &KernelEntry) -> Option<u32> {
        self.function(entry).and_then(|(_, r)| r)
    }

    /// Runs `launch` with a tile counter (address, base) for `stream`: the stream's cached
    /// one, allocated zeroed on first use, whose base moves on by `claims` (the number of
    /// increments the launch makes) when the launch succeeds. The lock is held across the
    /// launch, so concurrent callers on one stream enqueue in the order of their bases.
    ///
    /// A fresh zeroed counter per call (base 0, a memset on the stream, as before the
    /// cache) where a cached one could be shared or go stale:
    /// - a stream being captured into a CUDA graph: the launch is recorded, not run, and a
    ///   replay would reuse its base;
    /// - the default-stream handles (null, legacy, per-thread): the per-thread handle, and
    ///   the null one in per-thread builds, name a different stream on every host thread,
    ///   so none of them is cached.
    ///
    /// Streams are told apart by their driver id (`cuStreamGetId`), which no later stream
    /// reuses, not by their handle, which a new stream may get once an old one is gone.
    pub(crate) fn with_tile_counter<T>(
        &self,
        stream: &Arc<CudaStream>,
        claims: u32,
        launch: impl FnOnce(u64, u32) -> Result<T>,
    ) -> Result<T> {
        let Some(key) = cacheable_stream_id(stream)? else {
            // On the stream itself, with cudarc's ordering: freed there after the launch.
            let mut buf = stream.alloc_zeros::<u32>(1)?;
            let (ptr, _sync) = buf.device_ptr_mut(stream);
            return launch(ptr, 0);
        };
        // A poisoned lock only means another launch panicked; the cache stays consistent.
        let mut counters = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        // Frees the retired counters whose last launch has run (a failed query keeps one).
        counters.retired.retain(|c| !c.done.try_is_complete().unwrap_or(false));
        let mut c = match counters.cached.iter().position(|c| c.stream == key) {
            Some(i) => counters.cached.remove(i),
            None => {
                if counters.cached.len() == MAX_TILE_COUNTERS {
                    let old = counters.cached.remove(0);
                    counters.retired.push(old);
                }
                let private = match &counters.private {
                    Some(p) => p.clone(),
                    None => counters.private.insert(self.ctx.new_stream()?).clone(),
                };
                let buf = private.alloc_zeros::<u32>(1)?;
                // The zeroing runs on the private stream: the user's stream waits for it.
                stream.wait(&private.record_event(None)?)?;
                let ptr = buf.device_ptr(&private).0;
                TileCounter { stream: key, buf: ManuallyDrop::new(buf), ptr, next_base: 0, done: self.ctx.new_event(None)? }
            }
        };
        let r = launch(c.ptr, c.next_base);
        // Recorded whatever `launch` returned, so that `done` covers anything it enqueued.
        if c.done.record(stream).is_err() {
            // `done` cannot cover this launch: free the counter only after the stream has
            // run it (and leak it if even that cannot be known).
            match stream.synchronize() {
                Ok(()) => drop(c),
                Err(e) => {
                    std::mem::forget(c);
                    return Err(e.into());
                }
            }
            return r;
        }
        match r {
            Ok(v) => {
                c.next_base = c.next_base.wrapping_add(claims);
                counters.cached.push(c);
                Ok(v)
            }
            // A failed launch drops the entry: the stream's next launch starts from a fresh
            // zero.
            Err(e) => {
                counters.retired.push(c);
                Err(e)
            }
        }
    }

    /// Opts `f` (kernel `k` of another module, a variant's) into its shared memory.
    pub(crate) fn prepare_function(&self, k: &KernelEntry, f: &CudaFunction) -> Result<()> {
        prepare_function(&self.info, k, f)
    }

    /// The loaded kernel, and for a cluster kernel the most CTAs that run at once.
    pub(crate) fn function(&self, entry: &KernelEntry) -> Option<(&CudaFunction, Option<u32>)> {
        self.functions.iter().find(|(k, _, _)| k.name == entry.name).map(|(_, f, r)| (f, *r))
    }
}

/// Opts kernel `k`'s function into the dynamic shared memory it needs, if the GPU has it.
fn prepare_function(info: &GpuInfo, k: &KernelEntry, f: &CudaFunction) -> Result<()> {
    let smem = crate::plan::smem_bytes(k);
    if smem > info.max_smem_per_block {
        return Err(AttnError::KernelLoad(format!("{} needs {smem} B of shared memory, the GPU allows {}", k.name, info.max_smem_per_block)));
    }
    f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)?;
    Ok(())
}

/// `stream`'s driver id if its launches may share a cached tile counter (see
/// [`Gpu::with_tile_counter`]); `None` for the default streams and while capturing.
fn cacheable_stream_id(stream: &CudaStream) -> Result<Option<u64>> {
    use cudarc::driver::sys;
    let handle = stream.cu_stream();
    // The null, legacy (0x1) and per-thread (0x2) default streams.
    if (handle as usize) <= 2 {
        return Ok(None);
    }
    if stream.capture_status()? != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
        return Ok(None);
    }
    let mut id = 0u64;
    // SAFETY: a live stream handle and a valid out pointer.
    unsafe { sys::cuStreamGetId(handle, &mut id) }.result()?;
    Ok(Some(id))
}

fn driver_version() -> i32 {
    let mut v = 0;
    // SAFETY: writes one int; the driver is loaded and initialised by now.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    v
}
