//! The gRPC handlers of the driver service: thin wrappers over [`JobState`].

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::abort::AbortCause;
use crate::control::driver_state::JobState;
use crate::control::proto::driver_server::Driver;
use crate::control::proto::{
    AbortEvent, FailureReply, FailureReport, HeartbeatReply, HeartbeatRequest, KvGetReply,
    KvGetRequest, KvPutReply, KvPutRequest, LeaveReply, LeaveRequest, RegisterReply,
    RegisterRequest, WatchAbortRequest,
};

/// The service implementation handed to tonic.
#[derive(Debug)]
pub(crate) struct Handlers {
    pub(crate) state: Arc<JobState>,
}

pub(crate) fn abort_event(cause: AbortCause) -> AbortEvent {
    AbortEvent {
        rank: cause.rank,
        host: cause.host,
        message: cause.message,
    }
}

#[tonic::async_trait]
impl Driver for Handlers {
    async fn register(
        &self,
        request: Request<RegisterRequest>,
    ) -> Result<Response<RegisterReply>, Status> {
        let peer = request.remote_addr();
        let request = request.into_inner();
        log::debug!(
            "task {} registering from {peer:?} (round {}): host {} ({}), pid {}, data {}",
            request.task_index,
            request.generation,
            request.hostname,
            request.host_hash,
            request.pid,
            request.data_addr
        );
        self.state.register(&request)?;
        Ok(Response::new(
            self.state
                .await_assignment(request.task_index, request.generation)
                .await?,
        ))
    }

    async fn kv_put(&self, request: Request<KvPutRequest>) -> Result<Response<KvPutReply>, Status> {
        let request = request.into_inner();
        self.state.kv_put(request.key, request.value);
        Ok(Response::new(KvPutReply {}))
    }

    async fn kv_get(&self, request: Request<KvGetRequest>) -> Result<Response<KvGetReply>, Status> {
        let request = request.into_inner();
        let value = self
            .state
            .kv_get(&request.key, Duration::from_millis(request.timeout_ms))
            .await?;
        Ok(Response::new(KvGetReply { value }))
    }

    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatReply>, Status> {
        let aborted = self.state.heartbeat(request.into_inner().rank);
        Ok(Response::new(HeartbeatReply { aborted }))
    }

    async fn report_failure(
        &self,
        request: Request<FailureReport>,
    ) -> Result<Response<FailureReply>, Status> {
        let report = request.into_inner();
        self.state.report_failure(report.rank, report.message);
        Ok(Response::new(FailureReply {}))
    }

    type WatchAbortStream = ReceiverStream<Result<AbortEvent, Status>>;

    async fn watch_abort(
        &self,
        _request: Request<WatchAbortRequest>,
    ) -> Result<Response<Self::WatchAbortStream>, Status> {
        let (sender, receiver) = mpsc::channel(1);
        let state = Arc::clone(&self.state);
        tokio::spawn(async move {
            tokio::select! {
                cause = state.next_abort() => {
                    if let Some(cause) = cause {
                        let _ = sender.send(Ok(abort_event(cause))).await;
                    }
                }
                _ = sender.closed() => {}
            }
        });
        Ok(Response::new(ReceiverStream::new(receiver)))
    }

    async fn leave(&self, request: Request<LeaveRequest>) -> Result<Response<LeaveReply>, Status> {
        self.state.leave(request.into_inner().rank);
        Ok(Response::new(LeaveReply {}))
    }
}
