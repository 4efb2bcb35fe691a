//! `cargo xtask <command>`: build and check the GPU kernels.
//!
//! - `build-ptx [--out FILE]`: builds `kernels-gpu` to one PTX module (default
//!   `target/ptx/kernels.ptx`) and says where it went and how long it took.
//! - `check-ptx [--out FILE]`: builds, then assembles with `ptxas -arch=sm_90a -v` and fails
//!   on any spill, stack frame or ptxas warning (serialized `wgmma`, ignored
//!   `setmaxnreg`...). Fails if ptxas cannot be found (`pip install nvidia-cuda-nvcc`,
//!   or set `FA3_PTXAS`). Then the same with the driver JIT's ptxas
//!   (`ptx_builder::JIT_PTXAS_VERSION`, installed by `scripts/setup.sh`) when present.
use ptx_builder::{BuildConfig, find_jit_ptxas, find_ptxas, repo_root, run_ptxas};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!("usage: cargo xtask <build-ptx|check-ptx> [--out FILE]");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else { return usage() };
    let mut out = repo_root().join("target/ptx/kernels.ptx");
    let mut rest = args[1..].iter();
    while let Some(a) = rest.next() {
        match (a.as_str(), rest.next()) {
            ("--out", Some(p)) => out = PathBuf::from(p),
            _ => return usage(),
        }
    }
    match cmd.as_str() {
        "build-ptx" => build(out).map(|_| ExitCode::SUCCESS).unwrap_or_else(|e| e),
        "check-ptx" => match build(out) {
            Ok(path) => check(&path),
            Err(code) => code,
        },
        _ => usage(),
    }
}

fn build(out: PathBuf) -> Result<PathBuf, ExitCode> {
    let cfg = BuildConfig::in_repo(&repo_root().join("target"), out);
    eprintln!("building kernels-gpu for nvptx64-nvidia-cuda ({})...", ptx_builder::SM);
    match ptx_builder::build(&cfg) {
        Ok(b) => {
            println!(
                "PTX written to {} ({} KiB, {} kernels) in {:.1} s{}",
                b.ptx_path.display(),
                b.ptx.len() / 1024,
                common::KERNELS.len(),
                b.elapsed.as_secs_f64(),
                if b.cached { " (unchanged sources: from the PTX cache)" } else { "" }
            );
            Ok(b.ptx_path)
        }
        Err(e) => {
            eprintln!("error: {e}");
            Err(ExitCode::FAILURE)
        }
    }
}

fn check(ptx: &Path) -> ExitCode {
    let Some(ptxas) = find_ptxas() else {
        eprintln!("error: ptxas not found: `python3 -m pip install nvidia-cuda-nvcc` or set FA3_PTXAS");
        return ExitCode::FAILURE;
    };
    let latest = check_with(&ptxas, ptx);
    let Some(jit) = find_jit_ptxas() else {
        println!("(the driver JIT's ptxas {} is not installed: scripts/setup.sh)", ptx_builder::JIT_PTXAS_VERSION);
        return latest;
    };
    println!("\nthe driver JIT's ptxas {}:", ptx_builder::JIT_PTXAS_VERSION);
    match (latest, check_with(&jit, ptx)) {
        (ExitCode::SUCCESS, jit) => jit,
        (latest, _) => latest,
    }
}

fn check_with(ptxas: &Path, ptx: &Path) -> ExitCode {
    let (kernels, loose) = match run_ptxas(ptxas, ptx) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("ptxas ({}) -arch={} -v:", ptxas.display(), ptx_builder::SM);
    println!("{:<28} {:>5} {:>6} {:>7} {:>7}  warnings", "kernel", "regs", "stack", "spill-st", "spill-ld");
    for k in &kernels {
        println!(
            "{:<28} {:>5} {:>6} {:>7} {:>7}  {}",
            k.name,
            k.registers,
            k.stack_frame,
            k.spill_stores,
            k.spill_loads,
            k.warnings.join(" | ")
        );
    }
    let problems = ptx_builder::report_problems(&kernels, &loose, common::KERNELS.len());
    if problems.is_empty() {
        println!("ok: no spills, no stack frames, no warnings");
        ExitCode::SUCCESS
    } else {
        for p in &problems {
            eprintln!("error: {p}");
        }
        ExitCode::FAILURE
    }
}
