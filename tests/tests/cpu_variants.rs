//! User-defined variants (`common::variant::Variant`) in the CPU references: a variant
//! written as soft-capping, or as a sliding window, gives the built-in variant's O, LSE
//! and gradients (so the references' hook applies the score, its derivative and the mask
//! where the built-ins do); the tiled forward and backward (the kernels' algorithm)
//! equal the exact ones with a variant that biases and masks; rows a variant hides
//! entirely get O = 0 and LSE = +inf.
use common::variant::{Coords, Variant, VariantData};
use flash_attn3::DType;
use flash_attn3::reference::backward::{BwdTiling, attention_backward_f64, attention_backward_tiled};
use flash_attn3::reference::{HostTensor, HostVariantOf, Problem, Tiling, Window, attention_f64, attention_tiled, rng};
use proptest::prelude::*;

/// Soft-capping at the cap in word 0: `c · tanh(x / c)`, derivative `1 − tanh²`.
#[derive(Clone, Copy)]
struct Capped;

impl Variant for Capped {
    const SCORE_MOD: bool = true;
    const MASK_MOD: bool = false;
    fn score<D: VariantData + ?Sized>(data: &D, _: Coords, x: f32) -> f32 {
        let c = data.f32_at(0);
        c * (x / c).tanh()
    }
    fn score_grad<D: VariantData + ?Sized>(data: &D, _: Coords, x: f32) -> f32 {
        let t = (x / data.f32_at(0)).tanh();
        1.0 - t * t
    }
}

/// A sliding window of words 0 (left) and 1 (right) keys around the bottom-right diagonal.
#[derive(Clone, Copy)]
struct Windowed;

impl Variant for Windowed {
    const SCORE_MOD: bool = false;
    const MASK_MOD: bool = true;
    fn visible<D: VariantData + ?Sized>(data: &D, at: Coords) -> bool {
        let diagonal = at.q as i64 + at.seqlen_k as i64 - at.seqlen_q as i64;
        let kv = at.kv as i64;
        kv >= diagonal - data.u32_at(0) as i64 && kv <= diagonal + data.u32_at(1) as i64
    }
}

/// A per-head bias by key parity, and a mask hiding keys `kv ≡ q (mod 3)` of odd heads.
#[derive(Clone, Copy)]
struct Striped;

impl Variant for Striped {
    const SCORE_MOD: bool = true;
    const MASK_MOD: bool = true;
    const SCORE_GRAD: bool = false;
    fn score<D: VariantData + ?Sized>(data: &D, at: Coords, x: f32) -> f32 {
        x + data.f32_at(2 * at.head + at.kv % 2)
    }
    fn visible<D: VariantData + ?Sized>(_: &D, at: Coords) -> bool {
        at.head % 2 == 0 || at.kv % 3 != at.q % 3
    }
}

fn inputs(b: usize, sq: usize, sk: usize, hq: usize, hk: usize, d: usize, seed: u64) -> [HostTensor; 4] {
    let t = |s: usize, h: usize, salt: u64| HostTensor::randn([b, s, h, d], DType::BF16, 1.0, &mut rng(seed ^ salt));
    [t(sq, hq, 0), t(sk, hk, 1), t(sk, hk, 2), t(sq, hq, 3)]
}

/// Largest absolute difference, infinities equal only to themselves.
fn diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).fold(0.0, |m, (&x, &y)| m.max(if x == y { 0.0 } else { (x - y).abs() }))
}

fn shapes() -> impl Strategy<Value = (usize, usize, usize, usize, usize, usize, bool, u64)> {
    let heads = prop::sample::select(vec![(1usize, 1usize), (2, 1), (4, 2), (2, 2)]);
    (1usize..3, 1usize..40, 1usize..40, heads, prop::sample::select(vec![1usize, 8, 16]), any::<bool>(), any::<u64>())
        .prop_map(|(b, sq, sk, (hq, hk), d, causal, seed)| (b, sq, sk, hq, hk, d, causal, seed))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Soft-capping as a variant is the built-in soft-capping: O, LSE, dQ, dK, dV agree
    /// to the variant's f32 evaluation.
    #[test]
    fn a_soft_capping_variant_equals_built_in_soft_capping((b, sq, sk, hq, hk, d, causal, seed) in shapes(), cap in 0.5f32..20.0, scale in 0.1f32..1.5) {
        let [q, k, v, dout] = inputs(b, sq, sk, hq, hk, d, seed);
        let variant = HostVariantOf::<Capped>::new(vec![cap.to_bits()]);
        let built_in = Problem { softcap: Some(cap), ..Problem::plain(&q, &k, &v, causal, scale) };
        let user = Problem { variant: Some(&variant), ..Problem::plain(&q, &k, &v, causal, scale) };
        let (a, u) = (attention_f64(&built_in), attention_f64(&user));
        prop_assert!(diff(&a.o, &u.o) < 1e-5 && diff(&a.lse, &u.lse) < 1e-5, "O {:e}, LSE {:e}", diff(&a.o, &u.o), diff(&a.lse, &u.lse));
        let (ga, gu) = (attention_backward_f64(&built_in, &dout), attention_backward_f64(&user, &dout));
        for (name, x, y) in [("dQ", &ga.dq, &gu.dq), ("dK", &ga.dk, &gu.dk), ("dV", &ga.dv, &gu.dv)] {
            let bound = 1e-5 * x.iter().fold(1.0f64, |m, g| m.max(g.abs()));
            prop_assert!(diff(x, y) < bound, "{name}: {:e}", diff(x, y));
        }
    }

    /// A window as a variant's mask (without the causal flag) is the built-in window,
    /// rows that see no key included (O = 0, LSE = +inf in both).
    #[test]
    fn a_masking_variant_equals_the_built_in_window((b, sq, sk, hq, hk, d, _causal, seed) in shapes(), left in 0u32..12, right in 0u32..12) {
        let [q, k, v, dout] = inputs(b, sq, sk, hq, hk, d, seed);
        let variant = HostVariantOf::<Windowed>::new(vec![left, right]);
        let window = Window { left: Some(left as usize), right: Some(right as usize) };
        let built_in = Problem { window: Some(window), ..Problem::plain(&q, &k, &v, false, 0.3) };
        let user = Problem { variant: Some(&variant), ..Problem::plain(&q, &k, &v, false, 0.3) };
        let (a, u) = (attention_f64(&built_in), attention_f64(&user));
        prop_assert!(diff(&a.o, &u.o) < 1e-9 && diff(&a.lse, &u.lse) < 1e-9, "O {:e}, LSE {:e}", diff(&a.o, &u.o), diff(&a.lse, &u.lse));
        let (ga, gu) = (attention_backward_f64(&built_in, &dout), attention_backward_f64(&user, &dout));
        for (x, y) in [(&ga.dq, &gu.dq), (&ga.dk, &gu.dk), (&ga.dv, &gu.dv)] {
            prop_assert!(diff(x, y) < 1e-9);
        }
    }

    /// The tiled forward and backward (the kernels' algorithm: blocks, online softmax in
    /// base 2, logits from the variant) equal the exact ones with a variant that biases
    /// and masks, causal or not, any tile shape.
    #[test]
    fn tiled_algorithm_with_a_variant_equals_exact((b, sq, sk, hq, hk, d, causal, seed) in shapes(), block_m in prop::sample::select(vec![1usize, 16, 64]), block_n in prop::sample::select(vec![1usize, 16, 64])) {
        let [q, k, v, dout] = inputs(b, sq, sk, hq, hk, d, seed);
        let biases: Vec<u32> = (0..2 * hq).map(|i| (i as f32 * 0.37 - 0.8).to_bits()).collect();
        let variant = HostVariantOf::<Striped>::new(biases);
        let p = Problem { variant: Some(&variant), ..Problem::plain(&q, &k, &v, causal, 0.25) };
        let exact = attention_f64(&p);
        let fwd = attention_tiled(&p, Tiling { block_m, block_n, lazy_rescale: true }, None);
        let o: Vec<f64> = fwd.o.iter().map(|&x| x as f64).collect();
        let lse: Vec<f64> = fwd.lse.iter().map(|&x| x as f64).collect();
        prop_assert!(diff(&o, &exact.o) < 1e-4 && diff(&lse, &exact.lse) < 1e-4, "O {:e}, LSE {:e}", diff(&o, &exact.o), diff(&lse, &exact.lse));
        let grads = attention_backward_tiled(&p, &dout, &fwd.o, &fwd.lse, BwdTiling { block_m, block_n }, None);
        let want = attention_backward_f64(&p, &dout);
        for (name, got, want) in [("dQ", &grads.dq, &want.dq), ("dK", &grads.dk, &want.dk), ("dV", &grads.dv, &want.dv)] {
            let got: Vec<f64> = got.iter().map(|&x| x as f64).collect();
            let bound = 1e-4 * want.iter().fold(1.0f64, |m, g| m.max(g.abs()));
            prop_assert!(diff(&got, want) < bound, "{name}: {:e}", diff(&got, want));
        }
    }
}

/// A variant that hides every key of some rows: those get O = 0 and LSE = +inf, and the
/// rows' gradients are 0.
#[test]
fn rows_a_variant_hides_entirely_see_nothing() {
    let [q, k, v, dout] = inputs(1, 6, 5, 2, 1, 8, 7);
    // Window 0..0 around a diagonal that, with seqlen_q > seqlen_k, is negative for row 0.
    let variant = HostVariantOf::<Windowed>::new(vec![0, 0]);
    let p = Problem { variant: Some(&variant), ..Problem::plain(&q, &k, &v, false, 0.5) };
    let out = attention_f64(&p);
    // Row 0 of each head: diagonal key −1, no key.
    for h in 0..2 {
        assert_eq!(out.lse[h * 6], f64::INFINITY);
        assert!(out.o[h * 8..h * 8 + 8].iter().all(|&x| x == 0.0));
        assert!(out.lse[h * 6 + 1].is_finite(), "row 1 sees key 0");
    }
    let g = attention_backward_f64(&p, &dout);
    assert!(g.dq[..8].iter().all(|&x| x == 0.0));
}

/// The finite-difference check of a variant's derivative: exact for soft-capping, a bias
/// and a mask; a derivative left at 1 for soft-capping is caught.
#[test]
fn score_grad_error_catches_a_wrong_derivative() {
    use flash_attn3::reference::score_grad_error;
    let at: Vec<Coords> = (0..6u32).map(|i| Coords { batch: 0, head: i % 2, q: i, kv: 5 - i, seqlen_q: 6, seqlen_k: 6 }).collect();
    let xs = [-20.0f32, -3.0, -0.5, 0.0, 0.7, 4.0, 25.0];
    let cap = [8.0f32.to_bits()];
    assert!(score_grad_error::<Capped>(&cap, &at, &xs) < 1e-2);
    let biases: Vec<u32> = (0..4).map(|i| (i as f32 * 0.5).to_bits()).collect();
    assert!(score_grad_error::<Striped>(&biases, &at, &xs) < 1e-3);
    assert!(score_grad_error::<Windowed>(&[1, 1], &at, &xs) < 1e-3);
    /// Soft-capping with the default derivative (1): wrong.
    #[derive(Clone, Copy)]
    struct CappedNoGrad;
    impl Variant for CappedNoGrad {
        const SCORE_MOD: bool = true;
        const MASK_MOD: bool = false;
        fn score<D: VariantData + ?Sized>(data: &D, at: Coords, x: f32) -> f32 {
            Capped::score(data, at, x)
        }
    }
    assert!(score_grad_error::<CappedNoGrad>(&cap, &at, &xs) > 0.5);
}

/// The key-bound check: a window's true bound passes, one key short is a visible pair
/// past the bound, and a bound that falls with the row is caught.
#[test]
fn key_end_error_catches_a_bound_that_hides_visible_keys() {
    use flash_attn3::reference::key_end_error;
    /// [`Windowed`] with the bound `diagonal + right + 1 − short`, or falling past row 3.
    #[derive(Clone, Copy)]
    struct Bounded<const SHORT: u32, const FALLS: bool>;
    impl<const SHORT: u32, const FALLS: bool> Variant for Bounded<SHORT, FALLS> {
        const SCORE_MOD: bool = false;
        const MASK_MOD: bool = true;
        const KEY_END: bool = true;
        fn visible<D: VariantData + ?Sized>(data: &D, at: Coords) -> bool {
            Windowed::visible(data, at)
        }
        fn key_end<D: VariantData + ?Sized>(data: &D, _: u32, q: u32, seqlen_q: u32, seqlen_k: u32) -> u32 {
            if FALLS && q > 3 {
                return 0;
            }
            let end = q as i64 + seqlen_k as i64 - seqlen_q as i64 + data.u32_at(1) as i64 + 1 - SHORT as i64;
            end.max(0) as u32
        }
    }
    let window = [2u32, 1];
    for (sq, sk) in [(9, 9), (5, 12), (12, 5)] {
        assert_eq!(key_end_error::<Bounded<0, false>>(&window, 2, 2, sq, sk), None, "sq {sq} sk {sk}");
        assert!(key_end_error::<Bounded<1, false>>(&window, 2, 2, sq, sk).is_some_and(|e| e.contains("past its bound")), "sq {sq} sk {sk}");
    }
    assert!(key_end_error::<Bounded<0, true>>(&window, 1, 1, 9, 9).is_some_and(|e| e.contains("below")));
}
