//! Row-major f32 matrices and the few operations the per-rank program needs.

use crate::error::CommError;

#[derive(Debug, Clone, PartialEq)]
pub struct Mat {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

impl Mat {
    pub fn zeros(rows: usize, cols: usize) -> Mat {
        Mat {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        }
    }
    pub fn from_vec(rows: usize, cols: usize, data: Vec<f32>) -> Result<Mat, CommError> {
        if data.len() != rows * cols {
            return Err(CommError::Shape {
                len: data.len(),
                rows,
                cols,
            });
        }
        Ok(Mat { rows, cols, data })
    }
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
    pub fn row_mut(&mut self, r: usize) -> &mut [f32] {
        &mut self.data[r * self.cols..(r + 1) * self.cols]
    }
    /// Rows `a..b`.
    pub fn rows_range(&self, a: usize, b: usize) -> Mat {
        Mat {
            rows: b - a,
            cols: self.cols,
            data: self.data[a * self.cols..b * self.cols].to_vec(),
        }
    }
    /// Columns `a..b`.
    pub fn cols_range(&self, a: usize, b: usize) -> Mat {
        let mut out = Mat::zeros(self.rows, b - a);
        for r in 0..self.rows {
            out.row_mut(r).copy_from_slice(&self.row(r)[a..b]);
        }
        out
    }
    /// Stacks row blocks.
    pub fn vstack(parts: &[Mat]) -> Mat {
        let cols = parts.first().map_or(0, |p| p.cols);
        let data: Vec<f32> = parts.iter().flat_map(|p| p.data.iter().copied()).collect();
        Mat {
            rows: data.len() / cols.max(1),
            cols,
            data,
        }
    }
    /// Places column blocks side by side.
    pub fn hstack(parts: &[&Mat]) -> Mat {
        let rows = parts.first().map_or(0, |p| p.rows);
        let cols = parts.iter().map(|p| p.cols).sum();
        let mut out = Mat::zeros(rows, cols);
        for r in 0..rows {
            let mut c = 0;
            for p in parts {
                out.row_mut(r)[c..c + p.cols].copy_from_slice(p.row(r));
                c += p.cols;
            }
        }
        out
    }
    pub fn add_assign(&mut self, o: &Mat) {
        for (x, y) in self.data.iter_mut().zip(&o.data) {
            *x += y;
        }
    }
    pub fn scale(&mut self, k: f32) {
        for x in &mut self.data {
            *x *= k;
        }
    }
    pub fn bytes(&self) -> usize {
        self.data.len() * 4
    }
}

/// `op(a) @ op(b)` where `op` transposes when asked; the transposes are free
/// (strides). Shapes are checked, and each matrix's data against its shape (the
/// fields are public), before the one `unsafe` call outside `cuda::ffi`.
#[allow(unsafe_code)]
pub fn matmul(a: &Mat, ta: bool, b: &Mat, tb: bool) -> Mat {
    let (m, k) = if ta {
        (a.cols, a.rows)
    } else {
        (a.rows, a.cols)
    };
    let (k2, n) = if tb {
        (b.cols, b.rows)
    } else {
        (b.rows, b.cols)
    };
    assert_eq!(k, k2, "matmul inner dimensions");
    assert_eq!(a.data.len(), a.rows * a.cols, "matmul: a's data and shape");
    assert_eq!(b.data.len(), b.rows * b.cols, "matmul: b's data and shape");
    let mut c = Mat::zeros(m, n);
    if m == 0 || n == 0 || k == 0 {
        return c;
    }
    let (rsa, csa) = if ta {
        (1, a.cols as isize)
    } else {
        (a.cols as isize, 1)
    };
    let (rsb, csb) = if tb {
        (1, b.cols as isize)
    } else {
        (b.cols as isize, 1)
    };
    // SAFETY: a's and b's data hold rows x cols elements (asserted above), so with
    // the strides above the pointers cover m*k and k*n elements; c is m x n, made by
    // `zeros`, and borrowed mutably only here.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.data.as_ptr(),
            rsa,
            csa,
            b.data.as_ptr(),
            rsb,
            csb,
            0.0,
            c.data.as_mut_ptr(),
            n as isize,
            1,
        );
    }
    c
}

/// Largest |a - b| relative to the largest |b| (1 when b is all zeros).
pub fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return f32::INFINITY;
    }
    // f32::max drops NaN, so a NaN anywhere must be caught explicitly: a NaN
    // result is a failed comparison, not a perfect one.
    if a.iter().chain(b).any(|x| x.is_nan()) {
        return f32::NAN;
    }
    let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1e-6);
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_transposes() {
        let a = Mat::from_vec(2, 3, vec![1., 2., 3., 4., 5., 6.]).unwrap();
        let b = Mat::from_vec(3, 2, vec![1., 0., 0., 1., 1., 1.]).unwrap();
        assert_eq!(matmul(&a, false, &b, false).data, vec![4., 5., 10., 11.]);
        // a^T a: 3x3
        let ata = matmul(&a, true, &a, false);
        assert_eq!(ata.data[0], 17.0);
        assert_eq!(ata.data[8], 45.0);
        // a b^T with b^T of shape 2x3
        let bt = Mat::from_vec(2, 3, vec![1., 0., 1., 0., 1., 1.]).unwrap();
        assert_eq!(matmul(&a, false, &bt, true).data, vec![4., 5., 10., 11.]);
    }

    #[test]
    fn rel_diff_fails_on_nan() {
        assert!(rel_diff(&[1.0, f32::NAN], &[1.0, 2.0]).is_nan());
        assert!(rel_diff(&[1.0, 2.0], &[f32::NAN, 2.0]).is_nan());
        assert_eq!(rel_diff(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!((rel_diff(&[1.0, 2.5], &[1.0, 2.0]) - 0.25).abs() < 1e-6);
    }
}
