//! GPU tests of the FP8 path: the quantization kernel gives the CPU reference's codes and
//! factors exactly (block scales, incoherent processing, the transposed V), and the FP8
//! forward meets FlashAttention's rule against the f64 attention of the same e4m3 inputs
//! (max error <= 2 x that of the naive FP8 implementation plus slack), at awkward sizes,
//! causal or not, GQA, with per-head and per-block factors. The naive implementation is
//! `attention_fp8_naive` (scores from a bf16 matmul, P in e4m3, as FlashAttention-3's
//! tests), since the tensor cores accumulate FP8 products with fewer bits than f32; on
//! small-integer Q and K, whose scores every accumulator holds exactly, the kernel is held
//! to the f32-score reference (`attention_fp8_lowp`) instead.
//!
//! Without a usable GPU every test is reported as ignored and the reason is printed.
use flash_attn3::fp8::{
    Descale, DescaleKind, Fp8Descales, Fp8Layout, Fp8Options, Fp8Tensor, QuantizeOptions, Role, block_rows, flash_attn_fp8, hadamard_signs,
    quantize_fp8, transpose_v_codes,
};
use flash_attn3::reference::fp8::{Granularity, Hadamard, Quantized, attention_fp8_lowp, attention_fp8_naive, e4m3_code, quantize};
use flash_attn3::reference::{AttnResult, HostTensor, Problem, attention_f64, max_abs_err, rng, within_budget};
use flash_attn3::check::{LSE_SLACK, O_SLACK};
use cudarc::driver::CudaStream;
use flash_attn3::{Arg, DType, DeviceTensor, Gpu};
use std::sync::Arc;
use libtest_mimic::{Arguments, Failed};

mod support;

/// The e4m3 codes of a CPU-quantized tensor (its values divided by their group's factor).
fn codes(t: &Quantized, g: Granularity) -> Vec<u8> {
    let [_, s, h, d] = t.values.shape;
    let rows = match g {
        Granularity::Blocks { rows } | Granularity::Pow2Blocks { rows } => rows,
        _ => s,
    };
    let groups = s.div_ceil(rows);
    t.values
        .data
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let (hi, si, bi) = ((i / d) % h, (i / (d * h)) % s, i / (d * h * s));
            let sc = match g {
                Granularity::PerTensor => t.scales[0],
                Granularity::PerHead => t.scales[bi * h + hi],
                Granularity::Blocks { .. } | Granularity::Pow2Blocks { .. } => t.scales[(bi * h + hi) * groups + si / rows],
            };
            e4m3_code(x / sc)
        })
        .collect()
}

/// The quantization kernel against `reference::fp8::quantize` (after the same Hadamard
/// transform when `incoherent`): identical factors and codes.
fn quantize_matches_cpu(gpu: &Gpu, dtype: DType, d: usize, role: Role, incoherent: bool) -> Result<(), Failed> {
    let stream = gpu.new_stream()?;
    let shape = [2, 1000, 3, d];
    let mut r = rng(d as u64 * 7 + role as u64);
    let x = HostTensor::randn(shape, dtype, 1.5, &mut r);
    let dev = DeviceTensor::from_f32(&stream, dtype, shape, &x.data)?;
    let signs = hadamard_signs(&stream, d, 11)?;
    let opts = if incoherent { QuantizeOptions::new(role).hadamard(&signs) } else { QuantizeOptions::new(role) };
    let got = quantize_fp8(gpu, &stream, &dev.as_ref(), &opts)?;
    let input = if incoherent { Hadamard::from_signs(stream.clone_dtoh(&signs)?).apply(&x) } else { x };
    let g = Granularity::of_quantizer(role, d);
    let want = quantize(&input, g);
    let factors = stream.clone_dtoh(got.scales.factors())?;
    if factors != want.scales {
        let bad = factors.iter().zip(&want.scales).position(|(a, b)| a != b);
        return Err(format!("factors differ first at {bad:?} of {}", factors.len()).into());
    }
    let mut want_codes = codes(&want, g);
    if role == Role::V {
        want_codes = transpose_v_codes(&want_codes, shape)?;
    }
    let got_codes = got.tensor.to_codes(&stream)?;
    let wrong = got_codes.iter().zip(&want_codes).filter(|(a, b)| a != b).count();
    if got_codes.len() != want_codes.len() || wrong > 0 {
        return Err(format!("{wrong} of {} codes differ (lengths {} / {})", want_codes.len(), got_codes.len(), want_codes.len()).into());
    }
    Ok(())
}

#[derive(Clone, Copy, Debug)]
enum Scales {
    /// One factor per (batch, K/V head), codes made on the host.
    PerHead,
    /// Block factors from the quantization kernel.
    Blocks,
    /// Block factors after incoherent processing of Q and K.
    BlocksIncoherent,
    /// Block factors of a V whose key blocks are scaled by random powers of two from 1
    /// down to 2^-10: O's unit moves up and down (`common::fp8::VUnit`).
    BlocksSpreadV,
    /// V's block factors times 1.37 (its values too): not powers of two, so O is
    /// converted before every key block's PV.
    BlocksOddV,
    /// Block factors for Q and K, one per head for V: the block kernel's per-head V.
    BlocksHeadV,
    /// Block factors for Q and V, one per head for K: the block kernel's per-head K.
    BlocksHeadK,
    /// Q and K small integers (factor 1; exact scores in any accumulator), V per head.
    Integers,
    /// As `Integers` with a softmax scale of 20: each row's weight is on its largest
    /// score (the others round to e4m3 zero), so O is a V row (or the mean of tied
    /// ones), exactly: any key landing on the wrong V row shows. O only.
    IntegersPeaked,
}

#[derive(Clone, Copy, Debug)]
struct Case {
    out: DType,
    d: usize,
    b: usize,
    sq: usize,
    sk: usize,
    hq: usize,
    hk: usize,
    causal: bool,
    scales: Scales,
    /// V given as stored (`[b, s, h, d]`): the kernel transposes it in shared memory.
    v_rows: bool,
}

impl Case {
    fn name(&self) -> String {
        format!(
            "fp8_hdim{}_{}_b{}_sq{}_sk{}_h{}x{}{}_{:?}{}",
            self.d,
            self.out.name(),
            self.b,
            self.sq,
            self.sk,
            self.hq,
            self.hk,
            if self.causal { "_causal" } else { "" },
            self.scales,
            if self.v_rows { "_vrows" } else { "" }
        )
    }
}

fn cases() -> Vec<Case> {
    let base = Case { out: DType::BF16, d: 128, b: 2, sq: 1000, sk: 777, hq: 4, hk: 2, causal: false, scales: Scales::Blocks, v_rows: false };
    let mut v = Vec::new();
    for d in [64, 128, 256] {
        for causal in [false, true] {
            for scales in [Scales::PerHead, Scales::Blocks, Scales::BlocksIncoherent] {
                v.push(Case { d, causal, scales, ..base });
            }
        }
        v.push(Case { d, out: DType::F16, sq: 257, sk: 1500, hq: 3, hk: 1, causal: true, ..base });
        // V's factors: spread over 2^10 (O's unit moves), or not powers of two.
        v.push(Case { d, sq: 300, sk: 3000, scales: Scales::BlocksSpreadV, ..base });
        v.push(Case { d, sq: 300, sk: 3000, causal: true, scales: Scales::BlocksSpreadV, ..base });
        v.push(Case { d, sq: 300, sk: 1500, scales: Scales::BlocksOddV, ..base });
        v.push(Case { d, sq: 300, sk: 1500, scales: Scales::BlocksSpreadV, ..Case { v_rows: true, ..base } });
        // One of K and V per head, the other per block: the block kernel.
        v.push(Case { d, sq: 300, sk: 1500, causal: true, scales: Scales::BlocksHeadV, ..base });
        v.push(Case { d, sq: 300, sk: 1500, scales: Scales::BlocksHeadK, ..base });
        v.push(Case { d, sq: 1, sk: 17, b: 1, hq: 2, hk: 2, ..base });
        // From `common::fp8::WIDE_MIN_KEYS` keys, per-head K and V factors run the
        // wide-tile kernel (`common::fp8::block_n`): both output types, ragged last
        // tiles, causal or not, and the exact layout check (one V row per output row).
        v.push(Case { d, out: DType::F16, sq: 257, sk: 2500, hq: 3, hk: 1, causal: true, scales: Scales::PerHead, ..base });
        v.push(Case { d, sq: 1000, sk: 2100, scales: Scales::PerHead, ..base });
        v.push(Case { d, causal: true, sq: 700, sk: 2300, scales: Scales::IntegersPeaked, ..base });
        v.push(Case { d, sq: 1, sk: 17, b: 1, hq: 2, hk: 2, scales: Scales::PerHead, ..base });
        v.push(Case { d, sq: 4097, sk: 4097, b: 1, hq: 1, hk: 1, causal: true, ..base });
        v.push(Case { d, sq: 300, sk: 90, causal: true, scales: Scales::PerHead, ..base });
        v.push(Case { d, scales: Scales::Integers, ..base });
        v.push(Case { d, causal: true, sq: 700, sk: 1100, scales: Scales::Integers, ..base });
        v.push(Case { d, causal: true, sq: 700, sk: 1100, scales: Scales::IntegersPeaked, ..base });
        // V as stored, transposed by the kernel: both key tiles, ragged ends, each kind of
        // factor, and the exact layout checks (one V row per output row).
        let rows = Case { v_rows: true, ..base };
        for causal in [false, true] {
            v.push(Case { d, causal, ..rows });
            v.push(Case { d, causal, sq: 700, sk: 2300, scales: Scales::IntegersPeaked, ..rows });
        }
        v.push(Case { d, causal: true, sq: 700, sk: 1100, scales: Scales::IntegersPeaked, ..rows });
        v.push(Case { d, out: DType::F16, sq: 257, sk: 2500, hq: 3, hk: 1, causal: true, scales: Scales::PerHead, ..rows });
        v.push(Case { d, scales: Scales::BlocksIncoherent, ..rows });
        v.push(Case { d, scales: Scales::Integers, ..rows });
        v.push(Case { d, sq: 1, sk: 17, b: 1, hq: 2, hk: 2, scales: Scales::PerHead, ..rows });
        v.push(Case { d, sq: 4097, sk: 4097, b: 1, hq: 1, hk: 1, causal: true, ..rows });
    }
    v
}

/// V's codes of one factor per (batch, head), as the case gives V to the kernel.
fn v_tensor(stream: &Arc<CudaStream>, c: &Case, codes: &[u8], shape: [usize; 4]) -> Result<Fp8Tensor, Failed> {
    Ok(if c.v_rows {
        Fp8Tensor::from_codes(stream, Arg::V, codes, shape, Fp8Layout::Bshd)?
    } else {
        Fp8Tensor::from_codes(stream, Arg::V, &transpose_v_codes(codes, shape)?, shape, Fp8Layout::VTransposed)?
    })
}

fn run_case(gpu: &Gpu, c: &Case) -> Result<(), Failed> {
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64;
    let mut r = rng(seed);
    let stream = gpu.new_stream()?;
    let (qs, ks) = ([c.b, c.sq, c.hq, c.d], [c.b, c.sk, c.hk, c.d]);
    // Outliers, as in the paper's experiment: what the factors are for.
    let q = flash_attn3::reference::fp8::outlier_tensor(qs, 0.001, 10.0, &mut r);
    let k = flash_attn3::reference::fp8::outlier_tensor(ks, 0.001, 10.0, &mut r);
    let v = flash_attn3::reference::fp8::outlier_tensor(ks, 0.001, 10.0, &mut r);
    let (q, k, v) = [q, k, v].map(|t| HostTensor::new(t.shape, t.data.iter().map(|&x| flash_attn3::round_to(DType::BF16, x)).collect())).into();
    let mut scale = 1.0 / (c.d as f32).sqrt();
    let (q8, k8, v8, sq, sk, sv, hq, hk, hv);
    match c.scales {
        Scales::Integers | Scales::IntegersPeaked => {
            use rand::Rng;
            let ints = |shape: [usize; 4], r: &mut rand::rngs::StdRng| {
                let n = shape.iter().product();
                HostTensor::new(shape, (0..n).map(|_| r.random_range(-4i32..=4) as f32).collect())
            };
            let (qi, ki) = (ints(qs, &mut r), ints(ks, &mut r));
            // Integer scores of magnitude at most 16 · hdim <= 2^12: exact in any
            // accumulator; logits of a few units.
            scale = if matches!(c.scales, Scales::IntegersPeaked) { 20.0 } else { 0.02 };
            let vq = quantize(&v, Granularity::PerHead);
            let to_codes = |t: &HostTensor| t.data.iter().map(|&x| e4m3_code(x)).collect::<Vec<u8>>();
            q8 = Fp8Tensor::from_codes(&stream, Arg::Q, &to_codes(&qi), qs, Fp8Layout::Bshd)?;
            k8 = Fp8Tensor::from_codes(&stream, Arg::K, &to_codes(&ki), ks, Fp8Layout::Bshd)?;
            v8 = v_tensor(&stream, c, &codes(&vq, Granularity::PerHead), ks)?;
            let ones = vec![1.0f32; c.b * c.hk];
            sq = Descale::from_host(&stream, Arg::QDescale, &ones, DescaleKind::PerHead)?;
            sk = Descale::from_host(&stream, Arg::KDescale, &ones, DescaleKind::PerHead)?;
            sv = Descale::from_host(&stream, Arg::VDescale, &vq.scales, DescaleKind::PerHead)?;
            (hq, hk, hv) = (qi, ki, vq.values);
        }
        Scales::PerHead => {
            // FlashAttention-3's layout: Q's factors per (batch, K/V head) too.
            let group = c.hq / c.hk;
            let qh = HostTensor::new([c.b, c.sq * group, c.hk, c.d], {
                // Q's rows of a K/V group, gathered so that one "head" is the whole group.
                let mut out = vec![0f32; q.data.len()];
                for bi in 0..c.b {
                    for si in 0..c.sq {
                        for hi in 0..c.hq {
                            let (hk_i, g) = (hi / group, hi % group);
                            let src = ((bi * c.sq + si) * c.hq + hi) * c.d;
                            let dst = ((bi * c.sq * group + si * group + g) * c.hk + hk_i) * c.d;
                            out[dst..dst + c.d].copy_from_slice(&q.data[src..src + c.d]);
                        }
                    }
                }
                out
            });
            let qg = quantize(&qh, Granularity::PerHead);
            // Back to q's layout: the same factor for every head of a group.
            let mut qv = q.clone();
            let mut q_codes = vec![0u8; q.data.len()];
            for bi in 0..c.b {
                for si in 0..c.sq {
                    for hi in 0..c.hq {
                        let (hk_i, g) = (hi / group, hi % group);
                        let src = ((bi * c.sq * group + si * group + g) * c.hk + hk_i) * c.d;
                        let dst = ((bi * c.sq + si) * c.hq + hi) * c.d;
                        let f = qg.scales[bi * c.hk + hk_i];
                        for e in 0..c.d {
                            qv.data[dst + e] = qg.values.data[src + e];
                            q_codes[dst + e] = e4m3_code(qg.values.data[src + e] / f);
                        }
                    }
                }
            }
            let (kq, vq) = (quantize(&k, Granularity::PerHead), quantize(&v, Granularity::PerHead));
            q8 = Fp8Tensor::from_codes(&stream, Arg::Q, &q_codes, qs, Fp8Layout::Bshd)?;
            k8 = Fp8Tensor::from_codes(&stream, Arg::K, &codes(&kq, Granularity::PerHead), ks, Fp8Layout::Bshd)?;
            v8 = v_tensor(&stream, c, &codes(&vq, Granularity::PerHead), ks)?;
            sq = Descale::from_host(&stream, Arg::QDescale, &qg.scales, DescaleKind::PerHead)?;
            sk = Descale::from_host(&stream, Arg::KDescale, &kq.scales, DescaleKind::PerHead)?;
            sv = Descale::from_host(&stream, Arg::VDescale, &vq.scales, DescaleKind::PerHead)?;
            (hq, hk, hv) = (qv, kq.values, vq.values);
        }
        Scales::Blocks | Scales::BlocksIncoherent | Scales::BlocksSpreadV | Scales::BlocksOddV | Scales::BlocksHeadV | Scales::BlocksHeadK => {
            let incoherent = matches!(c.scales, Scales::BlocksIncoherent);
            let bn = block_rows(Role::V, c.d);
            let mut v = v;
            if matches!(c.scales, Scales::BlocksSpreadV) {
                use rand::Rng;
                let shifts: Vec<i32> = (0..c.b * c.sk.div_ceil(bn)).map(|_| r.random_range(-10..=0)).collect();
                for (i, row) in v.data.chunks_mut(c.hk * c.d).enumerate() {
                    let (bi, si) = (i / c.sk, i % c.sk);
                    let f = 2f32.powi(shifts[bi * c.sk.div_ceil(bn) + si / bn]);
                    row.iter_mut().for_each(|x| *x *= f);
                }
            }
            let signs = hadamard_signs(&stream, c.d, seed)?;
            let up = |t: &HostTensor| DeviceTensor::from_f32(&stream, DType::BF16, t.shape, &t.data);
            let (qd, kd, vd) = (up(&q)?, up(&k)?, up(&v)?);
            let opts = |role| if incoherent && role != Role::V { QuantizeOptions::new(role).hadamard(&signs) } else { QuantizeOptions::new(role) };
            let (a, b, e) = (
                quantize_fp8(gpu, &stream, &qd.as_ref(), &opts(Role::Q))?,
                quantize_fp8(gpu, &stream, &kd.as_ref(), &opts(Role::K))?,
                // V as stored: K's layout and key blocks, never transformed.
                quantize_fp8(gpu, &stream, &vd.as_ref(), &QuantizeOptions::new(if c.v_rows { Role::VRows } else { Role::V }))?,
            );
            let h = Hadamard::from_signs(stream.clone_dtoh(&signs)?);
            let (qi, ki) = if incoherent { (h.apply(&q), h.apply(&k)) } else { (q.clone(), k.clone()) };
            hq = quantize(&qi, Granularity::of_quantizer(Role::Q, c.d)).values;
            let (mut k8b, mut skb) = (b.tensor, b.scales);
            let (mut v8b, mut svb) = (e.tensor, e.scales);
            let mut k_values = quantize(&ki, Granularity::of_quantizer(Role::K, c.d)).values;
            let mut v_values = quantize(&v, Granularity::of_quantizer(Role::V, c.d)).values;
            match c.scales {
                Scales::BlocksOddV => {
                    const ODD: f32 = 1.37;
                    let f: Vec<f32> = stream.clone_dtoh(svb.factors())?.iter().map(|x| x * ODD).collect();
                    v_values.data.iter_mut().for_each(|x| *x *= ODD);
                    svb = Descale::from_host(&stream, Arg::VDescale, &f, DescaleKind::Blocks { rows: bn })?;
                }
                Scales::BlocksHeadV => {
                    let vq = quantize(&v, Granularity::PerHead);
                    v8b = v_tensor(&stream, c, &codes(&vq, Granularity::PerHead), ks)?;
                    svb = Descale::from_host(&stream, Arg::VDescale, &vq.scales, DescaleKind::PerHead)?;
                    v_values = vq.values;
                }
                Scales::BlocksHeadK => {
                    let kq = quantize(&ki, Granularity::PerHead);
                    k8b = Fp8Tensor::from_codes(&stream, Arg::K, &codes(&kq, Granularity::PerHead), ks, Fp8Layout::Bshd)?;
                    skb = Descale::from_host(&stream, Arg::KDescale, &kq.scales, DescaleKind::PerHead)?;
                    k_values = kq.values;
                }
                _ => {}
            }
            (hk, hv) = (k_values, v_values);
            (q8, k8, v8, sq, sk, sv) = (a.tensor, k8b, v8b, a.scales, skb, svb);
        }
    }
    let opts = Fp8Options::default().causal(c.causal).out_dtype(c.out).softmax_scale(scale);
    let res = flash_attn_fp8(gpu, &stream, &q8, &k8, &v8, &Fp8Descales { q: &sq, k: &sk, v: &sv }, &opts)?;
    let got = AttnResult { o: res.out.to_f32(&stream)?, lse: stream.clone_dtoh(&res.lse)? };
    let p = Problem::plain(&hq, &hk, &hv, c.causal, scale);
    let exact = attention_f64(&p);
    let f32_scores = attention_fp8_lowp(&p, c.out);
    let exact_scores = matches!(c.scales, Scales::Integers | Scales::IntegersPeaked);
    let naive = if exact_scores { f32_scores.clone() } else { attention_fp8_naive(&p, c.out) };
    let (o_err, o_naive) = (max_abs_err(&got.o, &exact.o), max_abs_err(&naive.o, &exact.o));
    let (l_err, l_naive) = (max_abs_err(&got.lse, &exact.lse), max_abs_err(&naive.lse, &exact.lse));
    let l_f32 = max_abs_err(&f32_scores.lse, &exact.lse);
    let report = format!("O err {o_err:.3e} (naive {o_naive:.3e}); LSE err {l_err:.3e} (naive {l_naive:.3e}, with f32 scores {l_f32:.3e})");
    // Peaked rows have logits in the thousands, where an f32 ulp is above the LSE's
    // slack: their LSE is the plain integer cases' to check.
    let lse_ok = matches!(c.scales, Scales::IntegersPeaked) || within_budget(l_err, l_naive, LSE_SLACK);
    if !(within_budget(o_err, o_naive, O_SLACK) && lse_ok) {
        return Err(format!("seed {seed}: {report}: FAIL").into());
    }
    println!("    {}: {report}: PASS", c.name());
    Ok(())
}

/// V given as e4m3 `[b, s, h, d]` (transposed by the kernel in shared memory, or by
/// `transpose_v_fp8` over the whole tensor) gives the transposed V's result bit for bit,
/// and the GPU's transposed codes are the host's. `sk` from 2048 with per-head factors
/// takes the wide key tile at hdim 128.
fn v_in_bshd_gives_the_transposed_v_result(gpu: &Gpu, d: usize, sk: usize, causal: bool) -> Result<(), Failed> {
    let stream = gpu.new_stream()?;
    let (qs, ks) = ([2, 333, 4, d], [2, sk, 2, d]);
    let mut r = rng(5);
    let mut t = |shape| flash_attn3::reference::fp8::outlier_tensor(shape, 0.001, 10.0, &mut r);
    let (q, k, v) = (t(qs), t(ks), t(ks));
    let (kz, vz) = (quantize(&k, Granularity::PerHead), quantize(&v, Granularity::PerHead));
    let v_codes = codes(&vz, Granularity::PerHead);
    // Q's codes are its values rounded (factor 1): the comparison is between layouts of
    // V, not against a reference.
    let q8 = Fp8Tensor::from_codes(&stream, Arg::Q, &q.data.iter().map(|&x| e4m3_code(x)).collect::<Vec<_>>(), qs, Fp8Layout::Bshd)?;
    let k8 = Fp8Tensor::from_codes(&stream, Arg::K, &codes(&kz, Granularity::PerHead), ks, Fp8Layout::Bshd)?;
    let v_bshd = Fp8Tensor::from_codes(&stream, Arg::V, &v_codes, ks, Fp8Layout::Bshd)?;
    let v_t = Fp8Tensor::from_codes(&stream, Arg::V, &transpose_v_codes(&v_codes, ks)?, ks, Fp8Layout::VTransposed)?;
    let gpu_t = flash_attn3::fp8::transpose_v_fp8(gpu, &stream, &v_bshd)?;
    if gpu_t.to_codes(&stream)? != transpose_v_codes(&v_codes, ks)? {
        return Err("the GPU transpose differs from the host's".into());
    }
    let ones = vec![1.0f32; 2 * 2];
    let sq = Descale::from_host(&stream, Arg::QDescale, &ones, DescaleKind::PerHead)?;
    let sk = Descale::from_host(&stream, Arg::KDescale, &kz.scales, DescaleKind::PerHead)?;
    let sv = Descale::from_host(&stream, Arg::VDescale, &vz.scales, DescaleKind::PerHead)?;
    let scales = Fp8Descales { q: &sq, k: &sk, v: &sv };
    let opts = Fp8Options::default().causal(causal);
    let bits = |x: Vec<f32>| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let b = flash_attn_fp8(gpu, &stream, &q8, &k8, &v_t, &scales, &opts)?;
    let (b_out, b_lse) = (bits(b.out.to_f32(&stream)?), bits(stream.clone_dtoh(&b.lse)?));
    for (how, v) in [("in the kernel", &v_bshd), ("by transpose_v_fp8", &gpu_t)] {
        let a = flash_attn_fp8(gpu, &stream, &q8, &k8, v, &scales, &opts)?;
        if bits(a.out.to_f32(&stream)?) != b_out || bits(stream.clone_dtoh(&a.lse)?) != b_lse {
            return Err(format!("V in [b, s, h, d] transposed {how} and V given transposed give different results").into());
        }
    }
    Ok(())
}

fn main() {
    let mut args = Arguments::from_args();
    args.test_threads.get_or_insert(1);
    let gpu = support::gpu_or_skip("FP8 GPU tests");
    let mut trials = Vec::new();
    for dtype in [DType::BF16, DType::F16] {
        for d in [64, 128, 256] {
            for role in [Role::Q, Role::K, Role::V, Role::VRows] {
                for incoherent in [false, true] {
                    if incoherent && matches!(role, Role::V | Role::VRows) {
                        continue;
                    }
                    let name = format!("quantize_matches_cpu_{}_hdim{d}_{role:?}{}", dtype.name(), if incoherent { "_hadamard" } else { "" });
                    trials.push(support::gpu_trial(name, &gpu, move |g| quantize_matches_cpu(g, dtype, d, role, incoherent)));
                }
            }
        }
    }
    for c in cases() {
        trials.push(support::gpu_trial(c.name(), &gpu, move |g| run_case(g, &c)));
    }
    for d in [64, 128, 256] {
        for (sk, causal) in [(300, true), (300, false), (2100, false), (4500, true)] {
            let name = format!("v_in_bshd_gives_the_transposed_v_result_hdim{d}_sk{sk}{}", if causal { "_causal" } else { "" });
            trials.push(support::gpu_trial(name, &gpu, move |g| v_in_bshd_gives_the_transposed_v_result(g, d, sk, causal)));
        }
    }
    libtest_mimic::run(&args, trials).exit();
}
