//! Shapes of the FlashAttention-3 forward kernel, shared by kernel and host.
//!
//! One CTA computes `block_m = 64 * consumer_wgs` query rows of one (batch, head):
//! a producer warpgroup issues TMA loads, each consumer warpgroup owns 64 rows and runs
//! S = QK^T (SS WGMMA, or RS with Q in registers at hdim 128), the online softmax and
//! O += PV (RS WGMMA). K and V stream through their own `STAGES`-deep shared-memory
//! rings.
use crate::{Algo, DType, FwdParams, KernelEntry};

/// The seed techniques a kernel variant uses; each can be turned off at compile time so
/// its contribution can be measured (the ablation kernels).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Techniques {
    /// A producer warpgroup does only TMA (with `setmaxnreg`); otherwise a consumer thread
    /// issues the loads itself, ahead of use.
    pub warp_specialized: bool,
    /// Named barriers order the consumer warpgroups' GEMMs so one's softmax overlaps the
    /// other's GEMMs.
    pub pingpong: bool,
    /// The softmax of step j overlaps the PV GEMM of step j-1 inside one warpgroup.
    pub intra_overlap: bool,
}

impl Techniques {
    pub const FULL: Self = Techniques { warp_specialized: true, pingpong: true, intra_overlap: true };
    pub const NO_PINGPONG: Self = Techniques { pingpong: false, ..Self::FULL };
    pub const NO_OVERLAP: Self = Techniques { intra_overlap: false, ..Self::FULL };
    pub const NO_WARP_SPECIALIZATION: Self = Techniques { warp_specialized: false, ..Self::FULL };
}

/// The techniques the planner uses when the caller names no algorithm: every one, at
/// every head dim and mask. hdim 128 without a causal mask left pingpong out from
/// session 7 to 11 (+0.9-1.8% at 2k-16k then, docs/perf.md items 48 and 50); with the
/// kernels of session 11 pingpong won every round of an A/B there (+0.1-2.4% steady,
/// 5 of 6 bursts at 16k, item 71). Kept as a function of the call so that a head dim or
/// mask can differ again.
pub const fn default_techniques(_hdim: u32, _cluster: u32, _causal: bool) -> Techniques {
    Techniques::FULL
}

/// Lazy rescaling (FlashAttention-4): the kernels keep a row's running max, and skip the
/// rescale of the output accumulator, while the row's scores exceed it by at most this
/// much in `exp2` units (`(s - max) * softmax_scale * log2 e <= 2`), so the unnormalised
/// probabilities stay at most 4. Not FA4's 8: with P rounded to f16/bf16, 8 raised the
/// error against the naive low-precision implementation and failed the 2x rule in one
/// GPU test. On the kernels' own tiles, the CPU model's mean error ratio rises by 10%
/// (f16) and 6% (bf16) at 2, with a worst case of 1.80x naive; at 4 and above, f16's
/// worst case exceeds 2x. 2 gives 60% of 8's speed-up (docs/perf.md, items 30 and 42).
/// Shared with the CPU model of the algorithm.
pub const RESCALE_THRESHOLD_LOG2: f32 = 2.0;

/// Q as the register (A) operand of QK^T, loaded once per tile with `ldmatrix`, so that
/// the QK wgmmas read only K from shared memory (RS instead of SS): a third less shared
/// memory traffic for QK^T, for 32 registers, and Q's buffer is released as soon as it is
/// read. hdim 128 only: hdim 64's consumers have 160 registers, and hdim 256 stages O in
/// Q's buffer. A compile-time switch so that its worth can be measured.
pub const Q_IN_REGISTERS: bool = true;

/// Under a causal mask, query tiles end at the last row instead of starting at row 0: when
/// `block_m` does not divide `seqlen_q`, the short tile is the first, whose rows see the
/// fewest key blocks, not the last, which sees the most. At hdim 64 1k that last tile was
/// one warpgroup running all 8 key blocks with no pingpong partner, 7% of the call
/// (docs/perf.md item 69). Without a mask every tile sees every key: nothing moves. Only
/// where warpgroups skip masked key blocks (tiles and key blocks of different sizes,
/// [`TileConfig::skips_masked_blocks`]): with square 128 x 128 tiles a shift of 64 rows
/// or more would leave warpgroup 0 a fully masked block in every tile (item 72). A
/// compile-time switch so that its worth can be measured.
pub const CAUSAL_TILES_END_AT_LAST_ROW: bool = true;

/// Whether causal tiles of `block_m` rows over key blocks of `block_n` end at the last
/// row ([`CAUSAL_TILES_END_AT_LAST_ROW`]).
#[inline(always)]
pub const fn tiles_end_at_last_row(block_m: u32, block_n: u32) -> bool {
    CAUSAL_TILES_END_AT_LAST_ROW && block_m != block_n
}

/// First query row of tile `m_block` of `block_m` rows; negative (rows that do not exist,
/// loaded as zeros and never stored) for the first tile when causal tiles end at the last
/// row ([`tiles_end_at_last_row`]). Shared by the kernels and their tests.
#[inline(always)]
pub fn tile_row0(p: &FwdParams, m_block: u32, block_m: u32, block_n: u32) -> i32 {
    let shift = if tiles_end_at_last_row(block_m, block_n) && p.causal != 0 { (block_m - p.seqlen_q % block_m) % block_m } else { 0 };
    (m_block * block_m) as i32 - shift as i32
}

/// Whether a kernel keeps Q in registers (see [`Q_IN_REGISTERS`]): hdim 128. The
/// no-overlap mainloop is rotated for it: in its plain loop shape, ptxas 13.0 (the driver
/// JIT of the lent H100) reused Q's registers for P (docs/perf.md items 44 and 49).
/// `tests/tests/ptx.rs` checks the JIT's SASS for such writes, and that these kernels
/// load Q with `ldmatrix`.
pub const fn q_in_registers(hdim: u32) -> bool {
    Q_IN_REGISTERS && hdim == 128
}

/// Tile number `t` of the FA3 kernels' order, as (query unit, (batch, head) index):
/// sections of `2^section_log2` (batch, head) pairs (the host guarantees that this
/// divides `batch * heads_q`), and within a section the query unit is the slow index,
/// last (heaviest under a causal mask) first. `units`: query units per (batch, head),
/// non-zero; a unit is one query block, or one per CTA of a cluster. Checked ops keep
/// panics out of the kernels.
#[inline(always)]
pub fn tile_unit_and_head(t: u32, units: u32, section_log2: u32) -> (u32, u32) {
    let k = section_log2;
    let section = t.checked_div(units << k).unwrap_or(0);
    let r = t - section * (units << k);
    (units - 1 - (r >> k), (section << k) | (r & ((1 << k) - 1)))
}

/// Bytes of the TMA descriptor block (q, k, v, o: 128 B each).
pub const TMA_PARAM_BYTES: u32 = 4 * 128;

/// Per-head-dim tile shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileConfig {
    pub hdim: u32,
    /// Consumer warpgroups per CTA, 64 query rows each.
    pub consumer_wgs: u32,
    /// Keys per K/V tile.
    pub block_n: u32,
    /// Depth of the K and V rings.
    pub stages: u32,
    /// Whether the pingpong schedule is used. On at every head dim: at hdim 256 it cost
    /// 5-15% while O was rescaled after PV (v2), and gains 3-16% since O is rescaled
    /// under the QK GEMM (v3, docs/perf.md).
    pub pingpong: bool,
}

impl TileConfig {
    /// A tile of `64 * consumer_wgs` query rows over key blocks of `block_n`, with two
    /// K and two V stages (at hdim 256 no third fits; at hdim 64 and 128 a third
    /// measured no faster).
    pub const fn new(hdim: u32, consumer_wgs: u32, block_n: u32) -> TileConfig {
        TileConfig { hdim, consumer_wgs, block_n, stages: 2, pingpong: true }
    }

    /// Query rows per CTA.
    pub const fn block_m(&self) -> u32 {
        64 * self.consumer_wgs
    }

    /// Registers per thread after `setmaxnreg`, (producer, consumers), in clusters of
    /// `cluster` (FA3's splits: with two consumer warpgroups 128 * (24 + 2 * 240) = 64512,
    /// with three 128 * (32 + 3 * 160) = 65536, of the 65536 per SM; the multicast kernels
    /// 128 * (40 + 2 * 232) = 64512, since their producer issues half-tile loads per chunk
    /// and spills on 24).
    pub const fn register_split(&self, cluster: u32) -> (u32, u32) {
        match (self.consumer_wgs, cluster) {
            (2, 1) => (24, 240),
            (2, _) => (40, 232),
            _ => (32, 160),
        }
    }

    /// Whether a consumer warpgroup skips a tile's leading key blocks that are masked
    /// for all of its rows (past its causal diagonal, or all blocks for rows past the
    /// sequence end). Only where tiles and key blocks differ in size (hdim 64's 192-row
    /// tiles, hdim 256's 80-key blocks) does a warpgroup of a causal tile have such
    /// blocks; with square 128 x 128 tiles (never shifted, [`tiles_end_at_last_row`]) it
    /// always sees part of the last one, and the bookkeeping cost 2-3% at hdim 128, 1k-2k
    /// (docs/perf.md, v7).
    pub const fn skips_masked_blocks(&self) -> bool {
        self.block_m() != self.block_n
    }
}

/// Tile shape per head dim, with its longest key blocks. hdim 64 runs three consumer
/// warpgroups (192 query rows: its softmax costs as much as its GEMMs, and a third
/// warpgroup hides more of it, as in FA3); hdim 256 keeps FA3's 80-key tiles so that Q,
/// two K and two V stages fit in 227 KB of shared memory (and 64-key tiles for up to
/// [`SHORT_KEYS_HDIM256`] keys, [`key_block`]).
pub const fn tile_config(hdim: u32) -> TileConfig {
    tile_config_wgs(hdim, if hdim == 64 { 3 } else { 2 })
}

/// Tile shape of a head dim with `consumer_wgs` consumer warpgroups and the head dim's
/// longest key blocks (the kernels use [`tile_config`]'s warpgroups; others are for
/// experiments).
pub const fn tile_config_wgs(hdim: u32, consumer_wgs: u32) -> TileConfig {
    TileConfig::new(hdim, consumer_wgs, if hdim == 256 { 80 } else { 128 })
}

/// Up to this many keys, hdim 256 runs 64-key blocks instead of 80: 80 does not divide
/// the usual lengths, so the last block is padded (512 keys take 7 blocks of 80 = 560,
/// 1k takes 1040), and a causal diagonal is coarser. Beyond, 80's fewer blocks win: an
/// A/B of the two (docs/perf.md item 73) had 64 ahead by 6.2% / 3.5% at 512 (non-causal /
/// causal), 0.7% / 4.1% at 1k, level at 2k-4k, and 1.4% behind at 16k non-causal. A block
/// costs about its keys plus 5 keys' worth of fixed work in that A/B, which puts the
/// break-even near 4k.
pub const SHORT_KEYS_HDIM256: u32 = 4096;

/// Keys per K/V block of the FA3 kernel the planner picks for `seqlen_k` keys.
pub const fn key_block(hdim: u32, seqlen_k: u32) -> u32 {
    if hdim == 256 && seqlen_k <= SHORT_KEYS_HDIM256 { 64 } else { tile_config(hdim).block_n }
}

/// Tile shape of an FA3 kernel.
pub const fn kernel_config(k: &KernelEntry) -> TileConfig {
    TileConfig::new(k.hdim, k.consumer_wgs, k.block_n)
}

/// Threads per CTA of a kernel variant with `wgs` consumer warpgroups.
pub const fn threads(t: Techniques, wgs: u32) -> u32 {
    if t.warp_specialized { 128 * (wgs + 1) } else { 128 * wgs }
}

/// Byte offsets in dynamic shared memory (after rounding its base up to 1024 B).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmemLayout {
    pub q: u32,
    pub k: u32,
    pub v: u32,
    /// Staging tile of O for the TMA store: its own buffer when it fits, so a tile's
    /// epilogue overlaps the next tile's Q load; else Q's buffer (then Q is released
    /// only once the store has read O).
    pub o: u32,
    /// Bytes of one K (or V) stage.
    pub kv_stage_bytes: u32,
    pub barriers: u32,
    /// The tile handoff from the producer to the consumers: its barriers, then its slots.
    pub tile_handoff: u32,
    /// Bytes to request at launch (includes 1024 B of alignment slack).
    pub total: u32,
}

impl SmemLayout {
    /// Byte offset of handoff slot `stage` (after the handoff's barriers).
    pub const fn tile_handoff_slot(&self, stage: u32) -> u32 {
        self.tile_handoff + 16 * TILE_HANDOFF_STAGES + TILE_HANDOFF_SLOT_BYTES * stage
    }

    pub const fn o_shares_q(&self) -> bool {
        self.o == self.q
    }
}

/// Largest dynamic shared memory per CTA on sm_90 (227 KB).
pub const MAX_SMEM: u32 = 227 * 1024;

/// mbarriers: Q full/empty, then K full/empty and V full/empty per stage.
pub const fn num_barriers(stages: u32) -> u32 {
    2 + 4 * stages
}

/// Slots of the producer-to-consumer tile handoff: the producer may publish the next
/// tile while the consumers still read the current one.
pub const TILE_HANDOFF_STAGES: u32 = 2;
/// A handoff slot: a decoded tile (query block, head, batch, key blocks), moved with one
/// 16-byte vector store and load.
pub const TILE_HANDOFF_SLOT_BYTES: u32 = 16;
/// Its full/empty barriers (8 B each), then its slots.
pub const TILE_HANDOFF_BYTES: u32 = 16 * TILE_HANDOFF_STAGES + TILE_HANDOFF_SLOT_BYTES * TILE_HANDOFF_STAGES;

pub const fn smem_layout(cfg: TileConfig) -> SmemLayout {
    let q_bytes = cfg.block_m() * cfg.hdim * 2;
    let kv_stage_bytes = cfg.block_n * cfg.hdim * 2;
    let k = q_bytes;
    let v = k + cfg.stages * kv_stage_bytes;
    let kv_end = v + cfg.stages * kv_stage_bytes;
    let tail = 8 * num_barriers(cfg.stages) + TILE_HANDOFF_BYTES + 1024;
    let (o, barriers) = if kv_end + q_bytes + tail <= MAX_SMEM { (kv_end, kv_end + q_bytes) } else { (0, kv_end) };
    let tile_handoff = barriers + 8 * num_barriers(cfg.stages);
    SmemLayout { q: 0, k, v, o, kv_stage_bytes, barriers, tile_handoff, total: barriers + tail }
}

macro_rules! fa3_entries {
    ($($name:literal => $hdim:literal, $dtype:ident, $tech:ident, wgs $wgs:literal, keys $keys:literal, cluster $cluster:literal;)*) => {
        [$(KernelEntry {
            name: $name,
            algo: Algo::Fa3(Techniques::$tech),
            hdim: $hdim,
            dtype: DType::$dtype,
            tma_param_bytes: TMA_PARAM_BYTES,
            launch_bounds: threads(Techniques::$tech, $wgs),
            cluster: $cluster,
            consumer_wgs: $wgs,
            block_n: $keys,
        },)*]
    };
}

/// CTAs per cluster of the multicast kernels: two CTAs on neighbouring query blocks of
/// one head share every K/V tile, each loading half and multicasting it to both, which
/// halves the K/V traffic from L2 (FA3 does this for hdim >= 128 without a causal mask,
/// where both CTAs visit the same key blocks).
pub const MULTICAST_CLUSTER: u32 = 2;

/// From this many query rows and keys, the planner runs hdim 128 without a mask in
/// multicast clusters. A/B against the persistent kernel, 3 rounds (docs/perf.md item
/// 78): +1.8% at 4k, +2.3% at 8k and +0.4% at 16k (medians; every round at 4k and 16k,
/// 2 of 3 at 8k), but -1.9% at 2k.
pub const MULTICAST_MIN_SEQLEN: u32 = 4096;

/// Whether the planner's default picks multicast clusters (no causal mask, every
/// technique: the only multicast kernels).
pub const fn multicast_pays(hdim: u32, seqlen_q: u32, seqlen_k: u32) -> bool {
    hdim == 128 && seqlen_q >= MULTICAST_MIN_SEQLEN && seqlen_k >= MULTICAST_MIN_SEQLEN
}

/// The FA3 kernels: every head dim and dtype with all techniques (hdim 256 with 80- and
/// 64-key blocks, [`key_block`]), the 2-CTA multicast
/// variants (hdim 128: at hdim 256 the consumers need all 240 registers, which leaves the
/// multicast producer too few), hdim 128 without pingpong (both dtypes: the default
/// without a mask until session 11),
/// plus the other ablation variants at hdim 128 fp16.
pub const KERNELS: [KernelEntry; 14] = fa3_entries! {
    "fa3_fwd_hdim64_f16" => 64, F16, FULL, wgs 3, keys 128, cluster 1;
    "fa3_fwd_hdim128_f16" => 128, F16, FULL, wgs 2, keys 128, cluster 1;
    "fa3_fwd_hdim256_f16" => 256, F16, FULL, wgs 2, keys 80, cluster 1;
    "fa3_fwd_hdim256_f16_n64" => 256, F16, FULL, wgs 2, keys 64, cluster 1;
    "fa3_fwd_hdim64_bf16" => 64, BF16, FULL, wgs 3, keys 128, cluster 1;
    "fa3_fwd_hdim128_bf16" => 128, BF16, FULL, wgs 2, keys 128, cluster 1;
    "fa3_fwd_hdim256_bf16" => 256, BF16, FULL, wgs 2, keys 80, cluster 1;
    "fa3_fwd_hdim256_bf16_n64" => 256, BF16, FULL, wgs 2, keys 64, cluster 1;
    "fa3_fwd_hdim128_f16_multicast" => 128, F16, FULL, wgs 2, keys 128, cluster 2;
    "fa3_fwd_hdim128_bf16_multicast" => 128, BF16, FULL, wgs 2, keys 128, cluster 2;
    "fa3_fwd_hdim128_f16_nopingpong" => 128, F16, NO_PINGPONG, wgs 2, keys 128, cluster 1;
    "fa3_fwd_hdim128_bf16_nopingpong" => 128, BF16, NO_PINGPONG, wgs 2, keys 128, cluster 1;
    "fa3_fwd_hdim128_f16_nooverlap" => 128, F16, NO_OVERLAP, wgs 2, keys 128, cluster 1;
    "fa3_fwd_hdim128_f16_nows" => 128, F16, NO_WARP_SPECIALIZATION, wgs 2, keys 128, cluster 1;
};

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::format;

    #[test]
    fn tile_order_visits_every_tile_once_heaviest_first_within_a_section() {
        for units in 1..=9 {
            for heads in 1..=24u32 {
                for k in 0..=heads.trailing_zeros() {
                    let total = units * heads;
                    let mut seen = [false; 9 * 24];
                    let mut last = (0, u32::MAX);
                    for t in 0..total {
                        let (unit, hb) = tile_unit_and_head(t, units, k);
                        assert!(unit < units && hb < heads, "units {units} heads {heads} k {k} t {t}");
                        let i = (hb * units + unit) as usize;
                        assert!(!seen[i], "units {units} heads {heads} k {k}: tile {i} twice");
                        seen[i] = true;
                        // Within a section the unit never rises; a section spans 2^k heads.
                        let section = hb >> k;
                        if section == last.0 {
                            assert!(unit <= last.1, "units {units} heads {heads} k {k} t {t}");
                        } else {
                            assert_eq!(unit, units - 1, "a section starts with its heaviest unit");
                        }
                        last = (section, unit);
                    }
                    // One head per section: the old order, query units fastest.
                    if k == 0 {
                        assert!((0..total).all(|t| tile_unit_and_head(t, units, 0) == (units - 1 - t % units, t / units)));
                    }
                }
            }
        }
    }

    /// The tiles of one (batch, head) cover each query row exactly once; under a causal
    /// mask the short tile is the first (it starts above row 0, never wholly) and the
    /// last ends on the last row; without one the tiles start at row 0.
    #[test]
    fn causal_tiles_cover_every_row_once_with_the_short_tile_first() {
        for causal in [false, true] {
            for (block_m, block_n) in [(64, 128), (128, 128), (128, 80), (128, 64), (192, 128)] {
                let shifted = causal && tiles_end_at_last_row(block_m, block_n);
                for seqlen_q in 1..=400u32 {
                    let p = FwdParams { seqlen_q, seqlen_k: seqlen_q, causal: causal as u32, ..Default::default() };
                    let units = seqlen_q.div_ceil(block_m);
                    let mut next = 0i32;
                    for m in 0..units {
                        let row0 = tile_row0(&p, m, block_m, block_n);
                        let ctx = format!("causal {causal} tile {block_m}x{block_n} seqlen {seqlen_q} tile {m}");
                        assert!(row0 > -(block_m as i32), "{ctx}: starts {row0}");
                        assert_eq!(row0.max(0), next, "{ctx}: a gap or an overlap");
                        next = row0 + block_m as i32;
                        if m > 0 {
                            assert!(row0 >= 0, "{ctx}: only the first tile may start above row 0");
                        }
                        if !shifted {
                            assert_eq!(row0, (m * block_m) as i32, "{ctx}");
                        }
                    }
                    if shifted {
                        assert_eq!(next, seqlen_q as i32, "tile {block_m}x{block_n} seqlen {seqlen_q}: the last tile ends on the last row");
                    }
                    assert!(next >= seqlen_q as i32);
                }
            }
        }
        // Causal calls with seqlen_k != seqlen_q (a diagonal offset of either sign): every
        // key a row attends lies in a block its tile visits, and no warpgroup sees past
        // the tile's blocks.
        for (seqlen_q, seqlen_k) in [(1, 9), (9, 1), (200, 333), (333, 200), (1000, 300), (300, 1000), (1025, 1025)] {
            let p = FwdParams { seqlen_q, seqlen_k, causal: 1, ..Default::default() };
            let off = seqlen_k as i32 - seqlen_q as i32;
            for (block_m, block_n) in [(192, 128), (128, 128), (128, 80)] {
                let mut next = 0i32;
                for m in 0..seqlen_q.div_ceil(block_m) {
                    let row0 = tile_row0(&p, m, block_m, block_n);
                    let n = p.n_blocks(row0, block_m, block_n);
                    let ctx = format!("sq {seqlen_q} sk {seqlen_k} tile {block_m}x{block_n} m {m}");
                    assert_eq!(row0.max(0), next, "{ctx}: a gap or an overlap");
                    next = row0 + block_m as i32;
                    for r in row0.max(0)..(row0 + block_m as i32).min(seqlen_q as i32) {
                        let last_key = (r + off).min(seqlen_k as i32 - 1);
                        assert!(last_key < 0 || (last_key as u32) < n * block_n, "{ctx}: row {r} needs key {last_key}, visits {n} blocks");
                    }
                    for wg in 0..block_m / 64 {
                        assert!(p.visible_blocks(row0 + 64 * wg as i32, 64, block_n) <= n, "{ctx}: warpgroup {wg}");
                    }
                }
                if tiles_end_at_last_row(block_m, block_n) {
                    assert_eq!(next, seqlen_q as i32, "sq {seqlen_q} sk {seqlen_k} block_m {block_m}: the last tile ends on the last row");
                }
            }
        }
        // hdim 64 at 1k: 64 rows first (one key block), the 192-row tiles after them.
        let p = FwdParams { seqlen_q: 1024, seqlen_k: 1024, causal: 1, ..Default::default() };
        let starts: std::vec::Vec<i32> = (0..6).map(|m| tile_row0(&p, m, 192, 128)).collect();
        assert_eq!(starts, [-128, 64, 256, 448, 640, 832]);
        assert_eq!((p.n_blocks(starts[0], 192, 128), p.n_blocks(starts[5], 192, 128)), (1, 8));
    }

    #[test]
    fn shared_memory_fits_the_h100_for_every_kernel() {
        for hdim in crate::HEAD_DIMS {
            assert!(smem_layout(tile_config_wgs(hdim, 2)).total <= MAX_SMEM, "hdim {hdim}, 2 warpgroups");
        }
        for k in KERNELS.iter() {
            let (hdim, l) = (k.hdim, smem_layout(kernel_config(k)));
            assert!(l.total <= MAX_SMEM, "{}: {} bytes", k.name, l.total);
            // hdim 64 and 128 stage O apart from Q; 256 has no room and reuses Q.
            assert_eq!(l.o_shares_q(), hdim == 256, "hdim {hdim}");
            // Every handoff slot is 16-byte aligned (vector stores and loads).
            for s in 0..TILE_HANDOFF_STAGES {
                let slot = l.tile_handoff_slot(s);
                assert_eq!(slot % 16, 0, "hdim {hdim}: handoff slot {s} at {slot}");
                assert!(slot + TILE_HANDOFF_SLOT_BYTES <= l.total, "hdim {hdim}");
            }
            // Every tile starts on a 1024 B swizzle-atom boundary.
            for off in [l.q, l.k, l.v, l.o, l.k + l.kv_stage_bytes, l.v + l.kv_stage_bytes] {
                assert_eq!(off % 1024, 0, "hdim {hdim}: tile at {off}");
            }
        }
    }

    #[test]
    fn register_split_fits_the_register_file() {
        for k in KERNELS.iter().filter(|k| k.algo == Algo::Fa3(Techniques::FULL)) {
            let (hdim, cluster) = (k.hdim, k.cluster);
            {
                let c = kernel_config(k);
                let (producer, consumer) = c.register_split(cluster);
                let threads = threads(Techniques::FULL, c.consumer_wgs);
                assert!(128 * (producer + c.consumer_wgs * consumer) <= 65536, "hdim {hdim}");
                assert_eq!((producer % 8, consumer % 8), (0, 0));
                // setmaxnreg moves registers within what the CTA got at launch (the
                // `.maxntid` cap, rounded down to 8): the consumers' increase must fit in
                // what the producer gives back, or `setmaxnreg.inc` would wait forever.
                let at_launch = (65536 / threads) / 8 * 8;
                assert!(producer <= at_launch && at_launch <= consumer, "hdim {hdim}");
                assert!((at_launch - producer) * 128 >= (consumer - at_launch) * 128 * c.consumer_wgs, "hdim {hdim}");
            }
        }
    }

    #[test]
    fn tma_boxes_and_tiles_fit_hardware_limits() {
        for k in KERNELS {
            let (hdim, c) = (k.hdim, kernel_config(&k));
            // A TMA box dimension is at most 256 elements; WGMMA N is a multiple of 8 up to 256.
            assert!(c.block_m() <= 256 && c.block_n <= 256 && c.block_n % 16 == 0, "hdim {hdim}");
            // Named barriers: the epilogues take 1..=wgs and pingpong 4..4+wgs (the kernel
            // asserts it at compile time), so at most three consumer warpgroups.
            assert!(c.consumer_wgs <= 3, "hdim {hdim}");
        }
    }
}
