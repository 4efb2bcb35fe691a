//! GPU tests of the backward: dQ, dK, dV against the exact f64 gradients under
//! FlashAttention's rule (max error <= 2 x the naive low-precision backward's + one ulp
//! of 0.3, [`flash_attn3::check::grad_slack`]), on fresh random inputs at awkward sizes,
//! GQA/MQA, causal with seqlen_q != seqlen_k (rows that see no key), strided outputs with
//! NaN in their gaps, gradients poisoned with NaN before each launch, inputs never
//! modified, and the deterministic mode bit-identical across launches and streams.
//!
//! Without a usable GPU every test is reported as ignored and the reason is printed.
use cudarc::driver::CudaStream;
use flash_attn3::check::{check_backward, check_sink_grads};
use flash_attn3::reference::backward::Grads as HostGrads;
use flash_attn3::reference::{HostAlibi, HostDocs, HostTensor, Problem, Window, rng};
use flash_attn3::{
    AttnError, AttnOptions, DType, DeviceTensor, DocumentMask, Gpu, Layout, backward_workspace_bytes, flash_attn_backward_into,
    flash_attn_func,
};
use libtest_mimic::{Arguments, Failed, Trial};
use std::sync::Arc;
use support::{bits, padded, transposed};

mod support;

#[derive(Clone, Debug)]
struct Case {
    dtype: DType,
    d: usize,
    b: usize,
    sq: usize,
    sk: usize,
    hq: usize,
    hk: usize,
    causal: bool,
    /// q and dout stored `[b, h, s, d]`, k/v and the gradients with padded rows and heads
    /// (NaN in every gap).
    strided: bool,
    deterministic: bool,
    /// Soft-capping at this cap (the soft-capping kernels, forward and backward).
    softcap: Option<f32>,
    /// ALiBi, slopes per head (`Some(false)`) or per (batch, head) (`Some(true)`).
    alibi: Option<bool>,
    /// A sliding window (left, right).
    window: Option<(Option<usize>, Option<usize>)>,
    /// Attention sinks ([`support::sink_logits`]), and their gradient checked.
    sinks: bool,
    /// Packed documents of these lengths (cycled), one packing per batch element (`true`)
    /// or one shared.
    docs: Option<(&'static [usize], bool)>,
}

impl Case {
    fn base(dtype: DType, d: usize, causal: bool) -> Self {
        Case { dtype, d, b: 2, sq: 1, sk: 1, hq: 3, hk: 3, causal, strided: false, deterministic: false, softcap: None, alibi: None, window: None, sinks: false, docs: None }
    }

    fn name(&self) -> String {
        format!(
            "bwd_{}_d{}_b{}_sq{}_sk{}_h{}-{}_{}{}{}{}{}",
            self.dtype.name(),
            self.d,
            self.b,
            self.sq,
            self.sk,
            self.hq,
            self.hk,
            if self.causal { "causal" } else { "full" },
            if self.strided { "_strided" } else { "" },
            if self.deterministic { "_deterministic" } else { "" },
            support::variant_suffix(self.softcap.is_some(), self.alibi, self.window, self.sinks),
            support::docs_suffix(self.docs),
        )
    }
}

/// The case's window, as the API and the reference take it.
fn window_of(c: &Case) -> Option<Window> {
    c.window.map(|(left, right)| Window { left, right })
}

fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for dtype in DType::ALL {
        for d in [64, 128, 256] {
            for causal in [false, true] {
                let base = Case::base(dtype, d, causal);
                for s in [1, 17, 1000] {
                    v.push(Case { sq: s, sk: s, ..base.clone() });
                }
                // seqlen_q != seqlen_k both ways (rows without keys when causal), GQA 4 and MQA.
                v.push(Case { sq: 300, sk: 1000, hq: 8, hk: 2, ..base.clone() });
                v.push(Case { sq: 1000, sk: 300, hq: 4, hk: 1, ..base.clone() });
            }
        }
    }
    for d in [64, 128, 256] {
        for causal in [false, true] {
            let base = Case::base(DType::BF16, d, causal);
            v.push(Case { sq: 333, sk: 257, hq: 4, hk: 2, strided: true, ..base.clone() });
            let base = Case::base(DType::F16, d, causal);
            v.push(Case { sq: 700, sk: 1000, hq: 4, hk: 2, deterministic: true, ..base });
        }
    }
    for d in [128, 256] {
        let base = Case::base(DType::F16, d, true);
        v.push(Case { b: 1, sq: 4097, sk: 4097, hq: 2, hk: 2, ..base });
    }
    // hdim 256 (the warpgroups split the head dimension): the deterministic kernel where
    // every CTA waits its turn at every block (no mask, more key blocks than fit the
    // rotated order's rule), and sinks with their gradient.
    for causal in [false, true] {
        let base = Case::base(DType::BF16, 256, causal);
        v.push(Case { sq: 200, sk: 2000, hq: 2, hk: 1, deterministic: true, ..base.clone() });
        v.push(Case { sq: 300, sk: 1000, hq: 8, hk: 2, sinks: true, ..base.clone() });
        v.push(Case { b: 3, sq: 700, sk: 1000, hq: 4, hk: 2, deterministic: true, sinks: true, ..base });
    }
    // ALiBi (standard slopes; per (batch, head) when causal) and soft-capping at 1.5 (the
    // logits saturate), each on the same shapes: both dtypes, head dims and masks, GQA and
    // rows without keys, strided, and the deterministic kernels.
    for dtype in DType::ALL {
        for d in [64, 128, 256] {
            for causal in [false, true] {
                for (softcap, alibi) in [(None, Some(causal)), (Some(1.5), None)] {
                    let base = Case { softcap, alibi, ..Case::base(dtype, d, causal) };
                    v.push(Case { sq: 17, sk: 17, ..base.clone() });
                    v.push(Case { sq: 1000, sk: 300, hq: 4, hk: 1, ..base.clone() });
                    v.push(Case { sq: 300, sk: 1000, hq: 8, hk: 2, strided: true, ..base.clone() });
                    if dtype == DType::F16 {
                        v.push(Case { sq: 700, sk: 1000, hq: 4, hk: 2, deterministic: true, ..base });
                    }
                }
            }
        }
    }
    // Sliding windows: narrower than a block (5, 3), one side unbounded, rows that see no
    // key, GQA and MQA, strided, the deterministic kernels (whose turns follow the
    // window's key block ranges), with soft-capping and ALiBi; both masks.
    for dtype in DType::ALL {
        for d in [64, 128, 256] {
            for causal in [false, true] {
                let base = Case::base(dtype, d, causal);
                v.push(Case { sq: 1000, sk: 1000, window: Some((Some(100), Some(20))), ..base.clone() });
                v.push(Case { sq: 300, sk: 1000, hq: 8, hk: 2, window: Some((Some(5), Some(3))), ..base.clone() });
                v.push(Case { sq: 1000, sk: 300, hq: 4, hk: 1, window: Some((Some(64), None)), ..base.clone() });
                v.push(Case { sq: 333, sk: 257, hq: 4, hk: 2, strided: true, window: Some((None, Some(40))), ..base.clone() });
                v.push(Case { sq: 700, sk: 1000, hq: 4, hk: 2, deterministic: true, window: Some((Some(200), Some(0))), ..base.clone() });
                v.push(Case { sq: 1000, sk: 700, hq: 2, hk: 1, softcap: Some(1.5), window: Some((Some(128), Some(7))), ..base.clone() });
                v.push(Case { sq: 700, sk: 700, hq: 4, hk: 2, alibi: Some(causal), deterministic: dtype == DType::F16, window: Some((Some(300), Some(64))), ..base });
            }
        }
    }
    // Soft-capping with ALiBi (the bias after the cap): both head dims, dtypes and masks,
    // rows without keys, deterministic, and with a window.
    for dtype in DType::ALL {
        for d in [64, 128, 256] {
            for causal in [false, true] {
                let base = Case { softcap: Some(1.5), alibi: Some(causal), ..Case::base(dtype, d, causal) };
                v.push(Case { sq: 1000, sk: 300, hq: 4, hk: 1, ..base.clone() });
                v.push(Case { sq: 700, sk: 1000, hq: 4, hk: 2, deterministic: true, ..base.clone() });
                v.push(Case { sq: 700, sk: 700, hq: 4, hk: 2, window: Some((Some(100), Some(30))), ..base });
            }
        }
    }
    // Packed documents: of one token, shorter and longer than a block; per batch or shared;
    // fewer queries than keys; GQA and MQA, strided, the deterministic kernels (whose
    // turns follow the documents' key block ranges), with a window, sinks, soft-capped.
    for dtype in DType::ALL {
        for d in [64, 128, 256] {
            for causal in [false, true] {
                let base = Case::base(dtype, d, causal);
                v.push(Case { sq: 17, sk: 17, docs: Some((&[5], false)), ..base.clone() });
                v.push(Case { sq: 1000, sk: 1000, hq: 4, hk: 1, docs: Some((&[1, 17, 100, 300, 64], true)), ..base.clone() });
                v.push(Case { sq: 300, sk: 1000, hq: 8, hk: 2, strided: true, docs: Some((&[333], false)), ..base.clone() });
                v.push(Case { sq: 700, sk: 700, hq: 4, hk: 2, deterministic: true, docs: Some((&[250, 1, 128], true)), ..base.clone() });
                v.push(Case { sq: 500, sk: 500, hq: 4, hk: 2, window: Some((Some(40), Some(8))), sinks: true, docs: Some((&[90, 33], true)), ..base.clone() });
                v.push(Case { sq: 700, sk: 1000, hq: 4, hk: 2, softcap: Some(1.5), docs: Some((&[300, 64, 1], true)), ..base.clone() });
                v.push(Case { sq: 500, sk: 500, hq: 2, hk: 1, deterministic: true, softcap: Some(1.5), docs: Some((&[128], false)), ..base.clone() });
                // With ALiBi, soft-capped or not, deterministic or not.
                v.push(Case { sq: 700, sk: 1000, hq: 4, hk: 2, alibi: Some(causal), docs: Some((&[300, 64, 1], true)), ..base.clone() });
                v.push(Case { sq: 500, sk: 500, hq: 4, hk: 2, deterministic: true, alibi: Some(false), docs: Some((&[90, 33], true)), ..base.clone() });
                v.push(Case { sq: 333, sk: 333, hq: 2, hk: 1, softcap: Some(1.5), alibi: Some(true), window: Some((Some(50), Some(0))), docs: Some((&[100], false)), ..base.clone() });
                v.push(Case { sq: 600, sk: 1000, hq: 4, hk: 2, deterministic: true, softcap: Some(1.5), alibi: Some(causal), docs: Some((&[17, 400], true)), ..base });
            }
        }
    }
    // Attention sinks: dQ, dK, dV through the forward's LSE, and the sinks' gradient:
    // GQA and rows that see no key, strided, deterministic (bit-identical dsinks too),
    // with a window, soft-capping and ALiBi; both masks.
    for dtype in DType::ALL {
        for d in [64, 128, 256] {
            for causal in [false, true] {
                let base = Case { sinks: true, ..Case::base(dtype, d, causal) };
                v.push(Case { sq: 17, sk: 17, ..base.clone() });
                v.push(Case { sq: 1000, sk: 300, hq: 4, hk: 1, ..base.clone() });
                v.push(Case { sq: 300, sk: 1000, hq: 8, hk: 2, strided: true, ..base.clone() });
                v.push(Case { b: 3, sq: 700, sk: 1000, hq: 4, hk: 2, deterministic: true, ..base.clone() });
                v.push(Case { sq: 500, sk: 500, hq: 4, hk: 4, window: Some((Some(50), Some(10))), softcap: Some(1.5), ..base.clone() });
                v.push(Case { sq: 500, sk: 600, hq: 4, hk: 2, alibi: Some(false), ..base });
            }
        }
    }
    v
}

/// The gradients of one launch.
struct Outputs {
    grads: [DeviceTensor; 3],
    /// The sinks' gradient, with sinks.
    dsinks: Option<Vec<f32>>,
}

#[allow(clippy::too_many_arguments)]
fn launch(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    c: &Case,
    inputs: &[DeviceTensor; 4],
    out: &DeviceTensor,
    lse: &cudarc::driver::CudaSlice<f32>,
    slopes: &cudarc::driver::CudaSlice<f32>,
    sinks: &cudarc::driver::CudaSlice<f32>,
    docs: Option<&DocumentMask>,
    workspace: Option<&mut cudarc::driver::CudaSlice<u8>>,
) -> Result<Outputs, Failed> {
    let layout = |shape: [usize; 4]| if c.strided { padded(shape) } else { (Layout::contiguous(shape), shape.iter().product()) };
    let poisoned = |shape| -> Result<DeviceTensor, AttnError> {
        let (l, len) = layout(shape);
        DeviceTensor::from_f32_strided(stream, c.dtype, l, len, &vec![f32::NAN; l.numel()], f32::NAN)
    };
    let (qs, ks) = ([c.b, c.sq, c.hq, c.d], [c.b, c.sk, c.hk, c.d]);
    let mut grads = [poisoned(qs)?, poisoned(ks)?, poisoned(ks)?];
    let [q, k, v, dout] = inputs;
    let mut opts = AttnOptions { softcap: c.softcap, window: window_of(c), documents: docs, ..AttnOptions::default().causal(c.causal).deterministic(c.deterministic) };
    if let Some(per_batch) = c.alibi {
        opts = opts.alibi(slopes, per_batch);
    }
    // Poisoned too: every head's gradient must be written.
    let mut dsinks = stream.clone_htod(&vec![f32::NAN; c.hq])?;
    if c.sinks {
        opts = opts.sinks(sinks);
    }
    let [dq, dk, dv] = &mut grads;
    flash_attn_backward_into(
        gpu,
        stream,
        &q.as_ref(),
        &k.as_ref(),
        &v.as_ref(),
        &out.as_ref(),
        lse,
        &dout.as_ref(),
        &mut dq.as_mut(),
        &mut dk.as_mut(),
        &mut dv.as_mut(),
        c.sinks.then_some(&mut dsinks),
        workspace,
        &opts,
    )?;
    stream.synchronize()?;
    let dsinks = if c.sinks { Some(stream.clone_dtoh(&dsinks)?) } else { None };
    Ok(Outputs { grads, dsinks })
}

fn run_case(gpu: &Gpu, c: &Case) -> Result<(), Failed> {
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64;
    let mut r = rng(seed);
    let q = HostTensor::randn([c.b, c.sq, c.hq, c.d], c.dtype, 1.0, &mut r);
    let k = HostTensor::randn([c.b, c.sk, c.hk, c.d], c.dtype, 1.0, &mut r);
    let v = HostTensor::randn([c.b, c.sk, c.hk, c.d], c.dtype, 1.0, &mut r);
    let dout = HostTensor::randn([c.b, c.sq, c.hq, c.d], c.dtype, 1.0, &mut r);
    let slopes = support::alibi_slopes(c.b, c.hq, c.alibi == Some(true));
    let alibi = c.alibi.map(|per_batch| HostAlibi { slopes: &slopes, per_batch });
    let sink_logits = support::sink_logits(c.hq);
    let sinks = c.sinks.then_some(&sink_logits[..]);
    let doc_ids = support::doc_ids(c.docs, c.b, c.sk);
    let docs = c.docs.zip(doc_ids.as_deref()).map(|((_, per_batch), ids)| HostDocs { ids, per_batch });
    let p = Problem { q: &q, k: &k, v: &v, causal: c.causal, scale: 1.0 / (c.d as f32).sqrt(), softcap: c.softcap, alibi, window: window_of(c), sinks, docs, variant: None };

    let stream = gpu.new_stream()?;
    let dev_slopes = stream.clone_htod(&slopes)?;
    let dev_sinks = stream.clone_htod(&sink_logits)?;
    let dev_docs = match docs {
        Some(d) => Some(DocumentMask::from_ids(&stream, d.ids, d.per_batch.then_some(c.b))?),
        None => None,
    };
    let upload = |t: &HostTensor, (layout, len): (Layout, usize)| DeviceTensor::from_f32_strided(&stream, c.dtype, layout, len, &t.data, f32::NAN);
    let packed = |t: &HostTensor| (Layout::contiguous(t.shape), t.data.len());
    let inputs = if c.strided {
        [upload(&q, transposed(q.shape))?, upload(&k, padded(k.shape))?, upload(&v, padded(v.shape))?, upload(&dout, transposed(dout.shape))?]
    } else {
        [upload(&q, packed(&q))?, upload(&k, packed(&k))?, upload(&v, packed(&v))?, upload(&dout, packed(&dout))?]
    };
    let mut fwd_opts = AttnOptions { softcap: c.softcap, window: window_of(c), documents: dev_docs.as_ref(), ..AttnOptions::default().causal(c.causal) };
    if let Some(per_batch) = c.alibi {
        fwd_opts = fwd_opts.alibi(&dev_slopes, per_batch);
    }
    if c.sinks {
        fwd_opts = fwd_opts.sinks(&dev_sinks);
    }
    let fwd = flash_attn_func(gpu, &stream, &inputs[0].as_ref(), &inputs[1].as_ref(), &inputs[2].as_ref(), &fwd_opts)?;
    let before = support::snapshot(&inputs, &stream)?;

    let first = launch(gpu, &stream, c, &inputs, &fwd.out, &fwd.lse, &dev_slopes, &dev_sinks, dev_docs.as_ref(), None)?;
    let host = |t: &DeviceTensor| t.to_f32(&stream);
    let got = HostGrads { dq: host(&first.grads[0])?, dk: host(&first.grads[1])?, dv: host(&first.grads[2])? };
    let report = check_backward(&p, &dout, c.dtype, &got);
    if !report.passed() {
        return Err(format!("seed {seed}: {report}").into());
    }
    // The sinks' gradient under the same 2x rule, with a slack of f32 rounding of the sum.
    let sink_report = match &first.dsinks {
        Some(got) => {
            let (fwd_o, fwd_lse) = (fwd.out.to_f32(&stream)?, stream.clone_dtoh(&fwd.lse)?);
            let report = check_sink_grads(&p, &dout, c.dtype, &fwd_o, &fwd_lse, got);
            if !report.passed() {
                return Err(format!("seed {seed}: {report}").into());
            }
            format!("; {report}")
        }
        None => String::new(),
    };
    // Gaps of strided gradients stay untouched.
    for g in &first.grads {
        let written = g.raw_f32(&stream)?.iter().filter(|x| !x.is_nan()).count();
        if written > g.layout().numel() {
            return Err(format!("seed {seed}: {written} elements written, the gradient has {}", g.layout().numel()).into());
        }
    }
    if c.deterministic {
        // Bit-identical on a second launch on another stream, with a caller-owned
        // workspace that is reused by a third.
        let other = gpu.new_stream()?;
        let (b, sq, hq, d) = (c.b, c.sq, c.hq, c.d);
        // SAFETY: the backward writes every workspace byte it reads.
        let mut ws = unsafe { other.alloc::<u8>(backward_workspace_bytes(b, sq, hq, d)) }?;
        for _ in 0..2 {
            let again = launch(gpu, &other, c, &inputs, &fwd.out, &fwd.lse, &dev_slopes, &dev_sinks, dev_docs.as_ref(), Some(&mut ws))?;
            for (g, (a, b)) in first.grads.iter().zip(&again.grads).enumerate() {
                if bits(&a.raw_f32(&stream)?) != bits(&b.raw_f32(&other)?) {
                    return Err(format!("seed {seed}: deterministic gradient {g} differs between launches").into());
                }
            }
            if first.dsinks.as_deref().map(bits) != again.dsinks.as_deref().map(bits) {
                return Err(format!("seed {seed}: the sinks' gradient differs between launches").into());
            }
        }
    }
    let after = support::snapshot(&inputs, &stream)?;
    if before != after {
        return Err(format!("seed {seed}: an input buffer changed").into());
    }
    println!("    {}: {report}{sink_report}", c.name());
    Ok(())
}

/// Misuse on the device path: a workspace too small is refused before anything runs,
/// with the argument named (the CPU validation tests cover the rest).
fn misuse_is_refused_before_launch(gpu: &Gpu) -> Result<(), Failed> {
    let stream = gpu.new_stream()?;
    let shape = [1, 100, 2, 64];
    let t = |x: f32| DeviceTensor::from_f32(&stream, DType::F16, shape, &vec![x; 100 * 2 * 64]);
    let (q, k, v, dout) = (t(0.5)?, t(0.25)?, t(1.0)?, t(0.1)?);
    let fwd = flash_attn_func(gpu, &stream, &q.as_ref(), &k.as_ref(), &v.as_ref(), &AttnOptions::default())?;
    let (mut dq, mut dk, mut dv) = (t(f32::NAN)?, t(f32::NAN)?, t(f32::NAN)?);
    let mut small = stream.alloc_zeros::<u8>(16)?;
    let err = flash_attn_backward_into(
        gpu,
        &stream,
        &q.as_ref(),
        &k.as_ref(),
        &v.as_ref(),
        &fwd.out.as_ref(),
        &fwd.lse,
        &dout.as_ref(),
        &mut dq.as_mut(),
        &mut dk.as_mut(),
        &mut dv.as_mut(),
        None,
        Some(&mut small),
        &AttnOptions::default(),
    );
    match err {
        Err(AttnError::OutOfBounds { arg: flash_attn3::Arg::Workspace, .. }) => Ok(()),
        other => Err(format!("expected a workspace error, got {:?}", other.err()).into()),
    }
}

fn main() {
    let mut args = Arguments::from_args();
    args.test_threads.get_or_insert(1);
    let gpu = support::gpu_or_skip("GPU backward tests");
    let mut trials: Vec<Trial> = cases().into_iter().map(|c| support::gpu_trial(c.name(), &gpu, move |g| run_case(g, &c))).collect();
    trials.push(support::gpu_trial("bwd_misuse_is_refused_before_launch", &gpu, misuse_is_refused_before_launch));
    libtest_mimic::run(&args, trials).exit();
}
