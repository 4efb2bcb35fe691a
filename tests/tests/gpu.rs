//! GPU tests: every kernel against the f64 reference under FlashAttention's rule
//! (max error <= 2 x the naive low-precision error + slack), on fresh random inputs at
//! awkward sizes, with outputs poisoned with NaN before each launch, NaN padding around
//! strided inputs, and bit-identical repeats.
//!
//! Without a usable GPU every test is reported as ignored and the reason is printed.
//! `FA3_REQUIRE_GPU=1` turns that into a failure (for runs that must not skip).
use flash_attn3::check::check;
use flash_attn3::reference::{AttnResult, HostAlibi, HostDocs, HostTensor, Problem, Window, rng};
use flash_attn3::{
    Algo, AttnOptions, DType, DeviceTensor, DocumentMask, Gpu, Layout, Schedule, Techniques, flash_attn_func_into, round_to,
};
use libtest_mimic::{Arguments, Failed, Trial};
use support::{bits, padded, transposed};

mod support;
use cudarc::driver::CudaStream;
use std::sync::Arc;

/// How a case lays its tensors out in memory.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Storage {
    /// Packed `[b, s, h, d]`.
    Packed,
    /// q stored `[b, h, s, d]` (a transposed view), k/v and out with padded rows and
    /// heads; NaN in every gap.
    Strided,
}

#[derive(Clone, Debug)]
struct Case {
    /// `None`: the planner's default (FA3 with the head dim's default techniques).
    algo: Option<Algo>,
    dtype: DType,
    d: usize,
    b: usize,
    sq: usize,
    sk: usize,
    hq: usize,
    hk: usize,
    causal: bool,
    storage: Storage,
    /// Not `Auto`: the case also checks that the output is bit-identical to one tile per
    /// CTA (a tile's result must not depend on which CTA computed it, or when).
    schedule: Schedule,
    /// Keys scaled up towards the sequence start (x1 at the end, x7 at the start): in the
    /// FA3 kernels' order (last key block first) every row's max climbs past the lazy
    /// rescaling threshold several times, so the accumulator must be rescaled mid-row.
    climbing: bool,
    /// Soft-capping at this cap (the soft-capping kernels).
    softcap: Option<f32>,
    /// ALiBi, with slopes per head (`Some(false)`) or per (batch, head) (`Some(true)`).
    alibi: Option<bool>,
    /// A sliding window (left, right).
    window: Option<(Option<usize>, Option<usize>)>,
    /// Attention sinks ([`support::sink_logits`]).
    sinks: bool,
    /// Packed documents of these lengths (cycled, `flash_attn3::documents::packed_doc_ids`),
    /// one packing per batch element (`true`) or one shared.
    docs: Option<(&'static [usize], bool)>,
}

impl Case {
    /// `b = 2`, one query and key, 3 heads, packed, default schedule: the base the
    /// cases below vary.
    fn base(algo: Option<Algo>, dtype: DType, d: usize, causal: bool) -> Self {
        Case {
            algo,
            dtype,
            d,
            b: 2,
            sq: 1,
            sk: 1,
            hq: 3,
            hk: 3,
            causal,
            storage: Storage::Packed,
            schedule: Schedule::Auto,
            climbing: false,
            softcap: None,
            alibi: None,
            window: None,
            sinks: false,
            docs: None,
        }
    }

    fn name(&self) -> String {
        let algo = match self.algo {
            None => "fa3",
            Some(Algo::Fa2) => "fa2",
            Some(Algo::Fa3(t)) if t == Techniques::FULL => "fa3full",
            Some(Algo::Fa3(t)) if t == Techniques::NO_PINGPONG => "fa3nopingpong",
            Some(Algo::Fa3(t)) if t == Techniques::NO_OVERLAP => "fa3nooverlap",
            Some(Algo::Fa3(_)) => "fa3nows",
        };
        format!(
            "{}_{}_d{}_b{}_sq{}_sk{}_h{}-{}_{}{}{}{}{}{}{}",
            algo,
            self.dtype.name(),
            self.d,
            self.b,
            self.sq,
            self.sk,
            self.hq,
            self.hk,
            if self.causal { "causal" } else { "full" },
            if self.storage == Storage::Strided { "_strided" } else { "" },
            if self.climbing { "_climbing" } else { "" },
            support::variant_suffix(self.softcap.is_some(), self.alibi, self.window, self.sinks),
            // The caps other than the usual 1.5 by value.
            self.softcap.filter(|&c| c != 1.5).map_or(String::new(), |c| format!("{c}")),
            support::docs_suffix(self.docs),
            match self.schedule {
                Schedule::Auto => "",
                Schedule::Persistent => "_persistent",
                Schedule::PersistentDynamic => "_dynamic",
                Schedule::TilePerCta => "_tilepercta",
                Schedule::PersistentMulticast => "_multicast",
            }
        )
        .to_lowercase()
    }
}

fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for algo in [None, Some(Algo::Fa2)] {
        for dtype in DType::ALL {
            for d in [64, 128, 256] {
                for causal in [false, true] {
                    let base = Case::base(algo, dtype, d, causal);
                    for s in [1, 17, 1000] {
                        v.push(Case { sq: s, sk: s, ..base.clone() });
                    }
                    v.push(Case { b: 1, sq: 4097, sk: 4097, hq: 2, hk: 2, ..base.clone() });
                    // seqlen_q != seqlen_k both ways (rows without keys when causal), GQA 4 and MQA.
                    v.push(Case { sq: 300, sk: 1000, hq: 8, hk: 2, ..base.clone() });
                    v.push(Case { sq: 1000, sk: 300, hq: 4, hk: 1, ..base.clone() });
                    v.push(Case { sq: 333, sk: 257, hq: 4, hk: 2, storage: Storage::Strided, ..base.clone() });
                    v.push(Case { sq: 700, sk: 1000, hq: 2, hk: 1, climbing: true, ..base.clone() });
                }
            }
        }
    }
    // More tiles than SMs: the persistent grids loop over several tiles per CTA (in the
    // static or the claimed order), and every schedule gives the same bits.
    for d in [64, 128, 256] {
        for causal in [false, true] {
            for schedule in [
                Schedule::Auto,
                Schedule::Persistent,
                Schedule::PersistentDynamic,
                Schedule::TilePerCta,
                Schedule::PersistentMulticast,
            ] {
                if schedule == Schedule::PersistentMulticast && (causal || d != 128) {
                    continue;
                }
                let base = Case::base(None, DType::BF16, d, causal);
                v.push(Case { b: 3, sq: 1500, sk: 1300, hq: 8, hk: 4, schedule, ..base });
            }
        }
    }
    // Multicast clusters (hdim 128 without a causal mask, opt-in): odd numbers of query
    // blocks (1, 3, 5: one CTA of each head's last pair has no rows) and an even one.
    for dtype in DType::ALL {
        for (sq, sk) in [(1, 1), (257, 700), (640, 333), (1000, 1000)] {
            let base = Case::base(None, dtype, 128, false);
            v.push(Case { sq, sk, hq: 4, hk: 2, schedule: Schedule::PersistentMulticast, ..base });
        }
    }
    // hdim 64 causal whose last 192-row tile has 64 or 65 rows: its second and third
    // warpgroups, or its third alone, have no row and skip every key block. Then 64-row
    // tails (448 = 2 x 192 + 64, 1024) with other key counts, both masks, and with more
    // tiles than SMs.
    for sq in [1024, 1025] {
        let base = Case::base(None, DType::F16, 64, true);
        v.push(Case { sq, sk: sq, hq: 4, hk: 2, ..base });
    }
    for dtype in DType::ALL {
        for causal in [false, true] {
            let base = Case::base(None, dtype, 64, causal);
            v.push(Case { b: 1, sq: 448, sk: 700, hq: 4, hk: 1, ..base.clone() });
            v.push(Case { b: 1, sq: 1024, sk: 333, hq: 2, hk: 2, ..base.clone() });
            v.push(Case { b: 8, sq: 1024, sk: 1024, hq: 16, hk: 4, ..base });
        }
    }
    // hdim 256 past 4096 keys runs its 80-key kernel (64-key up to it): a key block
    // padded at the end, queries shorter than keys, strided, and more tiles than SMs
    // (144, in the dynamic order: causal).
    for dtype in DType::ALL {
        for causal in [false, true] {
            let base = Case::base(None, dtype, 256, causal);
            v.push(Case { b: 1, sq: 300, sk: 4500, hq: 4, hk: 2, storage: Storage::Strided, ..base });
        }
    }
    let base = Case::base(None, DType::F16, 256, true);
    v.push(Case { b: 1, sq: 1100, sk: 4200, hq: 16, hk: 2, ..base });
    // Soft-capping at 1.5 (the logits, ~N(0, 1) here, saturate) and ALiBi (standard slopes,
    // per head or per (batch, head)), each on the same shapes: every head dim (hdim 256 both
    // key blocks), both dtypes and masks, GQA, rows without keys, strided, more tiles than
    // SMs; soft-capping with climbing maxima too.
    for dtype in DType::ALL {
        for d in [64, 128, 256] {
            for causal in [false, true] {
                for (softcap, alibi) in [(None, Some(causal)), (Some(1.5), None)] {
                    let base = Case { softcap, alibi, ..Case::base(None, dtype, d, causal) };
                    v.push(Case { sq: 17, sk: 17, ..base.clone() });
                    v.push(Case { sq: 1000, sk: 300, hq: 4, hk: 1, ..base.clone() });
                    v.push(Case { sq: 333, sk: 257, hq: 4, hk: 2, storage: Storage::Strided, ..base.clone() });
                    if softcap.is_some() {
                        v.push(Case { sq: 700, sk: 1000, hq: 2, hk: 1, climbing: true, ..base.clone() });
                    }
                    v.push(Case { b: 3, sq: 1500, sk: 1300, hq: 8, hk: 4, ..base.clone() });
                    if d == 256 {
                        v.push(Case { b: 1, sq: 300, sk: 4500, hq: 4, hk: 2, ..base.clone() });
                    }
                }
            }
        }
    }
    // Soft-capping at real models' caps, 30 (Grok-1) and 50 (Gemma 2), where the kernels'
    // `tanh.approx` error, times the cap, shows in the LSE of rows with large logits
    // (climbing maxima): the naive baseline computes the `tanh` in the input type
    // (`reference::attention_lowp`).
    for dtype in DType::ALL {
        for d in [64, 128, 256] {
            for causal in [false, true] {
                for cap in [30.0, 50.0] {
                    let base = Case { softcap: Some(cap), ..Case::base(None, dtype, d, causal) };
                    v.push(Case { sq: 1000, sk: 1300, hq: 4, hk: 2, ..base.clone() });
                    v.push(Case { sq: 700, sk: 1000, hq: 2, hk: 1, climbing: true, ..base.clone() });
                }
            }
        }
    }
    // Sliding windows: narrower than a tile (5, 3), one side unbounded, rows that see no
    // key (left-only windows with more queries than keys), GQA and MQA, strided, more
    // tiles than SMs; with and without the causal mask, which caps the right side. Then
    // windows with soft-capping and with ALiBi.
    for dtype in DType::ALL {
        for d in [64, 128, 256] {
            for causal in [false, true] {
                let base = Case::base(None, dtype, d, causal);
                v.push(Case { sq: 1000, sk: 1000, window: Some((Some(100), Some(20))), ..base.clone() });
                v.push(Case { sq: 300, sk: 1000, hq: 8, hk: 2, window: Some((Some(5), Some(3))), ..base.clone() });
                v.push(Case { sq: 1000, sk: 300, hq: 4, hk: 1, window: Some((Some(64), None)), ..base.clone() });
                v.push(Case { sq: 333, sk: 257, hq: 4, hk: 2, storage: Storage::Strided, window: Some((None, Some(40))), ..base.clone() });
                v.push(Case { b: 3, sq: 1500, sk: 1300, hq: 8, hk: 4, window: Some((Some(200), Some(0))), ..base.clone() });
                v.push(Case { sq: 700, sk: 1000, hq: 2, hk: 1, softcap: Some(1.5), window: Some((Some(128), Some(7))), ..base.clone() });
                v.push(Case { sq: 1000, sk: 700, hq: 4, hk: 2, alibi: Some(causal), window: Some((Some(300), Some(64))), ..base.clone() });
            }
        }
    }
    // Attention sinks (one logit per head, from below to above the rows' logits): every
    // head dim and dtype, both masks, GQA, rows that see no key (their LSE is the sink's),
    // strided, climbing maxima (lazy rescaling before the sink joins), more tiles than
    // SMs, with a window, soft-capping and ALiBi.
    for dtype in DType::ALL {
        for d in [64, 128, 256] {
            for causal in [false, true] {
                let base = Case { sinks: true, ..Case::base(None, dtype, d, causal) };
                v.push(Case { sq: 17, sk: 17, ..base.clone() });
                v.push(Case { sq: 1000, sk: 300, hq: 4, hk: 1, ..base.clone() });
                v.push(Case { sq: 333, sk: 257, hq: 4, hk: 2, storage: Storage::Strided, ..base.clone() });
                v.push(Case { sq: 700, sk: 1000, hq: 4, hk: 1, climbing: true, ..base.clone() });
                v.push(Case { b: 3, sq: 1500, sk: 1300, hq: 8, hk: 4, window: Some((Some(128), Some(0))), ..base.clone() });
                v.push(Case { sq: 500, sk: 500, hq: 4, hk: 2, softcap: Some(1.5), ..base.clone() });
                v.push(Case { sq: 500, sk: 700, hq: 4, hk: 2, alibi: Some(false), ..base.clone() });
            }
        }
    }
    // Packed documents: of one token, shorter and longer than a tile; one packing per
    // batch element or shared; fewer queries than keys (rows at the last keys); GQA and
    // MQA, strided, more tiles than SMs; with a window, with sinks and soft-capped.
    for dtype in DType::ALL {
        for d in [64, 128, 256] {
            for causal in [false, true] {
                let base = Case::base(None, dtype, d, causal);
                v.push(Case { sq: 17, sk: 17, docs: Some((&[5], false)), ..base.clone() });
                v.push(Case { sq: 1000, sk: 1000, hq: 4, hk: 1, docs: Some((&[1, 17, 100, 300, 64], true)), ..base.clone() });
                v.push(Case { sq: 300, sk: 1000, hq: 8, hk: 2, docs: Some((&[333], false)), ..base.clone() });
                v.push(Case { sq: 257, sk: 257, hq: 4, hk: 2, storage: Storage::Strided, window: Some((Some(20), Some(5))), docs: Some((&[50, 7], true)), ..base.clone() });
                v.push(Case { b: 3, sq: 1500, sk: 1500, hq: 8, hk: 4, sinks: true, docs: Some((&[700, 128, 1], true)), ..base.clone() });
                v.push(Case { sq: 700, sk: 1000, hq: 4, hk: 2, softcap: Some(1.5), docs: Some((&[300, 64, 1], true)), ..base.clone() });
                v.push(Case { sq: 333, sk: 333, hq: 2, hk: 1, softcap: Some(1.5), window: Some((Some(50), Some(0))), docs: Some((&[100], false)), ..base.clone() });
                // With ALiBi (per-batch slopes or shared), soft-capped or not, with a window.
                v.push(Case { sq: 700, sk: 1000, hq: 4, hk: 2, alibi: Some(causal), docs: Some((&[300, 64, 1], true)), ..base.clone() });
                v.push(Case { b: 3, sq: 1500, sk: 1500, hq: 8, hk: 4, alibi: Some(false), sinks: true, docs: Some((&[700, 128, 1], true)), ..base.clone() });
                v.push(Case { sq: 333, sk: 333, hq: 2, hk: 1, softcap: Some(1.5), alibi: Some(true), window: Some((Some(50), Some(0))), docs: Some((&[100], false)), ..base.clone() });
            }
        }
    }
    // Soft-capping with ALiBi (the bias after the cap): every head dim, both dtypes and
    // masks, GQA, rows without keys, more tiles than SMs, and with a window.
    for dtype in DType::ALL {
        for d in [64, 128, 256] {
            for causal in [false, true] {
                let base = Case { softcap: Some(1.5), alibi: Some(causal), ..Case::base(None, dtype, d, causal) };
                v.push(Case { sq: 1000, sk: 300, hq: 4, hk: 1, ..base.clone() });
                v.push(Case { b: 3, sq: 1500, sk: 1300, hq: 8, hk: 4, ..base.clone() });
                v.push(Case { sq: 700, sk: 700, hq: 4, hk: 2, window: Some((Some(100), Some(30))), ..base.clone() });
            }
        }
    }
    // The hdim 128 variants compute the same function as its default (every technique):
    // every technique named explicitly and no pingpong
    // (both dtypes, both masks), and the fp16 ablation kernels.
    let variants = [
        (Techniques::FULL, DType::F16),
        (Techniques::FULL, DType::BF16),
        (Techniques::NO_PINGPONG, DType::F16),
        (Techniques::NO_PINGPONG, DType::BF16),
        (Techniques::NO_OVERLAP, DType::F16),
        (Techniques::NO_WARP_SPECIALIZATION, DType::F16),
    ];
    for (t, dtype) in variants {
        for causal in [false, true] {
            let base = Case::base(Some(Algo::Fa3(t)), dtype, 128, causal);
            v.push(Case { sq: 17, sk: 17, ..base.clone() });
            v.push(Case { sq: 1000, sk: 1000, ..base.clone() });
            v.push(Case { sq: 1000, sk: 300, hq: 4, hk: 1, ..base.clone() });
            v.push(Case { sq: 333, sk: 700, hq: 4, hk: 2, storage: Storage::Strided, ..base.clone() });
            // More tiles than SMs: several tiles per CTA (Q released early, refilled).
            v.push(Case { b: 3, sq: 1500, sk: 1300, hq: 8, hk: 4, ..base.clone() });
        }
    }
    // hdim 64 causal with more tiles than SMs, so CTAs claim tiles from the counter, and
    // warpgroups skip the key blocks past their diagonal.
    for dtype in DType::ALL {
        let base = Case::base(None, dtype, 64, true);
        v.push(Case { b: 8, sq: 1000, sk: 1000, hq: 16, hk: 4, ..base });
    }
    v
}

struct Outputs {
    o: DeviceTensor,
    lse: cudarc::driver::CudaSlice<f32>,
}

fn run_once(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    c: &Case,
    p: &Problem<'_>,
    inputs: &[DeviceTensor; 3],
    schedule: Schedule,
) -> Result<Outputs, Failed> {
    let (out_layout, out_len) = match c.storage {
        Storage::Packed => (Layout::contiguous(p.q.shape), p.q.data.len()),
        Storage::Strided => padded(p.q.shape),
    };
    // Poison: every output element starts as NaN, so an unwritten one fails the check.
    let nan = vec![f32::NAN; out_layout.numel()];
    let mut o = DeviceTensor::from_f32_strided(stream, c.dtype, out_layout, out_len, &nan, f32::NAN)?;
    let lse_len = c.b * c.hq * c.sq;
    let mut lse = stream.clone_htod(&vec![f32::NAN; lse_len + 7])?;
    let slopes = match p.alibi {
        Some(a) => Some(stream.clone_htod(a.slopes)?),
        None => None,
    };
    let window = c.window.map(|(left, right)| Window { left, right });
    let sinks = match p.sinks {
        Some(s) => Some(stream.clone_htod(s)?),
        None => None,
    };
    let docs = match p.docs {
        Some(d) => Some(DocumentMask::from_ids(stream, d.ids, d.per_batch.then_some(c.b))?),
        None => None,
    };
    let mut opts = AttnOptions {
        algo: c.algo,
        softcap: c.softcap,
        window,
        sinks: sinks.as_ref(),
        documents: docs.as_ref(),
        ..AttnOptions::default().causal(c.causal).schedule(schedule)
    };
    if let (Some(dev), Some(a)) = (&slopes, p.alibi) {
        opts = opts.alibi(dev, a.per_batch);
    }
    let [q, k, v] = inputs;
    flash_attn_func_into(gpu, stream, &q.as_ref(), &k.as_ref(), &v.as_ref(), &mut o.as_mut(), &mut lse, &opts)?;
    stream.synchronize()?;
    Ok(Outputs { o, lse })
}

fn run_case(gpu: &Gpu, c: &Case) -> Result<(), Failed> {
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64;
    let mut r = rng(seed);
    let q = HostTensor::randn([c.b, c.sq, c.hq, c.d], c.dtype, 1.0, &mut r);
    let mut k = HostTensor::randn([c.b, c.sk, c.hk, c.d], c.dtype, 1.0, &mut r);
    if c.climbing {
        let row = c.hk * c.d;
        for (i, x) in k.data.iter_mut().enumerate() {
            let j = (i / row) % c.sk;
            *x = round_to(c.dtype, *x * (1.0 + 6.0 * (c.sk - 1 - j) as f32 / c.sk as f32));
        }
    }
    let v = HostTensor::randn([c.b, c.sk, c.hk, c.d], c.dtype, 1.0, &mut r);
    let slopes = support::alibi_slopes(c.b, c.hq, c.alibi == Some(true));
    let alibi = c.alibi.map(|per_batch| HostAlibi { slopes: &slopes, per_batch });
    let sink_logits = support::sink_logits(c.hq);
    let sinks = c.sinks.then_some(&sink_logits[..]);
    let doc_ids = support::doc_ids(c.docs, c.b, c.sk);
    let docs = c.docs.zip(doc_ids.as_deref()).map(|((_, per_batch), ids)| HostDocs { ids, per_batch });
    let p = Problem { q: &q, k: &k, v: &v, causal: c.causal, scale: 1.0 / (c.d as f32).sqrt(), softcap: c.softcap, alibi, window: c.window.map(|(left, right)| Window { left, right }), sinks, docs, variant: None };

    let stream = gpu.new_stream()?;
    let upload = |t: &HostTensor, (layout, len): (Layout, usize)| {
        DeviceTensor::from_f32_strided(&stream, c.dtype, layout, len, &t.data, f32::NAN)
    };
    let inputs = match c.storage {
        Storage::Packed => [
            upload(&q, (Layout::contiguous(q.shape), q.data.len()))?,
            upload(&k, (Layout::contiguous(k.shape), k.data.len()))?,
            upload(&v, (Layout::contiguous(v.shape), v.data.len()))?,
        ],
        Storage::Strided => [upload(&q, transposed(q.shape))?, upload(&k, padded(k.shape))?, upload(&v, padded(v.shape))?],
    };
    let before = support::snapshot(&inputs, &stream)?;

    // Both launches on one stream: the second also checks that the dynamic schedule's
    // tile counter, shared by the launches of a stream, was left right by the first.
    let launches = gpu.new_stream()?;
    let first = run_once(gpu, &launches, c, &p, &inputs, c.schedule)?;
    let second = run_once(gpu, &launches, c, &p, &inputs, c.schedule)?;

    let lse_len = c.b * c.hq * c.sq;
    let o = first.o.to_f32(&stream)?;
    let lse_raw = stream.clone_dtoh(&first.lse)?;
    if !lse_raw[lse_len..].iter().all(|x| x.is_nan()) {
        return Err(format!("seed {seed}: the kernel wrote past the LSE").into());
    }
    let got = AttnResult { o: o.clone(), lse: lse_raw[..lse_len].to_vec() };
    let report = check(&p, c.dtype, &got);
    if !report.passed() {
        return Err(format!("seed {seed}: {report}").into());
    }
    // Gaps of a strided output stay untouched.
    let raw = first.o.raw_f32(&stream)?;
    let layout = first.o.layout();
    let written = raw.iter().filter(|x| !x.is_nan()).count();
    if written > layout.numel() {
        return Err(format!("seed {seed}: {written} elements written, O has {}", layout.numel()).into());
    }
    // Determinism: a second launch gives the same bits.
    if bits(&o) != bits(&second.o.to_f32(&stream)?) || bits(&got.lse) != bits(&stream.clone_dtoh(&second.lse)?[..lse_len])
    {
        return Err(format!("seed {seed}: two launches on the same inputs differ").into());
    }
    if c.schedule != Schedule::Auto && c.schedule != Schedule::TilePerCta {
        let per_tile = run_once(gpu, &launches, c, &p, &inputs, Schedule::TilePerCta)?;
        if bits(&o) != bits(&per_tile.o.to_f32(&stream)?)
            || bits(&got.lse) != bits(&stream.clone_dtoh(&per_tile.lse)?[..lse_len])
        {
            return Err(format!("seed {seed}: {:?} and one tile per CTA give different bits", c.schedule).into());
        }
    }
    // Inputs are never modified.
    let after = support::snapshot(&inputs, &stream)?;
    if before != after {
        return Err(format!("seed {seed}: an input buffer changed").into());
    }
    println!("    {}: {report}", c.name());
    Ok(())
}

/// The dynamic schedule's tile counter is cached per stream and never reset: launches
/// from several host threads, on their per-thread default streams (one handle, a stream
/// per thread) and on streams of their own, interleaved, must each give the bits of one
/// tile per CTA. A counter shared by two streams, or a base that drifted, skips or
/// repeats tiles.
fn dynamic_counters_stay_right_across_threads_and_streams(gpu: &Gpu) -> Result<(), Failed> {
    let host = counter_case_inputs(11);
    let run = |stream: &Arc<CudaStream>, schedule: Schedule| run_counter_case(gpu, stream, &host, schedule);
    let want = run(&gpu.new_stream()?, Schedule::TilePerCta)?;
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..3)
            .map(|t| {
                let (want, run) = (&want, &run);
                scope.spawn(move || -> Result<(), String> {
                    let own = gpu.new_stream().map_err(|e| e.to_string())?;
                    let per_thread = gpu.context().per_thread_stream();
                    for i in 0..12 {
                        let stream = if (i + t) % 2 == 0 { &per_thread } else { &own };
                        if run(stream, Schedule::PersistentDynamic).map_err(|e| format!("{e:?}"))? != *want {
                            return Err(format!("thread {t}, launch {i}: differs from one tile per CTA"));
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        threads.into_iter().try_for_each(|h| h.join().map_err(|_| Failed::from("a thread panicked"))?.map_err(Failed::from))
    })
}

/// Shape of the tile-counter cases: hdim 128 causal with more tiles than SMs.
const COUNTER_CASE: [usize; 4] = [2, 1000, 16, 128];

/// Random q, k, v of [`COUNTER_CASE`].
fn counter_case_inputs(seed: u64) -> Vec<HostTensor> {
    let mut r = rng(seed);
    (0..3).map(|_| HostTensor::randn(COUNTER_CASE, DType::F16, 1.0, &mut r)).collect()
}

/// The buffers of one [`COUNTER_CASE`] call on one stream.
struct CounterCase {
    qkv: [DeviceTensor; 3],
    o: DeviceTensor,
    lse: cudarc::driver::CudaSlice<f32>,
}

impl CounterCase {
    /// Inputs uploaded on `stream`, outputs poisoned with NaN.
    fn upload(stream: &Arc<CudaStream>, host: &[HostTensor]) -> Result<Self, Failed> {
        let [b, s, h, _] = COUNTER_CASE;
        let layout = Layout::contiguous(COUNTER_CASE);
        let up = |data: &[f32]| DeviceTensor::from_f32_strided(stream, DType::F16, layout, data.len(), data, f32::NAN);
        Ok(CounterCase {
            qkv: [up(&host[0].data)?, up(&host[1].data)?, up(&host[2].data)?],
            o: up(&vec![f32::NAN; layout.numel()])?,
            lse: stream.clone_htod(&vec![f32::NAN; b * h * s])?,
        })
    }

    /// The causal launch, enqueued only.
    fn launch(&mut self, gpu: &Gpu, stream: &Arc<CudaStream>, schedule: Schedule) -> Result<(), Failed> {
        let opts = AttnOptions::default().causal(true).schedule(schedule);
        let [q, k, v] = &self.qkv;
        flash_attn_func_into(gpu, stream, &q.as_ref(), &k.as_ref(), &v.as_ref(), &mut self.o.as_mut(), &mut self.lse, &opts)?;
        Ok(())
    }

    /// The bits of O and LSE (waits for the stream).
    fn read(&self, stream: &Arc<CudaStream>) -> Result<Vec<u32>, Failed> {
        let mut out = bits(&self.o.to_f32(stream)?);
        out.extend(bits(&stream.clone_dtoh(&self.lse)?));
        Ok(out)
    }

    /// The bits of O and LSE, then both poisoned again, so that the next read shows only
    /// what later launches wrote.
    fn take(&mut self, stream: &Arc<CudaStream>) -> Result<Vec<u32>, Failed> {
        let out = self.read(stream)?;
        self.o.fill(stream, f32::NAN)?;
        stream.memcpy_htod(&vec![f32::NAN; self.lse.len()], &mut self.lse)?;
        Ok(out)
    }
}

/// One causal launch of [`COUNTER_CASE`] on `stream`: the bits of O and LSE.
fn run_counter_case(gpu: &Gpu, stream: &Arc<CudaStream>, host: &[HostTensor], schedule: Schedule) -> Result<Vec<u32>, Failed> {
    let mut case = CounterCase::upload(stream, host)?;
    case.launch(gpu, stream, schedule)?;
    case.read(stream)
}

/// A handle with cudarc's event tracking off, so that only its own events order the
/// counters (as for graph users), the inputs of `seed`, and their bits under one tile
/// per CTA. Its callers use each stream's buffers on that stream only.
fn untracked_counter_setup(seed: u64) -> Result<(Gpu, Vec<HostTensor>, Vec<u32>), Failed> {
    let gpu = Gpu::new(0)?;
    // SAFETY: see above.
    unsafe { gpu.context().disable_event_tracking() };
    let host = counter_case_inputs(seed);
    let want = run_counter_case(&gpu, &gpu.new_stream()?, &host, Schedule::TilePerCta)?;
    Ok((gpu, host, want))
}

/// Evicting a stream's cached counter (by launches on more streams than the cache
/// keeps) enqueues nothing on that stream: were it being captured into a graph, a free
/// there would land in the graph. The counters are allocated and freed on the handle's
/// own stream. Event tracking is off, as for graph users, so the handle's explicit
/// events alone order the free after the stream's last launch.
fn evicting_a_counter_enqueues_nothing_on_its_stream() -> Result<(), Failed> {
    let (gpu, host, want) = untracked_counter_setup(13)?;
    let captured = gpu.new_stream()?;
    if run_counter_case(&gpu, &captured, &host, Schedule::PersistentDynamic)? != want {
        return Err("the first launch differs from one tile per CTA".into());
    }
    // Relaxed: the other streams allocate and synchronize during the capture.
    captured.begin_capture(cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
    let others = (0..flash_attn3::gpu::MAX_TILE_COUNTERS + 4).map(|_| gpu.new_stream()).collect::<Result<Vec<_>, _>>()?;
    let evicting: Result<(), Failed> = others.iter().enumerate().try_for_each(|(i, s)| {
        match run_counter_case(&gpu, s, &host, Schedule::PersistentDynamic)? == want {
            true => Ok(()),
            false => Err(format!("stream {i} differs from one tile per CTA").into()),
        }
    });
    let graph = captured.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
    evicting?;
    // The driver returns an empty graph when nothing was captured.
    if let Some(graph) = graph? {
        let mut nodes = 0usize;
        // SAFETY: a live graph; with a null array the driver only writes the count.
        unsafe { cudarc::driver::sys::cuGraphGetNodes(graph.cu_graph(), std::ptr::null_mut(), &mut nodes) }.result()?;
        if nodes != 0 {
            return Err(format!("evicting the counter recorded {nodes} node(s) into the capture of its stream").into());
        }
    }
    // Its next launch starts again from a fresh counter.
    if run_counter_case(&gpu, &captured, &host, Schedule::PersistentDynamic)? != want {
        return Err("the launch after the eviction differs from one tile per CTA".into());
    }
    gpu.context().synchronize()?;
    // Errors of the counters' stream-ordered frees are only recorded in the context.
    gpu.context().check_err()?;
    Ok(())
}

/// Holds a stream back until dropped: a host function enqueued on it spins until the
/// gate opens. A host function, not a wait on device memory (`cuStreamWaitValue32`),
/// which the driver refused with CUDA_ERROR_INVALID_VALUE for a pool allocation.
struct HostGate {
    open: Arc<std::sync::atomic::AtomicBool>,
}

impl HostGate {
    /// Closes a gate on `stream`: what is enqueued there next waits until the gate drops.
    fn close(stream: &CudaStream) -> Result<Self, Failed> {
        use std::sync::atomic::{AtomicBool, Ordering};
        unsafe extern "C" fn spin(user: *mut std::ffi::c_void) {
            // SAFETY: the reference that `close` leaked for this call.
            let open = unsafe { Arc::from_raw(user as *const AtomicBool) };
            while !open.load(Ordering::Acquire) {
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
        }
        let open = Arc::new(AtomicBool::new(false));
        let user = Arc::into_raw(open.clone()) as *mut std::ffi::c_void;
        // SAFETY: a live stream; `spin` makes no CUDA call and owns `user`.
        let r = unsafe { cudarc::driver::sys::cuLaunchHostFunc(stream.cu_stream(), Some(spin), user) }.result();
        if let Err(e) = r {
            // SAFETY: not enqueued, so `spin` never takes it.
            drop(unsafe { Arc::from_raw(user as *const AtomicBool) });
            return Err(e.into());
        }
        Ok(HostGate { open })
    }
}

impl Drop for HostGate {
    /// Opens whatever happened, so that an early return leaves nothing blocked.
    fn drop(&mut self) {
        self.open.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// A stream's pending work never holds up another stream's launches through the
/// counters: stream X is held back by a gate before its launch (so the launch, and X's
/// counter, stay in use), then launches on more streams than the cache keeps evict X's
/// counter. Each of those launches must finish while X is still gated; the evicted
/// counter may only be freed once X has run, and X's own result must stay right (under
/// memcheck, a counter freed early is a use after free). Event tracking is off: only the
/// handle's explicit events order the counters.
fn pending_work_of_a_stream_whose_counter_is_evicted_holds_up_no_other_stream() -> Result<(), Failed> {
    let (gpu, host, want) = untracked_counter_setup(14)?;
    let x = gpu.new_stream()?;
    let mut x_case = CounterCase::upload(&x, &host)?;
    let others = (0..flash_attn3::gpu::MAX_TILE_COUNTERS + 1).map(|_| gpu.new_stream()).collect::<Result<Vec<_>, _>>()?;
    let mut cases = others.iter().map(|s| CounterCase::upload(s, &host)).collect::<Result<Vec<_>, _>>()?;
    x.synchronize()?;
    let gate = HostGate::close(&x)?;
    x_case.launch(&gpu, &x, Schedule::PersistentDynamic)?;
    let mut ends = Vec::new();
    for (s, case) in others.iter().zip(&mut cases) {
        case.launch(&gpu, s, Schedule::PersistentDynamic)?;
        ends.push(s.record_event(None)?);
    }
    let t0 = std::time::Instant::now();
    let mut held_up = false;
    while !ends.iter().all(|e| e.is_complete()) {
        if t0.elapsed() > std::time::Duration::from_secs(10) {
            held_up = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let x_still_gated = !x.record_event(None)?.is_complete();
    drop(gate);
    gpu.context().synchronize()?;
    if held_up {
        return Err("launches on other streams waited for the gated stream's pending work".into());
    }
    if !x_still_gated {
        return Err("the gate did not hold the stream back; the test proves nothing".into());
    }
    for (i, (s, case)) in others.iter().zip(&cases).enumerate() {
        if case.read(s)? != want {
            return Err(format!("stream {i} differs from one tile per CTA").into());
        }
    }
    if x_case.read(&x)? != want {
        return Err("the gated stream's launch differs from one tile per CTA".into());
    }
    // Its next launch, from a fresh counter, frees nothing it still uses.
    if run_counter_case(&gpu, &x, &host, Schedule::PersistentDynamic)? != want {
        return Err("the gated stream's next launch differs from one tile per CTA".into());
    }
    gpu.context().check_err()?;
    Ok(())
}

/// A launch captured into a CUDA graph must take a fresh counter (a replay cannot move
/// a cached base on): each replay, and the stream's ordinary launches around the capture,
/// give the bits of one tile per CTA. Event tracking is off on this context, as a user
/// capturing graphs with cudarc would set it (cross-capture event waits are illegal).
fn dynamic_counter_is_right_in_graph_replays() -> Result<(), Failed> {
    let gpu = Gpu::new(0)?;
    // SAFETY: everything below runs on one stream.
    unsafe { gpu.context().disable_event_tracking() };
    let stream = gpu.new_stream()?;
    let mut case = CounterCase::upload(&stream, &counter_case_inputs(12))?;
    case.launch(&gpu, &stream, Schedule::TilePerCta)?;
    let want = case.take(&stream)?;
    // Moves the stream's cached counter off zero before the capture.
    case.launch(&gpu, &stream, Schedule::PersistentDynamic)?;
    if case.take(&stream)? != want {
        return Err("the launch before the capture differs from one tile per CTA".into());
    }
    stream.synchronize()?;
    stream.begin_capture(cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let captured = case.launch(&gpu, &stream, Schedule::PersistentDynamic);
    let graph = stream.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))?;
    captured?;
    let graph = graph.ok_or("the capture recorded nothing")?;
    for i in 0..3 {
        graph.launch()?;
        if case.take(&stream)? != want {
            return Err(format!("graph replay {i} differs from one tile per CTA").into());
        }
        case.launch(&gpu, &stream, Schedule::PersistentDynamic)?;
        if case.take(&stream)? != want {
            return Err(format!("the launch after replay {i} differs from one tile per CTA").into());
        }
    }
    Ok(())
}

/// A stream made by another context handle than the `Gpu`'s is refused with its own
/// error before anything is launched (the launch would run under the wrong context).
fn a_stream_of_another_context_handle_is_refused() -> Result<(), Failed> {
    let gpu = Gpu::new(0)?;
    let stream = gpu.new_stream()?;
    let x = vec![0.5f32; 64 * 128];
    let t = |s| DeviceTensor::from_f32(&stream, DType::F16, [1, 64, 1, 128], s);
    let (q, k, v) = (t(&x)?, t(&x)?, t(&x)?);
    let other = cudarc::driver::CudaContext::new(0)?.new_stream()?;
    match flash_attn3::flash_attn_func(&gpu, &other, &q.as_ref(), &k.as_ref(), &v.as_ref(), &AttnOptions::default()) {
        Err(flash_attn3::AttnError::ForeignStream) => Ok(()),
        Err(e) => Err(format!("expected ForeignStream, got {e}").into()),
        Ok(_) => Err("a stream of another context handle was accepted".into()),
    }
}


fn main() {
    let mut args = Arguments::from_args();
    // One case at a time: each already uses every core for its CPU reference.
    args.test_threads.get_or_insert(1);
    let gpu = support::gpu_or_skip("GPU tests");
    let mut trials: Vec<Trial> = cases().into_iter().map(|c| support::gpu_trial(c.name(), &gpu, move |g| run_case(g, &c))).collect();
    trials.push(support::gpu_trial(
        "dynamic_counters_stay_right_across_threads_and_streams",
        &gpu,
        dynamic_counters_stay_right_across_threads_and_streams,
    ));
    for (name, test) in [
        ("dynamic_counter_is_right_in_graph_replays", dynamic_counter_is_right_in_graph_replays as fn() -> _),
        ("a_stream_of_another_context_handle_is_refused", a_stream_of_another_context_handle_is_refused),
        ("evicting_a_counter_enqueues_nothing_on_its_stream", evicting_a_counter_enqueues_nothing_on_its_stream),
        (
            "pending_work_of_a_stream_whose_counter_is_evicted_holds_up_no_other_stream",
            pending_work_of_a_stream_whose_counter_is_evicted_holds_up_no_other_stream,
        ),
    ] {
        trials.push(Trial::test(name, test).with_ignored_flag(gpu.is_none()));
    }
    libtest_mimic::run(&args, trials).exit();
}
