//! Device tensors as the attention API sees them: a cudarc buffer plus a
//! `[batch, seqlen, heads, hdim]` shape and element strides.
use crate::error::{AttnError, Result};
use common::DType;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, SyncOnDrop, ValidAsZeroBits};
use half::{bf16, f16};
use std::sync::Arc;

mod sealed {
    pub trait Sealed {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// An element type the kernels compute on: `half::f16` or `half::bf16`.
pub trait Element: sealed::Sealed + DeviceRepr + ValidAsZeroBits + Copy + Send + Sync + 'static {
    /// The matching [`DType`].
    const DTYPE: DType;
    /// Widens to f32 (exact).
    fn to_f32(self) -> f32;
    /// Rounds an f32 to the nearest value of this type (round to nearest even).
    fn from_f32(v: f32) -> Self;
    #[doc(hidden)]
    fn slice_ref(s: &CudaSlice<Self>) -> SliceRef<'_>;
    #[doc(hidden)]
    fn slice_mut(s: &mut CudaSlice<Self>) -> SliceMut<'_>;
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    fn to_f32(self) -> f32 {
        self.to_f32()
    }
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn slice_ref(s: &CudaSlice<Self>) -> SliceRef<'_> {
        SliceRef::F16(s)
    }
    fn slice_mut(s: &mut CudaSlice<Self>) -> SliceMut<'_> {
        SliceMut::F16(s)
    }
}

impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
    fn to_f32(self) -> f32 {
        self.to_f32()
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn slice_ref(s: &CudaSlice<Self>) -> SliceRef<'_> {
        SliceRef::BF16(s)
    }
    fn slice_mut(s: &mut CudaSlice<Self>) -> SliceMut<'_> {
        SliceMut::BF16(s)
    }
}

/// Rounds an f32 to the nearest value of `dtype` (round to nearest even).
pub fn round_to(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::BF16 => bf16::from_f32(x).to_f32(),
    }
}

/// Shape `[batch, seqlen, heads, hdim]` and strides in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// `[batch, seqlen, heads, hdim]`.
    pub shape: [usize; 4],
    /// Stride of each dimension, in elements (not bytes).
    pub strides: [usize; 4],
}

impl Layout {
    /// Row-major, packed.
    pub fn contiguous(shape: [usize; 4]) -> Self {
        let [_, s, h, d] = shape;
        Layout { shape, strides: [s * h * d, h * d, d, 1] }
    }

    /// One past the largest element index the layout reaches (`None` on overflow,
    /// 0 for an empty shape).
    pub fn extent(&self) -> Option<usize> {
        if self.shape.contains(&0) {
            return Some(0);
        }
        self.shape.iter().zip(&self.strides).try_fold(1usize, |acc, (&n, &st)| {
            (n - 1).checked_mul(st).and_then(|x| x.checked_add(acc))
        })
    }

    /// Number of elements the shape holds (its product; not the extent).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Element offset of `[b, s, h, d]`.
    pub fn offset(&self, idx: [usize; 4]) -> usize {
        idx.iter().zip(&self.strides).map(|(i, s)| i * s).sum()
    }
}

#[doc(hidden)]
pub enum SliceRef<'a> {
    F16(&'a CudaSlice<f16>),
    BF16(&'a CudaSlice<bf16>),
}

#[doc(hidden)]
pub enum SliceMut<'a> {
    F16(&'a mut CudaSlice<f16>),
    BF16(&'a mut CudaSlice<bf16>),
}

impl SliceRef<'_> {
    fn dtype(&self) -> DType {
        match self {
            SliceRef::F16(_) => DType::F16,
            SliceRef::BF16(_) => DType::BF16,
        }
    }
    fn len(&self) -> usize {
        match self {
            SliceRef::F16(s) => s.len(),
            SliceRef::BF16(s) => s.len(),
        }
    }
    pub(crate) fn device_ptr<'b>(&'b self, stream: &'b CudaStream) -> (u64, SyncOnDrop<'b>) {
        match self {
            SliceRef::F16(s) => s.device_ptr(stream),
            SliceRef::BF16(s) => s.device_ptr(stream),
        }
    }
}

impl SliceMut<'_> {
    fn dtype(&self) -> DType {
        match self {
            SliceMut::F16(_) => DType::F16,
            SliceMut::BF16(_) => DType::BF16,
        }
    }
    fn len(&self) -> usize {
        match self {
            SliceMut::F16(s) => s.len(),
            SliceMut::BF16(s) => s.len(),
        }
    }
    pub(crate) fn device_ptr_mut<'b>(&'b mut self, stream: &'b CudaStream) -> (u64, SyncOnDrop<'b>) {
        match self {
            SliceMut::F16(s) => s.device_ptr_mut(stream),
            SliceMut::BF16(s) => s.device_ptr_mut(stream),
        }
    }
}

/// A read-only view of a device buffer as a 4-D tensor.
pub struct TensorRef<'a> {
    pub(crate) slice: SliceRef<'a>,
    /// Shape and element strides of the view.
    pub layout: Layout,
}

impl<'a> TensorRef<'a> {
    /// A strided view; checked against the buffer when used.
    pub fn new<T: Element>(data: &'a CudaSlice<T>, shape: [usize; 4], strides: [usize; 4]) -> Self {
        TensorRef { slice: T::slice_ref(data), layout: Layout { shape, strides } }
    }

    /// A packed row-major view.
    pub fn contiguous<T: Element>(data: &'a CudaSlice<T>, shape: [usize; 4]) -> Self {
        TensorRef { slice: T::slice_ref(data), layout: Layout::contiguous(shape) }
    }

    /// Element type of the buffer.
    pub fn dtype(&self) -> DType {
        self.slice.dtype()
    }

    /// Elements in the underlying buffer.
    pub fn buffer_len(&self) -> usize {
        self.slice.len()
    }
}

/// A writable view of a device buffer as a 4-D tensor.
pub struct TensorMut<'a> {
    pub(crate) slice: SliceMut<'a>,
    /// Shape and element strides of the view.
    pub layout: Layout,
}

impl<'a> TensorMut<'a> {
    /// A strided view; checked against the buffer when used.
    pub fn new<T: Element>(data: &'a mut CudaSlice<T>, shape: [usize; 4], strides: [usize; 4]) -> Self {
        TensorMut { slice: T::slice_mut(data), layout: Layout { shape, strides } }
    }

    /// A packed row-major view.
    pub fn contiguous<T: Element>(data: &'a mut CudaSlice<T>, shape: [usize; 4]) -> Self {
        TensorMut { slice: T::slice_mut(data), layout: Layout::contiguous(shape) }
    }

    /// Element type of the buffer.
    pub fn dtype(&self) -> DType {
        self.slice.dtype()
    }

    /// Elements in the underlying buffer.
    pub fn buffer_len(&self) -> usize {
        self.slice.len()
    }
}

/// An owned device tensor of either element type.
pub enum DeviceTensor {
    /// An f16 buffer and the layout of the tensor in it.
    F16(CudaSlice<f16>, Layout),
    /// A bf16 buffer and the layout of the tensor in it.
    BF16(CudaSlice<bf16>, Layout),
}

impl DeviceTensor {
    /// Uploads f32 host data (contiguous `shape`), rounding to `dtype`.
    pub fn from_f32(stream: &Arc<CudaStream>, dtype: DType, shape: [usize; 4], data: &[f32]) -> Result<Self> {
        let layout = Layout::contiguous(shape);
        if data.len() != layout.numel() {
            return Err(AttnError::HostData(format!(
                "{} values for shape {shape:?} ({} expected)",
                data.len(),
                layout.numel()
            )));
        }
        Ok(match dtype {
            DType::F16 => {
                let h: Vec<f16> = data.iter().map(|&x| f16::from_f32(x)).collect();
                DeviceTensor::F16(stream.clone_htod(&h)?, layout)
            }
            DType::BF16 => {
                let h: Vec<bf16> = data.iter().map(|&x| bf16::from_f32(x)).collect();
                DeviceTensor::BF16(stream.clone_htod(&h)?, layout)
            }
        })
    }

    /// Uploads f32 host data given in logical order (packed `layout.shape`) into a buffer of
    /// `buffer_len` elements laid out by `layout`; elements no index reaches hold `fill`.
    pub fn from_f32_strided(
        stream: &Arc<CudaStream>,
        dtype: DType,
        layout: Layout,
        buffer_len: usize,
        data: &[f32],
        fill: f32,
    ) -> Result<Self> {
        if data.len() != layout.numel() || layout.extent().is_none_or(|e| e > buffer_len) {
            return Err(AttnError::HostData(format!(
                "{} values, layout {layout:?}, buffer of {buffer_len}: they do not fit",
                data.len()
            )));
        }
        let mut raw = vec![fill; buffer_len];
        let [b, s, h, d] = layout.shape;
        let mut src = data.iter();
        for idx in (0..b).flat_map(|bi| (0..s).flat_map(move |si| (0..h).flat_map(move |hi| (0..d).map(move |di| [bi, si, hi, di])))) {
            raw[layout.offset(idx)] = *src.next().expect("length checked");
        }
        let mut t = Self::from_f32(stream, dtype, [1, 1, 1, buffer_len], &raw)?;
        match &mut t {
            DeviceTensor::F16(_, l) | DeviceTensor::BF16(_, l) => *l = layout,
        }
        Ok(t)
    }

    /// Uninitialised packed tensor.
    pub fn alloc(stream: &Arc<CudaStream>, dtype: DType, shape: [usize; 4]) -> Result<Self> {
        let layout = Layout::contiguous(shape);
        // SAFETY: every element is written by the kernel before anyone reads it.
        Ok(unsafe {
            match dtype {
                DType::F16 => DeviceTensor::F16(stream.alloc(layout.numel())?, layout),
                DType::BF16 => DeviceTensor::BF16(stream.alloc(layout.numel())?, layout),
            }
        })
    }

    /// Shape and element strides.
    pub fn layout(&self) -> Layout {
        match self {
            DeviceTensor::F16(_, l) | DeviceTensor::BF16(_, l) => *l,
        }
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        match self {
            DeviceTensor::F16(..) => DType::F16,
            DeviceTensor::BF16(..) => DType::BF16,
        }
    }

    /// A read-only view of the tensor, with its layout.
    pub fn as_ref(&self) -> TensorRef<'_> {
        match self {
            DeviceTensor::F16(s, l) => TensorRef::new(s, l.shape, l.strides),
            DeviceTensor::BF16(s, l) => TensorRef::new(s, l.shape, l.strides),
        }
    }

    /// A writable view of the tensor, with its layout.
    pub fn as_mut(&mut self) -> TensorMut<'_> {
        match self {
            DeviceTensor::F16(s, l) => TensorMut::new(s, l.shape, l.strides),
            DeviceTensor::BF16(s, l) => TensorMut::new(s, l.shape, l.strides),
        }
    }

    /// A packed view of the same buffer with another shape (checked against the buffer
    /// when used).
    pub fn view(&self, shape: [usize; 4]) -> TensorRef<'_> {
        match self {
            DeviceTensor::F16(s, _) => TensorRef::contiguous(s, shape),
            DeviceTensor::BF16(s, _) => TensorRef::contiguous(s, shape),
        }
    }

    /// Writable counterpart of [`DeviceTensor::view`].
    pub fn view_mut(&mut self, shape: [usize; 4]) -> TensorMut<'_> {
        match self {
            DeviceTensor::F16(s, _) => TensorMut::contiguous(s, shape),
            DeviceTensor::BF16(s, _) => TensorMut::contiguous(s, shape),
        }
    }

    /// Downloads as f32, in logical (packed row-major) order.
    pub fn to_f32(&self, stream: &Arc<CudaStream>) -> Result<Vec<f32>> {
        Ok(gather(&self.raw_f32(stream)?, &self.layout()))
    }

    /// The whole buffer as f32, in storage order (padding included).
    pub fn raw_f32(&self, stream: &Arc<CudaStream>) -> Result<Vec<f32>> {
        Ok(match self {
            DeviceTensor::F16(s, _) => stream.clone_dtoh(s)?.iter().map(|x| x.to_f32()).collect(),
            DeviceTensor::BF16(s, _) => stream.clone_dtoh(s)?.iter().map(|x| x.to_f32()).collect(),
        })
    }

    /// Overwrites the whole buffer with one value (used to poison outputs in tests).
    pub fn fill(&mut self, stream: &Arc<CudaStream>, value: f32) -> Result<()> {
        match self {
            DeviceTensor::F16(s, _) => stream.memcpy_htod(&vec![f16::from_f32(value); s.len()], s)?,
            DeviceTensor::BF16(s, _) => stream.memcpy_htod(&vec![bf16::from_f32(value); s.len()], s)?,
        }
        Ok(())
    }
}

/// Reads a strided tensor out of a flat buffer into packed row-major order.
pub fn gather(raw: &[f32], layout: &Layout) -> Vec<f32> {
    let [b, s, h, d] = layout.shape;
    let mut out = Vec::with_capacity(layout.numel());
    for bi in 0..b {
        for si in 0..s {
            for hi in 0..h {
                let o = layout.offset([bi, si, hi, 0]);
                out.extend((0..d).map(|di| raw[o + di * layout.strides[3]]));
            }
        }
    }
    out
}
