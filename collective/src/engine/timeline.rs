//! Chrome-trace timeline of the engine's work, like Horovod's `HOROVOD_TIMELINE`.
//!
//! A recording is a file in the [Chrome trace event format]: `[`, then one JSON event object per
//! line separated by commas, then `]` when the recording stops. Open it in Perfetto
//! (<https://ui.perfetto.dev> → "Open trace file") or in `chrome://tracing` → "Load".
//!
//! Every tensor name is one trace "process" (`pid` 1, 2, ... in order of first appearance),
//! introduced by `process_name` and `process_sort_index` metadata events (`"ph":"M"`). On its
//! row a tensor shows nested duration spans (`"ph":"B"` / `"ph":"E"`, `ts` in microseconds since
//! the recording started): `NEGOTIATE_<KIND>` while the ranks agree on it, then `<KIND>` (for
//! example `ALLREDUCE`) holding activity spans such as `QUEUE`, `MEMCPY_IN_FUSION_BUFFER`,
//! `TCP_ALLREDUCE` and `MEMCPY_OUT_FUSION_BUFFER`. With cycle marking each engine cycle adds a
//! global instant event `CYCLE_START` (`"ph":"i"`, `"s":"g"`).
//!
//! Spans still open when a recording stops are closed at the stop time, and an end without a
//! matching begin in the same recording is dropped, so every file is balanced.
//!
//! Off, every recording call is one atomic load. On, the recording thread (the one running the
//! engine's cycle) only takes the timestamp and appends a small unformatted event to a batch;
//! a full batch ([`BATCH_EVENTS`]), or one holding events older than [`FLUSH_AFTER`], goes to a
//! writer thread in one message, and the writer does all formatting and file I/O. So a
//! recording costs the engine thread no allocation, formatting or system call per event, and
//! wakes the writer once per batch rather than once per event: on a machine with as many busy
//! threads as cores, the writer's wake-ups and small writes were what slowed the ranks. Events
//! still in the batch reach the file at the next recorded event older than [`FLUSH_AFTER`], or
//! when the recording stops.
//!
//! [Chrome trace event format]: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::wire::OpKind;

/// How many events the recording thread collects before it hands them to the writer.
pub const BATCH_EVENTS: usize = 4096;

/// The longest an event waits in a batch while events keep being recorded.
pub const FLUSH_AFTER: Duration = Duration::from_millis(100);

/// Records engine activity as a Chrome trace; off until [`Timeline::start`].
///
/// Safe to share between the engine thread (which records) and other threads (which start and
/// stop recordings). Events racing with [`Timeline::stop`] may be dropped.
#[derive(Debug, Default)]
pub struct Timeline {
    /// Whether a recording is running; the only thing the recording calls read when off.
    on: AtomicBool,
    /// Where the recording calls send events; held only for the length of one call.
    sink: Mutex<Option<Sink>>,
    /// The writer thread of the running recording; held for all of `start` and `stop`.
    writer: Mutex<Option<JoinHandle<io::Result<()>>>>,
}

/// The recording side of a running recording.
#[derive(Debug)]
struct Sink {
    events: Sender<Vec<Event>>,
    /// Events not yet handed to the writer, oldest first.
    batch: Vec<Event>,
    /// When (`ts`) the oldest event of `batch` was recorded.
    batch_since: u64,
    /// How many batches went to the writer.
    batches_sent: u64,
    started: Instant,
    mark_cycles: bool,
    rows: HashMap<String, Row>,
}

/// One tensor's trace process.
#[derive(Debug)]
struct Row {
    pid: u32,
    /// Spans begun and not yet ended.
    open: u32,
}

/// What the writer thread receives; `ts` in nanoseconds since the recording started.
#[derive(Debug)]
enum Event {
    NewRow { pid: u32, tensor: String },
    Begin { pid: u32, ts: u64, label: Label },
    End { pid: u32, ts: u64 },
    Cycle { ts: u64 },
}

/// The name of a span, formatted by the writer thread.
#[derive(Debug)]
enum Label {
    Negotiate(OpKind),
    Op(OpKind),
    Activity(Cow<'static, str>),
}

impl Timeline {
    /// A timeline that records nothing until started.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts writing to `path` (stopping a running recording first; a failure to finish that
    /// one is logged). Fails with [`Error::Io`] if the file cannot be created.
    pub fn start(&self, path: &Path, mark_cycles: bool) -> Result<()> {
        let mut writer = lock(&self.writer);
        if let Err(e) = self.stop_locked(&mut writer) {
            log::warn!("finishing the previous timeline failed: {e}");
        }
        let file = File::create(path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot create timeline file {}: {e}", path.display()),
            )
        })?;
        let (events, received) = mpsc::channel();
        let handle = std::thread::Builder::new()
            .name("kolo-timeline".into())
            .spawn(move || write_trace(received, file))?;
        *lock(&self.sink) = Some(Sink {
            events,
            batch: Vec::with_capacity(BATCH_EVENTS),
            batch_since: 0,
            batches_sent: 0,
            started: Instant::now(),
            mark_cycles,
            rows: HashMap::new(),
        });
        *writer = Some(handle);
        self.on.store(true, Ordering::Release);
        log::info!("timeline recording to {}", path.display());
        Ok(())
    }

    /// Flushes and closes the file, which is then a complete JSON array; does nothing when off.
    pub fn stop(&self) -> Result<()> {
        self.stop_locked(&mut lock(&self.writer))
    }

    /// Whether a recording is running.
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// `NEGOTIATE_<KIND>` begins for `tensor`.
    pub fn negotiate_start(&self, tensor: &str, kind: OpKind) {
        self.with_sink(|sink| sink.begin(tensor, Label::Negotiate(kind)));
    }

    /// The negotiation of `tensor` ended.
    pub fn negotiate_end(&self, tensor: &str) {
        self.with_sink(|sink| sink.end(tensor));
    }

    /// `<KIND>` begins for `tensor`.
    pub fn start_op(&self, tensor: &str, kind: OpKind) {
        self.with_sink(|sink| sink.begin(tensor, Label::Op(kind)));
    }

    /// An activity (`QUEUE`, `MEMCPY_IN_FUSION_BUFFER`, `TCP_ALLREDUCE`, ...) begins. A
    /// `&'static str` is recorded without a copy.
    pub fn activity_start(&self, tensor: &str, activity: impl Into<Cow<'static, str>>) {
        self.with_sink(|sink| sink.begin(tensor, Label::Activity(activity.into())));
    }

    /// The current activity of `tensor` ended.
    pub fn activity_end(&self, tensor: &str) {
        self.with_sink(|sink| sink.end(tensor));
    }

    /// The op of `tensor` ended.
    pub fn end_op(&self, tensor: &str) {
        self.with_sink(|sink| sink.end(tensor));
    }

    /// A `CYCLE_START` instant event, when the recording was started with `mark_cycles`.
    pub fn mark_cycle(&self) {
        self.with_sink(|sink| {
            if sink.mark_cycles {
                let ts = sink.now();
                sink.send(Event::Cycle { ts }, ts);
            }
        });
    }

    /// Runs `record` on the running recording; one atomic load when off.
    fn with_sink(&self, record: impl FnOnce(&mut Sink)) {
        if !self.on.load(Ordering::Acquire) {
            return;
        }
        if let Some(sink) = lock(&self.sink).as_mut() {
            record(sink);
        }
    }

    /// Stops the running recording, if any; `writer` is the held `self.writer`.
    fn stop_locked(&self, writer: &mut Option<JoinHandle<io::Result<()>>>) -> Result<()> {
        self.on.store(false, Ordering::Release);
        let Some(handle) = writer.take() else {
            return Ok(());
        };
        // Dropping the sink drops the channel's sender, which ends the writer's loop.
        if let Some(mut sink) = lock(&self.sink).take() {
            sink.close_open_spans();
        }
        match handle.join() {
            Ok(written) => written.map_err(Error::from),
            Err(_) => Err(Error::Internal(
                "the timeline writer thread panicked".into(),
            )),
        }
    }
}

impl Drop for Timeline {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            log::warn!("stopping the timeline failed: {e}");
        }
    }
}

impl Sink {
    fn now(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Adds `event` (recorded at `ts`) to the batch, handing the batch to the writer when it
    /// is full or its oldest event is older than [`FLUSH_AFTER`].
    fn send(&mut self, event: Event, ts: u64) {
        if self.batch.is_empty() {
            self.batch_since = ts;
        }
        self.batch.push(event);
        let waited = ts.saturating_sub(self.batch_since);
        if self.batch.len() >= BATCH_EVENTS || waited >= FLUSH_AFTER.as_nanos() as u64 {
            self.flush();
        }
    }

    /// Hands the batch to the writer; if the writer has stopped (a write failed) the events
    /// are dropped and the failure is reported by `stop`.
    fn flush(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH_EVENTS));
        self.batches_sent += 1;
        let _ = self.events.send(batch);
    }

    fn begin(&mut self, tensor: &str, label: Label) {
        let ts = self.now();
        let pid = match self.rows.get_mut(tensor) {
            Some(row) => {
                row.open += 1;
                row.pid
            }
            None => {
                let pid = u32::try_from(self.rows.len() + 1).unwrap_or(u32::MAX);
                self.rows.insert(tensor.to_owned(), Row { pid, open: 1 });
                self.send(
                    Event::NewRow {
                        pid,
                        tensor: tensor.to_owned(),
                    },
                    ts,
                );
                pid
            }
        };
        self.send(Event::Begin { pid, ts, label }, ts);
    }

    fn end(&mut self, tensor: &str) {
        let ts = self.now();
        let Some(row) = self.rows.get_mut(tensor) else {
            return;
        };
        if row.open == 0 {
            return;
        }
        row.open -= 1;
        let pid = row.pid;
        self.send(Event::End { pid, ts }, ts);
    }

    /// Ends every open span and hands the last batch to the writer.
    fn close_open_spans(&mut self) {
        let ts = self.now();
        for row in self.rows.values_mut() {
            for _ in 0..row.open {
                self.batch.push(Event::End { pid: row.pid, ts });
            }
            row.open = 0;
        }
        self.flush();
    }
}

/// The writer thread: writes every received batch of events, flushing the file whenever the
/// channel is empty, and closes the JSON array once all senders are gone.
fn write_trace(batches: Receiver<Vec<Event>>, file: File) -> io::Result<()> {
    let mut out = BufWriter::with_capacity(256 * 1024, file);
    out.write_all(b"[")?;
    let mut text = String::new();
    let mut first = true;
    loop {
        let batch = match batches.try_recv() {
            Ok(batch) => batch,
            Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) => {
                out.flush()?;
                match batches.recv() {
                    Ok(batch) => batch,
                    Err(_) => break,
                }
            }
        };
        text.clear();
        for event in &batch {
            text.push_str(if first { "\n" } else { ",\n" });
            event.write_json(&mut text);
            first = false;
        }
        out.write_all(text.as_bytes())?;
    }
    out.write_all(b"\n]\n")?;
    out.flush()
}

impl Event {
    /// Appends the event as JSON object(s) (a new row is two metadata objects).
    fn write_json(&self, out: &mut String) {
        match self {
            Event::NewRow { pid, tensor } => {
                out.push_str(r#"{"name":"process_name","ph":"M","pid":"#);
                let _ = write!(out, r#"{pid},"tid":0,"args":{{"name":"#);
                push_json_string(out, tensor);
                let _ = write!(
                    out,
                    r#"}}}},{{"name":"process_sort_index","ph":"M","pid":{pid},"tid":0,"args":{{"sort_index":{pid}}}}}"#
                );
            }
            Event::Begin { pid, ts, label } => {
                out.push_str(r#"{"name":"#);
                match label {
                    Label::Negotiate(kind) => {
                        out.push_str("\"NEGOTIATE_");
                        push_upper(out, kind.name());
                        out.push('"');
                    }
                    Label::Op(kind) => {
                        out.push('"');
                        push_upper(out, kind.name());
                        out.push('"');
                    }
                    Label::Activity(activity) => push_json_string(out, activity),
                }
                out.push_str(r#","ph":"B","ts":"#);
                push_micros(out, *ts);
                let _ = write!(out, r#","pid":{pid},"tid":0}}"#);
            }
            Event::End { pid, ts } => {
                out.push_str(r#"{"ph":"E","ts":"#);
                push_micros(out, *ts);
                let _ = write!(out, r#","pid":{pid},"tid":0}}"#);
            }
            Event::Cycle { ts } => {
                out.push_str(r#"{"name":"CYCLE_START","ph":"i","s":"g","ts":"#);
                push_micros(out, *ts);
                out.push_str(r#","pid":0,"tid":0}"#);
            }
        }
    }
}

/// Appends `nanos` as microseconds with three decimals (`1234.567`), without float formatting.
fn push_micros(out: &mut String, nanos: u64) {
    let _ = write!(out, "{}.{:03}", nanos / 1000, nanos % 1000);
}

fn push_upper(out: &mut String, s: &str) {
    out.extend(s.chars().map(|c| c.to_ascii_uppercase()));
}

/// Appends `s` as a JSON string literal (quoted and escaped).
fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c < ' ' => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Locks `mutex`, ignoring poisoning (the guarded state stays consistent between statements).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;
    use std::sync::Arc;

    use super::*;

    /// A parsed JSON value (a minimal strict parser: enough to prove the trace is valid JSON).
    #[derive(Debug, Clone, PartialEq)]
    enum Json {
        Null,
        Bool(bool),
        Num(f64),
        Str(String),
        Arr(Vec<Json>),
        Obj(BTreeMap<String, Json>),
    }

    impl Json {
        fn get(&self, key: &str) -> Option<&Json> {
            match self {
                Json::Obj(map) => map.get(key),
                _ => None,
            }
        }
        fn str(&self, key: &str) -> Option<&str> {
            match self.get(key) {
                Some(Json::Str(s)) => Some(s),
                _ => None,
            }
        }
        fn num(&self, key: &str) -> Option<f64> {
            match self.get(key) {
                Some(Json::Num(n)) => Some(*n),
                _ => None,
            }
        }
    }

    struct Parser<'a> {
        text: &'a str,
        s: &'a [u8],
        i: usize,
    }

    impl Parser<'_> {
        fn parse(text: &str) -> Json {
            let mut p = Parser {
                text,
                s: text.as_bytes(),
                i: 0,
            };
            let value = p.value();
            p.ws();
            assert_eq!(p.i, p.s.len(), "trailing characters after JSON value");
            value
        }
        fn ws(&mut self) {
            while self.i < self.s.len() && b" \t\r\n".contains(&self.s[self.i]) {
                self.i += 1;
            }
        }
        fn eat(&mut self, c: u8) {
            self.ws();
            assert_eq!(
                self.s.get(self.i),
                Some(&c),
                "expected {:?} at {}",
                c as char,
                self.i
            );
            self.i += 1;
        }
        fn peek(&mut self) -> u8 {
            self.ws();
            *self.s.get(self.i).expect("unexpected end of JSON")
        }
        fn value(&mut self) -> Json {
            match self.peek() {
                b'{' => {
                    self.eat(b'{');
                    let mut map = BTreeMap::new();
                    if self.peek() != b'}' {
                        loop {
                            let key = self.string();
                            self.eat(b':');
                            map.insert(key, self.value());
                            if self.peek() != b',' {
                                break;
                            }
                            self.eat(b',');
                        }
                    }
                    self.eat(b'}');
                    Json::Obj(map)
                }
                b'[' => {
                    self.eat(b'[');
                    let mut items = Vec::new();
                    if self.peek() != b']' {
                        loop {
                            items.push(self.value());
                            if self.peek() != b',' {
                                break;
                            }
                            self.eat(b',');
                        }
                    }
                    self.eat(b']');
                    Json::Arr(items)
                }
                b'"' => Json::Str(self.string()),
                b't' => self.literal("true", Json::Bool(true)),
                b'f' => self.literal("false", Json::Bool(false)),
                b'n' => self.literal("null", Json::Null),
                _ => {
                    let start = self.i;
                    while self.i < self.s.len() && b"+-.eE0123456789".contains(&self.s[self.i]) {
                        self.i += 1;
                    }
                    let text = &self.text[start..self.i];
                    Json::Num(
                        text.parse()
                            .unwrap_or_else(|_| panic!("bad number {text:?}")),
                    )
                }
            }
        }
        fn literal(&mut self, word: &str, value: Json) -> Json {
            assert!(self.s[self.i..].starts_with(word.as_bytes()));
            self.i += word.len();
            value
        }
        fn string(&mut self) -> String {
            self.eat(b'"');
            let mut out = String::new();
            loop {
                let c = self.text[self.i..]
                    .chars()
                    .next()
                    .expect("unterminated string");
                self.i += c.len_utf8();
                match c {
                    '"' => return out,
                    '\\' => {
                        let e = self.s[self.i];
                        self.i += 1;
                        match e {
                            b'"' => out.push('"'),
                            b'\\' => out.push('\\'),
                            b'/' => out.push('/'),
                            b'n' => out.push('\n'),
                            b'r' => out.push('\r'),
                            b't' => out.push('\t'),
                            b'b' => out.push('\u{8}'),
                            b'f' => out.push('\u{c}'),
                            b'u' => {
                                let hex = &self.text[self.i..self.i + 4];
                                self.i += 4;
                                let code = u32::from_str_radix(hex, 16).unwrap();
                                out.push(char::from_u32(code).expect("surrogates not expected"));
                            }
                            _ => panic!("bad escape \\{}", e as char),
                        }
                    }
                    c => {
                        assert!(c >= ' ', "raw control character {c:?} in JSON string");
                        out.push(c);
                    }
                }
            }
        }
    }

    /// A fresh directory for one test.
    fn temp_dir(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kolo-timeline-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Parses a finished trace into its events.
    fn read_trace(path: &Path) -> Vec<Json> {
        let text = std::fs::read_to_string(path).unwrap();
        match Parser::parse(&text) {
            Json::Arr(events) => events,
            other => panic!("trace is not a JSON array: {other:?}"),
        }
    }

    /// Tensor name → pid, from the `process_name` metadata events.
    fn rows(events: &[Json]) -> BTreeMap<String, f64> {
        events
            .iter()
            .filter(|e| e.str("name") == Some("process_name"))
            .map(|e| {
                assert_eq!(e.str("ph"), Some("M"));
                let name = e.get("args").unwrap().str("name").unwrap().to_owned();
                (name, e.num("pid").unwrap())
            })
            .collect()
    }

    /// Asserts B/E nest properly per pid with non-decreasing timestamps; returns the span count.
    fn assert_balanced(events: &[Json]) -> usize {
        let mut open: BTreeMap<u64, usize> = BTreeMap::new();
        let mut last_ts = 0.0;
        let mut spans = 0;
        for e in events {
            let Some(ph) = e.str("ph") else {
                panic!("event without ph: {e:?}")
            };
            if ph == "M" {
                continue;
            }
            let ts = e.num("ts").unwrap();
            assert!(ts >= last_ts, "timestamps go back: {ts} < {last_ts}");
            last_ts = ts;
            let pid = e.num("pid").unwrap() as u64;
            match ph {
                "B" => {
                    assert!(e.str("name").is_some());
                    *open.entry(pid).or_default() += 1;
                    spans += 1;
                }
                "E" => {
                    let depth = open.get_mut(&pid).expect("E before any B");
                    assert!(*depth > 0, "unbalanced E on pid {pid}");
                    *depth -= 1;
                }
                "i" => assert_eq!(e.str("name"), Some("CYCLE_START")),
                other => panic!("unexpected ph {other}"),
            }
        }
        assert!(open.values().all(|&d| d == 0), "open spans left: {open:?}");
        spans
    }

    fn record_allreduce(timeline: &Timeline, tensor: &str) {
        timeline.negotiate_start(tensor, OpKind::Allreduce);
        timeline.negotiate_end(tensor);
        timeline.start_op(tensor, OpKind::Allreduce);
        for activity in [
            "QUEUE",
            "MEMCPY_IN_FUSION_BUFFER",
            "TCP_ALLREDUCE",
            "MEMCPY_OUT_FUSION_BUFFER",
        ] {
            timeline.activity_start(tensor, activity);
            timeline.activity_end(tensor);
        }
        timeline.end_op(tensor);
    }

    #[test]
    fn json_string_escapes_quotes_backslashes_and_control_chars() {
        let cases = [
            ("plain.name", r#""plain.name""#),
            ("a\"b", r#""a\"b""#),
            ("a\\b", r#""a\\b""#),
            ("l1\nl2\r\t", r#""l1\nl2\r\t""#),
            ("\u{0}\u{1f}", r#""\u0000\u001f""#),
            ("grad/ünï€", "\"grad/ünï€\""),
        ];
        for (raw, want) in cases {
            let mut out = String::new();
            push_json_string(&mut out, raw);
            assert_eq!(out, want);
            assert_eq!(Parser::parse(&out), Json::Str(raw.to_owned()));
        }
    }

    #[test]
    fn timestamps_are_microseconds_with_three_decimals() {
        for (nanos, want) in [
            (0, "0.000"),
            (999, "0.999"),
            (1_000, "1.000"),
            (1_234_567, "1234.567"),
            (u64::MAX, "18446744073709551.615"),
        ] {
            let mut out = String::new();
            push_micros(&mut out, nanos);
            assert_eq!(out, want);
        }
    }

    /// How many batches the running recording handed to the writer.
    fn batches_sent(timeline: &Timeline) -> u64 {
        lock(&timeline.sink).as_ref().unwrap().batches_sent
    }

    #[test]
    fn events_reach_the_writer_in_batches_and_all_reach_the_file() {
        let dir = temp_dir("batches");
        let path = dir.join("trace.json");
        let timeline = Timeline::new();
        timeline.start(&path, true).unwrap();
        // 12 events per op (6 spans) and one cycle mark: about 3.5 batches.
        let ops = 3 * BATCH_EVENTS / 12 + BATCH_EVENTS / 24;
        for i in 0..ops {
            timeline.mark_cycle();
            record_allreduce(&timeline, &format!("grad.{}", i % 50));
        }
        let events = ops * 13 + 50;
        let sent = batches_sent(&timeline);
        assert_eq!(sent, (events / BATCH_EVENTS) as u64, "{events} events");
        timeline.stop().unwrap();

        let trace = read_trace(&path);
        assert_eq!(rows(&trace).len(), 50);
        assert_eq!(assert_balanced(&trace), ops * 6);
        let marks = trace.iter().filter(|e| e.str("ph") == Some("i")).count();
        assert_eq!(marks, ops);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_batch_older_than_flush_after_reaches_the_file_while_recording() {
        let dir = temp_dir("flush");
        let path = dir.join("trace.json");
        let timeline = Timeline::new();
        timeline.start(&path, false).unwrap();
        timeline.negotiate_start("early", OpKind::Allreduce);
        timeline.negotiate_end("early");
        assert_eq!(batches_sent(&timeline), 0, "a few events wait in the batch");
        std::thread::sleep(FLUSH_AFTER + std::time::Duration::from_millis(20));
        timeline.start_op("late", OpKind::Allreduce);
        assert_eq!(batches_sent(&timeline), 1);
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let text = std::fs::read_to_string(&path).unwrap();
            if text.contains("NEGOTIATE_ALLREDUCE") && text.contains(r#""late""#) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "not written while recording: {text}"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        timeline.stop().unwrap();
        let trace = read_trace(&path);
        assert_eq!(assert_balanced(&trace), 2);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn off_timeline_records_nothing_and_stop_is_a_no_op() {
        let timeline = Timeline::new();
        assert!(!timeline.is_on());
        record_allreduce(&timeline, "t");
        timeline.mark_cycle();
        assert!(lock(&timeline.sink).is_none());
        timeline.stop().unwrap();
        timeline.stop().unwrap();
        assert!(!timeline.is_on());
    }

    #[test]
    fn trace_is_valid_json_with_one_row_per_tensor() {
        let dir = temp_dir("rows");
        let path = dir.join("trace.json");
        let timeline = Timeline::new();
        timeline.start(&path, false).unwrap();
        assert!(timeline.is_on());
        let odd = "weird \"name\"\\\n\u{1}";
        record_allreduce(&timeline, "layer1.weight");
        record_allreduce(&timeline, odd);
        timeline.negotiate_start("layer1.weight", OpKind::Reducescatter);
        timeline.negotiate_end("layer1.weight");
        timeline.start_op("emb", OpKind::Allgather);
        timeline.end_op("emb");
        timeline.mark_cycle();
        timeline.stop().unwrap();
        assert!(!timeline.is_on());

        let events = read_trace(&path);
        let rows = rows(&events);
        let want: BTreeMap<String, f64> = [("layer1.weight", 1.0), (odd, 2.0), ("emb", 3.0)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        assert_eq!(rows, want);
        let sort_indexes = events
            .iter()
            .filter(|e| e.str("name") == Some("process_sort_index"))
            .count();
        assert_eq!(sort_indexes, 3);
        assert_eq!(assert_balanced(&events), 6 + 6 + 1 + 1);
        let names: Vec<&str> = events
            .iter()
            .filter(|e| e.str("ph") == Some("B") && e.num("pid") == Some(1.0))
            .map(|e| e.str("name").unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "NEGOTIATE_ALLREDUCE",
                "ALLREDUCE",
                "QUEUE",
                "MEMCPY_IN_FUSION_BUFFER",
                "TCP_ALLREDUCE",
                "MEMCPY_OUT_FUSION_BUFFER",
                "NEGOTIATE_REDUCESCATTER",
            ]
        );
        assert!(events.iter().any(|e| e.str("name") == Some("ALLGATHER")));
        assert!(!events.iter().any(|e| e.str("ph") == Some("i")));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn open_spans_are_closed_and_stray_ends_dropped() {
        let dir = temp_dir("balance");
        let path = dir.join("trace.json");
        let timeline = Timeline::new();
        timeline.start(&path, false).unwrap();
        timeline.end_op("never.started");
        timeline.start_op("t", OpKind::Broadcast);
        timeline.activity_start("t", "QUEUE");
        timeline.activity_end("t");
        timeline.activity_end("t");
        timeline.activity_end("t");
        timeline.start_op("u", OpKind::Alltoall);
        timeline.activity_start("u", "TCP_ALLTOALL");
        timeline.stop().unwrap();

        let events = read_trace(&path);
        assert_eq!(rows(&events).len(), 2);
        assert_eq!(assert_balanced(&events), 4);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn cycles_are_marked_only_when_requested() {
        let dir = temp_dir("cycles");
        let timeline = Timeline::new();
        for (mark, want) in [(true, 3), (false, 0)] {
            let path = dir.join(format!("trace-{mark}.json"));
            timeline.start(&path, mark).unwrap();
            for _ in 0..3 {
                timeline.mark_cycle();
            }
            timeline.stop().unwrap();
            let events = read_trace(&path);
            let cycles: Vec<&Json> = events.iter().filter(|e| e.str("ph") == Some("i")).collect();
            assert_eq!(cycles.len(), want);
            for c in cycles {
                assert_eq!(c.str("name"), Some("CYCLE_START"));
                assert_eq!(c.str("s"), Some("g"));
            }
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn restart_finishes_the_previous_file_and_starts_fresh_rows() {
        let dir = temp_dir("restart");
        let (first, second, third) = (dir.join("1.json"), dir.join("2.json"), dir.join("3.json"));
        let timeline = Timeline::new();
        timeline.start(&first, false).unwrap();
        record_allreduce(&timeline, "a");
        timeline.start_op("b", OpKind::Allreduce);
        timeline.start(&second, false).unwrap();
        timeline.end_op("b");
        record_allreduce(&timeline, "c");
        timeline.stop().unwrap();
        timeline.start(&third, false).unwrap();
        timeline.stop().unwrap();

        let events = read_trace(&first);
        assert_eq!(rows(&events).keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(assert_balanced(&events), 7);
        let events = read_trace(&second);
        assert_eq!(rows(&events).get("c"), Some(&1.0));
        assert_eq!(rows(&events).len(), 1);
        assert_eq!(assert_balanced(&events), 6);
        assert!(read_trace(&third).is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn start_reports_an_io_error_for_an_uncreatable_file() {
        let dir = temp_dir("badpath");
        let timeline = Timeline::new();
        let err = timeline
            .start(&dir.join("missing").join("trace.json"), false)
            .unwrap_err();
        assert!(matches!(err, Error::Io(_)), "{err:?}");
        assert!(err.to_string().contains("trace.json"), "{err}");
        assert!(!timeline.is_on());
        timeline.stop().unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn dropping_a_running_timeline_finishes_the_file() {
        let dir = temp_dir("drop");
        let path = dir.join("trace.json");
        {
            let timeline = Timeline::new();
            timeline.start(&path, true).unwrap();
            timeline.mark_cycle();
            timeline.start_op("t", OpKind::Barrier);
        }
        let events = read_trace(&path);
        assert_eq!(assert_balanced(&events), 1);
        assert!(events.iter().any(|e| e.str("name") == Some("BARRIER")));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn recording_while_another_thread_starts_and_stops_never_breaks_a_file() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Timeline>();

        let dir = temp_dir("race");
        let timeline = Arc::new(Timeline::new());
        let done = Arc::new(AtomicBool::new(false));
        let recorder = {
            let (timeline, done) = (Arc::clone(&timeline), Arc::clone(&done));
            std::thread::spawn(move || {
                let mut i = 0u64;
                // Bounded so that a slow disk cannot make the files (and the test) huge.
                while !done.load(Ordering::Relaxed) && i < 200_000 {
                    let tensor = format!("t{}", i % 7);
                    timeline.mark_cycle();
                    record_allreduce(&timeline, &tensor);
                    i += 1;
                }
            })
        };
        let paths: Vec<PathBuf> = (0..10).map(|n| dir.join(format!("{n}.json"))).collect();
        for (n, path) in paths.iter().enumerate() {
            timeline.start(path, n % 2 == 0).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(5));
            if n % 3 == 0 {
                timeline.stop().unwrap();
            }
        }
        timeline.stop().unwrap();
        done.store(true, Ordering::Relaxed);
        recorder.join().unwrap();
        for path in &paths {
            let events = read_trace(path);
            assert_balanced(&events);
            assert!(rows(&events).len() <= 7);
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
