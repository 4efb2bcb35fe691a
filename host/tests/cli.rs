//! The `fa3` command line, run as a process: usage errors exit 2 and name the argument,
//! every subcommand has `--help`, the flags the scripts pass still parse, and `fa3 plot`
//! draws from CSV files. None of these needs a GPU (on a machine with one, the `run`
//! invocations below compute small cases).
use std::path::PathBuf;
use std::process::{Command, Output};

fn fa3(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fa3")).args(args).output().expect("fa3 runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Asserts exit code 2 and that stderr mentions each of `names`.
fn assert_usage_error(args: &[&str], names: &[&str]) {
    let o = fa3(args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "fa3 {args:?}: expected a usage error (exit 2), got {:?}; stderr: {err}", o.status);
    for n in names {
        assert!(err.contains(n), "fa3 {args:?}: stderr does not name {n:?}: {err}");
    }
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fa3-cli-test-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn unknown_flag_is_a_usage_error() {
    assert_usage_error(&["bench", "--bogus"], &["--bogus"]);
    assert_usage_error(&["run", "--random", "1x64x1x64", "--frobnicate"], &["--frobnicate"]);
    assert_usage_error(&["info", "--verbose"], &["--verbose"]);
}

#[test]
fn unknown_or_missing_subcommand_is_a_usage_error() {
    assert_usage_error(&["frobnicate"], &["frobnicate"]);
    assert_usage_error(&[], &["Usage"]);
}

#[test]
fn input_with_random_is_a_usage_error() {
    assert_usage_error(&["run", "--input", "qkv.safetensors", "--random", "2x4096x16x128"], &["--input", "--random"]);
}

#[test]
fn run_without_input_or_random_is_a_usage_error() {
    assert_usage_error(&["run", "--causal"], &["--input", "--random"]);
}

#[test]
fn random_only_flags_with_input_are_usage_errors() {
    for flag in [["--seqlen-k", "100"], ["--heads-k", "2"], ["--dtype", "f16"]] {
        assert_usage_error(&["run", "--input", "qkv.safetensors", flag[0], flag[1]], &[flag[0], "--input"]);
    }
}

#[test]
fn malformed_random_shape_is_a_usage_error_naming_the_argument() {
    for bad in ["2x4096x16", "2x4096x16x128x1", "2x0x16x128", "2xfoo x16x128"] {
        assert_usage_error(&["run", "--random", bad], &["--random", bad]);
    }
}

#[test]
fn malformed_number_list_is_a_usage_error_naming_the_argument() {
    assert_usage_error(&["bench", "--hdims", "64,x"], &["--hdims"]);
    assert_usage_error(&["bench", "--seqlens", "512,,1024"], &["--seqlens"]);
    assert_usage_error(&["bench", "--seqlens", "0"], &["--seqlens"]);
}

#[test]
fn unknown_enum_value_is_a_usage_error_listing_the_choices() {
    assert_usage_error(&["bench", "--algo", "fa9"], &["--algo", "fa3-nopingpong", "fa3-nows"]);
    assert_usage_error(&["bench", "--causal", "maybe"], &["--causal", "off", "on", "both"]);
    assert_usage_error(&["bench", "--dtype", "f32"], &["--dtype", "bf16"]);
    assert_usage_error(&["run", "--random", "1x64x1x64", "--schedule", "fast"], &["--schedule", "multicast"]);
}

#[test]
fn plot_options_of_bench_require_plot() {
    assert_usage_error(&["bench", "--peers-csv", "peers.csv"], &["--plot"]);
    assert_usage_error(&["bench", "--title", "T"], &["--plot"]);
}

#[test]
fn plot_requires_csv_and_output() {
    assert_usage_error(&["plot", "-o", "x.svg"], &["--csv"]);
    assert_usage_error(&["plot", "--csv", "ours.csv"], &["--output"]);
}

#[test]
fn every_subcommand_has_help() {
    for sub in ["run", "bench", "info", "plot", "ptx"] {
        let o = fa3(&[sub, "--help"]);
        assert!(o.status.success(), "fa3 {sub} --help: {:?} {}", o.status, stderr(&o));
        assert!(stdout(&o).contains(&format!("Usage: fa3 {sub}")), "fa3 {sub} --help: {}", stdout(&o));
        let o = fa3(&["help", sub]);
        assert!(o.status.success() && stdout(&o).contains(&format!("Usage: fa3 {sub}")), "fa3 help {sub}");
    }
    let o = fa3(&["--help"]);
    assert!(o.status.success());
    for sub in ["run", "bench", "info", "plot", "ptx"] {
        assert!(stdout(&o).contains(sub), "fa3 --help does not list {sub}: {}", stdout(&o));
    }
}

/// The `bench` invocations of scripts/device.sh and scripts/ab.sh (and README's), each
/// with `--plot x.txt` added: that fails with exit 1 after parsing and before any GPU
/// work, so exit 1 with that message means the flags parsed.
#[test]
fn bench_flags_of_the_scripts_parse() {
    let cases: &[&[&str]] = &[
        &["--dtype", "f16", "--algo", "fa3", "--csv", "o.csv"],
        &["--dtype", "bf16", "--algo", "fa3-nopingpong", "--csv", "o.csv", "--untracked"],
        &["--dtype", "f16", "--hdims", "128", "--seqlens", "512,1024,2048,4096,8192,16384", "--algo", "fa3-nows", "--csv", "o.csv"],
        &["--dtype", "fp16", "--csv", "o.csv", "--hdims", "128", "--seqlens", "16384", "--causal", "off", "--warmup-ms", "0", "--timing-ms", "0", "--cooldown-ms", "3000"],
        &["--dtype", "f16", "--csv", "o.csv", "--schedule", "persistent", "--causal", "both"],
        &["--hdims", "128", "--seqlens", "4096", "--causal", "off", "--warmup-ms", "4000", "--csv", "o.csv"],
        &["--warmup", "5", "--iters", "20", "--device", "0", "--algo", "fa2", "--schedule", "dynamic", "--causal", "on"],
        &["--algo", "fa3-full", "--schedule", "multicast"],
        &["--algo", "fa3-nooverlap", "--schedule", "tile", "--peers-csv", "peers.csv", "--title", "T"],
    ];
    for args in cases {
        let mut all = vec!["bench"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--plot", "x.txt"]);
        let o = fa3(&all);
        assert_eq!(o.status.code(), Some(1), "fa3 {all:?}: {:?} {}", o.status, stderr(&o));
        assert!(stderr(&o).contains("x.txt: the plot must be a .svg or .png file"), "fa3 {all:?}: {}", stderr(&o));
    }
}

/// The `run` flags of scripts/device.sh (smoke, check, sanitize, profile) on small shapes:
/// without a GPU, `run` checks a small case on the CPU and succeeds.
#[test]
fn run_flags_of_the_scripts_parse() {
    let cases: &[&[&str]] = &[
        &["--random", "1x300x2x64", "--dtype", "bf16", "--causal", "--check", "--algo", "fa3"],
        &["--dtype", "f16", "--random", "1x300x4x128", "--heads-k", "2", "--schedule", "multicast"],
        &["--dtype", "f16", "--random", "1x100x2x256", "--seqlen-k", "4200", "--causal"],
        &["--dtype", "f16", "--random", "1x300x2x128", "--causal", "--algo", "fa3-nooverlap", "--seed", "1"],
        &["--random", "1x200x2x64", "--scale", "0.1", "--device", "0"],
    ];
    for args in cases {
        let mut all = vec!["run"];
        all.extend_from_slice(args);
        let o = fa3(&all);
        assert!(o.status.success(), "fa3 {all:?}: {:?} {}{}", o.status, stdout(&o), stderr(&o));
    }
}

const OURS: &str = "impl,dtype,hdim,seqlen,batch,heads,causal,ms,tflops
rust-fa3,f16,64,512,32,32,0,0.2014,341.1
rust-fa3,f16,64,512,32,32,1,0.1909,180.0
rust-fa3,f16,64,1024,16,32,0,0.3500,392.7
rust-fa3,f16,64,1024,16,32,1,0.2700,254.5
rust-fa3,f16,128,512,32,16,0,0.1500,458.1
rust-fa3,f16,128,1024,16,16,0,0.2500,549.8
";

const PEERS: &str = "impl,dtype,hdim,seqlen,batch,heads,causal,ms,tflops
torch-cudnn,f16,64,512,32,32,0,0.1727,397.9
torch-cudnn,f16,64,1024,16,32,0,0.3000,458.1
torch-fa2,f16,128,1024,16,16,0,0.4000,343.6
";

#[test]
fn plot_writes_an_svg_with_every_series() {
    let dir = temp_dir("svg");
    let (ours, peers, out) = (dir.join("ours.csv"), dir.join("peers.csv"), dir.join("fig.svg"));
    std::fs::write(&ours, OURS).unwrap();
    std::fs::write(&peers, PEERS).unwrap();
    let args = ["plot", "--csv", ours.to_str().unwrap(), "--peers-csv", peers.to_str().unwrap(), "--title", "CLI test", "-o", out.to_str().unwrap()];
    let o = fa3(&args);
    assert!(o.status.success(), "fa3 {args:?}: {}", stderr(&o));
    let svg = std::fs::read_to_string(&out).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "not an SVG document");
    for s in ["rust-fa3", "torch-cudnn", "torch-fa2", "CLI test", "hdim 64, causal", "hdim 128, non-causal"] {
        assert!(svg.contains(s), "the SVG lacks {s:?}");
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn plot_writes_a_png() {
    let dir = temp_dir("png");
    let (ours, out) = (dir.join("ours.csv"), dir.join("fig.png"));
    std::fs::write(&ours, OURS).unwrap();
    let o = fa3(&["plot", "--csv", ours.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let png = std::fs::read(&out).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG file");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn plot_failures_exit_1_with_the_reason() {
    let dir = temp_dir("fail");
    let ours = dir.join("ours.csv");
    std::fs::write(&ours, OURS).unwrap();
    let o = fa3(&["plot", "--csv", ours.to_str().unwrap(), "-o", "fig.pdf"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("fig.pdf"), "{}", stderr(&o));
    let missing = dir.join("missing.csv");
    let o = fa3(&["plot", "--csv", missing.to_str().unwrap(), "-o", dir.join("f.svg").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("missing.csv"), "{}", stderr(&o));
    let bad = dir.join("bad.csv");
    std::fs::write(&bad, "impl,hdim,seqlen,tflops\nx,64,512,1.0\n").unwrap();
    let o = fa3(&["plot", "--csv", bad.to_str().unwrap(), "-o", dir.join("f.svg").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("causal"), "{}", stderr(&o));
    std::fs::remove_dir_all(dir).ok();
}
