//! The candle ops against candle's own attention math, on a CUDA device: outputs under
//! FlashAttention's 2x rule (the op's error against the f32 math at most twice the error
//! of the same math in the input dtype, plus a tiny slack), and gradients through
//! `Tensor::backward` against candle autograd of that math, under the same rule.
//! User-defined variants (the `examples/variants` crate's, its PTX read from
//! `FA3_VARIANTS_PTX`; skipped without it) against the library's CPU reference given the
//! same `Variant` impls, under the same rule.
use candle::{D, DType, Device, Tensor, Var};
use candle_flash_attn3::{
    DocumentMask, FlashAttnOptions, VariantModule, flash_attn, flash_attn_alibi, flash_attn_alibi_windowed, flash_attn_windowed, flash_attn_with, load_variants,
};
use flash_attn3::check::{O_SLACK, grad_slack};
use flash_attn3::reference::backward::Grads as HostGrads;
use flash_attn3::reference::{HostTensor, HostVariant, HostVariantOf, Problem, attention_f64, attention_lowp, max_abs_err};
use libtest_mimic::{Arguments, Trial};
use std::sync::Arc;
use variants::{PrefixLm, RelBias, VARIANTS};

/// One attention problem: shapes and the variant, described once for the op and the math.
#[derive(Clone, Copy, Debug)]
struct Case {
    b: usize,
    sq: usize,
    sk: usize,
    hq: usize,
    hk: usize,
    d: usize,
    dtype: DType,
    left: Option<usize>,
    right: Option<usize>,
    alibi: bool,
    softcap: Option<f32>,
    sink: bool,
    /// Packed documents of this many keys each (the last one shorter).
    doc_len: Option<usize>,
    /// A variant of the example's module, by name.
    user: Option<&'static str>,
}

impl Case {
    fn new(b: usize, sq: usize, sk: usize, hq: usize, hk: usize, d: usize, dtype: DType) -> Self {
        Case { b, sq, sk, hq, hk, d, dtype, left: None, right: None, alibi: false, softcap: None, sink: false, doc_len: None, user: None }
    }
    fn causal(self) -> Self {
        Case { right: Some(0), ..self }
    }
    fn window(self, left: usize, right: usize) -> Self {
        Case { left: Some(left), right: Some(right), ..self }
    }
    fn scale(&self) -> f32 {
        1.0 / (self.d as f32).sqrt()
    }
}

/// Inputs of a case: q, k, v in the case's dtype, ALiBi slopes and sink logits (f32).
struct Inputs {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    slopes: Tensor,
    sinks: Tensor,
    documents: Option<std::sync::Arc<DocumentMask>>,
}

fn inputs(c: &Case, dev: &Device) -> candle::Result<Inputs> {
    let rnd = |s: usize, h: usize| Tensor::randn(0f32, 1., (c.b, s, h, c.d), dev)?.to_dtype(c.dtype);
    let slopes: Vec<f32> = (0..c.hq).map(|h| 0.5f32.powi(h as i32 + 1)).collect();
    let sinks: Vec<f32> = (0..c.hq).map(|h| h as f32 * 0.7 - 1.0).collect();
    let documents = match (c.doc_len, dev) {
        (Some(len), Device::Cuda(cuda)) => {
            let lengths: Vec<usize> = (0..c.sk).step_by(len).map(|start| len.min(c.sk - start)).collect();
            Some(std::sync::Arc::new(DocumentMask::from_lengths(&cuda.cuda_stream(), &lengths).map_err(candle::Error::wrap)?))
        }
        _ => None,
    };
    Ok(Inputs {
        documents,
        q: rnd(c.sq, c.hq)?,
        k: rnd(c.sk, c.hk)?,
        v: rnd(c.sk, c.hk)?,
        slopes: Tensor::new(slopes, dev)?,
        sinks: Tensor::new(sinks, dev)?,
    })
}

fn options(c: &Case, x: &Inputs) -> FlashAttnOptions {
    FlashAttnOptions {
        window_size_left: c.left,
        window_size_right: c.right,
        alibi_slopes: c.alibi.then(|| x.slopes.clone()),
        softcap: c.softcap,
        sinks: c.sink.then(|| x.sinks.clone()),
        documents: x.documents.clone(),
        ..FlashAttnOptions::new(c.scale())
    }
}

/// The additive bias `(hq, sq, sk)` of the case: −inf outside the window, −slope·distance.
fn bias(c: &Case, dev: &Device) -> candle::Result<Tensor> {
    let off = c.sk as i64 - c.sq as i64;
    let mut b = Vec::with_capacity(c.hq * c.sq * c.sk);
    for h in 0..c.hq {
        for i in 0..c.sq as i64 {
            for j in 0..c.sk as i64 {
                let same_doc = c.doc_len.is_none_or(|len| (i + off) / len as i64 == j / len as i64);
                let seen = same_doc && c.left.is_none_or(|l| j >= i + off - l as i64) && c.right.is_none_or(|r| j <= i + off + r as i64);
                let slope = if c.alibi { 0.5f32.powi(h as i32 + 1) } else { 0.0 };
                b.push(if seen { -slope * (i + off - j).abs() as f32 } else { f32::NEG_INFINITY });
            }
        }
    }
    Tensor::from_vec(b, (c.hq, c.sq, c.sk), dev)
}

/// candle's attention math: scores and softmax in f32, the two matmuls in `mm` (f32 for
/// the reference; the input dtype for the naive low-precision version, P rounded to it).
fn attention_math(c: &Case, q: &Tensor, k: &Tensor, v: &Tensor, sinks: &Tensor, mm: DType) -> candle::Result<Tensor> {
    let g = c.hq / c.hk;
    let heads = |t: &Tensor, s: usize| -> candle::Result<Tensor> {
        // (b, s, hk, d) -> (b, hq, s, d), each K/V head repeated for its query heads.
        let t = t.to_dtype(mm)?.transpose(1, 2)?;
        t.unsqueeze(2)?.broadcast_as((c.b, c.hk, g, s, c.d))?.reshape((c.b, c.hq, s, c.d))
    };
    let q = q.to_dtype(mm)?.transpose(1, 2)?.contiguous()?;
    let (k, v) = (heads(k, c.sk)?, heads(v, c.sk)?);
    let mut s = (q.matmul(&k.t()?)?.to_dtype(DType::F32)? * c.scale() as f64)?;
    if let Some(cap) = c.softcap {
        s = ((s / cap as f64)?.tanh()? * cap as f64)?;
    }
    let s = s.broadcast_add(&bias(c, q.device())?)?;
    // The shift cancels in the softmax: no gradient through it.
    let max = s.max_keepdim(D::Minus1)?.detach();
    let e = s.broadcast_sub(&max)?.exp()?;
    let mut denom = e.sum_keepdim(D::Minus1)?;
    if c.sink {
        let sink = sinks.reshape((1, c.hq, 1, 1))?;
        denom = (denom + sink.broadcast_sub(&max)?.exp()?)?;
    }
    let p = e.broadcast_div(&denom)?.to_dtype(mm)?;
    p.matmul(&v)?.transpose(1, 2)?.to_dtype(c.dtype)
}

fn max_abs(a: &Tensor, b: &Tensor) -> candle::Result<f64> {
    let d = (a.to_dtype(DType::F32)? - b.to_dtype(DType::F32)?)?.abs()?;
    Ok(d.flatten_all()?.max(0)?.to_scalar::<f32>()? as f64)
}

fn values(t: &Tensor) -> candle::Result<Vec<f64>> {
    Ok(t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?)
}

/// `err ≤ 2·naive + slack`, with the numbers in the message.
fn assert_rule(what: &str, c: &Case, err: f64, naive: f64, slack: f64) {
    assert!(err <= 2.0 * naive + slack, "{what} of {c:?}: error {err:.3e} > 2 x naive {naive:.3e} + {slack:.1e}");
}

/// The forward of `c` through `f` (the public function under test) against the math.
fn check_forward(dev: &Device, c: &Case, f: impl Fn(&Inputs) -> candle::Result<Tensor>) -> candle::Result<()> {
    let x = inputs(c, dev)?;
    let got = f(&x)?;
    assert_eq!(got.dims(), x.q.dims());
    let exact = attention_math(c, &x.q, &x.k, &x.v, &x.sinks, DType::F32)?;
    let naive = attention_math(c, &x.q, &x.k, &x.v, &x.sinks, c.dtype)?;
    assert_rule("O", c, max_abs(&got, &exact)?, max_abs(&naive, &exact)?, O_SLACK);
    Ok(())
}

/// dQ, dK, dV of `loss = Σ O·W` through the op against candle autograd of the math.
fn check_backward(dev: &Device, c: &Case) -> candle::Result<()> {
    let x = inputs(c, dev)?;
    let w = Tensor::randn(0f32, 1., x.q.dims(), dev)?;
    let grads = |run: &dyn Fn(&Tensor, &Tensor, &Tensor) -> candle::Result<Tensor>, dtype: DType| -> candle::Result<Vec<Tensor>> {
        let vars = [&x.q, &x.k, &x.v].map(|t| t.to_dtype(dtype).and_then(|t| Var::from_tensor(&t)));
        let [q, k, v] = vars;
        let (q, k, v) = (q?, k?, v?);
        let o = run(q.as_tensor(), k.as_tensor(), v.as_tensor())?;
        let g = (o.to_dtype(DType::F32)? * &w)?.sum_all()?.backward()?;
        [&q, &k, &v].iter().map(|t| g.get(t.as_tensor()).cloned().ok_or_else(|| candle::Error::Msg("no gradient".into()))).collect()
    };
    let opts = options(c, &x);
    let got = grads(&|q, k, v| flash_attn_with(q, k, v, &opts), c.dtype)?;
    let exact = grads(&|q, k, v| attention_math(c, q, k, v, &x.sinks, DType::F32), DType::F32)?;
    let naive = grads(&|q, k, v| attention_math(c, q, k, v, &x.sinks, c.dtype), c.dtype)?;
    for (i, name) in ["dQ", "dK", "dV"].iter().enumerate() {
        assert_eq!(got[i].dims(), exact[i].dims(), "{name} shape");
        let slack = grad_slack(&values(&exact[i])?, flash_dtype(c.dtype));
        assert_rule(name, c, max_abs(&got[i], &exact[i])?, max_abs(&naive[i], &exact[i])?, slack);
    }
    Ok(())
}

fn flash_dtype(d: DType) -> flash_attn3::DType {
    if d == DType::F16 { flash_attn3::DType::F16 } else { flash_attn3::DType::BF16 }
}

/// Shapes with awkward sizes, seqlen_q ≠ seqlen_k, MHA / GQA / MQA, every head size.
fn shapes() -> Vec<Case> {
    let mut v = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        for d in [64, 128, 256] {
            v.push(Case::new(1, 1, 17, 2, 2, d, dtype));
            v.push(Case::new(2, 113, 300, 4, 2, d, dtype));
            v.push(Case::new(1, 257, 257, 4, 1, d, dtype));
        }
    }
    v
}

fn flash_attn_matches_candle_math(dev: &Device) -> candle::Result<()> {
    for c in shapes() {
        for c in [c, c.causal()] {
            let causal = c.right == Some(0);
            check_forward(dev, &c, |x| flash_attn(&x.q, &x.k, &x.v, c.scale(), causal, false))?;
        }
    }
    Ok(())
}

fn windowed_and_alibi_match_candle_math(dev: &Device) -> candle::Result<()> {
    for c in shapes().into_iter().filter(|c| c.d != 256 || c.dtype == DType::BF16) {
        let w = c.window(40, 7);
        check_forward(dev, &w, |x| flash_attn_windowed(&x.q, &x.k, &x.v, c.scale(), w.left, w.right, false))?;
        let a = Case { alibi: true, ..c.causal() };
        check_forward(dev, &a, |x| flash_attn_alibi(&x.q, &x.k, &x.v, &x.slopes, c.scale(), true, false))?;
        let aw = Case { alibi: true, ..c.window(16, 0) };
        check_forward(dev, &aw, |x| flash_attn_alibi_windowed(&x.q, &x.k, &x.v, &x.slopes, c.scale(), aw.left, aw.right, false))?;
    }
    Ok(())
}

fn softcap_and_sinks_match_candle_math(dev: &Device) -> candle::Result<()> {
    for c in shapes().into_iter().filter(|c| c.d == 128) {
        for c in [Case { softcap: Some(5.0), ..c.causal() }, Case { sink: true, ..c }, Case { sink: true, softcap: Some(3.0), ..c.window(9, 3) }] {
            check_forward(dev, &c, |x| flash_attn_with(&x.q, &x.k, &x.v, &options(&c, x)))?;
        }
    }
    Ok(())
}

fn gradients_match_candle_autograd(dev: &Device) -> candle::Result<()> {
    for c in shapes() {
        for c in [c, c.causal()] {
            check_backward(dev, &c)?;
        }
    }
    Ok(())
}

fn variant_gradients_match_candle_autograd(dev: &Device) -> candle::Result<()> {
    for c in shapes().into_iter().filter(|c| c.d != 256 || c.dtype == DType::BF16) {
        let variants = [
            c.window(40, 7),
            Case { alibi: true, ..c.causal() },
            Case { softcap: Some(5.0), ..c },
            Case { sink: true, ..c.causal() },
        ];
        for c in variants {
            check_backward(dev, &c)?;
        }
    }
    Ok(())
}

fn strided_views_are_taken_as_they_are(dev: &Device) -> candle::Result<()> {
    let c = Case::new(2, 190, 190, 4, 2, 128, DType::BF16).causal();
    // (b, h, s, d) storage seen as (b, s, h, d): a view with a unit last stride.
    let x = inputs(&c, dev)?;
    let bhsd = |t: &Tensor| t.transpose(1, 2)?.contiguous()?.transpose(1, 2);
    let (q, k, v) = (bhsd(&x.q)?, bhsd(&x.k)?, bhsd(&x.v)?);
    assert!(!q.is_contiguous());
    let got = flash_attn(&q, &k, &v, c.scale(), true, false)?;
    let packed = flash_attn(&x.q, &x.k, &x.v, c.scale(), true, false)?;
    assert_eq!(max_abs(&got, &packed)?, 0.0, "a strided view must give the packed tensors' bits");
    Ok(())
}

fn deterministic_backward_is_bit_identical(dev: &Device) -> candle::Result<()> {
    let c = Case::new(2, 777, 1031, 8, 2, 128, DType::BF16).causal();
    let x = inputs(&c, dev)?;
    let opts = FlashAttnOptions { deterministic: true, ..options(&c, &x) };
    let run = || -> candle::Result<Vec<Vec<f32>>> {
        let (q, k, v) = (Var::from_tensor(&x.q)?, Var::from_tensor(&x.k)?, Var::from_tensor(&x.v)?);
        let g = flash_attn_with(q.as_tensor(), k.as_tensor(), v.as_tensor(), &opts)?.to_dtype(DType::F32)?.sum_all()?.backward()?;
        [&q, &k, &v].iter().map(|t| g.get(t.as_tensor()).unwrap().to_dtype(DType::F32)?.flatten_all()?.to_vec1()).collect()
    };
    let first = run()?;
    for _ in 0..3 {
        assert!(run()? == first, "deterministic gradients changed between runs");
    }
    Ok(())
}

fn misuse_is_an_error(dev: &Device) -> candle::Result<()> {
    let t = |shape: (usize, usize, usize, usize), dtype: DType, dev: &Device| Tensor::zeros(shape, dtype, dev);
    let bf = |s| t(s, DType::BF16, dev);
    let msg = |r: candle::Result<Tensor>| r.err().map(|e| e.to_string()).unwrap_or_default();
    // Wrong dtype, head size, head counts, rank, device; a bad slope shape; tracked sinks.
    let f32q = t((1, 8, 2, 64), DType::F32, dev)?;
    assert!(msg(flash_attn(&f32q, &f32q, &f32q, 1.0, false, false)).contains("f16 or bf16"));
    let h96 = bf((1, 8, 2, 96))?;
    assert!(!msg(flash_attn(&h96, &h96, &h96, 1.0, false, false)).is_empty());
    let (q, k3) = (bf((1, 8, 4, 64))?, bf((1, 8, 3, 64))?);
    assert!(!msg(flash_attn(&q, &k3, &k3, 1.0, false, false)).is_empty());
    let r3 = Tensor::zeros((8, 4, 64), DType::BF16, dev)?;
    assert!(msg(flash_attn(&r3, &r3, &r3, 1.0, false, false)).contains("rank 4"));
    let cpu = t((1, 8, 4, 64), DType::BF16, &Device::Cpu)?;
    assert!(msg(flash_attn(&cpu, &cpu, &cpu, 1.0, false, false)).contains("CUDA"));
    let slopes = Tensor::zeros(3, DType::F32, dev)?;
    assert!(msg(flash_attn_alibi(&q, &q, &q, &slopes, 1.0, true, false)).contains("alibi_slopes"));
    let sinks = Tensor::zeros(3, DType::F32, dev)?;
    let opts = FlashAttnOptions { sinks: Some(sinks), ..FlashAttnOptions::new(1.0) };
    assert!(msg(flash_attn_with(&q, &q, &q, &opts)).contains("sinks"));
    Ok(())
}

/// The sinks' gradient, through the zero-valued term that carries it, against candle
/// autograd of the math: within 2x the naive error plus 1% of the largest gradient (one
/// sum per head, where the rule's naive error alone is noise).
fn sink_gradient_matches_candle_autograd(dev: &Device) -> candle::Result<()> {
    for c in [Case::new(2, 300, 300, 4, 2, 128, DType::BF16).causal(), Case::new(1, 77, 1000, 4, 1, 64, DType::F16)] {
        let c = Case { sink: true, ..c };
        let x = inputs(&c, dev)?;
        let w = Tensor::randn(0f32, 1., x.q.dims(), dev)?;
        let dsinks = |run: &dyn Fn(&Tensor) -> candle::Result<Tensor>| -> candle::Result<Tensor> {
            let s = Var::from_tensor(&x.sinks)?;
            let g = (run(s.as_tensor())?.to_dtype(DType::F32)? * &w)?.sum_all()?.backward()?;
            Ok(g.get(s.as_tensor()).expect("sinks gradient").clone())
        };
        let got = dsinks(&|s| {
            let out = flash_attn_with(&x.q, &x.k, &x.v, &FlashAttnOptions { sinks: Some(s.clone()), ..options(&c, &x) })?;
            let plain = flash_attn_with(&x.q, &x.k, &x.v, &options(&c, &x))?;
            assert_eq!(max_abs(&out, &plain)?, 0.0, "the gradient term must not change O");
            Ok(out)
        })?;
        let exact = dsinks(&|s| attention_math(&c, &x.q, &x.k, &x.v, s, DType::F32))?;
        let naive = dsinks(&|s| attention_math(&c, &x.q, &x.k, &x.v, s, c.dtype))?;
        let scale = values(&exact)?.iter().fold(0f64, |m, g| m.max(g.abs()));
        assert_rule("dsinks", &c, max_abs(&got, &exact)?, max_abs(&naive, &exact)?, 0.01 * scale);
    }
    Ok(())
}

/// Packed documents (shorter and longer than a tile, with causal, a window and sinks):
/// outputs and gradients against the math with the same mask.
fn documents_match_candle_math(dev: &Device) -> candle::Result<()> {
    for c in shapes().into_iter().filter(|c| c.sq > 1 && (c.d != 256 || c.dtype == DType::BF16)) {
        for c in [Case { doc_len: Some(50), ..c }, Case { doc_len: Some(130), ..c.causal() }, Case { doc_len: Some(64), sink: true, ..c.window(20, 3) }] {
            check_forward(dev, &c, |x| flash_attn_with(&x.q, &x.k, &x.v, &options(&c, x)))?;
            check_backward(dev, &c)?;
        }
    }
    Ok(())
}

/// A tensor's values as the CPU reference takes them (exact: f16 and bf16 widen to f32).
fn host(t: &Tensor) -> candle::Result<HostTensor> {
    let (b, s, h, d) = t.dims4()?;
    Ok(HostTensor::new([b, s, h, d], t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?))
}

/// The buffer of the example's variant `name` for case `c`, on `dev` and as the host's
/// words: a bias table `[hq, RelBias::BUCKETS]` of values in [-2, 2) (distances past
/// `MAX_DISTANCE` clamp at these sizes), or the prefix-LM's prefixes (none, a third of the
/// keys, more than all).
fn variant_data(name: &str, c: &Case, dev: &Device) -> candle::Result<(Tensor, Vec<u32>)> {
    if name == VARIANTS[0] {
        let table: Vec<f32> = (0..c.hq * RelBias::BUCKETS as usize).map(|i| (i * 7919 % 1000) as f32 / 250.0 - 2.0).collect();
        let words = table.iter().map(|x| x.to_bits()).collect();
        return Ok((Tensor::new(table, dev)?, words));
    }
    let prefixes: Vec<u32> = [0, c.sk as u32 / 3, c.sk as u32 + 5].into_iter().cycle().take(c.b).collect();
    Ok((Tensor::new(prefixes.clone(), dev)?, prefixes))
}

/// Case `c` (its `user` variant) through `flash_attn_with`, forward and backward, against
/// the CPU reference of the same `Variant` impl (`HostVariantOf`) under the 2x rule.
fn check_user_variant(dev: &Device, module: &Arc<VariantModule>, c: &Case, host_variant: &dyn Fn(Vec<u32>) -> Box<dyn HostVariant>) -> candle::Result<()> {
    let name = c.user.expect("a variant case");
    let x = inputs(c, dev)?;
    let (data, words) = variant_data(name, c, dev)?;
    let opts = FlashAttnOptions::new(c.scale()).causal(c.right == Some(0)).variant(module, name, Some(data))?;
    let w = Tensor::randn(0f32, 1., x.q.dims(), dev)?.to_dtype(c.dtype)?;
    let (q, k, v) = (Var::from_tensor(&x.q)?, Var::from_tensor(&x.k)?, Var::from_tensor(&x.v)?);
    let o = flash_attn_with(q.as_tensor(), k.as_tensor(), v.as_tensor(), &opts)?;
    let g = (o.to_dtype(DType::F32)? * w.to_dtype(DType::F32)?)?.sum_all()?.backward()?;
    let grad = |t: &Var| -> candle::Result<Vec<f32>> {
        let g = g.get(t.as_tensor()).ok_or_else(|| candle::Error::Msg("no gradient".into()))?;
        g.to_dtype(DType::F32)?.flatten_all()?.to_vec1()
    };

    let (q_host, k_host, v_host, dout) = (host(&x.q)?, host(&x.k)?, host(&x.v)?, host(&w)?);
    let reference_variant = host_variant(words);
    let p = Problem { variant: Some(&*reference_variant), ..Problem::plain(&q_host, &k_host, &v_host, c.right == Some(0), c.scale()) };
    let exact = attention_f64(&p);
    let naive = attention_lowp(&p, flash_dtype(c.dtype));
    let got = o.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    assert_rule("O", c, max_abs_err(&got, &exact.o), max_abs_err(&naive.o, &exact.o), O_SLACK);
    let grads = HostGrads { dq: grad(&q)?, dk: grad(&k)?, dv: grad(&v)? };
    let report = flash_attn3::check::check_backward(&p, &dout, flash_dtype(c.dtype), &grads);
    assert!(report.passed(), "gradients of {c:?}: {report}");
    Ok(())
}

/// The learned relative-position bias (an f32 table per query head), causal or not, fewer
/// or more queries than keys (causal rows that see no key), GQA and MQA, every head dim.
fn rel_bias_variant_matches_the_cpu_reference(dev: &Device, module: &Arc<VariantModule>) -> candle::Result<()> {
    let user = Some(VARIANTS[0]);
    for c in [
        Case { user, ..Case::new(2, 300, 500, 4, 2, 128, DType::BF16) },
        Case { user, ..Case::new(2, 300, 500, 4, 2, 128, DType::BF16).causal() },
        Case { user, ..Case::new(2, 500, 300, 4, 1, 64, DType::F16).causal() },
        Case { user, ..Case::new(1, 300, 300, 2, 2, 256, DType::BF16) },
    ] {
        check_user_variant(dev, module, &c, &|w| Box::new(HostVariantOf::<RelBias>::new(w)))?;
    }
    Ok(())
}

/// The prefix-LM mask (u32 prefixes per batch element), fewer or more queries than keys
/// (rows that see no key without a prefix), GQA and MQA, every head dim.
fn prefix_lm_variant_matches_the_cpu_reference(dev: &Device, module: &Arc<VariantModule>) -> candle::Result<()> {
    let user = Some(VARIANTS[1]);
    for c in [
        Case { user, ..Case::new(3, 300, 500, 4, 2, 128, DType::BF16) },
        Case { user, ..Case::new(3, 500, 300, 4, 1, 64, DType::F16) },
        Case { user, ..Case::new(3, 257, 257, 2, 2, 256, DType::BF16) },
    ] {
        check_user_variant(dev, module, &c, &|w| Box::new(HostVariantOf::<PrefixLm>::new(w)))?;
    }
    Ok(())
}

/// A name the module lacks, data of another dtype or device, options a variant does not
/// take, a module of names the PTX lacks: errors, not crashes.
fn variant_misuse_is_an_error(dev: &Device, module: &Arc<VariantModule>) -> candle::Result<()> {
    let msg = |r: candle::Result<Tensor>| r.err().map(|e| e.to_string()).unwrap_or_default();
    let opts = FlashAttnOptions::new(1.0);
    let err = opts.clone().variant(module, "nope", None).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("nope"), "{err}");
    let f16 = Tensor::zeros(8, DType::F16, dev)?;
    let err = opts.clone().variant(module, VARIANTS[0], Some(f16)).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("f32 or u32"), "{err}");
    let q = Tensor::zeros((1, 64, 2, 64), DType::BF16, dev)?;
    let table = Tensor::zeros(2 * RelBias::BUCKETS as usize, DType::F32, dev)?;
    let capped = FlashAttnOptions { softcap: Some(5.0), ..opts.clone().variant(module, VARIANTS[0], Some(table))? };
    assert!(msg(flash_attn_with(&q, &q, &q, &capped)).contains("combines only with causal and sinks"));
    let on_cpu = opts.clone().variant(module, VARIANTS[0], Some(Tensor::zeros(8, DType::F32, &Device::Cpu)?))?;
    assert!(msg(flash_attn_with(&q, &q, &q, &on_cpu)).contains("q's device"));
    let ptx = std::env::var("FA3_VARIANTS_PTX").map_err(candle::Error::wrap)?;
    let ptx = std::fs::read_to_string(ptx)?;
    let err = load_variants(dev, &ptx, &["nope"]).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("nope"), "{err}");
    Ok(())
}

/// The example's variant module from `FA3_VARIANTS_PTX`, for the variant tests: `None`
/// (the reason printed) when the variable is unset, an error when it names no module.
fn variants_module(dev: &Device) -> Option<Result<Arc<VariantModule>, String>> {
    let Ok(path) = std::env::var("FA3_VARIANTS_PTX") else {
        println!(
            "variant tests SKIPPED (reported as ignored): FA3_VARIANTS_PTX is not set (write the example's module with \
             `cargo run --release -p fa3-variants-example --bin variants-ptx -- FILE`)"
        );
        return None;
    };
    let ptx = match std::fs::read_to_string(&path) {
        Ok(p) => p,
        Err(e) => return Some(Err(format!("FA3_VARIANTS_PTX={path}: {e}"))),
    };
    Some(load_variants(dev, &ptx, &VARIANTS).map_err(|e| format!("loading {path}: {e}")))
}

fn main() {
    let mut args = Arguments::from_args();
    args.test_threads.get_or_insert(1);
    let dev = match Device::new_cuda(0) {
        Ok(d) => {
            println!("candle-flash-attn3 GPU tests on CUDA device 0");
            Some(d)
        }
        Err(e) => {
            if std::env::var("FA3_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                eprintln!("FA3_REQUIRE_GPU=1 but no CUDA device: {e}");
                std::process::exit(1);
            }
            let e = e.to_string();
            println!("candle-flash-attn3 GPU tests SKIPPED (reported as ignored): no CUDA device: {}", e.lines().next().unwrap_or(""));
            None
        }
    };
    let tests: [(&str, fn(&Device) -> candle::Result<()>); 10] = [
        ("documents_match_candle_math", documents_match_candle_math),
        ("flash_attn_matches_candle_math", flash_attn_matches_candle_math),
        ("windowed_and_alibi_match_candle_math", windowed_and_alibi_match_candle_math),
        ("softcap_and_sinks_match_candle_math", softcap_and_sinks_match_candle_math),
        ("gradients_match_candle_autograd", gradients_match_candle_autograd),
        ("variant_gradients_match_candle_autograd", variant_gradients_match_candle_autograd),
        ("strided_views_are_taken_as_they_are", strided_views_are_taken_as_they_are),
        ("deterministic_backward_is_bit_identical", deterministic_backward_is_bit_identical),
        ("misuse_is_an_error", misuse_is_an_error),
        ("sink_gradient_matches_candle_autograd", sink_gradient_matches_candle_autograd),
    ];
    let mut trials: Vec<Trial> = tests
        .into_iter()
        .map(|(name, f)| {
            let (dev, ignored) = (dev.clone(), dev.is_none());
            Trial::test(name, move || match &dev {
                Some(d) => f(d).map_err(|e| e.to_string().into()),
                None => Ok(()),
            })
            .with_ignored_flag(ignored)
        })
        .collect();
    let module = dev.as_ref().and_then(variants_module);
    let variant_tests: [(&str, fn(&Device, &Arc<VariantModule>) -> candle::Result<()>); 3] = [
        ("rel_bias_variant_matches_the_cpu_reference", rel_bias_variant_matches_the_cpu_reference),
        ("prefix_lm_variant_matches_the_cpu_reference", prefix_lm_variant_matches_the_cpu_reference),
        ("variant_misuse_is_an_error", variant_misuse_is_an_error),
    ];
    for (name, f) in variant_tests {
        let (dev, module) = (dev.clone(), module.clone());
        let ignored = dev.is_none() || module.is_none();
        trials.push(
            Trial::test(name, move || match (&dev, &module) {
                (Some(d), Some(Ok(m))) => f(d, m).map_err(|e| e.to_string().into()),
                (_, Some(Err(e))) => Err(e.clone().into()),
                _ => Ok(()),
            })
            .with_ignored_flag(ignored),
        );
    }
    libtest_mimic::run(&args, trials).exit();
}
