//! FlashAttention-3 backward for Hopper (sm_90a): the recompute backward (no N×N matrix
//! is stored; S and P are recomputed from Q, K and the saved LSE), in three launches
//! (`common::bwd`). The main kernel reuses the forward's parts: the mbarrier rings
//! ([`crate::fa3::pipeline`]), the named-barrier enum, the GEMM discipline
//! ([`crate::fa3::gemm`]), the swizzled staging of the epilogue and the descriptor block.
//!
//! - [`traits`]: the kernel's configuration ([`BwdTraits`]);
//! - [`producer`]: the shared storage and the TMA loads (K, V once; Q + LSE, dO + D per
//!   step);
//! - [`mainloop`]: two consumer warpgroups, 64 keys each (at hdim 256 the same 64 keys,
//!   half the head dimension each): `Sᵀ`, `dPᵀ`, `Pᵀ`, `dSᵀ`, dV, dK and dQ per step;
//! - [`dq`]: dQ's fp32 accumulation: the consumers stage their pieces, a warp of the
//!   producer warpgroup adds them (unordered, or in a fixed order per query block);
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
use crate::ptx::compiler::opaque_u32;
use crate::ptx::{barrier, mbarrier, regs, sreg};
use crate::sparse::BlockList;
use crate::fa3::mask::DocSource;
use crate::fa3::variant::{LogitHook, VariantCall};
use common::bwd::{BwdParams, CtaSteps, MMA_WGS};
use common::window::KeyRanges;
use dq::{DqStager, DqWriter};
use mainloop::Consumer;
use producer::{BwdLoader, BwdStorage};
pub use traits::BwdTraits;

/// Registers per thread after `setmaxnreg`: the producer's one thread and the dQ writer
/// need few, the consumers hold dK, dV, `Sᵀ` and `dPᵀ` (FA3's split for two consumer
/// warpgroups). Where the warpgroups split the head dimension the deterministic writer
/// derives each step's turn beside the stage's slot addresses and its two reductions: on
/// 24 registers it spilled 8-16 bytes, so it gets 32 and the consumers 232 (what the
/// producer frees is all the consumers can take: 128 x (168 - 32) >= 256 x (232 - 168)).
struct ProducerRegs<K>(core::marker::PhantomData<K>);
struct ConsumerRegs<K>(core::marker::PhantomData<K>);
impl<K: BwdTraits> regs::RegisterCount for ProducerRegs<K> {
    const N: u32 = if K::SPLIT && K::DETERMINISTIC { 32 } else { 24 };
}
impl<K: BwdTraits> regs::RegisterCount for ConsumerRegs<K> {
    const N: u32 = if K::SPLIT && K::DETERMINISTIC { 232 } else { 240 };
}

/// The key ranges (window and documents) of batch `batch` in a local kernel; `None` in
/// the others.
#[inline(always)]
pub(crate) fn local_ranges<K: BwdTraits>(p: &BwdParams, batch: u32) -> Option<KeyRanges<K::Docs>> {
    if K::LOCAL { Some(p.key_ranges(K::Docs::of(&p.docs, batch))) } else { None }
}

/// The steps of key block `n_block`'s CTA (the producer, the consumers and the dQ writer
/// walk the same; `ranges`: [`local_ranges`]): the mask's query blocks, from the first
/// whose rows a user variant's key bound lets see the block (not in the deterministic
/// mode, whose turns count every block the causal or unmasked call visits); in a
/// block-sparse kernel the query blocks of the CTA's list.
#[inline(always)]
pub(crate) fn cta_steps<K: BwdTraits>(p: &BwdParams, n_block: u32, head_k: u32, batch: u32, ranges: Option<&KeyRanges<K::Docs>>) -> CtaWalk<K> {
    // The deterministic turns count every block a dense call visits.
    const { assert!(!(K::Variant::SPARSE && K::DETERMINISTIC)) };
    let walk = |steps, list, partial| CtaWalk { steps, list, partial, kernel: core::marker::PhantomData };
    if K::Variant::SPARSE {
        let list = BlockList::of(&p.block_mask.bwd, batch, head_k, n_block);
        let (blocks, partial) = list.header(&p.block_mask.bwd);
        return walk(CtaSteps::listed(n_block, blocks, p.kv_group), list, partial);
    }
    let steps = CtaSteps::new(p, n_block, K::BLOCK_M, K::BLOCK_N, ranges);
    if K::DETERMINISTIC || !K::Variant::ACTIVE {
        return walk(steps, BlockList::NONE, 0);
    }
    let call = VariantCall::of_bwd(p);
    walk(steps.from_block(K::Variant::first_query_block(call, batch, n_block * K::BLOCK_N, K::BLOCK_M)), BlockList::NONE, 0)
}

/// A CTA's walk ([`cta_steps`]): the [`CtaSteps`] over query blocks, or in a block-sparse
/// kernel over the entries of the CTA's list, which it maps to their query blocks (its
/// leading `partial` entries need the mask).
#[derive(Clone, Copy)]
pub(crate) struct CtaWalk<K> {
    steps: CtaSteps,
    list: BlockList,
    partial: u32,
    kernel: core::marker::PhantomData<K>,
}

impl<K: BwdTraits> CtaWalk<K> {
    /// No step (the CTA's dK and dV are zero).
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Calls `f(h, m)` for every step: its query head (`h` of the K/V group) and query
    /// block ([`CtaSteps::for_each`]).
    #[inline(always)]
    pub fn for_each(&self, p: &BwdParams, mut f: impl FnMut(u32, u32)) {
        self.steps.for_each(#[inline(always)] |h, i| f(h, self.block(p, i)))
    }

    /// Calls `f(step, m, partial)` for every step: its index (for [`CtaWalk::head_of`]),
    /// query block, and whether it is a block mask's partial block (false elsewhere)
    /// ([`CtaSteps::for_each_query_block`]).
    #[inline(always)]
    pub fn for_each_query_block(&self, p: &BwdParams, mut f: impl FnMut(u32, u32, bool)) {
        self.steps.for_each_query_block(#[inline(always)] |step, i| f(step, self.block(p, i), i < self.partial))
    }

    /// The query head of step `step`.
    #[inline(always)]
    pub fn head_of(&self, step: u32) -> u32 {
        self.steps.head_of(step)
    }

    /// The query block of walk value `i`.
    #[inline(always)]
    fn block(&self, p: &BwdParams, i: u32) -> u32 {
        if K::Variant::SPARSE { self.list.block(&p.block_mask.bwd, i) } else { i }
    }
}

/// Whether the CTAs of kernel `K` take their key blocks in [`common::bwd::cta_block`]'s
/// order ([`common::bwd::reorders_ctas`]).
const fn reorders<K: BwdTraits>() -> bool {
    common::bwd::reorders_ctas(K::HDIM, K::DETERMINISTIC, K::LOCAL && !<K::Docs as DocSource>::DOCS)
}

/// This CTA's (key block, K/V head, batch). Block-sparse kernels' grid is `(heads_k, key
/// blocks, batch)`, so that the CTAs of one key block of every head launch together: a
/// block mask's heavy key blocks (global tokens, say) start early instead of one head's
/// at the end of the grid. `rederive`: from grid registers LLVM cannot trace, so that
/// nothing derived before is kept live for it.
#[inline(always)]
fn cta<K: BwdTraits>(p: &BwdParams, order: common::bwd::DqOrder, rederive: bool) -> (u32, u32, u32) {
    let reg = |r: u32| if rederive { opaque_u32(r) } else { r };
    let (x, y) = if K::Variant::SPARSE { (sreg::block_idx_y(), sreg::block_idx_x()) } else { (sreg::block_idx_x(), sreg::block_idx_y()) };
    let (x, y, z) = (reg(x), reg(y), reg(sreg::block_idx_z()));
    let key_blocks = p.key_blocks(K::BLOCK_N);
    // A window's full key blocks launch first.
    let (x, head_k, batch) = if reorders::<K>() { common::bwd::cta_block(x, y, z, key_blocks, p.heads_k, p.batch, p.full_key_blocks) } else { (x, y, z) };
    (order.key_block(x, key_blocks), head_k, batch)
}

/// The main kernel body. Grid `(key blocks, heads_k, batch)`, `(heads_k, key blocks,
/// batch)` for block-sparse kernels (which CTA takes which key
/// block, and in what order it visits the query blocks: `common::bwd::DqOrder`); `tma`: generic address of
/// the descriptor block (q, k, v, dO maps).
///
/// # Safety
/// The host validated every buffer and map of `p` and `tma`.
#[inline(always)]
pub unsafe fn bwd<K: BwdTraits>(tma: u64, p: BwdParams) {
    let tid = sreg::thread_idx_x();
    let order = p.dq_order_of(K::LOCAL);
    // A window's coordinates (arithmetic there, not the grid's registers) are derived in
    // each role after `setmaxnreg`, opaquely so that LLVM does not hoist them back:
    // computed before it and live across it, they must fit the producer's 24 registers,
    // and were spilled there.
    let grid = cta::<K>(&p, order, false);
    let coords = || if reorders::<K>() { cta::<K>(&p, order, true) } else { grid };
    let storage = BwdStorage::new::<K>();
    if tid == 0 {
        storage.init::<K>(WARPGROUP_THREADS * MMA_WGS);
        mbarrier::fence_init();
    }
    barrier::sync_threads();
    let wg = tid / WARPGROUP_THREADS;
    if wg == 0 {
        regs::dealloc::<ProducerRegs<K>>();
        let (n_block, head_k, batch) = coords();
        let steps = cta_steps::<K>(&p, n_block, head_k, batch, local_ranges::<K>(&p, batch).as_ref());
        if tid == 0 {
            let mut loader = BwdLoader::<K>::new(TensorMaps(tma), storage);
            loader.prefetch_descriptors();
            if !steps.is_empty() {
                loader.load_kv(n_block, head_k, batch);
                steps.for_each(&p, |h, m| loader.load_step(&p, m, head_k * p.kv_group + h, batch));
            }
        } else if tid / 32 == 1 {
            if K::SPLIT {
                DqWriter::<K>::run_split(&p, &storage, n_block, head_k, batch, tid % 32);
            } else {
                DqWriter::<K>::run(&p, &storage, n_block, head_k, batch, tid % 32);
            }
        }
    } else {
        regs::alloc::<ConsumerRegs<K>>();
        let (n_block, head_k, batch) = coords();
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
            dq: DqStager::new(),
            kernel: core::marker::PhantomData,
        };
        let grads = consumer.run();
        // Soft-capping and 128-query steps: the coordinates are re-derived (opaque):
        // shared with the mainloop's, the epilogue's row index stayed live across it and
        // spilled (the other kernels keep theirs, which fit).
        let rederive = K::SOFTCAP || K::BLOCK_M == 128;
        let (wg, thread_in_wg) = if rederive { (opaque_u32(wg), opaque_u32(thread_in_wg)) } else { (wg, thread_in_wg) };
        // A window's coordinates are derived again (they are arithmetic there, not the
        // grid's registers: held across the mainloop, one spilled).
        let (n_block, head_k, batch) = coords();
        epilogue::store::<K>(&p, &grads, n_block, head_k, batch, wg, thread_in_wg);
        // Shared memory must outlive the last dQ reduction's reads.
        crate::fa3::epilogue::drain(thread_in_wg);
    }
}
