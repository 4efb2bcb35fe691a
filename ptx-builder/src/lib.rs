//! Builds the `no_std` kernel crate into one PTX module, without a CUDA toolkit and
//! without rustup's `llvm-bitcode-linker` component (not downloadable here).
//!
//! The pipeline is the one rustc would run through that linker, done by hand with the
//! `llvm-tools` of the pinned toolchain:
//!
//! 1. `cargo build --target nvptx64-nvidia-cuda -Zbuild-std=core` of the kernel crate as
//!    an rlib (for this target rlib members are LLVM bitcode);
//! 2. `llvm-link` every bitcode member of the kernel crate and its dependencies (core...);
//! 3. `opt`: internalize everything but the exported kernels, drop dead code, `O3`;
//! 4. `llc -mcpu=sm_90a` to PTX;
//! 5. raise the `.param` alignment of TMA descriptor blocks to 128 bytes (rustc's PTX ABI
//!    cannot express an alignment above 16; the TMA unit needs 64) and check that the
//!    module exports exactly its kernels ([`Exports`]: `common::KERNELS`, or a variant
//!    crate's `{name}__{kernel}` for each kernel of `common::variant::KERNELS`).
//!
//! It also runs `ptxas -v` (from PyPI's `nvidia-cuda-nvcc`, when present) and parses its
//! report, so spills and stack frames are caught without a GPU.

use std::ffi::OsStr;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::KernelEntry;

pub mod sass;

/// PTX ISA version requested from llc (8.0: `wgmma`, `setmaxnreg`, `cp.async.bulk.tensor`).
pub const PTX_ISA: &str = "ptx80";
/// The GPU the kernels are built for.
pub const SM: &str = "sm_90a";
/// Full-unroll budget for LLVM: register arrays must only ever be indexed by constants.
const UNROLL_THRESHOLD: &str = "-unroll-threshold=20000";

#[derive(Debug)]
pub enum Error {
    /// A tool could not be started.
    Spawn { tool: String, err: std::io::Error },
    /// A tool ran and failed.
    Tool { tool: String, status: String, stderr: String },
    Io(std::io::Error),
    /// The PTX does not have the shape the host expects.
    Ptx(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Spawn { tool, err } => write!(f, "could not run {tool}: {err}"),
            Error::Tool { tool, status, stderr } => write!(f, "{tool} failed ({status}):\n{stderr}"),
            Error::Io(e) => write!(f, "I/O error: {e}"),
            Error::Ptx(m) => write!(f, "unexpected PTX: {m}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

pub struct BuildConfig {
    /// Directory of the kernel crate (`kernels-gpu`, or a variant crate that depends on it).
    pub kernel_dir: PathBuf,
    /// Cargo target directory for the nvptx build (kept apart from the host's).
    pub target_dir: PathBuf,
    /// Where the PTX is written.
    pub out_ptx: PathBuf,
    /// The kernels the module must export, exactly.
    pub exports: Exports,
}

/// Which kernels a module exports.
#[derive(Clone, Debug)]
pub enum Exports {
    /// The library's own: `common::KERNELS`.
    Builtin,
    /// A variant module's: for each variant name given to `kernels_gpu::variant_kernels!`,
    /// every kernel of `common::variant::KERNELS`, as `{name}__{kernel}`.
    Variants(Vec<String>),
}

impl Exports {
    /// Each exported symbol and the kernel it is.
    pub fn kernels(&self) -> Vec<(String, KernelEntry)> {
        match self {
            Exports::Builtin => common::KERNELS.iter().map(|k| (k.name.to_string(), *k)).collect(),
            Exports::Variants(names) => names
                .iter()
                .flat_map(|n| common::variant::KERNELS.iter().map(move |k| (variant_symbol(n, k), *k)))
                .collect(),
        }
    }
}

/// The exported name of `kernel` (of `common::variant::KERNELS`) for variant `variant`.
pub fn variant_symbol(variant: &str, kernel: &KernelEntry) -> String {
    format!("{variant}{}{}", common::variant::SEPARATOR, kernel.name)
}

pub struct Built {
    pub ptx_path: PathBuf,
    pub ptx: String,
    pub elapsed: Duration,
    /// Taken from the PTX cache ([`cache_dir`]) rather than built.
    pub cached: bool,
}

/// Where built modules are kept, under a key of everything that goes into them
/// ([`cache_key`]): one checkout builds its kernels once whichever profile, target
/// directory or workspace asks for them (the host crate's build script in debug, release
/// and `cargo doc`, the candle crate's own workspace, `cargo xtask`, the variants
/// example), instead of once per output directory (2-3 minutes each on two cores).
/// `FA3_PTX_CACHE` names the directory (empty: no cache); by default
/// `target/ptx-cache` of this repository when it is a git checkout, and no cache when
/// it is not (a registry copy is not ours to write into).
pub fn cache_dir() -> Option<PathBuf> {
    match std::env::var_os("FA3_PTX_CACHE") {
        Some(dir) if dir.is_empty() => None,
        Some(dir) => Some(PathBuf::from(dir)),
        None => {
            let root = repo_root();
            root.join(".git").exists().then(|| root.join("target").join("ptx-cache"))
        }
    }
}

/// Cache entries kept: the newest few (the built-in module and a variant module, each
/// with its previous key).
const CACHE_ENTRIES: usize = 4;

/// The cache key of `cfg`'s module: every file of the kernel crate, `common`, this
/// builder (its passes and flags) and, for a variant module, the variant crate, the
/// pinned toolchain and the lock file (by relative path and contents), and the exported
/// names. std's hasher: its algorithm may change between Rust releases, which only turns
/// a key into a miss (the toolchain is part of the key).
pub fn cache_key(cfg: &BuildConfig) -> Result<String, Error> {
    use std::hash::{Hash, Hasher};
    let root = repo_root();
    let mut files = Vec::new();
    for dir in ["kernels-gpu/src", "common/src", "ptx-builder/src"] {
        collect_files(&root.join(dir), &mut files)?;
    }
    for f in ["kernels-gpu/Cargo.toml", "common/Cargo.toml", "ptx-builder/Cargo.toml", "rust-toolchain.toml", "Cargo.lock"] {
        files.push(root.join(f));
    }
    if cfg.kernel_dir != root.join("kernels-gpu") {
        collect_files(&cfg.kernel_dir.join("src"), &mut files)?;
        files.push(cfg.kernel_dir.join("Cargo.toml"));
    }
    files.sort();
    files.dedup();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for f in &files {
        f.strip_prefix(&root).unwrap_or(f).hash(&mut h);
        std::fs::read(f)?.hash(&mut h);
    }
    for (name, _) in cfg.exports.kernels() {
        name.hash(&mut h);
    }
    Ok(format!("{:016x}", h.finish()))
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), Error> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_files(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

/// Stores `ptx` under `key` in `dir` (written aside, then renamed: a concurrent build
/// reads a whole entry or none) and drops all but the newest [`CACHE_ENTRIES`] entries.
fn cache_store(dir: &Path, key: &str, ptx: &str) -> Result<(), Error> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!("{key}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, ptx)?;
    std::fs::rename(&tmp, dir.join(format!("{key}.ptx")))?;
    let mut entries: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension() == Some(OsStr::new("ptx")))
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .collect();
    entries.sort();
    for (_, old) in entries.iter().rev().skip(CACHE_ENTRIES) {
        let _ = std::fs::remove_file(old);
    }
    Ok(())
}

/// The repository root, from this crate's location.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("ptx-builder lives in the repo").to_path_buf()
}

impl BuildConfig {
    /// Kernel crate of this repository, building under `target_root`.
    pub fn in_repo(target_root: &Path, out_ptx: PathBuf) -> Self {
        BuildConfig {
            kernel_dir: repo_root().join("kernels-gpu"),
            target_dir: target_root.join("nvptx"),
            out_ptx,
            exports: Exports::Builtin,
        }
    }

    /// A variant crate at `kernel_dir` (a `no_std` crate calling
    /// `kernels_gpu::variant_kernels!` with these `names`), building under `target_root`.
    pub fn variant(kernel_dir: PathBuf, target_root: &Path, out_ptx: PathBuf, names: &[&str]) -> Self {
        let exports = Exports::Variants(names.iter().map(|n| n.to_string()).collect());
        BuildConfig { kernel_dir, target_dir: target_root.join("nvptx"), out_ptx, exports }
    }
}

/// From a user crate's `build.rs`: builds the variant crate at `kernel_dir` (relative to
/// the calling package) into `$OUT_DIR/{file}` and returns its path, for
/// `include_str!(concat!(env!("OUT_DIR"), "/{file}"))`. Reruns when the variant crate
/// changes. ptxas' report, when a ptxas is found, becomes cargo warnings (spills).
pub fn build_variant_module(kernel_dir: &Path, names: &[&str], file: &str) -> Result<PathBuf, Error> {
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").ok_or_else(|| Error::Ptx("OUT_DIR is not set: call from a build script".into()))?);
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let kernel_dir = manifest.join(kernel_dir);
    for watched in ["src", "Cargo.toml"] {
        println!("cargo:rerun-if-changed={}", kernel_dir.join(watched).display());
    }
    let cfg = BuildConfig::variant(kernel_dir, &out_dir, out_dir.join(file), names);
    let built = build(&cfg)?;
    if let Some(ptxas) = find_ptxas() {
        let (kernels, loose) = run_ptxas(&ptxas, &built.ptx_path)?;
        for problem in report_problems(&kernels, &loose, cfg.exports.kernels().len()) {
            println!("cargo:warning=ptxas: {problem}");
        }
    }
    Ok(built.ptx_path)
}

fn run(cmd: &mut Command) -> Result<std::process::Output, Error> {
    let tool = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd.output().map_err(|err| Error::Spawn { tool: tool.clone(), err })?;
    if !out.status.success() {
        return Err(Error::Tool {
            tool,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(out)
}

/// Directory of the `llvm-tools` binaries of the active toolchain.
fn llvm_tools_dir() -> Result<PathBuf, Error> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = run(Command::new(&rustc).args(["--print", "sysroot"]))?;
    let sysroot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let out = run(Command::new(&rustc).args(["--print", "host-tuple"]))
        .or_else(|_| run(Command::new(&rustc).arg("-vV")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let host = text
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .unwrap_or_else(|| text.trim())
        .to_string();
    let dir = sysroot.join("lib/rustlib").join(host).join("bin");
    if !dir.join("llvm-link").exists() {
        return Err(Error::Ptx(format!(
            "llvm-link not found in {}: install the toolchain's llvm-tools component",
            dir.display()
        )));
    }
    Ok(dir)
}

/// A cargo command for the nvptx build, cleaned of the variables an outer cargo (when
/// called from a build script) sets for its own target.
fn nested_cargo() -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        let outer = (k.starts_with("CARGO_") && k != "CARGO_HOME")
            || matches!(&*k, "RUSTFLAGS" | "RUSTC_WRAPPER" | "RUSTC_WORKSPACE_WRAPPER" | "RUSTDOCFLAGS");
        if outer {
            cmd.env_remove(&*k);
        }
    }
    cmd
}

/// Builds the kernel crate and writes one PTX module; it comes from the cache
/// ([`cache_dir`]) when its inputs have not changed since it was built.
pub fn build(cfg: &BuildConfig) -> Result<Built, Error> {
    let start = Instant::now();
    let cache = match cache_dir() {
        Some(dir) => Some((cache_key(cfg)?, dir)),
        None => None,
    };
    if let Some((key, dir)) = &cache {
        if let Ok(ptx) = std::fs::read_to_string(dir.join(format!("{key}.ptx"))) {
            return write_module(cfg, ptx, start, true);
        }
    }
    let built = build_uncached(cfg, start)?;
    if let Some((key, dir)) = &cache {
        cache_store(dir, key, &built.ptx)?;
    }
    Ok(built)
}

fn build_uncached(cfg: &BuildConfig, start: Instant) -> Result<Built, Error> {
    let tools = llvm_tools_dir()?;
    let out = run(nested_cargo()
        .current_dir(&cfg.kernel_dir)
        .args(["build", "--release", "--target", "nvptx64-nvidia-cuda", "-Zbuild-std=core"])
        .arg("--message-format=json-render-diagnostics")
        .arg("--target-dir")
        .arg(&cfg.target_dir)
        .env("RUSTFLAGS", format!("-C target-cpu={SM} -C llvm-args={UNROLL_THRESHOLD}"))
        // The kernel crate's profile, whichever workspace it builds in (a variant crate
        // may sit in its user's).
        .env("CARGO_PROFILE_RELEASE_PANIC", "abort")
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "3")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false"))?;

    let rlibs = rlib_artifacts(&String::from_utf8_lossy(&out.stdout))?;
    let work = cfg.target_dir.join("link");
    if work.exists() {
        std::fs::remove_dir_all(&work)?;
    }
    std::fs::create_dir_all(&work)?;
    let mut bitcode = Vec::new();
    for (i, rlib) in rlibs.iter().enumerate() {
        let dir = work.join(format!("{i}"));
        std::fs::create_dir_all(&dir)?;
        run(Command::new(tools.join("llvm-ar")).current_dir(&dir).arg("x").arg(rlib))?;
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.extension() == Some(OsStr::new("o")) {
                bitcode.push(path);
            }
        }
    }
    bitcode.sort();

    let linked = work.join("linked.bc");
    run(Command::new(tools.join("llvm-link")).args(&bitcode).arg("-o").arg(&linked))?;
    let exports = cfg.exports.kernels();
    let names: Vec<&str> = exports.iter().map(|(n, _)| n.as_str()).collect();
    let optimized = work.join("opt.bc");
    run(Command::new(tools.join("opt"))
        .arg("-passes=internalize,globaldce,default<O3>")
        .arg(format!("-internalize-public-api-list={}", names.join(",")))
        .arg(UNROLL_THRESHOLD)
        .arg(&linked)
        .arg("-o")
        .arg(&optimized))?;
    let raw_ptx = work.join("raw.ptx");
    run(Command::new(tools.join("llc"))
        .arg(format!("-mcpu={SM}"))
        .arg(format!("-mattr=+{PTX_ISA}"))
        .arg(&optimized)
        .arg("-o")
        .arg(&raw_ptx))?;

    let ptx = finish_ptx(&std::fs::read_to_string(&raw_ptx)?, &exports)?;
    write_module(cfg, ptx, start, false)
}

/// Writes the module to `cfg.out_ptx` (creating its directory).
fn write_module(cfg: &BuildConfig, ptx: String, start: Instant, cached: bool) -> Result<Built, Error> {
    if let Some(dir) = cfg.out_ptx.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&cfg.out_ptx, &ptx)?;
    Ok(Built { ptx_path: cfg.out_ptx.clone(), ptx, elapsed: start.elapsed(), cached })
}

/// The `.rlib` files cargo reported for the kernel crate and its dependencies.
fn rlib_artifacts(json_lines: &str) -> Result<Vec<PathBuf>, Error> {
    let mut rlibs = Vec::new();
    for line in json_lines.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        for f in msg["filenames"].as_array().into_iter().flatten() {
            if let Some(f) = f.as_str().filter(|f| f.ends_with(".rlib")) {
                rlibs.push(PathBuf::from(f));
            }
        }
    }
    if !rlibs.iter().any(|p| p.to_string_lossy().contains("kernels_gpu")) {
        return Err(Error::Ptx("cargo reported no rlib for kernels-gpu".into()));
    }
    Ok(rlibs)
}

/// The module with only the entries whose names `keep` accepts: the text before the first
/// entry (the header and any shared declarations), then each kept `.entry` through its
/// closing brace. Assembling a few kernels this way takes seconds, the module minutes.
pub fn ptx_subset(ptx: &str, keep: impl Fn(&str) -> bool) -> String {
    let mut out = String::new();
    // Some(kept) while inside an entry.
    let mut inside: Option<bool> = None;
    let mut seen_entry = false;
    for line in ptx.split_inclusive('\n') {
        if let Some(rest) = line.trim_start().strip_prefix(".visible .entry ") {
            let name = rest.split(['(', ' ']).next().unwrap_or("");
            inside = Some(keep(name));
            seen_entry = true;
        }
        match inside {
            Some(kept) => {
                if kept {
                    out.push_str(line);
                }
                if line.starts_with('}') {
                    inside = None;
                }
            }
            None if !seen_entry => out.push_str(line),
            None => {}
        }
    }
    out
}

/// Checks that the module exports exactly `exports` (symbol, kernel) and aligns TMA
/// descriptor parameters to [`TMA_PARAM_ALIGN`] bytes.
pub fn finish_ptx(raw: &str, exports: &[(String, KernelEntry)]) -> Result<String, Error> {
    let entries: Vec<&str> = raw
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix(".visible .entry "))
        .map(|l| l.trim_end_matches('(').trim())
        .collect();
    for e in &entries {
        if !exports.iter().any(|(name, _)| name == e) {
            // A variant crate with the library's own entry points.
            let hint = if common::KERNELS.iter().any(|k| k.name == *e) { " (depend on kernels-gpu with default-features = false)" } else { "" };
            return Err(Error::Ptx(format!("kernel {e} is defined but not listed{hint}")));
        }
    }
    for (name, _) in exports {
        if !entries.contains(&name.as_str()) {
            return Err(Error::Ptx(format!("kernel {name} is listed but not defined")));
        }
    }
    let mut ptx = raw.to_string();
    for (name, k) in exports.iter().filter(|(_, k)| k.tma_param_bytes > 0) {
        let tail = format!(" .b8 {name}_param_0[{}]", k.tma_param_bytes);
        let found = [".param .align 8", ".param .align 16"]
            .iter()
            .map(|head| format!("{head}{tail}"))
            .find(|decl| ptx.contains(decl.as_str()));
        let Some(decl) = found else {
            return Err(Error::Ptx(format!("{name}: no TMA descriptor parameter `{tail}` found")));
        };
        // 128 as nvcc emits for a __grid_constant__ CUtensorMap (the TMA unit needs 64).
        ptx = ptx.replace(&decl, &format!(".param .align {TMA_PARAM_ALIGN}{tail}"));
    }
    for (name, k) in exports.iter().filter(|(_, k)| k.launch_bounds > 0) {
        ptx = add_launch_bounds(&ptx, name, k.launch_bounds, k.cluster)?;
    }
    Ok(ptx)
}

/// Alignment given to TMA descriptor parameters.
pub const TMA_PARAM_ALIGN: u32 = 128;

/// Adds `.maxntid threads, 1, 1` and `.minnctapersm 1` after the parameter list of entry
/// `name` (what `__launch_bounds__(threads, 1)` emits): ptxas then knows the register
/// budget at entry, which `setmaxnreg` requires (without it, warning C7508 and no effect).
/// `cluster > 1` also adds `.reqnctapercluster cluster, 1, 1` (a compile-time cluster
/// shape, so an ordinary launch runs the grid in clusters).
fn add_launch_bounds(ptx: &str, name: &str, threads: u32, cluster: u32) -> Result<String, Error> {
    let head = format!(".visible .entry {name}(");
    let start = ptx.find(&head).ok_or_else(|| Error::Ptx(format!("entry {name} not found")))?;
    // The line closing the parameter list (llc may append a `// @name` comment to it).
    let close = ptx[start..]
        .find("\n)")
        .and_then(|i| ptx[start + i + 1..].find('\n').map(|j| start + i + 1 + j + 1))
        .ok_or_else(|| Error::Ptx(format!("entry {name}: end of parameter list not found")))?;
    let cluster = if cluster > 1 { format!(".reqnctapercluster {cluster}, 1, 1\n") } else { String::new() };
    Ok(format!("{}.maxntid {threads}, 1, 1\n.minnctapersm 1\n{cluster}{}", &ptx[..close], &ptx[close..]))
}

/// What `ptxas -v` said about one kernel.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelReport {
    pub name: String,
    pub registers: u32,
    pub stack_frame: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    /// Warnings that name this kernel.
    pub warnings: Vec<String>,
}

impl KernelReport {
    /// No spills, no stack frame, no warning.
    pub fn is_clean(&self) -> bool {
        self.stack_frame == 0 && self.spill_stores == 0 && self.spill_loads == 0 && self.warnings.is_empty()
    }
}

/// Why a `ptxas -v` run ([`run_ptxas`]) is not clean: each kernel with a spill, a stack
/// frame or a warning, each line ptxas printed outside a kernel's report, and a count
/// of kernels other than `expected`. Empty when clean.
pub fn report_problems(kernels: &[KernelReport], loose: &[String], expected: usize) -> Vec<String> {
    let mut problems: Vec<String> = kernels.iter().filter(|k| !k.is_clean()).map(|k| format!("{k:?}")).collect();
    problems.extend(loose.iter().cloned());
    if kernels.len() != expected {
        problems.push(format!("ptxas reported {} kernels, expected {expected}", kernels.len()));
    }
    problems
}

/// Finds `ptxas`: `$FA3_PTXAS`, then `PATH`, then PyPI's `nvidia-cuda-nvcc` wheel in
/// any `site-packages` that `python3` knows.
pub fn find_ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FA3_PTXAS").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    if Command::new("ptxas").arg("--version").output().is_ok_and(|o| o.status.success()) {
        return Some(PathBuf::from("ptxas"));
    }
    let out = Command::new("python3")
        .args(["-c", "import sys; print('\\n'.join(sys.path))"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|dir| {
        ["nvidia/cu13/bin/ptxas", "nvidia/cuda_nvcc/bin/ptxas", "nvidia/cu12/bin/ptxas"]
            .iter()
            .map(|rel| Path::new(dir).join(rel))
            .find(|p| p.exists())
    })
}

/// The ptxas release inside the driver JIT of the lent H100 (driver 580.159.04, CUDA
/// 13.0). The host ships PTX, so this compiler, not the newest ptxas, makes the SASS that
/// runs there; 13.0 has a register-allocation bug that 13.1 fixed (it reused Q's
/// registers for P in one loop shape, see `sass`).
/// `scripts/setup.sh` installs it in `.tools/ptxas-jit`.
pub const JIT_PTXAS_VERSION: &str = "13.0.88";

/// A tool under `.tools/<dir>/nvidia/cu13/bin/` (where `scripts/setup.sh` puts pinned
/// PyPI wheels), unless `env` names one.
fn find_tool(env: &str, dir: &str, tool: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    Some(repo_root().join(".tools").join(dir).join("nvidia/cu13/bin").join(tool)).filter(|p| p.exists())
}

/// The driver JIT's ptxas ([`JIT_PTXAS_VERSION`]): `$FA3_PTXAS_JIT`, else the one
/// `scripts/setup.sh` installed.
pub fn find_jit_ptxas() -> Option<PathBuf> {
    find_tool("FA3_PTXAS_JIT", "ptxas-jit", "ptxas")
}

/// `nvdisasm` (PyPI `nvidia-cuda-nvdisasm`): `$FA3_NVDISASM`, else the one
/// `scripts/setup.sh` installed.
pub fn find_nvdisasm() -> Option<PathBuf> {
    find_tool("FA3_NVDISASM", "nvdisasm", "nvdisasm")
}

/// Assembles `ptx_path` for sm_90a with `ptxas -v` and returns the per-kernel report
/// plus warnings that name no kernel.
pub fn run_ptxas(ptxas: &Path, ptx_path: &Path) -> Result<(Vec<KernelReport>, Vec<String>), Error> {
    let out = run(Command::new(ptxas)
        .arg(format!("-arch={SM}"))
        .arg("-v")
        .arg(ptx_path)
        .arg("-o")
        .arg(ptx_path.with_extension("cubin")))?;
    let text = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    Ok(parse_ptxas_report(&text))
}

fn number_before(line: &str, unit: &str) -> Option<u32> {
    let idx = line.find(unit)?;
    line[..idx].split_whitespace().last()?.parse().ok()
}

/// Parses `ptxas -v` output.
pub fn parse_ptxas_report(text: &str) -> (Vec<KernelReport>, Vec<String>) {
    let mut kernels: Vec<KernelReport> = Vec::new();
    let mut loose = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.split("Function properties for ").nth(1) {
            kernels.push(KernelReport { name: rest.trim().to_string(), ..Default::default() });
        } else if line.contains("bytes stack frame") {
            if let Some(k) = kernels.last_mut() {
                k.stack_frame = number_before(line, "bytes stack frame").unwrap_or(0);
                k.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
                k.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
            }
        } else if line.contains("Used ") && line.contains(" registers") {
            if let Some(k) = kernels.last_mut() {
                k.registers = number_before(line, "registers").unwrap_or(0);
            }
        } else if line.contains("warning")
            || line.contains("Performance Loss")
            || line.contains("wgmma.wait_group is injected")
        {
            // ptxas reports serialized wgmma as an *info* line ("Potential Performance Loss"),
            // and a wait it adds before code that reads a wgmma's registers too early
            // (C7517) as another info line.
            loose.push(line.trim().to_string());
        }
    }
    // Attribute warnings that name a kernel to it.
    loose.retain(|w| {
        match kernels.iter_mut().find(|k| w.contains(&format!("'{}'", k.name))) {
            Some(k) => {
                k.warnings.push(w.clone());
                false
            }
            None => true,
        }
    });
    (kernels, loose)
}

#[cfg(test)]
mod tests {
    #[test]
    fn ptx_subset_keeps_the_header_and_the_chosen_entries_whole() {
        let ptx = ".version 8.7\n.target sm_90a\n\n.visible .entry a(\n.param .u64 p\n)\n{\n  ret;\n}\n\n.visible .entry ab(\n)\n{\n  exit;\n}\n.visible .entry c(\n)\n{\n  ret;\n}\n";
        let sub = super::ptx_subset(ptx, |n| n.starts_with('a'));
        assert_eq!(sub, ".version 8.7\n.target sm_90a\n\n.visible .entry a(\n.param .u64 p\n)\n{\n  ret;\n}\n.visible .entry ab(\n)\n{\n  exit;\n}\n");
        assert_eq!(super::ptx_subset(ptx, |_| false), ".version 8.7\n.target sm_90a\n\n");
    }

    use super::*;

    #[test]
    fn ptxas_report_is_parsed_per_kernel() {
        let text = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'a' for 'sm_90a'\n\
ptxas info    : Function properties for a\n\
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
ptxas info    : Used 168 registers, used 1 barriers, 8 bytes cumulative stack size\n\
ptxas warning : (C7510) Potential Performance Loss: wgmma.mma_async instructions are serialized in 'b'\n\
ptxas info    : Function properties for b\n\
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 90 registers, used 1 barriers\n\
ptxas info    : (C7519) Potential Performance Loss: wgmma.mma_async instructions are serialized due to program dependence on compiler-inserted WG.AR in divergent path in the function 'b' in line 3\n\
ptxas info    : (C7517) wgmma.wait_group is injected in around line 9 by compiler to allow use of registers defined by GMMA in function 'b'\n\
ptxas warning : something global\n";
        let (k, loose) = parse_ptxas_report(text);
        assert_eq!(k.len(), 2);
        assert_eq!((k[0].registers, k[0].stack_frame, k[0].spill_stores, k[0].spill_loads), (168, 8, 4, 12));
        assert!(!k[0].is_clean());
        assert_eq!(k[1].registers, 90);
        assert_eq!(k[1].warnings.len(), 3, "the serialization and injected-wait reports name kernel b");
        assert!(!k[1].is_clean());
        assert_eq!(loose, vec!["ptxas warning : something global".to_string()]);
    }

    /// A PTX skeleton with every listed kernel, TMA parameters as rustc declares them.
    fn skeleton() -> String {
        let mut raw = String::new();
        for k in &common::KERNELS {
            raw += &format!(".visible .entry {}(\n", k.name);
            if k.tma_param_bytes > 0 {
                raw += &format!("\t.param .align 16 .b8 {}_param_0[{}],\n", k.name, k.tma_param_bytes);
            }
            raw += "\t.param .align 8 .b8 p[8]\n)\n{\n\tret;\n}\n";
        }
        raw
    }

    #[test]
    fn finish_ptx_aligns_tma_params_and_adds_launch_bounds() {
        let ptx = finish_ptx(&skeleton(), &Exports::Builtin.kernels()).unwrap();
        for k in common::KERNELS.iter().filter(|k| k.tma_param_bytes > 0) {
            assert!(ptx.contains(&format!(".param .align 128 .b8 {}_param_0[{}]", k.name, k.tma_param_bytes)));
            let entry = &ptx[ptx.find(&format!(".entry {}(", k.name)).unwrap()..];
            let body = &entry[..entry.find('{').unwrap()];
            let cluster = if k.cluster > 1 { format!(".reqnctapercluster {}, 1, 1\n", k.cluster) } else { String::new() };
            assert!(body.ends_with(&format!(")\n.maxntid {}, 1, 1\n.minnctapersm 1\n{cluster}", k.launch_bounds)), "{body}");
        }
    }

    #[test]
    fn variant_modules_export_each_variants_kernels_under_its_name() {
        let exports = Exports::Variants(vec!["a".into(), "b_c".into()]).kernels();
        assert_eq!(exports.len(), 2 * common::variant::KERNELS.len());
        let mut raw = String::new();
        for (name, k) in &exports {
            assert!(name.starts_with("a__") || name.starts_with("b_c__"), "{name}");
            raw += &if k.tma_param_bytes > 0 {
                format!(".visible .entry {name}(\n\t.param .align 16 .b8 {name}_param_0[{}],\n\t.param .align 8 .b8 p[8]\n)\n{{\n\tret;\n}}\n", k.tma_param_bytes)
            } else {
                // The block-mask build kernel: its parameter block alone.
                format!(".visible .entry {name}(\n\t.param .align 8 .b8 {name}_param_0[{}]\n)\n{{\n\tret;\n}}\n", k.params_bytes())
            };
        }
        let ptx = finish_ptx(&raw, &exports).unwrap();
        for (name, k) in &exports {
            let param0 = if k.tma_param_bytes > 0 { format!(".align 128 .b8 {name}_param_0[{}]", k.tma_param_bytes) } else { format!(".align 8 .b8 {name}_param_0[{}]", k.params_bytes()) };
            assert!(ptx.contains(&format!(".param {param0}")), "{name}");
        }
        // The library's own kernels are not a variant module's, and a missing one fails.
        assert!(matches!(finish_ptx(&skeleton(), &exports), Err(Error::Ptx(m)) if m.contains("default-features = false")));
        let (first, _) = &exports[0];
        assert!(finish_ptx(&raw.replace(&format!(".entry {first}("), ".entry other("), &exports).is_err());
    }

    #[test]
    fn finish_ptx_rejects_unlisted_kernels() {
        let raw = skeleton();
        assert!(finish_ptx(&raw, &Exports::Builtin.kernels()).is_ok());
        let extra = raw.clone() + ".visible .entry stray_kernel(\n)\n";
        assert!(matches!(finish_ptx(&extra, &Exports::Builtin.kernels()), Err(Error::Ptx(m)) if m.contains("stray_kernel")));
        let first = common::KERNELS[0].name;
        let missing = raw.replace(&format!(".entry {first}("), ".entry renamed(");
        assert!(finish_ptx(&missing, &Exports::Builtin.kernels()).is_err());
    }
}
