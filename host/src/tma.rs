//! TMA tensor maps for `[batch, seqlen, heads, hdim]` tensors.
//!
//! A tile of `rows x hdim` 16-bit elements is loaded by one TMA instruction into the
//! layout WGMMA reads with 128-byte swizzle: `hdim/64` chunks of `rows x 128 B`. The map
//! is 5-D, innermost first: `(64 elements, seqlen, hdim/64 chunks, heads, batch)`, with
//! byte strides `(row stride, 128, head stride, batch stride)`: the chunk dimension has
//! a smaller stride than the row dimension, which TMA allows, and puts chunks outermost
//! in shared memory. Rows past `seqlen` are zero-filled on loads and dropped on stores,
//! so no sequence length needs padding.
use crate::error::{Arg, AttnError, Result};
use crate::tensor::Layout;
use common::DType;
use cudarc::driver::sys;

/// Everything `cuTensorMapEncodeTiled` is given (checked on the host before the call).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorMapSpec {
    /// Element type (16-bit either way).
    pub dtype: DType,
    /// Device address of element 0 (TMA needs it 16-byte aligned).
    pub addr: u64,
    /// Extents in elements, innermost first: `(64, seqlen, hdim/64, heads, batch)`.
    pub dims: [u64; 5],
    /// Byte strides of dims 1..5 (dim 0 is contiguous).
    pub strides: [u64; 4],
    /// The box one copy moves, in elements of each dim: `(64, rows, chunks, 1, 1)`.
    pub box_dims: [u32; 5],
}

/// TMA's limit on byte strides.
const MAX_STRIDE: u64 = 1 << 40;

impl TensorMapSpec {
    /// The map of a `[b, s, h, d]` tensor (last dim contiguous) whose box is `rows` rows
    /// by `chunks` 64-element chunks of one head.
    pub fn bshd(arg: Arg, dtype: DType, addr: u64, layout: &Layout, rows: u32, chunks: u32) -> Result<Self> {
        let [b, s, h, d] = layout.shape.map(|x| x as u64);
        let [bs, rs, hs, _] = layout.strides.map(|x| x as u64 * 2);
        debug_assert!(d % 64 == 0 && chunks as u64 <= d / 64);
        if let Some(big) = [bs, rs, hs].into_iter().find(|&x| x >= MAX_STRIDE) {
            return Err(AttnError::TooLarge(format!("{arg}: byte stride {big} is beyond TMA's 2^40")));
        }
        Ok(TensorMapSpec {
            dtype,
            addr,
            dims: [64, s, d / 64, h, b],
            strides: [rs, 128, hs, bs],
            box_dims: [64, rows, chunks, 1, 1],
        })
    }

    /// Bytes one box moves (what a load's mbarrier must expect).
    pub fn box_bytes(&self) -> u32 {
        self.box_dims.iter().product::<u32>() * 2
    }

    /// Encodes the map (needs the driver).
    pub fn encode(&self) -> Result<[u64; 16]> {
        use sys::{
            CUtensorMapDataType as Dt, CUtensorMapFloatOOBfill as Oob, CUtensorMapInterleave as Il,
            CUtensorMapL2promotion as L2, CUtensorMapSwizzle as Sw,
        };
        let mut map = sys::CUtensorMap { opaque: [0; 16] };
        let dtype = match self.dtype {
            DType::F16 => Dt::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            DType::BF16 => Dt::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        };
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
                Sw::CU_TENSOR_MAP_SWIZZLE_128B,
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
    fn strides_beyond_two_to_the_forty_are_rejected() {
        let mut l = Layout::contiguous([2, 8, 1, 64]);
        l.strides[0] = 1 << 40;
        assert!(matches!(TensorMapSpec::bshd(Arg::Q, DType::F16, 0, &l, 64, 1), Err(AttnError::TooLarge(_))));
    }
}
