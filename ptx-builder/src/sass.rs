//! Reading the SASS that `ptxas` makes of the kernels (`nvdisasm -c` on the cubin), for
//! properties of the machine code that the PTX cannot show.
//!
//! The one checked today: Q's fragments stay intact. At hdim 128 the consumers load Q
//! with `ldmatrix` (`LDSM`) once per tile and feed it to every QK^T `HGMMA` of the tile,
//! so no other write may reach those `HGMMA`s. ptxas 13.0, the driver JIT of the lent
//! H100, broke this in one kernel shape: it put P in Q's registers.
use std::path::Path;
use std::process::Command;

use crate::{Error, run};

/// One instruction: opcode with its modifiers, and the operands as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instr {
    pub opcode: String,
    pub operands: Vec<String>,
    /// Under a predicate (`@P0`, `@!P1`...): it may not execute.
    pub guarded: bool,
    /// Branch targets (labels), for `BRA` and `BRXU`.
    pub targets: Vec<String>,
    /// The line without its address, guard and trailing `;`.
    pub text: String,
}

/// A kernel's instructions, with the index each label names.
#[derive(Clone, Debug, Default)]
pub struct Code {
    pub instrs: Vec<Instr>,
    pub labels: std::collections::HashMap<String, usize>,
}

/// Disassembles every kernel of `cubin` with `nvdisasm -c`.
pub fn disassemble(nvdisasm: &Path, cubin: &Path) -> Result<Vec<(String, Code)>, Error> {
    let out = run(Command::new(nvdisasm).arg("-c").arg(cubin))?;
    Ok(functions(&String::from_utf8_lossy(&out.stdout)))
}

/// Splits `nvdisasm -c` output into kernels (`.text.NAME:` labels) and their code.
pub fn functions(text: &str) -> Vec<(String, Code)> {
    let mut fns: Vec<(String, Code)> = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if let Some(name) = t.strip_prefix(".text.").and_then(|r| r.strip_suffix(':')) {
            fns.push((name.to_string(), Code::default()));
        } else if let Some((_, code)) = fns.last_mut() {
            if let Some(label) = t.strip_suffix(':').filter(|l| l.starts_with(".L")) {
                code.labels.insert(label.to_string(), code.instrs.len());
            } else if let Some(i) = parse_instr(t) {
                code.instrs.push(i);
            }
        }
    }
    fns
}

/// `/*0340*/  @!P0 OPCODE a, b, c ;` → the instruction.
fn parse_instr(line: &str) -> Option<Instr> {
    let rest = line.strip_prefix("/*")?;
    let (addr, rest) = rest.split_once("*/")?;
    if !addr.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let body = rest.split_once(';').map_or(rest, |(b, _)| b);
    // `BRXU UR8 -0x27d0 (*"BRANCH_TARGETS .L_x_1,.L_x_2"*) ;`: the list is not an operand.
    let (body, branch_targets) = body.split_once("(*\"BRANCH_TARGETS ").unwrap_or((body, ""));
    let body = body.trim();
    let (guarded, body) = match body.strip_prefix('@') {
        Some(g) => (true, g.split_once(char::is_whitespace)?.1.trim()),
        None => (false, body),
    };
    let (opcode, ops) = body.split_once(char::is_whitespace).unwrap_or((body, ""));
    if opcode.is_empty() {
        return None;
    }
    let operands: Vec<String> = ops.split(',').map(|o| o.trim().to_string()).filter(|o| !o.is_empty()).collect();
    // `BRA `(.L_x_12)`.
    let mut targets: Vec<String> =
        operands.iter().filter_map(|o| o.strip_prefix("`(")?.strip_suffix(')').map(str::to_string)).collect();
    let list = branch_targets.split('"').next().unwrap_or("");
    targets.extend(list.split(',').map(str::trim).filter(|l| !l.is_empty()).map(str::to_string));
    Some(Instr { opcode: opcode.to_string(), operands, guarded, targets, text: body.to_string() })
}

impl Code {
    /// Where control can go after instruction `i`.
    fn successors(&self, i: usize) -> Vec<usize> {
        let ins = &self.instrs[i];
        let op = ins.opcode.split('.').next().unwrap_or("");
        let mut next: Vec<usize> = ins.targets.iter().filter_map(|l| self.labels.get(l).copied()).collect();
        let falls_through = match op {
            "EXIT" | "BRA" | "BRX" | "BRXU" | "JMP" | "JMX" | "RET" => ins.guarded,
            _ => true,
        };
        if falls_through && i + 1 < self.instrs.len() {
            next.push(i + 1);
        }
        next
    }
}

fn gpr(op: &str) -> Option<u32> {
    op.strip_prefix('R')?.split(['.', ' ']).next()?.parse().ok()
}

fn is_predicate(op: &str) -> bool {
    op == "PT" || op.strip_prefix('P').is_some_and(|n| n.parse::<u32>().is_ok())
}

/// The general registers `i` writes, as `first..first + count`. A heuristic, not an ISA
/// table: the destination is the first operand, or the second after a predicate
/// (`SHFL`, `ATOMG`, the compares), with the widths of the wide forms used
/// in these kernels (`tests` below; HMMA and f64 forms are not). Instructions whose first
/// register is read (stores, barriers) write none.
pub fn written(i: &Instr) -> Option<std::ops::Range<u32>> {
    const READS_FIRST: [&str; 16] = [
        "ST", "STS", "STG", "STL", "STSM", "RED", "REDG", "REDAS", "BAR", "WARPSYNC", "NANOSLEEP", "BRX", "BRXU", "JMX",
        "RET", "CALL",
    ];
    if READS_FIRST.contains(&i.opcode.split('.').next().unwrap_or("")) {
        return None;
    }
    let mut ops = i.operands.iter();
    let mut first = ops.next()?;
    if is_predicate(first) {
        first = ops.next()?;
    }
    let base = gpr(first)?;
    let op = i.opcode.as_str();
    let count = if let Some(shape) = op.strip_prefix("HGMMA.") {
        // HGMMA.64xNx16.F32: N/2 f32 accumulators per thread (N/4 registers for f16).
        let n: u32 = shape.split('x').nth(1).and_then(|n| n.parse().ok()).unwrap_or(256);
        if op.contains(".F32") { n / 2 } else { n / 4 }
    } else if op.starts_with("LDSM") {
        // LDSM.16.M88.4 / .2; a single matrix has no count.
        op.rsplit('.').next().and_then(|n| n.parse().ok()).unwrap_or(1)
    } else if op.contains(".128") {
        4
    } else if op.contains(".64") || op == "CS2R" || op.contains(".WIDE") {
        2
    } else {
        1
    };
    Some(base..base + count)
}

/// Where an `HGMMA` with a register A operand and a K-major B (no `.tnspB`: in these
/// kernels QK^T, whose A is Q) can read an A register that something other than an
/// `LDSM` wrote: for each such write, the `HGMMA` and the writer. The writes are those
/// that reach the `HGMMA` along some path of the control-flow graph (reaching
/// definitions), so Q's registers may be reused where Q is dead (after a tile's last
/// QK^T, before the next tile's `LDSM`), but not across a loop back to a QK^T. Only the
/// `HGMMA`s whose A registers an `LDSM` writes somewhere are Q's: ALiBi's key-offset
/// k-step (`common::fa3::key_offsets`) also has a register A and a K-major B, from
/// registers the kernel computes.
pub fn q_operand_violations(code: &Code) -> Vec<String> {
    let loaded: std::collections::BTreeSet<u32> =
        code.instrs.iter().filter(|i| i.opcode.starts_with("LDSM")).filter_map(written).flatten().collect();
    let a_regs = |i: &Instr| -> Option<std::ops::Range<u32>> {
        if !i.opcode.starts_with("HGMMA") || i.text.contains("tnspB") {
            return None;
        }
        let a = gpr(i.operands.get(1)?)?;
        (a..a + 4).any(|r| loaded.contains(&r)).then_some(a..a + 4)
    };
    // The registers to follow: every QK^T A operand.
    let tracked: Vec<u32> = {
        let mut t: Vec<u32> = code.instrs.iter().filter_map(a_regs).flatten().collect();
        t.sort_unstable();
        t.dedup();
        t
    };
    if tracked.is_empty() {
        return Vec::new();
    }
    let slot = |r: u32| tracked.binary_search(&r).ok();
    type Defs = Vec<std::collections::BTreeSet<usize>>;
    // Transfer: an unguarded write replaces a register's definitions, a guarded one adds.
    let transfer = |i: usize, defs: &mut Defs| {
        if let Some(w) = written(&code.instrs[i]) {
            for r in w {
                if let Some(k) = slot(r) {
                    if !code.instrs[i].guarded {
                        defs[k].clear();
                    }
                    defs[k].insert(i);
                }
            }
        }
    };
    let n = code.instrs.len();
    let succs: Vec<Vec<usize>> = (0..n).map(|i| code.successors(i)).collect();
    let mut preds = vec![Vec::new(); n];
    for (i, next) in succs.iter().enumerate() {
        for &j in next {
            preds[j].push(i);
        }
    }
    let empty: Defs = vec![Default::default(); tracked.len()];
    // The definitions reaching instruction `i`: the union over its predecessors.
    let reaching = |i: usize, out: &[Defs]| -> Defs {
        let mut defs = empty.clone();
        for &p in &preds[i] {
            for (d, o) in defs.iter_mut().zip(&out[p]) {
                d.extend(o);
            }
        }
        defs
    };
    let mut out: Vec<Defs> = vec![empty.clone(); n];
    let mut work: std::collections::VecDeque<usize> = (0..n).collect();
    let mut queued = vec![true; n];
    while let Some(i) = work.pop_front() {
        queued[i] = false;
        let mut defs = reaching(i, &out);
        transfer(i, &mut defs);
        if defs != out[i] {
            out[i] = defs;
            for &j in &succs[i] {
                if !queued[j] {
                    queued[j] = true;
                    work.push_back(j);
                }
            }
        }
    }
    let mut found = Vec::new();
    for (i, ins) in code.instrs.iter().enumerate() {
        let Some(a) = a_regs(ins) else { continue };
        let defs = reaching(i, &out);
        for r in a {
            for &d in &defs[slot(r).expect("tracked")] {
                if !code.instrs[d].opcode.starts_with("LDSM") {
                    found.push(format!("{} reads R{r} written by {}", ins.text, code.instrs[d].text));
                }
            }
        }
    }
    found
}

/// How many `LDSM` instructions `code` has.
pub fn ldsm_count(code: &Code) -> usize {
    opcode_count(code, "LDSM")
}

/// Instructions whose opcode (with its modifiers) starts with `prefix`.
pub fn opcode_count(code: &Code, prefix: &str) -> usize {
    code.instrs.iter().filter(|i| i.opcode.starts_with(prefix)).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SNIPPET: &str = "\
\t.section\t.text.k,\"ax\",@progbits
.text.k:
        /*0260*/                   LDSM.16.M88.4 R152, [R2] ;
        /*0270*/                   CS2R R150, SRZ ;
        /*0280*/              @!P0 SHFL.BFLY PT, R27, R186, 0x1, 0x1f ;
        /*0290*/                   BAR.SYNC.DEFER_BLOCKING R153, 0x100 ;
        /*02a0*/                   STS.128 [R153], R4 ;
        /*0310*/                   HGMMA.64x128x16.F32 R24, R152, gdesc[UR8], RZ, !UPT ;
        /*03f0*/                   MUFU.EX2 R155, R2 ;
        /*0400*/                   ISETP.GE.AND P0, PT, R154, R3, PT ;
        /*0410*/                   LDS.64 R150, [R3] ;
        /*0420*/                   REDUX.SUM R152, R3 ;
";

    /// QK^T in a loop, after the `LDSM`s; `between` goes after the QK^T inside the loop,
    /// `after` after the loop but before the outer loop reloads Q.
    fn looped(between: &str, after: &str) -> String {
        format!(
            ".text.k:
.L_x_0:
        /*0000*/                   LDSM.16.M88.4 R152, [R2] ;
.L_x_1:
        /*0010*/                   HGMMA.64x128x16.F32 R24, R152, gdesc[UR8], RZ, !UPT ;
        /*0020*/                   {between} ;
        /*0030*/                   HGMMA.64x128x16.F32 R88, R152, gdesc[UR10].tnspB, R88 ;
        /*0040*/               @P0 BRA `(.L_x_1) ;
        /*0050*/                   {after} ;
        /*0060*/               @P1 BRA `(.L_x_0) ;
        /*0070*/                   EXIT ;
"
        )
    }

    #[test]
    fn instructions_are_split_per_kernel_with_operands_guards_and_targets() {
        let f = functions(SNIPPET);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].0, "k");
        assert_eq!(f[0].1.instrs.len(), 10);
        let shfl = &f[0].1.instrs[2];
        assert_eq!((shfl.opcode.as_str(), shfl.guarded), ("SHFL.BFLY", true));
        assert_eq!(shfl.operands, ["PT", "R27", "R186", "0x1", "0x1f"]);
        let code = &functions(&looped("NOP", "NOP"))[0].1;
        assert_eq!(code.instrs[4].targets, [".L_x_1"]);
        assert_eq!((code.labels[".L_x_0"], code.labels[".L_x_1"]), (0, 1));
        assert_eq!(code.successors(4), [1, 5], "a guarded branch also falls through");
        assert_eq!(code.successors(7), Vec::<usize>::new(), "EXIT");
        let brx = parse_instr("/*27c0*/  BRXU UR8 -0x27d0  (*\"BRANCH_TARGETS .L_x_246,.L_x_1298\"*);").unwrap();
        assert_eq!(brx.targets, [".L_x_246", ".L_x_1298"]);
    }

    #[test]
    fn written_registers_follow_the_destination_and_its_width() {
        let f = functions(SNIPPET);
        let w: Vec<_> = f[0].1.instrs.iter().map(written).collect();
        assert_eq!(w[0], Some(152..156));
        assert_eq!(w[1], Some(150..152));
        assert_eq!(w[2], Some(27..28), "after a predicate, the second operand");
        assert_eq!(w[3], None, "a barrier reads its register");
        assert_eq!(w[4], None, "a store writes memory");
        assert_eq!(w[5], Some(24..88), "64 f32 accumulators");
        assert_eq!(w[7], None, "predicate destinations only");
        assert_eq!(w[8], Some(150..152));
        assert_eq!(w[9], Some(152..153), "REDUX writes a register, unlike RED");
    }

    #[test]
    fn a_write_that_reaches_the_qk_gemm_around_the_loop_is_reported() {
        let bad = looped("MUFU.EX2 R155, R2", "NOP");
        let v = q_operand_violations(&functions(&bad)[0].1);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("reads R155 written by MUFU.EX2 R155, R2"), "{v:?}");
    }

    #[test]
    fn reuse_where_q_is_dead_and_reads_by_other_gemms_are_not_reported() {
        // After the key-block loop Q is dead until the outer loop's LDSM reloads it; the
        // PV GEMM (.tnspB) reading other values from those registers is not QK^T.
        let ok = looped("NOP", "MUFU.EX2 R155, R2");
        assert_eq!(q_operand_violations(&functions(&ok)[0].1), Vec::<String>::new());
        // A guarded write inside the loop may happen: reported.
        let maybe = looped("@P2 MUFU.EX2 R155, R2", "NOP");
        assert_eq!(q_operand_violations(&functions(&maybe)[0].1).len(), 1);
        assert_eq!(ldsm_count(&functions(&ok)[0].1), 1);
    }

    #[test]
    fn a_register_operand_that_no_ldsm_loads_is_not_q() {
        // ALiBi's key-offset k-step: its A registers come from ordinary moves, and no
        // LDSM ever writes them.
        let keys = looped("MOV R160, R2 ;\n        /*0028*/                   HGMMA.64x128x16.F32 R24, R160, gdesc[UR12], R24", "NOP");
        let code = &functions(&keys)[0].1;
        assert_eq!(code.instrs.iter().filter(|i| i.opcode.starts_with("HGMMA")).count(), 3);
        assert_eq!(q_operand_violations(code), Vec::<String>::new());
        // The same move into one of Q's registers is still reported.
        let clobber = keys.replace("MOV R160, R2", "MOV R153, R2");
        assert_eq!(q_operand_violations(&functions(&clobber)[0].1).len(), 1);
        // Without any LDSM (Q in shared memory) no register operand is Q's.
        let ss = looped("NOP", "NOP").replace("LDSM.16.M88.4 R152, [R2]", "NOP");
        assert_eq!(q_operand_violations(&functions(&ss)[0].1), Vec::<String>::new());
    }
}
