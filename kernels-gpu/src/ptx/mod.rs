//! Thin typed wrappers around PTX instructions: the only place in the kernel crate
//! where assembly text lives. Each submodule covers one instruction family; algorithm
//! code calls these and never writes `asm!` itself.
//!
//! Conventions: shared-memory addresses are 32-bit `.shared::cta` window offsets
//! ([`smem::SmemAddr`]); global addresses are 64-bit generic addresses.

pub mod barrier;
pub mod cluster;
pub mod compiler;
pub mod fence;
pub mod global;
pub mod math;
pub mod mbarrier;
pub mod mma;
pub mod regs;
pub mod smem;
pub mod sreg;
pub mod tma;
pub mod wgmma;
