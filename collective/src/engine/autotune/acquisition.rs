//! Expected improvement (Horovod's `BayesianOptimization::ExpectedImprovement`, with its
//! exploration margin `xi` = 0.01) and its maximisation over the unit cube. Horovod runs L-BFGS
//! from 25 random starts; kolo scans a fixed lattice, which is deterministic (the same samples
//! give the same proposal) and, in the two tuned dimensions, dense enough. A lattice point
//! already sampled is never proposed again: with noise in the model, expected improvement is
//! often largest at the best sample itself, and Horovod samples it again and again, spending
//! steps on one point (the paired re-check, not repeated single samples, settles which of
//! the top points is best).

use super::gp::GaussianProcess;

/// Horovod's exploration margin.
pub(crate) const XI: f64 = 0.01;

/// Lattice points per dimension scanned for the proposal.
const LATTICE: usize = 41;

/// The expected improvement over `best` of a normal posterior `(mu, sigma)` (all in normalised
/// score units; higher scores are better).
pub(crate) fn expected_improvement(mu: f64, sigma: f64, best: f64, xi: f64) -> f64 {
    if sigma <= 0.0 {
        return 0.0;
    }
    let improvement = mu - best - xi;
    let z = improvement / sigma;
    (improvement * normal_cdf(z) + sigma * normal_pdf(z)).max(0.0)
}

fn normal_pdf(z: f64) -> f64 {
    (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

fn normal_cdf(z: f64) -> f64 {
    0.5 * erfc(-z / std::f64::consts::SQRT_2)
}

/// The complementary error function (Numerical Recipes' Chebyshev fit, relative error below
/// 1.2e-7).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// A proposed next sample and its expected improvement (normalised units).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Proposal {
    pub point: Vec<f64>,
    pub expected_improvement: f64,
}

/// Whether `point` is the lattice point nearest to one of `xs` (a sample's coordinates come
/// back through the engine's units, bytes and nanoseconds, so they are not exactly on the
/// lattice).
pub(crate) fn sampled(point: &[f64], xs: &[Vec<f64>]) -> bool {
    let half_cell = 0.5 / (LATTICE - 1) as f64;
    xs.iter()
        .any(|x| x.iter().zip(point).all(|(a, b)| (a - b).abs() < half_cell))
}

/// The lattice point of `[0, 1]^dims` not yet sampled (see [`sampled`]) with the largest
/// expected improvement over the best posterior mean at the sampled points `xs` (Horovod's
/// noise-aware incumbent).
pub(crate) fn propose(gp: &GaussianProcess, xs: &[Vec<f64>], dims: usize) -> Proposal {
    let best = xs
        .iter()
        .map(|x| gp.predict_normalised(x).0)
        .fold(f64::NEG_INFINITY, f64::max);
    let mut proposal = Proposal {
        point: vec![0.5; dims],
        expected_improvement: 0.0,
    };
    let total = LATTICE.pow(dims as u32);
    for index in 0..total {
        let mut rest = index;
        let point: Vec<f64> = (0..dims)
            .map(|_| {
                let i = rest % LATTICE;
                rest /= LATTICE;
                i as f64 / (LATTICE - 1) as f64
            })
            .collect();
        if sampled(&point, xs) {
            continue;
        }
        let (mu, sigma) = gp.predict_normalised(&point);
        let ei = expected_improvement(mu, sigma, best, XI);
        if ei > proposal.expected_improvement {
            proposal = Proposal {
                point,
                expected_improvement: ei,
            };
        }
    }
    proposal
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erfc_matches_known_values() {
        for (x, want) in [
            (0.0, 1.0),
            (0.5, 0.479_500_122),
            (1.0, 0.157_299_207),
            (2.0, 0.004_677_735),
            (-1.0, 1.842_700_793),
        ] {
            assert!((erfc(x) - want).abs() < 1e-6, "erfc({x}) = {}", erfc(x));
        }
    }

    #[test]
    fn expected_improvement_grows_with_mean_and_uncertainty() {
        let base = expected_improvement(0.0, 0.1, 0.0, XI);
        assert!(expected_improvement(0.5, 0.1, 0.0, XI) > base);
        assert!(expected_improvement(0.0, 1.0, 0.0, XI) > base);
        assert_eq!(expected_improvement(5.0, 0.0, 0.0, XI), 0.0);
        // Far below the incumbent and certain: nothing to gain.
        assert!(expected_improvement(-5.0, 0.1, 0.0, XI) < 1e-12);
        // Certain gain: EI is the gain.
        let ei = expected_improvement(2.0, 1e-6, 0.0, XI);
        assert!((ei - (2.0 - XI)).abs() < 1e-6, "{ei}");
    }

    #[test]
    fn proposes_where_the_model_is_unexplored_or_promising() {
        // Samples only on the left half, rising towards the right: the proposal is right of
        // them.
        let xs: Vec<Vec<f64>> = [0.0, 0.1, 0.2, 0.3].iter().map(|&x| vec![x]).collect();
        let ys = [1.0, 2.0, 3.0, 4.0];
        let gp = GaussianProcess::fit(&xs, &ys, 0.01).unwrap();
        let p = propose(&gp, &xs, 1);
        assert!(p.point[0] > 0.3 && p.expected_improvement > 0.0, "{p:?}");
    }

    #[test]
    fn never_proposes_a_point_already_sampled() {
        // A noisy model around a peak sampled at the lattice point 0.5 (as the engine's units
        // bring it back, a hair off the lattice): expected improvement is largest there, yet
        // the proposal is a point not sampled yet.
        let xs: Vec<Vec<f64>> = [0.0, 0.25, 0.5 + 1e-7, 0.75, 1.0]
            .iter()
            .map(|&x| vec![x])
            .collect();
        let ys = [1.0, 3.0, 4.0, 3.0, 1.0];
        let gp = GaussianProcess::fit(&xs, &ys, 0.8).unwrap();
        let p = propose(&gp, &xs, 1);
        assert!(!sampled(&p.point, &xs), "{p:?}");
        assert!((p.point[0] - 0.5).abs() > 1e-3, "{p:?}");
        assert!(p.expected_improvement > 0.0, "{p:?}");
    }
}
