//! The PTX that ships inside the library (built from this tree by `host/build.rs`):
//! it targets sm_90a, exports exactly the listed kernels, cannot panic, and assembles
//! with `ptxas -arch=sm_90a` with no spill, no stack frame and no warning.
//!
//! It is also assembled with the ptxas of the driver JIT that runs it on the lent H100
//! (`ptx_builder::JIT_PTXAS_VERSION`), whose SASS must have no spill either, and in which
//! Q's register fragments must survive (ptxas 13.0 overwrote them in one kernel shape).
//!
//! The ptxas checks need `ptxas` (PyPI `nvidia-cuda-nvcc`, or `FA3_PTXAS`), the JIT's
//! ptxas and `nvdisasm` (`scripts/setup.sh` installs both in `.tools/`); without them a
//! check is reported as ignored with the reason, unless `FA3_REQUIRE_PTXAS=1` (CI).
use flash_attn3::gpu::PTX;
use libtest_mimic::{Arguments, Failed, Trial};
use ptx_builder::sass::{self, Code};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn targets_sm90a_and_exports_every_kernel() -> Result<(), Failed> {
    if !PTX.lines().any(|l| l.trim() == ".target sm_90a") {
        return Err("PTX does not target sm_90a".into());
    }
    for k in &common::KERNELS {
        if !PTX.contains(&format!(".visible .entry {}(", k.name)) {
            return Err(format!("kernel {} missing", k.name).into());
        }
    }
    Ok(())
}

/// The host passes `FwdParams` (forward) or `BwdParams` (backward) by value: its size
/// must be what the PTX declares.
fn param_block_matches_the_host_struct() -> Result<(), Failed> {
    for k in &common::KERNELS {
        let size = k.params_bytes();
        let mut decls = vec![];
        if k.tma_param_bytes == 0 {
            decls.push(format!(".b8 {}_param_0[{size}]", k.name));
        } else {
            // TMA descriptors first, 128-byte aligned (the TMA unit needs 64), then the block.
            decls.push(format!(".param .align 128 .b8 {}_param_0[{}]", k.name, k.tma_param_bytes));
            decls.push(format!(".b8 {}_param_1[{size}]", k.name));
        }
        for decl in decls {
            if !PTX.contains(&decl) {
                return Err(format!("{}: no `{decl}` parameter in the PTX", k.name).into());
            }
        }
    }
    Ok(())
}

/// The FA3 kernels really use Hopper's machinery: each one's PTX has TMA copies,
/// mbarrier waits, WGMMA, named-barrier arrivals, and (when warp-specialized)
/// `setmaxnreg` with the launch bounds that make it take effect, and with pingpong the
/// `bar.arrive` turns.
fn fa3_kernels_use_hopper_instructions() -> Result<(), Failed> {
    for k in common::KERNELS.iter().filter(|k| matches!(k.algo, common::Algo::Fa3(_)) && k.kind == common::KernelKind::Forward) {
        let start = PTX.find(&format!(".entry {}(", k.name)).ok_or("entry missing")?;
        let body = &PTX[start..];
        let body = &body[..body.find("\n}").ok_or("unterminated entry")?];
        let common::Algo::Fa3(t) = k.algo else { unreachable!() };
        let mut needed = vec!["cp.async.bulk.tensor", "mbarrier.try_wait", "wgmma.mma_async", ".maxntid"];
        if t.warp_specialized {
            needed.extend(["setmaxnreg.dec", "setmaxnreg.inc"]);
        }
        // Pingpong's named-barrier turns.
        if t.pingpong {
            needed.push("bar.arrive");
        }
        // Cluster kernels: multicast copies, remote releases, cluster barriers and shape.
        if k.cluster > 1 {
            needed.extend(["multicast::cluster", "mapa.shared::cluster", "barrier.cluster.wait", ".reqnctapercluster"]);
        }
        if let Some(missing) = needed.iter().find(|n| !body.contains(*n)) {
            return Err(format!("{}: no `{missing}` in its PTX", k.name).into());
        }
    }
    Ok(())
}

/// The backward's main kernels use the same machinery: TMA tensor and bulk copies,
/// mbarrier waits, WGMMA (SS with both operands transposed for dQ, RS with a transposed
/// B for dK and dV), `setmaxnreg`, named barriers, and bulk fp32 reductions for dQ.
fn backward_kernels_use_hopper_instructions() -> Result<(), Failed> {
    use common::bwd::BwdStage;
    for k in common::KERNELS.iter() {
        let common::KernelKind::Backward(stage) = k.kind else { continue };
        if !stage.is_main() {
            continue;
        }
        let start = PTX.find(&format!(".entry {}(", k.name)).ok_or("entry missing")?;
        let body = &PTX[start..];
        let body = &body[..body.find("\n}").ok_or("unterminated entry")?];
        let mut needed = vec![
            "cp.async.bulk.tensor",
            "cp.async.bulk.shared::cluster.global",
            "mbarrier.try_wait",
            "wgmma.mma_async",
            "p, 1, 1, 1, 1;",
            "setmaxnreg.dec",
            "setmaxnreg.inc",
            "bar.sync",
            ".maxntid",
        ];
        // dQ: bulk reductions, issued by the writer warp; in deterministic mode after
        // waiting for the turn, completed before handing it on.
        needed.push("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32");
        if stage == BwdStage::MainDeterministic {
            needed.extend(["ld.acquire.gpu", "cp.async.bulk.wait_group 0", "fence.proxy.async.global", "red.release.gpu"]);
        }
        if let Some(missing) = needed.iter().find(|n| !body.contains(*n)) {
            return Err(format!("{}: no `{missing}` in its PTX", k.name).into());
        }
    }
    Ok(())
}

/// Every helper is inlined and nothing can reach a panic (which would need `.func`s of
/// core's panic machinery).
fn kernels_cannot_panic() -> Result<(), Failed> {
    let funcs: Vec<&str> = PTX.lines().filter(|l| l.contains(".func")).collect();
    if !funcs.is_empty() || PTX.contains("panic") {
        return Err(format!("PTX has device functions or panic paths: {funcs:?}").into());
    }
    Ok(())
}

/// `ptx` assembled by one ptxas: the directory holding `kernels.ptx` and
/// `kernels.cubin`, and the `-v` report.
struct Assembly {
    dir: PathBuf,
    kernels: Vec<ptx_builder::KernelReport>,
    loose: Vec<String>,
}

/// This process' directory for the assembly named `tag`.
fn work_dir(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("fa3-ptx-test-{}-{tag}", std::process::id()))
}

/// Writes `ptx` to a fresh directory and assembles it with `ptxas`.
fn assemble(ptxas: &Path, ptx: &str, tag: &str) -> Result<Assembly, Failed> {
    let dir = work_dir(tag);
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("kernels.ptx");
    std::fs::write(&path, ptx)?;
    let (kernels, loose) = ptx_builder::run_ptxas(ptxas, &path)?;
    Ok(Assembly { dir, kernels, loose })
}

/// Which ptxas assembles the shipped PTX.
#[derive(Clone, Copy)]
enum Ptxas {
    Latest,
    DriverJit,
}

impl Ptxas {
    const ALL: [Ptxas; 2] = [Ptxas::Latest, Ptxas::DriverJit];

    /// Names its work directory.
    fn tag(self) -> &'static str {
        match self {
            Ptxas::Latest => "latest",
            Ptxas::DriverJit => "jit",
        }
    }
}

/// The shipped PTX assembled by `ptxas`, once per ptxas for all the trials that read it
/// (the JIT's report and its SASS come from one run); `main` removes the directories.
fn shipped(ptxas: &Path, which: Ptxas) -> Result<&'static Assembly, Failed> {
    static LATEST: OnceLock<Result<Assembly, String>> = OnceLock::new();
    static JIT: OnceLock<Result<Assembly, String>> = OnceLock::new();
    let cell = match which {
        Ptxas::Latest => &LATEST,
        Ptxas::DriverJit => &JIT,
    };
    let a = cell.get_or_init(|| assemble(ptxas, PTX, which.tag()).map_err(|e| format!("{e:?}")));
    a.as_ref().map_err(|e| e.clone().into())
}

/// Removes what [`shipped`] assembled.
fn remove_shipped() {
    for which in Ptxas::ALL {
        std::fs::remove_dir_all(work_dir(which.tag())).ok();
    }
}

fn assembles_without_spills(ptxas: PathBuf, which: Ptxas) -> Result<(), Failed> {
    let a = shipped(&ptxas, which)?;
    for k in &a.kernels {
        println!("    {:<28} {:>3} registers, {} B stack, {} B spilled", k.name, k.registers, k.stack_frame, k.spill_stores);
    }
    let problems = ptx_builder::report_problems(&a.kernels, &a.loose, common::KERNELS.len());
    if problems.is_empty() { Ok(()) } else { Err(problems.join("\n").into()) }
}

/// Each kernel's instructions in a cubin.
fn sass_of(nvdisasm: &Path, a: &Assembly) -> Result<Vec<(String, Code)>, Failed> {
    Ok(sass::disassemble(nvdisasm, &a.dir.join("kernels.cubin"))?)
}

/// In the SASS the driver's JIT makes, no write but an `ldmatrix` load reaches the A
/// operand of a QK^T `HGMMA` in any FA3 kernel, and the kernels that keep Q in registers
/// (`common::fa3::q_in_registers`) do load it (8 `LDSM`: the check is not vacuous).
fn q_fragments_survive_the_driver_jit(ptxas: PathBuf, nvdisasm: PathBuf) -> Result<(), Failed> {
    let code = sass_of(&nvdisasm, shipped(&ptxas, Ptxas::DriverJit)?)?;
    let mut problems = Vec::new();
    for k in common::KERNELS.iter().filter(|k| matches!(k.algo, common::Algo::Fa3(_)) && k.kind == common::KernelKind::Forward) {
        let Some((_, kernel)) = code.iter().find(|(n, _)| n == k.name) else {
            problems.push(format!("{}: not in the SASS", k.name));
            continue;
        };
        let violations = sass::q_operand_violations(kernel);
        if !violations.is_empty() {
            let shown = &violations[..violations.len().min(3)];
            problems.push(format!("{}: {} non-ldmatrix writes reach QK^T's A operand, e.g. {shown:?}", k.name, violations.len()));
        }
        let loads = sass::ldsm_count(kernel);
        let expected = if common::fa3::q_in_registers(k.hdim) { 8 } else { 0 };
        if loads != expected {
            problems.push(format!("{}: {loads} LDSM, expected {expected}", k.name));
        }
        println!("    {:<32} {loads} LDSM, {} other writes reaching QK^T", k.name, violations.len());
    }
    if problems.is_empty() { Ok(()) } else { Err(problems.join("\n").into()) }
}

/// The multicast kernels release their peer's K/V slots with remote mbarrier arrivals in
/// the mainloop; with `.release.cluster` each came with a GPU-wide `MEMBAR` (and error
/// barriers), which cost 30-58%. Only the two cluster barriers,
/// after init and before exit, may fence the whole GPU, and the remote arrivals are there
/// (so the check is not vacuous).
fn multicast_releases_carry_no_gpu_wide_fence(ptxas: PathBuf, nvdisasm: PathBuf) -> Result<(), Failed> {
    let code = sass_of(&nvdisasm, shipped(&ptxas, Ptxas::DriverJit)?)?;
    let mut problems = Vec::new();
    let mut kernels = 0;
    for k in common::KERNELS.iter().filter(|k| k.cluster > 1) {
        kernels += 1;
        let Some((_, kernel)) = code.iter().find(|(n, _)| n == k.name) else {
            problems.push(format!("{}: not in the SASS", k.name));
            continue;
        };
        let fences = sass::opcode_count(kernel, "MEMBAR.ALL.GPU");
        let remote = sass::opcode_count(kernel, "SYNCS.ARRIVE.TRANS64.RED");
        println!("    {:<32} {fences} MEMBAR.ALL.GPU, {remote} remote arrivals", k.name);
        if fences > 2 {
            problems.push(format!("{}: {fences} GPU-wide fences, at most 2 expected", k.name));
        }
        if remote == 0 {
            problems.push(format!("{}: no remote mbarrier arrival found", k.name));
        }
    }
    if kernels == 0 {
        problems.push("no multicast kernel".into());
    }
    if problems.is_empty() { Ok(()) } else { Err(problems.join("\n").into()) }
}

/// The check above can fail: on a kernel where ptxas 13.0 does overwrite the fragments
/// (it put P in Q's registers), it reports the writes. If this stops failing, the
/// pinned JIT ptxas no longer has the bug and the fixture no longer proves the check.
fn the_q_check_catches_ptxas_13_0s_clobber(ptxas: PathBuf, nvdisasm: PathBuf) -> Result<(), Failed> {
    let fixture = include_str!("../fixtures/ptxas13_0_clobbers_q.ptx");
    let fixture = assemble(&ptxas, fixture, "fixture")?;
    let code = sass_of(&nvdisasm, &fixture);
    std::fs::remove_dir_all(&fixture.dir).ok();
    let code = code?;
    let violations: Vec<String> = code.iter().flat_map(|(_, k)| sass::q_operand_violations(k)).collect();
    println!("    fixture: {} non-ldmatrix writes reach QK^T's A operand, e.g. {:?}", violations.len(), violations.first());
    if violations.is_empty() { Err("no clobber found in the fixture".into()) } else { Ok(()) }
}

/// A trial that needs the tools `found` (named in `missing` when not): ignored with the
/// reason, or failed when `FA3_REQUIRE_PTXAS=1` (CI).
fn tool_trial<T: Send + 'static>(
    name: &'static str,
    found: Option<T>,
    missing: &'static str,
    test: impl FnOnce(T) -> Result<(), Failed> + Send + 'static,
) -> Trial {
    let require = std::env::var("FA3_REQUIRE_PTXAS").is_ok_and(|v| v == "1");
    match found {
        Some(t) => Trial::test(name, move || test(t)),
        None if require => Trial::test(name, move || Err(format!("FA3_REQUIRE_PTXAS=1 but {missing}").into())),
        None => {
            println!("{name} SKIPPED (reported as ignored): {missing}");
            Trial::test(name, || Ok(())).with_ignored_flag(true)
        }
    }
}

fn main() {
    let args = Arguments::from_args();
    let jit = ptx_builder::JIT_PTXAS_VERSION;
    let jit_tools = ptx_builder::find_jit_ptxas().zip(ptx_builder::find_nvdisasm());
    let trials = vec![
        Trial::test("targets_sm90a_and_exports_every_kernel", targets_sm90a_and_exports_every_kernel),
        Trial::test("kernels_cannot_panic", kernels_cannot_panic),
        Trial::test("param_block_matches_the_host_struct", param_block_matches_the_host_struct),
        Trial::test("fa3_kernels_use_hopper_instructions", fa3_kernels_use_hopper_instructions),
        Trial::test("backward_kernels_use_hopper_instructions", backward_kernels_use_hopper_instructions),
        tool_trial(
            "assembles_for_sm90a_without_spills_or_stack",
            ptx_builder::find_ptxas(),
            "ptxas not found (pip install nvidia-cuda-nvcc, or set FA3_PTXAS)",
            |p| assembles_without_spills(p, Ptxas::Latest),
        ),
        tool_trial(
            "assembles_with_the_driver_jit_ptxas_without_spills_or_stack",
            ptx_builder::find_jit_ptxas(),
            "the driver JIT's ptxas is not installed (scripts/setup.sh, or set FA3_PTXAS_JIT)",
            |p| assembles_without_spills(p, Ptxas::DriverJit),
        ),
        tool_trial(
            "q_fragments_survive_the_driver_jit_ptxas",
            jit_tools.clone(),
            "the driver JIT's ptxas or nvdisasm is not installed (scripts/setup.sh)",
            |(p, d)| q_fragments_survive_the_driver_jit(p, d),
        ),
        tool_trial(
            "multicast_releases_carry_no_gpu_wide_fence",
            jit_tools.clone(),
            "the driver JIT's ptxas or nvdisasm is not installed (scripts/setup.sh)",
            |(p, d)| multicast_releases_carry_no_gpu_wide_fence(p, d),
        ),
        tool_trial(
            "the_q_check_catches_ptxas_13_0s_clobber",
            jit_tools,
            "the driver JIT's ptxas or nvdisasm is not installed (scripts/setup.sh)",
            |(p, d)| the_q_check_catches_ptxas_13_0s_clobber(p, d),
        ),
    ];
    println!("driver JIT ptxas: {jit} ({:?})", ptx_builder::find_jit_ptxas());
    let conclusion = libtest_mimic::run(&args, trials);
    remove_shipped();
    conclusion.exit();
}
