//! Integration tests of kolo-estimator.

mod loader;
mod prepare;
