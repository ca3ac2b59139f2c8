//! The gRPC handlers of the driver service: thin wrappers over [`JobState`].

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::abort::AbortCause;
use crate::control::driver_state::JobState;
use crate::control::proto::driver_server::Driver;
use crate::control::proto::{
    AbortEvent, FailureReply, FailureReport, HeartbeatReply, HeartbeatRequest, HostUpdate, KvChunk,
    KvGetReply, KvGetRequest, KvPutReply, KvPutRequest, LeaveReply, LeaveRequest, PostReply,
    PostRequest, RegisterReply, RegisterRequest, SilentRanksReply, SilentRanksRequest,
    WatchAbortRequest,
};
use crate::control::runner_watch::{RUNNER_GRACE, RUNNER_RANK};
use crate::control::service::MAX_TASKS;

/// The size of the chunks `KvGetStream` sends.
pub(crate) const KV_CHUNK: usize = 1 << 20;
/// The largest value `KvPutStream` accepts.
const MAX_STREAMED_VALUE: usize = 16 << 30;

/// The service implementation handed to tonic.
#[derive(Debug)]
pub(crate) struct Handlers {
    pub(crate) state: Arc<JobState>,
}

/// `AbortEvent.kind`: the job is aborted.
const KIND_ABORT: u32 = 0;
/// `AbortEvent.kind`: the watcher's elastic round is over (it resets).
pub(crate) const KIND_RESET: u32 = 1;
/// `AbortEvent.kind`: host updates only.
pub(crate) const KIND_HOSTS_UPDATED: u32 = 2;

pub(crate) fn abort_event(cause: AbortCause) -> AbortEvent {
    event(KIND_ABORT, cause)
}

fn event(kind: u32, cause: AbortCause) -> AbortEvent {
    AbortEvent {
        rank: cause.rank,
        host: cause.host,
        message: cause.message,
        kind,
        host_updates: Vec::new(),
    }
}

/// An elastic worker's watch stream: host updates as they are recorded, then one final event
/// (the job's abort, the task's removal, or the end of its round).
async fn watch_elastic(
    state: Arc<JobState>,
    task_index: u32,
    generation: u32,
    sender: mpsc::Sender<Result<AbortEvent, Status>>,
) {
    let mut membership = state.subscribe_membership();
    let mut rounds = state.subscribe_rounds();
    let mut abort = state.subscribe_abort();
    let mut shutdown = state.subscribe_shutdown();
    let mut cursor = None;
    loop {
        membership.borrow_and_update();
        rounds.borrow_and_update();
        if let Some(cause) = state.abort_cause() {
            let _ = sender.send(Ok(abort_event(cause))).await;
            return;
        }
        if *shutdown.borrow() {
            return;
        }
        let news = state.elastic_news(task_index, generation, cursor);
        cursor = Some(news.cursor);
        if !news.updates.is_empty() {
            let updates = AbortEvent {
                kind: KIND_HOSTS_UPDATED,
                host_updates: news
                    .updates
                    .iter()
                    .map(|u| HostUpdate {
                        timestamp: u.timestamp,
                        result: u.result,
                    })
                    .collect(),
                ..AbortEvent::default()
            };
            if sender.send(Ok(updates)).await.is_err() {
                return;
            }
        }
        if news.removed {
            let cause = AbortCause {
                rank: None,
                host: String::new(),
                message: format!(
                    "task {task_index} was removed from the elastic job (reported failed, its \
                     heartbeats were lost, or the launcher removed it); this process must exit"
                ),
            };
            let _ = sender.send(Ok(abort_event(cause))).await;
            return;
        }
        if let Some(cause) = news.over {
            let _ = sender.send(Ok(event(KIND_RESET, cause))).await;
            return;
        }
        tokio::select! {
            changed = membership.changed() => if changed.is_err() { return },
            changed = rounds.changed() => if changed.is_err() { return },
            _ = abort.wait_for(Option::is_some) => {}
            _ = shutdown.wait_for(|down| *down) => return,
            () = sender.closed() => return,
        }
    }
}

/// A task runner's watch stream: the job's abort, like a plain watch; when the runner's end of
/// it closes, the task may be lost (see [`crate::control::runner_watch`]).
async fn watch_runner(
    state: Arc<JobState>,
    task_index: u32,
    sender: mpsc::Sender<Result<AbortEvent, Status>>,
) {
    if task_index as usize >= MAX_TASKS {
        let _ = sender
            .send(Err(Status::invalid_argument(format!(
                "task index {task_index} is out of range (at most {})",
                MAX_TASKS - 1
            ))))
            .await;
        return;
    }
    let lease = state.runner_watch_opened(task_index);
    tokio::select! {
        cause = state.next_abort() => {
            let Some(cause) = cause else { return };
            let _ = sender.send(Ok(abort_event(cause))).await;
            if state.is_elastic() {
                return;
            }
            // A fixed job's launcher waits for every rank's exit after an abort: a runner
            // that is gone (its executor died) never posts one, so keep watching for its end.
            let mut shutdown = state.subscribe_shutdown();
            tokio::select! {
                () = sender.closed() => {}
                _ = shutdown.wait_for(|down| *down) => return,
            }
        }
        () = sender.closed() => {}
    }
    let ended = tokio::time::Instant::now();
    tokio::time::sleep(RUNNER_GRACE).await;
    state.runner_watch_ended(task_index, lease, ended).await;
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
        let generation = self.state.register(&request)?;
        Ok(Response::new(
            self.state
                .await_assignment(request.task_index, generation)
                .await?,
        ))
    }

    async fn kv_put(&self, request: Request<KvPutRequest>) -> Result<Response<KvPutReply>, Status> {
        let request = request.into_inner();
        self.state
            .kv_put(request.key, request.value.into())
            .map_err(Status::resource_exhausted)?;
        Ok(Response::new(KvPutReply {}))
    }

    async fn kv_get(&self, request: Request<KvGetRequest>) -> Result<Response<KvGetReply>, Status> {
        let request = request.into_inner();
        let value = self
            .state
            .kv_get(&request.key, Duration::from_millis(request.timeout_ms))
            .await?;
        Ok(Response::new(KvGetReply {
            value: value.to_vec(),
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatReply>, Status> {
        let request = request.into_inner();
        let aborted = self
            .state
            .heartbeat(request.rank, request.task_index, request.generation);
        Ok(Response::new(HeartbeatReply { aborted }))
    }

    async fn silent_ranks(
        &self,
        request: Request<SilentRanksRequest>,
    ) -> Result<Response<SilentRanksReply>, Status> {
        let request = request.into_inner();
        let reply = self
            .state
            .silent_ranks(Duration::from_millis(request.silent_for_ms));
        log::debug!(
            "rank {} asked which ranks are silent for {} ms: {:?}",
            request.rank,
            request.silent_for_ms,
            reply.ranks.iter().map(|r| r.rank).collect::<Vec<_>>()
        );
        Ok(Response::new(reply))
    }

    async fn report_failure(
        &self,
        request: Request<FailureReport>,
    ) -> Result<Response<FailureReply>, Status> {
        let report = request.into_inner();
        match report.task_index {
            Some(task_index) => self.state.report_task_failure(task_index, report.message),
            None => self.state.report_failure(report.rank, report.message),
        }
        Ok(Response::new(FailureReply {}))
    }

    type WatchAbortStream = ReceiverStream<Result<AbortEvent, Status>>;

    async fn watch_abort(
        &self,
        request: Request<WatchAbortRequest>,
    ) -> Result<Response<Self::WatchAbortStream>, Status> {
        let request = request.into_inner();
        let (sender, receiver) = mpsc::channel(1);
        let state = Arc::clone(&self.state);
        if let (RUNNER_RANK, Some(task_index)) = (request.rank, request.task_index) {
            tokio::spawn(watch_runner(state, task_index, sender));
            return Ok(Response::new(ReceiverStream::new(receiver)));
        }
        if let (true, Some(task_index)) = (state.is_elastic(), request.task_index) {
            tokio::spawn(watch_elastic(state, task_index, request.generation, sender));
            return Ok(Response::new(ReceiverStream::new(receiver)));
        }
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

    async fn post(&self, request: Request<PostRequest>) -> Result<Response<PostReply>, Status> {
        let request = request.into_inner();
        self.state.post(request.task_index, request.events).await?;
        Ok(Response::new(PostReply {
            aborted: self.state.abort_cause().is_some(),
        }))
    }

    async fn kv_put_stream(
        &self,
        request: Request<Streaming<KvChunk>>,
    ) -> Result<Response<KvPutReply>, Status> {
        let mut chunks = request.into_inner();
        let mut key: Option<String> = None;
        let mut value = Vec::new();
        while let Some(chunk) = chunks.message().await? {
            if key.is_none() {
                if chunk.key.is_empty() {
                    return Err(Status::invalid_argument(
                        "the first chunk of a streamed put must name the key",
                    ));
                }
                key = Some(chunk.key);
            }
            if value.len() + chunk.data.len() > MAX_STREAMED_VALUE {
                return Err(Status::resource_exhausted(format!(
                    "a streamed value may hold at most {MAX_STREAMED_VALUE} bytes"
                )));
            }
            value.extend_from_slice(&chunk.data);
        }
        let key = key.ok_or_else(|| Status::invalid_argument("a streamed put sent no chunk"))?;
        self.state
            .kv_put(key, value.into())
            .map_err(Status::resource_exhausted)?;
        Ok(Response::new(KvPutReply {}))
    }

    type KvGetStreamStream = ReceiverStream<Result<KvChunk, Status>>;

    async fn kv_get_stream(
        &self,
        request: Request<KvGetRequest>,
    ) -> Result<Response<Self::KvGetStreamStream>, Status> {
        let request = request.into_inner();
        let value = self
            .state
            .kv_get(&request.key, Duration::from_millis(request.timeout_ms))
            .await?;
        let (sender, receiver) = mpsc::channel(4);
        tokio::spawn(async move {
            let mut pieces = value.chunks(KV_CHUNK).peekable();
            if pieces.peek().is_none() {
                let _ = sender.send(Ok(KvChunk::default())).await;
            }
            for piece in pieces {
                let chunk = KvChunk {
                    key: String::new(),
                    data: piece.to_vec(),
                };
                if sender.send(Ok(chunk)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(receiver)))
    }

    async fn leave(&self, request: Request<LeaveRequest>) -> Result<Response<LeaveReply>, Status> {
        let request = request.into_inner();
        self.state
            .leave(request.rank, request.task_index, request.generation);
        Ok(Response::new(LeaveReply {}))
    }
}
