//! The FP8 references on the CPU: e4m3 rounding, quantization by groups, incoherent
//! processing, and the paper's accuracy experiment on a small case.
use flash_attn3::check::O_SLACK;
use flash_attn3::reference::fp8::{
    E4M3_MAX, Granularity, Hadamard, attention_fp8_lowp, attention_fp8_v_unit, fp8_accuracy, outlier_tensor, quantize, rmse, round_e4m3,
};
use flash_attn3::reference::{HostTensor, Problem, attention_f64, max_abs_err, rng, within_budget};
use flash_attn3::DType;
use rand::Rng;

#[test]
fn e4m3_rounding_is_the_formats() {
    // Saturation at the largest finite value, not infinity or NaN.
    for (x, want) in [(448.0, 448.0), (1000.0, 448.0), (-1e9, -448.0), (464.0, 448.0)] {
        assert_eq!(round_e4m3(x), want, "{x}");
    }
    // Three mantissa bits, ties to even: 1.0625 lies between 1 and 1.125.
    for (x, want) in [(1.0625, 1.0), (1.1875, 1.25), (1.2, 1.25), (-3.3, -3.25), (0.0, 0.0)] {
        assert_eq!(round_e4m3(x), want, "{x}");
    }
    // Subnormals: steps of 2^-9 below 2^-6, and zero below half a step.
    let step = 2f32.powi(-9);
    for (x, want) in [(step, step), (0.6 * step, step), (0.4 * step, 0.0), (5.4 * step, 5.0 * step)] {
        assert_eq!(round_e4m3(x), want, "{x}");
    }
    // Everywhere in the normal range: within half a step (2^(e-3)) of x.
    let mut r = rng(1);
    for _ in 0..100_000 {
        let x: f32 = r.random_range(2f32.powi(-6)..E4M3_MAX) * if r.random() { 1.0 } else { -1.0 };
        let half_step = 2f32.powi(x.abs().log2().floor() as i32 - 4);
        assert!((round_e4m3(x) - x).abs() <= half_step, "{x} -> {}", round_e4m3(x));
    }
}

#[test]
fn quantized_groups_keep_their_largest_value_and_e4m3_precision_and_pow2_blocks_are_powers_of_two() {
    let mut r = rng(2);
    let t = outlier_tensor([2, 300, 3, 64], 0.01, 10.0, &mut r);
    let blocks = [(Granularity::Blocks { rows: 128 }, 18), (Granularity::Pow2Blocks { rows: 128 }, 18)];
    for (g, groups) in [(Granularity::PerTensor, 1), (Granularity::PerHead, 6)].into_iter().chain(blocks) {
        let q = quantize(&t, g);
        assert_eq!(q.scales.len(), groups, "{g:?}");
        assert!(q.scales.iter().all(|s| s.is_finite() && *s > 0.0));
        let amax = t.data.iter().fold(0f32, |m, x| m.max(x.abs()));
        let qmax = q.values.data.iter().fold(0f32, |m, x| m.max(x.abs()));
        if g != (Granularity::Pow2Blocks { rows: 128 }) {
            assert!((qmax - amax).abs() <= amax * 1e-6, "{g:?}: the largest value survives ({qmax} vs {amax})");
        } else {
            // Powers of two (V's): a block's largest magnitude lands in (224, 448], rounded.
            assert!(q.scales.iter().all(|s| common::fp8::pow2_exponent(*s).is_some()), "{g:?}: {:?}", q.scales);
            assert!((qmax - amax).abs() <= amax / 16.0, "{g:?}: the largest value within e4m3's step ({qmax} vs {amax})");
        }
        let scale_max = q.scales.iter().cloned().fold(0f32, f32::max);
        for (&x, &y) in t.data.iter().zip(&q.values.data) {
            // Normal range: relative error up to 2^-4; subnormal: half a step of 2^-9.
            let budget = (x.abs() / 16.0).max(scale_max * 2f32.powi(-10)) * 1.0001;
            assert!((x - y).abs() <= budget, "{g:?}: {x} -> {y}");
        }
    }
    // A group of zeros stays zero.
    let z = quantize(&HostTensor::new([1, 4, 1, 64], vec![0.0; 256]), Granularity::PerHead);
    assert!(z.values.data.iter().all(|&x| x == 0.0) && z.scales == [1.0]);
}

#[test]
fn hadamard_keeps_dot_products_and_spreads_outliers() {
    let mut r = rng(3);
    for d in [64, 128, 256] {
        let h = Hadamard::new(d, &mut r);
        let a: Vec<f32> = (0..d).map(|_| r.random_range(-1.0..1.0)).collect();
        let b: Vec<f32> = (0..d).map(|_| r.random_range(-1.0..1.0)).collect();
        let (mut ah, mut bh) = (a.clone(), b.clone());
        h.apply_row(&mut ah);
        h.apply_row(&mut bh);
        let dot = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(p, q)| p * q).sum::<f32>();
        assert!((dot(&a, &b) - dot(&ah, &bh)).abs() < 1e-4, "d {d}: q·k changed");
        assert!((dot(&a, &a) - dot(&ah, &ah)).abs() < 1e-4, "d {d}: norm changed");
        let mut spike = vec![0.0f32; d];
        spike[d / 3] = 100.0;
        h.apply_row(&mut spike);
        let each = 100.0 / (d as f32).sqrt();
        assert!(spike.iter().all(|x| (x.abs() - each).abs() < 1e-3), "d {d}: the outlier is spread evenly");
    }
}

/// The paper's experiment on a small case: block scales beat one scale per tensor, and
/// incoherent processing beats block scales alone, with outliers in the inputs.
#[test]
fn block_scales_and_incoherent_processing_order_the_errors() {
    let mut r = rng(4);
    // 4 heads of 1024: at 512 tokens and one head the block scales' gain is within the
    // seeds' spread.
    let shape = [1, 1024, 4, 128];
    let (q, k, v) = (outlier_tensor(shape, 1e-3, 10.0, &mut r), outlier_tensor(shape, 1e-3, 10.0, &mut r), outlier_tensor(shape, 1e-3, 10.0, &mut r));
    let exact = attention_f64(&Problem::plain(&q, &k, &v, false, 1.0 / 128f32.sqrt())).o;
    let acc = fp8_accuracy(&q, &k, &v, &exact, 128, 128, &Hadamard::from_seed(128, 4));
    println!("{acc:?}");
    assert!(acc.blocks_incoherent < acc.blocks && acc.blocks < acc.per_tensor, "{acc:?}");
    // The FP8 emulation is attention: bf16-level outputs are far closer than the signal.
    let rms = (exact.iter().map(|x| x * x).sum::<f64>() / exact.len() as f64).sqrt();
    assert!(acc.per_tensor < 0.5 * rms, "{acc:?} against an output RMS of {rms}");
}

/// With e4m3-exact inputs and P the only rounding left, the FP8 reference is within FP8's
/// precision of exact attention, and its LSE (P's factor removed) is the exact one.
#[test]
fn fp8_reference_is_attention_up_to_rounding() {
    let mut r = rng(5);
    let shape = [2, 77, 2, 64];
    let rnd = |r: &mut _| quantize(&HostTensor::randn(shape, DType::F16, 1.0, r), Granularity::PerHead).values;
    let (q, k, v) = (rnd(&mut r), rnd(&mut r), rnd(&mut r));
    for causal in [false, true] {
        let p = Problem::plain(&q, &k, &v, causal, 0.125);
        let (exact, got) = (attention_f64(&p), attention_fp8_lowp(&p, DType::BF16));
        assert!(rmse(&got.o, &exact.o) < 0.02, "causal {causal}: {}", rmse(&got.o, &exact.o));
        for (g, w) in got.lse.iter().zip(&exact.lse) {
            assert!((*g as f64 - w).abs() < 1e-4, "causal {causal}: LSE {g} vs {w}");
        }
    }
}

/// V's per-block factors carried in P's `exp2` offset relative to O's unit (the FP8
/// kernel's scheme, `common::fp8::VUnit`) keep the 2x error rule against the naive
/// low-precision attention, with V's blocks spread over 2^10 in magnitude: falling and
/// rising along the keys, alternating (near and far), and at
/// random; causal or not, a ragged last block. (The kernel visits the keys last to
/// first: falling factors move the unit up at every block, rising ones keep it while
/// they are within its span.) Powers of two shift P exactly, so above e4m3's subnormals
/// the rounding is the naive one's.
#[test]
fn v_block_factors_in_o_units_keep_the_error_budget() {
    let mut r = rng(6);
    let (bn, d): (usize, usize) = (128, 64);
    let (qs, ks) = ([1, 48, 2, d], [1, 1000, 1, d]);
    let blocks = ks[1].div_ceil(bn);
    // Whether some blocks must ride in P (a shift); elsewhere they may, where an outlier
    // moved a block's factor.
    let patterns: [(&str, Vec<i32>, bool); 5] = [
        ("falling", (0..blocks as i32).map(|j| -j.min(10)).collect(), false),
        ("rising", (0..blocks as i32).map(|j| j.min(10) - 10).collect(), true),
        ("alternating far", (0..blocks as i32).map(|j| if j % 2 == 0 { 0 } else { -7 }).collect(), false),
        ("alternating near", (0..blocks as i32).map(|j| if j % 2 == 0 { 0 } else { -2 }).collect(), true),
        ("random", (0..blocks).map(|_| r.random_range(-10..=0)).collect(), true),
    ];
    let q = quantize(&outlier_tensor(qs, 1e-3, 10.0, &mut r), Granularity::PerHead).values;
    let k = quantize(&outlier_tensor(ks, 1e-3, 10.0, &mut r), Granularity::PerHead).values;
    for (name, exps, shifts) in patterns {
        let mut v = outlier_tensor(ks, 1e-3, 10.0, &mut r);
        for (j, row) in v.data.chunks_mut(d).enumerate() {
            let f = 2f32.powi(exps[j / bn]);
            row.iter_mut().for_each(|x| *x *= f);
        }
        let v = quantize(&v, Granularity::Pow2Blocks { rows: bn });
        // Which blocks ride in P, visited last to first as the kernel does.
        let mut unit = common::fp8::VUnit::new();
        let paths: Vec<bool> = v.scales.iter().rev().map(|&f| unit.enter(f).is_ok()).collect();
        assert!(paths.contains(&true) || !shifts, "{name}: {paths:?}");
        for causal in [false, true] {
            let p = Problem::plain(&q, &k, &v.values, causal, 1.0 / (d as f32).sqrt());
            let exact = attention_f64(&p);
            let (naive, unit) = (attention_fp8_lowp(&p, DType::BF16), attention_fp8_v_unit(&p, &v.scales, bn, DType::BF16));
            let (e_unit, e_naive) = (max_abs_err(&unit.o, &exact.o), max_abs_err(&naive.o, &exact.o));
            println!("{name} causal {causal}: O err {e_unit:.3e} (naive {e_naive:.3e})");
            assert!(within_budget(e_unit, e_naive, O_SLACK), "{name} causal {causal}: {e_unit:.3e} against naive {e_naive:.3e}");
            assert_eq!(unit.lse, naive.lse, "the unit leaves the row sums alone");
        }
    }
}
