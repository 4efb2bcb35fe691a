//! `fa3`: run and benchmark the attention kernels from the command line, and plot the results.
// The crate root is not a mod.rs: its modules live in fa3/ by path.
#[path = "fa3/cli.rs"]
mod cli;

use clap::Parser;
use cli::{BenchArgs, Cli, Command, Fp8AccuracyArgs, InfoArgs, PassArg, PlotArgs, RunArgs, Shape, VariantArgs};
use flash_attn3::bench::{TimingPlan, fwd_flops, fwd_flops_visible, time_calls, time_forward};
use flash_attn3::check::{check, check_backward, check_sink_grads};
use flash_attn3::reference::backward::{BwdTiling, Grads as HostGrads, attention_backward_f64, attention_backward_tiled};
use flash_attn3::plot::{self, PlotError, Point};
use flash_attn3::reference::{
    AttnResult, HostAlibi, HostDocs, HostTensor, Problem, Tiling, attention_f64, attention_tiled, max_abs_err, rng, standard_alibi_slopes,
};
use flash_attn3::documents::{ids_from_lengths, packed_doc_ids};
use flash_attn3::{
    AttnError, AttnOptions, DType, DeviceTensor, DocumentMask, Gpu, backward_workspace_bytes, flash_attn_backward, flash_attn_backward_into, flash_attn_func,
    flash_attn_func_into,
};
use indicatif::{ProgressBar, ProgressStyle};
use safetensors::{Dtype as StDtype, SafeTensors, tensor::TensorView};
use cudarc::driver::{CudaSlice, CudaStream};
use std::io::Write;
use std::sync::Arc;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

fn main() -> ExitCode {
    // Usage errors exit 2 (clap prints them); failures below exit 1.
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(a) => cmd_run(a),
        Command::Bench(a) => cmd_bench(a),
        Command::Plot(a) => cmd_plot(a),
        Command::Info(a) => cmd_info(a),
        Command::Fp8Accuracy(a) => cmd_fp8_accuracy(a),
        Command::Ptx => {
            print!("{}", flash_attn3::gpu::PTX);
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Debug)]
enum CliError {
    Attn(AttnError),
    Io(String),
    Usage(String),
    Plot(PlotError),
    CheckFailed,
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CliError::Io(m) | CliError::Usage(m) => f.write_str(m),
            CliError::Attn(e) => write!(f, "{e}"),
            CliError::Plot(e) => write!(f, "plot: {e}"),
            CliError::CheckFailed => f.write_str("the result is outside the error budget"),
        }
    }
}

impl From<AttnError> for CliError {
    fn from(e: AttnError) -> Self {
        CliError::Attn(e)
    }
}

impl From<PlotError> for CliError {
    fn from(e: PlotError) -> Self {
        CliError::Plot(e)
    }
}

type CliResult<T> = Result<T, CliError>;

fn clock_seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

struct Inputs {
    q: HostTensor,
    k: HostTensor,
    v: HostTensor,
    /// dL/dO, for the backward.
    dout: Option<HostTensor>,
    dtype: DType,
}

fn load_safetensors(path: &Path, backward: bool) -> CliResult<Inputs> {
    let bytes = std::fs::read(path).map_err(|e| CliError::Io(format!("{}: {e}", path.display())))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| CliError::Io(format!("{}: {e}", path.display())))?;
    let mut dtype = None;
    let mut read = |name: &str| -> CliResult<HostTensor> {
        let t = st.tensor(name).map_err(|e| CliError::Io(format!("{}: tensor {name:?}: {e}", path.display())))?;
        let shape: [usize; 4] = t.shape().try_into().map_err(|_| {
            CliError::Io(format!("{name}: expected 4 dims [batch, seqlen, heads, hdim], got {:?}", t.shape()))
        })?;
        let (dt, data): (DType, Vec<f32>) = match t.dtype() {
            StDtype::F16 => (
                DType::F16,
                t.data().chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            ),
            StDtype::BF16 => (
                DType::BF16,
                t.data().chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            ),
            other => return Err(CliError::Io(format!("{name}: dtype {other:?} (expected F16 or BF16)"))),
        };
        match dtype {
            None => dtype = Some(dt),
            Some(d) if d != dt => {
                return Err(CliError::Io(format!("{name} is {} but q is {}", dt.name(), d.name())));
            }
            _ => {}
        }
        Ok(HostTensor::new(shape, data))
    };
    let (q, k, v) = (read("q")?, read("k")?, read("v")?);
    let dout = if backward { Some(read("do")?) } else { None };
    Ok(Inputs { q, k, v, dout, dtype: dtype.expect("q was read") })
}

/// One tensor to write: its name, shape, element type (`None`: f32) and values.
struct Named<'a>(&'static str, Vec<usize>, Option<DType>, &'a [f32]);

fn write_safetensors(path: &Path, tensors: &[Named<'_>]) -> CliResult<()> {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|Named(_, _, dtype, data)| match dtype {
            Some(DType::F16) => data.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect(),
            Some(DType::BF16) => data.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect(),
            None => data.iter().flat_map(|x| x.to_le_bytes()).collect(),
        })
        .collect();
    let io = |e: safetensors::SafeTensorError| CliError::Io(format!("{}: {e}", path.display()));
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|(Named(name, shape, dtype, _), b)| {
            let st = match dtype {
                Some(DType::F16) => StDtype::F16,
                Some(DType::BF16) => StDtype::BF16,
                None => StDtype::F32,
            };
            Ok((*name, TensorView::new(st, shape.clone(), b).map_err(io)?))
        })
        .collect::<CliResult<Vec<_>>>()?;
    safetensors::serialize_to_file(views, None, path).map_err(io)
}

fn cmd_run(a: RunArgs) -> CliResult<()> {
    let RunArgs {
        input,
        random,
        seqlen_k,
        heads_k,
        dtype,
        causal,
        scale,
        variants,
        output,
        check: do_check,
        backward,
        deterministic,
        incoherent,
        seed,
        device,
        kernel,
    } = a;
    let fp8 = dtype == Some(cli::DtypeArg::E4m3);
    if fp8 && (backward || variants.softcap.is_some() || variants.alibi || variants.window.is_some() || variants.sinks.is_some() || variants.doc_lens.is_some()) {
        return Err(CliError::Usage("--dtype e4m3 runs the FP8 forward: no --backward, --softcap, --alibi, --window, --sinks or --doc-lens".into()));
    }
    if incoherent && !fp8 {
        return Err(CliError::Usage("--incoherent applies to --dtype e4m3".into()));
    }
    let dtype: DType = dtype.map_or(DType::BF16, DType::from);
    let seed = seed.unwrap_or_else(clock_seed);
    let (algo, schedule) = (kernel.algo.algo(), kernel.schedule.into());

    let gpu = match Gpu::new(device) {
        Ok(g) => g,
        Err(e @ (AttnError::NoDriver | AttnError::NoDevice { .. } | AttnError::UnsupportedGpu { .. })) if fp8 => {
            return Err(CliError::Usage(format!("no usable GPU ({e}): the FP8 forward runs on the GPU only")));
        }
        Err(e @ (AttnError::NoDriver | AttnError::NoDevice { .. } | AttnError::UnsupportedGpu { .. })) => {
            println!("no usable GPU ({e}); computing a small case on the CPU reference instead (NOT a GPU result)");
            return cpu_demo(causal, &variants, seed, backward);
        }
        Err(e) => return Err(e.into()),
    };
    let inputs = match (input, random) {
        (Some(path), None) => {
            eprintln!("reading {}", path.display());
            load_safetensors(&path, backward)?
        }
        (None, Some(Shape([b, s, h, d]))) => {
            let (sk, hk) = (seqlen_k.unwrap_or(s), heads_k.unwrap_or(h));
            eprintln!("generating random inputs (seed {seed}): q {b}x{s}x{h}x{d}, k/v {b}x{sk}x{hk}x{d}, {}", dtype.name());
            let mut r = rng(seed);
            Inputs {
                q: HostTensor::randn([b, s, h, d], dtype, 1.0, &mut r),
                k: HostTensor::randn([b, sk, hk, d], dtype, 1.0, &mut r),
                v: HostTensor::randn([b, sk, hk, d], dtype, 1.0, &mut r),
                dout: backward.then(|| HostTensor::randn([b, s, h, d], dtype, 1.0, &mut r)),
                dtype,
            }
        }
        // clap's ArgGroup "source": exactly one of them.
        _ => unreachable!("--input and --random are one required group"),
    };
    let info = gpu.info();
    eprintln!("GPU {}: {} (sm_{}{}, {} SMs)", info.ordinal, info.name, info.major, info.minor, info.sm_count);
    if fp8 {
        return run_fp8(&gpu, &inputs, causal, scale, incoherent, seed, output.as_deref(), do_check);
    }
    let stream = gpu.new_stream()?;
    let up = |t: &HostTensor| DeviceTensor::from_f32(&stream, inputs.dtype, t.shape, &t.data);
    let (q, k, v) = (up(&inputs.q)?, up(&inputs.k)?, up(&inputs.v)?);
    let data = VariantData::upload(&variants, &stream, inputs.q.shape[2], inputs.k.shape[1])?;
    let mut opts = data.options(&variants, AttnOptions { algo, ..AttnOptions::default().causal(causal).schedule(schedule).deterministic(deterministic) });
    if let Some(s) = scale {
        opts = opts.softmax_scale(s);
    }
    let t0 = Instant::now();
    let res = flash_attn_func(&gpu, &stream, &q.as_ref(), &k.as_ref(), &v.as_ref(), &opts)?;
    stream.synchronize().map_err(AttnError::from)?;
    let elapsed = t0.elapsed();
    let o = res.out.to_f32(&stream)?;
    let lse = stream.clone_dtoh(&res.lse).map_err(AttnError::from)?;
    let [b, s, h, d] = inputs.q.shape;
    println!(
        "computed O {b}x{s}x{h}x{d} {} and LSE on the GPU in {:.2} ms (first call, includes launch)",
        inputs.dtype.name(),
        elapsed.as_secs_f64() * 1e3
    );
    let mut dsinks: Option<Vec<f32>> = None;
    let grads = match &inputs.dout {
        Some(dout) => {
            let dout = up(dout)?;
            let t0 = Instant::now();
            let g = flash_attn_backward(&gpu, &stream, &q.as_ref(), &k.as_ref(), &v.as_ref(), &res.out.as_ref(), &res.lse, &dout.as_ref(), &opts)?;
            stream.synchronize().map_err(AttnError::from)?;
            println!("computed dQ, dK, dV on the GPU in {:.2} ms (first call, includes launch)", t0.elapsed().as_secs_f64() * 1e3);
            dsinks = match &g.dsinks {
                Some(d) => Some(stream.clone_dtoh(d).map_err(AttnError::from)?),
                None => None,
            };
            Some(HostGrads { dq: g.dq.to_f32(&stream)?, dk: g.dk.to_f32(&stream)?, dv: g.dv.to_f32(&stream)? })
        }
        None => None,
    };
    if let Some(path) = &output {
        let dt = Some(inputs.dtype);
        let mut named = vec![Named("o", inputs.q.shape.to_vec(), dt, &o), Named("lse", vec![b, h, s], None, &lse)];
        if let Some(g) = &grads {
            named.push(Named("dq", inputs.q.shape.to_vec(), dt, &g.dq));
            named.push(Named("dk", inputs.k.shape.to_vec(), dt, &g.dk));
            named.push(Named("dv", inputs.v.shape.to_vec(), dt, &g.dv));
        }
        write_safetensors(path, &named)?;
        let names: Vec<&str> = named.iter().map(|n| n.0).collect();
        println!("wrote {} to {}", names.join(", "), path.display());
    }
    if do_check {
        eprintln!("checking against the CPU references (f64 exact and naive low precision)...");
        let p = data.problem(&variants, [&inputs.q, &inputs.k, &inputs.v], causal, scale.unwrap_or(1.0 / (d as f32).sqrt()));
        let fwd = AttnResult { o, lse };
        let report = check(&p, inputs.dtype, &fwd);
        println!("check: {report}");
        let mut passed = report.passed();
        if let (Some(g), Some(dout)) = (&grads, &inputs.dout) {
            let report = check_backward(&p, dout, inputs.dtype, g);
            println!("check backward: {report}");
            passed &= report.passed();
            if let Some(got) = &dsinks {
                let report = check_sink_grads(&p, dout, inputs.dtype, &fwd.o, &fwd.lse, got);
                println!("check dsinks: {report}");
                passed &= report.passed();
            }
        }
        if !passed {
            return Err(CliError::CheckFailed);
        }
    }
    Ok(())
}

/// `run --dtype e4m3`: the inputs (16-bit) quantized on the GPU with block factors (after
/// incoherent processing of Q and K when `incoherent`), the FP8 forward, O in the inputs'
/// dtype. `--check` reports the error against the f64 attention of the unquantized inputs,
/// and holds the kernel to the 2x rule against the naive FP8 implementation of the same
/// e4m3 inputs (`reference::fp8::attention_fp8_naive`).
#[allow(clippy::too_many_arguments)]
fn run_fp8(gpu: &Gpu, inputs: &Inputs, causal: bool, scale: Option<f32>, incoherent: bool, seed: u64, output: Option<&Path>, do_check: bool) -> CliResult<()> {
    use flash_attn3::fp8::{Fp8Descales, Fp8Options, QuantizeOptions, Role, flash_attn_fp8, hadamard_signs, quantize_fp8};
    use flash_attn3::reference::fp8::{Granularity, Hadamard, attention_fp8_naive, quantize, rmse};
    let stream = gpu.new_stream()?;
    let up = |t: &HostTensor| DeviceTensor::from_f32(&stream, inputs.dtype, t.shape, &t.data);
    let (q, k, v) = (up(&inputs.q)?, up(&inputs.k)?, up(&inputs.v)?);
    let [b, s, h, d] = inputs.q.shape;
    let signs = hadamard_signs(&stream, d, seed)?;
    let qopts = |role| if incoherent && role != Role::V { QuantizeOptions::new(role).hadamard(&signs) } else { QuantizeOptions::new(role) };
    let scale = scale.unwrap_or(1.0 / (d as f32).sqrt());
    let opts = Fp8Options::default().causal(causal).softmax_scale(scale).out_dtype(inputs.dtype);
    let t0 = Instant::now();
    let (q8, k8, v8) = (
        quantize_fp8(gpu, &stream, &q.as_ref(), &qopts(Role::Q))?,
        quantize_fp8(gpu, &stream, &k.as_ref(), &qopts(Role::K))?,
        quantize_fp8(gpu, &stream, &v.as_ref(), &qopts(Role::V))?,
    );
    let res = flash_attn_fp8(gpu, &stream, &q8.tensor, &k8.tensor, &v8.tensor, &Fp8Descales { q: &q8.scales, k: &k8.scales, v: &v8.scales }, &opts)?;
    stream.synchronize().map_err(AttnError::from)?;
    let elapsed = t0.elapsed();
    let o = res.out.to_f32(&stream)?;
    let lse = stream.clone_dtoh(&res.lse).map_err(AttnError::from)?;
    println!(
        "computed O {b}x{s}x{h}x{d} {} from e4m3 Q, K, V (block factors{}) and LSE on the GPU in {:.2} ms (quantization and first call, includes launches)",
        inputs.dtype.name(),
        if incoherent { ", incoherent processing" } else { "" },
        elapsed.as_secs_f64() * 1e3
    );
    if let Some(path) = output {
        let named = [Named("o", inputs.q.shape.to_vec(), Some(inputs.dtype), &o), Named("lse", vec![b, h, s], None, &lse)];
        write_safetensors(path, &named)?;
        println!("wrote o, lse to {}", path.display());
    }
    if do_check {
        eprintln!("checking against the CPU references (f64 of the unquantized inputs; f64 and naive FP8 of the e4m3 inputs)...");
        let exact = attention_f64(&Problem::plain(&inputs.q, &inputs.k, &inputs.v, causal, scale));
        let max_err = o.iter().zip(&exact.o).map(|(&g, &w)| (g as f64 - w).abs()).fold(0.0, f64::max);
        println!("error against f64 of the unquantized inputs: RMSE {:.3e}, max {max_err:.3e}", rmse(&o, &exact.o));
        // The e4m3 values the kernel saw: the CPU quantization gives the GPU's codes.
        let h_t = Hadamard::from_signs(stream.clone_dtoh(&signs).map_err(AttnError::from)?);
        let (qi, ki) = if incoherent { (h_t.apply(&inputs.q), h_t.apply(&inputs.k)) } else { (inputs.q.clone(), inputs.k.clone()) };
        let g = |role| Granularity::of_quantizer(role, d);
        let (q8h, k8h, v8h) = (quantize(&qi, g(Role::Q)).values, quantize(&ki, g(Role::K)).values, quantize(&inputs.v, g(Role::V)).values);
        let p = Problem::plain(&q8h, &k8h, &v8h, causal, scale);
        let (exact8, naive) = (attention_f64(&p), attention_fp8_naive(&p, inputs.dtype));
        let err = |got: &[f32], want: &[f64]| got.iter().zip(want).map(|(&g, &w)| (g as f64 - w).abs()).fold(0.0, f64::max);
        let (o_err, o_naive) = (err(&o, &exact8.o), err(&naive.o, &exact8.o));
        let (l_err, l_naive) = (err(&lse, &exact8.lse), err(&naive.lse, &exact8.lse));
        let passed = flash_attn3::reference::within_budget(o_err, o_naive, flash_attn3::check::O_SLACK)
            && flash_attn3::reference::within_budget(l_err, l_naive, flash_attn3::check::LSE_SLACK);
        println!(
            "check (the e4m3 inputs): max |O - O_f64| = {o_err:.3e} (naive FP8 {o_naive:.3e}); max |LSE - LSE_f64| = {l_err:.3e} (naive {l_naive:.3e}): {}",
            if passed { "PASS" } else { "FAIL" }
        );
        if !passed {
            return Err(CliError::CheckFailed);
        }
    }
    Ok(())
}

/// The variants' data of a call with `heads` query heads: ALiBi's standard slopes and the
/// sink logits on the host (for the references) and, once uploaded, on the device.
struct VariantData {
    slopes: Vec<f32>,
    sink_logits: Option<Vec<f32>>,
    /// `--doc-lens` as one document id per key token.
    doc_ids: Option<Vec<u32>>,
    dev_slopes: Option<CudaSlice<f32>>,
    dev_sinks: Option<CudaSlice<f32>>,
    dev_docs: Option<DocumentMask>,
}

impl VariantData {
    /// For calls of `heads` query heads over `seqlen_k` keys.
    fn host(v: &VariantArgs, heads: usize, seqlen_k: usize) -> CliResult<Self> {
        let sink_logits = v.sinks.as_ref().map(|s| s.per_head(heads)).transpose().map_err(CliError::Usage)?;
        // One length: documents of that many tokens (the last one shorter).
        let doc_ids = match v.doc_lens.as_ref().map(|l| l.0.as_slice()) {
            Some(&[len]) => Some(packed_doc_ids(1, seqlen_k, &[len])),
            Some(lengths) => Some(ids_from_lengths(lengths)?),
            None => None,
        };
        if let Some(ids) = &doc_ids
            && ids.len() != seqlen_k
        {
            return Err(CliError::Usage(format!("--doc-lens: the documents add up to {} tokens, the sequence has {seqlen_k}", ids.len())));
        }
        Ok(VariantData { slopes: standard_alibi_slopes(heads), sink_logits, doc_ids, dev_slopes: None, dev_sinks: None, dev_docs: None })
    }

    /// The host data, and on `stream` the slopes (with `--alibi`), the sinks and the
    /// documents.
    fn upload(v: &VariantArgs, stream: &Arc<CudaStream>, heads: usize, seqlen_k: usize) -> CliResult<Self> {
        let mut d = Self::host(v, heads, seqlen_k)?;
        if v.alibi {
            d.dev_slopes = Some(stream.clone_htod(&d.slopes).map_err(AttnError::from)?);
        }
        if let Some(s) = &d.sink_logits {
            d.dev_sinks = Some(stream.clone_htod(s).map_err(AttnError::from)?);
        }
        if let Some(ids) = &d.doc_ids {
            d.dev_docs = Some(DocumentMask::from_ids(stream, ids, None)?);
        }
        Ok(d)
    }

    /// `opts` with the variants (the device data from [`VariantData::upload`]).
    fn options<'a>(&'a self, v: &VariantArgs, opts: AttnOptions<'a>) -> AttnOptions<'a> {
        let mut opts = AttnOptions { softcap: v.softcap, window: v.window, ..opts };
        if let Some(s) = &self.dev_slopes {
            opts = opts.alibi(s, false);
        }
        if let Some(s) = &self.dev_sinks {
            opts = opts.sinks(s);
        }
        if let Some(d) = &self.dev_docs {
            opts = opts.documents(d);
        }
        opts
    }

    /// The references' problem of inputs `qkv` with the variants.
    fn problem<'a>(&'a self, v: &VariantArgs, [q, k, val]: [&'a HostTensor; 3], causal: bool, scale: f32) -> Problem<'a> {
        Problem {
            q,
            k,
            v: val,
            causal,
            scale,
            softcap: v.softcap,
            alibi: v.alibi.then_some(HostAlibi { slopes: &self.slopes, per_batch: false }),
            window: v.window,
            sinks: self.sink_logits.as_deref(),
            docs: self.doc_ids.as_deref().map(|ids| HostDocs { ids, per_batch: false }),
            variant: None,
        }
    }
}

/// A window side in a series name (`inf`: unbounded).
fn side(w: Option<usize>) -> String {
    w.map_or("inf".into(), |w| w.to_string())
}

/// The no-GPU path: the tiled FlashAttention algorithm on the CPU against the f64 reference.
fn cpu_demo(causal: bool, variants: &VariantArgs, seed: u64, backward: bool) -> CliResult<()> {
    let (b, s, h, d) = (1, 300, 2, 64);
    let mut r = rng(seed);
    let dtype = DType::BF16;
    let q = HostTensor::randn([b, s, h, d], dtype, 1.0, &mut r);
    let k = HostTensor::randn([b, s, h, d], dtype, 1.0, &mut r);
    let v = HostTensor::randn([b, s, h, d], dtype, 1.0, &mut r);
    if let Some(c) = variants.softcap.filter(|c| !(c.is_finite() && *c > 0.0)) {
        return Err(AttnError::InvalidSoftcap(c).into());
    }
    let data = VariantData::host(variants, h, s)?;
    let p = data.problem(variants, [&q, &k, &v], causal, 1.0 / (d as f32).sqrt());
    let tiled = attention_tiled(&p, Tiling { block_m: 64, block_n: 64, lazy_rescale: true }, None);
    let exact = attention_f64(&p);
    let err = max_abs_err(&tiled.o, &exact.o);
    let lse_err = max_abs_err(&tiled.lse, &exact.lse);
    println!(
        "CPU reference (no GPU): tiled online-softmax algorithm, {b}x{s}x{h}x{d} bf16 inputs, causal={causal}, \
         softcap={:?}, alibi={}, window={:?}, sinks={:?}, documents={:?}: max |O - O_f64| = {err:.2e}, max |LSE - LSE_f64| = {lse_err:.2e}",
        p.softcap,
        p.alibi.is_some(),
        p.window,
        p.sinks,
        variants.doc_lens.as_ref().map(|l| &l.0)
    );
    if err > 1e-5 || lse_err > 1e-4 {
        return Err(CliError::CheckFailed);
    }
    if backward {
        // The recompute backward's tiles on the CPU (the GPU kernel's 64 x 128), in f32.
        let dout = HostTensor::randn([b, s, h, d], dtype, 1.0, &mut r);
        let tiling = BwdTiling { block_m: 64, block_n: 128 };
        let got = attention_backward_tiled(&p, &dout, &tiled.o, &tiled.lse, tiling, None);
        let [eq, ek, ev] = got.max_abs_err(&attention_backward_f64(&p, &dout));
        println!(
            "CPU reference (no GPU): tiled recompute backward, 64 x 128 tiles: max |dQ - exact| = {eq:.2e}, \
             max |dK - exact| = {ek:.2e}, max |dV - exact| = {ev:.2e}"
        );
        if eq.max(ek).max(ev) > 1e-4 {
            return Err(CliError::CheckFailed);
        }
    }
    Ok(())
}

fn cmd_fp8_accuracy(a: Fp8AccuracyArgs) -> CliResult<()> {
    use flash_attn3::reference::fp8::{Hadamard, fp8_accuracy, outlier_tensor, rmse};
    // The kernel's scale blocks where it has one, so that both sets of columns match.
    let kernel_tile = |f: fn(u32) -> u32| if flash_attn3::fp8::HEAD_DIMS.contains(&(a.hdim as u32)) { f(a.hdim as u32) as usize } else { 128 };
    let block_m = a.block_m.unwrap_or_else(|| kernel_tile(common::fp8::block_m));
    let block_n = a.block_n.unwrap_or_else(|| kernel_tile(common::fp8::block_n));
    if !a.hdim.is_power_of_two() || a.heads == 0 || block_m == 0 || block_n == 0 {
        return Err(CliError::Usage("--hdim must be a power of two; --heads, --block-m, --block-n positive".into()));
    }
    let gpu = Gpu::new(a.device).map_err(|e| eprintln!("GPU columns skipped: {e}")).ok();
    println!("CPU emulation: blocks of {block_m} query rows and {block_n} keys; the FP8 kernel: its own tiles (bf16 inputs)");
    println!("| seqlen | seed | fp16 naive (CPU) | fp16 kernel (GPU) | FP8 per tensor | FP8 blocks | FP8 blocks + incoherent | per tensor / incoherent | FP8 kernel: per tensor | blocks | blocks + incoherent | per tensor / incoherent |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (&s, &seed) in a.seqlens.0.iter().flat_map(|s| a.seeds.iter().map(move |seed| (s, seed))) {
        let mut r = rng(seed);
        let shape = [1, s, a.heads, a.hdim];
        let (q, k, v) = (outlier_tensor(shape, 1e-3, 10.0, &mut r), outlier_tensor(shape, 1e-3, 10.0, &mut r), outlier_tensor(shape, 1e-3, 10.0, &mut r));
        let scale = 1.0 / (a.hdim as f32).sqrt();
        let exact = attention_f64(&Problem::plain(&q, &k, &v, false, scale)).o;
        // The fp16 rows see the inputs rounded to fp16, as a caller's fp16 tensors would be.
        let r16 = |t: &HostTensor| HostTensor::new(t.shape, t.data.iter().map(|&x| flash_attn3::round_to(DType::F16, x)).collect());
        let (q16, k16, v16) = (r16(&q), r16(&k), r16(&v));
        let naive = if a.kernel_only {
            "-".to_string()
        } else {
            format!("{:.2e}", rmse(&flash_attn3::reference::attention_lowp(&Problem::plain(&q16, &k16, &v16, false, scale), DType::F16).o, &exact))
        };
        let kernel = match &gpu {
            Some(g) => {
                let stream = g.new_stream()?;
                let dev = |t: &HostTensor| DeviceTensor::from_f32(&stream, DType::F16, t.shape, &t.data);
                let (dq, dk, dv) = (dev(&q16)?, dev(&k16)?, dev(&v16)?);
                let out = flash_attn_func(g, &stream, &dq.as_ref(), &dk.as_ref(), &dv.as_ref(), &AttnOptions::default())?;
                format!("{:.2e}", rmse(&out.out.to_f32(&stream)?, &exact))
            }
            None => "-".into(),
        };
        // Four empty columns: the emulation's or the kernel's.
        const NONE4: &str = "- | - | - | -";
        let emulated = if a.kernel_only {
            NONE4.to_string()
        } else {
            let acc = fp8_accuracy(&q, &k, &v, &exact, block_m, block_n, &Hadamard::from_seed(a.hdim, seed));
            format!("{:.2e} | {:.2e} | {:.2e} | {:.2}", acc.per_tensor, acc.blocks, acc.blocks_incoherent, acc.per_tensor / acc.blocks_incoherent)
        };
        let fp8_kernel = match &gpu {
            Some(g) if flash_attn3::fp8::HEAD_DIMS.contains(&(a.hdim as u32)) => {
                let [b, c, d] = fp8_kernel_rmse(g, [&q, &k, &v], &exact, seed)?;
                format!("{b:.2e} | {c:.2e} | {d:.2e} | {:.2}", b / d)
            }
            _ => NONE4.into(),
        };
        println!("| {s} | {seed} | {naive} | {kernel} | {emulated} | {fp8_kernel} |");
    }
    Ok(())
}

/// The accuracy experiment's three FP8 configurations on the GPU (RMSE of O against
/// `exact`): Q, K, V rounded to bf16 (a caller's tensors), then (b) one factor per tensor
/// (quantized on the host, given as per-head factors of one value), (c) block factors
/// from the quantization kernel, (d) the same after incoherent processing of Q and K.
fn fp8_kernel_rmse(gpu: &Gpu, [q, k, v]: [&HostTensor; 3], exact: &[f64], seed: u64) -> CliResult<[f64; 3]> {
    use flash_attn3::fp8::{
        Descale, DescaleKind, Fp8Descales, Fp8Layout, Fp8Options, Fp8Tensor, QuantizeOptions, Role, flash_attn_fp8, hadamard_signs, quantize_fp8,
        transpose_v_codes,
    };
    use flash_attn3::reference::fp8::{Granularity, e4m3_code, quantize, rmse};
    let stream = gpu.new_stream()?;
    let bf = |t: &HostTensor| HostTensor::new(t.shape, t.data.iter().map(|&x| flash_attn3::round_to(DType::BF16, x)).collect());
    let (q, k, v) = (bf(q), bf(k), bf(v));
    let [b, _, _, d] = q.shape;
    let hk = k.shape[2];
    let opts = Fp8Options::default();
    let run = |qt: &Fp8Tensor, kt: &Fp8Tensor, vt: &Fp8Tensor, s: Fp8Descales| -> CliResult<f64> {
        let out = flash_attn_fp8(gpu, &stream, qt, kt, vt, &s, &opts)?;
        Ok(rmse(&out.out.to_f32(&stream)?, exact))
    };
    // (b) One factor per tensor.
    let codes = |t: &HostTensor| {
        let qz = quantize(t, Granularity::PerTensor);
        (qz.values.data.iter().map(|&x| e4m3_code(x / qz.scales[0])).collect::<Vec<u8>>(), qz.scales[0])
    };
    let ((qc, qs), (kc, ks), (vc, vs)) = (codes(&q), codes(&k), codes(&v));
    let per_head = |arg, x: f32| Descale::from_host(&stream, arg, &vec![x; b * hk], DescaleKind::PerHead);
    let (dq, dk, dv) = (per_head(flash_attn3::Arg::QDescale, qs)?, per_head(flash_attn3::Arg::KDescale, ks)?, per_head(flash_attn3::Arg::VDescale, vs)?);
    let per_tensor = run(
        &Fp8Tensor::from_codes(&stream, flash_attn3::Arg::Q, &qc, q.shape, Fp8Layout::Bshd)?,
        &Fp8Tensor::from_codes(&stream, flash_attn3::Arg::K, &kc, k.shape, Fp8Layout::Bshd)?,
        &Fp8Tensor::from_codes(&stream, flash_attn3::Arg::V, &transpose_v_codes(&vc, v.shape)?, v.shape, Fp8Layout::VTransposed)?,
        Fp8Descales { q: &dq, k: &dk, v: &dv },
    )?;
    // (c), (d) Block factors from the quantization kernel, without and with the transform.
    let dev = |t: &HostTensor| DeviceTensor::from_f32(&stream, DType::BF16, t.shape, &t.data);
    let (qd, kd, vd) = (dev(&q)?, dev(&k)?, dev(&v)?);
    let signs = hadamard_signs(&stream, d, seed)?;
    let mut blocks = [0.0; 2];
    for (i, incoherent) in [false, true].into_iter().enumerate() {
        let o = |role| if incoherent && role != Role::V { QuantizeOptions::new(role).hadamard(&signs) } else { QuantizeOptions::new(role) };
        let q8 = quantize_fp8(gpu, &stream, &qd.as_ref(), &o(Role::Q))?;
        let k8 = quantize_fp8(gpu, &stream, &kd.as_ref(), &o(Role::K))?;
        let v8 = quantize_fp8(gpu, &stream, &vd.as_ref(), &o(Role::V))?;
        blocks[i] = run(&q8.tensor, &k8.tensor, &v8.tensor, Fp8Descales { q: &q8.scales, k: &k8.scales, v: &v8.scales })?;
    }
    Ok([per_tensor, blocks[0], blocks[1]])
}

fn cmd_info(InfoArgs { device }: InfoArgs) -> CliResult<()> {
    println!("kernels: {}", common::KERNELS.iter().map(|k| k.name).collect::<Vec<_>>().join(", "));
    let gpu = Gpu::new(device)?;
    let i = gpu.info();
    println!(
        "GPU {}: {} (sm_{}{}), {} SMs, {} KiB shared memory per block, driver {}.{}",
        i.ordinal,
        i.name,
        i.major,
        i.minor,
        i.sm_count,
        i.max_smem_per_block / 1024,
        i.driver_version / 1000,
        i.driver_version % 1000 / 10
    );
    for k in common::KERNELS.iter().filter(|k| k.cluster > 1) {
        println!("{}: clusters of {}, at most {:?} CTAs at once", k.name, k.cluster, gpu.resident_ctas(k));
    }
    Ok(())
}

fn cmd_bench(a: BenchArgs) -> CliResult<()> {
    if a.dtype == cli::DtypeArg::E4m3 {
        return cmd_bench_fp8(&a);
    }
    let dtype = DType::from(a.dtype);
    let (hdims, seqlens, causal_modes) = (&a.hdims.0, &a.seqlens.0, a.causal.modes());
    let (algo, algo_name, schedule) = (a.kernel.algo.algo(), a.kernel.algo.name(), a.kernel.schedule.into());
    let iters = a.iters.max(1);
    // Before the GPU run: a bad plot name or peers' file fails now, not after it.
    let peers = match &a.plot {
        Some(path) => {
            plot::Format::from_path(path)?;
            read_csvs(&a.peers_csv)?
        }
        None => Vec::new(),
    };

    let gpu = Gpu::new(a.device)?;
    if a.untracked {
        // cudarc's event tracking off: measures what its per-buffer waits and records
        // cost each call (docs/perf-history.md item 66).
        // SAFETY: every buffer below is created and used on `stream` only.
        unsafe { gpu.context().disable_event_tracking() };
    }
    let stream = gpu.new_stream()?;
    let info = gpu.info();
    println!("# {} (sm_{}{}, {} SMs), {}, {}", info.name, info.major, info.minor, info.sm_count, dtype.name(), algo_name);
    let mut rows = vec!["impl,dtype,hdim,seqlen,batch,heads,causal,ms,tflops".to_string()];
    let mut points = Vec::new();
    println!(
        "{:>5} {:>6} {:>5} {:>5} {:>6} {:>9} {:>8} {:>8}",
        "hdim", "seqlen", "batch", "heads", "causal", "ms", "TFLOP/s", "host_us"
    );
    const TOKENS: usize = 16384;
    const HIDDEN: usize = 2048;
    let mut r = rng(clock_seed());
    // Every config has TOKENS x HIDDEN elements per tensor: one random buffer per tensor.
    let data: Vec<Vec<f32>> =
        (0..3).map(|_| HostTensor::randn([1, TOKENS, 1, HIDDEN], dtype, 1.0, &mut r).data).collect();
    let tensors: Vec<DeviceTensor> = data
        .iter()
        .map(|d| DeviceTensor::from_f32(&stream, dtype, [1, TOKENS, 1, HIDDEN], d))
        .collect::<Result<_, _>>()?;
    let mut out = DeviceTensor::alloc(&stream, dtype, [1, TOKENS, 1, HIDDEN])?;
    let mut lse = stream.alloc_zeros::<f32>(TOKENS * HIDDEN / 64).map_err(AttnError::from)?;
    // The backward's dO, gradients and workspace, allocated once (no allocation in the
    // timed calls).
    let backward = a.pass != PassArg::Fwd;
    let mut dout_and_grads = Vec::new();
    let mut workspace = None;
    if backward {
        let dout = HostTensor::randn([1, TOKENS, 1, HIDDEN], dtype, 1.0, &mut r).data;
        dout_and_grads.push(DeviceTensor::from_f32(&stream, dtype, [1, TOKENS, 1, HIDDEN], &dout)?);
        for _ in 0..3 {
            dout_and_grads.push(DeviceTensor::alloc(&stream, dtype, [1, TOKENS, 1, HIDDEN])?);
        }
        let bytes = hdims
            .iter()
            .flat_map(|&d| seqlens.iter().map(move |&s| backward_workspace_bytes(TOKENS / s, s, HIDDEN / d, d)))
            .max()
            .unwrap_or(0);
        // SAFETY: the backward writes every workspace byte it reads.
        workspace = Some(unsafe { stream.alloc::<u8>(bytes.max(1)) }.map_err(AttnError::from)?);
    }
    let (suffix, flops_factor) = a.pass.series_suffix_and_flops();
    // Variants are series of their own: "rust-fa3-softcap-bwd".
    let suffix = match (a.variants.softcap.is_some(), a.variants.alibi) {
        (true, true) => format!("-softcap-alibi{suffix}"),
        (true, false) => format!("-softcap{suffix}"),
        (false, true) => format!("-alibi{suffix}"),
        _ => suffix.to_string(),
    };
    let suffix = match a.variants.window {
        Some(w) => format!("-window{}-{}{suffix}", side(w.left), side(w.right)),
        None => suffix,
    };
    let suffix = if a.variants.sinks.is_some() { format!("-sinks{suffix}") } else { suffix };
    let suffix = match &a.variants.doc_lens {
        Some(l) => format!("-docs{}{suffix}", l.0.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("_")),
        None => suffix,
    };
    // On stderr, and only where it is a terminal: logs and stdout stay clean.
    let total = hdims.len() * seqlens.len() * causal_modes.len();
    let progress = ProgressBar::new(total as u64).with_style(progress_style());
    if !progress.is_hidden() {
        // Elapsed time and spinner move during a config's seconds of warm-up and timing.
        progress.enable_steady_tick(std::time::Duration::from_millis(250));
    }
    for &hdim in hdims {
        for &seqlen in seqlens {
            let (batch, heads) = (TOKENS / seqlen, HIDDEN / hdim);
            let shape = [batch, seqlen, heads, hdim];
            for &causal in causal_modes {
                progress.set_message(format!(
                    "hdim {hdim} seqlen {seqlen} {}",
                    if causal { "causal" } else { "non-causal" }
                ));
                let (q, k, v) = (tensors[0].view(shape), tensors[1].view(shape), tensors[2].view(shape));
                let data = VariantData::upload(&a.variants, &stream, heads, seqlen)?;
                let opts = data.options(
                    &a.variants,
                    AttnOptions { algo, ..AttnOptions::default().causal(causal).schedule(schedule).deterministic(a.deterministic) },
                );
                // Idle time before each config: with `--warmup-ms 0`, a short burst at the
                // clock of a cool card, as the anchors and the FA3 paper time (docs/perf.md).
                std::thread::sleep(std::time::Duration::from_millis(a.cooldown_ms));
                // Sustained load before each timing (see `time_calls`).
                let timing = TimingPlan { warmup: a.warmup, warmup_ms: a.warmup_ms, iters, timing_ms: a.timing_ms };
                let t = if backward {
                    // O and the LSE of this config for the backward to start from.
                    flash_attn_func_into(&gpu, &stream, &q, &k, &v, &mut out.view_mut(shape), &mut lse, &opts)?;
                    let [dout, dq, dk, dv] = &mut dout_and_grads[..] else { unreachable!("four buffers") };
                    let dout = dout.view(shape);
                    let (mut dq, mut dk, mut dv) = (dq.view_mut(shape), dk.view_mut(shape), dv.view_mut(shape));
                    let ws = workspace.as_mut().expect("allocated for the backward");
                    let both = a.pass == PassArg::Fwdbwd;
                    time_calls(&gpu, &stream, timing, || {
                        if both {
                            flash_attn_func_into(&gpu, &stream, &q, &k, &v, &mut out.view_mut(shape), &mut lse, &opts)?;
                        }
                        let o = out.view(shape);
                        flash_attn_backward_into(&gpu, &stream, &q, &k, &v, &o, &lse, &dout, &mut dq, &mut dk, &mut dv, None, Some(&mut *ws), &opts)
                    })?
                } else {
                    let mut o = out.view_mut(shape);
                    time_forward(&gpu, &stream, &q, &k, &v, &mut o, &mut lse, &opts, a.warmup, a.warmup_ms, iters, a.timing_ms)?
                };
                let flops = match (a.variants.window, &data.doc_ids) {
                    (None, None) => fwd_flops(batch, heads, seqlen, seqlen, hdim, causal),
                    (w, ids) => fwd_flops_visible(batch, heads, seqlen, seqlen, hdim, causal, w, ids.as_deref()),
                };
                let tflops = flops_factor * flops / (t.median_ms * 1e-3) / 1e12;
                progress.suspend(|| {
                    println!(
                        "{hdim:>5} {seqlen:>6} {batch:>5} {heads:>5} {:>6} {:>9.4} {tflops:>8.1} {:>8.1}",
                        causal as u8,
                        t.median_ms,
                        t.host_us
                    );
                    std::io::stdout().flush().ok();
                });
                progress.inc(1);
                let series = format!("rust-{algo_name}{suffix}");
                rows.push(format!(
                    "{series},{},{hdim},{seqlen},{batch},{heads},{},{:.4},{tflops:.1}",
                    dtype.name(),
                    causal as u8,
                    t.median_ms
                ));
                // As the CSV has it, so that `fa3 plot` on the CSV draws the same figure.
                points.push(Point { series, hdim, seqlen, causal, tflops: (tflops * 10.0).round() / 10.0 });
            }
        }
    }
    progress.finish_and_clear();
    if let Some(path) = &a.csv {
        write_csv(path, &rows)?;
    }
    if let Some(path) = &a.plot {
        let title = a.title.clone().unwrap_or_else(|| format!("{}, {}, {}: forward TFLOP/s", info.name, dtype.name(), algo_name));
        plot::draw(&points, &peers, &title, path)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// `bench --dtype e4m3`: the FP8 forward on e4m3 Q, K, V (quantized once per shape from
/// N(0, 1) bf16 data, not timed), O in bf16, over the FA3 grid (16k tokens, hidden 2048),
/// in the forward's CSV format: series `rust-fa3-fp8` with the block factors, and
/// `rust-fa3-fp8-headscale` with one factor per (batch, head) (FlashAttention-3's);
/// `--fp8-v` adds V as stored (`-vrows`: the kernel transposes it; `-vpass`: a transpose
/// pass before each call, timed with it).
fn cmd_bench_fp8(a: &BenchArgs) -> CliResult<()> {
    use flash_attn3::fp8::{
        Descale, DescaleKind, Fp8Descales, Fp8Options, QuantizeOptions, Role, flash_attn_fp8_into, quantize_fp8, transpose_v_fp8,
    };
    let gpu = Gpu::new(a.device)?;
    let stream = gpu.new_stream()?;
    let info = gpu.info();
    println!("# {} (sm_{}{}, {} SMs), e4m3 (O bf16), fa3-fp8", info.name, info.major, info.minor, info.sm_count);
    println!("{:>5} {:>6} {:>5} {:>5} {:>6} {:>9} {:>8} {:>8}", "hdim", "seqlen", "batch", "heads", "causal", "ms", "TFLOP/s", "host_us");
    let mut rows = vec!["impl,dtype,hdim,seqlen,batch,heads,causal,ms,tflops".to_string()];
    const TOKENS: usize = 16384;
    const HIDDEN: usize = 2048;
    let mut r = rng(clock_seed());
    let tensors: Vec<DeviceTensor> = (0..3)
        .map(|_| DeviceTensor::from_f32(&stream, DType::BF16, [1, TOKENS, 1, HIDDEN], &HostTensor::randn([1, TOKENS, 1, HIDDEN], DType::BF16, 1.0, &mut r).data))
        .collect::<Result<_, _>>()?;
    let mut out = DeviceTensor::alloc(&stream, DType::BF16, [1, TOKENS, 1, HIDDEN])?;
    let mut lse = stream.alloc_zeros::<f32>(TOKENS * HIDDEN / 64).map_err(AttnError::from)?;
    for &hdim in &a.hdims.0 {
        if !flash_attn3::fp8::HEAD_DIMS.contains(&(hdim as u32)) {
            println!("{hdim:>5} (no FP8 kernel at this head dim)");
            continue;
        }
        for &seqlen in &a.seqlens.0 {
            let (batch, heads) = (TOKENS / seqlen, HIDDEN / hdim);
            let shape = [batch, seqlen, heads, hdim];
            let quant = |i: usize, role| quantize_fp8(&gpu, &stream, &tensors[i].view(shape), &QuantizeOptions::new(role));
            let (q, k) = (quant(0, Role::Q)?, quant(1, Role::K)?);
            let ones = Descale::from_host(&stream, flash_attn3::Arg::QDescale, &vec![1.0; batch * heads], DescaleKind::PerHead)?;
            for &layout in a.fp8_v.layouts() {
                // V quantized transposed, or as stored (K's layout and key blocks).
                let v = quant(2, if layout == cli::Fp8VArg::Transposed { Role::V } else { Role::VRows })?;
                // Block factors (the quantization kernel's), and one factor per (batch,
                // head) as FlashAttention-3's descales (the speed does not depend on their
                // values).
                let block = Fp8Descales { q: &q.scales, k: &k.scales, v: &v.scales };
                let per_head = Fp8Descales { q: &ones, k: &ones, v: &ones };
                for (name, scales) in [("rust-fa3-fp8", block), ("rust-fa3-fp8-headscale", per_head)] {
                    let series = format!("{name}{}", layout.suffix());
                    for &causal in a.causal.modes() {
                        let opts = Fp8Options::default().causal(causal);
                        std::thread::sleep(std::time::Duration::from_millis(a.cooldown_ms));
                        let timing = TimingPlan { warmup: a.warmup, warmup_ms: a.warmup_ms, iters: a.iters.max(1), timing_ms: a.timing_ms };
                        let mut o = out.view_mut(shape);
                        let t = time_calls(&gpu, &stream, timing, || {
                            let vt = if layout == cli::Fp8VArg::Pass { Some(transpose_v_fp8(&gpu, &stream, &v.tensor)?) } else { None };
                            flash_attn_fp8_into(&gpu, &stream, &q.tensor, &k.tensor, vt.as_ref().unwrap_or(&v.tensor), &scales, &mut o, &mut lse, &opts)
                        })?;
                        let tflops = fwd_flops(batch, heads, seqlen, seqlen, hdim, causal) / (t.median_ms * 1e-3) / 1e12;
                        println!("{hdim:>5} {seqlen:>6} {batch:>5} {heads:>5} {:>6} {:>9.4} {tflops:>8.1} {:>8.1} {series}", causal as u8, t.median_ms, t.host_us);
                        rows.push(format!("{series},e4m3,{hdim},{seqlen},{batch},{heads},{},{:.4},{tflops:.1}", causal as u8, t.median_ms));
                    }
                }
            }
        }
    }
    if let Some(path) = &a.csv {
        write_csv(path, &rows)?;
    }
    Ok(())
}

/// Writes `bench`'s CSV rows (header first).
fn write_csv(path: &Path, rows: &[String]) -> CliResult<()> {
    std::fs::write(path, rows.join("\n") + "\n").map_err(|e| CliError::Io(format!("{}: {e}", path.display())))?;
    println!("wrote {}", path.display());
    Ok(())
}

fn progress_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} configs, {eta} left: {msg}")
        .expect("a valid template")
}

fn read_csvs(paths: &[PathBuf]) -> CliResult<Vec<Point>> {
    let mut points = Vec::new();
    for p in paths {
        points.extend(plot::read_csv(p)?);
    }
    Ok(points)
}

fn cmd_plot(a: PlotArgs) -> CliResult<()> {
    plot::Format::from_path(&a.output)?;
    let ours = read_csvs(&a.csv)?;
    let peers = read_csvs(&a.peers_csv)?;
    plot::draw(&ours, &peers, &a.title, &a.output)?;
    println!("wrote {}", a.output.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_progress_template_is_valid() {
        let _ = super::progress_style();
    }
}
