//! `fa3`: run and benchmark the attention kernels from the command line.
use flash_attn3::bench::{fwd_flops, time_forward};
use flash_attn3::check::check;
use flash_attn3::reference::{AttnResult, HostTensor, Problem, Tiling, attention_f64, attention_tiled, max_abs_err, rng};
use flash_attn3::{Algo, AttnError, AttnOptions, DType, DeviceTensor, Gpu, Schedule, flash_attn_func};
use safetensors::{Dtype as StDtype, SafeTensors, tensor::TensorView};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

const USAGE: &str = "\
fa3: FlashAttention for Hopper, kernels in Rust

USAGE:
  fa3 run   [--input FILE | --random BxSxHxD] [options]
            Computes O and LSE on the GPU. Input: a safetensors file with q, k, v
            ([batch, seqlen, heads, hdim], f16/bf16), or random normal inputs.
      --seqlen-k N     (with --random) key/value length, default = seqlen
      --heads-k N      (with --random) K/V heads (GQA), default = heads
      --dtype f16|bf16 (with --random) default bf16
      --causal         bottom-right aligned causal mask
      --scale X        softmax scale, default 1/sqrt(hdim)
      --output FILE    write o and lse to a safetensors file
      --check          compare with the CPU references (f64 exact, naive low precision)
      --seed N         random seed (default: from the clock)
      --device N       GPU ordinal (default 0)
      --algo NAME      fa3 (default: FA3 with the head dim's default techniques,
                       all of them), fa2, or an FA3 variant: fa3-full (every technique),
                       fa3-nopingpong, fa3-nooverlap, fa3-nows
                       (the last two hdim 128 f16 only)
      --schedule S     FA3 grid: auto (default), persistent, dynamic, multicast
                       (2-CTA clusters, hdim 128, non-causal), tile
  fa3 bench [--dtype f16|bf16] [--hdims 64,128,256] [--seqlens 512,...,16384]
            [--causal off|on|both] [--warmup N] [--iters N] [--warmup-ms MS (per config, 1000)] [--timing-ms MS (300)] [--cooldown-ms MS (0)] [--untracked] [--csv FILE] [--device N]
            [--algo NAME] [--schedule auto|persistent|dynamic|multicast|tile]
            Times the forward pass over the FlashAttention-3 paper's grid
            (batch = 16384 / seqlen, heads = 2048 / hdim).
  fa3 info  GPU, driver and kernels.
  fa3 ptx   Prints the embedded PTX module (for ptxas / cuobjdump).
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("run") => cmd_run(&args[1..]),
        Some("bench") => cmd_bench(&args[1..]),
        Some("info") => cmd_info(&args[1..]),
        Some("ptx") => {
            print!("{}", flash_attn3::gpu::PTX);
            Ok(())
        }
        Some("-h" | "--help" | "help") => {
            print!("{USAGE}");
            Ok(())
        }
        _ => Err(CliError::Usage("expected a command: run, bench or info".into())),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError::Usage(m)) => {
            eprintln!("error: {m}\n\n{USAGE}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Debug)]
enum CliError {
    Usage(String),
    Attn(AttnError),
    Io(String),
    CheckFailed,
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CliError::Usage(m) | CliError::Io(m) => f.write_str(m),
            CliError::Attn(e) => write!(f, "{e}"),
            CliError::CheckFailed => f.write_str("the result is outside the error budget"),
        }
    }
}

impl From<AttnError> for CliError {
    fn from(e: AttnError) -> Self {
        CliError::Attn(e)
    }
}

type CliResult<T> = Result<T, CliError>;

/// Minimal `--flag [value]` parser: takes what it recognises, `finish` rejects the rest.
struct Args {
    rest: Vec<String>,
}

impl Args {
    fn new(args: &[String]) -> Self {
        Args { rest: args.to_vec() }
    }

    fn flag(&mut self, name: &str) -> bool {
        let found = self.rest.iter().position(|a| a == name);
        found.map(|i| self.rest.remove(i)).is_some()
    }

    fn value(&mut self, name: &str) -> CliResult<Option<String>> {
        let Some(i) = self.rest.iter().position(|a| a == name) else { return Ok(None) };
        if i + 1 >= self.rest.len() {
            return Err(CliError::Usage(format!("{name} needs a value")));
        }
        let val = self.rest.remove(i + 1);
        self.rest.remove(i);
        Ok(Some(val))
    }

    fn parsed<T: std::str::FromStr>(&mut self, name: &str) -> CliResult<Option<T>> {
        self.value(name)?
            .map(|s| s.parse().map_err(|_| CliError::Usage(format!("{name}: cannot parse {s:?}"))))
            .transpose()
    }

    fn finish(self) -> CliResult<()> {
        match self.rest.first() {
            Some(a) => Err(CliError::Usage(format!("unexpected argument {a:?}"))),
            None => Ok(()),
        }
    }
}

fn parse_dtype(s: &str) -> CliResult<DType> {
    match s {
        "f16" | "fp16" | "float16" => Ok(DType::F16),
        "bf16" | "bfloat16" => Ok(DType::BF16),
        _ => Err(CliError::Usage(format!("unknown dtype {s:?} (f16 or bf16)"))),
    }
}

/// `None`: the planner's default (FA3 with the head dim's default techniques).
fn parse_algo(s: Option<&str>) -> CliResult<Option<Algo>> {
    use flash_attn3::Techniques;
    Ok(match s {
        None | Some("fa3") => None,
        Some("fa3-full") => Some(Algo::Fa3(Techniques::FULL)),
        Some("fa3-nopingpong") => Some(Algo::Fa3(Techniques::NO_PINGPONG)),
        Some("fa3-nooverlap") => Some(Algo::Fa3(Techniques::NO_OVERLAP)),
        Some("fa3-nows") => Some(Algo::Fa3(Techniques::NO_WARP_SPECIALIZATION)),
        Some("fa2") => Some(Algo::Fa2),
        Some(x) => {
            return Err(CliError::Usage(format!(
                "--algo {x:?}: expected fa3, fa2, fa3-full, fa3-nopingpong, fa3-nooverlap or fa3-nows"
            )));
        }
    })
}

fn parse_schedule(s: Option<&str>) -> CliResult<Schedule> {
    Ok(match s {
        None | Some("auto") => Schedule::Auto,
        Some("persistent") => Schedule::Persistent,
        Some("dynamic") => Schedule::PersistentDynamic,
        Some("multicast") => Schedule::PersistentMulticast,
        Some("tile") => Schedule::TilePerCta,
        Some(x) => return Err(CliError::Usage(format!("--schedule {x:?}: expected auto, persistent, dynamic, multicast or tile"))),
    })
}

/// Short name of a kernel family (CSV `impl` column).
fn algo_name(a: Option<Algo>) -> &'static str {
    use flash_attn3::Techniques;
    let Some(a) = a else { return "fa3" };
    match a {
        Algo::Fa2 => "fa2",
        Algo::Fa3(t) if t == Techniques::FULL => "fa3-full",
        Algo::Fa3(t) if t == Techniques::NO_PINGPONG => "fa3-nopingpong",
        Algo::Fa3(t) if t == Techniques::NO_OVERLAP => "fa3-nooverlap",
        Algo::Fa3(_) => "fa3-nows",
    }
}

fn parse_list(s: &str) -> CliResult<Vec<usize>> {
    s.split(',').map(|x| x.trim().parse().map_err(|_| CliError::Usage(format!("bad number {x:?} in {s:?}")))).collect()
}

fn parse_shape(s: &str) -> CliResult<[usize; 4]> {
    let v: Vec<usize> = s
        .split('x')
        .map(|x| x.parse().map_err(|_| CliError::Usage(format!("bad shape {s:?}: expected BxSxHxD"))))
        .collect::<CliResult<_>>()?;
    v.try_into().map_err(|_| CliError::Usage(format!("bad shape {s:?}: expected BxSxHxD")))
}

fn clock_seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

struct Inputs {
    q: HostTensor,
    k: HostTensor,
    v: HostTensor,
    dtype: DType,
}

fn load_safetensors(path: &PathBuf) -> CliResult<Inputs> {
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
    Ok(Inputs { q, k, v, dtype: dtype.expect("q was read") })
}

fn write_safetensors(path: &PathBuf, dtype: DType, shape: [usize; 4], o: &[f32], lse: &[f32], lse_shape: [usize; 3]) -> CliResult<()> {
    let o_bytes: Vec<u8> = match dtype {
        DType::F16 => o.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect(),
        DType::BF16 => o.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect(),
    };
    let lse_bytes: Vec<u8> = lse.iter().flat_map(|x| x.to_le_bytes()).collect();
    let st_dtype = match dtype {
        DType::F16 => StDtype::F16,
        DType::BF16 => StDtype::BF16,
    };
    let io = |e: safetensors::SafeTensorError| CliError::Io(format!("{}: {e}", path.display()));
    let tensors = vec![
        ("o", TensorView::new(st_dtype, shape.to_vec(), &o_bytes).map_err(io)?),
        ("lse", TensorView::new(StDtype::F32, lse_shape.to_vec(), &lse_bytes).map_err(io)?),
    ];
    safetensors::serialize_to_file(tensors, None, path).map_err(io)
}

fn cmd_run(args: &[String]) -> CliResult<()> {
    let mut a = Args::new(args);
    let input: Option<PathBuf> = a.value("--input")?.map(PathBuf::from);
    let random = a.value("--random")?.map(|s| parse_shape(&s)).transpose()?;
    let seqlen_k: Option<usize> = a.parsed("--seqlen-k")?;
    let heads_k: Option<usize> = a.parsed("--heads-k")?;
    let dtype = a.value("--dtype")?.map(|s| parse_dtype(&s)).transpose()?.unwrap_or(DType::BF16);
    let causal = a.flag("--causal");
    let scale: Option<f32> = a.parsed("--scale")?;
    let schedule = parse_schedule(a.value("--schedule")?.as_deref())?;
    let output: Option<PathBuf> = a.value("--output")?.map(PathBuf::from);
    let do_check = a.flag("--check");
    let seed: u64 = a.parsed("--seed")?.unwrap_or_else(clock_seed);
    let device: usize = a.parsed("--device")?.unwrap_or(0);
    let algo = parse_algo(a.value("--algo")?.as_deref())?;
    a.finish()?;

    let gpu = match Gpu::new(device) {
        Ok(g) => g,
        Err(e @ (AttnError::NoDriver | AttnError::NoDevice { .. } | AttnError::UnsupportedGpu { .. })) => {
            println!("no usable GPU ({e}); computing a small case on the CPU reference instead (NOT a GPU result)");
            return cpu_demo(causal, seed);
        }
        Err(e) => return Err(e.into()),
    };
    let inputs = match (input, random) {
        (Some(path), None) => {
            eprintln!("reading {}", path.display());
            load_safetensors(&path)?
        }
        (None, Some([b, s, h, d])) => {
            let (sk, hk) = (seqlen_k.unwrap_or(s), heads_k.unwrap_or(h));
            eprintln!("generating random inputs (seed {seed}): q {b}x{s}x{h}x{d}, k/v {b}x{sk}x{hk}x{d}, {}", dtype.name());
            let mut r = rng(seed);
            Inputs {
                q: HostTensor::randn([b, s, h, d], dtype, 1.0, &mut r),
                k: HostTensor::randn([b, sk, hk, d], dtype, 1.0, &mut r),
                v: HostTensor::randn([b, sk, hk, d], dtype, 1.0, &mut r),
                dtype,
            }
        }
        _ => return Err(CliError::Usage("give exactly one of --input FILE or --random BxSxHxD".into())),
    };
    let info = gpu.info();
    eprintln!("GPU {}: {} (sm_{}{}, {} SMs)", info.ordinal, info.name, info.major, info.minor, info.sm_count);
    let stream = gpu.new_stream()?;
    let up = |t: &HostTensor| DeviceTensor::from_f32(&stream, inputs.dtype, t.shape, &t.data);
    let (q, k, v) = (up(&inputs.q)?, up(&inputs.k)?, up(&inputs.v)?);
    let mut opts = AttnOptions { algo, ..AttnOptions::default().causal(causal).schedule(schedule) };
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
    if let Some(path) = &output {
        write_safetensors(path, inputs.dtype, inputs.q.shape, &o, &lse, [b, h, s])?;
        println!("wrote o and lse to {}", path.display());
    }
    if do_check {
        eprintln!("checking against the CPU references (f64 exact and naive low precision)...");
        let p = Problem {
            q: &inputs.q,
            k: &inputs.k,
            v: &inputs.v,
            causal,
            scale: scale.unwrap_or(1.0 / (d as f32).sqrt()),
        };
        let report = check(&p, inputs.dtype, &AttnResult { o, lse });
        println!("check: {report}");
        if !report.passed() {
            return Err(CliError::CheckFailed);
        }
    }
    Ok(())
}

/// The no-GPU path: the tiled FlashAttention algorithm on the CPU against the f64 reference.
fn cpu_demo(causal: bool, seed: u64) -> CliResult<()> {
    let (b, s, h, d) = (1, 300, 2, 64);
    let mut r = rng(seed);
    let dtype = DType::BF16;
    let q = HostTensor::randn([b, s, h, d], dtype, 1.0, &mut r);
    let k = HostTensor::randn([b, s, h, d], dtype, 1.0, &mut r);
    let v = HostTensor::randn([b, s, h, d], dtype, 1.0, &mut r);
    let p = Problem { q: &q, k: &k, v: &v, causal, scale: 1.0 / (d as f32).sqrt() };
    let tiled = attention_tiled(&p, Tiling { block_m: 64, block_n: 64, lazy_rescale: true }, None);
    let exact = attention_f64(&p);
    let err = max_abs_err(&tiled.o, &exact.o);
    let lse_err = max_abs_err(&tiled.lse, &exact.lse);
    println!(
        "CPU reference (no GPU): tiled online-softmax algorithm, {b}x{s}x{h}x{d} bf16 inputs, causal={causal}: \
         max |O - O_f64| = {err:.2e}, max |LSE - LSE_f64| = {lse_err:.2e}"
    );
    if err > 1e-5 || lse_err > 1e-4 {
        return Err(CliError::CheckFailed);
    }
    Ok(())
}

fn cmd_info(args: &[String]) -> CliResult<()> {
    let mut a = Args::new(args);
    let device: usize = a.parsed("--device")?.unwrap_or(0);
    a.finish()?;
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

fn cmd_bench(args: &[String]) -> CliResult<()> {
    let mut a = Args::new(args);
    let dtype = a.value("--dtype")?.map(|s| parse_dtype(&s)).transpose()?.unwrap_or(DType::F16);
    let hdims = a.value("--hdims")?.map(|s| parse_list(&s)).transpose()?.unwrap_or(vec![64, 128, 256]);
    let seqlens =
        a.value("--seqlens")?.map(|s| parse_list(&s)).transpose()?.unwrap_or(vec![512, 1024, 2048, 4096, 8192, 16384]);
    let causal_modes = match a.value("--causal")?.as_deref() {
        None | Some("both") => vec![false, true],
        Some("off") => vec![false],
        Some("on") => vec![true],
        Some(x) => return Err(CliError::Usage(format!("--causal {x:?}: expected off, on or both"))),
    };
    let warmup: usize = a.parsed("--warmup")?.unwrap_or(5);
    let iters: usize = a.parsed("--iters")?.unwrap_or(20).max(1);
    // Sustained load before each timing (see `time_forward`).
    let warmup_ms: u64 = a.parsed("--warmup-ms")?.unwrap_or(1000);
    let timing_ms: u64 = a.parsed("--timing-ms")?.unwrap_or(300);
    // Idle time before each config: with `--warmup-ms 0`, a short burst at the clock of a
    // cool card, as the anchors and the FA3 paper time (docs/perf.md).
    let cooldown_ms: u64 = a.parsed("--cooldown-ms")?.unwrap_or(0);
    // cudarc's event tracking off: measures what its per-buffer waits and records cost
    // each call (docs/perf.md item 66).
    let untracked = a.flag("--untracked");
    let csv: Option<PathBuf> = a.value("--csv")?.map(PathBuf::from);
    let device: usize = a.parsed("--device")?.unwrap_or(0);
    let algo = parse_algo(a.value("--algo")?.as_deref())?;
    let schedule = parse_schedule(a.value("--schedule")?.as_deref())?;
    a.finish()?;

    let gpu = Gpu::new(device)?;
    if untracked {
        // SAFETY: every buffer below is created and used on `stream` only.
        unsafe { gpu.context().disable_event_tracking() };
    }
    let stream = gpu.new_stream()?;
    let info = gpu.info();
    println!("# {} (sm_{}{}, {} SMs), {}, {}", info.name, info.major, info.minor, info.sm_count, dtype.name(), algo_name(algo));
    let mut rows = vec!["impl,dtype,hdim,seqlen,batch,heads,causal,ms,tflops".to_string()];
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
    for &hdim in &hdims {
        for &seqlen in &seqlens {
            let (batch, heads) = (TOKENS / seqlen, HIDDEN / hdim);
            let shape = [batch, seqlen, heads, hdim];
            for &causal in &causal_modes {
                let (q, k, v) = (tensors[0].view(shape), tensors[1].view(shape), tensors[2].view(shape));
                let mut o = out.view_mut(shape);
                let opts = AttnOptions { algo, ..AttnOptions::default().causal(causal).schedule(schedule) };
                std::thread::sleep(std::time::Duration::from_millis(cooldown_ms));
                let t = time_forward(&gpu, &stream, &q, &k, &v, &mut o, &mut lse, &opts, warmup, warmup_ms, iters, timing_ms)?;
                let tflops = fwd_flops(batch, heads, seqlen, seqlen, hdim, causal) / (t.median_ms * 1e-3) / 1e12;
                println!(
                    "{hdim:>5} {seqlen:>6} {batch:>5} {heads:>5} {:>6} {:>9.4} {tflops:>8.1} {:>8.1}",
                    causal as u8,
                    t.median_ms,
                    t.host_us
                );
                std::io::stdout().flush().ok();
                rows.push(format!(
                    "rust-{},{},{hdim},{seqlen},{batch},{heads},{},{:.4},{tflops:.1}",
                    algo_name(algo),
                    dtype.name(),
                    causal as u8,
                    t.median_ms
                ));
            }
        }
    }
    if let Some(path) = csv {
        std::fs::write(&path, rows.join("\n") + "\n").map_err(|e| CliError::Io(format!("{}: {e}", path.display())))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
