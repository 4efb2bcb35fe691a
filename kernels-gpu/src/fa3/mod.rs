//! FlashAttention-3 forward for Hopper (sm_90a).
//!
//! - [`producer`]: TMA loads (Q once; K and V through their rings), one thread of a
//!   producer warpgroup that hands its registers back with `setmaxnreg.dec`;
//! - [`mainloop`]: two consumer warpgroups (`setmaxnreg.inc`), 64 query rows each: SS WGMMA
//!   for QK^T, online softmax, RS WGMMA for PV, intra-warpgroup overlap and pingpong;
//! - [`epilogue`]: O through shared memory and a TMA store, LSE;
//! - [`scheduler`]: tile order and the key blocks a tile visits (causal blocks past the
//!   diagonal are never loaded nor computed);
//! - [`pipeline`]: the stage/phase ring of mbarriers.
pub mod epilogue;
pub mod mainloop;
pub mod pipeline;
pub mod producer;
pub mod scheduler;

use crate::element::Element;
use crate::ptx::mbarrier::{self, Mbarrier};
use crate::ptx::smem::{align_up, dynamic_smem_base};
use crate::ptx::tma::TensorMap;
use crate::ptx::wgmma::WgmmaAcc;
use crate::ptx::{barrier, regs, sreg};
use crate::softmax::Frag;
use common::fa3::{BLOCK_M, CONSUMER_REGS, CONSUMER_WGS, PRODUCER_REGS, SmemLayout, TileConfig, smem_layout};
use common::{FwdParams, gmma::k_major_sw128};
use mainloop::{Operands, PingPong};
use pipeline::{PipelineState, TmaPipeline};
use producer::Loader;

/// The kernel body. `tma`: generic address of the descriptor block (q, k, v, o maps,
/// 128 B each). `SN = BLOCK_N/8`, `ON = D/8`, `PK = BLOCK_N/16` size the register tiles.
/// `WS`, `PINGPONG`, `OVERLAP` switch the seed techniques (see `common::fa3::Techniques`).
#[inline(always)]
pub unsafe fn fwd<
    E: Element,
    const D: u32,
    const BLOCK_N: u32,
    const STAGES: u32,
    const SN: usize,
    const ON: usize,
    const PK: usize,
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
    const { assert!(SN as u32 * 8 == BLOCK_N && ON as u32 * 8 == D && PK as u32 * 16 == BLOCK_N && D % 64 == 0) };
    let layout: SmemLayout = const { smem_layout(TileConfig { hdim: D, block_n: BLOCK_N, stages: STAGES }) };
    let base = align_up(dynamic_smem_base(), 1024);
    let tid = sreg::thread_idx_x();
    let q_full = Mbarrier(base.add(layout.barriers));
    let k = TmaPipeline::<STAGES> { data: base.add(layout.k), stage_bytes: layout.kv_stage_bytes, barriers: base.add(layout.barriers + 8) };
    let v = TmaPipeline::<STAGES> {
        data: base.add(layout.v),
        stage_bytes: layout.kv_stage_bytes,
        barriers: base.add(layout.barriers + 8 + 16 * STAGES),
    };
    if tid == 0 {
        q_full.init(1);
        k.init(128 * CONSUMER_WGS);
        v.init(128 * CONSUMER_WGS);
        mbarrier::fence_init();
    }
    barrier::sync_threads();

    let tile = scheduler::current_tile::<BLOCK_M, BLOCK_N>(&p);
    let q_smem = base.add(layout.q);
    let mut loader = Loader::<STAGES, BLOCK_M, BLOCK_N> {
        tma_q: TensorMap(tma),
        tma_k: TensorMap(tma + 128),
        tma_v: TensorMap(tma + 256),
        q_smem,
        q_full,
        q_bytes: BLOCK_M * D * 2,
        k,
        v,
        k_state: PipelineState::new(),
        v_state: PipelineState::new(),
        tile,
    };
    let tma_o = TensorMap(tma + 384);
    let wg = tid / 128;
    let thread_in_wg = tid % 128;
    if WS {
        if wg == 0 {
            regs::dealloc::<PRODUCER_REGS>();
            if tid == 0 {
                loader.run();
            }
        } else {
            regs::alloc::<CONSUMER_REGS>();
            consume::<E, D, BLOCK_N, STAGES, SN, ON, PK, PINGPONG, OVERLAP>(&p, &tile, &loader, tma_o, wg - 1, thread_in_wg, None);
        }
    } else {
        // No producer warpgroup: thread 0 fills the rings ahead and refills them from
        // inside the mainloop.
        let n = tile.n_blocks;
        if tid == 0 && n > 0 {
            loader.prefetch_descriptors();
            loader.load_q();
            for i in 0..if n < STAGES { n } else { STAGES } {
                loader.load_k(i);
                loader.load_v(i);
            }
        }
        let shared = loader.shared_view();
        consume::<E, D, BLOCK_N, STAGES, SN, ON, PK, PINGPONG, OVERLAP>(
            &p,
            &tile,
            &shared,
            tma_o,
            wg,
            thread_in_wg,
            if tid == 0 { Some(&mut loader) } else { None },
        );
    }
}

/// One consumer warpgroup: mainloop, then epilogue.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn consume<
    E: Element,
    const D: u32,
    const BLOCK_N: u32,
    const STAGES: u32,
    const SN: usize,
    const ON: usize,
    const PK: usize,
    const PINGPONG: bool,
    const OVERLAP: bool,
>(
    p: &FwdParams,
    tile: &scheduler::Tile,
    smem: &Loader<STAGES, BLOCK_M, BLOCK_N>,
    tma_o: TensorMap,
    cw: u32,
    thread_in_wg: u32,
    loader: Option<&mut Loader<STAGES, BLOCK_M, BLOCK_N>>,
) where
    [Frag; SN]: WgmmaAcc,
    [Frag; ON]: WgmmaAcc,
{
    let ops = Operands { q_full: smem.q_full, q_desc: k_major_sw128(smem.q_smem.add(cw * 64 * 128).0), k: smem.k, v: smem.v };
    let (o, softmax) = mainloop::run::<E, D, BLOCK_M, BLOCK_N, STAGES, SN, ON, PK, OVERLAP>(
        p,
        tile,
        &ops,
        PingPong { enabled: PINGPONG, wg: cw },
        cw,
        thread_in_wg,
        loader,
    );
    epilogue::store::<E, D, BLOCK_M, ON>(p, tile, tma_o, smem.q_smem, &o, &softmax, cw, thread_in_wg);
}
