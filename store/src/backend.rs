//! Building the `object_store` client of a resolved location: environment variables first
//! (object_store's `from_env()`), then kolo's bounded timeouts, then `storage_options`.

use std::collections::HashMap;
use std::sync::Arc;
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
use std::time::Duration;

use object_store::ObjectStore;

use crate::error::{Error, Result};
use crate::location::Backend;

/// Keys kolo reads itself for every remote backend (the retry budget); the HTTP client keys
/// `timeout` and `connect_timeout` go to object_store.
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure", feature = "hdfs"))]
pub(crate) const RETRY_KEYS: [&str; 2] = ["max_retries", "retry_timeout"];

/// Default time to establish a connection to a remote store.
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
pub(crate) const DEFAULT_CONNECT_TIMEOUT: &str = "5s";
/// Default time one request may take end to end.
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
pub(crate) const DEFAULT_TIMEOUT: &str = "120s";
/// Default number of retries of a failed request.
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
pub(crate) const DEFAULT_MAX_RETRIES: usize = 3;
/// Default bound on the time spent retrying one request.
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
pub(crate) const DEFAULT_RETRY_TIMEOUT_SECS: u64 = 15;

/// Builds the client for `backend`.
pub(crate) fn build(
    url: &str,
    backend: Backend,
    builder_url: Option<&str>,
    options: &HashMap<String, String>,
) -> Result<Arc<dyn ObjectStore>> {
    match backend {
        Backend::S3 => s3(url, builder_url, options),
        Backend::Gcs => gcs(url, builder_url, options),
        Backend::Azure => azure(url, builder_url, options),
        Backend::Hdfs => hdfs(url, builder_url, options),
    }
}

#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
macro_rules! cloud_store {
    ($builder:ty, $key:ty, $backend:expr, $url:expr, $builder_url:expr, $options:expr) => {{
        let mut builder = <$builder>::from_env()
            .with_retry(retry_config($url, $backend, $options)?)
            .with_config(
                <$key>::Client(object_store::ClientConfigKey::ConnectTimeout),
                DEFAULT_CONNECT_TIMEOUT,
            )
            .with_config(
                <$key>::Client(object_store::ClientConfigKey::Timeout),
                DEFAULT_TIMEOUT,
            );
        let mut keys: Vec<_> = $options.iter().collect();
        keys.sort();
        for (key, value) in keys {
            if RETRY_KEYS.contains(&key.as_str()) {
                continue;
            }
            let parsed: $key =
                key.to_ascii_lowercase()
                    .parse()
                    .map_err(|_| Error::InvalidOption {
                        location: $url.to_string(),
                        backend: $backend.name(),
                        key: key.clone(),
                        reason: format!(
                            "object_store's {} client has no such option (check the spelling)",
                            $backend.name()
                        ),
                    })?;
            builder = builder.with_config(parsed, value.clone());
        }
        if let Some(builder_url) = $builder_url {
            builder = builder.with_url(builder_url);
        }
        let store = builder.build().map_err(|source| Error::Client {
            location: $url.to_string(),
            source,
        })?;
        Ok(Arc::new(store) as Arc<dyn ObjectStore>)
    }};
}

#[cfg(feature = "aws")]
fn s3(
    url: &str,
    builder_url: Option<&str>,
    options: &HashMap<String, String>,
) -> Result<Arc<dyn ObjectStore>> {
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
    cloud_store!(
        AmazonS3Builder,
        AmazonS3ConfigKey,
        Backend::S3,
        url,
        builder_url,
        options
    )
}

#[cfg(feature = "gcp")]
fn gcs(
    url: &str,
    builder_url: Option<&str>,
    options: &HashMap<String, String>,
) -> Result<Arc<dyn ObjectStore>> {
    use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
    cloud_store!(
        GoogleCloudStorageBuilder,
        GoogleConfigKey,
        Backend::Gcs,
        url,
        builder_url,
        options
    )
}

#[cfg(feature = "azure")]
fn azure(
    url: &str,
    builder_url: Option<&str>,
    options: &HashMap<String, String>,
) -> Result<Arc<dyn ObjectStore>> {
    use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
    cloud_store!(
        MicrosoftAzureBuilder,
        AzureConfigKey,
        Backend::Azure,
        url,
        builder_url,
        options
    )
}

#[cfg(feature = "hdfs")]
fn hdfs(
    url: &str,
    builder_url: Option<&str>,
    options: &HashMap<String, String>,
) -> Result<Arc<dyn ObjectStore>> {
    let mut builder = hdfs_native_object_store::HdfsObjectStoreBuilder::new();
    if let Some(builder_url) = builder_url {
        builder = builder.with_url(builder_url);
    }
    // Every option is Hadoop configuration (core-site/hdfs-site keys), except kolo's own.
    let config: Vec<(String, String)> = options
        .iter()
        .filter(|(key, _)| !RETRY_KEYS.contains(&key.as_str()))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    let store = builder
        .with_config(config)
        .build()
        .map_err(|source| Error::Client {
            location: url.to_string(),
            source,
        })?;
    Ok(Arc::new(store))
}

#[cfg(not(feature = "aws"))]
fn s3(url: &str, _: Option<&str>, _: &HashMap<String, String>) -> Result<Arc<dyn ObjectStore>> {
    Err(disabled(url, Backend::S3))
}

#[cfg(not(feature = "gcp"))]
fn gcs(url: &str, _: Option<&str>, _: &HashMap<String, String>) -> Result<Arc<dyn ObjectStore>> {
    Err(disabled(url, Backend::Gcs))
}

#[cfg(not(feature = "azure"))]
fn azure(url: &str, _: Option<&str>, _: &HashMap<String, String>) -> Result<Arc<dyn ObjectStore>> {
    Err(disabled(url, Backend::Azure))
}

#[cfg(not(feature = "hdfs"))]
fn hdfs(url: &str, _: Option<&str>, _: &HashMap<String, String>) -> Result<Arc<dyn ObjectStore>> {
    Err(disabled(url, Backend::Hdfs))
}

#[cfg(not(all(feature = "aws", feature = "gcp", feature = "azure", feature = "hdfs")))]
fn disabled(url: &str, backend: Backend) -> Error {
    Error::FeatureDisabled {
        location: url.to_string(),
        feature: backend.feature(),
    }
}

/// The retry budget: `max_retries` (default 3) within `retry_timeout` (default 15 s), so a
/// wrong endpoint fails within seconds instead of object_store's default three minutes.
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
fn retry_config(
    url: &str,
    backend: Backend,
    options: &HashMap<String, String>,
) -> Result<object_store::RetryConfig> {
    let bad = |key: &str, reason: &str| Error::InvalidOption {
        location: url.to_string(),
        backend: backend.name(),
        key: key.to_string(),
        reason: reason.to_string(),
    };
    let max_retries = match options.get("max_retries") {
        Some(value) => value
            .trim()
            .parse()
            .map_err(|_| bad("max_retries", "expected a whole number such as 3"))?,
        None => DEFAULT_MAX_RETRIES,
    };
    let retry_timeout = match options.get("retry_timeout") {
        Some(value) => parse_duration(value).ok_or_else(|| {
            bad(
                "retry_timeout",
                "expected seconds such as 15, 15s or 1500ms",
            )
        })?,
        None => Duration::from_secs(DEFAULT_RETRY_TIMEOUT_SECS),
    };
    Ok(object_store::RetryConfig {
        backoff: object_store::BackoffConfig::default(),
        max_retries,
        retry_timeout,
    })
}

/// Parses `15`, `15s`, `1.5s` or `1500ms`.
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
fn parse_duration(value: &str) -> Option<Duration> {
    let value = value.trim();
    let (number, scale) = if let Some(ms) = value.strip_suffix("ms") {
        (ms, 1e-3)
    } else if let Some(s) = value.strip_suffix('s') {
        (s, 1.0)
    } else {
        (value, 1.0)
    };
    let seconds: f64 = number.trim().parse().ok()?;
    (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds * scale))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
    fn options(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
    #[test]
    fn durations() {
        assert_eq!(parse_duration("15"), Some(Duration::from_secs(15)));
        assert_eq!(parse_duration("2s"), Some(Duration::from_secs(2)));
        assert_eq!(parse_duration("1500ms"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("soon"), None);
        assert_eq!(parse_duration("-1"), None);
    }

    #[cfg(feature = "aws")]
    #[test]
    fn s3_accepts_object_store_keys_and_refuses_typos() {
        let url = "s3://bucket/p";
        let good = options(&[
            ("aws_access_key_id", "k"),
            ("aws_secret_access_key", "s"),
            ("aws_endpoint", "http://127.0.0.1:1"),
            ("AWS_ALLOW_HTTP", "true"),
            ("aws_region", "us-east-1"),
            ("timeout", "3s"),
            ("max_retries", "1"),
        ]);
        build(url, Backend::S3, Some("s3://bucket"), &good).unwrap();
        let typo = options(&[("aws_acess_key_id", "k")]);
        let err = build(url, Backend::S3, Some("s3://bucket"), &typo).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidOption { key, .. } if key == "aws_acess_key_id"),
            "{err}"
        );
        let bad_retries = options(&[("max_retries", "many")]);
        let err = build(url, Backend::S3, Some("s3://bucket"), &bad_retries).unwrap_err();
        assert!(err.to_string().contains("whole number"), "{err}");
    }

    #[cfg(not(feature = "aws"))]
    #[test]
    fn compiled_out_backends_name_their_feature() {
        let err = build("s3://b/p", Backend::S3, Some("s3://b"), &HashMap::new()).unwrap_err();
        assert!(
            matches!(err, Error::FeatureDisabled { feature: "aws", .. }),
            "{err}"
        );
        assert!(err.to_string().contains("--features aws"), "{err}");
    }

    #[cfg(feature = "azure")]
    #[test]
    fn azure_emulator_options_build() {
        let opts = options(&[("azure_storage_use_emulator", "true")]);
        build("az://c/p", Backend::Azure, Some("az://c"), &opts).unwrap();
    }

    #[cfg(feature = "gcp")]
    #[test]
    fn gcs_refuses_s3_keys() {
        let opts = options(&[("aws_access_key_id", "k")]);
        let err = build("gs://b/p", Backend::Gcs, Some("gs://b"), &opts).unwrap_err();
        assert!(
            matches!(err, Error::InvalidOption { backend: "gcs", .. }),
            "{err}"
        );
    }
}
