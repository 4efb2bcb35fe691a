//! FlashAttention-3 backward for Hopper (sm_90a): the recompute backward (no N×N matrix
//! is stored; S and P are recomputed from Q, K and the saved LSE), in three launches
//! (`common::bwd`). The main kernel reuses the forward's parts: the mbarrier rings
//! ([`crate::fa3::pipeline`]), the named-barrier enum, the GEMM discipline
//! ([`crate::fa3::gemm`]), the swizzled staging of the epilogue and the descriptor block.
//!
//! - [`traits`]: the kernel's configuration ([`BwdTraits`]);
//! - [`producer`]: the shared storage and the TMA loads (K, V once; Q + LSE, dO + D per
//!   step);
//! - [`mainloop`]: two consumer warpgroups, 64 keys each: `Sᵀ`, `dPᵀ`, `Pᵀ`, `dSᵀ`, dV,
//!   dK and dQ per step;
//! - [`dq`]: dQ's fp32 accumulation (unordered, or in key-block order);
//! - [`epilogue`]: dK and dV out;
//! - [`preprocess`], [`postprocess`]: the launches before and after.
pub mod dq;
pub mod epilogue;
pub mod mainloop;
pub mod postprocess;
pub mod preprocess;
pub mod producer;
pub mod traits;

use crate::fa3::pipeline::PipelineState;
use crate::fa3::storage::TensorMaps;
use crate::fa3::traits::WARPGROUP_THREADS;
use crate::ptx::{barrier, mbarrier, regs, sreg};
use common::bwd::{BwdParams, MMA_WGS, first_query_block};
use dq::DqWriter;
use mainloop::Consumer;
use producer::{BwdLoader, BwdStorage};
pub use traits::BwdTraits;

/// Registers per thread after `setmaxnreg`: the producer's one thread needs few, the
/// consumers hold dK, dV, `Sᵀ` and `dPᵀ` (FA3's split for two consumer warpgroups).
struct ProducerRegs;
struct ConsumerRegs;
impl regs::RegisterCount for ProducerRegs {
    const N: u32 = 24;
}
impl regs::RegisterCount for ConsumerRegs {
    const N: u32 = 240;
}

/// The main kernel body. Grid `(key blocks, heads_k, batch)`; `tma`: generic address of
/// the descriptor block (q, k, v, dO maps).
///
/// # Safety
/// The host validated every buffer and map of `p` and `tma`.
#[inline(always)]
pub unsafe fn bwd<K: BwdTraits>(tma: u64, p: BwdParams) {
    let tid = sreg::thread_idx_x();
    let (n_block, head_k, batch) = (sreg::block_idx_x(), sreg::block_idx_y(), sreg::block_idx_z());
    let storage = BwdStorage::new::<K>();
    if tid == 0 {
        storage.init(WARPGROUP_THREADS * MMA_WGS);
        mbarrier::fence_init();
    }
    barrier::sync_threads();
    let wg = tid / WARPGROUP_THREADS;
    if wg == 0 {
        regs::dealloc::<ProducerRegs>();
        if tid == 0 {
            let mut loader = BwdLoader::<K>::new(TensorMaps(tma), storage);
            loader.prefetch_descriptors();
            let first = first_query_block(p.causal != 0, n_block, K::BLOCK_M, K::BLOCK_N, p.seqlen_q, p.seqlen_k);
            let blocks = p.query_blocks(K::BLOCK_M);
            if first < blocks {
                loader.load_kv(n_block, head_k, batch);
                for h in 0..p.kv_group {
                    for m in first..blocks {
                        loader.load_step(&p, m, head_k * p.kv_group + h, batch);
                    }
                }
            }
        }
    } else {
        regs::alloc::<ConsumerRegs>();
        let (wg, thread_in_wg) = (wg - 1, tid % WARPGROUP_THREADS);
        let mut consumer = Consumer::<K> {
            p: &p,
            storage,
            wg,
            thread_in_wg,
            n_block,
            head_k,
            batch,
            state: PipelineState::new(),
            dq: DqWriter::new(&p, batch, n_block, wg == 0 && thread_in_wg == 0),
        };
        let grads = consumer.run();
        epilogue::store::<K>(&p, &grads, n_block, head_k, batch, wg, thread_in_wg);
        // Shared memory must outlive the last dQ reduction's reads.
        crate::fa3::epilogue::drain(thread_in_wg);
    }
}
