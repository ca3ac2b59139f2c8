//! A Gaussian-process regressor over points in the unit cube (Horovod's
//! `optim/gaussian_process.cc`): squared-exponential kernel, noise `alpha` on the diagonal,
//! scores normalised to mean 0 and standard deviation 1 before fitting. The kernel's length
//! scale, signal amplitude and noise level are chosen by maximising the log marginal
//! likelihood over a fixed grid (deterministic, unlike Horovod's L-BFGS from a fixed start,
//! which can stop at NaN). Horovod fixes the noise at `alpha`; kolo takes `alpha` as the
//! largest noise level it may assume, so samples that are consistent (kolo scores a sample by
//! its steps' median) are fitted closely instead of being smoothed away.

/// Length scales tried when fitting (the inputs live in `[0, 1]^d`).
const LENGTH_SCALES: [f64; 8] = [0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.8, 1.2];
/// Signal amplitudes tried when fitting (scores are normalised to unit variance).
const AMPLITUDES: [f64; 6] = [0.5, 1.0, 2.0, 4.0, 8.0, 16.0];
/// Noise levels tried, as fractions of the largest one allowed.
const NOISE_FRACTIONS: [f64; 5] = [0.02, 0.05, 0.15, 0.4, 1.0];
/// Jitter added to the diagonal so the Cholesky factor exists even without noise.
const JITTER: f64 = 1e-9;

/// A fitted posterior.
#[derive(Debug, Clone)]
pub(crate) struct GaussianProcess {
    xs: Vec<Vec<f64>>,
    /// `K⁻¹ y` of the normalised scores.
    weights: Vec<f64>,
    /// Lower Cholesky factor of `K` (row-major, `n × n`).
    chol: Vec<f64>,
    length: f64,
    amplitude: f64,
    mean: f64,
    scale: f64,
}

impl GaussianProcess {
    /// Fits the scores `ys` seen at `xs` (each in `[0, 1]^d`), with a noise standard deviation
    /// of at most `noise` in normalised score units. `None` without samples.
    pub(crate) fn fit(xs: &[Vec<f64>], ys: &[f64], noise: f64) -> Option<GaussianProcess> {
        if xs.is_empty() || xs.len() != ys.len() {
            return None;
        }
        let n = ys.len() as f64;
        let mean = ys.iter().sum::<f64>() / n;
        let var = ys.iter().map(|y| (y - mean).powi(2)).sum::<f64>() / n;
        let scale = if var.sqrt() > 1e-12 * mean.abs().max(1.0) {
            var.sqrt()
        } else {
            1.0
        };
        let normalised: Vec<f64> = ys.iter().map(|y| (y - mean) / scale).collect();
        let mut best: Option<(f64, GaussianProcess)> = None;
        for &length in &LENGTH_SCALES {
            for &amplitude in &AMPLITUDES {
                for fraction in NOISE_FRACTIONS {
                    let Some((gp, likelihood)) = Self::with(
                        xs,
                        &normalised,
                        noise * fraction,
                        length,
                        amplitude,
                        mean,
                        scale,
                    ) else {
                        continue;
                    };
                    if best.as_ref().is_none_or(|(b, _)| likelihood > *b) {
                        best = Some((likelihood, gp));
                    }
                }
            }
        }
        best.map(|(_, gp)| gp)
    }

    fn with(
        xs: &[Vec<f64>],
        ys: &[f64],
        noise: f64,
        length: f64,
        amplitude: f64,
        mean: f64,
        scale: f64,
    ) -> Option<(GaussianProcess, f64)> {
        let n = xs.len();
        let mut k = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..n {
                k[i * n + j] = kernel(&xs[i], &xs[j], length, amplitude);
            }
            k[i * n + i] += noise * noise + JITTER;
        }
        let chol = cholesky(&k, n)?;
        let weights = solve_upper(&chol, n, &solve_lower(&chol, n, ys));
        // log p(y) = -½ yᵀK⁻¹y - Σ log L_ii - n/2 log 2π
        let fit: f64 = ys.iter().zip(&weights).map(|(y, w)| y * w).sum();
        let det: f64 = (0..n).map(|i| chol[i * n + i].ln()).sum();
        let likelihood = -0.5 * fit - det - 0.5 * n as f64 * (2.0 * std::f64::consts::PI).ln();
        likelihood.is_finite().then(|| {
            (
                GaussianProcess {
                    xs: xs.to_vec(),
                    weights,
                    chol,
                    length,
                    amplitude,
                    mean,
                    scale,
                },
                likelihood,
            )
        })
    }

    /// The posterior mean and standard deviation at `x`, in normalised score units.
    pub(crate) fn predict_normalised(&self, x: &[f64]) -> (f64, f64) {
        let n = self.xs.len();
        let ks: Vec<f64> = self
            .xs
            .iter()
            .map(|xi| kernel(xi, x, self.length, self.amplitude))
            .collect();
        let mu: f64 = ks.iter().zip(&self.weights).map(|(k, w)| k * w).sum();
        let v = solve_lower(&self.chol, n, &ks);
        let var = self.amplitude * self.amplitude - v.iter().map(|x| x * x).sum::<f64>();
        (mu, var.max(0.0).sqrt())
    }

    /// One normalised score unit in the scores' own units.
    pub(crate) fn score_scale(&self) -> f64 {
        self.scale
    }

    /// The posterior mean at `x`, in the scores' own units.
    pub(crate) fn mean_at(&self, x: &[f64]) -> f64 {
        self.predict_normalised(x).0 * self.scale + self.mean
    }
}

fn kernel(a: &[f64], b: &[f64], length: f64, amplitude: f64) -> f64 {
    let d2: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
    amplitude * amplitude * (-0.5 * d2 / (length * length)).exp()
}

/// The lower Cholesky factor of the symmetric `n × n` matrix `a`; `None` unless it is positive
/// definite.
fn cholesky(a: &[f64], n: usize) -> Option<Vec<f64>> {
    let mut l = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..=i {
            let sum: f64 = (0..j).map(|k| l[i * n + k] * l[j * n + k]).sum();
            if i == j {
                let d = a[i * n + i] - sum;
                if d <= 0.0 || !d.is_finite() {
                    return None;
                }
                l[i * n + i] = d.sqrt();
            } else {
                l[i * n + j] = (a[i * n + j] - sum) / l[j * n + j];
            }
        }
    }
    Some(l)
}

/// Solves `L x = b`.
fn solve_lower(l: &[f64], n: usize, b: &[f64]) -> Vec<f64> {
    let mut x = vec![0.0; n];
    for i in 0..n {
        let sum: f64 = (0..i).map(|k| l[i * n + k] * x[k]).sum();
        x[i] = (b[i] - sum) / l[i * n + i];
    }
    x
}

/// Solves `Lᵀ x = b`.
fn solve_upper(l: &[f64], n: usize, b: &[f64]) -> Vec<f64> {
    let mut x = vec![0.0; n];
    for i in (0..n).rev() {
        let sum: f64 = (i + 1..n).map(|k| l[k * n + i] * x[k]).sum();
        x[i] = (b[i] - sum) / l[i * n + i];
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpolates_a_smooth_function_without_noise() {
        let f = |x: f64| (3.0 * x).sin() + 2.0;
        let xs: Vec<Vec<f64>> = (0..=10).map(|i| vec![i as f64 / 10.0]).collect();
        let ys: Vec<f64> = xs.iter().map(|x| f(x[0])).collect();
        let gp = GaussianProcess::fit(&xs, &ys, 1e-3).unwrap();
        for probe in [0.05, 0.33, 0.71, 0.95] {
            let got = gp.mean_at(&[probe]);
            assert!(
                (got - f(probe)).abs() < 0.02,
                "{probe}: {got} vs {}",
                f(probe)
            );
        }
        // Uncertain far from samples, certain at them.
        let (_, at_sample) = gp.predict_normalised(&[0.5]);
        let far = GaussianProcess::fit(&xs[..3], &ys[..3], 1e-3).unwrap();
        let (_, away) = far.predict_normalised(&[0.9]);
        assert!(at_sample < 0.05 && away > 0.3, "{at_sample} {away}");
    }

    #[test]
    fn noise_smooths_instead_of_interpolating() {
        let xs: Vec<Vec<f64>> = (0..20).map(|i| vec![i as f64 / 19.0]).collect();
        // A constant 10 with alternating ±1 noise.
        let ys: Vec<f64> = (0..20)
            .map(|i| 10.0 + if i % 2 == 0 { 1.0 } else { -1.0 })
            .collect();
        let gp = GaussianProcess::fit(&xs, &ys, 0.8).unwrap();
        let got = gp.mean_at(&[0.5]);
        assert!((got - 10.0).abs() < 0.5, "{got}");
    }

    #[test]
    fn refuses_mismatched_or_empty_samples() {
        assert!(GaussianProcess::fit(&[], &[], 0.1).is_none());
        assert!(GaussianProcess::fit(&[vec![0.0]], &[1.0, 2.0], 0.1).is_none());
    }

    #[test]
    fn cholesky_rejects_indefinite_matrices() {
        assert!(cholesky(&[1.0, 2.0, 2.0, 1.0], 2).is_none());
        let l = cholesky(&[4.0, 2.0, 2.0, 3.0], 2).unwrap();
        assert_eq!(l, vec![2.0, 0.0, 1.0, 2f64.sqrt()]);
    }
}
