//! `cargo xtask <command>`: build and check the GPU kernels.
//!
//! - `build-ptx [--out FILE]`: builds `kernels-gpu` to one PTX module (default
//!   `target/ptx/kernels.ptx`) and says where it went and how long it took.
//! - `check-ptx [--out FILE]`: builds, then assembles with `ptxas -arch=sm_90a -v` and fails
//!   on any spill, stack frame or ptxas warning (serialized `wgmma`, ignored
//!   `setmaxnreg`...). Fails if ptxas cannot be found (`pip install nvidia-cuda-nvcc`,
//!   or set `FA3_PTXAS`). Then the same with the driver JIT's ptxas
//!   (`ptx_builder::JIT_PTXAS_VERSION`, installed by `scripts/setup.sh`) when present.
//! - `ptx-spills [--sass] [--ptx FILE] PATTERN`: assembles only the entries of a built
//!   module (default `target/ptx/kernels.ptx`) whose names match PATTERN (`*` matches any
//!   run of characters; without one, the name must contain PATTERN) and reports each
//!   one's stack frame and spills; with `--sass`, each spill store and load and the
//!   role whose code it sits in (after the producer warpgroup's `setmaxnreg.dec` or the
//!   consumers' `.inc`). Seconds for a few kernels, while fitting one.
use ptx_builder::{BuildConfig, find_jit_ptxas, find_nvdisasm, find_ptxas, repo_root, run_ptxas};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!("usage: cargo xtask <build-ptx|check-ptx> [--out FILE]\n       cargo xtask ptx-spills [--sass] [--ptx FILE] PATTERN");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else { return usage() };
    if cmd == "ptx-spills" {
        return spills(&args[1..]);
    }
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

/// `ptx-spills`: see the module's doc.
fn spills(args: &[String]) -> ExitCode {
    let (mut sass, mut ptx, mut pattern) = (false, repo_root().join("target/ptx/kernels.ptx"), None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--sass" => sass = true,
            "--ptx" => match it.next() {
                Some(p) => ptx = PathBuf::from(p),
                None => return usage(),
            },
            p if pattern.is_none() => pattern = Some(p.to_string()),
            _ => return usage(),
        }
    }
    let Some(pattern) = pattern else { return usage() };
    let (Some(ptxas), nvdisasm) = (find_ptxas(), find_nvdisasm()) else {
        eprintln!("error: ptxas not found: `python3 -m pip install nvidia-cuda-nvcc` or set FA3_PTXAS");
        return ExitCode::FAILURE;
    };
    let text = match std::fs::read_to_string(&ptx) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {}: {e}", ptx.display());
            return ExitCode::FAILURE;
        }
    };
    let dir = repo_root().join("target/ptx-spills");
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("error: {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix(".visible .entry "))
        .map(|l| l.split(['(', ' ']).next().unwrap_or(""))
        .filter(|n| matches(&pattern, n))
        .collect();
    if names.is_empty() {
        eprintln!("error: no entry of {} matches {pattern}", ptx.display());
        return ExitCode::FAILURE;
    }
    for name in names {
        // One entry a module: ptxas' report and the SASS then belong to it alone.
        let path = dir.join(format!("{name}.ptx"));
        if let Err(e) = std::fs::write(&path, ptx_builder::ptx_subset(&text, |n| n == name)) {
            eprintln!("error: {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        let k = match run_ptxas(&ptxas, &path) {
            Ok((kernels, _)) => kernels.into_iter().find(|k| k.name == name),
            Err(e) => {
                eprintln!("error: {name}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let Some(k) = k else {
            eprintln!("error: ptxas reported nothing for {name}");
            return ExitCode::FAILURE;
        };
        let verdict = if k.is_clean() { "ok   " } else { "SPILL" };
        println!("{verdict} {name}: {} B stack frame, {} B spill stores, {} B spill loads", k.stack_frame, k.spill_stores, k.spill_loads);
        if !sass || k.is_clean() {
            continue;
        }
        let Some(nvdisasm) = &nvdisasm else {
            eprintln!("(nvdisasm not found: scripts/setup.sh)");
            continue;
        };
        match ptx_builder::sass::disassemble(nvdisasm, &path.with_extension("cubin")) {
            Ok(fns) => {
                for (_, code) in fns {
                    let mut role = "entry";
                    for i in &code.instrs {
                        if i.opcode.starts_with("USETMAXREG") {
                            role = if i.opcode.contains("DEALLOC") { "producer warpgroup" } else { "consumers" };
                        } else if i.opcode.starts_with("STL") || i.opcode.starts_with("LDL") {
                            println!("    {role:<18} {}", i.text);
                        }
                    }
                }
            }
            Err(e) => eprintln!("error: {name}: {e}"),
        }
    }
    ExitCode::SUCCESS
}

/// Whether `name` matches `pattern`: `*` matches any run of characters; a pattern without
/// one need only occur in the name.
fn matches(pattern: &str, name: &str) -> bool {
    if !pattern.contains('*') {
        return name.contains(pattern);
    }
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn patterns_match_substrings_or_globs() {
        assert!(matches("hdim128", "bwd_hdim128_f16"));
        assert!(!matches("hdim64", "bwd_hdim128_f16"));
        assert!(matches("bwd_hdim128_f16", "bwd_hdim128_f16_softcap"));
        assert!(matches("bwd_hdim128_f16*", "bwd_hdim128_f16"));
        assert!(!matches("bwd_*_f16", "bwd_hdim128_f16_softcap"));
        assert!(matches("bwd_*_f16_*cap", "bwd_hdim128_f16_softcap"));
        assert!(matches("*", ""));
        assert!(!matches("ab*ba", "aba"), "the two ends may not overlap");
    }
}

