//! Times the example's variants against the library's plain kernels, forward and
//! backward, bf16, with the timing method of `fa3 bench` (steady state, median):
//! `rel_bias` causal (a learned bias of 257 buckets per head), `prefix_lm` with a prefix of a
//! quarter of the keys (non-causal kernels: every key block is visited), and plain causal
//! as the baseline. TFLOP/s on visible pairs (4 d per pair forward, 2.5x backward). Prints
//! CSV: impl,dtype,hdim,seqlen,batch,heads,causal,ms,tflops.
//!
//! usage: variants-bench [HDIM SEQLEN BATCH HEADS]
use fa3_variants_example::{PREFIX_LM, PTX, REL_BIAS, RelBias, VARIANTS, prefix_lm_data, rel_bias_data};
use flash_attn3::bench::{TimingPlan, time_calls};
use flash_attn3::{AttnOptions, DType, DeviceTensor, Gpu, VariantModule, flash_attn_backward, flash_attn_func};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse()).collect::<Result<_, _>>()?;
    let [d, s, b, h] = match args[..] {
        [d, s, b, h] => [d, s, b, h],
        [] => [128, 16384, 1, 16],
        _ => return Err("usage: variants-bench [HDIM SEQLEN BATCH HEADS]".into()),
    };
    let gpu = Gpu::new(0)?;
    let stream = gpu.new_stream()?;
    let module = VariantModule::load(&gpu, PTX, &VARIANTS)?;
    let n = b * s * h * d;
    let data: Vec<f32> = (0..n).map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0).collect();
    let t = |off: usize| DeviceTensor::from_f32(&stream, DType::BF16, [b, s, h, d], &data[off..].iter().chain(&data[..off]).copied().collect::<Vec<_>>());
    let (q, k, v, dout) = (t(0)?, t(13)?, t(29)?, t(71)?);
    let table: Vec<f32> = (0..h * RelBias::BUCKETS as usize).map(|i| (i % 17) as f32 / 17.0 - 0.5).collect();
    let bias = stream.clone_htod(&rel_bias_data(&table))?;
    let prefix = s / 4;
    let prefixes = stream.clone_htod(&prefix_lm_data(&vec![prefix as u32; b]))?;
    let causal_pairs = (s * (s + 1) / 2) as f64;
    let prefix_pairs = (0..s).map(|i| (i + 1).max(prefix)).sum::<usize>() as f64;
    let runs = [
        ("fa3-causal", AttnOptions::default().causal(true), causal_pairs, true),
        ("fa3-rel_bias-causal", AttnOptions::default().causal(true).variant(module.variant(REL_BIAS)?.data_u32(&bias)), causal_pairs, true),
        ("fa3-prefix_lm", AttnOptions::default().variant(module.variant(PREFIX_LM)?.data_u32(&prefixes)), prefix_pairs, false),
    ];
    let plan = TimingPlan { warmup: 3, warmup_ms: 1000, iters: 20, timing_ms: 300 };
    println!("impl,dtype,hdim,seqlen,batch,heads,causal,ms,tflops");
    for (name, opts, pairs, causal) in runs {
        let fwd = flash_attn_func(&gpu, &stream, &q.as_ref(), &k.as_ref(), &v.as_ref(), &opts)?;
        let f = time_calls(&gpu, &stream, plan, || flash_attn_func(&gpu, &stream, &q.as_ref(), &k.as_ref(), &v.as_ref(), &opts).map(|_| ()))?;
        let g = time_calls(&gpu, &stream, plan, || {
            flash_attn_backward(&gpu, &stream, &q.as_ref(), &k.as_ref(), &v.as_ref(), &fwd.out.as_ref(), &fwd.lse, &dout.as_ref(), &opts).map(|_| ())
        })?;
        for (suffix, ms, factor) in [("", f.median_ms, 1.0), ("-bwd", g.median_ms, 2.5)] {
            let tflops = 4.0 * (d * b * h) as f64 * pairs * factor / (ms * 1e-3) / 1e12;
            println!("{name}{suffix},bf16,{d},{s},{b},{h},{},{ms:.4},{tflops:.1}", causal as u8);
        }
    }
    Ok(())
}
