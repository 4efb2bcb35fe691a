//! Every misuse of the backward API gets its own precise error, checked without a GPU
//! through the planner that `flash_attn_backward_into` runs before any launch; and a valid
//! call is planned as the kernels expect.
use common::bwd::{self, BwdStage, DqOrder};
use flash_attn3::plan_bwd::WorkspaceLayout;
use flash_attn3::plan::DeviceVec;
use flash_attn3::{Arg, AttnError, AttnOptions, BwdTensors, DType, Layout, TensorDesc, backward_workspace_bytes, plan_backward};

/// Each tensor of a call gets its own buffer, far apart.
fn packed(shape: [usize; 4], dtype: DType, buffer: u64) -> TensorDesc {
    let layout = Layout::contiguous(shape);
    TensorDesc { dtype, layout, addr: 0x7f00_0000_0000 + (buffer << 36), buffer_len: layout.numel() }
}

/// A valid call: q 2 x 300 x 8 x `d`, k/v 2 x 500 x 2 x `d` (GQA 4), bf16.
fn good(d: usize) -> BwdTensors {
    call([2, 300, 8, d], [2, 500, 2, d], DType::BF16)
}

/// A call with packed q, out, dout, dq of shape `qs` and k, v, dk, dv of shape `ks`, and
/// a workspace of the size it needs.
fn call(qs: [usize; 4], ks: [usize; 4], dt: DType) -> BwdTensors {
    BwdTensors {
        q: packed(qs, dt, 0),
        k: packed(ks, dt, 1),
        v: packed(ks, dt, 2),
        out: packed(qs, dt, 3),
        dout: packed(qs, dt, 4),
        lse: (0x7f00_0000_0000 + (5 << 36), qs[0] * qs[2] * qs[1]),
        dq: packed(qs, dt, 6),
        dk: packed(ks, dt, 7),
        dv: packed(ks, dt, 8),
        workspace: (0x7f00_0000_0000 + (9 << 36), backward_workspace_bytes(qs[0], qs[1], qs[2], qs[3])),
        alibi: None,
        sinks: None,
        dsinks: None,
        documents: None,
        variant: None,
    }
}

fn err(t: &BwdTensors, opts: &AttnOptions) -> AttnError {
    plan_backward(t, opts, 132).expect_err("this call must be rejected")
}

#[test]
fn a_valid_call_is_planned_as_three_launches_with_workspace_regions() {
    for d in [64, 128, 256] {
        let t = good(d);
        // Keys per CTA: 128, or 64 where the warpgroups split the head dimension. Query
        // rows per step: 128 in hdim 64's plain kernels, else 64.
        let bn = if d == 256 { 64 } else { 128 };
        let bm = if d == 64 { 128 } else { 64 };
        let plan = plan_backward(&t, &AttnOptions::default().causal(true), 132).unwrap();
        let stages: Vec<_> = plan.launches.iter().map(|l| l.kernel.kind).collect();
        assert_eq!(
            stages,
            [BwdStage::Preprocess, BwdStage::Main, BwdStage::Postprocess].map(common::KernelKind::Backward).to_vec()
        );
        // Main: one CTA per key block, K/V head and batch.
        assert_eq!(plan.launches[1].grid, (500u32.div_ceil(bn), 2, 2));
        assert_eq!(plan.launches[1].block, bwd::THREADS);
        assert!(plan.launches[1].smem_bytes <= common::fa3::MAX_SMEM);
        // Pre: every padded query row; post: every query row; the heads as x.
        assert_eq!(plan.launches[0].grid, (8, bwd::padded_rows(300, d as u32) / 64, 2));
        assert_eq!(plan.launches[2].grid, (8, 300u32.div_ceil(64), 2));
        let p = plan.params;
        let ws = WorkspaceLayout::new(2, 300, 8, d);
        assert_eq!(p.lse_log2 - t.workspace.0, ws.lse_log2 as u64);
        assert_eq!(p.dq_accum - t.workspace.0, ws.dq_accum as u64);
        assert_eq!(p.dq_semaphore, 0, "semaphores only in deterministic mode");
        assert_eq!((p.kv_group, p.causal, p.padded_rows), (4, 1, 300u32.div_ceil(bm) * bm));
        assert!((p.softmax_scale - 1.0 / (d as f32).sqrt()).abs() < 1e-7);
        assert_eq!(plan.tma[0].box_dims, [64, bm, d as u32 / 64, 1, 1], "q: a query block");
        assert_eq!(plan.launches[1].smem_bytes, bwd::SmemLayout::new(d as u32, bm).total);
        assert_eq!(plan.tma[1].box_dims, [64, bn, d as u32 / 64, 1, 1], "k: a key block");
        assert_eq!(p.dq_order, DqOrder::Unordered as u32);
        let det = plan_backward(&t, &AttnOptions::default().deterministic(true), 132).unwrap();
        assert_eq!(det.params.dq_semaphore - t.workspace.0, ws.semaphores as u64);
        assert_eq!(det.launches[1].kernel.kind, common::KernelKind::Backward(BwdStage::MainDeterministic));
        // 5 query blocks, 4 key blocks: the rotated order when all 4 CTAs of a head fit
        // (8 key blocks of 64 at hdim 256, and 3 query blocks of 128 at hdim 64: more key
        // blocks than query blocks, so descending).
        let rotated = if d == 128 { DqOrder::Rotated } else { DqOrder::Descending };
        assert_eq!(det.params.dq_order, rotated as u32);
        let few_sms = plan_backward(&t, &AttnOptions::default().deterministic(true), 3).unwrap();
        assert_eq!(few_sms.params.dq_order, DqOrder::Descending as u32);
        let causal = plan_backward(&t, &AttnOptions::default().deterministic(true).causal(true), 132).unwrap();
        assert_eq!(causal.params.dq_order, DqOrder::Descending as u32);
        // A score modification: 64-row steps at every head dim; a window: the plain
        // kernels' steps (128 rows at hdim 64); the same workspace (its padding fits both).
        for (opts, rows) in [(AttnOptions::default().softcap(30.0), 64), (AttnOptions::default().window(Some(50), Some(0)), bm)] {
            let plan = plan_backward(&t, &opts, 132).unwrap();
            assert_eq!(plan.tma[0].box_dims, [64, rows, d as u32 / 64, 1, 1], "q: {rows} query rows");
            assert_eq!(plan.launches[1].smem_bytes, bwd::SmemLayout::new(d as u32, rows).total);
            assert_eq!(plan.params.padded_rows, p.padded_rows);
        }
    }
}

#[test]
fn aux_grids_stay_within_the_y_limit_at_millions_of_query_rows() {
    // 5M query rows are 81920 row blocks: grid y is capped at 65535 and the kernels
    // stride over the rest (`kernels_gpu::bwd::preprocess::row_blocks`).
    let t = call([1, 5 << 20, 1, 64], [1, 256, 1, 64], DType::F16);
    let plan = plan_backward(&t, &AttnOptions::default(), 132).unwrap();
    for l in [plan.launches[0], plan.launches[2]] {
        assert_eq!(l.grid, (1, 65535, 1));
    }
}

#[test]
fn hdim_96_is_refused_with_the_head_dims_that_work() {
    let t = good(96);
    assert!(matches!(err(&t, &AttnOptions::default()), AttnError::UnsupportedHeadDim { hdim: 96, supported } if supported == [64, 128, 256]));
}

#[test]
fn each_argument_of_the_wrong_shape_is_named() {
    let cases: [(fn(&mut BwdTensors), &str); 6] = [
        (|t| t.v = packed([2, 501, 2, 64], DType::BF16, 2), "v must have k's shape"),
        (|t| t.out = packed([2, 301, 8, 64], DType::BF16, 3), "out must have q's shape"),
        (|t| t.dout = packed([2, 300, 4, 64], DType::BF16, 4), "dout must have q's shape"),
        (|t| t.dq = packed([1, 300, 8, 64], DType::BF16, 6), "dq must have q's shape"),
        (|t| t.dk = packed([2, 500, 1, 64], DType::BF16, 7), "dk must have k's shape"),
        (|t| t.dv = packed([2, 499, 2, 64], DType::BF16, 8), "dv must have k's shape"),
    ];
    for (break_it, want) in cases {
        let mut t = good(64);
        break_it(&mut t);
        match err(&t, &AttnOptions::default()) {
            AttnError::ShapeMismatch(m) => assert!(m.contains(want), "{m} (wanted {want})"),
            e => panic!("{want}: got {e:?}"),
        }
    }
}

#[test]
fn each_argument_of_the_wrong_dtype_is_named() {
    for arg in [Arg::Out, Arg::DOut, Arg::Dq, Arg::Dk, Arg::Dv] {
        let mut t = good(64);
        let d = match arg {
            Arg::Out => &mut t.out,
            Arg::DOut => &mut t.dout,
            Arg::Dq => &mut t.dq,
            Arg::Dk => &mut t.dk,
            _ => &mut t.dv,
        };
        d.dtype = DType::F16;
        assert!(
            matches!(err(&t, &AttnOptions::default()), AttnError::ArgDType { arg: a, expected: DType::BF16, got: DType::F16 } if a == arg),
            "{arg}"
        );
    }
}

#[test]
fn a_short_lse_or_workspace_and_a_misaligned_workspace_are_refused() {
    let mut t = good(128);
    t.lse.1 -= 1;
    assert!(matches!(err(&t, &AttnOptions::default()), AttnError::OutOfBounds { arg: Arg::Lse, .. }));
    let mut t = good(128);
    t.workspace.1 -= 1;
    assert!(matches!(err(&t, &AttnOptions::default()), AttnError::OutOfBounds { arg: Arg::Workspace, needed, .. } if needed == t.workspace.1 + 1));
    let mut t = good(128);
    t.workspace.0 += 16;
    assert!(matches!(err(&t, &AttnOptions::default()), AttnError::Misaligned { arg: Arg::Workspace, .. }));
}

#[test]
fn gradients_that_overlap_an_input_or_each_other_are_refused() {
    let mut t = good(64);
    t.dq.addr = t.q.addr;
    assert!(matches!(err(&t, &AttnOptions::default()), AttnError::Overlap { arg: Arg::Dq, other: Arg::Q }));
    let mut t = good(64);
    t.dv.addr = t.dk.addr + 64;
    assert!(matches!(err(&t, &AttnOptions::default()), AttnError::Overlap { arg: Arg::Dk, other: Arg::Dv }));
}

#[test]
fn a_bad_scale_is_refused() {
    for s in [f32::NAN, f32::INFINITY, -0.5] {
        assert!(matches!(err(&good(64), &AttnOptions::default().softmax_scale(s)), AttnError::InvalidScale(_)), "{s}");
    }
}

#[test]
fn strided_gradients_with_a_non_contiguous_head_dim_are_refused() {
    let mut t = good(64);
    t.dk.layout.strides[3] = 2;
    t.dk.buffer_len *= 2;
    assert!(matches!(err(&t, &AttnOptions::default()), AttnError::NonContiguousLastDim { arg: Arg::Dk, stride: 2 }));
}

#[test]
fn softcap_backward_uses_the_soft_capping_main_kernel_and_keeps_the_gradient_scale() {
    for d in [64, 128] {
        let t = good(d);
        for det in [false, true] {
            let plan = plan_backward(&t, &AttnOptions::default().softcap(20.0).deterministic(det), 132).unwrap();
            let main = plan.launches[1].kernel;
            assert_eq!(main.score_mod, common::ScoreModKind::Softcap);
            assert!(main.name.ends_with("_softcap"), "{}", main.name);
            // Pre- and postprocess serve every variant.
            assert_eq!(plan.launches[0].kernel.score_mod, common::ScoreModKind::None);
            let p = plan.params;
            let scale = 1.0 / (d as f32).sqrt();
            assert_eq!(p.softmax_scale, scale, "dQ and dK keep the call's scale");
            assert!((p.scale_log2 - 20.0 * std::f32::consts::LOG2_E).abs() < 1e-5);
            assert!((p.softcap_scale - scale / 20.0).abs() < 1e-9);
        }
        assert!(matches!(err(&t, &AttnOptions::default().softcap(-1.0)), AttnError::InvalidSoftcap(_)));
        assert!(matches!(err(&t, &AttnOptions::default().softcap(f32::NAN)), AttnError::InvalidSoftcap(_)));
    }
}

#[test]
fn alibi_backward_uses_the_alibi_main_kernel_and_checks_its_slopes() {
    for d in [64, 128] {
        let mut t = good(d);
        t.alibi = Some(flash_attn3::AlibiDesc { addr: 0x7f00_0000_0000 + (10 << 36), len: 8, per_batch: false });
        let plan = plan_backward(&t, &AttnOptions::default(), 132).unwrap();
        assert_eq!(plan.launches[1].kernel.score_mod, common::ScoreModKind::Alibi);
        assert_eq!(plan.params.alibi_slopes, t.alibi.unwrap().addr);
        t.alibi = Some(flash_attn3::AlibiDesc { len: 7, ..t.alibi.unwrap() });
        assert!(matches!(err(&t, &AttnOptions::default()), AttnError::OutOfBounds { arg: Arg::AlibiSlopes, .. }));
    }
}

#[test]
fn a_window_backward_uses_the_local_main_kernel_and_never_the_rotated_order() {
    for d in [64, 128] {
        let t = good(d);
        let opts = AttnOptions::default().window(Some(100), Some(20));
        let plan = plan_backward(&t, &opts, 132).unwrap();
        assert_eq!(plan.launches[1].kernel.mask, common::MaskKind::Local);
        assert_eq!(plan.launches[0].kernel.mask, common::MaskKind::Causal, "the preprocess serves every mask");
        assert_eq!((plan.params.window.left, plan.params.window.right), (100, 20));
        // Without the window this call gets the rotated order (see above); with it, the
        // CTAs of a key block see a range of query blocks that the rotation would leave.
        let det = plan_backward(&t, &opts.deterministic(true), 132).unwrap();
        assert_eq!(det.params.dq_order, DqOrder::Descending as u32);
        assert_eq!(det.launches[1].kernel.kind, common::KernelKind::Backward(BwdStage::MainDeterministic));
        assert_eq!(det.launches[1].kernel.mask, common::MaskKind::Local);
        let causal = plan_backward(&t, &AttnOptions::default().causal(true).window(Some(30), None), 132).unwrap();
        assert_eq!((causal.params.window.left, causal.params.window.right), (30, 0));
        // good(): 300 queries, 500 keys (4 key blocks). Key block n sees queries
        // n·128 − 200 − 20 ..= n·128 + 127 − 200 + 100: block 2 alone is unclipped.
        // Only hdim 128's kernels reorder; the deterministic mode keeps the grid's order.
        assert_eq!(plan.params.full_key_blocks, if d == 128 { [2, 3] } else { [0, 4] });
        assert_eq!(det.params.full_key_blocks, [0, 4]);
    }
}

#[test]
fn sinks_gradient_is_checked_and_gets_its_workspace() {
    let vec_at = |buffer: u64, len| Some(DeviceVec { addr: 0x7f00_0000_0000 + (buffer << 36), len });
    let mut t = good(128);
    t.sinks = vec_at(10, 8);
    t.dsinks = vec_at(11, 8);
    let plan = plan_backward(&t, &AttnOptions::default(), 132).unwrap();
    let ws = WorkspaceLayout::new(2, 300, 8, 128);
    assert_eq!((plan.params.sinks, plan.params.dsinks), (t.sinks.unwrap().addr, t.dsinks.unwrap().addr));
    assert_eq!(plan.params.sink_partials - t.workspace.0, ws.sink_partials as u64);
    // One f32 per (batch, head, preprocess block of 64 rows, warp) fits in the workspace.
    let partials = 2 * 8 * bwd::padded_rows(300, 128).div_ceil(bwd::PREPROCESS_ROWS) as usize * (bwd::AUX_THREADS / 32) as usize * 4;
    assert!(ws.sink_partials + partials <= ws.bytes);
    // Sinks without their gradient: dQ, dK, dV only (the LSE holds the sinks).
    let mut t2 = good(128);
    t2.sinks = vec_at(10, 8);
    assert_eq!(plan_backward(&t2, &AttnOptions::default(), 132).unwrap().params.sinks, 0);
    let mut t3 = good(128);
    t3.dsinks = vec_at(11, 8);
    assert!(matches!(err(&t3, &AttnOptions::default()), AttnError::Unsupported(_)), "dsinks without sinks");
    let mut t4 = good(128);
    t4.sinks = vec_at(10, 8);
    t4.dsinks = vec_at(11, 7);
    assert!(matches!(err(&t4, &AttnOptions::default()), AttnError::OutOfBounds { arg: Arg::DSinks, needed: 8, len: 7 }));
}

/// Documents reach the backward's document kernels, deterministic or not, and what does
/// not fit the call is refused as in the forward.
#[test]
fn documents_pick_the_backward_document_kernels() {
    let docs = flash_attn3::DocsDesc { addr: 0x7f00_0000_0000 + (23 << 36), positions: 500, seqlen: 500, per_batch: false };
    for (deterministic, name) in [(false, "bwd_hdim128_bf16_document"), (true, "bwd_hdim128_bf16_deterministic_document")] {
        let t = BwdTensors { documents: Some(docs), ..good(128) };
        let plan = plan_backward(&t, &AttnOptions::default().causal(true).deterministic(deterministic), 132).unwrap();
        assert_eq!(plan.launches[1].kernel.name, name);
        assert_eq!(plan.params.docs.addr, docs.addr);
    }
    let t = BwdTensors { documents: Some(flash_attn3::DocsDesc { seqlen: 400, ..docs }), ..good(128) };
    assert!(matches!(err(&t, &AttnOptions::default()), AttnError::ShapeMismatch(_)));
    // With ALiBi (soft-capped or not, deterministic or not) at every head dim.
    let alibi = Some(flash_attn3::AlibiDesc { addr: 0x7f00_0000_0000 + (24 << 36), len: 8, per_batch: false });
    let (plain, softcap) = (AttnOptions::default(), AttnOptions::default().softcap(10.0));
    for (hdim, opts, name) in [
        (128, plain, "bwd_hdim128_bf16_alibi_document"),
        (128, plain.deterministic(true), "bwd_hdim128_bf16_deterministic_alibi_document"),
        (128, softcap, "bwd_hdim128_bf16_softcap_alibi_document"),
        (128, softcap.deterministic(true), "bwd_hdim128_bf16_deterministic_softcap_alibi_document"),
        (64, plain.deterministic(true), "bwd_hdim64_bf16_deterministic_alibi_document"),
        (64, softcap, "bwd_hdim64_bf16_softcap_alibi_document"),
        (256, plain, "bwd_hdim256_bf16_alibi_document"),
        (256, softcap.deterministic(true), "bwd_hdim256_bf16_deterministic_softcap_alibi_document"),
    ] {
        let t = BwdTensors { documents: Some(docs), alibi, ..good(hdim) };
        assert_eq!(plan_backward(&t, &opts, 132).unwrap().launches[1].kernel.name, name);
    }
    for (hdim, name) in [(64, "bwd_hdim64_bf16_softcap_document"), (128, "bwd_hdim128_bf16_softcap_document")] {
        let t = BwdTensors { documents: Some(docs), ..good(hdim) };
        let plan = plan_backward(&t, &AttnOptions::default().softcap(10.0), 132).unwrap();
        assert_eq!(plan.launches[1].kernel.name, name);
    }
}

#[test]
fn hdim_256_variants_pick_their_split_main_kernels() {
    let t = good(256);
    for (opts, name) in [
        (AttnOptions::default().causal(true), "bwd_hdim256_bf16"),
        (AttnOptions::default().softcap(20.0).deterministic(true), "bwd_hdim256_bf16_deterministic_softcap"),
        (AttnOptions::default().window(Some(100), Some(0)), "bwd_hdim256_bf16_local"),
    ] {
        let plan = plan_backward(&t, &opts, 132).unwrap();
        assert_eq!(plan.launches[1].kernel.name, name);
        assert_eq!(plan.launches[1].grid.0, 500u32.div_ceil(64), "64-key blocks");
    }
}
