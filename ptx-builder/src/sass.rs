//! Reading the SASS that `ptxas` makes of the kernels (`nvdisasm -c` on the cubin), for
//! properties of the machine code that the PTX cannot show.
//!
//! The one checked today: Q's fragments stay intact. At hdim 128 the consumers load Q
//! with `ldmatrix` (`LDSM`) once per tile and feed it to every QK^T `HGMMA` of the tile,
//! so nothing else may write those registers. ptxas 13.0, the driver JIT of the lent
//! H100, broke this in one kernel shape (docs/perf.md item 49).
use std::path::Path;
use std::process::Command;

use crate::{Error, run};

/// One instruction: opcode with its modifiers, and the operands as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instr {
    pub opcode: String,
    pub operands: Vec<String>,
    /// The line without its address and trailing `;`.
    pub text: String,
}

/// Disassembles every kernel of `cubin` with `nvdisasm -c`.
pub fn disassemble(nvdisasm: &Path, cubin: &Path) -> Result<Vec<(String, Vec<Instr>)>, Error> {
    let out = run(Command::new(nvdisasm).arg("-c").arg(cubin))?;
    Ok(functions(&String::from_utf8_lossy(&out.stdout)))
}

/// Splits `nvdisasm -c` output into kernels (`.text.NAME:` labels) and their instructions.
pub fn functions(text: &str) -> Vec<(String, Vec<Instr>)> {
    let mut fns: Vec<(String, Vec<Instr>)> = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if let Some(name) = t.strip_prefix(".text.").and_then(|r| r.strip_suffix(':')) {
            fns.push((name.to_string(), Vec::new()));
        } else if let (Some(i), Some((_, f))) = (parse_instr(t), fns.last_mut()) {
            f.push(i);
        }
    }
    fns
}

/// `/*0340*/  @!P0 OPCODE a, b, c ;` → the instruction (predicate guard dropped).
fn parse_instr(line: &str) -> Option<Instr> {
    let rest = line.strip_prefix("/*")?;
    let (addr, rest) = rest.split_once("*/")?;
    if !addr.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let body = rest.trim().split(';').next()?.trim();
    let body = match body.strip_prefix('@') {
        Some(guarded) => guarded.split_once(char::is_whitespace)?.1.trim(),
        None => body,
    };
    let (opcode, ops) = body.split_once(char::is_whitespace).unwrap_or((body, ""));
    if opcode.is_empty() {
        return None;
    }
    let operands = ops.split(',').map(|o| o.trim().to_string()).filter(|o| !o.is_empty()).collect();
    Some(Instr { opcode: opcode.to_string(), operands, text: body.to_string() })
}

fn gpr(op: &str) -> Option<u32> {
    op.strip_prefix('R')?.split(['.', ' ']).next()?.parse().ok()
}

fn is_predicate(op: &str) -> bool {
    op == "PT" || op.strip_prefix('P').is_some_and(|n| n.parse::<u32>().is_ok())
}

/// The general registers `i` writes, as `first..first + count`. A heuristic, not an ISA
/// table: the destination is the first operand, or the second after a predicate
/// (`SHFL`, `ATOM*`, `IADD3`'s carry-out...), with the widths of the wide forms used
/// here. Instructions whose first register is read (stores, barriers) write none.
pub fn written(i: &Instr) -> Option<std::ops::Range<u32>> {
    const READS_FIRST: [&str; 9] = ["ST", "RED", "BAR", "WARPSYNC", "NANOSLEEP", "BRX", "JMX", "RET", "CALL"];
    if READS_FIRST.iter().any(|p| i.opcode.starts_with(p)) {
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
        op.rsplit('.').next().and_then(|n| n.parse().ok()).unwrap_or(4)
    } else if op.contains(".128") {
        4
    } else if op.contains(".64") || op.starts_with("CS2R") || op.contains(".WIDE") {
        2
    } else {
        1
    };
    Some(base..base + count)
}

/// The instructions other than `LDSM` that write a register some `LDSM` of `code`
/// loaded: for the FA3 consumers, anything that overwrites Q's fragments.
pub fn ldsm_fragment_clobbers(code: &[Instr]) -> Vec<String> {
    let loaded: Vec<std::ops::Range<u32>> =
        code.iter().filter(|i| i.opcode.starts_with("LDSM")).filter_map(written).collect();
    code.iter()
        .filter(|i| !i.opcode.starts_with("LDSM"))
        .filter(|i| written(i).is_some_and(|w| loaded.iter().any(|q| w.start < q.end && q.start < w.end)))
        .map(|i| i.text.clone())
        .collect()
}

/// How many `LDSM` instructions `code` has.
pub fn ldsm_count(code: &[Instr]) -> usize {
    code.iter().filter(|i| i.opcode.starts_with("LDSM")).count()
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
";

    #[test]
    fn instructions_are_split_per_kernel_with_their_operands() {
        let f = functions(SNIPPET);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].0, "k");
        assert_eq!(f[0].1.len(), 9);
        assert_eq!(f[0].1[2].opcode, "SHFL.BFLY");
        assert_eq!(f[0].1[2].operands, ["PT", "R27", "R186", "0x1", "0x1f"]);
    }

    #[test]
    fn written_registers_follow_the_destination_and_its_width() {
        let f = functions(SNIPPET);
        let w: Vec<_> = f[0].1.iter().map(written).collect();
        assert_eq!(w[0], Some(152..156));
        assert_eq!(w[1], Some(150..152));
        assert_eq!(w[2], Some(27..28), "after a predicate, the second operand");
        assert_eq!(w[3], None, "a barrier reads its register");
        assert_eq!(w[4], None, "a store writes memory");
        assert_eq!(w[5], Some(24..88), "64 f32 accumulators");
        assert_eq!(w[7], None, "predicate destinations only");
        assert_eq!(w[8], Some(150..152));
    }

    #[test]
    fn a_write_into_loaded_fragments_is_reported_and_reads_are_not() {
        let f = functions(SNIPPET);
        // MUFU writes R155 (inside R152..R156), LDS.64 R150 writes R150-R151 (outside);
        // the HGMMA, the barrier and the compare only read R152-R154.
        assert_eq!(ldsm_fragment_clobbers(&f[0].1), ["MUFU.EX2 R155, R2"]);
        assert_eq!(ldsm_count(&f[0].1), 1);
    }
}
