//! Block-sparse masks (FlexAttention's `BlockMask`), built on the GPU from a user-defined
//! variant's mask mod.
//!
//! [`BlockMask::new`] runs the variant module's build kernel over every block of the
//! forward's and the backward's tiles: a block where no pair is visible (under the
//! variant's `visible`, the call's causal flag and its lengths) is *empty* and is neither
//! loaded nor computed; one where every pair is visible is *full* and runs without mask
//! code; the others are *partial* and run the mask. Pass the mask with
//! [`AttnOptions::block_mask`](crate::AttnOptions::block_mask) alongside the same variant:
//! arbitrary patterns (local + global tokens, dilated or random blocks, ...) then cost
//! what their visible blocks cost.
//!
//! ```no_run
//! # use flash_attn3::{AttnOptions, BlockMask, BlockMaskShape, Gpu, VariantModule};
//! # fn f(gpu: &Gpu, stream: &std::sync::Arc<cudarc::driver::CudaStream>, module: &VariantModule,
//! #      data: &cudarc::driver::CudaSlice<u32>) -> flash_attn3::Result<()> {
//! let variant = module.variant("local_global")?.data_u32(data);
//! // batch 1, 16k queries and keys, 16 query heads, 16 K/V heads, head dim 128; one mask
//! // for every head (the mask mod does not read the head).
//! let shape = BlockMaskShape::new(1, 16384, 16384, 16, 16, 128).same_for_every_head();
//! let mask = BlockMask::new(gpu, stream, &variant, shape)?;
//! let opts = AttnOptions::default().variant(variant).block_mask(&mask);
//! # Ok(()) }
//! ```
//!
//! The lists depend on the variant's buffer as it is when the mask is built: rebuild the
//! mask when it changes. A mask built "the same for every head" (or batch) evaluates the
//! mask mod for head 0 (batch 0) alone; if the mask mod does depend on the head, the
//! skipped blocks of other heads are wrong. The deterministic backward does not skip
//! (its turns count every block of a dense call): it runs the variant's dense kernel,
//! with the same gradients.
use crate::error::{AttnError, Result};
use crate::gpu::Gpu;
use crate::variant::{UserVariant, VariantDesc};
use common::sparse::{BUILD_THREADS, BlockLists, BlockMaskArgs, BuildParams, MAX_BLOCKS};
use common::variant::{Coords, Variant};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg, SyncOnDrop};
use std::sync::Arc;

/// The call a block mask is built for: the same shape as the attention calls that take
/// it (`[batch, seqlen, heads, head_dim]` tensors, causal or not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockMaskShape {
    /// Batch size.
    pub batch: usize,
    /// Query and key lengths.
    pub seqlen_q: usize,
    /// See [`BlockMaskShape::seqlen_q`].
    pub seqlen_k: usize,
    /// Query heads and K/V heads (GQA/MQA: `heads_q` a multiple of `heads_k`).
    pub heads_q: usize,
    /// See [`BlockMaskShape::heads_q`].
    pub heads_k: usize,
    /// The head dim (the kernels' tiles depend on it).
    pub head_dim: usize,
    /// The calls' `causal` flag (folded into the blocks' states).
    pub causal: bool,
    /// Lists per batch element (`false`: the mask mod is evaluated for batch 0 and its
    /// lists serve every batch element).
    pub per_batch: bool,
    /// Lists per head (`false`: evaluated for head 0, serving every head).
    pub per_head: bool,
}

impl BlockMaskShape {
    /// A non-causal call of this shape, with lists per batch element and per head.
    pub fn new(batch: usize, seqlen_q: usize, seqlen_k: usize, heads_q: usize, heads_k: usize, head_dim: usize) -> Self {
        BlockMaskShape { batch, seqlen_q, seqlen_k, heads_q, heads_k, head_dim, causal: false, per_batch: true, per_head: true }
    }

    /// Sets the calls' causal flag.
    pub fn causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }

    /// One set of lists for every batch element (FlexAttention's `B=None`).
    pub fn same_for_every_batch(mut self) -> Self {
        self.per_batch = false;
        self
    }

    /// One set of lists for every head (FlexAttention's `H=None`).
    pub fn same_for_every_head(mut self) -> Self {
        self.per_head = false;
        self
    }
}

/// One pass's build: its kernel parameters (the lists' address left 0), grid, and the
/// words of its lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PassPlan {
    /// The build kernel's parameters.
    pub params: BuildParams,
    /// `(lists per head, list heads, list batches)`.
    pub grid: (u32, u32, u32),
    /// u32 words of all lists.
    pub words: usize,
}

impl PassPlan {
    fn new(p: BuildParams, lists_per_head: u32, list_heads: u32, list_batches: u32) -> Self {
        let row_words = 2 + p.list_len();
        let lists = BlockLists { addr: 0, row_words, head_rows: if list_heads > 1 { lists_per_head } else { 0 }, batch_rows: if list_batches > 1 { lists_per_head * list_heads } else { 0 }, _pad: 0 };
        let params = BuildParams { lists, list_heads, ..p };
        let words = (lists_per_head * list_heads * list_batches) as usize * row_words as usize;
        PassPlan { params, grid: (lists_per_head, list_heads, list_batches), words }
    }

    /// Bytes of scratch the build needs (a byte per block of every list).
    pub fn scratch_bytes(&self) -> usize {
        (self.grid.0 * self.grid.1 * self.grid.2) as usize * self.params.list_len() as usize
    }
}

/// The forward's and the backward's builds of a block mask of `shape`, after checking it.
pub fn plan(shape: &BlockMaskShape) -> Result<(PassPlan, PassPlan)> {
    let s = shape;
    if s.batch == 0 || s.seqlen_q == 0 || s.seqlen_k == 0 || s.heads_q == 0 || s.heads_k == 0 {
        return Err(AttnError::InvalidBlockMask(format!("shape {s:?} has an empty dimension")));
    }
    if s.heads_q % s.heads_k != 0 {
        return Err(AttnError::HeadsNotDivisible { heads_q: s.heads_q, heads_k: s.heads_k });
    }
    let hdim = s.head_dim as u32;
    let fwd = common::variant::find_forward(hdim, common::DType::F16, true);
    let cfg = fwd.and_then(common::fa3::kernel_config);
    let (Some(fwd), Some(cfg)) = (fwd, cfg) else {
        return Err(AttnError::UnsupportedHeadDim { hdim: s.head_dim, supported: &common::bwd::HEAD_DIMS });
    };
    let too_large = |what: &str| AttnError::TooLarge(format!("a block mask over {what}"));
    if s.seqlen_q > i32::MAX as usize || s.seqlen_k > i32::MAX as usize || s.batch > u16::MAX as usize || s.heads_q > u16::MAX as usize {
        return Err(too_large(&format!("{s:?}")));
    }
    let (sq, sk, causal) = (s.seqlen_q as u32, s.seqlen_k as u32, s.causal as u32);
    let batches = if s.per_batch { s.batch as u32 } else { 1 };
    let (block_m, block_n) = (cfg.block_m(), fwd.block_n);
    let base = BuildParams { seqlen_q: sq, seqlen_k: sk, causal, heads_per_list: 1, ..Default::default() };
    let f = BuildParams { block_m, block_n, row_shift: common::fa3::tile_row_shift(s.causal, sq, block_m, block_n), transposed: 0, ..base };
    let fwd_heads = if s.per_head { s.heads_q as u32 } else { 1 };
    let fwd = PassPlan::new(f, f.query_blocks(), fwd_heads, batches);
    let b = BuildParams { block_m: common::bwd::block_m(hdim, false), block_n: common::bwd::block_n(hdim), row_shift: 0, transposed: 1, ..base };
    let (bwd_heads, group) = if s.per_head { (s.heads_k as u32, (s.heads_q / s.heads_k) as u32) } else { (1, 1) };
    let bwd = PassPlan::new(BuildParams { heads_per_list: group, ..b }, b.key_blocks(), bwd_heads, batches);
    for p in [&fwd, &bwd] {
        if p.params.list_len() > MAX_BLOCKS {
            return Err(too_large(&format!("{} blocks per list (at most {MAX_BLOCKS})", p.params.list_len())));
        }
        if p.words > u32::MAX as usize {
            return Err(too_large(&format!("{} list words", p.words)));
        }
    }
    Ok((fwd, bwd))
}

/// The lists of one pass on the CPU, from `visible` (a variant's `Variant::visible` with
/// its buffer): `common::sparse::classify` and `list_of` over every list, as the build
/// kernel does. For tests and for checking a mask mod.
pub fn host_lists(pass: &PassPlan, mut visible: impl FnMut(Coords) -> bool) -> Vec<u32> {
    let p = &pass.params;
    let mut out = vec![0u32; pass.words];
    let (lists, heads, batches) = pass.grid;
    for batch in 0..batches {
        for head in 0..heads {
            for list in 0..lists {
                let states: Vec<_> = (0..p.list_len())
                    .map(|i| {
                        let (m, n) = p.block_of(list, i);
                        common::sparse::classify(p, m, n, p.heads_per_list, |h, q, kv| {
                            visible(Coords { batch, head: head * p.heads_per_list + h, q, kv, seqlen_q: p.seqlen_q, seqlen_k: p.seqlen_k })
                        })
                    })
                    .collect();
                let row = (p.lists.row(batch, head, list) / 4) as usize;
                common::sparse::list_of(&states, &mut out[row..row + p.lists.row_words as usize]);
            }
        }
    }
    out
}

/// [`host_lists`] for variant `V` with buffer `data` (as the kernels read it).
pub fn host_lists_of<V: Variant>(pass: &PassPlan, data: &[u32]) -> Vec<u32> {
    host_lists(pass, |at| V::visible(data, at))
}

/// The forward's tile order of `lists` (the forward pass's, of `pass`): for each
/// (batch, head) of the lists, its query blocks by the count of their listed blocks, most
/// first (ties: the later block first, the dense order), laid out as the lists' rows
/// (`common::sparse::BlockMaskArgs::fwd_order`).
pub fn tile_order(pass: &PassPlan, lists: &[u32]) -> Vec<u32> {
    let p = &pass.params;
    let (tiles, heads, batches) = pass.grid;
    let mut order = vec![0u32; (tiles * heads * batches) as usize];
    for batch in 0..batches {
        for head in 0..heads {
            let count = |m: u32| common::sparse::split_header(lists[(p.lists.row(batch, head, m) / 4) as usize]).0;
            let mut ms: Vec<u32> = (0..tiles).collect();
            ms.sort_by_key(|&m| (std::cmp::Reverse(count(m)), std::cmp::Reverse(m)));
            for (i, m) in ms.into_iter().enumerate() {
                order[p.lists.row_index(batch, head, i as u32) as usize] = m;
            }
        }
    }
    order
}

/// Which variant (module, index) and buffer a mask was built with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BuiltWith {
    module: u64,
    index: usize,
    data: VariantDesc,
}

/// A block mask on the device: the forward's lists (per query block) and the backward's
/// (per key block), for one call shape and one variant with its buffer.
pub struct BlockMask {
    fwd: CudaSlice<u32>,
    bwd: CudaSlice<u32>,
    /// `BlockMaskArgs::fwd_order`.
    order: CudaSlice<u32>,
    args: BlockMaskArgs,
    plans: (PassPlan, PassPlan),
    shape: BlockMaskShape,
    built_with: BuiltWith,
}

impl std::fmt::Debug for BlockMask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockMask").field("shape", &self.shape).finish_non_exhaustive()
    }
}

/// The build kernel's parameters as one by-value kernel argument.
#[repr(transparent)]
struct BuildParamBlock(BuildParams);
// SAFETY: plain `#[repr(C)]` data the kernel reads by value.
unsafe impl DeviceRepr for BuildParamBlock {}

impl BlockMask {
    /// Builds the mask of `variant`'s mask mod (with its buffer) for calls of `shape`, on
    /// `stream` (the lists are ready for any later work on it).
    pub fn new(gpu: &Gpu, stream: &Arc<CudaStream>, variant: &UserVariant<'_>, shape: BlockMaskShape) -> Result<Self> {
        if !Arc::ptr_eq(stream.context(), gpu.context()) {
            return Err(AttnError::ForeignStream);
        }
        let (fwd_plan, bwd_plan) = plan(&shape)?;
        let f = variant.function(gpu, &common::variant::BLOCK_MASK_KERNEL)?;
        let (desc, _data_sync) = variant.desc(stream);
        let data = desc.check()?;
        // Zeroed: the words past a list's end mark are never read, but a copy to the host
        // (`to_host`) then holds nothing stale.
        let fwd = stream.alloc_zeros::<u32>(fwd_plan.words)?;
        let bwd = stream.alloc_zeros::<u32>(bwd_plan.words)?;
        let scratch_len = fwd_plan.scratch_bytes().max(bwd_plan.scratch_bytes()).max(1);
        // SAFETY: the build kernel writes every scratch byte it reads.
        let mut scratch = unsafe { stream.alloc::<u8>(scratch_len) }?;
        let mut args = BlockMaskArgs::default();
        for (pass, lists, out) in [(&fwd_plan, &fwd, &mut args.fwd), (&bwd_plan, &bwd, &mut args.bwd)] {
            let (addr, _lists_sync) = lists.device_ptr(stream);
            let (states, _scratch_sync) = scratch.device_ptr_mut(stream);
            let params = BuildParams { lists: BlockLists { addr, ..pass.params.lists }, states, variant: data, ..pass.params };
            let cfg = LaunchConfig { grid_dim: pass.grid, block_dim: (BUILD_THREADS, 1, 1), shared_mem_bytes: 0 };
            let block = BuildParamBlock(params);
            // SAFETY: `plan` sized the lists and the scratch for this grid; the variant's
            // buffer was checked and is read-only.
            unsafe { stream.launch_builder(f).arg(&block).launch(cfg) }?;
            *out = params.lists;
        }
        // The forward's tiles heaviest first (the scheduler's order), from the lists'
        // headers on the host: one synchronisation per build.
        let order = stream.clone_htod(&tile_order(&fwd_plan, &stream.clone_dtoh(&fwd)?))?;
        args.fwd_order = order.device_ptr(stream).0;
        let built_with = BuiltWith { module: variant.module_id(), index: variant.index(), data: desc };
        Ok(BlockMask { fwd, bwd, order, args, plans: (fwd_plan, bwd_plan), shape, built_with })
    }

    /// The shape the mask was built for.
    pub fn shape(&self) -> &BlockMaskShape {
        &self.shape
    }

    /// The forward's and the backward's builds (tile shapes and list layout).
    pub fn plans(&self) -> &(PassPlan, PassPlan) {
        &self.plans
    }

    /// The forward's and the backward's lists, copied to the host (layout:
    /// `common::sparse`).
    pub fn to_host(&self, stream: &Arc<CudaStream>) -> Result<(Vec<u32>, Vec<u32>)> {
        Ok((stream.clone_dtoh(&self.fwd)?, stream.clone_dtoh(&self.bwd)?))
    }

    /// The share of the forward's blocks that are visited, and of those that are
    /// partial: `(visited / all, partial / visited)` (from the lists on the host).
    pub fn density(&self, stream: &Arc<CudaStream>) -> Result<(f64, f64)> {
        let (fwd, _) = self.to_host(stream)?;
        let p = &self.plans.0;
        let row_words = p.params.lists.row_words as usize;
        let (mut visited, mut partial) = (0u64, 0u64);
        for row in fwd.chunks(row_words) {
            let (b, pt) = common::sparse::split_header(row[0]);
            visited += b as u64;
            partial += pt as u64;
        }
        let all = (fwd.len() / row_words) as u64 * p.params.list_len() as u64;
        Ok((visited as f64 / all as f64, partial as f64 / visited.max(1) as f64))
    }

    /// The guards that order a launch on `stream` after the build (held until it is
    /// queued).
    pub(crate) fn read_guards<'a>(&'a self, stream: &'a Arc<CudaStream>) -> [SyncOnDrop<'a>; 3] {
        [self.fwd.device_ptr(stream).1, self.bwd.device_ptr(stream).1, self.order.device_ptr(stream).1]
    }

    /// The kernels' view of the mask for a call of `shape` with `variant` and its buffer
    /// `data`, after checking that the mask was built for them.
    pub(crate) fn check(&self, variant: Option<&UserVariant<'_>>, data: Option<VariantDesc>, shape: &BlockMaskShape) -> Result<BlockMaskArgs> {
        let Some(v) = variant else {
            return Err(AttnError::InvalidBlockMask("a block mask needs AttnOptions::variant: the variant whose mask mod built it".into()));
        };
        if (v.module_id(), v.index()) != (self.built_with.module, self.built_with.index) {
            return Err(AttnError::InvalidBlockMask(format!("built with another variant than the call's {:?}", v.name())));
        }
        if data.unwrap_or_default() != self.built_with.data {
            return Err(AttnError::InvalidBlockMask("built with another buffer than the call's variant data: rebuild it".into()));
        }
        let b = &self.shape;
        let same = (b.batch, b.seqlen_q, b.seqlen_k, b.heads_q, b.heads_k, b.head_dim, b.causal)
            == (shape.batch, shape.seqlen_q, shape.seqlen_k, shape.heads_q, shape.heads_k, shape.head_dim, shape.causal);
        if !same {
            return Err(AttnError::InvalidBlockMask(format!(
                "built for batch {}, seqlen_q {}, seqlen_k {}, heads {}/{}, head dim {}, causal {}; the call is batch {}, seqlen_q {}, seqlen_k {}, heads {}/{}, head dim {}, causal {}",
                b.batch, b.seqlen_q, b.seqlen_k, b.heads_q, b.heads_k, b.head_dim, b.causal,
                shape.batch, shape.seqlen_q, shape.seqlen_k, shape.heads_q, shape.heads_k, shape.head_dim, shape.causal
            )));
        }
        Ok(self.args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::sparse::split_header;

    #[test]
    fn plans_follow_the_kernels_tiles() {
        let s = BlockMaskShape::new(2, 1000, 3000, 8, 2, 128).causal(true);
        let (f, b) = plan(&s).unwrap();
        // Forward: 128-row tiles over 64-key blocks, causal tiles ending on the last row.
        assert_eq!((f.params.block_m, f.params.block_n, f.params.row_shift), (128, 64, 24));
        assert_eq!(f.grid, (8, 8, 2));
        assert_eq!(f.params.lists.row_words, 2 + 47);
        // Backward: per K/V head, the union over its 4 query heads.
        assert_eq!((b.params.block_m, b.params.block_n, b.params.transposed, b.params.heads_per_list), (64, 128, 1, 4));
        assert_eq!(b.grid, (24, 2, 2));
        assert_eq!(b.params.lists.row_words, 2 + 16);
        let shared = plan(&s.same_for_every_head().same_for_every_batch()).unwrap();
        assert_eq!((shared.0.grid, shared.1.grid, shared.1.params.heads_per_list), ((8, 1, 1), (24, 1, 1), 1));
        assert_eq!((shared.0.params.lists.head_rows, shared.0.params.lists.batch_rows), (0, 0));
        let at256 = plan(&BlockMaskShape::new(1, 100, 100, 1, 1, 256)).unwrap();
        assert_eq!((at256.1.params.block_m, at256.1.params.block_n), (64, 64));
    }

    #[test]
    fn tiles_are_ordered_heaviest_first_per_head() {
        // Two heads of 300 x 1000, hdim 64: 3 query tiles over 8 key blocks each; head 1
        // sees every key from its first tile only.
        let s = BlockMaskShape::new(1, 300, 1000, 2, 2, 64);
        let (f, _) = plan(&s).unwrap();
        let lists = host_lists(&f, |at| at.head == 0 || at.q < 128 || at.kv < 200);
        let order = tile_order(&f, &lists);
        assert_eq!(&order[0..3], &[2, 1, 0], "equal counts: the dense order");
        assert_eq!(&order[3..6], &[0, 2, 1], "the tile that sees all 8 blocks, then ties from the last");
    }

    #[test]
    fn bad_shapes_are_refused() {
        let ok = BlockMaskShape::new(1, 128, 128, 4, 2, 64);
        assert!(plan(&ok).is_ok());
        assert!(matches!(plan(&BlockMaskShape { heads_k: 3, ..ok }), Err(AttnError::HeadsNotDivisible { .. })));
        assert!(matches!(plan(&BlockMaskShape { head_dim: 96, ..ok }), Err(AttnError::UnsupportedHeadDim { hdim: 96, .. })));
        assert!(matches!(plan(&BlockMaskShape { seqlen_q: 0, ..ok }), Err(AttnError::InvalidBlockMask(_))));
        // 64-key forward blocks: more than 65535 per list.
        let long = BlockMaskShape { seqlen_k: 64 * 65536, head_dim: 128, ..ok };
        assert!(matches!(plan(&long), Err(AttnError::TooLarge(_))));
    }

    #[test]
    fn host_lists_skip_the_blocks_a_local_mask_hides() {
        // Keys within 100 of the query's diagonal, non-causal: 1000 x 1000, hdim 64
        // (128 x 128 forward tiles).
        let s = BlockMaskShape::new(1, 1000, 1000, 1, 1, 64);
        let (f, b) = plan(&s).unwrap();
        let band = |at: Coords| (at.q as i64 - at.kv as i64).abs() <= 100;
        let lists = host_lists(&f, band);
        let rw = f.params.lists.row_words as usize;
        for (m, row) in lists.chunks(rw).enumerate() {
            let (n, partial) = split_header(row[0]);
            let blocks = &row[1..1 + n as usize];
            let rows = (128 * m) as i64..(128 * m as i64 + 128).min(1000);
            for kb in 0..8u32 {
                let keys = (128 * kb) as i64..(128 * kb as i64 + 128).min(1000);
                let any = rows.clone().any(|q| keys.clone().any(|k| (q - k).abs() <= 100));
                assert_eq!(blocks.contains(&kb), any, "tile {m} key block {kb}");
            }
            assert!(partial <= n);
        }
        // The transposed lists hold the same pairs of blocks (at the backward's tiles).
        let t = host_lists(&b, band);
        let total: u32 = t.chunks(b.params.lists.row_words as usize).map(|r| split_header(r[0]).0).sum();
        assert!(total > 0 && total < 16 * 8, "{total} of 128 backward blocks");
    }
}
