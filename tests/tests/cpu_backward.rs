//! The CPU side of backward correctness: the exact f64 gradients are the derivatives of
//! the f64 forward (checked by central differences), the tiled recompute algorithm (what
//! the kernels run) equals them on random shapes, tiles and masks, its causal block
//! skipping is exact, and the naive low-precision backward gives a meaningful budget that
//! the tiled algorithm with rounded operands meets under FlashAttention's 2x rule.
use flash_attn3::check::grad_slack as fa_slack;
use flash_attn3::DType;
use flash_attn3::reference::backward::{
    sink_grads_f64, BwdTiling, Grads, attention_backward_f64, attention_backward_lowp, attention_backward_tiled,
    causal_first_query_block, visited_block_pairs,
    query_block_range, rows_seeing,
};
use flash_attn3::reference::{HostAlibi, HostDocs, HostTensor, Window, Problem, Tiling, attention_f64, attention_tiled, rng, within_budget};
use proptest::prelude::*;

/// `N(0, std^2)` values rounded to bf16.
fn randn(shape: [usize; 4], seed: u64, std: f32) -> HostTensor {
    HostTensor::randn(shape, DType::BF16, std, &mut rng(seed))
}

fn max_abs<T: Copy + Into<f64>>(x: &[T]) -> f64 {
    x.iter().fold(0.0f64, |m, &v| m.max(v.into().abs()))
}

/// q, k, v, dO of one case (dO shaped like q), `N(0, 1)` rounded to `dtype`.
fn inputs(b: usize, sq: usize, sk: usize, hq: usize, hk: usize, d: usize, dtype: DType, seed: u64) -> [HostTensor; 4] {
    let t = |s: usize, h: usize, salt: u64| HostTensor::randn([b, s, h, d], dtype, 1.0, &mut rng(seed ^ salt));
    [t(sq, hq, 0), t(sk, hk, 1), t(sk, hk, 2), t(sq, hq, 3)]
}

/// The loss whose gradients the backward computes: `sum(dO ∘ O)`, O from the f64 forward.
fn loss(p: &Problem<'_>, dout: &HostTensor) -> f64 {
    attention_f64(p).o.iter().zip(&dout.data).map(|(&o, &g)| o * g as f64).sum()
}

#[derive(Clone, Debug)]
struct Shape {
    b: usize,
    sq: usize,
    sk: usize,
    hk: usize,
    group: usize,
    d: usize,
    causal: bool,
    seed: u64,
}

fn small_shapes() -> impl Strategy<Value = (Shape, f32)> {
    // heads_q in {1, 2, 4}, heads_k dividing it.
    let heads = prop::sample::select(vec![(1usize, 1usize), (2, 1), (1, 2), (4, 1), (2, 2), (1, 4)]);
    (1usize..3, 1usize..10, 1usize..10, heads, 1usize..9, any::<bool>(), any::<u64>(), 0.05f32..2.0).prop_map(
        |(b, sq, sk, (hk, group), d, causal, seed, scale)| (Shape { b, sq, sk, hk, group, d, causal, seed }, scale),
    )
}

fn tiled_cases() -> impl Strategy<Value = (Shape, BwdTiling, f32)> {
    let block = || prop::sample::select(vec![1usize, 3, 16, 64]);
    (
        (1usize..3, 1usize..71, 1usize..71, 1usize..3, 1usize..4, prop::sample::select(vec![1usize, 3, 8, 16, 64])),
        (any::<bool>(), any::<u64>(), block(), block(), prop::sample::select(vec![0.05f32, 0.25, 1.0, 2.0])),
    )
        .prop_map(|((b, sq, sk, hk, group, d), (causal, seed, block_m, block_n, scale))| {
            (Shape { b, sq, sk, hk, group, d, causal, seed }, BwdTiling { block_m, block_n }, scale)
        })
}

/// ALiBi slopes: the standard geometric ones scaled by `slope`, per head, or per (batch,
/// head) with each batch's shifted.
fn alibi_slopes(batch: usize, heads: usize, slope: f32, per_batch: bool) -> Vec<f32> {
    let per_head = |b: usize| (0..heads).map(move |h| slope * 0.5f32.powi(h as i32) * (1.0 + b as f32));
    if per_batch { (0..batch).flat_map(per_head).collect() } else { per_head(0).collect() }
}

/// Sink logits for `heads` heads around `base` (each head its own).
fn sink_logits(heads: usize, base: f32) -> Vec<f32> {
    (0..heads).map(|h| base + 0.7 * h as f32).collect()
}

/// The attention variant of case number `variant`: 0 plain, 1 soft-capped at `cap`,
/// 2 ALiBi with `slopes`, 3 the sliding `window`, 4 soft-capping and ALiBi, 5 all three.
fn variant_of(variant: u8, cap: f32, slopes: &[f32], per_batch: bool, window: Window) -> (Option<f32>, Option<HostAlibi<'_>>, Option<Window>) {
    let alibi = Some(HostAlibi { slopes, per_batch });
    match variant {
        1 => (Some(cap), None, None),
        2 => (None, alibi, None),
        3 => (None, None, Some(window)),
        4 => (Some(cap), alibi, None),
        5 => (Some(cap), alibi, Some(window)),
        _ => (None, None, None),
    }
}

proptest! {
    // Each case runs two f64 forwards per input entry (up to ~1700 entries): 48 cases take
    // about 3 s.
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// dQ, dK, dV of `attention_backward_f64` are the derivatives of `sum(dO ∘ O)` with O
    /// from `attention_f64`, entry by entry, causal or not, with GQA and with rows that
    /// see no key (causal, seqlen_q > seqlen_k).
    ///
    /// The inputs are bf16 values (8 significant bits), so `x ± 2^-16` is exact in f32
    /// for |x| < 2^7 (the quotient uses the stored values anyway).
    ///
    /// Tolerance: central differences with h = 2^-16 have a truncation error
    /// h²/6 · |∂³L| ≈ 4e-11 · |∂³L| and a rounding error about ε₆₄ · Σ|terms| / h ≈ 1e-11
    /// here; |∂³L| (≤ scale³ |k|³ |v| |dO|) stays at ~1e2 at these sizes and scales: over
    /// 1000 cases the worst difference was 3.7e-9 · max(1, |g|), so 1e-7 · max(1, |g|)
    /// leaves a margin of ~25x, while a wrong term (a missing scale, a dropped GQA head, a
    /// mask off by one) is off by O(|g|).
    /// With soft-capping (a third of the cases) the gradients include tanh's
    /// derivative; with ALiBi (another third, per head or per (batch, head)) the bias
    /// moves P but not dS's formula; with packed documents (a third, per batch).
    #[test]
    fn exact_gradients_match_central_finite_differences((s, scale) in small_shapes(), variant in 0u8..6, cap in 1.0f32..8.0, slope in 0.01f32..0.5, left in 0usize..6, right in proptest::option::of(0usize..6), sink in proptest::option::of(-3.0f32..3.0), doc_lens in proptest::option::weighted(0.33, proptest::collection::vec(1usize..5, 1..4))) {
        let hq = s.hk * s.group;
        let [q, k, v, dout] = inputs(s.b, s.sq, s.sk, hq, s.hk, s.d, DType::BF16, s.seed);
        let slopes = alibi_slopes(s.b, hq, slope, s.seed % 2 == 1);
        // A sliding window in the last quarter of the cases; sinks in half of them.
        let (softcap, alibi, window) = variant_of(variant, cap, &slopes, s.seed % 2 == 1, Window { left: Some(left), right });
        let sink_logits = sink.map(|x| sink_logits(hq, x));
        let sinks = sink_logits.as_deref();
        let ids = doc_lens.filter(|_| s.sq <= s.sk).map(|l| flash_attn3::documents::packed_doc_ids(s.b, s.sk, &l));
        let docs = ids.as_deref().map(|ids| HostDocs { ids, per_batch: true });
        let grads = attention_backward_f64(&Problem { q: &q, k: &k, v: &v, causal: s.causal, scale, softcap, alibi, window, sinks, docs, variant: None }, &dout);
        const H: f32 = 1.0 / 65536.0;
        for (name, which, g) in [("dQ", 0, &grads.dq), ("dK", 1, &grads.dk), ("dV", 2, &grads.dv)] {
            let x = [&q, &k, &v][which];
            for (idx, &want) in g.iter().enumerate() {
                let at = |delta: f32| {
                    let mut t = x.clone();
                    t.data[idx] += delta;
                    let mut qkv = [&q, &k, &v];
                    qkv[which] = &t;
                    let p = Problem { q: qkv[0], k: qkv[1], v: qkv[2], causal: s.causal, scale, softcap, alibi, window, sinks, docs, variant: None };
                    (loss(&p, &dout), t.data[idx] as f64)
                };
                let ((l_plus, x_plus), (l_minus, x_minus)) = (at(H), at(-H));
                let fd = (l_plus - l_minus) / (x_plus - x_minus);
                let tol = 1e-7 * want.abs().max(1.0);
                prop_assert!((fd - want).abs() <= tol, "{name}[{idx}]: backward {want:e}, finite difference {fd:e}");
            }
        }
        // The sinks' gradient, by the same differences on each sink logit.
        if let Some(logits) = &sink_logits {
            let p = Problem { q: &q, k: &k, v: &v, causal: s.causal, scale, softcap, alibi, window, sinks, docs, variant: None };
            let g = sink_grads_f64(&p, &dout);
            prop_assert_eq!(g.len(), hq);
            for (h, &want) in g.iter().enumerate() {
                let at = |delta: f32| {
                    let mut t = logits.clone();
                    t[h] += delta;
                    (loss(&Problem { sinks: Some(&t), ..p }, &dout), t[h] as f64)
                };
                let ((l_plus, x_plus), (l_minus, x_minus)) = (at(H), at(-H));
                let fd = (l_plus - l_minus) / (x_plus - x_minus);
                prop_assert!((fd - want).abs() <= 1e-7 * want.abs().max(1.0), "dsink[{h}]: backward {want:e}, finite difference {fd:e}");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The tiled recompute backward in f32 (operands not rounded) computes the exact
    /// gradients, for any tile shape, with seqlen_q != seqlen_k, GQA, causal masks and
    /// rows that see no key, from the tiled forward's O and LSE; with soft-capping or
    /// ALiBi too, windows, sinks and packed documents (a third of the cases, per batch).
    #[test]
    fn tiled_backward_equals_exact_backward((s, tiling, scale) in tiled_cases(), variant in 0u8..6, cap in 0.5f32..20.0, slope in 0.01f32..1.0, left in proptest::option::of(0usize..40), right in proptest::option::of(0usize..40), sink in proptest::option::of(-3.0f32..3.0), doc_lens in proptest::option::weighted(0.33, proptest::collection::vec(1usize..30, 1..6))) {
        let hq = s.hk * s.group;
        let [q, k, v, dout] = inputs(s.b, s.sq, s.sk, hq, s.hk, s.d, DType::BF16, s.seed);
        let slopes = alibi_slopes(s.b, hq, slope, s.seed % 2 == 1);
        let (softcap, alibi, window) = variant_of(variant, cap, &slopes, s.seed % 2 == 1, Window { left, right });
        let sink_logits = sink.map(|x| sink_logits(hq, x));
        let ids = doc_lens.filter(|_| s.sq <= s.sk).map(|l| flash_attn3::documents::packed_doc_ids(s.b, s.sk, &l));
        let docs = ids.as_deref().map(|ids| HostDocs { ids, per_batch: true });
        let p = Problem { q: &q, k: &k, v: &v, causal: s.causal, scale, softcap, alibi, window, sinks: sink_logits.as_deref(), docs, variant: None };
        let exact = attention_backward_f64(&p, &dout);
        let fwd = attention_tiled(&p, Tiling { block_m: 64, block_n: 64, lazy_rescale: true }, None);
        let tiled = attention_backward_tiled(&p, &dout, &fwd.o, &fwd.lse, tiling, None);
        check_f32_accuracy(&p, &dout, &tiled, &exact)?;
    }

    /// The causal block-skipping rule is exact: a (query block, key block) tile is
    /// visited iff some query row of the block sees some key of the other; without a mask
    /// every tile is visited; tiles come key block by key block, query blocks ascending.
    #[test]
    fn tiled_backward_visits_only_blocks_some_query_sees(
        sq in 1usize..200, sk in 1usize..200, block_m in 1usize..130, block_n in 1usize..130, causal in any::<bool>(),
    ) {
        let tiling = BwdTiling { block_m, block_n };
        let (nm, nn) = (sq.div_ceil(block_m), sk.div_ceil(block_n));
        let mut sees = vec![false; nm * nn];
        for i in 0..sq {
            for j in 0..sk {
                if !causal || j + sq <= i + sk {
                    sees[i / block_m * nn + j / block_n] = true;
                }
            }
        }
        let want: Vec<(usize, usize)> =
            (0..nn).flat_map(|n| (0..nm).map(move |m| (m, n))).filter(|&(m, n)| sees[m * nn + n]).collect();
        prop_assert_eq!(visited_block_pairs(causal, tiling, sq, sk), want);
        for n in 0..nn {
            let first = (0..nm).find(|&m| sees[m * nn + n]).unwrap_or(nm);
            let rule = if causal { causal_first_query_block(n, block_m, block_n, sq, sk) } else { 0 };
            prop_assert_eq!(rule, first, "key block {}", n);
        }
    }
}

/// The f32 tiled backward against the f64 gradients, each relative to the sum of the
/// magnitudes of its terms: the scale of f32 rounding in a sum. (Relative to the largest
/// gradient entry alone fails: gradients cancel, to exactly 0 with a single visible key,
/// and now and then to a few thousandths of their terms' magnitudes.)
///
/// Two f32 error sources: the exponent argument `s · scale · log2 e − LSE₂` is rounded
/// to ~|arg| · 2^-24, a relative error of P; and sums (dot products, dS = P (dP − D),
/// the GEMM sums) lose ~2^-24 of their terms' magnitudes each step. The magnitudes:
/// dV_j = Σ P_ij dO_i has Σ P_ij |dO_i| exactly (the exact dV of |dO|); dQ and dK have
/// |dS_ij| ≤ P_ij (|dP_ij| + |D_i|) ≤ 2 P_ij max|dO_i| max|V_j| (Cauchy-Schwarz), and
/// P's rows sum to 1, its columns to the exact dV of an all-ones dO. The allowance is
/// `(32 + 4 |arg|max) · 2^-24` of that (|arg|max bounds the exponent argument); on 4000
/// cases the worst error was 0.19 of it for dV, 0.05 for dK and 0.02 for dQ (whose
/// magnitudes are Cauchy-Schwarz bounds, a median 40x / 170x above |g|), so the
/// allowance is still a small fraction of |g|, while a wrong term is off by ~|g|.
fn check_f32_accuracy(
    p: &Problem<'_>,
    dout: &HostTensor,
    got: &Grads<f32>,
    exact: &Grads<f64>,
) -> Result<(), TestCaseError> {
    let row_norm = |t: &HostTensor| {
        t.data.chunks(t.shape[3]).map(|r| r.iter().map(|x| (x * x) as f64).sum::<f64>().sqrt()).fold(0.0, f64::max)
    };
    let (nq, nk, nv, ndo) = (row_norm(p.q), row_norm(p.k), row_norm(p.v), row_norm(dout));
    let with_dout = |f: fn(f32) -> f32| {
        attention_backward_f64(p, &HostTensor::new(dout.shape, dout.data.iter().map(|&x| f(x)).collect())).dv
    };
    let (abs_dv, col_sums) = (max_abs(&with_dout(f32::abs)), max_abs(&with_dout(|_| 1.0)));
    let scale = p.scale as f64;
    let natural = [
        scale * 2.0 * ndo * nv * max_abs(&p.k.data),
        scale * 2.0 * ndo * nv * max_abs(&p.q.data) * col_sums,
        abs_dv,
    ];
    let max_arg = 2.0 * scale * nq * nk * std::f64::consts::LOG2_E + 1.0;
    let rel = (32.0 + 4.0 * max_arg) * f64::powi(2.0, -24);
    let errs = got.max_abs_err(exact);
    for (i, (name, want)) in [("dQ", &exact.dq), ("dK", &exact.dk), ("dV", &exact.dv)].into_iter().enumerate() {
        let bound = rel * natural[i].max(max_abs(want));
        prop_assert!(errs[i] <= bound, "{name}: error {:e} > {bound:e} (|g| up to {:e})", errs[i], max_abs(want));
    }
    Ok(())
}

/// Relative error of each gradient against the f64 one (relative to its largest entry).
fn rel_errs<T: Copy + Into<f64>>(got: &Grads<T>, exact: &Grads<f64>) -> [f64; 3] {
    let errs = got.max_abs_err(exact);
    [errs[0] / max_abs(&exact.dq), errs[1] / max_abs(&exact.dk), errs[2] / max_abs(&exact.dv)]
}

/// The naive low-precision backward is close to exact but not exact, in f16 and bf16:
/// the budget it sets for the kernels is meaningful (never zero, never huge).
#[test]
fn lowp_backward_error_is_small_but_nonzero() {
    for seed in 0..4u64 {
        for dtype in DType::ALL {
            let (sq, sk, causal) = [(48, 48, false), (48, 48, true), (33, 70, true), (70, 33, false)][seed as usize];
            let [q, k, v, dout] = inputs(1, sq, sk, 4, 2, 32, dtype, seed);
            let p = Problem { q: &q, k: &k, v: &v, causal, scale: 32f32.sqrt().recip(), softcap: None, alibi: None, window: None, sinks: None, docs: None, variant: None };
            let exact = attention_backward_f64(&p, &dout);
            let errs = rel_errs(&attention_backward_lowp(&p, &dout, dtype), &exact);
            let [eq, ek, ev] = errs;
            eprintln!("{dtype:?} seed {seed}: relative errors dQ {eq:.1e} dK {ek:.1e} dV {ev:.1e}");
            for e in errs {
                assert!((1e-4..5e-2).contains(&e), "{dtype:?} seed {seed}: naive relative error {e:e} out of band");
            }
        }
    }
}

/// The rule the GPU backward is held to: with P and dS rounded to f16/bf16 as tensor-core
/// operands and O, LSE from the tiled forward in the same precision, the tiled backward's
/// error is at most twice the naive low-precision backward's plus FlashAttention's slack
/// ([`fa_slack`]), gradient by gradient, on the kernels' tile shapes and awkward sizes;
/// and on average it is no worse than the naive error (measured: mean ratio 0.96 in f16,
/// 0.94 in bf16; worst 1.85, f16 dK at 100 x 130, where the naive error is half an ulp
/// of |dK| ~ 1.2 and the tiled one just under an ulp).
#[test]
fn tiled_lowp_backward_is_within_twice_the_naive_error() {
    let shapes = [(17, 17, true), (100, 100, false), (17, 100, true), (100, 17, true), (100, 130, true)];
    let tilings = [BwdTiling { block_m: 128, block_n: 128 }, BwdTiling { block_m: 64, block_n: 128 }];
    for dtype in [DType::F16, DType::BF16] {
        let mut ratios = Vec::new();
        for (case, &(sq, sk, causal)) in shapes.iter().enumerate() {
            for seed in 0..3u64 {
                let [q, k, v, dout] = inputs(1, sq, sk, 2, 1, 64, dtype, seed * 16 + case as u64);
                let p = Problem { q: &q, k: &k, v: &v, causal, scale: 0.125, softcap: None, alibi: None, window: None, sinks: None, docs: None, variant: None };
                let exact = attention_backward_f64(&p, &dout);
                let naive = attention_backward_lowp(&p, &dout, dtype).max_abs_err(&exact);
                for tiling in tilings {
                    let fwd_tiling = Tiling { block_m: tiling.block_m, block_n: tiling.block_n, lazy_rescale: true };
                    let fwd = attention_tiled(&p, fwd_tiling, Some(dtype));
                    let grads = attention_backward_tiled(&p, &dout, &fwd.o, &fwd.lse, tiling, Some(dtype));
                    let tiled = grads.max_abs_err(&exact);
                    let named = [("dQ", &exact.dq), ("dK", &exact.dk), ("dV", &exact.dv)];
                    for (g, (name, want)) in named.into_iter().enumerate() {
                        ratios.push(tiled[g] / naive[g]);
                        assert!(
                            within_budget(tiled[g], naive[g], fa_slack(want, dtype)),
                            "{dtype:?} {sq}x{sk} causal {causal} seed {seed} {tiling:?}: {name} error {:e} > 2 x {:e} + {:e}",
                            tiled[g],
                            naive[g],
                            fa_slack(want, dtype)
                        );
                    }
                }
            }
        }
        let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
        let worst = ratios.iter().cloned().fold(0.0, f64::max);
        eprintln!("{dtype:?}: tiled / naive error ratio mean {mean:.3}, worst {worst:.3}");
        assert!(mean <= 1.1, "{dtype:?}: the tiled backward is worse than the naive one on average ({mean:.3})");
    }
}

/// Rows that see no key (causal, seqlen_q > seqlen_k: LSE = +inf) get dQ = 0 and add
/// nothing to dK and dV: whatever their q and dO, the other gradients do not move; and
/// no reference produces a NaN.
#[test]
fn rows_without_keys_give_zero_dq_and_add_nothing_to_dk_dv() {
    let (sq, sk, hq, hk, d) = (20, 6, 4, 2, 16);
    let empty_rows = sq - sk;
    let [q, k, v, dout] = inputs(2, sq, sk, hq, hk, d, DType::BF16, 5);
    // The same problem with other (large) q and dO on the empty rows.
    let garble = |t: &HostTensor, salt: u64| {
        let noise = randn(t.shape, salt, 100.0);
        let mut g = t.clone();
        for (i, (x, n)) in g.data.iter_mut().zip(&noise.data).enumerate() {
            if (i / (hq * d)) % sq < empty_rows {
                *x = *n;
            }
        }
        g
    };
    let (q2, dout2) = (garble(&q, 77), garble(&dout, 78));
    let odd_tiles = BwdTiling { block_m: 3, block_n: 16 };
    let run = |q: &HostTensor, dout: &HostTensor| -> Vec<Grads<f64>> {
        let p = Problem { q, k: &k, v: &v, causal: true, scale: 0.3, softcap: None, alibi: None, window: None, sinks: None, docs: None, variant: None };
        let fwd = attention_tiled(&p, Tiling { block_m: 8, block_n: 4, lazy_rescale: true }, None);
        assert!(fwd.lse.iter().enumerate().all(|(r, &l)| (r % sq < empty_rows) == (l == f32::INFINITY)));
        let widen = |g: Grads<f32>| Grads {
            dq: g.dq.iter().map(|&x| x as f64).collect(),
            dk: g.dk.iter().map(|&x| x as f64).collect(),
            dv: g.dv.iter().map(|&x| x as f64).collect(),
        };
        vec![
            attention_backward_f64(&p, dout),
            widen(attention_backward_lowp(&p, dout, DType::F16)),
            widen(attention_backward_tiled(&p, dout, &fwd.o, &fwd.lse, BwdTiling { block_m: 8, block_n: 4 }, None)),
            widen(attention_backward_tiled(&p, dout, &fwd.o, &fwd.lse, odd_tiles, Some(DType::BF16))),
        ]
    };
    for (g, g2) in run(&q, &dout).iter().zip(run(&q2, &dout2)) {
        for x in [&g.dq, &g.dk, &g.dv, &g2.dq, &g2.dk, &g2.dv] {
            assert!(x.iter().all(|v| v.is_finite()));
        }
        for (i, (a, b)) in g.dq.chunks(hq * d).zip(g2.dq.chunks(hq * d)).enumerate() {
            if i % sq < empty_rows {
                assert!(a.iter().chain(b).all(|&x| x == 0.0), "row {i}: dQ of a row without keys is not 0");
            } else {
                assert_eq!(a, b, "row {i}: dQ moved with another row's q or dO");
            }
        }
        assert!(max_abs(&g.dq) > 0.0 && max_abs(&g.dk) > 0.0);
        assert_eq!((&g.dk, &g.dv), (&g2.dk, &g2.dv), "dK/dV moved with the q or dO of rows without keys");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// With a sliding window and documents, a key block is visited by exactly the query
    /// blocks that have a row seeing one of its keys (`query_block_range`, from the
    /// block's first and last keys), and a key's rows are exactly those whose band and
    /// document hold it.
    #[test]
    fn window_and_document_block_ranges_are_exactly_the_blocks_some_query_sees(
        sq in 1usize..120, sk in 1usize..120, block_m in 1usize..40, block_n in 1usize..40,
        causal in any::<bool>(), left in proptest::option::of(0usize..50), right in proptest::option::of(0usize..50),
        doc_lens in proptest::option::of(proptest::collection::vec(1usize..30, 1..12)),
    ) {
        let (q, k) = (HostTensor::new([1, sq, 1, 1], vec![0.0; sq]), HostTensor::new([1, sk, 1, 1], vec![0.0; sk]));
        // Documents of these lengths (the last one filling the keys); rows sit at keys.
        let ids: Option<Vec<u32>> = doc_lens.filter(|_| sq <= sk).map(|l| (0..sk).map(|j| {
            let mut end = 0;
            l.iter().position(|&len| { end += len; j < end }).unwrap_or(l.len()) as u32
        }).collect());
        let docs = ids.as_deref().map(|ids| HostDocs { ids, per_batch: false });
        let p = Problem { q: &q, k: &k, v: &k, causal, scale: 1.0, softcap: None, alibi: None, window: Some(Window { left, right }), sinks: None, docs, variant: None };
        let off = sk - sq.min(sk);
        for j in 0..sk {
            let want: Vec<usize> = (0..sq)
                .filter(|&i| p.sees(0, i, j))
                .collect();
            // Independently of `sees`: the same id.
            if let Some(ids) = &ids {
                prop_assert!(want.iter().all(|&i| ids[i + off] == ids[j]));
            }
            prop_assert_eq!(rows_seeing(&p, 0, j).collect::<Vec<_>>(), want, "key {}", j);
        }
        let tiling = BwdTiling { block_m, block_n };
        for n in 0..sk.div_ceil(block_n) {
            let keys = n * block_n..((n + 1) * block_n).min(sk);
            let want: Vec<usize> = (0..sq.div_ceil(block_m))
                .filter(|&m| (m * block_m..((m + 1) * block_m).min(sq)).any(|i| keys.clone().any(|j| p.sees(0, i, j))))
                .collect();
            prop_assert_eq!(query_block_range(&p, 0, n, tiling).collect::<Vec<_>>(), want, "key block {}", n);
        }
    }
}

/// The sinks' gradient check passes the f32 rounding of the right gradient and fails a
/// wrong one (sign flipped, one batch left out), so the GPU tests' check can fail.
#[test]
fn sink_gradient_check_accepts_rounding_and_rejects_wrong_terms() {
    let (b, s, h, d) = (2, 300, 3, 64);
    let [q, k, v, dout] = inputs(b, s, s, h, h, d, DType::BF16, 7);
    let sinks = sink_logits(h, -0.5);
    let p = Problem { q: &q, k: &k, v: &v, causal: true, scale: 0.125, softcap: None, alibi: None, window: None, sinks: Some(&sinks), docs: None, variant: None };
    let fwd = attention_tiled(&p, Tiling { block_m: 64, block_n: 64, lazy_rescale: true }, Some(DType::BF16));
    let given = flash_attn3::reference::backward::sink_grads_given(&p, &dout, &fwd.o, &fwd.lse);
    let right: Vec<f32> = given.iter().map(|&(g, _)| g as f32).collect();
    let check = |got: &[f32]| flash_attn3::check::check_sink_grads(&p, &dout, DType::BF16, &fwd.o, &fwd.lse, got);
    assert!(check(&right).passed(), "{}", check(&right));
    let flipped: Vec<f32> = right.iter().map(|g| -g).collect();
    assert!(!check(&flipped).passed());
    // Batch 0 alone: half the rows' terms.
    let half: Vec<f32> = {
        let mut o0 = fwd.o.clone();
        let mut l0 = fwd.lse.clone();
        let (rows, heads) = (s * h * d, h * s);
        o0[rows..].iter_mut().for_each(|x| *x = 0.0);
        l0[heads..].iter_mut().for_each(|x| *x = f32::INFINITY);
        flash_attn3::reference::backward::sink_grads_given(&p, &dout, &o0, &l0).iter().map(|&(g, _)| g as f32).collect()
    };
    assert!(!check(&half).passed());
    let nan = vec![f32::NAN; h];
    assert!(!check(&nan).passed());
}
