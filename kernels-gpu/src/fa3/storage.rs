//! The kernel's shared memory as typed views (FA3's `SharedStorage`): the layout is
//! computed once on the host side of `common` ([`common::fa3::SmemLayout`], checked
//! against the 227 KB limit at compile time here and in a CPU test), and the kernel
//! reaches each buffer and barrier array through these fields, never through offsets.
use super::pipeline::TmaPipeline;
use super::traits::KernelTraits;
use crate::ptx::compiler::opaque_u64;
use crate::element::Element;
use crate::ptx::fence;
use crate::ptx::smem::{self, SmemAddr, align_up, dynamic_smem_base};
use common::gmma::k_major_plain_offset;
use crate::ptx::tma::TensorMap;
use common::fa3::{DescriptorSlot, KV_STAGES, MAX_SMEM, SMEM_ALIGN, TILE_HANDOFF_STAGES};

#[derive(Clone, Copy)]
pub struct SharedStorage {
    /// Q of the current tile (one slot) and its full/empty barriers.
    pub q: TmaPipeline<1>,
    /// The K and V rings.
    pub k: TmaPipeline<KV_STAGES>,
    pub v: TmaPipeline<KV_STAGES>,
    /// The raw V ring of the kernels that transpose V (`super::transpose`); unused
    /// elsewhere (no stage in the layout).
    pub v_raw: TmaPipeline<KV_STAGES>,
    /// O's staging tile for the TMA store (Q's buffer when `o_shares_q`).
    pub o: SmemAddr,
    pub o_shares_q: bool,
    /// The producer-to-consumer tile handoff.
    pub tile_handoff: TmaPipeline<TILE_HANDOFF_STAGES>,
    /// The key-offset tile (`KernelConfig::key_offsets`; nothing there elsewhere).
    pub key_offsets: SmemAddr,
}

impl SharedStorage {
    /// The storage of kernel `K`. `peer`: the cluster peer whose producer also fills the
    /// K/V rings (multicast).
    #[inline(always)]
    pub fn new<K: KernelTraits>(peer: Option<u32>) -> Self {
        const { assert!(K::SMEM.total <= MAX_SMEM) };
        let layout = K::SMEM;
        let base = align_up(dynamic_smem_base(), SMEM_ALIGN);
        SharedStorage {
            q: TmaPipeline::at(base, layout.q, None),
            k: TmaPipeline::at(base, layout.k, peer),
            v: TmaPipeline::at(base, layout.v, peer),
            v_raw: TmaPipeline::at(base, layout.v_raw, None),
            o: base.add(layout.o.offset),
            o_shares_q: layout.o_shares_q(),
            tile_handoff: TmaPipeline::at(base, layout.tile_handoff, None),
            key_offsets: base.add(layout.key_offsets.offset),
        }
    }

    /// `KernelConfig::key_offsets`: fills the key-offset tile, the B operand of QKᵀ's
    /// extra k-step: key `j` of a block has `j` in columns 0-2 (the A operand's three
    /// parts of the slope) and 0 in the rest. Every thread of the CTA calls it once,
    /// before the CTA's first barrier; the tile is read through the async proxy. (16-bit
    /// kernels only: `OutElement` is their operand type.)
    #[inline(always)]
    pub fn fill_key_offsets<K: KernelTraits>(&self, tid: u32) {
        let mut unit = tid;
        // 16 bytes (8 columns) a store: two per key.
        while unit < 2 * K::BLOCK_N {
            let (key, half) = (unit / 2, unit % 2);
            let j = key as f32;
            let v = if half == 0 { [K::OutElement::pack2(j, j), K::OutElement::pack2(j, 0.0), 0, 0] } else { [0; 4] };
            // SAFETY: inside the tile (`block_n` rows of 32 B); 16 B aligned.
            unsafe { smem::st_v4_u32(self.key_offsets.add(k_major_plain_offset(key, 8 * half)), v) };
            unit += K::CONFIG.threads();
        }
        fence::proxy_async_shared();
    }
}

/// A kernel's TMA descriptor block (its first parameter, `common::TmaDescriptors`),
/// by generic address: the descriptors are read in place, never copied.
#[derive(Clone, Copy)]
pub struct TensorMaps(pub u64);

impl TensorMaps {
    /// One map.
    #[inline(always)]
    pub fn get(self, slot: impl DescriptorSlot) -> TensorMap {
        TensorMap(self.0 + slot.offset() as u64)
    }

    /// One map, its address derived at each use: the producer thread runs on 24
    /// registers and cannot hold three 64-bit addresses for the whole kernel.
    #[inline(always)]
    pub fn get_rederived(self, slot: impl DescriptorSlot) -> TensorMap {
        TensorMap(opaque_u64(self.0) + slot.offset() as u64)
    }
}
