//! Every misuse of the forward API gets its own precise error, checked without a GPU
//! through the planner that `flash_attn_func` runs before any launch.
use flash_attn3::plan::DeviceVec;
use flash_attn3::{AlibiDesc, DocsDesc, Algo, Arg, AttnError, AttnOptions, DType, Layout, Schedule, TensorDesc, plan_forward};
use common::fa3::Techniques;

const BASE: u64 = 0x7f00_0000_0000;

fn packed(shape: [usize; 4], dtype: DType) -> TensorDesc {
    let layout = Layout::contiguous(shape);
    TensorDesc { dtype, layout, addr: BASE, buffer_len: layout.numel() }
}

struct Call {
    q: TensorDesc,
    k: TensorDesc,
    v: TensorDesc,
    out: TensorDesc,
    lse: (u64, usize),
    opts: AttnOptions<'static>,
    alibi: Option<AlibiDesc>,
    sinks: Option<DeviceVec>,
    documents: Option<DocsDesc>,
}

impl Call {
    /// A valid call: 2 x 300 x 8 x 128 queries, 2 x 500 x 2 x 128 keys (GQA 4), bf16.
    fn good() -> Self {
        Self::shaped([2, 300, 8, 128], [2, 500, 2, 128], DType::BF16)
    }

    /// A valid call with packed q (and out) of `q` and k, v of `kv`.
    fn shaped(q: [usize; 4], kv: [usize; 4], dtype: DType) -> Self {
        Call {
            q: packed(q, dtype),
            k: packed(kv, dtype),
            v: packed(kv, dtype),
            out: packed(q, dtype),
            lse: (BASE, q[0] * q[1] * q[2]),
            opts: AttnOptions::default(),
            alibi: None,
            sinks: None,
            documents: None,
        }
    }

    fn plan(&self) -> Result<flash_attn3::plan::FwdPlan, AttnError> {
        plan_forward(&self.q, &self.k, &self.v, &self.out, self.lse, &self.opts, self.alibi, self.sinks, self.documents, None, 132)
    }

    fn err(self) -> AttnError {
        self.plan().expect_err("this call must be rejected")
    }
}

#[test]
fn a_valid_call_is_planned_with_the_default_scale() {
    let plan = Call::good().plan().unwrap();
    // FlashAttention-3 by default: 128 query rows per tile, 384 threads, TMA maps, and a
    // persistent grid of at most one CTA per SM.
    assert_eq!(plan.grid, ((300usize.div_ceil(128) * 8 * 2) as u32, 1, 1));
    assert_eq!(plan.block, 384);
    // hdim 128's default techniques: all of them.
    assert_eq!(plan.kernel.algo, Algo::Fa3(Techniques::FULL));
    assert_eq!((plan.kernel.cluster, plan.kernel.name), (1, "fa3_fwd_hdim128_bf16"));
    let maps = plan.tma.expect("FA3 launches carry tensor maps");
    assert_eq!(maps[1].dims, [64, 500, 2, 2, 2], "k: 64-wide chunks, seqlen, chunks, heads_k, batch");
    assert_eq!(maps[1].box_dims, [64, 128, 2, 1, 1], "k: one box per tile");
    assert_eq!(maps[3].box_dims, [64, 64, 1, 1, 1], "o leaves in 64 x 64 boxes");
    assert_eq!(plan.params.kv_group, 4);
    assert!((plan.params.softmax_scale - 1.0 / 128f32.sqrt()).abs() < 1e-7);
    assert_eq!(plan.kernel.hdim, 128);
    assert_eq!(plan.kernel.dtype, DType::BF16);
}

#[test]
fn persistent_grid_is_capped_at_the_sm_count() {
    let mut c = Call::good();
    c.q = packed([2, 4096, 8, 128], DType::BF16);
    c.out = c.q;
    c.lse.1 = 2 * 8 * 4096;
    assert_eq!(c.plan().unwrap().grid, (132, 1, 1));
    c.opts = c.opts.schedule(Schedule::TilePerCta);
    assert_eq!(c.plan().unwrap().grid, (32 * 8 * 2, 1, 1));
    assert!(c.plan().unwrap().tile_counter.is_none(), "the static orders need no counter");
    c.opts = AttnOptions::default().schedule(Schedule::Persistent);
    assert!(c.plan().unwrap().tile_counter.is_none());
    // Causal tiles differ in cost: by default CTAs claim them from a counter.
    c.opts = AttnOptions::default().causal(true);
    let plan = c.plan().unwrap();
    assert_eq!(plan.grid, (132, 1, 1));
    assert!(plan.tile_counter.is_some());
    c.opts = c.opts.schedule(Schedule::Persistent);
    assert_eq!(c.plan().unwrap().grid, (132, 1, 1));
    assert!(c.plan().unwrap().tile_counter.is_none());
    c.opts = c.opts.schedule(Schedule::TilePerCta);
    assert_eq!(c.plan().unwrap().grid, (32 * 8 * 2, 1, 1));
}

#[test]
fn short_last_query_blocks_are_balanced_by_the_tile_counter() {
    // hdim 64 tiles have 192 rows: 1024 rows end in a 64-row block, 1152 do not.
    for (seqlen, counter) in [(1024, true), (1152, false), (4096, true)] {
        let mut c = Call::shaped([16, seqlen, 32, 64], [16, seqlen, 32, 64], DType::F16);
        let plan = c.plan().unwrap();
        assert_eq!(plan.tile_counter.is_some(), counter, "hdim 64, seqlen {seqlen}");
        assert_eq!(plan.grid, (132, 1, 1));
        // An explicit static schedule is kept.
        c.opts = c.opts.schedule(Schedule::Persistent);
        assert!(c.plan().unwrap().tile_counter.is_none());
    }
    // hdim 128 tiles have 128 rows.
    for (seqlen, counter) in [(1024, false), (1000, true)] {
        let c = Call::shaped([16, seqlen, 16, 128], [16, seqlen, 16, 128], DType::F16);
        assert_eq!(c.plan().unwrap().tile_counter.is_some(), counter, "hdim 128, seqlen {seqlen}");
    }
}

#[test]
fn dynamic_tile_sections_fit_l2_and_divide_the_heads() {
    use flash_attn3::plan::section_log2;
    // K/V of one head at 4k, hdim 128: 2 MiB, so 16 heads fill 32 MiB.
    assert_eq!(section_log2(64, 1, 4096, 128), 4);
    assert_eq!(section_log2(16, 1, 8192, 256), 2);
    // The section divides the heads: 48 = 16 * 3.
    assert_eq!(section_log2(48, 1, 4096, 128), 4);
    assert_eq!(section_log2(15, 1, 4096, 128), 0);
    // GQA: four query heads read one K/V head; 32 would fit, the cap is 16.
    assert_eq!(section_log2(64, 4, 8192, 128), 4);
    assert_eq!(section_log2(64, 4, 8192, 256), 4);
    assert_eq!(section_log2(64, 4, 16384, 128), 0);
    // Capped at 16 heads (hdim 64 at 1k would fit 128); 16k keys are not sectioned.
    assert_eq!(section_log2(512, 1, 1024, 64), 4);
    assert_eq!(section_log2(8, 1, 1024, 64), 3);
    assert_eq!(section_log2(16, 1, 16384, 128), 0);
    assert_eq!(section_log2(32, 1, 16384, 64), 0);

    // Only the counter's order of a causal call is sectioned; the static orders keep
    // query blocks fastest.
    let mut c = Call::shaped([4, 4096, 16, 128], [4, 4096, 16, 128], DType::F16);
    c.opts = c.opts.causal(true);
    let plan = c.plan().unwrap();
    assert!(plan.tile_counter.is_some());
    assert_eq!(plan.params.section_log2, 4);
    c.opts = c.opts.schedule(Schedule::Persistent);
    assert_eq!(c.plan().unwrap().params.section_log2, 0);
    // Without a mask the counter is used for a short last block, in the plain order.
    let c = Call::shaped([4, 4000, 16, 128], [4, 4000, 16, 128], DType::F16);
    let plan = c.plan().unwrap();
    assert!(plan.tile_counter.is_some());
    assert_eq!(plan.params.section_log2, 0);
}

#[test]
fn dynamic_schedule_needs_no_counter_when_every_tile_has_its_own_cta() {
    let mut c = Call::good();
    c.opts = AttnOptions::default().causal(true).schedule(Schedule::PersistentDynamic);
    let plan = c.plan().unwrap();
    assert!(plan.grid.0 < 132, "this call has fewer tiles than SMs");
    assert!(plan.tile_counter.is_none());
}

#[test]
fn dynamic_schedule_needs_a_producer_warpgroup() {
    let mut c = Call::good();
    for t in [&mut c.q, &mut c.k, &mut c.v, &mut c.out] {
        t.dtype = DType::F16;
    }
    c.opts = AttnOptions::default().causal(true).algo(Algo::Fa3(Techniques::NO_WARP_SPECIALIZATION));
    let plan = c.plan().unwrap();
    assert!(plan.tile_counter.is_none(), "Auto falls back to one tile per CTA");
    c.opts = c.opts.schedule(Schedule::PersistentDynamic);
    assert!(matches!(c.plan(), Err(AttnError::Unsupported(_))));
}

#[test]
fn the_fa2_kernel_can_be_forced() {
    let mut c = Call::good();
    c.opts = c.opts.algo(Algo::Fa2);
    let plan = c.plan().unwrap();
    assert_eq!((plan.grid.0, plan.block), (300usize.div_ceil(64) as u32, 128));
    assert!(plan.tma.is_none());
}

#[test]
fn hdim_128_defaults_to_every_technique_and_can_leave_pingpong_out() {
    for dtype in DType::ALL {
        let mut c = Call::good();
        for t in [&mut c.q, &mut c.k, &mut c.v, &mut c.out] {
            t.dtype = dtype;
        }
        for causal in [false, true] {
            c.opts = c.opts.causal(causal);
            assert_eq!(c.plan().unwrap().kernel.algo, Algo::Fa3(Techniques::FULL), "{dtype:?} causal {causal}");
        }
        c.opts = c.opts.causal(false).algo(Algo::Fa3(Techniques::NO_PINGPONG));
        assert_eq!(c.plan().unwrap().kernel.algo, Algo::Fa3(Techniques::NO_PINGPONG), "{dtype:?}");
    }
    // Multicast clusters keep pingpong (no kernel without it).
    let mut c = Call::good();
    c.opts = AttnOptions::default().schedule(Schedule::PersistentMulticast);
    let plan = c.plan().unwrap();
    assert_eq!((plan.kernel.algo, plan.kernel.cluster), (Algo::Fa3(Techniques::FULL), 2));
}

#[test]
fn ablation_variants_exist_only_where_built() {
    let mut c = Call::good();
    c.opts = c.opts.algo(Algo::Fa3(Techniques::NO_OVERLAP));
    assert!(matches!(c.err(), AttnError::NoKernel { hdim: 128, dtype: DType::BF16, .. }));
    let mut c = Call::good();
    for t in [&mut c.q, &mut c.k, &mut c.v, &mut c.out] {
        t.dtype = DType::F16;
    }
    c.opts = c.opts.algo(Algo::Fa3(Techniques::NO_WARP_SPECIALIZATION));
    assert_eq!(c.plan().unwrap().block, 256);
}

#[test]
fn strided_views_are_accepted() {
    let mut c = Call::good();
    // [b, h, s, d] storage viewed as [b, s, h, d]: head stride s*d, row stride d.
    c.q.layout.strides = [8 * 300 * 128, 128, 300 * 128, 1];
    let p = c.plan().unwrap();
    assert_eq!((p.params.q_strides.row, p.params.q_strides.head), (128, 300 * 128));
}

#[test]
fn dtype_mismatch_is_rejected() {
    let mut c = Call::good();
    c.k.dtype = DType::F16;
    assert!(matches!(c.err(), AttnError::DTypeMismatch { q: DType::BF16, k: DType::F16, v: DType::BF16 }));
    let mut c = Call::good();
    c.out.dtype = DType::F16;
    assert!(matches!(c.err(), AttnError::OutDType { .. }));
}

#[test]
fn unsupported_head_dims_are_rejected() {
    for d in [32, 96, 160, 512] {
        let mut c = Call::good();
        for t in [&mut c.q, &mut c.k, &mut c.v, &mut c.out] {
            t.layout = Layout::contiguous([t.layout.shape[0], t.layout.shape[1], t.layout.shape[2], d]);
            t.buffer_len = t.layout.numel();
        }
        assert!(matches!(c.err(), AttnError::UnsupportedHeadDim { hdim, .. } if hdim == d));
    }
}

#[test]
fn shape_mismatches_are_rejected() {
    let mut c = Call::good();
    c.v = packed([2, 499, 2, 128], DType::BF16);
    assert!(matches!(c.err(), AttnError::ShapeMismatch(m) if m.contains("k and v")));
    let mut c = Call::good();
    c.k = packed([3, 500, 2, 128], DType::BF16);
    c.v = c.k;
    assert!(matches!(c.err(), AttnError::ShapeMismatch(m) if m.contains("batch")));
    let mut c = Call::good();
    c.k = packed([2, 500, 2, 64], DType::BF16);
    c.v = c.k;
    assert!(matches!(c.err(), AttnError::ShapeMismatch(m) if m.contains("head dim")));
    let mut c = Call::good();
    c.out = packed([2, 301, 8, 128], DType::BF16);
    assert!(matches!(c.err(), AttnError::ShapeMismatch(m) if m.contains("out")));
}

#[test]
fn heads_must_divide() {
    let mut c = Call::good();
    c.k = packed([2, 500, 3, 128], DType::BF16);
    c.v = c.k;
    assert!(matches!(c.err(), AttnError::HeadsNotDivisible { heads_q: 8, heads_k: 3 }));
}

#[test]
fn empty_dimensions_are_rejected() {
    for dim in 0..3 {
        let mut c = Call::good();
        c.q.layout.shape[dim] = 0;
        assert!(matches!(c.err(), AttnError::EmptyDim { arg: Arg::Q, .. }));
    }
    let mut c = Call::good();
    c.k.layout.shape[1] = 0;
    assert!(matches!(c.err(), AttnError::EmptyDim { arg: Arg::K, .. }));
}

#[test]
fn non_contiguous_head_dim_is_rejected() {
    let mut c = Call::good();
    c.v.layout.strides[3] = 2;
    c.v.buffer_len *= 2;
    assert!(matches!(c.err(), AttnError::NonContiguousLastDim { arg: Arg::V, stride: 2 }));
}

#[test]
fn misalignment_is_rejected() {
    let mut c = Call::good();
    c.q.addr += 2;
    assert!(matches!(c.err(), AttnError::Misaligned { arg: Arg::Q, .. }));
    let mut c = Call::good();
    // Row stride of 129 elements: rows no longer start on 16-byte boundaries.
    c.k.layout.strides = [500 * 2 * 129, 2 * 129, 129, 1];
    c.k.buffer_len = 2 * 500 * 2 * 129;
    assert!(matches!(c.err(), AttnError::Misaligned { arg: Arg::K, detail } if detail.contains("seqlen stride 258")));
    let mut c = Call::good();
    c.lse.0 += 2;
    assert!(matches!(c.err(), AttnError::Misaligned { arg: Arg::Lse, .. }));
}

#[test]
fn views_past_the_buffer_are_rejected() {
    let mut c = Call::good();
    c.k.buffer_len -= 1;
    assert!(matches!(c.err(), AttnError::OutOfBounds { arg: Arg::K, .. }));
    let mut c = Call::good();
    c.out.layout.strides[0] *= 2;
    assert!(matches!(c.err(), AttnError::OutOfBounds { arg: Arg::Out, .. }));
    let mut c = Call::good();
    c.lse.1 = 2 * 8 * 300 - 1;
    assert!(matches!(c.err(), AttnError::OutOfBounds { arg: Arg::Lse, needed: 4800, len: 4799 }));
    let mut c = Call::good();
    c.q.layout.shape[0] = 3;
    c.q.layout.strides[0] = usize::MAX / 2 + 8;
    assert!(matches!(c.err(), AttnError::TooLarge(_)));
}

#[test]
fn oversized_launches_are_rejected() {
    let mut c = Call::good();
    c.q = packed([70_000, 1, 8, 128], DType::BF16);
    c.k = packed([70_000, 1, 2, 128], DType::BF16);
    c.v = c.k;
    c.out = c.q;
    c.lse.1 = 70_000 * 8;
    assert!(matches!(c.err(), AttnError::TooLarge(m) if m.contains("batch")));
}

#[test]
fn non_finite_or_negative_scale_is_rejected() {
    for s in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.125, -f32::MIN_POSITIVE] {
        let mut c = Call::good();
        c.opts = c.opts.softmax_scale(s);
        assert!(matches!(c.err(), AttnError::InvalidScale(_)));
    }
    for s in [0.0, -0.0, 0.125] {
        let mut c = Call::good();
        c.opts = c.opts.softmax_scale(s);
        assert!(c.plan().is_ok(), "scale {s}");
    }
}

#[test]
fn errors_read_well() {
    let msg = Call { k: packed([2, 500, 3, 128], DType::BF16), v: packed([2, 500, 3, 128], DType::BF16), ..Call::good() }
        .err()
        .to_string();
    assert_eq!(msg, "heads of q (8) must be a multiple of heads of k/v (3)");
}

#[test]
fn no_driver_is_an_error_not_a_crash() {
    if flash_attn3::driver_present() {
        eprintln!("skipped: a CUDA driver is present on this machine");
        return;
    }
    assert!(matches!(flash_attn3::Gpu::new(0), Err(AttnError::NoDriver)));
}

#[test]
fn hdim_64_tiles_have_192_query_rows() {
    let plan = Call::shaped([2, 1000, 8, 64], [2, 500, 2, 64], DType::BF16).plan().unwrap();
    // Three consumer warpgroups and a producer; ceil(1000 / 192) = 6 tiles per head.
    assert_eq!(plan.block, 512);
    assert_eq!(plan.grid, (6 * 8 * 2, 1, 1));
    assert_eq!(plan.tma.unwrap()[0].box_dims, [64, 192, 1, 1, 1], "q arrives in 192-row boxes");
}

#[test]
fn multicast_clusters_only_without_a_causal_mask() {
    let mut c = Call::good();
    c.opts = AttnOptions::default().causal(true).schedule(Schedule::PersistentMulticast);
    assert!(matches!(c.plan(), Err(AttnError::Unsupported(_))));
    // Auto with a causal mask: no cluster, whole K/V tiles.
    c.opts = AttnOptions::default().causal(true);
    let plan = c.plan().unwrap();
    assert_eq!(plan.kernel.cluster, 1);
    assert_eq!(plan.tma.unwrap()[1].box_dims, [64, 128, 2, 1, 1]);
    // The persistent static schedule without clusters stays available.
    c.opts = AttnOptions::default().schedule(Schedule::Persistent);
    assert_eq!(c.plan().unwrap().kernel.cluster, 1);
    // No multicast kernel for the ablation variants: a typed error, not a fallback.
    c.opts = AttnOptions::default().schedule(Schedule::PersistentMulticast).algo(Algo::Fa3(Techniques::NO_PINGPONG));
    assert!(matches!(c.plan(), Err(AttnError::NoKernel { .. })));
}

/// The default runs hdim 128 without a mask in multicast clusters from 4096 query rows
/// and keys (+1.8-2.3% there, -1.9% at 2k), and never with a mask, another head dim, shorter
/// sequences or an ablation variant (which has no multicast kernel).
#[test]
fn long_hdim_128_calls_without_a_mask_default_to_multicast() {
    let cluster = |q: [usize; 4], kv: [usize; 4], opts: AttnOptions<'static>| {
        let mut c = Call::shaped(q, kv, DType::F16);
        c.opts = opts;
        c.plan().unwrap().kernel.cluster
    };
    let long = [1, 4096, 16, 128];
    assert_eq!(cluster(long, long, AttnOptions::default()), 2);
    assert_eq!(cluster([1, 16384, 16, 128], [1, 16384, 4, 128], AttnOptions::default()), 2);
    assert_eq!(cluster(long, long, AttnOptions::default().causal(true)), 1);
    assert_eq!(cluster([1, 4095, 16, 128], long, AttnOptions::default()), 1);
    assert_eq!(cluster(long, [1, 4095, 16, 128], AttnOptions::default()), 1);
    assert_eq!(cluster([1, 4096, 16, 64], [1, 4096, 16, 64], AttnOptions::default()), 1);
    assert_eq!(cluster([1, 4096, 8, 256], [1, 4096, 8, 256], AttnOptions::default()), 1);
    assert_eq!(cluster(long, long, AttnOptions::default().algo(Algo::Fa3(Techniques::NO_PINGPONG))), 1);
    assert_eq!(cluster(long, long, AttnOptions::default().schedule(Schedule::Persistent)), 1);
}

#[test]
fn multicast_plans_pairs_of_query_blocks_in_whole_clusters() {
    let mut c = Call::good();
    c.opts = AttnOptions::default().schedule(Schedule::PersistentMulticast);
    let plan = c.plan().unwrap();
    // 3 query blocks per head make 2 pairs (the last with one block past the end), for
    // 8 heads x 2 batches.
    assert_eq!(plan.grid, (2 * 2 * 8 * 2, 1, 1));
    assert_eq!((plan.kernel.cluster, plan.kernel.name), (2, "fa3_fwd_hdim128_bf16_multicast"));
    let maps = plan.tma.unwrap();
    assert_eq!(maps[1].box_dims, [64, 64, 1, 1, 1], "each CTA loads half the rows of one chunk per copy");
    assert_eq!(maps[0].box_dims, [64, 128, 2, 1, 1], "q: one box per tile");
    c.q = packed([2, 4096, 8, 128], DType::BF16);
    c.out = c.q;
    c.lse.1 = 2 * 8 * 4096;
    assert_eq!(c.plan().unwrap().grid, (132, 1, 1), "whole clusters within the SM count");
}

/// Short causal calls too: since warpgroups skip the key blocks masked for all of
/// their rows, 192-row tiles beat 128-row ones there as well.
#[test]
fn hdim_64_calls_use_192_row_tiles() {
    for (seqlen, causal) in [(1024, true), (300, true), (1024, false), (1025, true)] {
        let mut c = Call::shaped([2, seqlen, 8, 64], [2, seqlen, 2, 64], DType::F16);
        c.opts = AttnOptions::default().causal(causal);
        let plan = c.plan().unwrap();
        assert_eq!((plan.kernel.name, plan.block), ("fa3_fwd_hdim64_f16", 512), "seqlen {seqlen} causal {causal}");
        assert_eq!(plan.tma.unwrap()[0].box_dims, [64, 192, 1, 1, 1]);
    }
}

/// hdim 256 runs 64-key blocks up to 4096 keys (80 pads the usual lengths) and 80-key
/// blocks beyond; the K and V maps load one block per box.
#[test]
fn hdim_256_picks_its_key_block_by_the_key_count() {
    for (seqlen_k, name, keys) in [
        (1, "fa3_fwd_hdim256_bf16_n64", 64),
        (1024, "fa3_fwd_hdim256_bf16_n64", 64),
        (4096, "fa3_fwd_hdim256_bf16_n64", 64),
        (4097, "fa3_fwd_hdim256_bf16", 80),
        (16384, "fa3_fwd_hdim256_bf16", 80),
    ] {
        for causal in [false, true] {
            let mut c = Call::shaped([1, 1000, 8, 256], [1, seqlen_k, 8, 256], DType::BF16);
            c.opts = AttnOptions::default().causal(causal);
            let plan = c.plan().unwrap();
            assert_eq!(plan.kernel.name, name, "seqlen_k {seqlen_k} causal {causal}");
            let maps = plan.tma.unwrap();
            assert_eq!((maps[1].box_dims[1], maps[2].box_dims[1]), (keys, keys), "seqlen_k {seqlen_k}");
        }
    }
    // The query length does not move it.
    let c = Call::shaped([1, 9000, 8, 256], [1, 300, 8, 256], DType::F16);
    assert_eq!(c.plan().unwrap().kernel.name, "fa3_fwd_hdim256_f16_n64");
}

/// The kernel's dynamic schedule, run on the CPU with CTAs interleaved in a random
/// order: from any base (wrapping included), every tile is computed exactly once and the
/// counter moves on by exactly the tile count, which the host adds to the next launch's
/// base on the stream (`FwdPlan::tile_counter`; a wrong count would make the next launch
/// skip or repeat tiles).
#[test]
fn dynamic_schedule_moves_the_counter_by_its_claims_and_covers_every_tile_once() {
    // The kernels' own arithmetic (`common::claim_stride`, `common::claimed_tile`): a
    // saturating add, or the base added instead of subtracted, fails here.
    // xorshift: the interleaving only needs to be arbitrary and repeatable.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = |n: u32| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    for base in [0u32, 5, u32::MAX - 3] {
        for ctas in [1u32, 2, 3, 7, 132] {
            for tiles in [0u32, 1, 2, 6, 7, 8, 131, 133, 500] {
                let mut counter = base;
                // Per CTA: its current tile, as the producer's `TileClaims` keeps it.
                let stride = common::claim_stride(ctas, base);
                let mut current: Vec<Option<u32>> = (0..ctas).map(Some).collect();
                let mut seen = vec![0u32; tiles as usize];
                while current.iter().any(Option::is_some) {
                    let c = next(ctas);
                    let Some(t) = current[c] else { continue };
                    if t >= tiles {
                        current[c] = None;
                        continue;
                    }
                    seen[t as usize] += 1;
                    let claim = counter;
                    counter = counter.wrapping_add(1);
                    current[c] = Some(common::claimed_tile(claim, stride));
                }
                assert!(seen.iter().all(|&n| n == 1), "base {base} ctas {ctas} tiles {tiles}: {seen:?}");
                assert_eq!(counter.wrapping_sub(base), tiles, "base {base} ctas {ctas} tiles {tiles}");
            }
        }
    }
}

#[test]
fn softcap_must_be_finite_and_positive() {
    for c in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, -30.0] {
        let mut call = Call::good();
        call.opts = call.opts.softcap(c);
        assert!(matches!(call.err(), AttnError::InvalidSoftcap(_)), "softcap {c}");
    }
}

#[test]
fn softcap_picks_the_soft_capping_kernel_and_folds_the_cap_into_the_softmax_scale() {
    // hdim 64: three consumer warpgroups on 64-key blocks (`common::fa3::three_wgs_short_keys`).
    for (hdim, seqlen_k, name, wgs, keys) in [
        (64, 500, "fa3_fwd_hdim64_bf16_softcap", 3, 64),
        (128, 500, "fa3_fwd_hdim128_bf16_softcap", 2, 128),
        (256, 500, "fa3_fwd_hdim256_bf16_n64_softcap", 2, 64),
        (256, 8192, "fa3_fwd_hdim256_bf16_softcap", 2, 80),
    ] {
        let mut call = Call::shaped([2, 300, 8, hdim], [2, seqlen_k, 2, hdim], DType::BF16);
        call.opts = call.opts.softcap(30.0).causal(true);
        let plan = call.plan().unwrap();
        assert_eq!((plan.kernel.name, plan.kernel.consumer_wgs, plan.kernel.block_n), (name, wgs, keys));
        assert_eq!(plan.kernel.score_mod, common::ScoreModKind::Softcap);
        let scale = 1.0 / (hdim as f32).sqrt();
        assert!((plan.params.softcap_scale - scale / 30.0).abs() < 1e-9);
        assert!((plan.params.scale_log2 - 30.0 * std::f32::consts::LOG2_E).abs() < 1e-5);
        assert_eq!(plan.params.softmax_scale, 30.0, "the LSE is c times the tanh's max plus the log-sum");
        // 64 query rows per consumer warpgroup in Q's box.
        assert_eq!(call.plan().unwrap().tma.unwrap()[0].box_dims[1], 64 * wgs);
    }
    // The plain kernel stays without it.
    assert_eq!(Call::good().plan().unwrap().kernel.score_mod, common::ScoreModKind::None);
}

#[test]
fn softcap_has_no_fa2_ablation_or_multicast_kernel() {
    let long = [1, 4096, 16, 128];
    let mut c = Call::shaped(long, long, DType::F16);
    c.opts = c.opts.softcap(50.0);
    assert_eq!(c.plan().unwrap().kernel.cluster, 1, "no multicast by default with soft-capping");
    for opts in [
        AttnOptions::default().softcap(50.0).algo(Algo::Fa2),
        AttnOptions::default().softcap(50.0).algo(Algo::Fa3(Techniques::NO_PINGPONG)),
        AttnOptions::default().softcap(50.0).schedule(Schedule::PersistentMulticast),
    ] {
        let mut c = Call::shaped(long, long, DType::F16);
        c.opts = opts;
        assert!(matches!(c.err(), AttnError::Unsupported(_)), "{opts:?}");
    }
}

#[test]
fn alibi_picks_the_alibi_kernel_and_checks_its_slopes() {
    let slopes = |len, per_batch| Some(AlibiDesc { addr: BASE + (20 << 36), len, per_batch });
    // 2 x 300 x 8 x 128 queries: 8 slopes, or 16 per (batch, head).
    for (alibi, stride) in [(slopes(8, false), 0), (slopes(16, true), 8)] {
        let mut c = Call::good();
        c.alibi = alibi;
        let plan = c.plan().unwrap();
        assert_eq!((plan.kernel.name, plan.kernel.score_mod), ("fa3_fwd_hdim128_bf16_alibi", common::ScoreModKind::Alibi));
        assert_eq!((plan.params.alibi_slopes, plan.params.alibi_batch_stride), (alibi.unwrap().addr, stride));
        assert!((plan.params.alibi_inv_scale - 128f32.sqrt()).abs() < 1e-4, "slopes in raw-score units");
    }
    for (alibi, needed) in [(slopes(7, false), 8), (slopes(15, true), 16)] {
        let mut c = Call::good();
        c.alibi = alibi;
        assert!(matches!(c.err(), AttnError::OutOfBounds { arg: Arg::AlibiSlopes, needed: n, .. } if n == needed));
    }
    let mut c = Call::good();
    c.alibi = Some(AlibiDesc { addr: BASE + 2, len: 8, per_batch: false });
    assert!(matches!(c.err(), AttnError::Misaligned { arg: Arg::AlibiSlopes, .. }));
    // With soft-capping: the combined kernel, the slopes in the tanh's units (1 / c).
    let mut c = Call::good();
    c.alibi = slopes(8, false);
    c.opts = c.opts.softcap(30.0);
    let plan = c.plan().unwrap();
    assert_eq!((plan.kernel.name, plan.kernel.score_mod), ("fa3_fwd_hdim128_bf16_softcap_alibi", common::ScoreModKind::SoftcapAlibi));
    assert!((plan.params.alibi_inv_scale - 1.0 / 30.0).abs() < 1e-9);
    assert!((plan.params.softcap_scale - 1.0 / (30.0 * 128f32.sqrt())).abs() < 1e-9);
    assert_eq!(plan.params.softmax_scale, 30.0);
    let mut c = Call::good();
    c.alibi = slopes(8, false);
    c.opts = c.opts.softmax_scale(0.0);
    assert!(matches!(c.err(), AttnError::Unsupported(_)), "ALiBi needs a positive scale");
}

#[test]
fn a_window_picks_the_local_kernel_with_its_bounds_and_causal_folded_in() {
    // q 300 rows, k 500 keys: row i's diagonal key is i + 200.
    for (hdim, name) in [(64, "fa3_fwd_hdim64_bf16_local"), (128, "fa3_fwd_hdim128_bf16_local"), (256, "fa3_fwd_hdim256_bf16_n64_local")] {
        let mut c = Call::shaped([2, 300, 8, hdim], [2, 500, 2, hdim], DType::BF16);
        c.opts = c.opts.window(Some(64), Some(16));
        let plan = c.plan().unwrap();
        assert_eq!((plan.kernel.name, plan.kernel.mask), (name, common::MaskKind::Local));
        assert_eq!((plan.params.window.left, plan.params.window.right), (64, 16));
    }
    // hdim 256 keeps 64-key blocks with a window past 4096 keys (no 80-key local kernel).
    let mut c = Call::shaped([1, 300, 8, 256], [1, 8192, 2, 256], DType::F16);
    c.opts = c.opts.window(Some(4096), None);
    assert_eq!(c.plan().unwrap().kernel.name, "fa3_fwd_hdim256_f16_n64_local");
    // Causal caps the right side at 0; unbounded sides are the longer length.
    let mut c = Call::good();
    c.opts = c.opts.window(None, Some(7)).causal(true);
    let w = c.plan().unwrap().params.window;
    assert_eq!((w.left, w.right), (500, 0));
    // Huge windows are unbounded ones, and combine with soft-capping and ALiBi.
    let mut c = Call::good();
    c.opts = c.opts.window(Some(usize::MAX), Some(3)).softcap(30.0);
    let plan = c.plan().unwrap();
    assert_eq!((plan.kernel.name, plan.params.window.left), ("fa3_fwd_hdim128_bf16_softcap_local", 500));
    let mut c = Call::good();
    c.opts = c.opts.window(Some(10), Some(0));
    c.alibi = Some(AlibiDesc { addr: BASE + (20 << 36), len: 8, per_batch: false });
    assert_eq!(c.plan().unwrap().kernel.name, "fa3_fwd_hdim128_bf16_alibi_local");
    // A window bounded on neither side is no window: the plain kernel.
    let mut c = Call::good();
    c.opts = c.opts.window(None, None);
    assert_eq!(c.plan().unwrap().kernel.mask, common::MaskKind::Causal);
}

#[test]
fn a_window_has_no_fa2_ablation_or_multicast_kernel_and_a_length_limit() {
    let long = [1, 4096, 16, 128];
    let mut c = Call::shaped(long, long, DType::F16);
    c.opts = c.opts.window(Some(256), Some(256));
    assert_eq!(c.plan().unwrap().kernel.cluster, 1, "no multicast by default with a window");
    for opts in [
        AttnOptions::default().window(Some(8), None).algo(Algo::Fa2),
        AttnOptions::default().window(Some(8), None).algo(Algo::Fa3(Techniques::NO_OVERLAP)),
        AttnOptions::default().window(Some(8), None).schedule(Schedule::PersistentMulticast),
    ] {
        let mut c = Call::shaped(long, long, DType::F16);
        c.opts = opts;
        assert!(matches!(c.err(), AttnError::Unsupported(_)), "{opts:?}");
    }
    let huge = [1, (1 << 29) + 1, 1, 64];
    let mut c = Call::shaped(huge, [1, 64, 1, 64], DType::F16);
    c.opts = c.opts.window(Some(8), Some(8));
    assert!(matches!(c.err(), AttnError::TooLarge(_)));
}

#[test]
fn sinks_are_checked_and_passed_to_every_fa3_kernel() {
    let sinks = |addr_off: u64, len| Some(DeviceVec { addr: BASE + (21 << 36) + addr_off, len });
    // 8 query heads.
    let mut c = Call::good();
    c.sinks = sinks(0, 8);
    assert_eq!(c.plan().unwrap().params.sinks, BASE + (21 << 36));
    assert_eq!(Call::good().plan().unwrap().params.sinks, 0, "no sinks: 0");
    // With a window, soft-capping and an ablation kernel alike (the epilogue folds them in).
    for opts in [
        AttnOptions::default().window(Some(16), Some(0)),
        AttnOptions::default().softcap(20.0),
        AttnOptions::default().algo(Algo::Fa3(Techniques::NO_PINGPONG)),
    ] {
        let mut c = Call::good();
        c.opts = opts;
        c.sinks = sinks(0, 8);
        assert!(c.plan().is_ok(), "{opts:?}");
    }
    let mut c = Call::good();
    c.sinks = sinks(0, 7);
    assert!(matches!(c.err(), AttnError::OutOfBounds { arg: Arg::Sinks, needed: 8, len: 7 }));
    let mut c = Call::good();
    c.sinks = sinks(2, 8);
    assert!(matches!(c.err(), AttnError::Misaligned { arg: Arg::Sinks, .. }));
    let mut c = Call::good();
    c.opts = c.opts.algo(Algo::Fa2);
    c.sinks = sinks(0, 8);
    assert!(matches!(c.err(), AttnError::Unsupported(_)));
}

/// Documents of a 2 x 300-query, 2 x 500-key call (bounds for `positions` keys).
fn docs(positions: usize, per_batch: bool) -> Option<DocsDesc> {
    Some(DocsDesc { addr: BASE + (23 << 36), positions, seqlen: 500, per_batch })
}

#[test]
fn documents_pick_the_document_kernel_with_the_window_and_causal_folded_in() {
    let mut c = Call::good();
    c.documents = docs(500, false);
    let plan = c.plan().unwrap();
    assert_eq!(plan.kernel.name, "fa3_fwd_hdim128_bf16_document");
    assert_eq!(plan.params.docs.addr, BASE + (23 << 36));
    assert_eq!(plan.params.docs.batch_stride, 0, "one packing shared by the batch");
    // No window: unbounded on both sides (as wide as the longer sequence).
    assert_eq!((plan.params.window.left, plan.params.window.right), (500, 500));
    c.opts = c.opts.causal(true);
    assert_eq!((c.plan().unwrap().params.window.left, c.plan().unwrap().params.window.right), (500, 0));
    c.opts = c.opts.window(Some(64), None);
    assert_eq!(c.plan().unwrap().params.window.left, 64);
    c.documents = docs(1000, true);
    assert_eq!(c.plan().unwrap().params.docs.batch_stride, 500, "one packing per batch element");
    // hdim 256: the 64-key blocks of the local kernels.
    let mut c = Call::shaped([1, 300, 2, 256], [1, 500, 2, 256], DType::F16);
    c.documents = docs(500, false);
    assert_eq!(c.plan().unwrap().kernel.name, "fa3_fwd_hdim256_f16_n64_document");
    assert_eq!(Call::good().plan().unwrap().params.docs.addr, 0, "no documents: 0");
    // Soft-capped documents: their own kernels, hdim 64 on two warpgroups.
    let mut c = Call::shaped([1, 300, 2, 64], [1, 500, 2, 64], DType::BF16);
    (c.documents, c.opts) = (docs(500, false), AttnOptions::default().softcap(20.0));
    let plan = c.plan().unwrap();
    assert_eq!((plan.kernel.name, plan.kernel.consumer_wgs), ("fa3_fwd_hdim64_bf16_softcap_document", 2));
}

#[test]
fn documents_that_do_not_fit_the_call_are_refused_by_name() {
    let with = |d: Option<DocsDesc>, opts: AttnOptions<'static>| {
        let mut c = Call::good();
        (c.documents, c.opts) = (d, opts);
        c.err()
    };
    let plain = AttnOptions::default();
    assert!(matches!(with(Some(DocsDesc { seqlen: 499, ..docs(500, false).unwrap() }), plain), AttnError::ShapeMismatch(m) if m.contains("documents cover 499")));
    assert!(matches!(with(docs(499, false), plain), AttnError::OutOfBounds { arg: Arg::Documents, needed: 500, len: 499 }));
    assert!(matches!(with(docs(999, true), plain), AttnError::OutOfBounds { arg: Arg::Documents, needed: 1000, .. }));
    assert!(matches!(with(Some(DocsDesc { addr: BASE + 4, ..docs(500, false).unwrap() }), plain), AttnError::Misaligned { arg: Arg::Documents, .. }));
    assert!(matches!(with(Some(DocsDesc { addr: 0, ..docs(500, false).unwrap() }), plain), AttnError::Misaligned { arg: Arg::Documents, .. }));
    for opts in [plain.algo(Algo::Fa2), plain.algo(Algo::Fa3(Techniques::NO_OVERLAP)), plain.schedule(Schedule::PersistentMulticast)] {
        assert!(matches!(with(docs(500, false), opts), AttnError::Unsupported(_)), "{opts:?}");
    }
    // ALiBi with documents (with or without soft-capping) at every head dim: 64-key
    // blocks at hdim 128 and 256.
    for (opts, kernel, kernel256) in [
        (plain, "fa3_fwd_hdim128_bf16_n64_alibi_document", "fa3_fwd_hdim256_f16_n64_alibi_document"),
        (plain.softcap(30.0), "fa3_fwd_hdim128_bf16_n64_softcap_alibi_document", "fa3_fwd_hdim256_f16_n64_softcap_alibi_document"),
    ] {
        let mut c = Call::good();
        (c.documents, c.opts) = (docs(500, false), opts);
        c.alibi = Some(AlibiDesc { addr: BASE + (20 << 36), len: 8, per_batch: false });
        assert_eq!(c.plan().unwrap().kernel.name, kernel);
        let mut c = Call::shaped([1, 300, 2, 256], [1, 500, 2, 256], DType::F16);
        (c.documents, c.opts) = (docs(500, false), opts);
        c.alibi = Some(AlibiDesc { addr: BASE + (20 << 36), len: 2, per_batch: false });
        assert_eq!(c.plan().unwrap().kernel.name, kernel256, "{opts:?}");
    }
    // Queries sit at key positions: no more queries than keys.
    let mut c = Call::shaped([1, 600, 2, 128], [1, 500, 2, 128], DType::BF16);
    c.documents = docs(500, false);
    assert!(matches!(c.err(), AttnError::ShapeMismatch(m) if m.contains("seqlen_q <= seqlen_k")));
}

/// Document ids become each position's `[start, end)`; ids that come back after another
/// document, and empty documents, are refused.
#[test]
fn document_ids_become_bounds_and_scattered_documents_are_refused() {
    use flash_attn3::documents::{document_bounds, ids_from_lengths};
    assert_eq!(document_bounds(&[7, 7, 3, 9, 9, 9]).unwrap(), vec![[0, 2], [0, 2], [2, 3], [3, 6], [3, 6], [3, 6]]);
    assert_eq!(document_bounds(&[]).unwrap(), Vec::<[u32; 2]>::new());
    assert!(matches!(document_bounds(&[1, 2, 1]), Err(AttnError::InvalidDocuments(m)) if m.contains("id 1")));
    assert_eq!(ids_from_lengths(&[2, 1, 3]).unwrap(), vec![0, 0, 1, 2, 2, 2]);
    assert!(matches!(ids_from_lengths(&[2, 0]), Err(AttnError::InvalidDocuments(_))));
}
