//! The C ABI of flash-attn3: the forward and backward on raw device pointers and a
//! caller's CUDA stream, for bindings that own their tensors (the PyTorch extension in
//! `python/flash_attn3_torch` loads this library with `ctypes`: no compiler on the
//! machine that installs it, and no PyTorch C++ ABI to match).
//!
//! Every function returns 0 on success and a negative code otherwise, with the message
//! of the last error on the calling thread from [`fa3_last_error`]. Nothing here panics
//! across the boundary: arguments are validated by the library's planners (the same
//! typed errors as the Rust API) before anything is launched.
//!
//! User-defined variants (`flash_attn3::VariantModule`): [`fa3_variant_module_load`]
//! loads a variant crate's PTX for a device and returns a handle, which
//! [`Fa3Options::variant_module`] names in a call (with the variant's index and its
//! buffer) until [`fa3_variant_module_free`] releases it. Handles are keys of a table, not
//! pointers: a freed or made-up handle is an error, never a dangling read.
use common::DType;
use cudarc::driver::sys::CUstream;
use flash_attn3::{AlibiDesc, AttnError, AttnOptions, BwdTensors, DeviceVec, DocsDesc, Gpu, Layout, TensorDesc, VariantDesc, VariantModule, Window};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, c_char};
use std::sync::{Arc, Mutex, OnceLock};

/// A tensor `[batch, seqlen, heads, hdim]` on the device: address, shape, strides in
/// elements, element type (0: f16, 1: bf16) and the elements its buffer holds from
/// `ptr` on (for the bounds check; the storage's size less the offset).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Fa3Tensor {
    pub ptr: u64,
    pub shape: [i64; 4],
    pub strides: [i64; 4],
    pub dtype: i32,
    pub numel_in_buffer: i64,
}

/// The options of a call (`flash_attn_func`'s): `softmax_scale` NaN for `1/sqrt(hdim)`;
/// `window_left` / `window_right` negative for unbounded (both: no window); `softcap` 0
/// for none; `sinks` a device address of f32 `[heads_q]` logits, or 0; `alibi_slopes` a
/// device address of f32 slopes, `[heads_q]` or with `alibi_per_batch` `[batch,
/// heads_q]`, or 0.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Fa3Options {
    pub softmax_scale: f32,
    pub causal: i32,
    pub window_left: i64,
    pub window_right: i64,
    pub softcap: f32,
    pub deterministic: i32,
    pub sinks: u64,
    pub alibi_slopes: u64,
    pub alibi_per_batch: i32,
    /// Packed documents: device address of int32 pairs `[start, end)`, one per key
    /// position (`[seqlen_k, 2]`, or `[batch, seqlen_k, 2]` when `doc_per_batch`), 0: none.
    pub doc_bounds: u64,
    /// Pairs at `doc_bounds`, and key positions per sequence of the mask.
    pub doc_positions: i64,
    pub doc_seqlen: i64,
    pub doc_per_batch: i32,
    /// A user-defined variant: the handle of its module ([`fa3_variant_module_load`], of
    /// the call's device; 0: none) and its index among the names the module was loaded
    /// with.
    pub variant_module: u64,
    pub variant_index: i64,
    /// The variant's buffer: device address of its 4-byte words (f32 or u32, as the
    /// variant reads them) and their count; 0, 0: none (every read yields 0).
    pub variant_data: u64,
    pub variant_words: i64,
}

/// Bad argument (the message names it).
pub const FA3_ERR_INVALID: i32 = -1;
/// A CUDA or kernel-loading failure.
pub const FA3_ERR_CUDA: i32 = -2;

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

fn fail(code: i32, msg: String) -> i32 {
    LAST_ERROR.with(|e| *e.borrow_mut() = msg);
    code
}

fn code_of(e: &AttnError) -> i32 {
    match e {
        AttnError::Driver(_) | AttnError::KernelLoad(_) | AttnError::NoDriver | AttnError::NoDevice { .. } | AttnError::UnsupportedGpu { .. } => {
            FA3_ERR_CUDA
        }
        _ => FA3_ERR_INVALID,
    }
}

/// The library's handle of device `ordinal` (its kernels loaded once per process).
fn gpu(ordinal: i32) -> Result<Arc<Gpu>, AttnError> {
    static GPUS: OnceLock<Mutex<HashMap<i32, Arc<Gpu>>>> = OnceLock::new();
    let mut gpus = GPUS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(g) = gpus.get(&ordinal) {
        return Ok(g.clone());
    }
    let ordinal_usize = usize::try_from(ordinal).map_err(|_| AttnError::NoDevice { ordinal: 0, detail: format!("device {ordinal}") })?;
    let g = Arc::new(Gpu::new(ordinal_usize)?);
    gpus.insert(ordinal, g.clone());
    Ok(g)
}

fn desc(t: &Fa3Tensor, name: &str) -> Result<TensorDesc, AttnError> {
    let dtype = match t.dtype {
        0 => DType::F16,
        1 => DType::BF16,
        d => return Err(AttnError::Unsupported(format!("{name}: dtype code {d} (0: f16, 1: bf16)"))),
    };
    let dim = |x: i64, what: &str| usize::try_from(x).map_err(|_| AttnError::Unsupported(format!("{name}: negative {what} {x}")));
    let shape = [dim(t.shape[0], "size")?, dim(t.shape[1], "size")?, dim(t.shape[2], "size")?, dim(t.shape[3], "size")?];
    let strides = [dim(t.strides[0], "stride")?, dim(t.strides[1], "stride")?, dim(t.strides[2], "stride")?, dim(t.strides[3], "stride")?];
    Ok(TensorDesc { dtype, layout: Layout { shape, strides }, addr: t.ptr, buffer_len: dim(t.numel_in_buffer, "buffer length")? })
}

/// The ALiBi slopes of a call on q of `shape` (the caller sized them as declared).
fn alibi(o: &Fa3Options, shape: [usize; 4]) -> Option<AlibiDesc> {
    let per_batch = o.alibi_per_batch != 0;
    let len = if per_batch { shape[0] * shape[2] } else { shape[2] };
    (o.alibi_slopes != 0).then_some(AlibiDesc { addr: o.alibi_slopes, len, per_batch })
}

/// The document mask of a call (the planner checks it against the call's shapes).
fn documents(o: &Fa3Options) -> Option<DocsDesc> {
    let n = |x: i64| usize::try_from(x).unwrap_or(0);
    (o.doc_bounds != 0).then_some(DocsDesc { addr: o.doc_bounds, positions: n(o.doc_positions), seqlen: n(o.doc_seqlen), per_batch: o.doc_per_batch != 0 })
}

/// A loaded variant module and the device it was loaded for.
struct LoadedModule {
    device: i32,
    gpu: Arc<Gpu>,
    module: VariantModule,
}

impl Drop for LoadedModule {
    fn drop(&mut self) {
        // Launches return before their kernels finish: unloading the module under a
        // running kernel is undefined, so the device's queued work ends first.
        let _ = self.gpu.context().synchronize();
    }
}

/// The loaded variant modules by handle (from 1; 0 is "none").
fn modules() -> std::sync::MutexGuard<'static, (u64, HashMap<u64, Arc<LoadedModule>>)> {
    static MODULES: OnceLock<Mutex<(u64, HashMap<u64, Arc<LoadedModule>>)>> = OnceLock::new();
    MODULES.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner())
}

/// The module a call names (`None` for handle 0), checked against the call's device.
fn module_of(handle: u64, device: i32) -> Result<Option<Arc<LoadedModule>>, AttnError> {
    if handle == 0 {
        return Ok(None);
    }
    let m = modules().1.get(&handle).cloned().ok_or_else(|| AttnError::InvalidVariant(format!("no variant module has handle {handle} (never loaded, or freed)")))?;
    if m.device != device {
        return Err(AttnError::InvalidVariant(format!("the variant module was loaded for device {}, the call runs on device {device}", m.device)));
    }
    Ok(Some(m))
}

/// The call's variant buffer as the raw API takes it (`None` without one: the planner
/// then refuses a variant that holds data, and data without a variant).
fn variant_desc(o: &Fa3Options) -> Result<Option<VariantDesc>, AttnError> {
    let words = usize::try_from(o.variant_words).map_err(|_| AttnError::InvalidVariant(format!("negative variant_words {}", o.variant_words)))?;
    Ok((o.variant_data != 0 || words != 0).then_some(VariantDesc { data: o.variant_data, words }))
}

/// The library's options of a call, with its variant from `module` (the module
/// [`Fa3Options::variant_module`] names).
fn options<'m>(o: &Fa3Options, module: Option<&'m LoadedModule>) -> Result<AttnOptions<'m>, AttnError> {
    let side = |w: i64| usize::try_from(w).ok();
    let mut opts = AttnOptions::default().causal(o.causal != 0).deterministic(o.deterministic != 0);
    if let Some(m) = module {
        let names = m.module.names();
        let name = usize::try_from(o.variant_index).ok().and_then(|i| names.get(i)).ok_or_else(|| {
            AttnError::InvalidVariant(format!("variant index {} out of range: the module holds {} ({names:?})", o.variant_index, names.len()))
        })?;
        opts = opts.variant(m.module.variant(name)?);
    }
    if !o.softmax_scale.is_nan() {
        opts = opts.softmax_scale(o.softmax_scale);
    }
    if o.softcap != 0.0 {
        opts = opts.softcap(o.softcap);
    }
    let window = Window { left: side(o.window_left), right: side(o.window_right) };
    if window.is_bounded() {
        opts.window = Some(window);
    }
    Ok(opts)
}

/// Runs `f` with the device's handle and the caller's stream, mapping errors to codes.
fn with_stream(device: i32, stream: u64, f: impl FnOnce(&Gpu, &Arc<cudarc::driver::CudaStream>) -> Result<(), AttnError>) -> i32 {
    let result = gpu(device).and_then(|g| {
        // SAFETY: the caller passes a stream of this device's primary context (PyTorch's
        // current stream) and keeps it alive during the call; work on it is ordered by
        // the stream itself.
        let s = unsafe { g.context().wrap_borrowed_stream(stream as CUstream) };
        f(&g, &s)
    });
    match result {
        Ok(()) => 0,
        Err(e) => fail(code_of(&e), e.to_string()),
    }
}

/// The forward: O into `out`, the natural-log LSE (`[batch, heads_q, seqlen_q]` f32) at
/// `lse` (`lse_len` floats), on `stream` of device `device`.
///
/// # Safety
/// The pointers must be valid `Fa3Tensor`s / `Fa3Options`, every device address and
/// extent in them live memory of the device until the launch completes on `stream`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fa3_forward(
    device: i32,
    stream: u64,
    q: *const Fa3Tensor,
    k: *const Fa3Tensor,
    v: *const Fa3Tensor,
    out: *const Fa3Tensor,
    lse: u64,
    lse_len: i64,
    opts: *const Fa3Options,
) -> i32 {
    // SAFETY: the caller passes valid pointers.
    let (q, k, v, out, o) = unsafe { (*q, *k, *v, *out, *opts) };
    with_stream(device, stream, |g, s| {
        let heads_q = usize::try_from(q.shape[2]).unwrap_or(0);
        let sinks = (o.sinks != 0).then_some(DeviceVec { addr: o.sinks, len: heads_q });
        let lse = (lse, usize::try_from(lse_len).unwrap_or(0));
        let (q, k, v, out) = (desc(&q, "q")?, desc(&k, "k")?, desc(&v, "v")?, desc(&out, "out")?);
        let alibi = alibi(&o, q.layout.shape);
        let module = module_of(o.variant_module, device)?;
        let opts = options(&o, module.as_deref())?;
        // SAFETY: the caller guarantees the memory (this function's contract).
        unsafe { flash_attn3::flash_attn_raw(g, s, &q, &k, &v, &out, lse, &opts, alibi, sinks, documents(&o), variant_desc(&o)?) }
    })
}

/// Bytes of workspace [`fa3_backward`] needs for q of shape `[batch, seqlen_q, heads_q,
/// hdim]`.
#[unsafe(no_mangle)]
pub extern "C" fn fa3_backward_workspace_bytes(batch: i64, seqlen_q: i64, heads_q: i64, hdim: i64) -> i64 {
    let u = |x: i64| usize::try_from(x).unwrap_or(0);
    flash_attn3::backward_workspace_bytes(u(batch), u(seqlen_q), u(heads_q), u(hdim)) as i64
}

/// The backward: dQ, dK, dV (and with `opts.sinks` and `dsinks != 0`, the sinks'
/// gradient, `[heads_q]` f32) from the forward's `out` and `lse` and `dout`, with the
/// scratch at `workspace` (`workspace_len` bytes, 256-byte aligned).
///
/// # Safety
/// As [`fa3_forward`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fa3_backward(
    device: i32,
    stream: u64,
    tensors: *const Fa3Tensor,
    lse: u64,
    lse_len: i64,
    dsinks: u64,
    workspace: u64,
    workspace_len: i64,
    opts: *const Fa3Options,
) -> i32 {
    // SAFETY: the caller passes 8 tensors: q, k, v, out, dout, dq, dk, dv.
    let (t, o) = unsafe { (std::slice::from_raw_parts(tensors, 8), *opts) };
    with_stream(device, stream, |g, s| {
        let names = ["q", "k", "v", "out", "dout", "dq", "dk", "dv"];
        let d: Vec<TensorDesc> = t.iter().zip(names).map(|(t, n)| desc(t, n)).collect::<Result<_, _>>()?;
        let heads_q = d[0].layout.shape[2];
        let vec = |addr: u64| (addr != 0).then_some(DeviceVec { addr, len: heads_q });
        let tensors = BwdTensors {
            q: d[0],
            k: d[1],
            v: d[2],
            out: d[3],
            dout: d[4],
            lse: (lse, usize::try_from(lse_len).unwrap_or(0)),
            dq: d[5],
            dk: d[6],
            dv: d[7],
            workspace: (workspace, usize::try_from(workspace_len).unwrap_or(0)),
            alibi: alibi(&o, d[0].layout.shape),
            sinks: vec(o.sinks).filter(|_| dsinks != 0),
            dsinks: vec(dsinks),
            documents: documents(&o),
            variant: variant_desc(&o)?,
        };
        let module = module_of(o.variant_module, device)?;
        // SAFETY: the caller guarantees the memory (this function's contract).
        unsafe { flash_attn3::flash_attn_backward_raw(g, s, &tensors, &options(&o, module.as_deref())?) }
    })
}

/// Loads a variant module (a variant crate's PTX, `ptx_len` bytes of text at `ptx`, built
/// by `ptx_builder::build_variant_module`) for device `device` with its variants `names`
/// (`count` NUL-terminated UTF-8 strings: the names given to `variant_kernels!`, in the
/// order [`Fa3Options::variant_index`] counts them), and writes its handle to `*handle`.
/// The module stays loaded until [`fa3_variant_module_free`]: keep it until the calls
/// that use it are done, their backward included.
///
/// # Safety
/// `ptx` must be valid for `ptx_len` bytes, `names` for `count` pointers to NUL-terminated
/// strings, `handle` for one write (null pointers are refused).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fa3_variant_module_load(device: i32, ptx: *const c_char, ptx_len: usize, names: *const *const c_char, count: usize, handle: *mut u64) -> i32 {
    let result = (|| {
        if ptx.is_null() || handle.is_null() || (names.is_null() && count > 0) {
            return Err(AttnError::InvalidVariant("null ptx, names or handle pointer".into()));
        }
        // SAFETY: the caller passes `ptx_len` readable bytes.
        let ptx = std::str::from_utf8(unsafe { std::slice::from_raw_parts(ptx as *const u8, ptx_len) })
            .map_err(|e| AttnError::KernelLoad(format!("variant module: the PTX is not UTF-8 text ({e})")))?;
        // SAFETY: the caller passes `count` pointers (checked non-null above when count > 0).
        let names = if count == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(names, count) } };
        let names = names
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                if n.is_null() {
                    return Err(AttnError::InvalidVariant(format!("variant name {i} is a null pointer")));
                }
                // SAFETY: a NUL-terminated string (the caller's contract).
                unsafe { CStr::from_ptr(n) }.to_str().map_err(|_| AttnError::InvalidVariant(format!("variant name {i} is not UTF-8")))
            })
            .collect::<Result<Vec<&str>, _>>()?;
        let g = gpu(device)?;
        let module = VariantModule::load(&g, ptx, &names)?;
        let mut table = modules();
        table.0 += 1;
        let h = table.0;
        table.1.insert(h, Arc::new(LoadedModule { device, gpu: g, module }));
        Ok(h)
    })();
    match result {
        Ok(h) => {
            // SAFETY: checked non-null; the caller passes a writable u64.
            unsafe { *handle = h };
            0
        }
        Err(e) => fail(code_of(&e), e.to_string()),
    }
}

/// Unloads the variant module of `handle` (after the device's queued work: a kernel of
/// it may still run). An unknown handle (0, freed, never loaded) is an error.
#[unsafe(no_mangle)]
pub extern "C" fn fa3_variant_module_free(handle: u64) -> i32 {
    // Out of the table's lock before the drop, which waits for the device.
    let removed = modules().1.remove(&handle);
    match removed {
        Some(_) => 0,
        None => fail(FA3_ERR_INVALID, AttnError::InvalidVariant(format!("no variant module has handle {handle} to free")).to_string()),
    }
}

/// Copies the last error's message on this thread into `buf` (`len` bytes, NUL
/// terminated, truncated if needed); returns the message's full length in bytes.
///
/// # Safety
/// `buf` must be valid for `len` bytes (or null with `len` 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fa3_last_error(buf: *mut c_char, len: usize) -> usize {
    LAST_ERROR.with(|e| {
        let e = e.borrow();
        if len > 0 && !buf.is_null() {
            let n = e.len().min(len - 1);
            // SAFETY: `buf` holds `len` bytes; `n + 1 <= len`.
            unsafe {
                std::ptr::copy_nonoverlapping(e.as_ptr() as *const c_char, buf, n);
                *buf.add(n) = 0;
            }
        }
        e.len()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No option set: the default scale, no mask, no variant.
    fn plain() -> Fa3Options {
        Fa3Options {
            softmax_scale: f32::NAN,
            causal: 0,
            window_left: -1,
            window_right: -1,
            softcap: 0.0,
            deterministic: 0,
            sinks: 0,
            alibi_slopes: 0,
            alibi_per_batch: 0,
            doc_bounds: 0,
            doc_positions: 0,
            doc_seqlen: 0,
            doc_per_batch: 0,
            variant_module: 0,
            variant_index: 0,
            variant_data: 0,
            variant_words: 0,
        }
    }

    fn tensor(shape: [i64; 4]) -> Fa3Tensor {
        let strides = [shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1];
        Fa3Tensor { ptr: 0x7f00_0000_0000, shape, strides, dtype: 1, numel_in_buffer: shape.iter().product() }
    }

    #[test]
    fn options_map_to_the_rust_api() {
        let o = Fa3Options { causal: 1, window_left: 128, ..plain() };
        let a = options(&o, None).unwrap();
        assert!(a.causal && a.softmax_scale.is_none() && a.softcap.is_none() && a.variant.is_none());
        assert_eq!(a.window, Some(Window { left: Some(128), right: None }));
        let none = options(&Fa3Options { window_left: -1, ..o }, None).unwrap();
        assert_eq!(none.window, None, "unbounded on both sides: no window");
        assert_eq!(options(&Fa3Options { softcap: 30.0, softmax_scale: 0.1, ..o }, None).unwrap().softcap, Some(30.0));
        assert_eq!(alibi(&o, [2, 64, 8, 64]), None);
        let per_batch = Fa3Options { alibi_slopes: 0x7f00_0000_0000, alibi_per_batch: 1, ..o };
        assert_eq!(alibi(&per_batch, [2, 64, 8, 64]).map(|a| (a.len, a.per_batch)), Some((16, true)));
        assert_eq!(documents(&o), None, "no documents: none");
        let docs = Fa3Options { doc_bounds: 0x7f00_0000_0000, doc_positions: 128, doc_seqlen: 64, doc_per_batch: 1, ..o };
        assert_eq!(documents(&docs), Some(DocsDesc { addr: 0x7f00_0000_0000, positions: 128, seqlen: 64, per_batch: true }));
    }

    #[test]
    fn options_layout_is_the_one_python_declares() {
        // flash_attn3_torch's ctypes `_Options` lists the same fields in this order.
        assert_eq!(std::mem::size_of::<Fa3Options>(), 120);
        assert_eq!(std::mem::offset_of!(Fa3Options, doc_per_batch), 80);
        assert_eq!(std::mem::offset_of!(Fa3Options, variant_module), 88);
        assert_eq!(std::mem::offset_of!(Fa3Options, variant_words), 112);
        assert_eq!(std::mem::size_of::<Fa3Tensor>(), 88);
    }

    #[test]
    fn variant_misuse_is_a_typed_error() {
        assert!(module_of(0, 0).unwrap().is_none(), "handle 0: no variant");
        let unknown = module_of(0xdead, 0).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(unknown.contains("no variant module has handle 57005"), "{unknown}");
        assert_eq!(variant_desc(&plain()).unwrap(), None, "no buffer");
        let data = Fa3Options { variant_data: 0x7f00_0000_0000, variant_words: 257, ..plain() };
        assert_eq!(variant_desc(&data).unwrap(), Some(VariantDesc { data: 0x7f00_0000_0000, words: 257 }));
        assert!(matches!(variant_desc(&Fa3Options { variant_words: -1, ..data }), Err(AttnError::InvalidVariant(_))));
        // A buffer without a variant: the planner refuses it before anything runs.
        let (q, lse) = (desc(&tensor([1, 64, 2, 64]), "q").unwrap(), (0x7f00_0000_0000, 128));
        let opts = options(&data, None).unwrap();
        let r = flash_attn3::plan_forward(&q, &q, &q, &q, lse, &opts, None, None, None, variant_desc(&data).unwrap(), 132);
        assert!(matches!(r, Err(AttnError::InvalidVariant(m)) if m.contains("without AttnOptions::variant")));
        assert_eq!(fa3_variant_module_free(0xdead), FA3_ERR_INVALID);
        assert_eq!(fa3_variant_module_free(0), FA3_ERR_INVALID);
    }

    #[test]
    fn variant_module_load_refuses_null_pointers_and_reports_no_device() {
        let mut handle = 0u64;
        let ptx = b".version 8.0";
        // SAFETY: null pointers are what is checked; nothing is read through them.
        let rc = unsafe { fa3_variant_module_load(0, std::ptr::null(), 0, std::ptr::null(), 0, &mut handle) };
        assert_eq!(rc, FA3_ERR_INVALID);
        // SAFETY: `ptx` holds its length; one name pointer that is null (refused).
        let names = [std::ptr::null::<c_char>()];
        let rc = unsafe { fa3_variant_module_load(0, ptx.as_ptr() as *const c_char, ptx.len(), names.as_ptr(), 1, &mut handle) };
        assert_eq!(rc, FA3_ERR_INVALID);
        // Valid arguments: on a machine without a GPU the device handle fails (a CUDA
        // error); with one, this text has no kernel of variant "v" (a load error too).
        let name = c"v";
        let names = [name.as_ptr()];
        // SAFETY: valid pointers and lengths.
        let rc = unsafe { fa3_variant_module_load(0, ptx.as_ptr() as *const c_char, ptx.len(), names.as_ptr(), 1, &mut handle) };
        assert_eq!((rc, handle), (FA3_ERR_CUDA, 0), "nothing is loaded, no handle written");
    }

    #[test]
    fn bad_tensors_are_refused_with_their_name() {
        let mut t = tensor([2, 128, 8, 64]);
        t.dtype = 7;
        assert!(desc(&t, "k").unwrap_err().to_string().contains("k: dtype code 7"));
        let mut t = tensor([2, 128, 8, 64]);
        t.strides[1] = -5;
        assert!(desc(&t, "q").unwrap_err().to_string().contains("q: negative stride"));
        let d = desc(&tensor([2, 128, 8, 64]), "q").unwrap();
        assert_eq!((d.layout.shape, d.layout.strides, d.dtype), ([2, 128, 8, 64], [65536, 512, 64, 1], DType::BF16));
    }

    #[test]
    fn errors_reach_the_caller_as_codes_and_messages() {
        // No driver on CI machines: the device handle fails, as a CUDA error with a message.
        let (o, q) = (plain(), tensor([1, 64, 2, 64]));
        // SAFETY: valid host structs; nothing is launched without a device.
        let rc = unsafe { fa3_forward(0, 0, &q, &q, &q, &q, 0x7f00_0000_0000, 128, &o) };
        if rc != 0 {
            let mut buf = [0 as c_char; 256];
            // SAFETY: 256 bytes.
            let n = unsafe { fa3_last_error(buf.as_mut_ptr(), buf.len()) };
            assert!(n > 0 && buf[0] != 0, "an error code comes with a message");
        }
    }
}
