//! The consumer mainloop of one warpgroup (64 query rows): S = Q K^T (SS WGMMA; RS with
//! Q in registers at hdim 128, see `common::fa3::Q_IN_REGISTERS`), mask, online softmax,
//! O += P V (RS WGMMA, P straight from the S registers).
//!
//! With `OVERLAP` (FA3's intra-warpgroup pipelining), step i issues QK^T of block i and
//! PV of block i-1 back to back, then runs the softmax of block i while that PV is still
//! on the tensor cores; O is rescaled once the PV has landed. With pingpong, named
//! barriers make the two warpgroups take turns issuing their GEMMs, so one's softmax
//! runs while the other's GEMMs do.
use super::pipeline::{PipelineState, TmaPipeline};
use super::producer::Loader;
use super::scheduler::Tile;
use crate::element::{Element, a_fragment};
use crate::ptx::{barrier, math, mma};
use crate::ptx::smem::SmemAddr;
use crate::ptx::mbarrier::Mbarrier;
use crate::ptx::wgmma::{self, WgmmaAcc, fence_a_operand};
use crate::softmax::{Frag, OnlineSoftmax, apply_mask};
use common::FwdParams;
use common::fa3::{TileConfig, q_in_registers};
use common::gmma::{k_major_sw128, mn_major_sw128, sw128_offset};

/// A warpgroup's 64 x 128 Q as A fragments, one per k16 step.
pub type QFrags = [[u32; 4]; 8];

/// Loads this warpgroup's rows of Q (`q_tile`: the CTA's Q buffer, `BLOCK_M` rows in
/// 64-column 128 B-swizzled chunks) into A fragments: `ldmatrix.x4` gives matrix `i` to
/// register `i`, and lanes 8i..8i+7 address its rows, so matrices (rows 0-7 | 8-15) x
/// (k 0-7 | 8-15) land as the wgmma A fragment's `a0..a3`.
#[inline(always)]
pub fn load_q<const BLOCK_M: u32>(q_tile: SmemAddr, wg: u32, thread_in_wg: u32) -> QFrags {
    let warp = thread_in_wg / 32;
    let lane = thread_in_wg % 32;
    let row = wg * 64 + warp * 16 + (lane / 8 % 2) * 8 + lane % 8;
    core::array::from_fn(|kk| {
        let col = kk as u32 * 16 + (lane / 16) * 8;
        // SAFETY: inside the landed Q tile; 16 B aligned (a whole swizzle unit).
        unsafe { mma::ldmatrix_x4(q_tile.add(sw128_offset(BLOCK_M, row, col))) }
    })
}

/// Named barriers 4.. (one per consumer warpgroup, after the epilogues' 1..=3): the
/// warpgroups' turns to issue GEMMs.
pub const PINGPONG_BARRIER: u32 = 4;

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
            barrier::named_arrive(PINGPONG_BARRIER, 256);
        }
    }

    /// After this warpgroup's last tile.
    #[inline(always)]
    pub fn finish(self) {
        if self.enabled && self.wg == 0 {
            barrier::named_sync(PINGPONG_BARRIER, 256);
        }
    }

    #[inline(always)]
    fn begin(self) {
        if self.enabled {
            barrier::named_sync(PINGPONG_BARRIER + self.wg, 256);
        }
    }

    #[inline(always)]
    fn end(self) {
        if self.enabled {
            let next = if self.is_last() { 0 } else { self.wg + 1 };
            barrier::named_arrive(PINGPONG_BARRIER + next, 256);
        }
    }
}

/// Shared-memory operands of the mainloop.
#[derive(Clone, Copy)]
pub struct Operands<const STAGES: u32> {
    /// Descriptor of this warpgroup's 64 Q rows (chunk 0, k 0).
    pub q_desc: u64,
    pub k: TmaPipeline<STAGES>,
    pub v: TmaPipeline<STAGES>,
    /// Q's "empty" barrier, released right after the tile's last QK^T (before its last PV
    /// and the epilogue), so that the producer's load of the next tile's Q hides behind
    /// them, as in FA3. `None` when O is staged in Q's buffer (released after the store).
    pub q_empty: Option<Mbarrier>,
}

impl<const STAGES: u32> Operands<STAGES> {
    #[inline(always)]
    fn k_desc(&self, st: PipelineState<STAGES>) -> u64 {
        k_major_sw128(self.k.slot(st.index()).0)
    }

    #[inline(always)]
    fn v_desc<const BLOCK_N: u32>(&self, st: PipelineState<STAGES>) -> u64 {
        mn_major_sw128(self.v.slot(st.index()).0, BLOCK_N)
    }
}

/// S = Q K^T over the head dim: `D/16` SS wgmmas, K-major operands; a k16 step is +32 B
/// inside a 128 B chunk, a chunk is `rows * 128` B.
#[inline(always)]
fn qk<E: Element, S: WgmmaAcc, const D: u32, const BLOCK_M: u32, const BLOCK_N: u32>(s: &mut S, q_desc: u64, k_desc: u64) {
    for kk in 0..D / 16 {
        let q_off = (kk / 4) * BLOCK_M * 128 + (kk % 4) * 32;
        let k_off = (kk / 4) * BLOCK_N * 128 + (kk % 4) * 32;
        E::wgmma_ss(s, q_desc + (q_off >> 4) as u64, k_desc + (k_off >> 4) as u64, kk > 0);
    }
}

/// S = Q K^T with Q from registers ([`q_in_registers`]): 8 RS wgmmas (hdim 128).
#[inline(always)]
fn qk_rs<E: Element, S: WgmmaAcc, const BLOCK_N: u32>(s: &mut S, q: &QFrags, k_desc: u64) {
    for kk in 0..8u32 {
        let k_off = (kk / 4) * BLOCK_N * 128 + (kk % 4) * 32;
        E::wgmma_rs_k(s, q[kk as usize], k_desc + (k_off >> 4) as u64, kk > 0);
    }
}

/// S = Q K^T from wherever Q is.
#[inline(always)]
fn qk_any<E: Element, S: WgmmaAcc, const D: u32, const BLOCK_M: u32, const BLOCK_N: u32>(s: &mut S, q: &QFrags, q_desc: u64, k_desc: u64) {
    if q_in_registers(D) {
        qk_rs::<E, S, BLOCK_N>(s, q, k_desc)
    } else {
        qk::<E, S, D, BLOCK_M, BLOCK_N>(s, q_desc, k_desc)
    }
}

/// O += P V: `BLOCK_N/16` RS wgmmas with V MN-major (+16 key rows = 2048 B a step).
#[inline(always)]
fn pv<E: Element, O: WgmmaAcc, const PK: usize>(o: &mut O, p: &[[u32; 4]; PK], v_desc: u64) {
    for kb in 0..PK {
        E::wgmma_rs_mn(o, p[kb], v_desc + ((kb as u32 * 2048) >> 4) as u64, true);
    }
}

#[inline(always)]
fn to_p<E: Element, const SN: usize, const PK: usize>(s: &[Frag; SN]) -> [[u32; 4]; PK] {
    core::array::from_fn(|kb| a_fragment::<E>(&s[2 * kb], &s[2 * kb + 1]))
}

/// Compiler fences on everything ordinary code wrote, then the hardware `wgmma.fence`.
#[inline(always)]
fn fence_before_gemms<S: WgmmaAcc, O: WgmmaAcc, const PK: usize>(s: &mut S, o: &mut O, p: &mut [[u32; 4]; PK]) {
    // Q's fragments (when in registers) are written once per tile, before any of its GEMMs.
    s.fence_operand();
    o.fence_operand();
    for a in p.iter_mut() {
        fence_a_operand(a);
    }
    wgmma::fence();
}

/// Where this thread's scores need masking, and the softmax step.
#[derive(Clone, Copy)]
struct Masker<'a> {
    p: &'a FwdParams,
    n: u32,
    wg_row0: i32,
    row_g: i32,
    col_2t: i32,
}

impl Masker<'_> {
    /// The first step this warpgroup computes: the tile's leading steps visit key blocks
    /// masked for all of its 64 rows (past its causal diagonal, or every block when its rows
    /// are past `seqlen_q`), which cost it no GEMM and no softmax.
    #[inline(always)]
    fn first_step<const BLOCK_N: u32>(&self) -> u32 {
        let visible = self.p.visible_blocks(self.wg_row0, 64, BLOCK_N);
        // Warpgroup-uniform already; the broadcast lets ptxas see it, so that the loops
        // bounded by it keep their wgmma asynchronous.
        math::shfl_broadcast_u32(self.n - visible.min(self.n))
    }

    /// Masks (only blocks that cross the sequence end or this warpgroup's diagonal) and
    /// folds the scores of step `i` (key block `n - 1 - i`) into the softmax.
    #[inline(always)]
    fn step<const SN: usize, const BLOCK_N: u32>(&self, s: &mut [Frag; SN], sm: &mut OnlineSoftmax, i: u32) -> Option<[f32; 2]> {
        let n0 = ((self.n - 1 - i) * BLOCK_N) as i32;
        let seqlen_k = self.p.seqlen_k as i32;
        let causal = self.p.causal_offset();
        let needs_mask =
            n0 + BLOCK_N as i32 > seqlen_k || causal.is_some_and(|off| n0 + BLOCK_N as i32 - 1 > self.wg_row0 + off);
        if needs_mask {
            apply_mask(s, self.row_g, n0 + self.col_2t, seqlen_k, causal);
        }
        sm.update(s, self.p.scale_log2)
    }
}

/// Releasing ring slots after use and, without warp specialization, refilling them
/// with the block `STAGES` steps ahead.
struct Rings<'a, const STAGES: u32, const BLOCK_N: u32> {
    ops: &'a Operands<STAGES>,
    kst: &'a mut PipelineState<STAGES>,
    vst: &'a mut PipelineState<STAGES>,
    loader: &'a mut Loader<STAGES, BLOCK_N>,
    /// This thread takes part in loading (no warp specialization).
    refills: bool,
    tile: &'a Tile,
}

impl<const STAGES: u32, const BLOCK_N: u32> Rings<'_, STAGES, BLOCK_N> {
    /// Done with K of step `i` (and, after the last step, with Q).
    #[inline(always)]
    fn release_k(&mut self, i: u32) {
        self.ops.k.consumer_release(*self.kst);
        if i + 1 == self.tile.n_blocks {
            if let Some(q_empty) = self.ops.q_empty {
                q_empty.arrive();
            }
        }
        if self.refills && i + STAGES < self.tile.n_blocks {
            self.loader.load_k(self.tile, i + STAGES);
        }
        self.kst.advance();
    }

    /// Done with V of step `i`.
    #[inline(always)]
    fn release_v(&mut self, i: u32) {
        self.ops.v.consumer_release(*self.vst);
        if self.refills && i + STAGES < self.tile.n_blocks {
            self.loader.load_v(self.tile, i + STAGES);
        }
        self.vst.advance();
    }
}

/// Runs the mainloop of one tile (Q already landed); returns the unnormalised O
/// accumulator and the row statistics. `kst`, `vst`: ring positions, carried across tiles.
/// `is_loader`: this thread refills the rings itself through `loader` (no warp
/// specialization).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn run<
    E: Element,
    const D: u32,
    const BLOCK_M: u32,
    const BLOCK_N: u32,
    const STAGES: u32,
    const SN: usize,
    const ON: usize,
    const PK: usize,
    const OVERLAP: bool,
>(
    p: &FwdParams,
    tile: &Tile,
    ops: &Operands<STAGES>,
    pingpong: PingPong,
    wg: u32,
    thread_in_wg: u32,
    kst: &mut PipelineState<STAGES>,
    vst: &mut PipelineState<STAGES>,
    loader: &mut Loader<STAGES, BLOCK_N>,
    is_loader: bool,
    qf: &QFrags,
) -> ([Frag; ON], OnlineSoftmax)
where
    [Frag; SN]: WgmmaAcc,
    [Frag; ON]: WgmmaAcc,
{
    let mut o = [[0.0f32; 4]; ON];
    let mut softmax = OnlineSoftmax::new();
    let n = tile.n_blocks;
    if n == 0 {
        return (o, softmax);
    }
    let lane = thread_in_wg % 32;
    let wg_row0 = tile.row0 + (wg * 64) as i32;
    let masker = Masker {
        p,
        n,
        wg_row0,
        row_g: wg_row0 + ((thread_in_wg / 32) * 16 + lane / 4) as i32,
        col_2t: 2 * (lane % 4) as i32,
    };

    let mut s = [[0.0f32; 4]; SN];
    let mut pf = [[0u32; 4]; PK];
    let mut rings = Rings { ops, kst, vst, loader, refills: is_loader, tile };

    // Skipped steps still move the rings on and take their GEMM turn, so that every
    // warpgroup takes the same number of turns per tile (n + 1 with the overlap, n without).
    // Not without warp specialization: there a release refills the ring and blocks until
    // the other warpgroups released the slot too, which they do only after turns that
    // would wait for ours (the ablation's hdim 128 skips no block anyway).
    let skips = const { TileConfig::new(D, BLOCK_M / 64, BLOCK_N).skips_masked_blocks() };
    let first = if is_loader || !skips { 0 } else { masker.first_step::<BLOCK_N>() };
    for i in 0..first {
        ops.k.consumer_wait(*rings.kst);
        ops.v.consumer_wait(*rings.vst);
        pingpong.begin();
        pingpong.end();
        rings.release_k(i);
        rings.release_v(i);
    }
    if first == n {
        if OVERLAP {
            pingpong.begin();
            pingpong.end();
        }
        return (o, softmax);
    }

    // A GEMM turn of QK_i alone, waited for; K_i's slot released.
    macro_rules! qk_turn {
        ($i:expr) => {
            ops.k.consumer_wait(*rings.kst);
            pingpong.begin();
            fence_before_gemms(&mut s, &mut o, &mut pf);
            qk_any::<E, _, D, BLOCK_M, BLOCK_N>(&mut s, qf, ops.q_desc, ops.k_desc(*rings.kst));
            wgmma::commit();
            pingpong.end();
            wgmma::wait::<0>();
            s.fence_operand();
            rings.release_k($i);
        };
    }
    if OVERLAP {
        // n - first + 1 GEMM turns: QK_first; (QK_i, PV_{i-1}) for i in first+1..n; PV_{n-1}.
        // When step i-1 moved the row maxima (lazy rescaling: rarely), O is rescaled while
        // QK_i runs (no wgmma holds O then), just before PV_{i-1} accumulates into it, as
        // in FA3; so only the P conversion sits between a PV landing and the next GEMMs.
        qk_turn!(first);
        // O is still zero: the first step's factor is not needed.
        masker.step::<SN, BLOCK_N>(&mut s, &mut softmax, first);
        let mut alpha = None;
        pf = to_p::<E, SN, PK>(&s);
        for i in first + 1..n {
            ops.k.consumer_wait(*rings.kst);
            pingpong.begin();
            fence_before_gemms(&mut s, &mut o, &mut pf);
            qk_any::<E, _, D, BLOCK_M, BLOCK_N>(&mut s, qf, ops.q_desc, ops.k_desc(*rings.kst));
            wgmma::commit();
            OnlineSoftmax::rescale(&mut o, alpha);
            o.fence_operand();
            ops.v.consumer_wait(*rings.vst);
            // After the wait: a spin loop between the fence and the wgmma makes ptxas 13.0
            // (the driver's JIT) inject another `warpgroup.arrive` (C7519).
            wgmma::fence();
            pv::<E, _, PK>(&mut o, &pf, ops.v_desc::<BLOCK_N>(*rings.vst));
            wgmma::commit();
            pingpong.end();
            // S_i landed; PV_{i-1} may still run while the softmax does.
            wgmma::wait::<1>();
            s.fence_operand();
            rings.release_k(i);
            alpha = masker.step::<SN, BLOCK_N>(&mut s, &mut softmax, i);
            wgmma::wait::<0>();
            o.fence_operand();
            // P_i may only overwrite the A registers once PV_{i-1} has read them.
            s.fence_operand();
            rings.release_v(i - 1);
            pf = to_p::<E, SN, PK>(&s);
        }
        ops.v.consumer_wait(*rings.vst);
        pingpong.begin();
        OnlineSoftmax::rescale(&mut o, alpha);
        fence_before_gemms(&mut s, &mut o, &mut pf);
        pv::<E, _, PK>(&mut o, &pf, ops.v_desc::<BLOCK_N>(*rings.vst));
        wgmma::commit();
        pingpong.end();
        wgmma::wait::<0>();
        o.fence_operand();
        // Also moves the ring on: its position carries over to the next tile.
        rings.release_v(n - 1);
    } else {
        // n - first GEMM turns: QK_i; then softmax, PV_i, serially. The loop is rotated
        // (QK_first before it, QK_{i+1} at the end of step i), as in the overlap path, for
        // the driver's PTX JIT: ptxas 13.0 (580 drivers; 13.1 and later do not) took Q's
        // fragments as dead after a body-opening RS QK^T when branches followed it, and put
        // P in their registers (docs/perf.md item 49). Rotated, Q's last use in the body is
        // its last instruction, and 13.0 keeps Q's registers (tests/tests/ptx.rs checks).
        qk_turn!(first);
        let mut i = first;
        loop {
            let alpha = masker.step::<SN, BLOCK_N>(&mut s, &mut softmax, i);
            OnlineSoftmax::rescale(&mut o, alpha);
            pf = to_p::<E, SN, PK>(&s);
            ops.v.consumer_wait(*rings.vst);
            fence_before_gemms(&mut s, &mut o, &mut pf);
            pv::<E, _, PK>(&mut o, &pf, ops.v_desc::<BLOCK_N>(*rings.vst));
            wgmma::commit();
            wgmma::wait::<0>();
            o.fence_operand();
            rings.release_v(i);
            i += 1;
            if i == n {
                break;
            }
            qk_turn!(i);
        }
    }
    (o, softmax)
}
