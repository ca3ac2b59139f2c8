//! [`Links`] over the data plane: one cycle's messages on a session acting for a process set,
//! all under the cycle's tag. Point-to-point messages go over the TCP links of the two peers
//! only; the all-to-all exchange uses [`Session::exchange`] (shared memory on one host).

use super::{Digest, Links};
use crate::collectives::Session;
use crate::error::{Error, Result};

const WHAT: &str = "the engine's cycle";

/// One cycle's links among the members of the group `session` acts for.
pub(crate) struct SessionLinks<'s> {
    session: &'s mut Session,
    tag: u32,
}

impl<'s> SessionLinks<'s> {
    /// Takes the session's next tag for this cycle.
    pub(crate) fn new(session: &'s mut Session) -> Self {
        let tag = session.next_tag();
        SessionLinks { session, tag }
    }

    fn transfer(
        &mut self,
        peer: usize,
        bytes: &[u8],
        send: bool,
        max_len: usize,
    ) -> Result<Vec<u8>> {
        let global = self.session.peer(peer);
        let mesh = self.session.mesh.as_mut().ok_or_else(|| {
            Error::Internal("the engine negotiated without a data-plane mesh".into())
        })?;
        let mut out = mesh.transfer(WHAT, self.tag, bytes, max_len, &[(global, send, !send)])?;
        Ok(out.pop().unwrap_or_default())
    }
}

impl Links for SessionLinks<'_> {
    fn rank(&self) -> usize {
        self.session.rank
    }

    fn size(&self) -> usize {
        self.session.size
    }

    fn global(&self, peer: usize) -> usize {
        self.session.peer(peer)
    }

    fn send(&mut self, peer: usize, bytes: &[u8]) -> Result<()> {
        self.transfer(peer, bytes, true, 0).map(drop)
    }

    fn recv(&mut self, peer: usize, max_len: usize) -> Result<Vec<u8>> {
        self.transfer(peer, &[], false, max_len)
    }

    fn exchange_all(&mut self, payload: Vec<u8>, max_len: usize) -> Result<Digest> {
        let all = self.session.exchange(WHAT, self.tag, &payload, max_len)?;
        Ok(Digest::from_payloads(all))
    }
}
