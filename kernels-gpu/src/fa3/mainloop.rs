//! The consumer mainloop of one warpgroup (64 query rows): S = Q K^T (SS WGMMA; RS with
//! Q in registers at hdim 128, see `common::fa3::Q_IN_REGISTERS`), score modification,
//! mask, online softmax, O += P V (RS WGMMA, P straight from the S registers).
//!
//! A tile's key blocks are visited from the last down (step i visits block
//! `n_block_min + n - 1 - i`), so the blocks a causal mask cuts come first: they run the
//! masked step, the rest the unmasked one, which has no mask code ([`super::mask`]); a
//! sliding window's first blocks, visited last, need the mask again (its kernels run one
//! loop whose step branches around the mask).
//!
//! With the intra-warpgroup overlap (FA3's), step i issues QK^T of block i and PV of
//! block i-1 back to back, then runs the softmax of block i while that PV is still on
//! the tensor cores; O is rescaled once the PV has landed. With pingpong, named barriers
//! make the warpgroups take turns issuing their GEMMs, so one's softmax runs while the
//! other's GEMMs do.
use super::barriers::NamedBarrier;
use super::descale::{self, BlockFactorRows, BlockFactors, VUnit};
use super::gemm;
use super::mask::{Mask, ScoreMod};
use super::pipeline::{PipelineState, TmaPipeline};
use super::producer::Loader;
use super::scheduler::Tile;
use super::storage::SharedStorage;
use super::traits::{FragTile, KernelTraits, ProbTile, WARPGROUP_ROWS, WARPGROUP_THREADS};
use crate::element::{Element, Operand};
use crate::ptx::compiler::opaque_u32;
use crate::ptx::mbarrier::Mbarrier;
use crate::ptx::smem::SmemAddr;
use crate::ptx::wgmma::WgmmaAcc;
use crate::ptx::{math, mma, sreg};
use crate::softmax::{OnlineSoftmax, Weight};
use common::FwdParams;
use common::fa3::KV_STAGES;
use common::gmma::{desc_add, k_major_plain, sw128_offset};

/// A warpgroup's 64 x 128 Q as A fragments, one per k16 step.
pub type QFrags = [[u32; 4]; 8];

/// Loads this warpgroup's rows of Q (`q_tile`: the CTA's Q buffer, `K::BLOCK_M` rows in
/// 64-column 128 B-swizzled chunks) into A fragments: `ldmatrix.x4` gives matrix `i` to
/// register `i`, and lanes 8i..8i+7 address its rows, so matrices (rows 0-7 | 8-15) x
/// (k 0-7 | 8-15) land as the wgmma A fragment's `a0..a3`.
#[inline(always)]
pub fn load_q<K: KernelTraits>(q_tile: SmemAddr, wg: u32, thread_in_wg: u32) -> QFrags {
    let warp = thread_in_wg / 32;
    let lane = thread_in_wg % 32;
    let row = wg * WARPGROUP_ROWS + warp * 16 + (lane / 8 % 2) * 8 + lane % 8;
    core::array::from_fn(|kk| {
        let col = kk as u32 * 16 + (lane / 16) * 8;
        // SAFETY: inside the landed Q tile; 16 B aligned (a whole swizzle unit).
        unsafe { mma::ldmatrix_x4(q_tile.add(sw128_offset(K::BLOCK_M, row, col))) }
    })
}

/// Inter-warpgroup GEMM ordering, round robin over the consumer warpgroups. Warpgroup w
/// waits on its own barrier before issuing and arrives on the next one's after. The turns
/// run on across tiles: the last warpgroup's final turn of a tile hands warpgroup 0 its
/// first turn of the next, so no warpgroup waits for another's epilogue. Once per CTA,
/// [`PingPong::start`] gives warpgroup 0 its very first turn and [`PingPong::finish`]
/// takes the last warpgroup's final arrival, so that every barrier ends balanced.
#[derive(Clone, Copy)]
pub struct PingPong {
    pub enabled: bool,
    pub wg: u32,
    pub wgs: u32,
}

impl PingPong {
    #[inline(always)]
    fn is_last(self) -> bool {
        self.wg + 1 == self.wgs
    }

    /// Before this warpgroup's first tile.
    #[inline(always)]
    pub fn start(self) {
        if self.enabled && self.is_last() {
            NamedBarrier::PingPong.arrive(0);
        }
    }

    /// After this warpgroup's last tile.
    #[inline(always)]
    pub fn finish(self) {
        if self.enabled && self.wg == 0 {
            NamedBarrier::PingPong.sync(0);
        }
    }

    #[inline(always)]
    fn begin(self) {
        if self.enabled {
            NamedBarrier::PingPong.sync(self.wg);
        }
    }

    #[inline(always)]
    fn end(self) {
        if self.enabled {
            let next = if self.is_last() { 0 } else { self.wg + 1 };
            NamedBarrier::PingPong.arrive(next);
        }
    }
}

/// Shared-memory operands of the mainloop.
#[derive(Clone, Copy)]
pub struct Operands {
    /// Descriptor of this warpgroup's 64 Q rows (chunk 0, k 0); unused where it is
    /// derived at each step ([`KernelTraits::Q_DESC_PER_STEP`]).
    pub q_desc: u64,
    pub k: TmaPipeline<KV_STAGES>,
    pub v: TmaPipeline<KV_STAGES>,
    /// Q's "empty" barrier, released right after the tile's last QK^T (before its last PV
    /// and the epilogue), so that the producer's load of the next tile's Q hides behind
    /// them, as in FA3. `None` when O is staged in Q's buffer (released after the store)
    /// or Q is in registers (released once loaded).
    pub q_empty: Option<Mbarrier>,
    /// The key-offset tile (`KernelConfig::key_offsets`).
    pub key_offsets: SmemAddr,
}

impl Operands {
    /// This warpgroup's Q descriptor: held, or derived afresh from the thread index and
    /// the shared-memory base ([`KernelTraits::Q_DESC_PER_STEP`]).
    #[inline(always)]
    fn q_desc<K: KernelTraits>(&self) -> u64 {
        if !K::Q_DESC_PER_STEP {
            return self.q_desc;
        }
        let wg = opaque_u32(sreg::thread_idx_x()) / WARPGROUP_THREADS - K::WARP_SPECIALIZED as u32;
        K::qk_desc(SharedStorage::new::<K>(None).q.slot(0).add(K::qk_rows(K::BLOCK_M, wg * WARPGROUP_ROWS)).0)
    }

    #[inline(always)]
    fn k_desc<K: KernelTraits>(&self, st: PipelineState<KV_STAGES>) -> u64 {
        K::qk_desc(self.k.slot(st.index()).0)
    }

    #[inline(always)]
    fn v_desc<K: KernelTraits>(&self, st: PipelineState<KV_STAGES>) -> u64 {
        K::Element::v_desc(self.v.slot(st.index()).0, K::BLOCK_N)
    }
}

/// The extra k-step of QKᵀ that adds a bias's column term (`KernelConfig::key_offsets`):
/// this lane's A fragment and the key-offset tile's descriptor.
#[derive(Clone, Copy)]
struct KeyOffsets {
    a: [u32; 4],
    desc: u64,
}

/// S = Q K^T over the head dim, from wherever Q is: `HDIM/K_STEP` SS wgmmas with both
/// operands K-major, or 8 RS wgmmas with Q's fragments ([`KernelTraits::Q_IN_REGISTERS`]);
/// then with `KernelConfig::key_offsets` one RS wgmma that adds the bias's column term.
#[inline(always)]
fn qk<K: KernelTraits>(s: &mut K::Scores, q: &QFrags, q_desc: u64, k_desc: u64, offsets: KeyOffsets) {
    qk_head_dim::<K>(s, q, q_desc, k_desc);
    if K::CONFIG.key_offsets {
        K::Element::qk_rs(s, offsets.a, offsets.desc, true);
    }
}

#[inline(always)]
fn qk_head_dim<K: KernelTraits>(s: &mut K::Scores, q: &QFrags, q_desc: u64, k_desc: u64) {
    if K::Q_IN_REGISTERS {
        for kk in 0..8u32 {
            K::Element::qk_rs(s, q[kk as usize], desc_add(k_desc, K::qk_k_step(K::BLOCK_N, kk)), kk > 0);
        }
    } else {
        for kk in 0..K::HDIM / K::Element::K_STEP {
            let (q_step, k_step) = (K::qk_k_step(K::BLOCK_M, kk), K::qk_k_step(K::BLOCK_N, kk));
            K::Element::qk_ss(s, desc_add(q_desc, q_step), desc_add(k_desc, k_step), kk > 0);
        }
    }
}

/// P's register tile of a kernel.
type Probs<K> = <<K as KernelTraits>::Element as Operand>::Probs<<K as KernelTraits>::Scores>;

/// O += P V: `BLOCK_N/K_STEP` RS wgmmas, V as stored (MN-major, or transposed for e4m3).
#[inline(always)]
fn pv<K: KernelTraits>(o: &mut K::Out, p: &Probs<K>, v_desc: u64) {
    for kb in 0..<Probs<K> as ProbTile>::STEPS {
        K::Element::pv(o, p.step(kb), desc_add(v_desc, K::Element::v_k_step(kb as u32, K::HDIM, K::BLOCK_N)));
    }
}

/// A consumer warpgroup's register tiles.
struct Registers<K: KernelTraits> {
    s: K::Scores,
    o: K::Out,
    p: Probs<K>,
}

impl<K: KernelTraits> Registers<K> {
    /// Compiler fences on every register operand that ordinary code may have written
    /// since the last GEMM (before a [`gemm::issue`]). Q's fragments (when in registers)
    /// are written once per tile, before any of its GEMMs.
    #[inline(always)]
    fn fence_operands(&mut self) {
        self.s.fence_operand();
        self.o.fence_operand();
        self.p.fence_operand();
    }
}

/// Where this warpgroup's steps need masking, and the softmax step.
#[derive(Clone, Copy)]
struct Steps<'a, K: KernelTraits> {
    p: &'a FwdParams,
    mask: K::Mask,
    score_mod: K::ScoreMod,
    tile: &'a Tile,
    /// The softmax's `scale · log2 e` with the FP8 descales folded in (FP8 only; the
    /// 16-bit kernels read `p.scale_log2`).
    scale_log2: f32,
    n: u32,
    /// One past the tile's last key block (`n_block_min + n`): step `i` visits block
    /// `top - 1 - i`.
    top: u32,
    wg_row0: i32,
    row_g: i32,
    col_2t: i32,
    /// `KernelConfig::key_offsets`: this lane's A register for `+slope` ([`key_offset_operand`]).
    offset_operand: u32,
}

/// The A register of lane `lane` for the key-offset k-step: row-independent, columns
/// `2 (lane % 4)` and `+ 1` of the slope split into three parts of `E` (`hi + mid + lo`
/// is the f32 slope to within its rounding): lane 0 holds (hi, mid), lane 1 (lo, 0), the
/// others zeros (their columns' B is zero too).
#[inline(always)]
fn key_offset_operand<E: Element>(slope: f32, lane: u32) -> u32 {
    let hi = E::unpack2(E::pack2(slope, 0.0))[0];
    let mid = E::unpack2(E::pack2(slope - hi, 0.0))[0];
    let lo = slope - hi - mid;
    match lane % 4 {
        0 => E::pack2(hi, mid),
        1 => E::pack2(lo, 0.0),
        _ => 0,
    }
}

impl<K: KernelTraits> Steps<'_, K> {
    /// The key block of step `i`.
    #[inline(always)]
    fn block(&self, i: u32) -> u32 {
        if K::Mask::SPARSE { self.tile.key_block::<K>(self.p, i) } else { self.top - 1 - i }
    }

    /// The key-offset k-step of step `i` (`KernelConfig::key_offsets`): `±slope` on the
    /// blocks that lie on one side of the warp's diagonals, zero elsewhere (there the
    /// score hook adds the whole bias).
    #[inline(always)]
    fn key_offsets(&self, i: u32, tile: SmemAddr) -> KeyOffsets {
        if !K::CONFIG.key_offsets {
            return KeyOffsets { a: [0; 4], desc: 0 };
        }
        let col_2t = (self.block(i) * K::BLOCK_N) as i32 + self.col_2t;
        let a = match self.score_mod.key_offset_side::<K::Scores>(self.row_g, col_2t) {
            Some(true) => self.offset_operand,
            // -slope: both halves' signs flipped.
            Some(false) => self.offset_operand ^ 0x8000_8000,
            None => 0,
        };
        KeyOffsets { a: [a, a, 0, 0], desc: k_major_plain(tile.0) }
    }

    /// The first step this warpgroup computes: the tile's leading steps visit key blocks
    /// masked for all of its 64 rows (past its causal diagonal or window, or every block
    /// when its rows are past `seqlen_q`), which cost it no GEMM and no softmax.
    #[inline(always)]
    fn first(&self) -> u32 {
        let end = K::Mask::visible_blocks(self.p, self.tile.batch, self.wg_row0, WARPGROUP_ROWS, K::BLOCK_N).1;
        let skipped = self.top - end.min(self.top);
        // A local warpgroup that sees nothing skips every step (its `end` is 0).
        let skipped = if K::Mask::LOCAL { skipped.min(self.n) } else { skipped };
        // Warpgroup-uniform already; the broadcast lets ptxas see it, so that the loops
        // bounded by it keep their wgmma asynchronous.
        math::shfl_broadcast_u32(skipped)
    }

    /// Steps before the first returned visit blocks that need a mask for some row of
    /// the warpgroup; from it to the second none does. From the second on (local masks
    /// only; `n` otherwise) they need it again.
    #[inline(always)]
    fn unmasked_steps(&self) -> (u32, u32) {
        if K::Mask::SPARSE {
            // The list's partial blocks lead.
            return (self.tile.partial(), self.n);
        }
        let (whole_first, whole_end) = K::Mask::whole_blocks(self.p, self.tile.batch, self.wg_row0, WARPGROUP_ROWS, K::BLOCK_N);
        let from = self.top - whole_end.min(self.top);
        // `whole_first` within the tile's blocks (`max`/`min`: `clamp` would bring a
        // panic path).
        let to = if K::Mask::LOCAL { (self.top - whole_first.max(self.top - self.n).min(self.top)).max(from) } else { self.n };
        // Uniform, as above.
        (math::shfl_broadcast_u32(from), math::shfl_broadcast_u32(to))
    }

    /// Score modification, mask and the softmax of step `i` (key block `top - 1 - i`);
    /// returns the factor O must be rescaled by, if any. The mask runs when `MASKED` (a
    /// step of a masked loop) and `needs_mask` (a run-time check, for kernels whose
    /// masked and unmasked steps share one loop; `true` elsewhere). FP8 only: `k_factor`
    /// scales the block's scores, `weight` its probabilities.
    #[inline(always)]
    fn softmax<const MASKED: bool>(&self, s: &mut K::Scores, sm: &mut OnlineSoftmax, i: u32, needs_mask: bool, k_factor: f32, weight: Weight) -> Option<[f32; 2]> {
        let col_2t = (self.block(i) * K::BLOCK_N) as i32 + self.col_2t;
        let row_bias = self.score_mod.apply(s, self.row_g, col_2t);
        if MASKED && needs_mask {
            self.mask.apply_with(self.p, self.tile.batch, s, col_2t);
        }
        if K::FP8 {
            // K's per-block factor scales this block's scores (1 with per-head factors,
            // which are in `scale_log2`).
            return s.softmax_update(sm, self.scale_log2, k_factor, row_bias, weight, false);
        }
        s.softmax_update(sm, self.p.scale_log2, 1.0, row_bias, Weight::ONE, crate::softmax::LAZY_RESCALE)
    }
}

/// Releasing ring slots after use and, without warp specialization, refilling them
/// with the block `KV_STAGES` steps ahead.
struct Rings<'a, K: KernelTraits> {
    ops: &'a Operands,
    k_state: &'a mut PipelineState<KV_STAGES>,
    v_state: &'a mut PipelineState<KV_STAGES>,
    loader: &'a mut Loader<K>,
    /// This thread takes part in loading (no warp specialization).
    refills: bool,
    tile: &'a Tile,
}

impl<K: KernelTraits> Rings<'_, K> {
    /// Done with K of step `i` (and, after the last step, with Q).
    #[inline(always)]
    fn release_k(&mut self, i: u32) {
        self.ops.k.consumer_release(*self.k_state);
        if i + 1 == self.tile.n_blocks {
            if let Some(q_empty) = self.ops.q_empty {
                q_empty.arrive();
            }
        }
        if self.refills && i + KV_STAGES < self.tile.n_blocks {
            self.loader.load_k(self.tile, i + KV_STAGES);
        }
        self.k_state.advance();
    }

    /// Done with V of step `i`.
    #[inline(always)]
    fn release_v(&mut self, i: u32) {
        self.ops.v.consumer_release(*self.v_state);
        if self.refills && i + KV_STAGES < self.tile.n_blocks {
            self.loader.load_v(self.tile, i + KV_STAGES);
        }
        self.v_state.advance();
    }
}

/// One tile's mainloop state of a warpgroup.
struct Mainloop<'a, K: KernelTraits> {
    ops: &'a Operands,
    q: &'a QFrags,
    pingpong: PingPong,
    steps: Steps<'a, K>,
    rings: Rings<'a, K>,
    regs: Registers<K>,
    softmax: OnlineSoftmax,
    /// FP8: O's V unit, and where the tile's per-block factors are.
    v_unit: VUnit,
    factor_rows: BlockFactorRows,
}

impl<K: KernelTraits> Mainloop<'_, K> {
    /// A GEMM turn of QK_i alone, waited for; K_i's slot released. Returns step i's FP8
    /// block factors, loaded under the GEMM.
    #[inline(always)]
    fn qk_turn(&mut self, i: u32) -> BlockFactors {
        self.ops.k.consumer_wait(*self.rings.k_state);
        self.pingpong.begin();
        self.regs.fence_operands();
        let k_desc = self.ops.k_desc::<K>(*self.rings.k_state);
        let offsets = self.steps.key_offsets(i, self.ops.key_offsets);
        gemm::issue(#[inline(always)] || qk::<K>(&mut self.regs.s, self.q, self.ops.q_desc::<K>(), k_desc, offsets));
        let factors = self.block_factors(i);
        self.pingpong.end();
        gemm::wait::<0>(&mut self.regs.s);
        self.rings.release_k(i);
        factors
    }

    /// Step `i` of the overlapped loop, one GEMM turn: QK_i and PV_{i-1} (O rescaled by
    /// `alpha`, step i-1's factor, under QK_i, just before PV_{i-1} accumulates into it,
    /// as in FA3), then the softmax of block i while PV_{i-1} runs. Returns step i's
    /// factor.
    #[inline(always)]
    fn overlapped_step<const MASKED: bool>(&mut self, i: u32, alpha: Option<[f32; 2]>, needs_mask: bool) -> Option<[f32; 2]> {
        let ops = self.ops;
        ops.k.consumer_wait(*self.rings.k_state);
        self.pingpong.begin();
        self.regs.fence_operands();
        let k_desc = ops.k_desc::<K>(*self.rings.k_state);
        let offsets = self.steps.key_offsets(i, ops.key_offsets);
        gemm::issue(#[inline(always)] || qk::<K>(&mut self.regs.s, self.q, ops.q_desc::<K>(), k_desc, offsets));
        let factors = self.block_factors(i);
        let alpha = self.before_pv(alpha);
        self.regs.o.rescale(alpha);
        self.regs.o.fence_operand();
        // Waited for after O's fence: a spin loop between `wgmma.fence` and the wgmma
        // makes ptxas 13.0 (the driver's JIT) inject another `warpgroup.arrive` (C7519).
        ops.v.consumer_wait(*self.rings.v_state);
        let v_desc = ops.v_desc::<K>(*self.rings.v_state);
        gemm::issue(|| pv::<K>(&mut self.regs.o, &self.regs.p, v_desc));
        self.pingpong.end();
        // S_i landed; PV_{i-1} may still run while the softmax does.
        gemm::wait::<1>(&mut self.regs.s);
        self.rings.release_k(i);
        let alpha = self.softmax::<MASKED>(i, needs_mask, factors);
        gemm::wait::<0>(&mut self.regs.o);
        // P_i may only overwrite the A registers once PV_{i-1} has read them.
        self.regs.s.fence_operand();
        self.rings.release_v(i - 1);
        self.regs.p = K::Element::to_probs(&self.regs.s);
        alpha
    }

    /// FP8: step `i`'s key block factors (to be loaded while its QK GEMM runs).
    #[inline(always)]
    fn block_factors(&self, i: u32) -> BlockFactors {
        if K::FP8 { self.factor_rows.load::<K>(self.steps.top - 1 - i) } else { BlockFactors::NONE }
    }

    /// The softmax of step `i` ([`Steps::softmax`]), with FP8's factors of its key block.
    #[inline(always)]
    fn softmax<const MASKED: bool>(&mut self, i: u32, needs_mask: bool, factors: BlockFactors) -> Option<[f32; 2]> {
        let weight = if K::FP8 { self.v_unit.enter::<K>(self.steps.p, factors.v) } else { Weight::ONE };
        self.steps.softmax::<MASKED>(&mut self.regs.s, &mut self.softmax, i, needs_mask, factors.k, weight)
    }

    /// O's factor before the PV of the last softmax's step: the softmax's `alpha`, with
    /// FP8's conversion of O to a new V unit folded in.
    #[inline(always)]
    fn before_pv(&mut self, alpha: Option<[f32; 2]>) -> Option<[f32; 2]> {
        if K::FP8 { self.v_unit.before_pv(alpha) } else { alpha }
    }

    /// The last GEMM turn of the overlapped loop: PV of the last step, after O's rescale.
    #[inline(always)]
    fn last_pv(&mut self, n: u32, alpha: Option<[f32; 2]>) {
        self.ops.v.consumer_wait(*self.rings.v_state);
        self.pingpong.begin();
        let alpha = self.before_pv(alpha);
        self.regs.o.rescale(alpha);
        self.regs.fence_operands();
        let v_desc = self.ops.v_desc::<K>(*self.rings.v_state);
        gemm::issue(|| pv::<K>(&mut self.regs.o, &self.regs.p, v_desc));
        self.pingpong.end();
        gemm::wait::<0>(&mut self.regs.o);
        // Also moves the ring on: its position carries over to the next tile.
        self.rings.release_v(n - 1);
    }

    /// Step `i` without overlap: softmax, PV_i, serially.
    #[inline(always)]
    fn serial_step<const MASKED: bool>(&mut self, i: u32) {
        // Never FP8 (`run` asserts it): no block factors.
        let alpha = self.softmax::<MASKED>(i, true, BlockFactors::NONE);
        self.regs.o.rescale(alpha);
        self.regs.p = K::Element::to_probs(&self.regs.s);
        self.ops.v.consumer_wait(*self.rings.v_state);
        self.regs.fence_operands();
        let v_desc = self.ops.v_desc::<K>(*self.rings.v_state);
        gemm::issue(|| pv::<K>(&mut self.regs.o, &self.regs.p, v_desc));
        gemm::wait::<0>(&mut self.regs.o);
        self.rings.release_v(i);
    }
}

/// Runs the mainloop of one tile (Q already landed); returns the unnormalised O
/// accumulator and the row statistics. `k_state`, `v_state`: ring positions, carried across tiles.
/// `is_loader`: this thread refills the rings itself through `loader` (no warp
/// specialization).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn run<K: KernelTraits>(
    p: &FwdParams,
    tile: &Tile,
    ops: &Operands,
    pingpong: PingPong,
    wg: u32,
    thread_in_wg: u32,
    k_state: &mut PipelineState<KV_STAGES>,
    v_state: &mut PipelineState<KV_STAGES>,
    loader: &mut Loader<K>,
    is_loader: bool,
    qf: &QFrags,
) -> (K::Out, OnlineSoftmax) {
    let n = tile.n_blocks;
    if n == 0 {
        return (K::Out::zeroed(), OnlineSoftmax::new());
    }
    let lane = thread_in_wg % 32;
    let wg_row0 = tile.row0 + (wg * WARPGROUP_ROWS) as i32;
    let row_g = wg_row0 + ((thread_in_wg / 32) * 16 + lane / 4) as i32;
    let score_mod = K::ScoreMod::new(p, tile.batch, tile.head);
    let steps = Steps::<K> {
        p,
        mask: K::Mask::new(p, tile, row_g),
        score_mod,
        tile,
        scale_log2: descale::tile_scales::<K>(p, tile).0,
        n,
        top: tile.n_block_min + n,
        wg_row0,
        row_g,
        col_2t: 2 * (lane % 4) as i32,
        offset_operand: if K::CONFIG.key_offsets { key_offset_operand::<K::OutElement>(score_mod.key_offset_slope(), lane) } else { 0 },
    };
    let mut ml = Mainloop::<K> {
        ops,
        q: qf,
        pingpong,
        steps,
        rings: Rings { ops, k_state, v_state, loader, refills: is_loader, tile },
        regs: Registers { s: K::Scores::zeroed(), o: K::Out::zeroed(), p: ProbTile::zeroed() },
        softmax: OnlineSoftmax::new(),
        v_unit: VUnit::new(),
        factor_rows: BlockFactorRows::new::<K>(p, tile),
    };
    // The FP8 kernels' per-block V factors are folded in by the overlapped loop only, and
    // their steps visit key blocks `top - 1 - i` (no block-sparse list).
    const { assert!(!K::FP8 || (K::OVERLAP && !K::Mask::SPARSE)) };

    // Skipped steps still move the rings on and take their GEMM turn, so that every
    // warpgroup takes the same number of turns per tile (n + 1 with the overlap, n without).
    // Not without warp specialization: there a release refills the ring and blocks until
    // the other warpgroups released the slot too, which they do only after turns that
    // would wait for ours (the ablation's hdim 128 skips no block anyway).
    let first = if is_loader || !K::SKIPS_MASKED_BLOCKS { 0 } else { steps.first() };
    for i in 0..first {
        ops.k.consumer_wait(*ml.rings.k_state);
        ops.v.consumer_wait(*ml.rings.v_state);
        pingpong.begin();
        pingpong.end();
        ml.rings.release_k(i);
        ml.rings.release_v(i);
    }
    if first == n {
        if K::OVERLAP {
            pingpong.begin();
            pingpong.end();
        }
        return (ml.regs.o, ml.softmax);
    }
    // Masked steps: first..unmasked_from and masked_from..n.
    let (unmasked_from, masked_from) = steps.unmasked_steps();

    if K::OVERLAP {
        // n - first + 1 GEMM turns: QK_first; (QK_i, PV_{i-1}) for i in first+1..n; PV_{n-1}.
        let factors = ml.qk_turn(first);
        // O is still zero: the first step's factor is not needed. It is masked or not by
        // a (warp-uniform) branch, not a loop of its own.
        let first_masked = first < unmasked_from || (K::Mask::LOCAL && first >= masked_from);
        ml.softmax::<true>(first, first_masked, factors);
        ml.regs.p = K::Element::to_probs(&ml.regs.s);
        let mut alpha = None;
        if K::SEPARATE_MASKED_LOOP {
            // Never a local mask (its masked steps at both ends run the single loop below,
            // `KernelTraits::SEPARATE_MASKED_LOOP`): masked steps are the leading ones.
            const { assert!(!K::Mask::LOCAL || !K::SEPARATE_MASKED_LOOP) };
            let split = unmasked_from.max(first + 1).min(n);
            for i in first + 1..split {
                alpha = ml.overlapped_step::<true>(i, alpha, true);
            }
            for i in split..n {
                alpha = ml.overlapped_step::<false>(i, alpha, false);
            }
        } else {
            for i in first + 1..n {
                let masked = i < unmasked_from || (K::Mask::LOCAL && i >= masked_from);
                alpha = ml.overlapped_step::<true>(i, alpha, masked);
            }
        }
        ml.last_pv(n, alpha);
        if K::FP8 {
            let v = ml.v_unit.output::<K>(p, tile);
            ml.regs.o.rescale(Some([v, v]));
        }
    } else {
        // n - first GEMM turns: QK_i; then softmax, PV_i, serially. The loops are rotated
        // (QK_first before them, QK_{i+1} at the end of step i), as in the overlap path,
        // for the driver's PTX JIT: ptxas 13.0 (580 drivers; 13.1 and later do not) took
        // Q's fragments as dead after a body-opening RS QK^T when branches followed it,
        // and put P in their registers. Rotated, Q's last use in the body is its last
        // instruction, and 13.0 keeps Q's registers (tests/tests/ptx.rs checks).
        ml.qk_turn(first);
        let split = unmasked_from.max(first).min(n);
        let split_local = if K::Mask::LOCAL { masked_from.max(split).min(n) } else { n };
        for i in first..split {
            ml.serial_step::<true>(i);
            if i + 1 < n {
                ml.qk_turn(i + 1);
            }
        }
        for i in split..split_local {
            ml.serial_step::<false>(i);
            if i + 1 < n {
                ml.qk_turn(i + 1);
            }
        }
        if K::Mask::LOCAL {
            for i in split_local..n {
                ml.serial_step::<true>(i);
                if i + 1 < n {
                    ml.qk_turn(i + 1);
                }
            }
        }
    }
    (ml.regs.o, ml.softmax)
}
