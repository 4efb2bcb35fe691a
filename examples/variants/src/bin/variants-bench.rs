//! Times the example's variants against the library's plain kernels, forward and
//! backward, bf16, with the timing method of `fa3 bench` (steady state, median):
//! `rel_bias` causal (a learned bias of 257 buckets per head), `prefix_lm` with a prefix of a
//! quarter of the keys (its key bound; `-blockmask`: through a block mask instead),
//! `local_global` (keys within 1024 of the diagonal, 256 global tokens; `-blockmask`: with
//! a block mask, `-dense`: without, every block visited and masked), and plain causal as
//! the baseline. TFLOP/s on visible pairs (4 d per pair forward, 2.5x backward). Prints
//! CSV: impl,dtype,hdim,seqlen,batch,heads,causal,ms,tflops; and the block masks' build
//! times and densities on stderr.
//!
//! usage: variants-bench [HDIM SEQLEN BATCH HEADS]
use fa3_variants_example::{LOCAL_GLOBAL, PREFIX_LM, PTX, REL_BIAS, RelBias, VARIANTS, local_global_data, prefix_lm_data, rel_bias_data};
use flash_attn3::bench::{TimingPlan, time_calls};
use flash_attn3::{AttnOptions, BlockMask, BlockMaskShape, DType, DeviceTensor, Gpu, VariantModule, flash_attn_backward, flash_attn_func};

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
    let (window, globals) = (1024usize, 256usize);
    let local_global = stream.clone_htod(&local_global_data(window as u32, globals as u32))?;
    let local_global_pairs = (0..s).map(|i| if i < globals { s } else { (i + window + 1).min(s) - i.saturating_sub(window).max(globals) + globals }).sum::<usize>() as f64;
    let shape = BlockMaskShape::new(b, s, s, h, h, d).same_for_every_head();
    let prefix_lm = module.variant(PREFIX_LM)?.data_u32(&prefixes);
    let lg = module.variant(LOCAL_GLOBAL)?.data_u32(&local_global);
    let mut masks = Vec::new();
    for (name, v) in [("prefix_lm", &prefix_lm), ("local_global", &lg)] {
        stream.synchronize()?;
        let t0 = std::time::Instant::now();
        let m = BlockMask::new(&gpu, &stream, v, shape)?;
        stream.synchronize()?;
        let (visited, partial) = m.density(&stream)?;
        eprintln!("{name} block mask: built in {:.2} ms, {:.1}% of the forward's blocks visited, {:.1}% of those partial", t0.elapsed().as_secs_f64() * 1e3, visited * 100.0, partial * 100.0);
        masks.push(m);
    }
    let runs = [
        ("fa3-causal", AttnOptions::default().causal(true), causal_pairs, true),
        ("fa3-rel_bias-causal", AttnOptions::default().causal(true).variant(module.variant(REL_BIAS)?.data_u32(&bias)), causal_pairs, true),
        ("fa3-prefix_lm", AttnOptions::default().variant(prefix_lm), prefix_pairs, false),
        ("fa3-prefix_lm-blockmask", AttnOptions::default().variant(prefix_lm).block_mask(&masks[0]), prefix_pairs, false),
        ("fa3-local_global-blockmask", AttnOptions::default().variant(lg).block_mask(&masks[1]), local_global_pairs, false),
        ("fa3-local_global-dense", AttnOptions::default().variant(lg), local_global_pairs, false),
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
