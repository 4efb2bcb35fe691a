//! Shapes of the FP8 (e4m3) forward and its quantization kernel, shared by kernel and host.
//!
//! The FP8 forward is the FA3 forward (`fa3`) with e4m3 Q, K and V, f32 accumulators and a
//! 16-bit O: both GEMMs run `wgmma ... k32 .e4m3`, which reads shared-memory operands only
//! K-major. Q and K are K-major as stored (`[b, s, h, d]`); V is not (`O = P V` reduces
//! over keys), so the kernel reads V **transposed** (`[b, h_k, d, keys]`, keys contiguous)
//! with the keys of every 16 permuted ([`vt_position`]) so that P, converted from the S
//! accumulator registers in place, is already the A operand of `P V` (no shuffles). The
//! quantization kernel writes that layout; [`vt_len`] keys per row, zero-padded.
//!
//! Dequantization factors ("descales", `x ≈ scale · e4m3(x)`) come per
//! (batch, head, block of rows) through [`ScaleIndex`]: a block stride of 0 gives one
//! factor per (batch, head), FlashAttention-3's `q_descale` / `k_descale` / `v_descale`.
//! Q's blocks are the kernel's query tiles ([`block_m`] rows), K's and V's its key
//! blocks ([`block_n`] keys).
use crate::fa3::{KernelConfig, TMA_PARAM_BYTES, Techniques};
use crate::{Algo, DType, KernelEntry, KernelKind, Strides};

/// Head dimensions with an FP8 forward kernel (hdim 64's Q and K rows are 64 bytes: the
/// 64-byte swizzle).
pub const HEAD_DIMS: [u32; 3] = [64, 128, 256];
/// Query rows per CTA (64 per consumer warpgroup) and per Q scale block at a head dim:
/// 128, but 192 at hdim 64, where the GEMMs are short beside the softmax and a third
/// warpgroup's GEMMs hide more of it (FlashAttention-3's FP8 tile there is 192 rows, as
/// our 16-bit one).
pub const fn block_m(hdim: u32) -> u32 {
    if hdim == 64 { 192 } else { 128 }
}
/// Keys per K/V scale block at a head dim, and the key tile of the kernel that reads
/// block factors: 192 at hdim 128 (fewer instructions per score in a step: +6-10% at
/// 4k-16k against 128, -2% at 1k without a mask; the accuracy experiment's (d) is the
/// same within its seeds' spread), 64 at hdim 256 (O's accumulator alone takes 128
/// registers a thread and 128-key S and P made ptxas spill at 240), else 128.
pub const fn block_n(hdim: u32) -> u32 {
    match hdim {
        256 => 64,
        128 => 192,
        _ => 128,
    }
}

/// The key tile of the kernel for per-(batch, head) K and V factors below
/// [`WIDE_MIN_KEYS`] keys: 128 at hdim 128 (1024 keys take 6 tiles of 192, 11% of them
/// padding: -8% at 1k without a mask), else [`block_n`]. Per-head factors tie no scale
/// block to the tile, so the kernel may change with the keys; from [`WIDE_MIN_KEYS`] keys
/// they take [`block_n`] too (192 at hdim 128: +4-5% at 16k, +1-4% at 4k against 128).
pub const fn short_block_n(hdim: u32) -> u32 {
    if hdim == 128 { 128 } else { block_n(hdim) }
}

/// Fewest keys for which per-head K and V factors take [`block_n`] rather than
/// [`short_block_n`].
pub const WIDE_MIN_KEYS: u32 = 2048;

/// Keys per swizzle chunk of a transposed V tile of `block_n` keys: its rows are
/// `block_n` bytes, loaded and read as `block_n / vt_chunk` chunks of `hdim` rows by
/// `vt_chunk` bytes with the swizzle of that span (128 B, or 64 B where 128 does not
/// divide the block: 64 and 192 keys).
pub const fn vt_chunk(block_n: u32) -> u32 {
    if block_n % 128 == 0 { 128 } else { 64 }
}
/// Keys of the e4m3 k-step (`wgmma ... k32`).
pub const K_STEP: u32 = 32;
/// Largest finite e4m3 value: a block factor maps its block's largest magnitude at most here.
pub const E4M3_MAX: f32 = 448.0;

/// The probabilities enter the PV GEMM as `P · 2^P_EXP2_OFFSET` (at most 256), in e4m3's
/// range instead of its subnormals, as FlashAttention-3 does. The FP8 kernels keep each
/// row's exact running max (no lazy rescaling), so a row's largest weight is exactly 256
/// (64 to 256 in a block whose V factor rides in P: [`VUnit`]).
/// The row sums carry the same factor, which cancels in O; the LSE takes it out.
pub const P_EXP2_OFFSET: f32 = 8.0;

/// The factor of a block of values whose largest magnitude is `amax` (1 for a block of
/// zeros): `amax / E4M3_MAX`, so that the largest value is exactly 448 (Q's and K's: their
/// outliers set the scores), or with `pow2` the smallest power of two at or above it (the
/// largest code then in `(224, 448]`; V's, as MX formats' shared scales, so that the FP8
/// forward carries them in P's `exp2` offset exactly, [`VUnit`]). On the paper's
/// accuracy experiment power-of-two factors cost Q and K 1.46e-2 -> 1.78e-2 RMSE without
/// incoherent processing at 4k, and V nothing measurable.
#[inline(always)]
pub fn block_factor(amax: f32, pow2: bool) -> f32 {
    if !(amax > 0.0) {
        1.0
    } else if pow2 {
        pow2_at_least(amax / E4M3_MAX)
    } else {
        amax / E4M3_MAX
    }
}

/// The smallest power of two at or above `x > 0` (2^-126 for any `x` up to it; `+inf`
/// stays, and so does anything above 2^127).
#[inline(always)]
pub fn pow2_at_least(x: f32) -> f32 {
    let (bits, exp) = (x.to_bits(), x.to_bits() >> 23);
    if exp == 0 {
        f32::MIN_POSITIVE
    } else if bits & 0x7f_ffff == 0 {
        x
    } else {
        f32::from_bits((exp + 1) << 23)
    }
}

/// `n` of a positive normal power of two `2^n`; `None` for any other value.
#[inline(always)]
pub fn pow2_exponent(x: f32) -> Option<i32> {
    let (bits, exp) = (x.to_bits(), (x.to_bits() >> 23) as i32);
    (bits & 0x7f_ffff == 0 && exp > 0 && exp < 255).then_some(exp - 127)
}

/// `2^n` for `-126 <= n <= 127`, exactly.
#[inline(always)]
pub fn pow2(n: i32) -> f32 {
    f32::from_bits(((127 + n) as u32) << 23)
}

/// Bits of a V factor below O's unit that a block may take in P's `exp2` offset
/// ([`VUnit`]): what its probabilities lose is at most this many bits at e4m3's
/// subnormal end.
pub const V_UNIT_SPAN_LOG2: i32 = 2;

/// With per-block V factors, the unit O's accumulator is kept in: one block's factor.
/// A key block whose factor `v` is a power of two ([`block_factor`]'s) at most
/// [`V_UNIT_SPAN_LOG2`] bits below a power-of-two unit enters the PV GEMM as
/// `P · 2^(P_EXP2_OFFSET + shift)`: the shift is exact (e4m3's rounding commutes with
/// powers of two above its subnormals) and O needs no conversion. Any other block
/// becomes the unit, and O is converted to it before the block's PV (factors that are not
/// powers of two convert at every block). The FP8 forward's rule, and the CPU
/// emulation's (`host::reference::fp8::attention_fp8_v_unit`).
#[derive(Clone, Copy, Debug)]
pub struct VUnit {
    factor: f32,
    /// The factor's exponent when it is a power of two, else one no shift reaches.
    exp: i32,
}

impl VUnit {
    const NO_EXP: i32 = i32::MIN / 2;

    /// Before the first key block.
    pub const fn new() -> Self {
        VUnit { factor: 0.0, exp: Self::NO_EXP }
    }

    /// The unit (0 before the first block).
    #[inline(always)]
    pub fn factor(&self) -> f32 {
        self.factor
    }

    /// A key block with factor `v` (positive, finite) arrives: `Ok(shift)`, P's extra
    /// `exp2` offset (`-V_UNIT_SPAN_LOG2..=0`), or `Err(old)`: the block's factor is the
    /// unit now, and O must be multiplied by `old / v` before its PV (`old` is 0 before
    /// the first block: nothing to convert). The division is the caller's (the kernel's
    /// `rcp`, rare).
    #[inline(always)]
    pub fn enter(&mut self, v: f32) -> Result<i32, f32> {
        let bits = v.to_bits();
        let shift = (bits >> 23) as i32 - 127 - self.exp;
        if bits & 0x7f_ffff == 0 && (shift + V_UNIT_SPAN_LOG2) as u32 <= V_UNIT_SPAN_LOG2 as u32 {
            return Ok(shift);
        }
        let old = self.factor;
        self.factor = v;
        self.exp = match pow2_exponent(v) {
            Some(e) => e,
            None => Self::NO_EXP,
        };
        Err(old)
    }
}

impl Default for VUnit {
    fn default() -> Self {
        Self::new()
    }
}

/// Keys a transposed V's rows are padded to a multiple of: a 64-byte swizzle chunk (so a
/// whole number of k-steps).
pub const VT_ALIGN: u32 = 64;

/// Keys per row of a transposed V (`[b, h_k, d, vt_len(seqlen_k)]`): a whole number of
/// [`VT_ALIGN`] chunks (so of k-steps: the permuted groups are complete and rows are
/// 16-byte aligned), so that a tile loaded by 64-byte chunks never reads past a row.
pub const fn vt_len(seqlen_k: u32) -> u32 {
    seqlen_k.div_ceil(VT_ALIGN) * VT_ALIGN
}

/// Where key `key` sits in a row of the transposed V: within each 16 keys, position
/// `4t + i` holds key `2t + (i % 2) + 8 (i / 2)`, the keys that thread `t` of a quad holds
/// in the S accumulator (columns `2t, 2t + 1` of two neighbouring 8-column fragments),
/// in the order the e4m3 A fragment wants them (`k = 4t .. 4t + 3`).
pub const fn vt_position(key: u32) -> u32 {
    let k = key % 16;
    (key - k) + 4 * ((k % 8) / 2) + (k % 2) + 2 * (k / 8)
}

/// Where one tensor's dequantization factors are: `scale[b, h, blk]` at
/// `ptr + 4 (b · batch_stride + (h / head_div) · head_stride + blk · block_stride)`
/// (`h`: the query head for Q, the K/V head for K and V).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScaleIndex {
    /// Device address of f32 factors; 0 only in non-FP8 calls.
    pub ptr: u64,
    pub batch_stride: u32,
    pub head_stride: u32,
    /// 0: one factor per (batch, head).
    pub block_stride: u32,
    /// Heads that share a factor (`heads_q / heads_k` for Q's per-(batch, K/V head)
    /// factors, FlashAttention-3's layout); 1 otherwise.
    pub head_div: u32,
}

impl ScaleIndex {
    /// Element offset of the factor of (`batch`, `head`, `block`).
    #[inline(always)]
    pub fn offset(&self, batch: u32, head: u32, block: u32) -> u64 {
        batch as u64 * self.batch_stride as u64
            + head.checked_div(self.head_div).unwrap_or(0) as u64 * self.head_stride as u64
            + block as u64 * self.block_stride as u64
    }
}

/// The FP8 forward's dequantization factors (part of `FwdParams`; zero elsewhere).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fp8Descales {
    pub q: ScaleIndex,
    pub k: ScaleIndex,
    pub v: ScaleIndex,
}

/// The FP8 forward kernel table: `callback! { NAME => OUT_DTYPE, hdim D, keys N, V, F; ... }`
/// with `V` either `transposed` (V given as [`vt_position`] lays it out) or `rows` (V as
/// stored, `[b, s, h, d]`, transposed by the kernel's producer: [`transpose_op`]), and
/// `F` either `blocks` (K and V may have per-block factors: the kernel reads them per key
/// block, [`VUnit`]) or `head` (K and V have one factor per (batch, head), and the
/// kernel has no per-block code: `_headscale` and the wide `_n192` kernels).
/// Every entry runs [`block_m`]` / 64` consumer warpgroups with every FA3 technique.
#[macro_export]
macro_rules! fp8_kernel_table {
    ($callback:ident) => {
        $callback! {
            fa3_fp8_hdim64_bf16 => BF16, hdim 64, keys 128, transposed, blocks;
            fa3_fp8_hdim64_bf16_headscale => BF16, hdim 64, keys 128, transposed, head;
            fa3_fp8_hdim64_f16 => F16, hdim 64, keys 128, transposed, blocks;
            fa3_fp8_hdim64_f16_headscale => F16, hdim 64, keys 128, transposed, head;
            fa3_fp8_hdim128_bf16 => BF16, hdim 128, keys 192, transposed, blocks;
            fa3_fp8_hdim128_bf16_headscale => BF16, hdim 128, keys 128, transposed, head;
            fa3_fp8_hdim128_f16 => F16, hdim 128, keys 192, transposed, blocks;
            fa3_fp8_hdim128_f16_headscale => F16, hdim 128, keys 128, transposed, head;
            fa3_fp8_hdim128_bf16_n192 => BF16, hdim 128, keys 192, transposed, head;
            fa3_fp8_hdim128_f16_n192 => F16, hdim 128, keys 192, transposed, head;
            fa3_fp8_hdim256_bf16 => BF16, hdim 256, keys 64, transposed, blocks;
            fa3_fp8_hdim256_bf16_headscale => BF16, hdim 256, keys 64, transposed, head;
            fa3_fp8_hdim256_f16 => F16, hdim 256, keys 64, transposed, blocks;
            fa3_fp8_hdim256_f16_headscale => F16, hdim 256, keys 64, transposed, head;
            fa3_fp8_hdim64_bf16_vrows => BF16, hdim 64, keys 128, rows, blocks;
            fa3_fp8_hdim64_bf16_headscale_vrows => BF16, hdim 64, keys 128, rows, head;
            fa3_fp8_hdim64_f16_vrows => F16, hdim 64, keys 128, rows, blocks;
            fa3_fp8_hdim64_f16_headscale_vrows => F16, hdim 64, keys 128, rows, head;
            fa3_fp8_hdim128_bf16_vrows => BF16, hdim 128, keys 192, rows, blocks;
            fa3_fp8_hdim128_bf16_headscale_vrows => BF16, hdim 128, keys 128, rows, head;
            fa3_fp8_hdim128_f16_vrows => F16, hdim 128, keys 192, rows, blocks;
            fa3_fp8_hdim128_f16_headscale_vrows => F16, hdim 128, keys 128, rows, head;
            fa3_fp8_hdim128_bf16_n192_vrows => BF16, hdim 128, keys 192, rows, head;
            fa3_fp8_hdim128_f16_n192_vrows => F16, hdim 128, keys 192, rows, head;
            fa3_fp8_hdim256_bf16_vrows => BF16, hdim 256, keys 64, rows, blocks;
            fa3_fp8_hdim256_bf16_headscale_vrows => BF16, hdim 256, keys 64, rows, head;
            fa3_fp8_hdim256_f16_vrows => F16, hdim 256, keys 64, rows, blocks;
            fa3_fp8_hdim256_f16_headscale_vrows => F16, hdim 256, keys 64, rows, head;
        }
    };
}

/// Whether a table entry's factors column (`blocks` or `head`) gives K and V per-block
/// factors.
#[doc(hidden)]
#[macro_export]
macro_rules! fp8_block_factors {
    (blocks) => {
        true
    };
    (head) => {
        false
    };
}

/// Whether a table entry's `V` column (`transposed` or `rows`) makes the kernel
/// transpose V.
#[doc(hidden)]
#[macro_export]
macro_rules! fp8_transposes_v {
    (transposed) => {
        false
    };
    (rows) => {
        true
    };
}

/// The kernel configuration of an FP8 forward entry.
pub const fn config(hdim: u32, block_n: u32, transpose_v: bool, block_factors: bool) -> KernelConfig {
    KernelConfig {
        hdim,
        consumer_wgs: block_m(hdim) / 64,
        block_n,
        cluster: 1,
        techniques: Techniques::FULL,
        fp8: true,
        transpose_v,
        fp8_block_factors: block_factors,
        key_offsets: false,
    }
}

macro_rules! fp8_entries {
    ($($name:ident => $dtype:ident, hdim $hdim:literal, keys $keys:literal, $v:ident, $f:ident;)*) => {
        &[$(KernelEntry {
            name: stringify!($name),
            algo: Algo::Fa3(Techniques::FULL),
            kind: KernelKind::ForwardFp8 { transpose_v: $crate::fp8_transposes_v!($v), block_factors: $crate::fp8_block_factors!($f) },
            hdim: $hdim,
            dtype: DType::$dtype,
            tma_param_bytes: TMA_PARAM_BYTES,
            launch_bounds: config($hdim, $keys, $crate::fp8_transposes_v!($v), $crate::fp8_block_factors!($f)).threads(),
            cluster: 1,
            consumer_wgs: block_m($hdim) / 64,
            block_n: $keys,
            score_mod: crate::ScoreModKind::None,
            mask: crate::MaskKind::Causal,
        },)*]
    };
}

/// The FP8 forward kernels ([`fp8_kernel_table`]).
pub const KERNELS: &[KernelEntry] = fp8_kernel_table!(fp8_entries);

/// The FP8 forward kernel with head dim `hdim` writing O in `out` over `seqlen_k` keys,
/// for K and V with block factors (either of them: [`block_n`] keys a tile, the
/// per-block code) or per-head ones (both: a kernel without per-block code,
/// [`short_block_n`] keys below [`WIDE_MIN_KEYS`] keys); `transpose_v`: for V as stored
/// (`[b, s, h, d]`), transposed by the kernel.
pub fn find(hdim: u32, out: DType, per_head_kv: bool, seqlen_k: u32, transpose_v: bool) -> Option<&'static KernelEntry> {
    let keys = if per_head_kv && seqlen_k < WIDE_MIN_KEYS { short_block_n(hdim) } else { block_n(hdim) };
    let kind = KernelKind::ForwardFp8 { transpose_v, block_factors: !per_head_kv };
    KERNELS.iter().find(|k| k.hdim == hdim && k.dtype == out && k.block_n == keys && k.kind == kind)
}

/// Head-dim bytes per swizzle span of a K tile, and of a V tile as stored (`[b, s, h, d]`,
/// loaded as K is): 128 (`SWIZZLE_128B`), or 64 at hdim 64 (`SWIZZLE_64B`).
pub const fn kv_span(hdim: u32) -> u32 {
    if hdim >= 128 { 128 } else { hdim }
}

/// Byte offset of the swizzled 16-byte unit `lin / 16` (plus `lin % 16`) of a tile laid
/// out by TMA with a swizzle span of `span` bytes (128: Swizzle<3,4,3>, the unit index
/// XORed with bits 7-9; 64: Swizzle<2,4,3>, with bits 7-8), the tile aligned to its atom.
pub const fn swizzled(lin: u32, span: u32) -> u32 {
    let mask = if span == 128 { 7 } else { 3 };
    lin ^ (((lin >> 7) & mask) << 4)
}

/// Byte offset of element (`key`, `d`) in a K tile of `block_n` keys by `hdim`, and of V
/// as stored: the head dim in [`kv_span`] chunks, chunk `c` at `c * block_n * span`.
pub const fn kv_tile_offset(block_n: u32, hdim: u32, key: u32, d: u32) -> u32 {
    let span = kv_span(hdim);
    (d / span) * block_n * span + swizzled(key * span + d % span, span)
}

/// Byte offset of position `pos` ([`vt_position`] of a key) of row `d` in a transposed V
/// tile of `block_n` keys by `hdim` rows, as the consumers read it: chunks of
/// [`vt_chunk`] positions, each `hdim` rows of one swizzle span, one after another.
pub const fn vt_tile_offset(block_n: u32, hdim: u32, pos: u32, d: u32) -> u32 {
    let chunk = vt_chunk(block_n);
    (pos / chunk) * hdim * chunk + swizzled(d * chunk + pos % chunk, chunk)
}

/// Warp operations of the in-kernel V transpose per tile of `block_n` keys by `hdim`:
/// each moves 16 keys by 32 columns of the head dim ([`transpose_op`]).
pub const fn transpose_ops(block_n: u32, hdim: u32) -> u32 {
    (block_n / 16) * (hdim / 32)
}

/// Lane `lane`'s two row addresses in warp operation `op` (< [`transpose_ops`]) of the
/// in-kernel V transpose: `(load, store)`, byte offsets in the stored V tile
/// ([`kv_tile_offset`]) and the transposed one ([`vt_tile_offset`]).
///
/// The operation covers keys `k0 .. k0 + 16` and columns `d0 .. d0 + 32`. `ldmatrix.x4.trans`
/// reads four 8 x 8 matrices of 16-bit pairs (rows: 8 keys; columns: 8 pairs of
/// columns): matrix `m` holds keys `k0 + 8 (m % 2) ..` and columns `d0 + 16 (m / 2) ..`,
/// so lane (g = lane / 4, t = lane % 4) gets in register `m` the columns `2g, 2g + 1` of
/// keys `2t, 2t + 1` of that matrix: bytes (key 2t, col 2g), (2t, 2g + 1), (2t + 1, 2g),
/// (2t + 1, 2g + 1). Byte permutes of registers 0 and 1 (2 and 3) make of them column
/// `2g`'s and column `2g + 1`'s bytes of keys `2t, 2t + 1, 2t + 8, 2t + 9`, which are
/// positions `4t .. 4t + 3` of [`vt_position`]: `stmatrix.x4` stores them as four 8 x 8
/// matrices whose rows (16 positions of one column) are columns `d0 + 16 (j / 2) + 2i +
/// (j % 2)` for row `i` of matrix `j`.
pub const fn transpose_op(block_n: u32, hdim: u32, op: u32, lane: u32) -> (u32, u32) {
    let slabs = hdim / 32;
    let (k0, d0) = (16 * (op / slabs), 32 * (op % slabs));
    let (m, i) = (lane / 8, lane % 8);
    let load = kv_tile_offset(block_n, hdim, k0 + 8 * (m % 2) + i, d0 + 16 * (m / 2));
    let store = vt_tile_offset(block_n, hdim, k0, d0 + 16 * (m / 2) + 2 * i + m % 2);
    (load, store)
}

/// Head-dim slabs of 32 columns a transposing warp moves per unit of work
/// ([`transpose_units`]): up to 4 (one 128-byte span of a stored V row).
pub const fn transpose_unit_slabs(hdim: u32) -> u32 {
    let slabs = hdim / 32;
    if slabs < 4 { slabs } else { 4 }
}

/// Units of work of the in-kernel V transpose per tile: 16 keys by
/// [`transpose_unit_slabs`] slabs, unit `u` being key group `u / (slabs / unit slabs)`
/// and slabs from `(u % ..) * unit slabs`; the warps take them round robin.
pub const fn transpose_units(block_n: u32, hdim: u32) -> u32 {
    transpose_ops(block_n, hdim) / transpose_unit_slabs(hdim)
}

/// A lane's constants of the in-kernel V transpose, from which [`transpose_load`] and
/// [`transpose_store`] give its row addresses of every operation with a few integer
/// operations (the swizzles' XOR terms of a row depend on the row within its 16-key
/// group and on the lane only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransposeLane {
    /// Byte offset of the lane's `ldmatrix` row (key `8 (m % 2) + i` of a group) in
    /// its 128 B (64 B at hdim 64) span.
    pub load_row: u32,
    /// The 16-byte unit the swizzle puts the row's first unit of a 32-column slab at,
    /// before the slab's own unit index is XORed in.
    pub load_unit: u32,
    /// Byte offset of the lane's `stmatrix` row (column `16 (m / 2) + 2i + (m % 2)` of a
    /// slab) in a transposed chunk.
    pub store_row: u32,
    /// The swizzle's XOR term of that row.
    pub store_unit: u32,
}

/// The constants of lane `lane` ([`TransposeLane`]).
pub const fn transpose_lane(block_n: u32, hdim: u32, lane: u32) -> TransposeLane {
    let (m, i) = (lane / 8, lane % 8);
    let (span, chunk) = (kv_span(hdim), vt_chunk(block_n));
    let row = 8 * (m % 2) + i;
    let col = 16 * (m / 2) + 2 * i + m % 2;
    let row_bits = if span == 128 { row % 8 } else { (row / 2) % 4 };
    let col_bits = if chunk == 128 { col % 8 } else { (col / 2) % 4 };
    TransposeLane { load_row: row * span, load_unit: (m / 2) ^ row_bits, store_row: col * chunk, store_unit: col_bits }
}

/// [`transpose_op`]'s load row of key group `kg` and slab `s` for a lane of constants `l`.
pub const fn transpose_load(block_n: u32, hdim: u32, l: &TransposeLane, kg: u32, s: u32) -> u32 {
    let span = kv_span(hdim);
    let slabs_per_span = span / 32;
    16 * kg * span + (s / slabs_per_span) * block_n * span + l.load_row + ((l.load_unit ^ (2 * (s % slabs_per_span))) << 4)
}

/// [`transpose_op`]'s store row of key group `kg` and slab `s` for a lane of constants `l`.
pub const fn transpose_store(block_n: u32, hdim: u32, l: &TransposeLane, kg: u32, s: u32) -> u32 {
    let chunk = vt_chunk(block_n);
    let k0 = 16 * kg;
    (k0 / chunk) * hdim * chunk + ((((k0 % chunk) / 16) ^ l.store_unit) << 4) + l.store_row + 32 * s * chunk
}

/// The byte selectors of the transpose's two permutes (PTX `prmt.b32 d, a, b, sel`, bytes
/// of `a` numbered 0-3 and of `b` 4-7): the even bytes of both registers (column `2g` of
/// keys `2t, 2t + 1` in `a`, `2t + 8, 2t + 9` in `b`), and the odd bytes.
pub const TRANSPOSE_PERMUTES: [u32; 2] = [0x6420, 0x7531];

/// Threads per CTA of the quantization kernel: one warp per row at a time.
pub const QUANTIZE_THREADS: u32 = 256;

/// What the quantization kernel writes.
#[repr(u32)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QuantizeOutput {
    /// e4m3 `[b, s, h, d]`, packed.
    #[default]
    Bshd = 0,
    /// e4m3 `[b, h, d, vt_len(s)]` with permuted keys ([`vt_position`]), the padding zero:
    /// the FP8 forward's V.
    VTransposed = 1,
}

/// The quantization kernel's parameters. One CTA per (block of `block_rows` rows, head,
/// batch); grid `(ceil(seqlen / block_rows), heads, batch)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct QuantizeParams {
    /// 16-bit input `[b, s, h, d]`, last dim contiguous.
    pub src: u64,
    pub src_strides: Strides,
    /// e4m3 output ([`QuantizeOutput`]).
    pub dst: u64,
    pub output: QuantizeOutput,
    /// f32 factors `[b, h, ceil(s / block_rows)]`, packed: [`block_factor`] of the
    /// block's largest magnitude (after the Hadamard transform), powers of two when
    /// `pow2_factors` is 1 (V).
    pub scales: u64,
    pub batch: u32,
    pub seqlen: u32,
    pub heads: u32,
    pub block_rows: u32,
    /// Incoherent processing: device address of `hdim` f32 signs (±1); each row becomes
    /// `H · diag(signs) · x / sqrt(hdim)` before quantization. 0: none.
    pub signs: u64,
    /// The V transpose (`fp8_transpose_v`): the head dim (its input is e4m3 `[b, s, h, d]`
    /// at `src`, packed, its output the transposed V at `dst`).
    pub hdim: u32,
    /// 1: power-of-two factors ([`block_factor`]'s `pow2`).
    pub pow2_factors: u32,
}

/// Keys per CTA of the V transpose (grid `(vt_len(seqlen) / TRANSPOSE_KEYS, heads, batch)`,
/// [`QUANTIZE_THREADS`] threads).
pub const TRANSPOSE_KEYS: u32 = K_STEP;

/// The quantization kernel table: `callback! { NAME => IN_DTYPE, hdim D; ... }`.
#[macro_export]
macro_rules! fp8_quantize_table {
    ($callback:ident) => {
        $callback! {
            fp8_quantize_hdim64_f16 => F16, hdim 64;
            fp8_quantize_hdim128_f16 => F16, hdim 128;
            fp8_quantize_hdim256_f16 => F16, hdim 256;
            fp8_quantize_hdim64_bf16 => BF16, hdim 64;
            fp8_quantize_hdim128_bf16 => BF16, hdim 128;
            fp8_quantize_hdim256_bf16 => BF16, hdim 256;
        }
    };
}

/// The entry of a quantization-family kernel (no TMA, no launch bounds, by-value
/// [`QuantizeParams`]).
const fn aux_entry(name: &'static str, hdim: u32, dtype: DType) -> KernelEntry {
    KernelEntry {
        name,
        algo: Algo::Fa3(Techniques::FULL),
        kind: KernelKind::Fp8Quantize,
        hdim,
        dtype,
        tma_param_bytes: 0,
        launch_bounds: 0,
        cluster: 1,
        consumer_wgs: 0,
        block_n: 0,
        score_mod: crate::ScoreModKind::None,
        mask: crate::MaskKind::Causal,
    }
}

/// The V transpose's entry (e4m3 `[b, s, h, d]` to the FP8 forward's V layout).
pub const TRANSPOSE_V: KernelEntry = aux_entry("fp8_transpose_v", 0, DType::BF16);

macro_rules! quantize_entries {
    ($($name:ident => $dtype:ident, hdim $hdim:literal;)*) => {
        &[$(aux_entry(stringify!($name), $hdim, DType::$dtype),)*]
    };
}

/// The quantization kernels ([`fp8_quantize_table`]) and the V transpose.
pub const QUANTIZE_KERNELS: &[KernelEntry] = &{
    const TABLE: &[KernelEntry] = fp8_quantize_table!(quantize_entries);
    let mut all = [TRANSPOSE_V; TABLE.len() + 1];
    let mut i = 0;
    while i < TABLE.len() {
        all[i] = TABLE[i];
        i += 1;
    }
    all
};

/// The quantization kernel for a 16-bit input of head dim `hdim`.
pub fn find_quantize(hdim: u32, input: DType) -> Option<&'static KernelEntry> {
    QUANTIZE_KERNELS.iter().find(|k| k.hdim == hdim && k.dtype == input && k.name != TRANSPOSE_V.name)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::{vec, vec::Vec};

    #[test]
    fn block_factors_are_the_smallest_powers_of_two_that_fit_e4m3() {
        for amax in [1e-30f32, 0.3, 1.0, 3.5, 448.0, 449.0, 896.0, 1e6, 3.0e38] {
            assert_eq!(block_factor(amax, false), amax / E4M3_MAX);
            let f = block_factor(amax, true);
            let n = pow2_exponent(f).expect("a power of two");
            assert!(amax / f <= E4M3_MAX && amax / f > E4M3_MAX / 2.0, "{amax}: {f}");
            assert_eq!(pow2(n), f);
        }
        assert_eq!((block_factor(0.0, true), block_factor(0.0, false)), (1.0, 1.0));
        // Below the smallest normal the factor stays normal (the codes are then smaller).
        assert_eq!(block_factor(1e-44, true), f32::MIN_POSITIVE);
        assert_eq!(pow2_at_least(f32::INFINITY), f32::INFINITY);
        for x in [0.0f32, -2.0, 3.0, f32::INFINITY, f32::NAN, 1e-40] {
            assert_eq!(pow2_exponent(x), None, "{x}");
        }
    }

    #[test]
    fn v_factors_ride_in_p_only_as_powers_of_two_within_the_span() {
        // The cases assume a 2-bit span.
        assert_eq!(V_UNIT_SPAN_LOG2, 2);
        let unit_at = |u: f32| {
            let mut unit = VUnit::new();
            // The first block sets the unit; O has nothing to convert.
            assert_eq!(unit.enter(u), Err(0.0));
            assert_eq!(unit.factor(), u);
            unit
        };
        for (v, want) in [(0.5, Ok(0)), (0.25, Ok(-1)), (0.125, Ok(-2)), (0.0625, Err(0.5)), (1.0, Err(0.5)), (0.3, Err(0.5))] {
            let mut unit = unit_at(0.5);
            assert_eq!(unit.enter(v), want, "unit 0.5, factor {v}");
            // A block outside the span becomes the unit.
            assert_eq!(unit.factor(), if want.is_ok() { 0.5 } else { v });
        }
        // A unit that is not a power of two takes no block in P, not even its own factor.
        let mut unit = unit_at(0.3);
        assert_eq!(unit.enter(0.3), Err(0.3));
        assert_eq!(unit.enter(0.25), Err(0.3));
        assert_eq!(unit.enter(0.125), Ok(-1));
        // The extremes of the exponent range.
        let mut unit = unit_at(f32::MIN_POSITIVE * 4.0);
        assert_eq!(unit.enter(f32::MIN_POSITIVE), Ok(-2));
        let mut unit = unit_at(pow2(127));
        assert_eq!(unit.enter(pow2(126)), Ok(-1));
    }

    #[test]
    fn vt_positions_permute_each_group_of_16_keys() {
        for group in 0..4u32 {
            let mut seen = [false; 16];
            for k in 0..16 {
                let p = vt_position(16 * group + k);
                assert_eq!(p / 16, group, "key {k} leaves its group");
                seen[(p % 16) as usize] = true;
            }
            assert!(seen.iter().all(|&s| s));
        }
        // Thread t = 1 of a quad holds keys 2, 3 (fragment 0) and 10, 11 (fragment 1):
        // they are the A fragment's k = 4 .. 7.
        assert_eq!([2, 3, 10, 11].map(vt_position), [4, 5, 6, 7]);
        assert_eq!([16, 17, 24, 25].map(vt_position), [16, 17, 18, 19]);
    }

    #[test]
    fn the_fp8_layout_fits_shared_memory_with_its_own_o_staging() {
        for k in KERNELS {
            let l = common_config(k).smem();
            assert!(l.total <= crate::fa3::MAX_SMEM, "{}: {}", k.name, l.total);
            // e4m3 Q is half of O's 16-bit tile: O cannot be staged in Q's buffer.
            assert!(!l.o_shares_q(), "{}", k.name);
            assert_eq!(l.q.stage_bytes, block_m(k.hdim) * k.hdim);
            assert_eq!(l.o.bytes, block_m(k.hdim) * k.hdim * 2);
        }
        assert!(find(128, DType::BF16, false, 1, false).is_some() && find(64, DType::F16, true, 1, true).is_some());
        assert!(find(32, DType::BF16, false, 1, false).is_none());
        for hdim in HEAD_DIMS {
            let cases = [(false, 1 << 20, block_n(hdim)), (false, 1, block_n(hdim)), (true, WIDE_MIN_KEYS - 1, short_block_n(hdim)), (true, WIDE_MIN_KEYS, block_n(hdim))];
            for (per_head, seqlen_k, keys) in cases {
                for (out, transpose_v) in [(DType::BF16, false), (DType::F16, false), (DType::BF16, true), (DType::F16, true)] {
                    let k = find(hdim, out, per_head, seqlen_k, transpose_v).unwrap();
                    assert_eq!((k.block_n, k.kind), (keys, KernelKind::ForwardFp8 { transpose_v, block_factors: !per_head }), "hdim {hdim}");
                }
            }
        }
        for k in KERNELS {
            assert!(k.block_n == block_n(k.hdim) || k.block_n == short_block_n(k.hdim), "{}", k.name);
            // The per-block code reads K's and V's factors by the kernel's key blocks.
            if let KernelKind::ForwardFp8 { block_factors: true, .. } = k.kind {
                assert_eq!(k.block_n, block_n(k.hdim), "{}", k.name);
            }
            assert_eq!(k.block_n % K_STEP, 0, "{}: P needs whole k32 steps", k.name);
        }
    }

    fn common_config(k: &KernelEntry) -> KernelConfig {
        crate::fa3::kernel_config(k).unwrap()
    }

    /// `ldmatrix.x4.trans` of a warp: register `m` of lane (g, t) from the four 8 x 8
    /// matrices of 16-bit elements whose rows lanes `8m .. 8m + 8` address (PTX ISA's
    /// fragment layout for `.trans`: element (row 2t, col g) and (2t + 1, g) of matrix m).
    fn ldmatrix_x4_trans(smem: &[u8], rows: &[u32; 32]) -> [[u32; 4]; 32] {
        let elem = |m: usize, row: usize, col: usize| {
            let a = rows[8 * m + row] as usize + 2 * col;
            u16::from_le_bytes([smem[a], smem[a + 1]]) as u32
        };
        core::array::from_fn(|lane| {
            let (g, t) = (lane / 4, lane % 4);
            core::array::from_fn(|m| elem(m, 2 * t, g) | elem(m, 2 * t + 1, g) << 16)
        })
    }

    /// `stmatrix.x4` of a warp: lanes `8j .. 8j + 8` address the rows of matrix `j`, and
    /// lane (g, t)'s register `j` is its row g's elements 2t, 2t + 1.
    fn stmatrix_x4(smem: &mut [u8], rows: &[u32; 32], regs: &[[u32; 4]; 32]) {
        for (lane, r) in regs.iter().enumerate() {
            let (g, t) = (lane / 4, lane % 4);
            for (j, v) in r.iter().enumerate() {
                let a = rows[8 * j + g] as usize + 4 * t;
                smem[a..a + 4].copy_from_slice(&v.to_le_bytes());
            }
        }
    }

    fn prmt(a: u32, b: u32, sel: u32) -> u32 {
        let bytes = [a.to_le_bytes(), b.to_le_bytes()].concat();
        (0..4).fold(0, |acc, i| acc | (bytes[((sel >> (4 * i)) & 7) as usize] as u32) << (8 * i))
    }

    #[test]
    fn the_in_kernel_transpose_writes_the_transposed_layout() {
        // Every tile shape of the table: the warp operations, simulated instruction by
        // instruction from a stored V tile, give what a transposed V's TMA load would:
        // row d of the tile at position vt_position(key) holds V[key][d].
        let mut shapes: Vec<(u32, u32)> = KERNELS.iter().map(|k| (k.block_n, k.hdim)).collect();
        shapes.sort();
        shapes.dedup();
        for (block_n, hdim) in shapes {
            let bytes = (block_n * hdim) as usize;
            let value = |key: u32, d: u32| (key * 31 + d * 7 + key / 3) as u8;
            let mut stored = vec![0u8; bytes];
            let mut seen = vec![false; bytes];
            for key in 0..block_n {
                for d in 0..hdim {
                    let a = kv_tile_offset(block_n, hdim, key, d) as usize;
                    assert!(!seen[a], "stored layout: ({key}, {d}) collides");
                    seen[a] = true;
                    stored[a] = value(key, d);
                }
            }
            let mut transposed = vec![0u8; bytes];
            for op in 0..transpose_ops(block_n, hdim) {
                let plan: [(u32, u32); 32] = core::array::from_fn(|lane| transpose_op(block_n, hdim, op, lane as u32));
                for (l, s) in plan {
                    assert!(l % 16 == 0 && s % 16 == 0 && (l as usize) < bytes && (s as usize) < bytes, "op {op}");
                }
                let regs = ldmatrix_x4_trans(&stored, &plan.map(|p| p.0));
                let permuted = regs.map(|r| {
                    let [x0, y0] = TRANSPOSE_PERMUTES.map(|sel| prmt(r[0], r[1], sel));
                    let [x1, y1] = TRANSPOSE_PERMUTES.map(|sel| prmt(r[2], r[3], sel));
                    [x0, y0, x1, y1]
                });
                stmatrix_x4(&mut transposed, &plan.map(|p| p.1), &permuted);
            }
            for key in 0..block_n {
                for d in 0..hdim {
                    let a = vt_tile_offset(block_n, hdim, vt_position(key), d) as usize;
                    assert_eq!(transposed[a], value(key, d), "{block_n} x {hdim}: key {key}, d {d}");
                }
            }
        }
    }

    #[test]
    fn the_transposes_lane_constants_give_the_reference_rows() {
        for (block_n, hdim) in [(128, 128), (192, 128), (64, 256), (128, 64)] {
            let slabs = hdim / 32;
            assert_eq!(transpose_units(block_n, hdim) * transpose_unit_slabs(hdim), transpose_ops(block_n, hdim));
            for lane in 0..32 {
                let l = transpose_lane(block_n, hdim, lane);
                for op in 0..transpose_ops(block_n, hdim) {
                    let (kg, s) = (op / slabs, op % slabs);
                    let got = (transpose_load(block_n, hdim, &l, kg, s), transpose_store(block_n, hdim, &l, kg, s));
                    assert_eq!(got, transpose_op(block_n, hdim, op, lane), "{block_n} x {hdim}: op {op}, lane {lane}");
                }
            }
        }
    }

    #[test]
    fn the_transposed_tile_offsets_match_the_consumers_descriptors() {
        // The consumers read a transposed V tile as chunks of `vt_chunk` positions, `hdim`
        // rows each, 32 bytes a k-step inside a chunk (`element::E4M3::v_k_step`): the
        // unswizzled row starts (d a multiple of 8) are where the chunk's atoms begin.
        for (block_n, hdim) in [(128, 128), (192, 128), (64, 256), (128, 64)] {
            let chunk = vt_chunk(block_n);
            for c in 0..block_n / chunk {
                for d in (0..hdim).step_by(8) {
                    assert_eq!(vt_tile_offset(block_n, hdim, c * chunk, d), c * hdim * chunk + d * chunk);
                }
            }
            // K's layout: one 128 B chunk of the head dim after another (64 B at hdim 64).
            assert_eq!(kv_tile_offset(block_n, hdim, 8, 0), 8 * kv_span(hdim));
            if hdim == 256 {
                assert_eq!(kv_tile_offset(block_n, hdim, 0, 128), block_n * 128);
            }
        }
    }

    #[test]
    fn scale_index_strides_batch_head_and_block() {
        let s = ScaleIndex { ptr: 1, batch_stride: 32, head_stride: 4, block_stride: 1, head_div: 2 };
        assert_eq!(s.offset(1, 5, 3), 32 + 2 * 4 + 3);
        assert_eq!(ScaleIndex { head_div: 0, ..s }.offset(0, 5, 0), 0);
        assert_eq!(vt_len(1), 64);
        assert_eq!(vt_len(64), 64);
        assert_eq!(vt_len(65), 128);
        for k in KERNELS {
            let chunk = vt_chunk(k.block_n);
            assert!(k.block_n % chunk == 0 && VT_ALIGN % K_STEP == 0 && (chunk == VT_ALIGN || k.block_n == chunk), "{}", k.name);
        }
    }
}
