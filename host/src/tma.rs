//! TMA tensor maps for `[batch, seqlen, heads, hdim]` tensors, and for the FP8 forward's
//! transposed V (`[batch, heads, hdim, keys]`, [`TensorMapSpec::vt`]).
//!
//! A tile of `rows x hdim` elements is loaded by one TMA instruction into the layout
//! WGMMA reads with 128-byte swizzle: chunks of `rows x 128 B` (64 16-bit or 128 e4m3
//! elements wide). The map is 5-D, innermost first: `(chunk, seqlen, chunks, heads, batch)`, with
//! byte strides `(row stride, 128, head stride, batch stride)`: the chunk dimension has
//! a smaller stride than the row dimension, which TMA allows, and puts chunks outermost
//! in shared memory. Rows past `seqlen` are zero-filled on loads and dropped on stores,
//! so no sequence length needs padding.
use crate::error::{Arg, AttnError, Result};
use crate::tensor::Layout;
use common::DType;
use cudarc::driver::sys;

/// The element type of a map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TmaElem {
    /// fp16.
    F16,
    /// bf16.
    BF16,
    /// e4m3, moved as bytes.
    E4M3,
}

impl TmaElem {
    /// Bytes per element.
    pub const fn bytes(self) -> u32 {
        match self {
            TmaElem::E4M3 => 1,
            _ => 2,
        }
    }
}

impl From<DType> for TmaElem {
    fn from(d: DType) -> Self {
        match d {
            DType::F16 => TmaElem::F16,
            DType::BF16 => TmaElem::BF16,
        }
    }
}

/// Everything `cuTensorMapEncodeTiled` is given (checked on the host before the call).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorMapSpec {
    /// Element type.
    pub elem: TmaElem,
    /// Device address of element 0 (TMA needs it 16-byte aligned).
    pub addr: u64,
    /// Extents in elements, innermost first: `(64, seqlen, hdim/64, heads, batch)`.
    pub dims: [u64; 5],
    /// Byte strides of dims 1..5 (dim 0 is contiguous).
    pub strides: [u64; 4],
    /// The box one copy moves, in elements of each dim: `(64, rows, chunks, 1, 1)`.
    pub box_dims: [u32; 5],
    /// Bytes of the swizzle span (128, or 64 for 64-byte rows).
    pub swizzle: u32,
}

/// TMA's limit on byte strides.
const MAX_STRIDE: u64 = 1 << 40;

impl TensorMapSpec {
    /// The map of a `[b, s, h, d]` tensor (last dim contiguous) whose box is `rows` rows
    /// by `chunks` 128-byte chunks of one head.
    pub fn bshd(arg: Arg, elem: impl Into<TmaElem>, addr: u64, layout: &Layout, rows: u32, chunks: u32) -> Result<Self> {
        let elem = elem.into();
        let bytes = elem.bytes() as u64;
        // 128-byte chunks, or one of 64 bytes for e4m3 rows of 64.
        let chunk = (128 / bytes).min(layout.shape[3] as u64);
        let [b, s, h, d] = layout.shape.map(|x| x as u64);
        let [bs, rs, hs, _] = layout.strides.map(|x| x as u64 * bytes);
        debug_assert!(d % chunk == 0 && chunks as u64 <= d / chunk);
        check_strides(arg, [bs, rs, hs])?;
        Ok(TensorMapSpec {
            elem,
            addr,
            dims: [chunk, s, d / chunk, h, b],
            strides: [rs, 128, hs, bs],
            box_dims: [chunk as u32, rows, chunks, 1, 1],
            swizzle: (chunk * bytes) as u32,
        })
    }

    /// The map of the FP8 forward's transposed V, e4m3 `[b, h, d, keys]` packed with
    /// `keys` (`common::fp8::vt_len`) per row: a box of `block_n` keys by all `d` rows,
    /// swizzled over its rows' chunks of `common::fp8::vt_chunk(block_n)` bytes. One
    /// chunk: `(keys, d, 1, heads, batch)`, keys beyond the row zero-filled. Several:
    /// `(chunk, d, keys / chunk, heads, batch)` with the chunk dimension strided by its
    /// bytes (as [`TensorMapSpec::bshd`]'s), so that the chunks land one after another;
    /// rows are whole chunks (`vt_len`), and chunks past the row are zero-filled.
    pub fn vt(arg: Arg, addr: u64, batch: usize, heads: usize, hdim: usize, keys: usize, block_n: u32) -> Result<Self> {
        let (b, h, d, n) = (batch as u64, heads as u64, hdim as u64, keys as u64);
        check_strides(arg, [n, d * n, h * d * n])?;
        let chunk = common::fp8::vt_chunk(block_n);
        let (dims, strides, box_dims) = if chunk == block_n {
            ([n, d, 1, h, b], [n, d * n, d * n, h * d * n], [block_n, hdim as u32, 1, 1, 1])
        } else {
            debug_assert!(n % chunk as u64 == 0);
            let c = chunk as u64;
            ([c, d, n / c, h, b], [n, c, d * n, h * d * n], [chunk, hdim as u32, block_n / chunk, 1, 1])
        };
        Ok(TensorMapSpec { elem: TmaElem::E4M3, addr, dims, strides, box_dims, swizzle: chunk })
    }

    /// Bytes one box moves (what a load's mbarrier must expect).
    pub fn box_bytes(&self) -> u32 {
        self.box_dims.iter().product::<u32>() * self.elem.bytes()
    }

    /// Encodes the map (needs the driver).
    pub fn encode(&self) -> Result<[u64; 16]> {
        use sys::{
            CUtensorMapDataType as Dt, CUtensorMapFloatOOBfill as Oob, CUtensorMapInterleave as Il,
            CUtensorMapL2promotion as L2, CUtensorMapSwizzle as Sw,
        };
        let mut map = sys::CUtensorMap { opaque: [0; 16] };
        let dtype = match self.elem {
            TmaElem::F16 => Dt::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            TmaElem::BF16 => Dt::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            TmaElem::E4M3 => Dt::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        };
        let swizzle = if self.swizzle == 64 { Sw::CU_TENSOR_MAP_SWIZZLE_64B } else { Sw::CU_TENSOR_MAP_SWIZZLE_128B };
        let elem_strides = [1u32; 5];
        // SAFETY: every pointer is to a live local array of the length the rank implies.
        let rc = unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                dtype,
                5,
                self.addr as *mut std::ffi::c_void,
                self.dims.as_ptr(),
                self.strides.as_ptr(),
                self.box_dims.as_ptr(),
                elem_strides.as_ptr(),
                Il::CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle,
                L2::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                Oob::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        if rc != sys::CUresult::CUDA_SUCCESS {
            return Err(AttnError::Driver(cudarc::driver::DriverError(rc)));
        }
        Ok(map.opaque)
    }
}

/// TMA takes byte strides below 2^40.
fn check_strides(arg: Arg, strides: [u64; 3]) -> Result<()> {
    match strides.into_iter().find(|&x| x >= MAX_STRIDE) {
        Some(big) => Err(AttnError::TooLarge(format!("{arg}: byte stride {big} is beyond TMA's 2^40"))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_bshd_map_has_chunk_dimension_inside() {
        let l = Layout::contiguous([2, 1000, 16, 128]);
        let m = TensorMapSpec::bshd(Arg::K, DType::BF16, 0x1000, &l, 128, 2).unwrap();
        assert_eq!(m.dims, [64, 1000, 2, 16, 2]);
        // Row stride 16 heads * 128 * 2 B, chunk 128 B, head 256 B, batch 1000 rows.
        assert_eq!(m.strides, [16 * 128 * 2, 128, 256, 1000 * 16 * 128 * 2]);
        assert_eq!(m.box_dims, [64, 128, 2, 1, 1]);
        assert_eq!(m.box_bytes(), 128 * 128 * 2);
    }

    #[test]
    fn e4m3_maps_have_128_element_chunks_and_byte_strides() {
        let l = Layout::contiguous([2, 1000, 16, 256]);
        let m = TensorMapSpec::bshd(Arg::Q, TmaElem::E4M3, 0x1000, &l, 128, 2).unwrap();
        assert_eq!(m.dims, [128, 1000, 2, 16, 2]);
        assert_eq!(m.strides, [16 * 256, 128, 256, 1000 * 16 * 256]);
        assert_eq!(m.box_bytes(), 128 * 256);
        // Transposed V: rows of 1024 keys, a box of 64 keys by 256 rows, 64 B swizzle.
        let v = TensorMapSpec::vt(Arg::V, 0x2000, 2, 4, 256, 1024, 64).unwrap();
        assert_eq!(v.dims, [1024, 256, 1, 4, 2]);
        assert_eq!(v.strides, [1024, 256 * 1024, 256 * 1024, 4 * 256 * 1024]);
        assert_eq!((v.box_bytes(), v.swizzle), (64 * 256, 64));
        // 192 keys (hdim 128): three 64-key chunks of 128 rows, the chunk dimension
        // strided by 64 B inside the row stride.
        let v = TensorMapSpec::vt(Arg::V, 0x2000, 2, 4, 128, 1088, 192).unwrap();
        assert_eq!(v.dims, [64, 128, 1088 / 64, 4, 2]);
        assert_eq!(v.strides, [1088, 64, 128 * 1088, 4 * 128 * 1088]);
        assert_eq!(v.box_dims, [64, 128, 3, 1, 1]);
        assert_eq!((v.box_bytes(), v.swizzle), (192 * 128, 64));
    }

    #[test]
    fn strides_beyond_two_to_the_forty_are_rejected() {
        let mut l = Layout::contiguous([2, 8, 1, 64]);
        l.strides[0] = 1 << 40;
        assert!(matches!(TensorMapSpec::bshd(Arg::Q, DType::F16, 0, &l, 64, 1), Err(AttnError::TooLarge(_))));
    }
}
