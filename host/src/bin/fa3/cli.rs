//! The command line of `fa3`: subcommands, flags and their value parsers.
use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};
use flash_attn3::{Algo, DType, Schedule, Techniques, Window};
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "fa3",
    version,
    about = "FlashAttention for Hopper, kernels in Rust",
    subcommand_required = true,
    arg_required_else_help = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Computes O and LSE (and with --backward dQ, dK, dV) on the GPU, from a safetensors file or random inputs
    ///
    /// Input: a safetensors file with q, k, v (and do: dL/dO, for --backward) ([batch,
    /// seqlen, heads, hdim], f16 or bf16), or random normal inputs. Without a usable GPU it checks a small case of the same
    /// algorithm on the CPU instead, labelled as such.
    Run(RunArgs),
    /// Times the forward (or backward) pass over the FlashAttention-3 paper's grid
    ///
    /// batch = 16384 / seqlen, heads = 2048 / hdim. Prints one line per config on stdout,
    /// and a progress bar on stderr when stderr is a terminal.
    Bench(BenchArgs),
    /// Draws TFLOP/s against sequence length from `fa3 bench --csv` files (no GPU needed)
    Plot(PlotArgs),
    /// FP8 accuracy: the FlashAttention-3 paper's experiment on the CPU (and our fp16 kernel on the GPU when there is one)
    ///
    /// Q, K, V ~ N(0, 1) with 0.1% of the entries from N(0, 10²), non-causal; RMSE of O
    /// against f64 for FP8 with one scale per tensor, with block scales, and with block
    /// scales after incoherent processing (Hadamard with random signs on Q and K), each
    /// with e4m3 rounding of Q, K, V and P.
    Fp8Accuracy(Fp8AccuracyArgs),
    /// GPU, driver and kernels
    Info(InfoArgs),
    /// Prints the embedded PTX module (for ptxas / cuobjdump)
    Ptx,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("source").required(true).args(["input", "random"])))]
pub struct RunArgs {
    /// Read q, k, v from a safetensors file
    #[arg(long, value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// Random normal inputs: batch x seqlen x heads x hdim, e.g. 2x4096x16x128
    #[arg(long, value_name = "BxSxHxD", value_parser = parse_shape)]
    pub random: Option<Shape>,
    /// Key/value length (with --random) [default: seqlen]
    #[arg(long, value_name = "N", requires = "random", conflicts_with = "input")]
    pub seqlen_k: Option<usize>,
    /// K/V heads, for GQA (with --random) [default: heads]
    #[arg(long, value_name = "N", requires = "random", conflicts_with = "input")]
    pub heads_k: Option<usize>,
    /// Element type of the random inputs (with --random) [default: bf16]
    #[arg(long, value_enum, requires = "random", conflicts_with = "input")]
    pub dtype: Option<DtypeArg>,
    /// Bottom-right aligned causal mask
    #[arg(long)]
    pub causal: bool,
    /// Softmax scale [default: 1/sqrt(hdim)]
    #[arg(long, value_name = "X", allow_negative_numbers = true)]
    pub scale: Option<f32>,
    #[command(flatten)]
    pub variants: VariantArgs,
    /// Write o and lse to a safetensors file
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Compare with the CPU references (f64 exact, naive low precision); exit 1 if outside the budget
    #[arg(long)]
    pub check: bool,
    /// Also run the backward: dO is read from the input file's `do` (or random), and dq,
    /// dk, dv join o and lse in the output
    #[arg(long)]
    pub backward: bool,
    /// Backward: the deterministic mode
    #[arg(long, requires = "backward")]
    pub deterministic: bool,
    /// FP8 (`--dtype e4m3`): incoherent processing of Q and K before quantization
    #[arg(long)]
    pub incoherent: bool,
    /// Random seed [default: from the clock]
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// GPU ordinal
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub device: usize,
    #[command(flatten)]
    pub kernel: KernelArgs,
}

/// Which kernel runs: shared by `run` and `bench`.
#[derive(Debug, Args)]
pub struct KernelArgs {
    /// Kernel family
    #[arg(long, value_enum, value_name = "NAME", default_value_t = AlgoArg::Fa3)]
    pub algo: AlgoArg,
    /// FA3 grid schedule
    #[arg(long, value_enum, value_name = "S", default_value_t = ScheduleArg::Auto)]
    pub schedule: ScheduleArg,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Element type
    #[arg(long, value_enum, default_value_t = DtypeArg::F16)]
    pub dtype: DtypeArg,
    /// Head dims, comma-separated
    #[arg(long, value_name = "N,...", value_parser = parse_list, default_value = "64,128,256")]
    pub hdims: List,
    /// Sequence lengths, comma-separated
    #[arg(long, value_name = "N,...", value_parser = parse_list, default_value = "512,1024,2048,4096,8192,16384")]
    pub seqlens: List,
    /// Causal mask: without, with, or both
    #[arg(long, value_enum, value_name = "MODE", default_value_t = CausalArg::Both)]
    pub causal: CausalArg,
    /// Untimed launches before the sustained load, per config
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub warmup: usize,
    /// Timed launches, at least (more when --timing-ms needs them)
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub iters: usize,
    /// Back-to-back launches of each config for this long before timing it (the card
    /// reaches its power cap under sustained load)
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub warmup_ms: u64,
    /// Time at least --iters launches and as many as span this long; the median is kept
    #[arg(long, value_name = "MS", default_value_t = 300)]
    pub timing_ms: u64,
    /// Idle before each config (with --warmup-ms 0: short bursts on a cool card, as the
    /// anchors and the FA3 paper time)
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub cooldown_ms: u64,
    /// Turn cudarc's event tracking off (measures what its per-buffer waits cost)
    #[arg(long)]
    pub untracked: bool,
    /// What to time: the forward, the backward (preprocess, main and postprocess
    /// launches; FLOPs 2.5x the forward's), or both in a row
    #[arg(long, value_enum, value_name = "PASS", default_value_t = PassArg::Fwd)]
    pub pass: PassArg,
    /// Backward: the deterministic mode (dQ summed in a fixed order per query block)
    #[arg(long)]
    pub deterministic: bool,
    /// `--dtype e4m3`: how V reaches the kernel
    #[arg(long, value_enum, value_name = "LAYOUT", default_value_t = Fp8VArg::Transposed)]
    pub fp8_v: Fp8VArg,
    #[command(flatten)]
    pub variants: VariantArgs,
    /// Write the results as CSV (impl,dtype,hdim,seqlen,batch,heads,causal,ms,tflops)
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Draw the results as TFLOP/s against sequence length (.svg or .png)
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Peers' results to overlay on the plot (scripts/peers.py's CSV or the anchors'); repeatable
    #[arg(long, value_name = "FILE", requires = "plot")]
    pub peers_csv: Vec<PathBuf>,
    /// Title of the plot [default: the GPU, dtype and kernel]
    #[arg(long, value_name = "T", requires = "plot")]
    pub title: Option<String>,
    /// GPU ordinal
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub device: usize,
    #[command(flatten)]
    pub kernel: KernelArgs,
}

#[derive(Debug, Args)]
pub struct PlotArgs {
    /// Our results, as `fa3 bench --csv` wrote them; repeatable (one series per impl)
    #[arg(long, value_name = "FILE", required = true)]
    pub csv: Vec<PathBuf>,
    /// Peers' results (scripts/peers.py's CSV or the anchors'), drawn dashed; repeatable
    #[arg(long, value_name = "FILE")]
    pub peers_csv: Vec<PathBuf>,
    /// Title of the plot
    #[arg(long, value_name = "T", default_value = "Attention forward, TFLOP/s (16k tokens, hidden 2048)")]
    pub title: String,
    /// The image to write: .svg or .png
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
}

#[derive(Debug, Args)]
pub struct Fp8AccuracyArgs {
    /// Sequence lengths (queries and keys), comma-separated
    #[arg(long, value_name = "N,...", value_parser = parse_list, default_value = "4096")]
    pub seqlens: List,
    /// Head dim (a power of two)
    #[arg(long, value_name = "D", default_value_t = 128)]
    pub hdim: usize,
    /// Heads (batch 1)
    #[arg(long, value_name = "H", default_value_t = 1)]
    pub heads: usize,
    /// Query rows per block scale of Q in the CPU emulation (default: the FP8 kernel's
    /// tile at this head dim, as its own columns use; 128 without a kernel)
    #[arg(long, value_name = "N")]
    pub block_m: Option<usize>,
    /// Keys per block scale of K and V in the CPU emulation (default: the FP8 kernel's)
    #[arg(long, value_name = "N")]
    pub block_n: Option<usize>,
    /// Seeds of the inputs and of the Hadamard signs (one row per seed and length; the
    /// emulation and the kernel share the signs), comma-separated
    #[arg(long, value_name = "S,...", value_delimiter = ',', default_value = "0")]
    pub seeds: Vec<u64>,
    /// Only the GPU kernels' columns: skip the CPU's fp16 and FP8 emulation rows
    #[arg(long)]
    pub kernel_only: bool,
    /// GPU ordinal for the fp16 kernel's row (skipped without a usable GPU)
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub device: usize,
}

#[derive(Debug, Args)]
pub struct InfoArgs {
    /// GPU ordinal
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub device: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DtypeArg {
    /// IEEE half precision
    #[value(name = "f16", alias = "fp16", alias = "float16")]
    F16,
    /// bfloat16
    #[value(name = "bf16", alias = "bfloat16")]
    Bf16,
    /// FP8: e4m3 Q, K, V with block factors (quantized on the GPU from bf16), O in bf16
    #[value(name = "e4m3", alias = "fp8")]
    E4m3,
}

impl From<DtypeArg> for DType {
    fn from(d: DtypeArg) -> DType {
        match d {
            DtypeArg::F16 => DType::F16,
            // The FP8 path's O; its inputs are e4m3 (`bench` branches on it first).
            DtypeArg::Bf16 | DtypeArg::E4m3 => DType::BF16,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AlgoArg {
    /// FA3 with the head dim's default techniques
    #[value(name = "fa3")]
    Fa3,
    /// FlashAttention-2 on mma.sync
    #[value(name = "fa2")]
    Fa2,
    /// FA3 with every technique
    #[value(name = "fa3-full")]
    Fa3Full,
    /// FA3 without pingpong scheduling
    #[value(name = "fa3-nopingpong")]
    Fa3NoPingpong,
    /// FA3 without the intra-warpgroup overlap (hdim 128 f16 only)
    #[value(name = "fa3-nooverlap")]
    Fa3NoOverlap,
    /// FA3 without warp specialization (hdim 128 f16 only)
    #[value(name = "fa3-nows")]
    Fa3NoWs,
}

impl AlgoArg {
    /// `None`: the planner's default (FA3 with the head dim's default techniques).
    pub fn algo(self) -> Option<Algo> {
        match self {
            AlgoArg::Fa3 => None,
            AlgoArg::Fa2 => Some(Algo::Fa2),
            AlgoArg::Fa3Full => Some(Algo::Fa3(Techniques::FULL)),
            AlgoArg::Fa3NoPingpong => Some(Algo::Fa3(Techniques::NO_PINGPONG)),
            AlgoArg::Fa3NoOverlap => Some(Algo::Fa3(Techniques::NO_OVERLAP)),
            AlgoArg::Fa3NoWs => Some(Algo::Fa3(Techniques::NO_WARP_SPECIALIZATION)),
        }
    }

    /// Its name on the command line (and, after `rust-`, in the CSV `impl` column).
    pub fn name(self) -> &'static str {
        match self {
            AlgoArg::Fa3 => "fa3",
            AlgoArg::Fa2 => "fa2",
            AlgoArg::Fa3Full => "fa3-full",
            AlgoArg::Fa3NoPingpong => "fa3-nopingpong",
            AlgoArg::Fa3NoOverlap => "fa3-nooverlap",
            AlgoArg::Fa3NoWs => "fa3-nows",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ScheduleArg {
    /// The planner's choice
    #[value(name = "auto")]
    Auto,
    /// Persistent CTAs
    #[value(name = "persistent")]
    Persistent,
    /// Persistent CTAs with a dynamic tile counter
    #[value(name = "dynamic")]
    Dynamic,
    /// 2-CTA clusters sharing K/V loads (hdim 128, non-causal)
    #[value(name = "multicast")]
    Multicast,
    /// One tile per CTA
    #[value(name = "tile")]
    Tile,
}

impl From<ScheduleArg> for Schedule {
    fn from(s: ScheduleArg) -> Schedule {
        match s {
            ScheduleArg::Auto => Schedule::Auto,
            ScheduleArg::Persistent => Schedule::Persistent,
            ScheduleArg::Dynamic => Schedule::PersistentDynamic,
            ScheduleArg::Multicast => Schedule::PersistentMulticast,
            ScheduleArg::Tile => Schedule::TilePerCta,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PassArg {
    /// The forward pass
    Fwd,
    /// The backward pass (after one untimed forward for O and the LSE)
    Bwd,
    /// A forward and a backward
    Fwdbwd,
}

impl PassArg {
    /// The suffix of the CSV's impl name, and the FLOPs of one timed call relative to
    /// the forward's.
    pub fn series_suffix_and_flops(self) -> (&'static str, f64) {
        match self {
            PassArg::Fwd => ("", 1.0),
            PassArg::Bwd => ("-bwd", 2.5),
            PassArg::Fwdbwd => ("-fwdbwd", 3.5),
        }
    }
}

/// The V layouts `bench --dtype e4m3` times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Fp8VArg {
    /// V quantized transposed (`quantize_fp8` with `Role::V`): series `rust-fa3-fp8*`
    Transposed,
    /// V as stored (`[b, s, h, d]`), transposed by the kernel: series `*-vrows`
    Rows,
    /// V as stored, transposed by `transpose_v_fp8` before each call (the pass timed with
    /// it): series `*-vpass`
    Pass,
    /// All three
    All,
}

impl Fp8VArg {
    /// The layouts to time, in order.
    pub fn layouts(self) -> &'static [Fp8VArg] {
        match self {
            Fp8VArg::All => &[Fp8VArg::Transposed, Fp8VArg::Rows, Fp8VArg::Pass],
            Fp8VArg::Transposed => &[Fp8VArg::Transposed],
            Fp8VArg::Rows => &[Fp8VArg::Rows],
            Fp8VArg::Pass => &[Fp8VArg::Pass],
        }
    }

    /// The suffix of the series' names.
    pub fn suffix(self) -> &'static str {
        match self {
            Fp8VArg::Rows => "-vrows",
            Fp8VArg::Pass => "-vpass",
            _ => "",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CausalArg {
    /// Without the mask
    Off,
    /// With the causal mask
    On,
    /// Each config without, then with
    Both,
}

impl CausalArg {
    /// The masks to time, in order.
    pub fn modes(self) -> &'static [bool] {
        match self {
            CausalArg::Off => &[false],
            CausalArg::On => &[true],
            CausalArg::Both => &[false, true],
        }
    }
}

/// A tensor shape, `[batch, seqlen, heads, hdim]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape(pub [usize; 4]);

/// `BxSxHxD`, four positive integers.
pub fn parse_shape(s: &str) -> Result<Shape, String> {
    let bad = || format!("expected BxSxHxD (four positive integers, e.g. 2x4096x16x128), got {s:?}");
    let v: Vec<usize> = s.split(['x', 'X']).map(|x| x.trim().parse().map_err(|_| bad())).collect::<Result<_, _>>()?;
    let dims: [usize; 4] = v.try_into().map_err(|_| bad())?;
    if dims.contains(&0) {
        return Err(bad());
    }
    Ok(Shape(dims))
}

/// A comma-separated list of positive integers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct List(pub Vec<usize>);

/// `N,N,...`, positive integers.
pub fn parse_list(s: &str) -> Result<List, String> {
    let v = s
        .split(',')
        .map(|x| match x.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("expected a comma-separated list of positive integers, got {x:?} in {s:?}")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(List(v))
}

/// The attention variants of a call (`run` and `bench`; `bench` counts a window's
/// TFLOP/s on its visible pairs).
#[derive(Debug, Clone, Args)]
pub struct VariantArgs {
    /// Soft-capping: logits c * tanh(scale * QK^T / c)
    #[arg(long, value_name = "C", allow_negative_numbers = true)]
    pub softcap: Option<f32>,
    /// ALiBi with the standard slopes 2^(-8 (h + 1) / heads)
    #[arg(long)]
    pub alibi: bool,
    /// Sliding window L,R: row i sees keys i + (sk - sq) - L ..= i + (sk - sq) + R; "inf"
    /// or -1 leaves a side unbounded (FlashAttention's window_size)
    #[arg(long, value_name = "L,R", value_parser = parse_window, allow_hyphen_values = true)]
    pub window: Option<Window>,
    /// Attention sinks: one logit for every query head, or one per head (L0,L1,...)
    #[arg(long, value_name = "L,...", value_parser = parse_floats, allow_hyphen_values = true)]
    pub sinks: Option<Floats>,
    /// Packed documents (a document mask): their lengths L0,L1,... in tokens, adding up to
    /// the sequence; a single L cuts the sequence into documents of L tokens (the last one
    /// shorter)
    #[arg(long, value_name = "L,...", value_parser = parse_lengths)]
    pub doc_lens: Option<Lengths>,
}

/// Comma-separated positive lengths.
#[derive(Clone, Debug, PartialEq)]
pub struct Lengths(pub Vec<usize>);

pub fn parse_lengths(s: &str) -> Result<Lengths, String> {
    s.split(',')
        .map(|x| match x.trim().parse::<usize>() {
            Ok(v) if v > 0 => Ok(v),
            _ => Err(format!("expected comma-separated positive lengths, got {x:?} in {s:?}")),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Lengths)
}

/// Comma-separated finite floats.
#[derive(Clone, Debug, PartialEq)]
pub struct Floats(pub Vec<f32>);

impl Floats {
    /// One value per head: the list itself, or its single value repeated.
    pub fn per_head(&self, heads: usize) -> Result<Vec<f32>, String> {
        match self.0.len() {
            1 => Ok(vec![self.0[0]; heads]),
            n if n == heads => Ok(self.0.clone()),
            n => Err(format!("--sinks: {n} logits for {heads} heads (give 1 or {heads})")),
        }
    }
}

pub fn parse_floats(s: &str) -> Result<Floats, String> {
    s.split(',')
        .map(|x| match x.trim().parse::<f32>() {
            Ok(v) if v.is_finite() => Ok(v),
            _ => Err(format!("expected comma-separated finite numbers, got {x:?} in {s:?}")),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Floats)
}

/// `L,R`: each side a key count, or `inf` / `-1` for unbounded.
pub fn parse_window(s: &str) -> Result<Window, String> {
    let side = |x: &str| match x.trim() {
        "inf" | "-1" => Ok(None),
        x => x.parse::<usize>().map(Some).map_err(|_| format!("expected a key count, inf or -1, got {x:?} in {s:?}")),
    };
    match s.split(',').collect::<Vec<_>>()[..] {
        [l, r] => Ok(Window { left: side(l)?, right: side(r)? }),
        _ => Err(format!("expected L,R, got {s:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn shapes_and_lists_parse() {
        assert_eq!(parse_shape("2x4096x16x128"), Ok(Shape([2, 4096, 16, 128])));
        assert!(parse_shape("2x4096x16").is_err());
        assert!(parse_shape("2x0x16x128").is_err());
        assert_eq!(parse_list("64, 128,256"), Ok(List(vec![64, 128, 256])));
        assert!(parse_list("64,,128").is_err());
        assert!(parse_list("0").is_err());
        assert_eq!(parse_window("4096,0"), Ok(Window { left: Some(4096), right: Some(0) }));
        assert_eq!(parse_window("inf, 7"), Ok(Window { left: None, right: Some(7) }));
        assert_eq!(parse_window("-1,-1"), Ok(Window { left: None, right: None }));
        assert!(parse_window("5").is_err());
        assert!(parse_window("-2,0").is_err());
        assert_eq!(parse_floats("-1.5, 2"), Ok(Floats(vec![-1.5, 2.0])));
        assert!(parse_floats("1,nan").is_err());
        assert_eq!(Floats(vec![0.5]).per_head(3), Ok(vec![0.5; 3]));
        assert!(Floats(vec![0.5, 1.0]).per_head(3).is_err());
    }
}
