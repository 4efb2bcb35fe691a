//! Comparing a kernel's output with the CPU references under FlashAttention's rule.
use crate::reference::backward::{Grads, attention_backward_f64, attention_backward_lowp, sink_grads_f64, sink_grads_lowp};
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

/// The sinks' gradient of a backward against the references: FlashAttention's rule with
/// a relative slack of 1e-5 of the largest gradient (its f32 sums over every row).
#[derive(Clone, Copy, Debug)]
pub struct SinkCheckReport {
    /// Largest absolute error of the kernel's dsinks.
    pub err: f64,
    /// Largest absolute error of the naive one ([`sink_grads_lowp`]).
    pub naive: f64,
    /// Absolute slack.
    pub slack: f64,
}

impl SinkCheckReport {
    /// Whether the error is within twice the naive one plus the slack.
    pub fn passed(&self) -> bool {
        within_budget(self.err, self.naive, self.slack)
    }
}

impl std::fmt::Display for SinkCheckReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "max |dsinks - exact| = {:.3e} (naive {:.3e}, budget {:.3e}): {}",
            self.err,
            self.naive,
            2.0 * self.naive + self.slack,
            if self.passed() { "PASS" } else { "FAIL" }
        )
    }
}

/// Scores a backward's gradient of the sinks of `p` (`got`, `[heads_q]`).
pub fn check_sink_grads(p: &Problem<'_>, dout: &HostTensor, dtype: DType, got: &[f32]) -> SinkCheckReport {
    let exact = sink_grads_f64(p, dout);
    let naive = max_abs_err(&sink_grads_lowp(p, dout, dtype), &exact);
    let slack = 1e-5 * exact.iter().fold(1.0f64, |m, x| m.max(x.abs()));
    SinkCheckReport { err: max_abs_err(got, &exact), naive, slack }
}
