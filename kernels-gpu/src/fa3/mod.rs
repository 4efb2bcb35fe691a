//! FlashAttention-3 forward for Hopper (sm_90a).
//!
//! - [`producer`]: TMA loads (Q per tile; K and V through their rings, or in the multicast
//!   kernels half of each K/V tile into both CTAs of a 2-CTA cluster), one thread of a
//!   producer warpgroup that hands its registers back with `setmaxnreg.dec`;
//! - [`mainloop`]: two or three consumer warpgroups (`setmaxnreg.inc`), 64 query rows
//!   each: SS WGMMA for QK^T (RS, Q in registers, at hdim 128), online softmax, RS WGMMA
//!   for PV, intra-warpgroup overlap (O rescaled under the QK GEMM) and round-robin
//!   pingpong;
//! - [`epilogue`]: O through shared memory and a TMA store, LSE;
//! - [`scheduler`]: tile order (one tile per CTA, or persistent with a static or a dynamic
//!   order, the producer handing each tile, decoded, to the consumers) and the key
//!   blocks a tile visits (causal blocks past the diagonal are never loaded nor
//!   computed);
//! - [`pipeline`]: the stage/phase ring of mbarriers.
pub mod epilogue;
pub mod mainloop;
pub mod pipeline;
pub mod producer;
pub mod scheduler;

use crate::element::Element;
use crate::ptx::mbarrier;
use crate::ptx::smem::{SmemAddr, align_up, dynamic_smem_base};
use crate::ptx::tma::TensorMap;
use crate::ptx::wgmma::WgmmaAcc;
use crate::ptx::compiler::{opaque_u32, opaque_u64};
use crate::ptx::{barrier, cluster, fence, regs, sreg};
use crate::softmax::Frag;
use common::fa3::{SmemLayout, TILE_HANDOFF_SLOT_BYTES, TILE_HANDOFF_STAGES, TileConfig, q_in_registers, smem_layout};
use common::{FwdParams, gmma::k_major_sw128};
use mainloop::{Operands, PingPong};
use pipeline::{CountState, PipelineState, TmaPipeline};
use producer::Loader;
use scheduler::{HandoffTiles, StaticTiles, TileClaims, TileHandoff, TileOrder, TileSource};

/// The kernel body. `tma`: generic address of the descriptor block (q, k, v, o maps,
/// 128 B each). `BLOCK_M`, `BLOCK_N`, `STAGES` and the register split come from
/// `TileConfig::new(D, BLOCK_M / 64, BLOCK_N)` (asserted); `SN = BLOCK_N/8`, `ON = D/8`, `PK = BLOCK_N/16` size the register tiles.
/// `WS`, `PINGPONG`, `OVERLAP` switch the seed techniques (see `common::fa3::Techniques`).
#[inline(always)]
pub unsafe fn fwd<
    E: Element,
    const D: u32,
    const BLOCK_M: u32,
    const BLOCK_N: u32,
    const STAGES: u32,
    const PRODUCER_REGS: u32,
    const CONSUMER_REGS: u32,
    const SN: usize,
    const ON: usize,
    const PK: usize,
    const CLUSTER: u32,
    const WS: bool,
    const PINGPONG: bool,
    const OVERLAP: bool,
>(
    tma: u64,
    p: FwdParams,
) where
    [Frag; SN]: WgmmaAcc,
    [Frag; ON]: WgmmaAcc,
{
    const {
        let c = TileConfig::new(D, BLOCK_M / 64, BLOCK_N);
        assert!(c.block_m() == BLOCK_M && c.block_n == BLOCK_N && c.stages == STAGES);
        assert!(c.register_split(CLUSTER).0 == PRODUCER_REGS && c.register_split(CLUSTER).1 == CONSUMER_REGS);
        assert!(SN as u32 * 8 == BLOCK_N && ON as u32 * 8 == D && PK as u32 * 16 == BLOCK_N && D % 64 == 0);
        // Named barrier ids: one per warpgroup for the epilogue, one per warpgroup for
        // pingpong, all below 16 and not overlapping.
        assert!(epilogue::EPILOGUE_BARRIER + BLOCK_M / 64 <= mainloop::PINGPONG_BARRIER);
        assert!(mainloop::PINGPONG_BARRIER + BLOCK_M / 64 <= 16);
    };
    let layout: SmemLayout = const { smem_layout(TileConfig::new(D, BLOCK_M / 64, BLOCK_N)) };
    let consumer_wgs = BLOCK_M / 64;
    let base = align_up(dynamic_smem_base(), 1024);
    let tid = sreg::thread_idx_x();
    let bars = base.add(layout.barriers);
    let kv_barriers = 16 * STAGES;
    // In clusters of two (the multicast kernels, non-causal calls only), the CTAs share
    // K/V tiles: each loads half of every tile and multicasts it to both.
    const { assert!(CLUSTER == 1 || (CLUSTER == 2 && WS)) };
    let rank = if CLUSTER > 1 { sreg::cluster_ctarank() } else { 0 };
    let (peer, multicast_rank) = if CLUSTER == 2 { (Some(rank ^ 1), Some(rank)) } else { (None, None) };
    let q = TmaPipeline::<1> { data: base.add(layout.q), stage_bytes: BLOCK_M * D * 2, barriers: bars, peer: None };
    let k = TmaPipeline::<STAGES> { data: base.add(layout.k), stage_bytes: layout.kv_stage_bytes, barriers: bars.add(16), peer };
    let v = TmaPipeline::<STAGES> {
        data: base.add(layout.v),
        stage_bytes: layout.kv_stage_bytes,
        barriers: bars.add(16 + kv_barriers),
        peer,
    };
    let handoff = TileHandoff {
        ring: TmaPipeline::<TILE_HANDOFF_STAGES> {
            data: base.add(layout.tile_handoff_slot(0)),
            stage_bytes: TILE_HANDOFF_SLOT_BYTES,
            barriers: base.add(layout.tile_handoff),
            peer: None,
        },
    };
    if tid == 0 {
        q.init(128 * consumer_wgs);
        k.init(128 * consumer_wgs);
        v.init(128 * consumer_wgs);
        handoff.init(128 * consumer_wgs);
        mbarrier::fence_init();
    }
    if CLUSTER > 1 {
        // The peer's producer and consumers use our barriers from here on.
        cluster::sync();
    } else {
        barrier::sync_threads();
    }

    let mut loader = Loader::<STAGES, BLOCK_N> {
        tma,
        q,
        k,
        v,
        q_state: PipelineState::new(),
        k_state: PipelineState::new(),
        v_state: PipelineState::new(),
        leader: tid == 0,
        multicast_rank,
        chunks: D / 64,
    };
    let consumer = Consumer::<D, BLOCK_M, BLOCK_N, STAGES> {
        tma_o: TensorMap(tma + 384),
        q,
        k,
        v,
        o_smem: base.add(layout.o),
        o_shares_q: layout.o_shares_q(),
    };
    let wg = tid / 128;
    let thread_in_wg = tid % 128;
    let order = TileOrder::<BLOCK_M, BLOCK_N>::new(&p, CLUSTER, rank);
    if WS {
        if wg == 0 {
            regs::dealloc::<PRODUCER_REGS>();
            if tid == 0 {
                loader.prefetch_descriptors();
                // The producer claims each tile (dynamically when the host gave a
                // counter), hands its number to the consumers, then loads it.
                let mut claims = TileClaims::new(&p, CLUSTER);
                let mut st = CountState::new();
                loop {
                    let t = claims.current();
                    if t >= order.total {
                        handoff.publish(&mut st, None);
                        break;
                    }
                    let tile = order.tile(t, &p);
                    handoff.publish(&mut st, Some(&tile));
                    loader.load_tile(&tile);
                    claims.advance();
                }
            }
        } else {
            regs::alloc::<CONSUMER_REGS>();
            let mut tiles = HandoffTiles::<BLOCK_M, BLOCK_N> { handoff, state: PipelineState::new() };
            consumer.run::<E, SN, ON, PK, PINGPONG, OVERLAP>(&p, &mut tiles, wg - 1, thread_in_wg, &mut loader, false);
        }
    } else {
        // No producer warpgroup: the consumers load each tile's Q and first stages and
        // refill the rings from inside the mainloop. Thread 0 issues; every consumer thread
        // runs the same code and waits along, so no branch diverges next to the wgmma
        // (ptxas would serialize them). Every thread follows the static tile order.
        if tid == 0 {
            loader.prefetch_descriptors();
        }
        let mut tiles = StaticTiles::new(order);
        consumer.run::<E, SN, ON, PK, PINGPONG, OVERLAP>(&p, &mut tiles, wg, thread_in_wg, &mut loader, true);
    }
    if CLUSTER > 1 {
        // Our shared memory and barriers stay alive until the peer is done with them.
        cluster::sync();
    }
}

/// What a consumer warpgroup needs besides its registers.
#[derive(Clone, Copy)]
struct Consumer<const D: u32, const BLOCK_M: u32, const BLOCK_N: u32, const STAGES: u32> {
    tma_o: TensorMap,
    q: TmaPipeline<1>,
    k: TmaPipeline<STAGES>,
    v: TmaPipeline<STAGES>,
    o_smem: SmemAddr,
    o_shares_q: bool,
}

impl<const D: u32, const BLOCK_M: u32, const BLOCK_N: u32, const STAGES: u32> Consumer<D, BLOCK_M, BLOCK_N, STAGES> {
    /// Every tile of this CTA: wait for Q, mainloop, epilogue. `is_loader`: this thread
    /// issues the loads itself (no warp specialization).
    #[inline(always)]
    fn run<E: Element, const SN: usize, const ON: usize, const PK: usize, const PINGPONG: bool, const OVERLAP: bool>(
        &self,
        p: &FwdParams,
        tiles: &mut impl TileSource<BLOCK_M, BLOCK_N>,
        cw: u32,
        thread_in_wg: u32,
        loader: &mut Loader<STAGES, BLOCK_N>,
        is_loader: bool,
    ) where
        [Frag; SN]: WgmmaAcc,
        [Frag; ON]: WgmmaAcc,
    {
        let ops = Operands {
            q_desc: k_major_sw128(self.q.slot(0).add(cw * 64 * 128).0),
            k: self.k,
            v: self.v,
            // With Q in registers, Q is released once loaded (below), not after the last QK.
            q_empty: if self.o_shares_q || q_in_registers(D) { None } else { Some(self.q.empty(0)) },
        };
        let (mut qst, mut kst, mut vst) = (PipelineState::<1>::new(), PipelineState::<STAGES>::new(), PipelineState::<STAGES>::new());
        let pingpong = PingPong { enabled: PINGPONG, wg: cw, wgs: BLOCK_M / 64 };
        pingpong.start();
        while let Some(tile) = tiles.next_tile(p) {
            // Per-tile addresses are recomputed each tile rather than hoisted out of the
            // tile loop, where they would pin dozens of registers.
            let ops = Operands { q_desc: opaque_u64(ops.q_desc), ..ops };
            let o_smem = SmemAddr(opaque_u32(self.o_smem.0));
            if is_loader {
                loader.load_q(&tile);
                for i in 0..if tile.n_blocks < STAGES { tile.n_blocks } else { STAGES } {
                    loader.load_k(&tile, i);
                    loader.load_v(&tile, i);
                }
            }
            self.q.consumer_wait(qst);
            let qf = if q_in_registers(D) {
                // O must have its own buffer: Q's is released here, not after the store.
                const { assert!(!q_in_registers(D) || !smem_layout(TileConfig::new(D, BLOCK_M / 64, BLOCK_N)).o_shares_q()) };
                let qf = mainloop::load_q::<BLOCK_M>(self.q.slot(0), cw, thread_in_wg);
                // The next Q lands here through the async proxy, after these generic reads.
                fence::proxy_async_shared();
                self.q.consumer_release(qst);
                qf
            } else {
                [[0; 4]; 8]
            };
            let (o, softmax) = mainloop::run::<E, D, BLOCK_M, BLOCK_N, STAGES, SN, ON, PK, OVERLAP>(
                p,
                &tile,
                &ops,
                pingpong,
                cw,
                thread_in_wg,
                &mut kst,
                &mut vst,
                loader,
                is_loader,
                &qf,
            );
            if !self.o_shares_q && !q_in_registers(D) && tile.n_blocks == 0 {
                // No QK^T ran, so the mainloop did not release Q: do it here.
                self.q.consumer_release(qst);
            }
            epilogue::store::<E, D, BLOCK_M, ON>(
                p,
                &tile,
                self.tma_o,
                o_smem,
                &o,
                &softmax,
                cw,
                // Its staging addresses too: hoisted, they cost registers the mainloop needs.
                opaque_u32(thread_in_wg),
                if self.o_shares_q { Some(self.q.empty(0)) } else { None },
            );
            qst.advance();
        }
        pingpong.finish();
        epilogue::drain(thread_in_wg);
    }
}
