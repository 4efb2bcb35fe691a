//! Shapes of the FlashAttention-3 backward kernels, shared by kernel and host.
//!
//! A call is three launches:
//! 1. **preprocess**: per query row, `D = rowsum(dO ∘ O)` and the LSE in the log2 domain
//!    (`lse · log2 e`, `+inf` for rows past `seqlen_q`, so that they give `P = 0`), into
//!    padded f32 workspaces; the fp32 dQ accumulator and the semaphores zeroed;
//! 2. **main**: one CTA per (key block of [`BLOCK_N`] keys, K/V head, batch). K and V are
//!    loaded once; the CTA loops over the query heads of its K/V head (GQA: their dK and
//!    dV sum in registers, no atomics) and over the query blocks that see its keys,
//!    recomputing `Sᵀ = K Qᵀ`, `dPᵀ = V dOᵀ`, `Pᵀ`, `dSᵀ`, accumulating `dV += Pᵀ dO`
//!    and `dK += dSᵀ Q` in registers, and adding `dQ += dS K` to the fp32 accumulator;
//! 3. **postprocess**: dQ = accumulator × softmax scale, to the output type.
//!
//! Two consumer warpgroups each own 64 of the block's keys (FA3's "swapAB": the score
//! accumulator's rows are keys, so `Pᵀ` and `dSᵀ` are already the register A operands
//! of the dV and dK products); a producer warpgroup issues the TMA loads.
use crate::{DType, KernelEntry, Strides};

/// Keys per CTA: two consumer warpgroups of 64.
pub const BLOCK_N: u32 = 128;
/// Consumer (MMA) warpgroups.
pub const MMA_WGS: u32 = 2;
/// Threads per main-kernel CTA: a producer warpgroup and the consumers.
pub const THREADS: u32 = 128 * (MMA_WGS + 1);
/// Depth of the Q (+LSE) and dO (+D) rings.
pub const STAGES: u32 = 2;
/// Threads per CTA of the preprocess and postprocess kernels.
pub const AUX_THREADS: u32 = 256;
/// Query rows per preprocess CTA (one warp per row at a time).
pub const PREPROCESS_ROWS: u32 = 64;

/// Head dimensions with a backward kernel. hdim 256 needs the head dimension split
/// across the warpgroups (its dK and dV of 64 keys take 256 registers a thread).
pub const HEAD_DIMS: [u32; 2] = [64, 128];

/// Query rows per step of the main kernel. 64: at hdim 128 dK and dV of a warpgroup's
/// 64 keys take 128 registers a thread; at hdim 64, 128 rows made `Sᵀ` and `dPᵀ` 128
/// registers and ptxas spilled at 240.
pub const fn block_m(hdim: u32) -> u32 {
    let _ = hdim;
    64
}

/// Rows of the LSE, D and dQ workspaces per (batch, head): `seqlen_q` rounded up to a
/// whole query block, so the main kernel's loads never leave them.
pub const fn padded_rows(seqlen_q: u32, hdim: u32) -> u32 {
    seqlen_q.div_ceil(block_m(hdim)) * block_m(hdim)
}

/// The first query block (of `block_m` rows) that sees key block `n` (of `block_n` keys)
/// under a bottom-right causal mask (query `i` sees key `j` iff `j <= i + seqlen_k -
/// seqlen_q`); `blocks` (the number of query blocks) when none does. Without a mask, 0.
pub const fn first_query_block(causal: bool, n: u32, block_m: u32, block_n: u32, seqlen_q: u32, seqlen_k: u32) -> u32 {
    let blocks = seqlen_q.div_ceil(block_m);
    if !causal {
        return 0;
    }
    // The first row that sees key n * block_n: i >= n * block_n - (seqlen_k - seqlen_q).
    let first_row = (n * block_n) as i64 - seqlen_k as i64 + seqlen_q as i64;
    if first_row <= 0 {
        0
    } else if first_row >= seqlen_q as i64 {
        blocks
    } else {
        first_row as u32 / block_m
    }
}

/// Whether the step of query block `m` over key block `n` needs the causal mask: some
/// (query, key) pair of the two blocks is hidden. Its first row must see its last key.
pub const fn step_needs_mask(causal: bool, m: u32, n: u32, block_m: u32, block_n: u32, seqlen_q: u32, seqlen_k: u32) -> bool {
    causal && ((m * block_m) as i64 + seqlen_k as i64 - seqlen_q as i64) < ((n + 1) * block_n) as i64 - 1
}

/// The tensor maps of the main kernel's descriptor block, in order.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BwdTensorMap {
    Q = 0,
    K = 1,
    V = 2,
    DOut = 3,
}

impl crate::fa3::DescriptorSlot for BwdTensorMap {
    #[inline(always)]
    fn offset(self) -> u32 {
        self as u32 * crate::fa3::TMA_DESCRIPTOR_BYTES
    }
}

/// Floats of one warpgroup's dQ piece (64 query rows by 64 columns).
pub const DQ_PIECE: u32 = 64 * 64;

/// Where element (`row`, `col`) of a query block's dQ (64 rows by `hdim`) lives in the
/// fp32 accumulator, relative to the block's first float: the block is `hdim / 64`
/// pieces of 64 columns, and inside a piece the floats are in the order the consumer
/// threads hold them (thread (warp w, lane l), n-tile j: `[c0, c1, c2, c3]` of rows
/// `16 w + l / 4` and `+ 8`, columns `8 j + 2 (l % 4)` and `+ 1`), so that each thread
/// stages its fragments with 16-byte stores and a piece leaves shared memory as one
/// contiguous bulk reduction.
pub const fn dq_accum_index(row: u32, col: u32) -> u32 {
    let (piece, c) = (col / 64, col % 64);
    let (warp, half, g) = (row / 16, (row % 16) / 8, row % 8);
    let (j, t, e) = (c / 8, (c % 8) / 2, c % 2);
    piece * DQ_PIECE + ((warp * 8 + j) * 32 + g * 4 + t) * 4 + half * 2 + e
}

/// The parameters of the three backward launches (one by-value kernel argument).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BwdParams {
    /// Inputs: device addresses of q, k, v, the forward's output o, and dO.
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub dout: u64,
    /// The forward's LSE, `[batch, heads_q, seqlen_q]` f32, contiguous.
    pub lse: u64,
    /// Outputs (the input dtype, strided like the inputs).
    pub dq: u64,
    pub dk: u64,
    pub dv: u64,
    /// Workspaces, f32 `[batch, heads_q, padded_rows]`: the LSE times log2 e, and D.
    pub lse_log2: u64,
    pub dpsum: u64,
    /// f32 `[batch, heads_q, padded_rows, hdim]`: dQ before the softmax scale, each query
    /// block's `64 x hdim` floats in [`dq_accum_index`] order.
    pub dq_accum: u64,
    /// u32 `[batch, heads_q, query blocks]`: in deterministic mode, how many key blocks
    /// have added to a query block's dQ (they add in key-block order); 0 otherwise.
    pub dq_semaphore: u64,
    pub q_strides: Strides,
    pub k_strides: Strides,
    pub v_strides: Strides,
    pub o_strides: Strides,
    pub dout_strides: Strides,
    pub dq_strides: Strides,
    pub dk_strides: Strides,
    pub dv_strides: Strides,
    pub batch: u32,
    pub heads_q: u32,
    pub heads_k: u32,
    /// `heads_q / heads_k`.
    pub kv_group: u32,
    pub seqlen_q: u32,
    pub seqlen_k: u32,
    /// [`padded_rows`] of this call.
    pub padded_rows: u32,
    pub hdim: u32,
    /// `softmax_scale * log2(e)`.
    pub scale_log2: f32,
    pub softmax_scale: f32,
    /// Non-zero: causal (bottom-right).
    pub causal: u32,
}

impl BwdParams {
    /// The causal offset `seqlen_k - seqlen_q`, or `None` without a mask.
    #[inline(always)]
    pub fn causal_offset(&self) -> Option<i32> {
        if self.causal != 0 { Some(self.seqlen_k as i32 - self.seqlen_q as i32) } else { None }
    }

    /// Query blocks of `block_m` rows.
    #[inline(always)]
    pub fn query_blocks(&self, block_m: u32) -> u32 {
        self.seqlen_q.div_ceil(block_m)
    }
}

/// Which kernel of the backward a [`KernelEntry`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BwdStage {
    Preprocess,
    /// The main kernel, dQ summed in whatever order the CTAs come.
    Main,
    /// The main kernel of the deterministic mode (dQ summed in key-block order).
    MainDeterministic,
    Postprocess,
}

impl BwdStage {
    /// One of the two main kernels.
    pub const fn is_main(self) -> bool {
        matches!(self, BwdStage::Main | BwdStage::MainDeterministic)
    }
}

/// The backward kernel table, written once: `callback! { NAME => DTYPE, hdim D, STAGE; ... }`
/// builds both [`KERNELS`] (the host's list) and the kernel crate's entry points.
#[macro_export]
macro_rules! bwd_kernel_table {
    ($callback:ident) => {
        $callback! {
            bwd_preprocess_hdim64_f16 => F16, hdim 64, Preprocess;
            bwd_preprocess_hdim128_f16 => F16, hdim 128, Preprocess;
            bwd_preprocess_hdim64_bf16 => BF16, hdim 64, Preprocess;
            bwd_preprocess_hdim128_bf16 => BF16, hdim 128, Preprocess;
            bwd_hdim64_f16 => F16, hdim 64, Main;
            bwd_hdim128_f16 => F16, hdim 128, Main;
            bwd_hdim64_bf16 => BF16, hdim 64, Main;
            bwd_hdim128_bf16 => BF16, hdim 128, Main;
            bwd_hdim64_f16_deterministic => F16, hdim 64, MainDeterministic;
            bwd_hdim128_f16_deterministic => F16, hdim 128, MainDeterministic;
            bwd_hdim64_bf16_deterministic => BF16, hdim 64, MainDeterministic;
            bwd_hdim128_bf16_deterministic => BF16, hdim 128, MainDeterministic;
            bwd_postprocess_hdim64_f16 => F16, hdim 64, Postprocess;
            bwd_postprocess_hdim128_f16 => F16, hdim 128, Postprocess;
            bwd_postprocess_hdim64_bf16 => BF16, hdim 64, Postprocess;
            bwd_postprocess_hdim128_bf16 => BF16, hdim 128, Postprocess;
        }
    };
}

macro_rules! bwd_entries {
    ($($name:ident => $dtype:ident, hdim $hdim:literal, $stage:ident;)*) => {
        &[$(KernelEntry {
            name: stringify!($name),
            algo: crate::Algo::Fa3(crate::fa3::Techniques::FULL),
            kind: crate::KernelKind::Backward(BwdStage::$stage),
            hdim: $hdim,
            dtype: DType::$dtype,
            tma_param_bytes: if BwdStage::$stage.is_main() { crate::fa3::TMA_PARAM_BYTES } else { 0 },
            launch_bounds: if BwdStage::$stage.is_main() { THREADS } else { 0 },
            cluster: 1,
            consumer_wgs: if BwdStage::$stage.is_main() { MMA_WGS } else { 0 },
            block_n: if BwdStage::$stage.is_main() { BLOCK_N } else { 0 },
        },)*]
    };
}

/// The backward kernels ([`bwd_kernel_table`]).
pub const KERNELS: &[KernelEntry] = bwd_kernel_table!(bwd_entries);

/// Looks up a backward kernel.
pub fn find(stage: BwdStage, hdim: u32, dtype: DType) -> Option<&'static KernelEntry> {
    KERNELS.iter().find(|k| k.kind == crate::KernelKind::Backward(stage) && k.hdim == hdim && k.dtype == dtype)
}

/// The dynamic shared memory of the main kernel, from its (1024 B aligned) base:
///
/// ```text
/// | K | V | Q stage 0, 1 | dO stage 0, 1 | dSᵀ | LSE stage 0, 1 | D stage 0, 1 | dQ pieces | barriers |
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmemLayout {
    /// K and V of the CTA's key block (`BLOCK_N × hdim` each), one slot each.
    pub k: crate::fa3::SmemRing,
    pub v: crate::fa3::SmemRing,
    /// Q and dO of a query block (`block_m × hdim`), [`STAGES`] slots each; the Q ring's
    /// stage also carries that block's LSE (log2), the dO ring's its D.
    pub q: crate::fa3::SmemRing,
    pub dout: crate::fa3::SmemRing,
    /// `dSᵀ` of the current step (`BLOCK_N` rows of `block_m` elements, 128 B swizzled):
    /// the A operand of `dQ = dS K`, written by both consumer warpgroups.
    pub ds: crate::fa3::SmemBuffer,
    /// `block_m` f32 per stage.
    pub lse: crate::fa3::SmemBuffer,
    pub dpsum: crate::fa3::SmemBuffer,
    /// Each consumer warpgroup's dQ piece ([`DQ_PIECE`] f32), staged for its bulk
    /// reduction into the accumulator.
    pub dq: crate::fa3::SmemBuffer,
    /// Bytes to request at launch (with [`crate::fa3::SMEM_ALIGN`] of slack).
    pub total: u32,
}

impl SmemLayout {
    pub const fn new(hdim: u32) -> Self {
        use crate::fa3::{MBARRIER_BYTES, SMEM_ALIGN, SmemBuffer, SmemRing};
        let bm = block_m(hdim);
        let kv_bytes = BLOCK_N * hdim * 2;
        let q_bytes = bm * hdim * 2;
        let k = SmemRing { data: 0, stage_bytes: kv_bytes, stages: 1, barriers: 0 };
        let v = SmemRing { data: kv_bytes, ..k };
        let q = SmemRing { data: 2 * kv_bytes, stage_bytes: q_bytes, stages: STAGES, barriers: 0 };
        let dout = SmemRing { data: q.slot(STAGES), ..q };
        let ds = SmemBuffer { offset: dout.slot(STAGES), bytes: BLOCK_N * bm * 2 };
        let vec_bytes = bm * 4;
        let lse = SmemBuffer { offset: ds.offset + ds.bytes, bytes: STAGES * vec_bytes };
        let dpsum = SmemBuffer { offset: lse.offset + lse.bytes, bytes: STAGES * vec_bytes };
        let dq = SmemBuffer { offset: dpsum.offset + dpsum.bytes, bytes: MMA_WGS * DQ_PIECE * 4 };
        let barriers = dq.offset + dq.bytes;
        let k = SmemRing { barriers, ..k };
        let v = SmemRing { barriers: k.barriers + k.barrier_bytes(), ..v };
        let q = SmemRing { barriers: v.barriers + v.barrier_bytes(), ..q };
        let dout = SmemRing { barriers: q.barriers + q.barrier_bytes(), ..dout };
        let end = dout.barriers + 2 * MBARRIER_BYTES * STAGES;
        SmemLayout { k, v, q, dout, ds, lse, dpsum, dq, total: end + SMEM_ALIGN }
    }

    /// Bytes of one stage's f32 vector (LSE or D).
    pub const fn vector_bytes(hdim: u32) -> u32 {
        block_m(hdim) * 4
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::fa3::MAX_SMEM;
    use std::format;

    #[test]
    fn every_backward_layout_fits_and_its_tiles_are_swizzle_aligned() {
        for &hdim in &HEAD_DIMS {
            let l = SmemLayout::new(hdim);
            assert!(l.total <= MAX_SMEM, "hdim {hdim}: {} bytes", l.total);
            for (name, off) in [("k", l.k.data), ("v", l.v.data), ("q", l.q.data), ("q1", l.q.slot(1)), ("dout", l.dout.data), ("dout1", l.dout.slot(1)), ("ds", l.ds.offset)] {
                assert_eq!(off % 1024, 0, "hdim {hdim}: {name} at {off}");
            }
            assert_eq!(l.lse.offset % 16, 0, "bulk copies need 16-byte alignment");
            assert_eq!(l.dq.offset % 16, 0);
            assert_eq!(l.dpsum.offset % 16, 0);
            assert_eq!(l.k.barriers % 8, 0);
            // Nothing overlaps: the regions are in increasing order.
            let ends = [l.k.slot(1), l.v.slot(1), l.q.slot(STAGES), l.dout.slot(STAGES), l.ds.offset + l.ds.bytes, l.lse.offset + l.lse.bytes, l.dpsum.offset + l.dpsum.bytes, l.dq.offset + l.dq.bytes, l.k.barriers];
            let starts = [l.k.data, l.v.data, l.q.data, l.dout.data, l.ds.offset, l.lse.offset, l.dpsum.offset, l.dq.offset, l.k.barriers];
            for i in 1..starts.len() {
                assert!(ends[i - 1] <= starts[i], "hdim {hdim}: region {i}");
            }
        }
    }

    /// Brute force: query block `m` sees some key of key block `n` iff `m >=
    /// first_query_block(n)`, and a step needs the mask iff some pair of it is hidden.
    #[test]
    fn first_query_block_and_mask_rule_match_the_visible_pairs() {
        for (sq, sk) in [(1, 1), (5, 9), (9, 5), (17, 40), (40, 17), (130, 130), (200, 70), (70, 200)] {
            for (bm, bn) in [(1, 1), (4, 8), (16, 16), (64, 128), (128, 128)] {
                let off = sk as i64 - sq as i64;
                let sees = |i: u32, j: u32| i < sq && j < sk && (j as i64) <= i as i64 + off;
                let blocks = sq.div_ceil(bm);
                for n in 0..sk.div_ceil(bn) {
                    let first = first_query_block(true, n, bm, bn, sq, sk);
                    for m in 0..blocks {
                        let any = (m * bm..(m + 1) * bm).any(|i| (n * bn..(n + 1) * bn).any(|j| sees(i, j)));
                        let ctx = format!("sq {sq} sk {sk} tile {bm}x{bn} m {m} n {n}");
                        assert_eq!(any, m >= first, "{ctx}: first {first}");
                        // Rows past seqlen_q and keys past seqlen_k do not count as hidden:
                        // their P is zero by the LSE padding and the zero-filled K/V.
                        let hidden = (m * bm..((m + 1) * bm).min(sq))
                            .any(|i| (n * bn..((n + 1) * bn).min(sk)).any(|j| !sees(i, j)));
                        if hidden {
                            assert!(step_needs_mask(true, m, n, bm, bn, sq, sk), "{ctx}: a hidden pair unmasked");
                        }
                    }
                    assert_eq!(first_query_block(false, n, bm, bn, sq, sk), 0);
                }
            }
        }
    }

    /// The accumulator order is a bijection of a query block's `64 x hdim` floats, and it
    /// is where each consumer thread's fragment elements go, four at a time.
    #[test]
    fn dq_accum_index_is_a_bijection_in_fragment_order() {
        for hdim in HEAD_DIMS {
            let mut seen = std::vec![false; (64 * hdim) as usize];
            for row in 0..64 {
                for col in 0..hdim {
                    let i = dq_accum_index(row, col) as usize;
                    assert!(!seen[i], "hdim {hdim}: ({row}, {col}) collides");
                    seen[i] = true;
                }
            }
            assert!(seen.iter().all(|&s| s));
        }
        // Thread (warp w, lane l), n-tile j of piece p: elements c0..c3 at 4 consecutive
        // floats from ((w * 8 + j) * 32 + l) * 4.
        for (w, l, j, p) in [(0, 0, 0, 0), (3, 31, 7, 1), (1, 6, 2, 0), (2, 17, 5, 1)] {
            let (row, col) = (16 * w + l / 4, 64 * p + 8 * j + 2 * (l % 4));
            let base = p * DQ_PIECE + ((w * 8 + j) * 32 + l) * 4;
            assert_eq!(
                [dq_accum_index(row, col), dq_accum_index(row, col + 1), dq_accum_index(row + 8, col), dq_accum_index(row + 8, col + 1)],
                [base, base + 1, base + 2, base + 3]
            );
        }
    }

    #[test]
    fn the_table_has_every_stage_for_every_head_dim_and_dtype() {
        for &hdim in &HEAD_DIMS {
            for dtype in DType::ALL {
                for stage in [BwdStage::Preprocess, BwdStage::Main, BwdStage::MainDeterministic, BwdStage::Postprocess] {
                    assert!(find(stage, hdim, dtype).is_some(), "{stage:?} hdim {hdim} {dtype:?}");
                }
            }
        }
    }
}
