//! FlashAttention-3 forward for Hopper (sm_90a), in the roles of FA3's `hopper/`:
//!
//! - [`traits`]: the kernel's configuration as a traits type ([`KernelTraits`]): shapes,
//!   register tiles, switches and the shared-memory layout, derived once;
//! - [`storage`]: the shared memory as typed views ([`storage::SharedStorage`]);
//! - [`producer`]: TMA loads (Q per tile; K and V through their rings, or in the multicast
//!   kernels half of each K/V tile into both CTAs of a 2-CTA cluster), one thread of a
//!   producer warpgroup that hands its registers back with `setmaxnreg.dec`;
//! - [`mainloop`]: two or three consumer warpgroups (`setmaxnreg.inc`), 64 query rows
//!   each: QK^T, score modification and mask ([`mask`]), online softmax, PV, with the
//!   intra-warpgroup overlap and round-robin pingpong; every GEMM through [`gemm`];
//! - [`epilogue`]: O through shared memory and a TMA store, LSE;
//! - [`scheduler`]: tile order (one tile per CTA, or persistent with a static or a dynamic
//!   order, the producer handing each tile, decoded, to the consumers) and the key
//!   blocks a tile visits (causal blocks past the diagonal are never loaded nor
//!   computed);
//! - [`pipeline`]: the stage/phase ring of mbarriers;
//! - [`barriers`]: the named-barrier ids;
//! - [`descale`]: the FP8 kernels' dequantization factors (e4m3 Q, K, V through the
//!   same roles: `crate::element::Operand` says what changes in the GEMMs);
//! - [`transpose`]: the FP8 kernels' V transpose in shared memory, by the producer
//!   warpgroup's other warps, for V as stored;
//! - [`variant`]: user-defined variants (`common::variant`) in the score-modification
//!   hooks of the forward and the backward.
//!
//! `docs/design.md` maps the roles, pipelines and barriers, and the data flow of a tile.
pub mod barriers;
pub mod descale;
pub mod epilogue;
pub mod gemm;
pub mod mainloop;
pub mod mask;
pub mod pipeline;
pub mod producer;
pub mod scheduler;
pub mod storage;
pub mod traits;
pub mod transpose;
pub mod variant;

use crate::ptx::compiler::{opaque_u32, opaque_u64};
use crate::ptx::smem::SmemAddr;
use crate::ptx::{barrier, cluster, fence, mbarrier, regs, sreg};
use common::FwdParams;
use common::fa3::{KV_STAGES, TensorMapSlot};
use mainloop::{Operands, PingPong};
use pipeline::{CountState, PipelineState};
use producer::Loader;
use scheduler::{HandoffTiles, StaticTiles, TileClaims, TileHandoff, TileOrder, TileSource};
use storage::{SharedStorage, TensorMaps};
pub use traits::KernelTraits;
use traits::{ConsumerRegs, ProducerRegs, WARPGROUP_ROWS, WARPGROUP_THREADS};

/// The kernel body. `tma`: generic address of the descriptor block (q, k, v, o maps).
#[inline(always)]
pub unsafe fn fwd<K: KernelTraits>(tma: u64, p: FwdParams) {
    // In clusters of two (the multicast kernels, non-causal calls only), the CTAs share
    // K/V tiles: each loads half of every tile and multicasts it to both.
    const { assert!(K::CLUSTER == 1 || (K::CLUSTER == 2 && K::WARP_SPECIALIZED)) };
    const { assert!(K::HDIM % 64 == 0 && K::CONSUMER_WGS <= common::fa3::MAX_CONSUMER_WGS) };
    const { assert!(K::CONFIG.key_offsets == <K::ScoreMod as mask::ScoreMod>::KEY_OFFSETS && (!K::CONFIG.key_offsets || K::BLOCK_N % 8 == 0)) };
    let tid = sreg::thread_idx_x();
    let rank = if K::CLUSTER > 1 { sreg::cluster_ctarank() } else { 0 };
    let (peer, multicast_rank) = if K::CLUSTER == 2 { (Some(rank ^ 1), Some(rank)) } else { (None, None) };
    let storage = SharedStorage::new::<K>(peer);
    let handoff = TileHandoff { ring: storage.tile_handoff };
    const { assert!(!K::TRANSPOSE_V || (K::WARP_SPECIALIZED && K::CLUSTER == 1 && !<K::Mask as mask::Mask>::SPARSE)) };
    let consumer_threads = WARPGROUP_THREADS * K::CONSUMER_WGS;
    // The transposing warps read the tile handoff too.
    let transposers = if K::TRANSPOSE_V { transpose::TRANSPOSER_THREADS } else { 0 };
    if tid == 0 {
        storage.q.init(consumer_threads);
        storage.k.init(consumer_threads);
        storage.v.init(consumer_threads);
        if K::TRANSPOSE_V {
            // Released once per tile by the transposers.
            storage.v_raw.init(1);
        }
        handoff.init(consumer_threads + transposers);
        mbarrier::fence_init();
    }
    if K::CONFIG.key_offsets {
        storage.fill_key_offsets::<K>(tid);
    }
    if K::CLUSTER > 1 {
        // The peer's producer and consumers use our barriers from here on.
        cluster::sync();
    } else {
        barrier::sync_threads();
    }

    let maps = TensorMaps(tma);
    let mut loader = Loader::<K>::new(maps, &storage, tid == 0, multicast_rank);
    let consumer = Consumer { tma_o: maps.get(TensorMapSlot::O), storage };
    let wg = tid / WARPGROUP_THREADS;
    let thread_in_wg = tid % WARPGROUP_THREADS;
    let order = TileOrder::<K>::new(&p, rank);
    if K::WARP_SPECIALIZED {
        if wg == 0 {
            regs::dealloc::<ProducerRegs<K>>();
            if tid == 0 {
                loader.prefetch_descriptors();
                // The producer claims each tile (dynamically when the host gave a
                // counter), hands its number to the consumers, then loads it.
                let mut claims = TileClaims::new(&p, K::CLUSTER);
                let mut st = CountState::new();
                loop {
                    let t = claims.current();
                    if t >= order.total {
                        handoff.publish(&mut st, None);
                        break;
                    }
                    let tile = order.tile(t, &p);
                    handoff.publish(&mut st, Some(&tile));
                    loader.load_tile(&p, &tile);
                    claims.advance();
                }
            } else if K::TRANSPOSE_V && tid >= 32 {
                let mut tiles = HandoffTiles::<K>::new(handoff);
                transpose::Transposer::<K>::new(storage.v_raw, storage.v, tid / 32).run(&p, &mut tiles);
            }
        } else {
            regs::alloc::<ConsumerRegs<K>>();
            let mut tiles = HandoffTiles::<K>::new(handoff);
            consumer.run::<K>(&p, &mut tiles, wg - 1, thread_in_wg, &mut loader, false);
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
        consumer.run::<K>(&p, &mut tiles, wg, thread_in_wg, &mut loader, true);
    }
    if K::CLUSTER > 1 {
        // Our shared memory and barriers stay alive until the peer is done with them.
        cluster::sync();
    }
}

/// What a consumer warpgroup needs besides its registers.
#[derive(Clone, Copy)]
struct Consumer {
    tma_o: crate::ptx::tma::TensorMap,
    storage: SharedStorage,
}

impl Consumer {
    /// Every tile of this CTA: wait for Q, mainloop, epilogue. `wg`: this consumer
    /// warpgroup (0-based); `is_loader`: this thread issues the loads itself (no warp
    /// specialization).
    #[inline(always)]
    fn run<K: KernelTraits>(
        &self,
        p: &FwdParams,
        tiles: &mut impl TileSource,
        wg: u32,
        thread_in_wg: u32,
        loader: &mut Loader<K>,
        is_loader: bool,
    ) {
        let q = self.storage.q;
        let o_shares_q = self.storage.o_shares_q;
        let ops = Operands {
            q_desc: K::qk_desc(q.slot(0).add(K::qk_rows(K::BLOCK_M, wg * WARPGROUP_ROWS)).0),
            k: self.storage.k,
            v: self.storage.v,
            // With Q in registers, Q is released once loaded (below), not after the last QK.
            q_empty: if o_shares_q || K::Q_IN_REGISTERS { None } else { Some(q.empty(0)) },
            key_offsets: self.storage.key_offsets,
        };
        let (mut q_state, mut k_state, mut v_state) =
            (PipelineState::<1>::new(), PipelineState::<KV_STAGES>::new(), PipelineState::<KV_STAGES>::new());
        let pingpong = PingPong { enabled: K::PINGPONG, wg, wgs: K::CONSUMER_WGS };
        pingpong.start();
        while let Some(tile) = tiles.next_tile(p) {
            // Per-tile addresses are recomputed each tile rather than hoisted out of the
            // tile loop, where they would pin dozens of registers.
            let ops = Operands { q_desc: opaque_u64(ops.q_desc), ..ops };
            let o_smem = SmemAddr(opaque_u32(self.storage.o.0));
            if is_loader {
                loader.load_q(&tile);
                for i in 0..tile.n_blocks.min(KV_STAGES) {
                    loader.load_k(&tile, i);
                    loader.load_v(&tile, i);
                }
            }
            q.consumer_wait(q_state);
            let qf = if K::Q_IN_REGISTERS {
                // O must have its own buffer: Q's is released here, not after the store.
                const { assert!(!K::Q_IN_REGISTERS || !K::SMEM.o_shares_q()) };
                let qf = mainloop::load_q::<K>(q.slot(0), wg, thread_in_wg);
                // The next Q lands here through the async proxy, after these generic reads.
                fence::proxy_async_shared();
                q.consumer_release(q_state);
                qf
            } else {
                [[0; 4]; 8]
            };
            let (o, softmax) = mainloop::run::<K>(
                p,
                &tile,
                &ops,
                pingpong,
                wg,
                thread_in_wg,
                &mut k_state,
                &mut v_state,
                loader,
                is_loader,
                &qf,
            );
            if !o_shares_q && !K::Q_IN_REGISTERS && tile.n_blocks == 0 {
                // No QK^T ran, so the mainloop did not release Q: do it here.
                q.consumer_release(q_state);
            }
            epilogue::store::<K>(
                p,
                &tile,
                self.tma_o,
                o_smem,
                &o,
                &softmax,
                wg,
                // Its staging addresses too: hoisted, they cost registers the mainloop needs.
                opaque_u32(thread_in_wg),
                if o_shares_q { Some(q.empty(0)) } else { None },
            );
            q_state.advance();
        }
        pingpong.finish();
        epilogue::drain(thread_in_wg);
    }
}
