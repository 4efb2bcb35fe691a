//! Comparing a kernel's output with the CPU references under FlashAttention's rule.
use crate::reference::backward::{Grads, attention_backward_f64, attention_backward_lowp, sink_grads_f64, sink_grads_given, sink_grads_lowp};
use crate::reference::{AttnResult, HostTensor, Problem, attention_f64, attention_lowp, max_abs_err, within_budget};
use crate::tensor::round_to;
use common::DType;

/// Absolute slack on O (FlashAttention's "tiny absolute slack").
pub const O_SLACK: f64 = 1e-5;
/// Absolute slack on the LSE: the kernels use the SFU's `ex2`/`lg2` approximations, and
/// 1e-4 in log space is a 1e-4 relative change of the probabilities.
pub const LSE_SLACK: f64 = 1e-4;

/// Errors of a kernel and of the naive low-precision implementation, both against f64.
#[derive(Clone, Copy, Debug)]
pub struct CheckReport {
    /// Largest absolute error of the kernel's O.
    pub o_err: f64,
    /// Largest absolute error of the naive O ([`attention_lowp`]).
    pub o_err_naive: f64,
    /// Largest absolute error of the kernel's LSE.
    pub lse_err: f64,
    /// Largest absolute error of the naive LSE.
    pub lse_err_naive: f64,
}

impl CheckReport {
    /// Whether O and LSE are both within budget: at most twice the naive error plus
    /// [`O_SLACK`] or [`LSE_SLACK`].
    pub fn passed(&self) -> bool {
        within_budget(self.o_err, self.o_err_naive, O_SLACK) && within_budget(self.lse_err, self.lse_err_naive, LSE_SLACK)
    }
}

impl std::fmt::Display for CheckReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "max |O - O_f64| = {:.3e} (naive {:.3e}, budget {:.3e}); max |LSE - LSE_f64| = {:.3e} (naive {:.3e}, budget {:.3e}): {}",
            self.o_err,
            self.o_err_naive,
            2.0 * self.o_err_naive + O_SLACK,
            self.lse_err,
            self.lse_err_naive,
            2.0 * self.lse_err_naive + LSE_SLACK,
            if self.passed() { "PASS" } else { "FAIL" }
        )
    }
}

/// Scores `got` (O packed like q, LSE `[b, h, sq]`) against the references of `p`.
pub fn check(p: &Problem<'_>, dtype: DType, got: &AttnResult<f32>) -> CheckReport {
    let exact = attention_f64(p);
    let naive = attention_lowp(p, dtype);
    CheckReport {
        o_err: max_abs_err(&got.o, &exact.o),
        o_err_naive: max_abs_err(&naive.o, &exact.o),
        lse_err: max_abs_err(&got.lse, &exact.lse),
        lse_err_naive: max_abs_err(&naive.lse, &exact.lse),
    }
}

/// FlashAttention's absolute slack in its gradient checks, `2 * max|g + 0.3 - 0.3 - g|`
/// with the reference g in `dtype`: about one ulp of 0.3 in `dtype`. It covers the final
/// rounding of the gradients to `dtype`: the naive error can sit at half an ulp of the
/// largest gradients, and a kernel whose f32 result is a hair off on the other side of a
/// rounding boundary then shows one ulp, twice the naive error without any other fault.
pub fn grad_slack(exact: &[f64], dtype: DType) -> f64 {
    let moved = |g: f64| {
        let x = round_to(dtype, g as f32);
        (round_to(dtype, round_to(dtype, x + 0.3) - 0.3) - x).abs() as f64
    };
    2.0 * exact.iter().map(|&g| moved(g)).fold(0.0, f64::max)
}

/// Errors of a backward kernel's dQ, dK, dV and of the naive low-precision backward, all
/// against the exact f64 gradients.
#[derive(Clone, Copy, Debug)]
pub struct BwdCheckReport {
    /// Largest absolute error of the kernel's dQ, dK, dV.
    pub err: [f64; 3],
    /// Largest absolute error of the naive backward's ([`attention_backward_lowp`]).
    pub naive: [f64; 3],
    /// The absolute slack of each ([`grad_slack`]).
    pub slack: [f64; 3],
}

impl BwdCheckReport {
    /// Whether every gradient is within budget: at most twice the naive error plus its
    /// slack.
    pub fn passed(&self) -> bool {
        (0..3).all(|g| within_budget(self.err[g], self.naive[g], self.slack[g]))
    }
}

impl std::fmt::Display for BwdCheckReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (g, name) in ["dQ", "dK", "dV"].iter().enumerate() {
            write!(
                f,
                "max |{name} - exact| = {:.3e} (naive {:.3e}, budget {:.3e}); ",
                self.err[g],
                self.naive[g],
                2.0 * self.naive[g] + self.slack[g]
            )?;
        }
        f.write_str(if self.passed() { "PASS" } else { "FAIL" })
    }
}

/// Scores a backward's `got` gradients (packed like q, k, v) for loss gradient `dout`
/// against the references of `p`.
pub fn check_backward(p: &Problem<'_>, dout: &HostTensor, dtype: DType, got: &Grads<f32>) -> BwdCheckReport {
    let exact = attention_backward_f64(p, dout);
    let naive = attention_backward_lowp(p, dout, dtype).max_abs_err(&exact);
    let slack = [grad_slack(&exact.dq, dtype), grad_slack(&exact.dk, dtype), grad_slack(&exact.dv, dtype)];
    BwdCheckReport { err: got.max_abs_err(&exact), naive, slack }
}

/// The sinks' gradient of a backward, checked against the f64 gradient of the same
/// forward outputs (O and LSE) it started from: the forward's accuracy has its own
/// check, and a sum over every row of a head makes a max over a handful of heads too
/// noisy for the 2x rule against the naive implementation. The budget is f32 rounding:
/// `1e-4 · Σ exp(sink − LSE_i) · |D_i| + 1e-7` per head (f32 sums of a few thousand terms
/// stay far below 1e-4 of their magnitudes; a wrong or missing term is of their order).
/// The error against the exact gradient is reported alongside.
#[derive(Clone, Copy, Debug)]
pub struct SinkCheckReport {
    /// Error against the f64 gradient of the same forward outputs, of the head furthest
    /// into (or past) its budget.
    pub err: f64,
    /// That head's budget.
    pub budget: f64,
    /// Largest error against the exact gradient ([`sink_grads_f64`]).
    pub err_exact: f64,
    /// The naive implementation's ([`sink_grads_lowp`]).
    pub naive_exact: f64,
}

impl SinkCheckReport {
    /// Whether every head is within its budget.
    pub fn passed(&self) -> bool {
        self.err <= self.budget
    }
}

impl std::fmt::Display for SinkCheckReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "max |dsinks - f64 of the same O, LSE| = {:.3e} (budget {:.3e}), against exact {:.3e} (naive {:.3e}): {}",
            self.err,
            self.budget,
            self.err_exact,
            self.naive_exact,
            if self.passed() { "PASS" } else { "FAIL" }
        )
    }
}

/// Scores a backward's gradient of the sinks of `p` (`got`, `[heads_q]`), given the
/// forward's `o` and `lse` that the backward started from.
pub fn check_sink_grads(p: &Problem<'_>, dout: &HostTensor, dtype: DType, o: &[f32], lse: &[f32], got: &[f32]) -> SinkCheckReport {
    let given = sink_grads_given(p, dout, o, lse);
    // The worst head: the largest error over its budget (NaN counts as infinite).
    let (err, budget) = got
        .iter()
        .zip(&given)
        .map(|(&g, &(want, mag))| {
            let e = (g as f64 - want).abs();
            (if e.is_nan() { f64::INFINITY } else { e }, 1e-4 * mag + 1e-7)
        })
        .fold((0.0, 1.0), |worst, (e, b)| if e / b > worst.0 / worst.1 { (e, b) } else { worst });
    let exact = sink_grads_f64(p, dout);
    SinkCheckReport {
        err,
        budget,
        err_exact: max_abs_err(got, &exact),
        naive_exact: max_abs_err(&sink_grads_lowp(p, dout, dtype), &exact),
    }
}
