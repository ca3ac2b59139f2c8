//! Authentication of driver calls: every request carries the job secret (hex) in the
//! `kolo-secret` metadata header; the server compares it in constant time.

use std::sync::Arc;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::control::ids::JobSecret;
use crate::error::{Error, Result};

/// The metadata header that carries the job secret (hex) on every call.
pub const SECRET_HEADER: &str = "kolo-secret";

/// The message of the `Unauthenticated` status a call without the right secret gets.
pub const REFUSED_MESSAGE: &str = "wrong or missing job secret";

/// Server side: refuses calls whose `kolo-secret` header does not match the job secret.
#[derive(Debug, Clone)]
pub(crate) struct CheckSecret {
    secret: Arc<JobSecret>,
}

impl CheckSecret {
    pub(crate) fn new(secret: JobSecret) -> Self {
        Self {
            secret: Arc::new(secret),
        }
    }
}

impl Interceptor for CheckSecret {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let presented = request
            .metadata()
            .get(SECRET_HEADER)
            .and_then(|value| value.to_str().ok())
            .and_then(|text| hex::decode(text).ok());
        if presented.is_some_and(|bytes| self.secret.matches(&bytes)) {
            return Ok(request);
        }
        let peer = request
            .remote_addr()
            .map_or_else(|| "an unknown address".to_owned(), |addr| addr.to_string());
        log::warn!("job driver refused a call from {peer}: {REFUSED_MESSAGE}");
        Err(Status::unauthenticated(REFUSED_MESSAGE))
    }
}

/// Client side: adds the `kolo-secret` header to every call.
#[derive(Clone)]
pub struct AddSecret {
    value: MetadataValue<Ascii>,
}

impl std::fmt::Debug for AddSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AddSecret(<redacted>)")
    }
}

impl AddSecret {
    /// The interceptor for `secret`.
    pub fn new(secret: &JobSecret) -> Result<Self> {
        let mut value: MetadataValue<Ascii> = secret
            .to_hex()
            .parse()
            .map_err(|_| Error::Internal("hex is not valid metadata".into()))?;
        value.set_sensitive(true);
        Ok(Self { value })
    }
}

impl Interceptor for AddSecret {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        request
            .metadata_mut()
            .insert(SECRET_HEADER, self.value.clone());
        Ok(request)
    }
}
