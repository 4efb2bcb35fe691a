//! The CPU side of correctness: the f64 reference has the properties attention must
//! have, and the tiled online-softmax algorithm (what the kernels run) equals it on
//! random shapes, tile sizes and masks, extreme logits included.
use flash_attn3::DType;
use flash_attn3::reference::{Window, 
    HostTensor, Problem, Tiling, attention_f64, attention_lowp, attention_tiled, max_abs_err, rng,
};
use proptest::prelude::*;

fn randn(shape: [usize; 4], seed: u64, std: f32) -> HostTensor {
    HostTensor::randn(shape, DType::BF16, std, &mut rng(seed))
}

/// Largest |scale * q.k| over all pairs (an upper bound via norms).
fn max_logit(q: &HostTensor, k: &HostTensor, scale: f32) -> f32 {
    let norm = |t: &HostTensor| {
        t.data.chunks(t.shape[3]).map(|r| r.iter().map(|x| x * x).sum::<f32>().sqrt()).fold(0.0f32, f32::max)
    };
    scale.abs() * norm(q) * norm(k)
}

#[derive(Clone, Debug)]
struct Case {
    b: usize,
    sq: usize,
    sk: usize,
    hk: usize,
    group: usize,
    d: usize,
    causal: bool,
    scale: f32,
    std: f32,
    block_m: usize,
    block_n: usize,
    lazy_rescale: bool,
    seed: u64,
}

fn cases() -> impl Strategy<Value = Case> {
    (
        (1usize..3, 1usize..80, 1usize..80, 1usize..3, 1usize..4, prop::sample::select(vec![4usize, 8, 16, 32])),
        (any::<bool>(), prop::sample::select(vec![0.05f32, 0.25, 1.0, 8.0, 40.0]), prop::sample::select(vec![0.5f32, 1.0, 3.0])),
        (1usize..70, 1usize..70, any::<bool>(), any::<u64>()),
    )
        .prop_map(|((b, sq, sk, hk, group, d), (causal, scale, std), (block_m, block_n, lazy_rescale, seed))| Case {
            b,
            sq,
            sk,
            hk,
            group,
            d,
            causal,
            scale,
            std,
            block_m,
            block_n,
            lazy_rescale,
            seed,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// The FlashAttention-2 algorithm (tiles, online softmax in base 2, one final rescale,
    /// causal tiles skipped) computes exact attention, for any tile shape, with seqlen_q
    /// != seqlen_k, GQA, and logits up to a few hundred in magnitude; with the output
    /// rescaled on every new maximum or lazily (only on jumps past the threshold); and
    /// with sliding windows (a third of the cases; windows narrower than a tile, rows
    /// that see no key), whose tiles come from the first row's first visible key to the
    /// last row's last; and with attention sinks (a third of the cases, logits from -20
    /// to 20, below and above the rows' own; rows that see no key get the sink's LSE); and
    /// with packed documents (a third of the cases, per batch, documents shorter and
    /// longer than a tile).
    #[test]
    fn tiled_online_softmax_equals_exact_attention(c in cases(), window in proptest::option::weighted(0.33, (proptest::option::of(0usize..90), proptest::option::of(0usize..90))), sink in proptest::option::weighted(0.33, -20.0f32..20.0), doc_lens in proptest::option::weighted(0.33, proptest::collection::vec(1usize..40, 1..6))) {
        let hq = c.hk * c.group;
        let q = randn([c.b, c.sq, hq, c.d], c.seed, c.std);
        let k = randn([c.b, c.sk, c.hk, c.d], c.seed ^ 1, c.std);
        let v = randn([c.b, c.sk, c.hk, c.d], c.seed ^ 2, 1.0);
        let window = window.map(|(left, right)| Window { left, right });
        let sinks: Option<Vec<f32>> = sink.map(|x| (0..hq).map(|h| x - 1.5 * h as f32).collect());
        let ids = doc_lens.filter(|_| c.sq <= c.sk).map(|l| flash_attn3::documents::packed_doc_ids(c.b, c.sk, &l));
        let docs = ids.as_deref().map(|ids| flash_attn3::reference::HostDocs { ids, per_batch: true });
        let p = Problem { q: &q, k: &k, v: &v, causal: c.causal, scale: c.scale, softcap: None, alibi: None, window, sinks: sinks.as_deref(), docs, variant: None };
        let exact = attention_f64(&p);
        let tiled = attention_tiled(&p, Tiling { block_m: c.block_m, block_n: c.block_n, lazy_rescale: c.lazy_rescale }, None);
        let o_err = max_abs_err(&tiled.o, &exact.o);
        // f32 rounds the exponent argument s * scale * log2(e) to ~|arg| * 2^-24; that
        // relative error of the weights reaches O through the V values.
        let max_arg = max_logit(&q, &k, c.scale) as f64 * std::f64::consts::LOG2_E;
        let max_v = v.data.iter().fold(0.0f32, |m, x| m.max(x.abs())) as f64;
        let bound = 2e-5 + 4.0 * max_arg * f64::powi(2.0, -23) * max_v;
        prop_assert!(o_err < bound, "O error {o_err:e} > {bound:e}");
        // LSE grows with the logits; f32 keeps ~7 digits of it.
        let lse_mag = exact.lse.iter().filter(|x| x.is_finite()).fold(1.0f64, |m, x| m.max(x.abs()));
        let lse_err = max_abs_err(&tiled.lse, &exact.lse);
        prop_assert!(lse_err <= 1e-5 * lse_mag, "LSE error {lse_err:e} (|LSE| up to {lse_mag})");
    }

    /// The naive low-precision implementation is close to exact, but not exact: the budget
    /// it sets is meaningful (never zero, never huge).
    #[test]
    fn naive_low_precision_error_is_small_but_nonzero(seed in any::<u64>(), causal in any::<bool>()) {
        let (b, s, h, d) = (1, 48, 2, 32);
        let q = randn([b, s, h, d], seed, 1.0);
        let k = randn([b, s, h, d], seed ^ 1, 1.0);
        let v = randn([b, s, h, d], seed ^ 2, 1.0);
        let p = Problem { q: &q, k: &k, v: &v, causal, scale: 0.2, softcap: None, alibi: None, window: None, sinks: None, docs: None, variant: None };
        let exact = attention_f64(&p);
        for dtype in DType::ALL {
            let err = max_abs_err(&attention_lowp(&p, dtype).o, &exact.o);
            let ulp = if dtype == DType::F16 { 1e-3 } else { 8e-3 };
            prop_assert!(err > 0.0 && err < 4.0 * ulp, "{dtype:?}: naive error {err:e}");
        }
    }
}

/// Rows of the softmax sum to one: with V all ones, O is all ones (wherever a key is visible).
#[test]
fn softmax_rows_sum_to_one() {
    let (b, sq, sk, h, d) = (2, 37, 53, 3, 16);
    let q = randn([b, sq, h, d], 7, 2.0);
    let k = randn([b, sk, h, d], 8, 2.0);
    let v = HostTensor::new([b, sk, h, d], vec![1.0; b * sk * h * d]);
    for causal in [false, true] {
        let p = Problem { q: &q, k: &k, v: &v, causal, scale: 0.7, softcap: None, alibi: None, window: None, sinks: None, docs: None, variant: None };
        let r = attention_f64(&p);
        assert!(r.o.iter().all(|&x| (x - 1.0).abs() < 1e-12));
    }
}

/// LSE is log(sum_j exp(scale * q.k_j)) computed directly.
#[test]
fn lse_is_log_sum_exp_of_scaled_scores() {
    let (sq, sk, d) = (5, 9, 8);
    let q = randn([1, sq, 1, d], 1, 1.0);
    let k = randn([1, sk, 1, d], 2, 1.0);
    let v = randn([1, sk, 1, d], 3, 1.0);
    let p = Problem { q: &q, k: &k, v: &v, causal: false, scale: 0.5, softcap: None, alibi: None, window: None, sinks: None, docs: None, variant: None };
    let r = attention_f64(&p);
    for i in 0..sq {
        let direct: f64 = (0..sk)
            .map(|j| {
                let s: f64 = q.row(0, i, 0).iter().zip(k.row(0, j, 0)).map(|(&a, &b)| a as f64 * b as f64).sum();
                (0.5 * s).exp()
            })
            .sum::<f64>()
            .ln();
        assert!((r.lse[i] - direct).abs() < 1e-12, "row {i}: {} vs {direct}", r.lse[i]);
    }
}

/// Bottom-right causal alignment: with seqlen_q < seqlen_k the last query row sees every
/// key and row i sees i + seqlen_k - seqlen_q + 1 keys; row 0 with seqlen_q == seqlen_k
/// returns V's first row.
#[test]
fn causal_mask_is_bottom_right_aligned() {
    let d = 8;
    let q = randn([1, 4, 1, d], 11, 1.0);
    let k = randn([1, 10, 1, d], 12, 1.0);
    let v = randn([1, 10, 1, d], 13, 1.0);
    let p = Problem { q: &q, k: &k, v: &v, causal: true, scale: 0.3, softcap: None, alibi: None, window: None, sinks: None, docs: None, variant: None };
    assert_eq!((0..4).map(|i| p.visible_range(0, i)).collect::<Vec<_>>(), vec![0..7, 0..8, 0..9, 0..10]);
    let full = attention_f64(&Problem { causal: false, ..p });
    let causal = attention_f64(&p);
    // The last row sees everything: same as non-causal.
    assert_eq!(&causal.o[3 * d..], &full.o[3 * d..]);
    assert_ne!(&causal.o[..d], &full.o[..d]);

    let q2 = randn([1, 10, 1, d], 14, 1.0);
    let p2 = Problem { q: &q2, k: &k, v: &v, causal: true, scale: 0.3, softcap: None, alibi: None, window: None, sinks: None, docs: None, variant: None };
    let r = attention_f64(&p2);
    for c in 0..d {
        assert!((r.o[c] - v.data[c] as f64).abs() < 1e-12);
    }
}

/// seqlen_q > seqlen_k with a causal mask leaves the first rows without any key:
/// O = 0 and LSE = +inf there (FlashAttention's convention), in every implementation.
#[test]
fn rows_without_keys_give_zero_output_and_infinite_lse() {
    let (sq, sk, d) = (20, 6, 16);
    let q = randn([1, sq, 2, d], 21, 1.0);
    let k = randn([1, sk, 2, d], 22, 1.0);
    let v = randn([1, sk, 2, d], 23, 1.0);
    let p = Problem { q: &q, k: &k, v: &v, causal: true, scale: 0.25, softcap: None, alibi: None, window: None, sinks: None, docs: None, variant: None };
    let empty_rows = sq - sk; // rows 0..14 see no key
    let exact = attention_f64(&p);
    let tiled = attention_tiled(&p, Tiling { block_m: 8, block_n: 4, lazy_rescale: true }, None);
    let naive = attention_lowp(&p, DType::F16);
    for h in 0..2 {
        for i in 0..sq {
            let lse = [exact.lse[h * sq + i], tiled.lse[h * sq + i] as f64, naive.lse[h * sq + i] as f64];
            let o_row = |o: &[f64]| o[(i * 2 + h) * d..(i * 2 + h + 1) * d].iter().all(|&x| x == 0.0);
            if i < empty_rows {
                assert!(lse.iter().all(|&l| l == f64::INFINITY), "row {i}: {lse:?}");
                assert!(o_row(&exact.o));
                assert!(o_row(&tiled.o.iter().map(|&x| x as f64).collect::<Vec<_>>()));
            } else {
                assert!(lse.iter().all(|l| l.is_finite()), "row {i}: {lse:?}");
            }
        }
    }
}

/// Extreme logits: huge scale (one key dominates), and all-equal scores (uniform weights).
#[test]
fn extreme_and_constant_logits_stay_finite_and_exact() {
    let (s, d) = (70, 32);
    let q = randn([1, s, 1, d], 31, 3.0);
    let k = randn([1, s, 1, d], 32, 3.0);
    let v = randn([1, s, 1, d], 33, 1.0);
    for scale in [100.0f32, 1000.0] {
        let p = Problem { q: &q, k: &k, v: &v, causal: false, scale, softcap: None, alibi: None, window: None, sinks: None, docs: None, variant: None };
        let exact = attention_f64(&p);
        let tiled = attention_tiled(&p, Tiling { block_m: 16, block_n: 16, lazy_rescale: true }, None);
        assert!(tiled.o.iter().all(|x| x.is_finite()));
        assert!(max_abs_err(&tiled.o, &exact.o) < 5e-5);
    }
    // q = 0: every score is 0, weights uniform, O = mean of visible V rows, LSE = ln(n).
    let zeros = HostTensor::new([1, s, 1, d], vec![0.0; s * d]);
    let p = Problem { q: &zeros, k: &k, v: &v, causal: true, scale: 1.0, softcap: None, alibi: None, window: None, sinks: None, docs: None, variant: None };
    let tiled = attention_tiled(&p, Tiling { block_m: 16, block_n: 16, lazy_rescale: true }, None);
    for i in [0usize, 9, 69] {
        let n = i + 1;
        let mean: f32 = (0..n).map(|j| v.data[j * d]).sum::<f32>() / n as f32;
        assert!((tiled.o[i * d] - mean).abs() < 1e-5);
        assert!((tiled.lse[i] - (n as f32).ln()).abs() < 1e-5);
    }
}

/// Scores that climb all along the sequence (by ~1 in exp2 units a key, 200 in all):
/// lazy rescaling must still move the max every few keys, else `exp2` overflows f32; and
/// between moves the probabilities reach 2^8 without losing accuracy.
#[test]
fn lazy_rescaling_is_exact_when_the_max_keeps_climbing() {
    let (s, d) = (200, 16);
    let q = HostTensor::new([1, s, 1, d], vec![1.0; s * d]);
    let k = HostTensor::new([1, s, 1, d], (0..s * d).map(|i| (i / d) as f32 * 0.7 / d as f32).collect());
    let v = randn([1, s, 1, d], 41, 1.0);
    for causal in [false, true] {
        let p = Problem { q: &q, k: &k, v: &v, causal, scale: 1.0, softcap: None, alibi: None, window: None, sinks: None, docs: None, variant: None };
        let exact = attention_f64(&p);
        // The f32 rounding of exponent arguments up to ~200 (as in the property above).
        let max_v = v.data.iter().fold(0.0f32, |m, x| m.max(x.abs())) as f64;
        let bound = 2e-5 + 4.0 * 200.0 * f64::powi(2.0, -23) * max_v;
        for block_n in [1, 7, 64] {
            let tiled = attention_tiled(&p, Tiling { block_m: 16, block_n, lazy_rescale: true }, None);
            let err = max_abs_err(&tiled.o, &exact.o);
            assert!(err < bound, "causal {causal} block_n {block_n}: O error {err:e} > {bound:e}");
            assert!(max_abs_err(&tiled.lse, &exact.lse) < 1e-4);
        }
    }
}

/// Lazy rescaling must not cost accuracy once P is rounded to f16/bf16 as the kernels
/// round it, on the FA3 kernels' own tiles (`common::fa3::block_m`: 192 x 128 at hdim 64,
/// 128 x 128 at 128, 128 x 80 at 256): over fixed seeds, the error ratio against the
/// naive low-precision implementation stays within 15% of eager rescaling's on average,
/// and under the GPU tests' 2x rule at worst. Measured here, lazy vs eager mean: threshold
/// 2 (ours) f16 +10.3%, worst 1.80 (eager 1.21), bf16 +6.2%, worst 1.29; threshold 1
/// +4.2% / +1.0%, worst 1.21 / 1.20; threshold 4 f16 +17%, and the test fails
/// On 64-key blocks threshold 2 cost only +5-6%; the kernels' 128-key blocks cost more.
#[test]
fn lazy_rescaling_keeps_the_low_precision_error_of_eager_rescaling() {
    for dtype in [DType::F16, DType::BF16] {
        let (mut eager, mut lazy) = (Vec::new(), Vec::new());
        for seed in 0..64u64 {
            let (sq, sk, d, causal) = [(200, 1000, 64, true), (300, 600, 128, false), (200, 700, 256, true), (300, 500, 128, true)][seed as usize % 4];
            let q = HostTensor::randn([1, sq, 2, d], dtype, 1.0, &mut rng(seed));
            let k = HostTensor::randn([1, sk, 1, d], dtype, 1.0, &mut rng(seed ^ 1));
            let v = HostTensor::randn([1, sk, 1, d], dtype, 1.0, &mut rng(seed ^ 2));
            let p = Problem { q: &q, k: &k, v: &v, causal, scale: 1.0 / (d as f32).sqrt(), softcap: None, alibi: None, window: None, sinks: None, docs: None, variant: None };
            let exact = attention_f64(&p);
            let naive = max_abs_err(&attention_lowp(&p, dtype).o, &exact.o);
            // The tiles of the kernel the planner launches (hdim 256's key block depends on sk).
            let block_m = common::fa3::block_m(d as u32) as usize;
            let block_n = common::fa3::key_block(d as u32, sk as u32) as usize;
            for (lazy_rescale, errs) in [(false, &mut eager), (true, &mut lazy)] {
                let tiling = Tiling { block_m, block_n, lazy_rescale };
                let tiled = attention_tiled(&p, tiling, Some(dtype));
                errs.push(max_abs_err(&tiled.o, &exact.o) / naive);
            }
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let max = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
        let worst = max(&lazy);
        eprintln!("{dtype:?}: mean ratio {:.3} lazy vs {:.3} eager, worst {worst:.3} (eager {:.3})", mean(&lazy), mean(&eager), max(&eager));
        assert!(mean(&lazy) <= 1.15 * mean(&eager), "{dtype:?}: mean ratio {} lazy vs {} eager", mean(&lazy), mean(&eager));
        assert!(worst < 2.0, "{dtype:?}: worst ratio {worst} with lazy rescaling");
    }
}

/// Without a mask, permuting the keys (with their values) changes nothing.
#[test]
fn output_is_invariant_under_key_permutation() {
    let (s, d) = (23, 8);
    let q = randn([1, 5, 1, d], 41, 1.0);
    let k = randn([1, s, 1, d], 42, 1.0);
    let v = randn([1, s, 1, d], 43, 1.0);
    let perm = |t: &HostTensor| {
        let mut data = Vec::new();
        for j in (0..s).rev() {
            data.extend_from_slice(t.row(0, j, 0));
        }
        HostTensor::new(t.shape, data)
    };
    let (k2, v2) = (perm(&k), perm(&v));
    let a = attention_f64(&Problem { q: &q, k: &k, v: &v, causal: false, scale: 0.4, softcap: None, alibi: None, window: None, sinks: None, docs: None, variant: None });
    let b = attention_f64(&Problem { q: &q, k: &k2, v: &v2, causal: false, scale: 0.4, softcap: None, alibi: None, window: None, sinks: None, docs: None, variant: None });
    assert!(max_abs_err(&a.o.iter().map(|&x| x as f32).collect::<Vec<_>>(), &b.o) < 1e-6);
}

/// A row's visible keys are exactly its band around the bottom-right diagonal
/// (FlashAttention's window convention), cut by the causal mask and the sequence.
#[test]
fn windows_see_the_band_around_the_diagonal() {
    let d = 4;
    for (sq, sk) in [(5, 9), (9, 5), (17, 17), (1, 30), (30, 1)] {
        let (q, k) = (randn([1, sq, 1, d], 1, 1.0), randn([1, sk, 1, d], 2, 1.0));
        for left in [None, Some(0), Some(1), Some(3), Some(40)] {
            for right in [None, Some(0), Some(2), Some(40)] {
                for causal in [false, true] {
                    let window = Some(Window { left, right });
                    let p = Problem { q: &q, k: &k, v: &k, causal, scale: 1.0, softcap: None, alibi: None, window, sinks: None, docs: None, variant: None };
                    for i in 0..sq {
                        let diag = i as i64 + sk as i64 - sq as i64;
                        let want: Vec<usize> = (0..sk)
                            .filter(|&j| {
                                let j = j as i64;
                                left.is_none_or(|l| j >= diag - l as i64)
                                    && right.is_none_or(|r| j <= diag + r as i64)
                                    && (!causal || j <= diag)
                            })
                            .collect();
                        let got: Vec<usize> = p.visible_range(0, i).collect();
                        assert_eq!(got, want, "sq {sq} sk {sk} window {left:?},{right:?} causal {causal} row {i}");
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// The kernels' key ranges (`KeyWindow`, i32 bounds with unbounded sides stored as
    /// `max(seqlen_q, seqlen_k)` and causal folded into the right side, built by the
    /// planner's `Window::key_window`, and the document bounds of `document_bounds`) give
    /// every row the same keys as the reference's `visible_range`, with sides from 0 past
    /// both lengths and documents or not.
    #[test]
    fn kernel_window_and_document_bounds_equal_the_reference_rows(
        sq in 1usize..300, sk in 1usize..300, causal in any::<bool>(),
        left in proptest::option::of(0usize..700), right in proptest::option::of(0usize..700),
        doc_lens in proptest::option::of(proptest::collection::vec(1usize..80, 1..10)),
    ) {
        let window = Window { left, right };
        let w = window.key_window(causal, sq, sk);
        let ids: Option<Vec<u32>> = doc_lens.filter(|_| sq <= sk).map(|l| {
            let mut ids: Vec<u32> = l.iter().enumerate().flat_map(|(d, &n)| std::iter::repeat_n(d as u32, n)).collect();
            ids.resize(sk, l.len() as u32);
            ids
        });
        let bounds = ids.as_deref().map(|ids| flash_attn3::documents::document_bounds(ids).unwrap());
        let (q, k) = (HostTensor::new([1, sq, 1, 1], vec![0.0; sq]), HostTensor::new([1, sk, 1, 1], vec![0.0; sk]));
        let docs = ids.as_deref().map(|ids| flash_attn3::reference::HostDocs { ids, per_batch: false });
        let p = Problem { q: &q, k: &k, v: &k, causal, scale: 1.0, softcap: None, alibi: None, window: Some(window), sinks: None, docs, variant: None };
        for i in 0..sq {
            let want = p.visible_range(0, i);
            let (first, end) = match &bounds {
                Some(b) => {
                    let r = common::window::KeyRanges { window: w, seqlen_q: sq as u32, seqlen_k: sk as u32, docs: b.as_slice() };
                    (r.first_key(i as i32).max(0), r.end_key(i as i32))
                }
                None => {
                    let r = w.ranges(sq as u32, sk as u32);
                    (r.first_key(i as i32).max(0), r.end_key(i as i32))
                }
            };
            let got = if end > first { first as usize..end as usize } else { want.start..want.start };
            prop_assert_eq!(got.len(), want.len(), "row {}", i);
            if !want.is_empty() {
                prop_assert_eq!(got, want, "row {}", i);
            }
        }
    }
}
