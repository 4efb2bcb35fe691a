//! Validation and launch planning of the backward pass: pure functions of shapes,
//! strides, dtypes and addresses, so every misuse is caught (and tested) without a GPU.
use crate::error::{Arg, AttnError, Result};
use crate::plan::{MAX_GRID_YZ, DeviceVec, AlibiDesc, AttnOptions, TensorDesc, ScoreModParams, check_lse_scale_and_sizes, check_tensor, strides, variant_args};
use crate::tma::TensorMapSpec;
use common::bwd::{self, BwdParams, BwdStage, DqOrder};
use common::{KernelEntry, MaskKind, ScoreModKind};
use crate::documents::DocsDesc;
use crate::variant::VariantDesc;

/// Alignment of each region of the workspace.
const REGION_ALIGN: usize = 256;

/// Where the backward's scratch lives inside a workspace buffer (byte offsets), and how
/// big the buffer must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkspaceLayout {
    /// f32 LSE times log2 e, `[batch, heads_q, padded_rows]`.
    pub lse_log2: usize,
    /// f32 `D = rowsum(dO ∘ O)`, same shape.
    pub dpsum: usize,
    /// f32 dQ accumulator, `[batch, heads_q, padded_rows, hdim]`.
    pub dq_accum: usize,
    /// u32 per (batch, head, query block): the deterministic mode's turn counters.
    pub semaphores: usize,
    /// f32 per (batch, head, preprocess block, warp): partial sums of the sinks' gradient.
    pub sink_partials: usize,
    /// Bytes in all.
    pub bytes: usize,
}

impl WorkspaceLayout {
    /// The layout for q of shape `[batch, seqlen_q, heads_q, hdim]` (hdim 64, 128 or 256).
    pub fn new(batch: usize, seqlen_q: usize, heads_q: usize, hdim: usize) -> Self {
        let up = |x: usize| x.div_ceil(REGION_ALIGN) * REGION_ALIGN;
        let padded = bwd::padded_rows(seqlen_q as u32, hdim as u32) as usize;
        let vector = up(batch * heads_q * padded * 4);
        let accum = up(batch * heads_q * padded * hdim * 4);
        let semaphores = up(batch * heads_q * seqlen_q.div_ceil(bwd::ACCUM_ROWS as usize) * 4);
        let partials = up(batch * heads_q * bwd::sink_partials_per_head(padded as u32) as usize * 4);
        let sink_partials = 2 * vector + accum + semaphores;
        WorkspaceLayout {
            lse_log2: 0,
            dpsum: vector,
            dq_accum: 2 * vector,
            semaphores: 2 * vector + accum,
            sink_partials,
            bytes: sink_partials + partials,
        }
    }
}

/// Bytes of workspace a backward call on q of shape `[batch, seqlen_q, heads_q, hdim]`
/// needs (pass at least this much to [`crate::flash_attn_backward_into`]).
pub fn backward_workspace_bytes(batch: usize, seqlen_q: usize, heads_q: usize, hdim: usize) -> usize {
    WorkspaceLayout::new(batch, seqlen_q, heads_q, hdim).bytes
}

/// One launch of the backward.
#[derive(Clone, Copy, Debug)]
pub struct Launch {
    /// The kernel.
    pub kernel: &'static KernelEntry,
    /// Grid, in CTAs.
    pub grid: (u32, u32, u32),
    /// Threads per CTA.
    pub block: u32,
    /// Dynamic shared memory, bytes.
    pub smem_bytes: u32,
}

/// A checked backward call: its three launches, their shared parameter block, and the
/// main kernel's tensor maps (q, k, v, dout).
#[derive(Clone, Copy, Debug)]
pub struct BwdPlan {
    /// Preprocess, main, postprocess, in order.
    pub launches: [Launch; 3],
    /// The parameter block (device addresses filled in).
    pub params: BwdParams,
    /// The main kernel's TMA maps.
    pub tma: [TensorMapSpec; 4],
}

/// The tensors of a backward call, as validation sees them.
#[derive(Clone, Copy, Debug)]
pub struct BwdTensors {
    /// The forward's queries.
    pub q: TensorDesc,
    /// The forward's keys.
    pub k: TensorDesc,
    /// The forward's values.
    pub v: TensorDesc,
    /// The forward's output O.
    pub out: TensorDesc,
    /// The gradient of the loss with respect to O.
    pub dout: TensorDesc,
    /// The forward's LSE: (device address, elements).
    pub lse: (u64, usize),
    /// The gradient outputs for q, k and v.
    pub dq: TensorDesc,
    /// See [`BwdTensors::dq`].
    pub dk: TensorDesc,
    /// See [`BwdTensors::dq`].
    pub dv: TensorDesc,
    /// Scratch: (device address, bytes).
    pub workspace: (u64, usize),
    /// ALiBi slopes, when the call has them.
    pub alibi: Option<AlibiDesc>,
    /// The attention sinks' logits (`[heads_q]`), if the forward had them.
    pub sinks: Option<DeviceVec>,
    /// Where to write the sinks' gradient (`[heads_q]` f32); only with `sinks`.
    pub dsinks: Option<DeviceVec>,
    /// The forward's document mask, if it had one.
    pub documents: Option<DocsDesc>,
    /// The buffer of the forward's user-defined variant (`AttnOptions::variant`), if it
    /// had one with data.
    pub variant: Option<VariantDesc>,
}

/// Validates a backward call and plans its launches on a GPU with `sm_count` SMs (the
/// deterministic mode's order of dQ additions depends on how many CTAs are resident at
/// once: [`common::bwd::DqOrder`]).
pub fn plan_backward(t: &BwdTensors, opts: &AttnOptions, sm_count: u32) -> Result<BwdPlan> {
    let dtype = t.q.dtype;
    if t.k.dtype != dtype || t.v.dtype != dtype {
        return Err(AttnError::DTypeMismatch { q: dtype, k: t.k.dtype, v: t.v.dtype });
    }
    for (arg, d) in [(Arg::Out, &t.out), (Arg::DOut, &t.dout), (Arg::Dq, &t.dq), (Arg::Dk, &t.dk), (Arg::Dv, &t.dv)] {
        if d.dtype != dtype {
            return Err(AttnError::ArgDType { arg, expected: dtype, got: d.dtype });
        }
    }
    let all = [
        (Arg::Q, &t.q),
        (Arg::K, &t.k),
        (Arg::V, &t.v),
        (Arg::Out, &t.out),
        (Arg::DOut, &t.dout),
        (Arg::Dq, &t.dq),
        (Arg::Dk, &t.dk),
        (Arg::Dv, &t.dv),
    ];
    for (arg, d) in all {
        check_tensor(arg, d)?;
    }
    let [batch, seqlen_q, heads_q, hdim] = t.q.layout.shape;
    let [batch_k, seqlen_k, heads_k, hdim_k] = t.k.layout.shape;
    if batch_k != batch {
        return Err(AttnError::ShapeMismatch(format!("q has batch {batch}, k has {batch_k}")));
    }
    if hdim_k != hdim {
        return Err(AttnError::ShapeMismatch(format!("q has head dim {hdim}, k/v have {hdim_k}")));
    }
    for (arg, d, want) in [
        (Arg::V, &t.v, t.k.layout.shape),
        (Arg::Out, &t.out, t.q.layout.shape),
        (Arg::DOut, &t.dout, t.q.layout.shape),
        (Arg::Dq, &t.dq, t.q.layout.shape),
        (Arg::Dk, &t.dk, t.k.layout.shape),
        (Arg::Dv, &t.dv, t.k.layout.shape),
    ] {
        if d.layout.shape != want {
            let of = if matches!(arg, Arg::V | Arg::Dk | Arg::Dv) { "k" } else { "q" };
            return Err(AttnError::ShapeMismatch(format!("{arg} must have {of}'s shape {want:?}, got {:?}", d.layout.shape)));
        }
    }
    if !bwd::HEAD_DIMS.contains(&(hdim as u32)) {
        return Err(AttnError::UnsupportedHeadDim { hdim, supported: &bwd::HEAD_DIMS });
    }
    if heads_q % heads_k != 0 {
        return Err(AttnError::HeadsNotDivisible { heads_q, heads_k });
    }
    let scale = check_lse_scale_and_sizes(t.lse, t.q.layout.shape, seqlen_k, opts)?;
    let ws = WorkspaceLayout::new(batch, seqlen_q, heads_q, hdim);
    if t.workspace.1 < ws.bytes {
        return Err(AttnError::OutOfBounds { arg: Arg::Workspace, needed: ws.bytes, len: t.workspace.1 });
    }
    if t.workspace.0 % REGION_ALIGN as u64 != 0 {
        return Err(AttnError::Misaligned {
            arg: Arg::Workspace,
            detail: format!("address {:#x} is not {REGION_ALIGN}-byte aligned", t.workspace.0),
        });
    }
    // Outputs must not overlap anything else the call reads or writes: the kernels would
    // read what they are overwriting.
    check_disjoint(&all)?;
    let score_mod = opts.score_mod(t.alibi.is_some())?;
    let mask_plan = opts.mask(batch, seqlen_q, seqlen_k, t.documents, score_mod)?;
    let mask = mask_plan.kind;
    let find = |stage: BwdStage| {
        let found = if score_mod == ScoreModKind::User && stage.is_main() {
            common::variant::find_backward(hdim as u32, dtype, stage == BwdStage::MainDeterministic, opts.block_mask.is_some())
        } else {
            bwd::find(stage, hdim as u32, dtype, score_mod, mask)
        };
        found.ok_or_else(|| {
            let with = match (score_mod, mask) {
                (ScoreModKind::None, MaskKind::Causal) => String::new(),
                _ => format!(" with {score_mod:?} and {mask:?}"),
            };
            AttnError::Unsupported(format!("no backward kernel for hdim {hdim} {}{with}", dtype.name()))
        })
    };
    let main_stage = if opts.deterministic { BwdStage::MainDeterministic } else { BwdStage::Main };
    let (pre, main, post) = (find(BwdStage::Preprocess)?, find(main_stage)?, find(BwdStage::Postprocess)?);
    let padded = bwd::padded_rows(seqlen_q as u32, hdim as u32);
    let ws_addr = t.workspace.0;
    let block_n = bwd::block_n(hdim as u32);
    let key_blocks = (seqlen_k as u32).div_ceil(block_n);
    let mut params = BwdParams {
        q: t.q.addr,
        k: t.k.addr,
        v: t.v.addr,
        o: t.out.addr,
        dout: t.dout.addr,
        lse: t.lse.0,
        dq: t.dq.addr,
        dk: t.dk.addr,
        dv: t.dv.addr,
        lse_log2: ws_addr + ws.lse_log2 as u64,
        dpsum: ws_addr + ws.dpsum as u64,
        dq_accum: ws_addr + ws.dq_accum as u64,
        dq_semaphore: if opts.deterministic { ws_addr + ws.semaphores as u64 } else { 0 },
        dq_order: DqOrder::choose(
            opts.deterministic,
            opts.causal || mask.is_local(),
            (seqlen_q as u32).div_ceil(bwd::entry_block_m(main)),
            key_blocks,
            sm_count,
        ) as u32,
        q_strides: strides(&t.q.layout),
        k_strides: strides(&t.k.layout),
        v_strides: strides(&t.v.layout),
        o_strides: strides(&t.out.layout),
        dout_strides: strides(&t.dout.layout),
        dq_strides: strides(&t.dq.layout),
        dk_strides: strides(&t.dk.layout),
        dv_strides: strides(&t.dv.layout),
        batch: batch as u32,
        heads_q: heads_q as u32,
        heads_k: heads_k as u32,
        kv_group: (heads_q / heads_k) as u32,
        seqlen_q: seqlen_q as u32,
        seqlen_k: seqlen_k as u32,
        padded_rows: padded,
        hdim: hdim as u32,
        scale_log2: scale * std::f32::consts::LOG2_E,
        softmax_scale: scale,
        causal: opts.causal as u32,
        softcap_scale: 0.0,
        alibi_slopes: 0,
        alibi_batch_stride: 0,
        alibi_inv_scale: 0.0,
        window: mask_plan.window,
        docs: mask_plan.docs,
        sinks: 0,
        dsinks: 0,
        sink_partials: 0,
        variant: Default::default(),
        block_mask: Default::default(),
        // The kernels that reorder their CTAs launch a window's full key blocks first,
        // so that the shorter ones end the grid (`bwd::cta_block`).
        full_key_blocks: if bwd::reorders_ctas(hdim as u32, opts.deterministic, mask == MaskKind::Local) {
            bwd::full_key_blocks(mask_plan.window, seqlen_q as u32, seqlen_k as u32, block_n)
        } else {
            [0, key_blocks]
        },
    };
    match (t.sinks, t.dsinks) {
        (Some(s), Some(d)) => {
            s.check(Arg::Sinks, heads_q)?;
            d.check(Arg::DSinks, heads_q)?;
            params.sinks = s.addr;
            params.dsinks = d.addr;
            params.sink_partials = ws_addr + ws.sink_partials as u64;
        }
        // The forward's LSE holds the sinks: dQ, dK and dV need nothing more.
        (_, None) => {}
        (None, Some(_)) => return Err(AttnError::Unsupported("dsinks without sinks: the call has no sinks to differentiate".into())),
    }
    // As the forward's; dQ and dK keep the call's `softmax_scale` (with soft-capping the
    // logits' derivative is scale · (1 − tanh²)).
    let m = ScoreModParams::new(score_mod, opts.softcap, t.alibi, batch, heads_q, scale)?;
    (params.softcap_scale, params.scale_log2) = (m.softcap_scale, m.scale_log2);
    (params.alibi_slopes, params.alibi_batch_stride, params.alibi_inv_scale) = (m.alibi_slopes, m.alibi_batch_stride, m.alibi_inv_scale);
    params.variant = variant_args(opts, t.variant)?;
    let block_mask = opts.block_mask_args(t.variant, [batch, seqlen_q, seqlen_k, heads_q, heads_k, hdim])?;
    if main.mask == MaskKind::Sparse {
        params.block_mask = block_mask;
    }
    let (b, hq, hk) = (batch as u32, heads_q as u32, heads_k as u32);
    // The aux kernels take the heads as x and stride over the row blocks in y
    // (`kernels_gpu::bwd::preprocess::row_blocks`).
    let aux = |kernel, rows: u32| {
        let y = rows.div_ceil(bwd::PREPROCESS_ROWS).min(MAX_GRID_YZ as u32);
        Launch { kernel, grid: (hq, y, b), block: bwd::AUX_THREADS, smem_bytes: 0 }
    };
    let launches = [
        aux(pre, padded),
        Launch {
            kernel: main,
            grid: {
                // Block-sparse kernels take the heads as x (`kernels_gpu::bwd::bwd`).
                if main.mask == MaskKind::Sparse { (hk, key_blocks, b) } else { (key_blocks, hk, b) }
            },
            block: bwd::THREADS,
            smem_bytes: bwd::SmemLayout::new(hdim as u32, bwd::entry_block_m(main)).total,
        },
        aux(post, seqlen_q as u32),
    ];
    let chunks = hdim as u32 / 64;
    let block_m = bwd::entry_block_m(main);
    let map = |arg, d: &TensorDesc, rows| TensorMapSpec::bshd(arg, d.dtype, d.addr, &d.layout, rows, chunks);
    let tma = [
        map(Arg::Q, &t.q, block_m)?,
        map(Arg::K, &t.k, block_n)?,
        map(Arg::V, &t.v, block_n)?,
        map(Arg::DOut, &t.dout, block_m)?,
    ];
    Ok(BwdPlan { launches, params, tma })
}

/// The byte range a strided view spans inside its buffer.
fn span(d: &TensorDesc) -> (u64, u64) {
    let bytes = d.layout.extent().unwrap_or(0) as u64 * 2;
    (d.addr, d.addr + bytes)
}

/// No gradient output overlaps another argument (outputs are written while inputs are
/// read, and two outputs would overwrite each other).
fn check_disjoint(all: &[(Arg, &TensorDesc)]) -> Result<()> {
    for (i, (a, da)) in all.iter().enumerate() {
        if !matches!(a, Arg::Dq | Arg::Dk | Arg::Dv) {
            continue;
        }
        let (a0, a1) = span(da);
        for (j, (b, db)) in all.iter().enumerate() {
            let (b0, b1) = span(db);
            if i != j && a0 < b1 && b0 < a1 {
                return Err(AttnError::Overlap { arg: *a, other: *b });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_regions_are_aligned_and_disjoint() {
        let w = WorkspaceLayout::new(3, 1000, 5, 128);
        let padded = 1024;
        assert_eq!(w.dpsum - w.lse_log2, (3 * 5 * padded * 4usize).div_ceil(256) * 256);
        assert!(w.dq_accum >= w.dpsum + 3 * 5 * padded * 4);
        assert!(w.semaphores >= w.dq_accum + 3 * 5 * padded * 128 * 4);
        assert!(w.bytes >= w.semaphores + 3 * 5 * 16 * 4);
        for off in [w.lse_log2, w.dpsum, w.dq_accum, w.semaphores, w.bytes] {
            assert_eq!(off % 256, 0);
        }
    }
}
