//! The one error type of the host API.
use common::DType;
use std::fmt;

/// Which argument of an attention call an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    /// The queries `q`.
    Q,
    /// The keys `k`.
    K,
    /// The values `v`.
    V,
    /// The output O (`out`).
    Out,
    /// The log-sum-exp output (`lse`).
    Lse,
    /// The gradient of the loss with respect to the output (`dout`, backward).
    DOut,
    /// The gradient output for q (`dq`, backward).
    Dq,
    /// The gradient output for k (`dk`, backward).
    Dk,
    /// The gradient output for v (`dv`, backward).
    Dv,
    /// The caller-given scratch buffer of the backward (`workspace`).
    Workspace,
    /// The ALiBi slopes (`AttnOptions::alibi`).
    AlibiSlopes,
    /// The attention sinks' logits (`AttnOptions::sinks`).
    Sinks,
    /// The sinks' gradient output (`dsinks`, backward).
    DSinks,
    /// The FP8 forward's dequantization factors of q (`scales.q`).
    QDescale,
    /// Those of k (`scales.k`).
    KDescale,
    /// Those of v (`scales.v`).
    VDescale,
    /// The random signs of incoherent processing (`QuantizeOptions::hadamard`).
    Signs,
    /// The document mask (`AttnOptions::documents`).
    Documents,
    /// A user-defined variant's buffer (`UserVariant::data_f32` / `data_u32`).
    VariantData,
}

impl fmt::Display for Arg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Arg::Q => "q",
            Arg::K => "k",
            Arg::V => "v",
            Arg::Out => "out",
            Arg::Lse => "lse",
            Arg::AlibiSlopes => "alibi_slopes",
            Arg::Sinks => "sinks",
            Arg::DSinks => "dsinks",
            Arg::QDescale => "q_descale",
            Arg::KDescale => "k_descale",
            Arg::VDescale => "v_descale",
            Arg::Signs => "signs",
            Arg::Documents => "documents",
            Arg::VariantData => "variant data",
            Arg::DOut => "dout",
            Arg::Dq => "dq",
            Arg::Dk => "dk",
            Arg::Dv => "dv",
            Arg::Workspace => "workspace",
        })
    }
}

/// Everything that can go wrong, each case precise enough to act on.
#[derive(Debug)]
pub enum AttnError {
    /// `libcuda` could not be loaded: no NVIDIA driver on this machine.
    NoDriver,
    /// The driver loaded but reports no usable GPU (or the ordinal is out of range).
    NoDevice {
        /// The device ordinal asked for.
        ordinal: usize,
        /// The driver's reason.
        detail: String,
    },
    /// The GPU is not a Hopper (sm_90) part: the kernels use sm_90a instructions, which
    /// only sm_90 runs.
    UnsupportedGpu {
        /// The device's name, as the driver reports it.
        name: String,
        /// Compute capability, major version.
        major: i32,
        /// Compute capability, minor version.
        minor: i32,
    },
    /// The embedded PTX could not be loaded or a kernel is missing from it.
    KernelLoad(String),
    /// A CUDA driver call failed.
    Driver(cudarc::driver::DriverError),
    /// A dimension is zero.
    EmptyDim {
        /// The tensor with the empty dimension.
        arg: Arg,
        /// Its shape, `[batch, seqlen, heads, hdim]`.
        shape: [usize; 4],
    },
    /// Shapes of q, k, v (or out/lse) do not fit together.
    ShapeMismatch(String),
    /// Head dimension without a kernel.
    UnsupportedHeadDim {
        /// q's head dimension.
        hdim: usize,
        /// The head dimensions that have kernels.
        supported: &'static [u32],
    },
    /// `heads_q` must be a multiple of `heads_k` (GQA/MQA).
    HeadsNotDivisible {
        /// Heads of q.
        heads_q: usize,
        /// Heads of k and v.
        heads_k: usize,
    },
    /// q, k and v do not share one dtype.
    DTypeMismatch {
        /// q's dtype.
        q: DType,
        /// k's dtype.
        k: DType,
        /// v's dtype.
        v: DType,
    },
    /// The output's dtype differs from q's.
    OutDType {
        /// q's dtype, which the output must have.
        q: DType,
        /// The output's dtype.
        out: DType,
    },
    /// A gradient output shares memory with another argument of the call.
    Overlap {
        /// The output.
        arg: Arg,
        /// The argument it overlaps.
        other: Arg,
    },
    /// A backward argument's dtype differs from q's.
    ArgDType {
        /// The argument.
        arg: Arg,
        /// q's dtype, which it must have.
        expected: DType,
        /// Its dtype.
        got: DType,
    },
    /// The head dimension must be contiguous (stride 1).
    NonContiguousLastDim {
        /// The tensor whose head dimension is strided.
        arg: Arg,
        /// Its head-dimension stride, in elements.
        stride: usize,
    },
    /// Base address or a stride breaks the alignment the loads need: 16 bytes for q, k,
    /// v and out (address, and batch, seqlen and heads strides), 4 for the LSE address.
    Misaligned {
        /// The misaligned tensor.
        arg: Arg,
        /// Which address or stride, and the alignment it misses.
        detail: String,
    },
    /// The strided extent reaches past the end of the buffer.
    OutOfBounds {
        /// The tensor that does not fit its buffer.
        arg: Arg,
        /// Elements the shape and strides reach (one past the largest index).
        needed: usize,
        /// Elements in the buffer.
        len: usize,
    },
    /// A size is beyond what one launch can address.
    TooLarge(String),
    /// No kernel of the requested family for this head dim and dtype (the FA3 ablation
    /// variants exist for hdim 128 fp16 only).
    NoKernel {
        /// The kernel family asked for.
        algo: common::Algo,
        /// q's head dimension.
        hdim: usize,
        /// q's dtype.
        dtype: DType,
    },
    /// `softmax_scale` is NaN, infinite or negative.
    InvalidScale(f32),
    /// `softcap` is NaN, infinite, zero or negative.
    InvalidSoftcap(f32),
    /// Document ids or lengths that do not describe packed documents (a document's
    /// tokens not contiguous, lengths that do not add up to the sequence, ...).
    InvalidDocuments(String),
    /// A user-defined variant that cannot serve the call (not in its module, loaded with
    /// another `Gpu`).
    InvalidVariant(String),
    /// A block mask that does not serve the call (built for another shape, variant or
    /// buffer, or passed without its variant).
    InvalidBlockMask(String),
    /// The options ask for something the chosen kernel cannot do.
    Unsupported(String),
    /// A dequantization factor (or a Hadamard sign) is zero, negative or not finite.
    InvalidDescale {
        /// The factors' argument.
        arg: Arg,
        /// Index of the first bad value.
        index: usize,
        /// The value.
        value: f32,
    },
    /// Block scales whose block size is not the FP8 kernel's tile.
    BlockSize {
        /// The factors' argument.
        arg: Arg,
        /// Rows per block of the factors.
        got: usize,
        /// Rows per block of the kernel's tiles at this head dim.
        expected: usize,
    },
    /// Host data does not match a declared shape.
    HostData(String),
    /// The stream was made by another CUDA context handle than the `Gpu`'s (make it
    /// with `Gpu::new_stream`).
    ForeignStream,
}

impl fmt::Display for AttnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use AttnError::*;
        match self {
            NoDriver => write!(f, "no CUDA driver: libcuda could not be loaded (is an NVIDIA driver installed?)"),
            NoDevice { ordinal, detail } => write!(f, "no CUDA device {ordinal}: {detail}"),
            UnsupportedGpu { name, major, minor } => write!(
                f,
                "GPU {name} is sm_{major}{minor}; these kernels need Hopper (sm_90) or newer"
            ),
            KernelLoad(m) => write!(f, "could not load the kernels: {m}"),
            Driver(e) => write!(f, "CUDA driver error: {e}"),
            EmptyDim { arg, shape } => write!(f, "{arg} has an empty dimension: shape {shape:?}"),
            ShapeMismatch(m) => write!(f, "shape mismatch: {m}"),
            ForeignStream => write!(f, "stream: it belongs to another CUDA context than the Gpu handle (make it with Gpu::new_stream)"),
            UnsupportedHeadDim { hdim, supported } => {
                write!(f, "head dim {hdim} is not supported (supported: {supported:?})")
            }
            HeadsNotDivisible { heads_q, heads_k } => write!(
                f,
                "heads of q ({heads_q}) must be a multiple of heads of k/v ({heads_k})"
            ),
            DTypeMismatch { q, k, v } => write!(
                f,
                "q, k, v must have one dtype; got q {}, k {}, v {}",
                q.name(),
                k.name(),
                v.name()
            ),
            OutDType { q, out } => write!(f, "out must have q's dtype {}, got {}", q.name(), out.name()),
            Overlap { arg, other } => write!(f, "{arg} overlaps {other} in memory: the gradients need buffers of their own"),
            ArgDType { arg, expected, got } => write!(f, "{arg} must have q's dtype {}, got {}", expected.name(), got.name()),
            NonContiguousLastDim { arg, stride } => write!(
                f,
                "{arg}: the last (head) dimension must be contiguous, its stride is {stride}"
            ),
            Misaligned { arg, detail } => write!(f, "{arg} is misaligned: {detail}"),
            OutOfBounds { arg, needed, len } => write!(
                f,
                "{arg}: shape and strides reach element {needed} but the buffer has {len}"
            ),
            TooLarge(m) => write!(f, "too large for one launch: {m}"),
            NoKernel { algo, hdim, dtype } => {
                write!(f, "no {algo:?} kernel for head dim {hdim} and {}", dtype.name())
            }
            InvalidScale(s) => write!(f, "softmax_scale must be finite and non-negative, got {s}"),
            InvalidSoftcap(c) => write!(f, "softcap must be finite and positive, got {c}"),
            InvalidDocuments(m) => write!(f, "invalid documents: {m}"),
            InvalidVariant(m) => write!(f, "variant: {m}"),
            InvalidBlockMask(m) => write!(f, "block mask: {m}"),
            Unsupported(m) => write!(f, "unsupported option: {m}"),
            InvalidDescale { arg, index, value } => write!(f, "{arg}[{index}] is {value}; dequantization factors must be positive normal floats, at most 2^126"),
            BlockSize { arg, got, expected } => write!(f, "{arg}: blocks of {got} rows, but the FP8 kernel's tiles at this head dim are {expected}"),
            HostData(m) => write!(f, "host data: {m}"),
        }
    }
}

impl std::error::Error for AttnError {}

impl From<cudarc::driver::DriverError> for AttnError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        AttnError::Driver(e)
    }
}

/// The result of every fallible host API call.
pub type Result<T> = std::result::Result<T, AttnError>;
