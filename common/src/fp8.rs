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
/// block factors: 128, but 64 at hdim 256, where O's accumulator alone takes 128
/// registers a thread and 128-key S and P made ptxas spill at 240.
pub const fn block_n(hdim: u32) -> u32 {
    if hdim == 256 { 64 } else { 128 }
}

/// The key tile of the kernel for K and V with per-(batch, head) factors over at least
/// [`WIDE_MIN_KEYS`] keys, where no scale block ties the tile: 192 at hdim 128 (fewer
/// instructions per score in a step: +4-5% at 16k, +1-4% at 4k), else [`block_n`]. Not
/// below 2k keys: 1024 keys take 6 tiles of 192, 11% of them padding (-8% at 1k
/// non-causal). The block-factor kernel keeps 128-key blocks: with 192 the paper's
/// accuracy experiment read 9.25e-3 at 16k against the 9.1e-3 it must stay under.
pub const fn per_head_block_n(hdim: u32) -> u32 {
    if hdim == 128 { 192 } else { block_n(hdim) }
}

/// Fewest keys for which per-head K and V factors take [`per_head_block_n`].
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
/// Largest finite e4m3 value: block scales map a block's largest magnitude here.
pub const E4M3_MAX: f32 = 448.0;

/// The probabilities enter the PV GEMM as `P · 2^P_EXP2_OFFSET` (at most 256), in e4m3's
/// range instead of its subnormals, as FlashAttention-3 does. The FP8 kernels keep each
/// row's exact running max (no lazy rescaling), so a row's largest weight is exactly 256.
/// The row sums carry the same factor, which cancels in O; the LSE takes it out.
pub const P_EXP2_OFFSET: f32 = 8.0;

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

/// The FP8 forward kernel table: `callback! { NAME => OUT_DTYPE, hdim D, keys N; ... }`.
/// Every entry runs [`block_m`]` / 64` consumer warpgroups with every FA3 technique.
#[macro_export]
macro_rules! fp8_kernel_table {
    ($callback:ident) => {
        $callback! {
            fa3_fp8_hdim64_bf16 => BF16, hdim 64, keys 128;
            fa3_fp8_hdim64_f16 => F16, hdim 64, keys 128;
            fa3_fp8_hdim128_bf16 => BF16, hdim 128, keys 128;
            fa3_fp8_hdim128_f16 => F16, hdim 128, keys 128;
            fa3_fp8_hdim128_bf16_n192 => BF16, hdim 128, keys 192;
            fa3_fp8_hdim128_f16_n192 => F16, hdim 128, keys 192;
            fa3_fp8_hdim256_bf16 => BF16, hdim 256, keys 64;
            fa3_fp8_hdim256_f16 => F16, hdim 256, keys 64;
        }
    };
}

/// The kernel configuration of an FP8 forward entry.
pub const fn config(hdim: u32, block_n: u32) -> KernelConfig {
    KernelConfig { hdim, consumer_wgs: block_m(hdim) / 64, block_n, cluster: 1, techniques: Techniques::FULL, fp8: true }
}

macro_rules! fp8_entries {
    ($($name:ident => $dtype:ident, hdim $hdim:literal, keys $keys:literal;)*) => {
        &[$(KernelEntry {
            name: stringify!($name),
            algo: Algo::Fa3(Techniques::FULL),
            kind: KernelKind::ForwardFp8,
            hdim: $hdim,
            dtype: DType::$dtype,
            tma_param_bytes: TMA_PARAM_BYTES,
            launch_bounds: config($hdim, $keys).threads(),
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
/// for K and V with block factors ([`block_n`] keys a tile) or per-head ones
/// ([`per_head_block_n`] from [`WIDE_MIN_KEYS`] keys).
pub fn find(hdim: u32, out: DType, per_head_kv: bool, seqlen_k: u32) -> Option<&'static KernelEntry> {
    let keys = if per_head_kv && seqlen_k >= WIDE_MIN_KEYS { per_head_block_n(hdim) } else { block_n(hdim) };
    KERNELS.iter().find(|k| k.hdim == hdim && k.dtype == out && k.block_n == keys)
}

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
    /// f32 factors `[b, h, ceil(s / block_rows)]`, packed: the block's largest magnitude
    /// (after the Hadamard transform) over [`E4M3_MAX`], 1 for an all-zero block.
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
    use super::*;

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
            let l = config(k.hdim, k.block_n).smem();
            assert!(l.total <= crate::fa3::MAX_SMEM, "{}: {}", k.name, l.total);
            // e4m3 Q is half of O's 16-bit tile: O cannot be staged in Q's buffer.
            assert!(!l.o_shares_q(), "{}", k.name);
            assert_eq!(l.q.stage_bytes, block_m(k.hdim) * k.hdim);
            assert_eq!(l.o.bytes, block_m(k.hdim) * k.hdim * 2);
        }
        assert!(find(128, DType::BF16, false, 1).is_some() && find(64, DType::F16, true, 1).is_some() && find(32, DType::BF16, false, 1).is_none());
        for hdim in HEAD_DIMS {
            let cases = [(false, 1 << 20, block_n(hdim)), (true, WIDE_MIN_KEYS - 1, block_n(hdim)), (true, WIDE_MIN_KEYS, per_head_block_n(hdim))];
            for (per_head, seqlen_k, keys) in cases {
                for out in [DType::BF16, DType::F16] {
                    assert_eq!(find(hdim, out, per_head, seqlen_k).map(|k| k.block_n), Some(keys), "hdim {hdim}");
                }
            }
        }
        for k in KERNELS {
            assert!(k.block_n == block_n(k.hdim) || k.block_n == per_head_block_n(k.hdim), "{}", k.name);
            assert_eq!(k.block_n % K_STEP, 0, "{}: P needs whole k32 steps", k.name);
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
