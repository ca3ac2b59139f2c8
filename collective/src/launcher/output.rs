//! Rank output: every line of a rank's stdout/stderr goes to kolorun's stdout/stderr prefixed
//! `[R]<stdout>:` / `[R]<stderr>:` (after the local time, asctime-style, with
//! `--prefix-output-with-timestamp`, as horovodrun's `safe_shell_exec`), and optionally
//! unprefixed to `DIR/rank.R/{stdout,stderr}` (`R` zero-padded to the width of the last rank,
//! as horovodrun does).

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::JoinHandle;

use crate::error::{Error, Result};

/// A writer shared by the threads that forward rank output.
pub type SharedWriter = Arc<Mutex<dyn Write + Send>>;

/// Where kolorun writes: rank stdout lines go to `stdout`; rank stderr lines, the failure
/// summary and `--help` errors go to `stderr`. Tests inject in-memory buffers.
#[derive(Clone)]
pub struct Output {
    /// Receives `[R]<stdout>:` lines (and `--help`).
    pub stdout: SharedWriter,
    /// Receives `[R]<stderr>:` lines and kolorun's own messages.
    pub stderr: SharedWriter,
}

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Output { .. }")
    }
}

impl Output {
    /// The process's own stdout and stderr.
    pub fn process() -> Self {
        Self {
            stdout: Arc::new(Mutex::new(std::io::stdout())),
            stderr: Arc::new(Mutex::new(std::io::stderr())),
        }
    }

    /// Writes one line (a newline is added) to the stderr writer.
    pub(crate) fn message(&self, line: &str) {
        write_line(&self.stderr, b"", line.as_bytes());
    }
}

/// Which of a rank's streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// The label of each task's lines: its task index until the driver has assigned ranks, then
/// its rank.
#[derive(Debug, Clone)]
pub(crate) struct RankLabels(Arc<RwLock<Vec<u32>>>);

impl RankLabels {
    pub(crate) fn new(tasks: usize) -> Self {
        Self(Arc::new(RwLock::new((0..tasks as u32).collect())))
    }

    pub(crate) fn get(&self, task: u32) -> u32 {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(task as usize)
            .copied()
            .unwrap_or(task)
    }

    /// Sets the rank of each task (`ranks[task] = rank`).
    pub(crate) fn set(&self, ranks: Vec<u32>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = ranks;
    }

    /// Sets the label of task `task` alone (elastic launches: tasks come and go, and their
    /// ranks change at every round).
    pub(crate) fn set_one(&self, task: u32, label: u32) {
        let mut labels = self.0.write().unwrap_or_else(PoisonError::into_inner);
        let index = task as usize;
        if labels.len() <= index {
            let from = labels.len() as u32;
            labels.extend(from..=task);
        }
        labels[index] = label;
    }
}

/// `rank` zero-padded to the width of `size - 1` (horovodrun's `_pad_rank`).
pub(crate) fn pad_rank(rank: u32, size: usize) -> String {
    let width = size.saturating_sub(1).max(1).to_string().len();
    format!("{rank:0width$}")
}

/// Creates `DIR/rank.R/` and opens its `stdout` and `stderr` files for rank `R` of `size`.
pub(crate) fn open_rank_files(dir: &Path, rank: u32, size: usize) -> Result<(File, File)> {
    open_files_in(&dir.join(format!("rank.{}", pad_rank(rank, size))))
}

fn open_files_in(rank_dir: &Path) -> Result<(File, File)> {
    std::fs::create_dir_all(rank_dir).map_err(|err| {
        Error::Config(format!(
            "kolorun: cannot create --output-filename directory {}: {err}",
            rank_dir.display()
        ))
    })?;
    let open = |name: &str| {
        File::create(rank_dir.join(name)).map_err(|err| {
            Error::Config(format!(
                "kolorun: cannot create {}: {err}",
                rank_dir.join(name).display()
            ))
        })
    };
    Ok((open("stdout")?, open("stderr")?))
}

/// Creates `DIR/task.T/` and opens its `stdout` and `stderr` files for task `T` (elastic
/// launches: a task's rank changes from round to round, its task index never does and is never
/// reused, so no process overwrites another's files).
pub(crate) fn open_task_files(dir: &Path, task: u32) -> Result<(File, File)> {
    open_files_in(&dir.join(format!("task.{task}")))
}

/// The local time as C's `asctime` writes it, without the newline (`Wed Nov 25 08:10:00 2026`).
pub(crate) fn asctime_now() -> String {
    // SAFETY: time, localtime_r and strftime write only into the buffers passed; `tm` is
    // plain data, zero is a valid value for it.
    unsafe {
        let now = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&now, &mut tm).is_null() {
            return String::new();
        }
        let mut buffer = [0u8; 64];
        let written = libc::strftime(
            buffer.as_mut_ptr().cast(),
            buffer.len(),
            c"%a %b %e %H:%M:%S %Y".as_ptr(),
            &tm,
        );
        String::from_utf8_lossy(&buffer[..written]).into_owned()
    }
}

/// The longest piece of a line kolorun holds: a longer line is forwarded in pieces of this
/// size, each on its own prefixed line (the rank file gets the bytes unchanged). horovodrun's
/// `safe_shell_exec.forward_stream` keeps the whole line however long it grows.
pub(crate) const MAX_LINE_BYTES: usize = 64 << 10;
/// How much of a rank's output is read at once.
const READ_BUFFER_BYTES: usize = 64 << 10;

/// Starts a thread that copies `reader` line by line to `writer` with the rank prefix
/// (preceded by the local time when `timestamps`) and to `file` unprefixed, until EOF, then
/// sends on `done`. Lines longer than [`MAX_LINE_BYTES`] are cut into pieces of that size.
#[expect(
    clippy::too_many_arguments,
    reason = "one call site; each argument is one concern"
)]
pub(crate) fn forward(
    reader: impl Read + Send + 'static,
    task: u32,
    stream: Stream,
    labels: RankLabels,
    writer: SharedWriter,
    mut file: Option<File>,
    timestamps: bool,
    done: std::sync::mpsc::Sender<()>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("kolorun-{}-{task}", stream.name()))
        .spawn(move || {
            let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, reader);
            let mut line: Vec<u8> = Vec::with_capacity(READ_BUFFER_BYTES);
            let mut emit = |line: &[u8], ended: bool| {
                let time = if timestamps {
                    asctime_now()
                } else {
                    String::new()
                };
                let prefix = format!("{time}[{}]<{}>:", labels.get(task), stream.name());
                write_line(&writer, prefix.as_bytes(), line);
                if let Some(out) = file.as_mut() {
                    let written = out.write_all(line).and_then(|()| {
                        if ended {
                            out.write_all(b"\n")
                        } else {
                            Ok(())
                        }
                    });
                    if let Err(err) = written {
                        log::warn!(
                            "kolorun: cannot write the {} file of task {task}: {err}",
                            stream.name()
                        );
                        file = None;
                    }
                }
            };
            loop {
                let available = match reader.fill_buf() {
                    Ok(available) => available,
                    Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(err) => {
                        log::debug!("reading {} of task {task}: {err}", stream.name());
                        break;
                    }
                };
                if available.is_empty() {
                    // The last line without its newline still gets one.
                    if !line.is_empty() {
                        emit(&line, true);
                    }
                    break;
                }
                let room = &available[..available.len().min(MAX_LINE_BYTES - line.len())];
                match room.iter().position(|&b| b == b'\n') {
                    Some(end) => {
                        line.extend_from_slice(&room[..end]);
                        reader.consume(end + 1);
                        emit(&line, true);
                        line.clear();
                    }
                    None => {
                        let taken = room.len();
                        line.extend_from_slice(room);
                        reader.consume(taken);
                        if line.len() == MAX_LINE_BYTES {
                            // A line this long goes out in pieces, each with the prefix, so a
                            // rank that never writes a newline cannot grow kolorun's memory.
                            emit(&line, false);
                            line.clear();
                        }
                    }
                }
            }
            if let Some(out) = file.as_mut() {
                let _ = out.flush();
            }
            let _ = done.send(());
        })
}

fn write_line(writer: &SharedWriter, prefix: &[u8], line: &[u8]) {
    let mut out = writer.lock().unwrap_or_else(PoisonError::into_inner);
    // kolorun's own output failing (closed pipe) must not stop the job; nothing to report to.
    let _ = out
        .write_all(prefix)
        .and_then(|()| out.write_all(line))
        .and_then(|()| out.write_all(b"\n"));
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Forwards all of `input` as task `task`'s stderr (of `size` tasks, rank files under
    /// `dir`) and returns what reached the shared writer.
    fn forward_stderr(
        input: impl Read + Send + 'static,
        dir: &std::path::Path,
        task: u32,
        size: usize,
        labels: RankLabels,
    ) -> String {
        let buffer = Arc::new(Mutex::new(Vec::<u8>::new()));
        let writer: SharedWriter = buffer.clone();
        let (_, file) = open_rank_files(dir, task, size).unwrap();
        let (done, finished) = std::sync::mpsc::channel();
        forward(
            input,
            task,
            Stream::Stderr,
            labels,
            writer,
            Some(file),
            false,
            done,
        )
        .unwrap()
        .join()
        .unwrap();
        finished.recv().unwrap();
        let text = String::from_utf8(buffer.lock().unwrap().clone()).unwrap();
        text
    }

    #[test]
    fn lines_are_prefixed_with_the_current_label_and_copied_to_files() {
        let labels = RankLabels::new(3);
        labels.set(vec![0, 2, 1]);
        let dir = std::env::temp_dir().join(format!("kolo-output-test-{}", std::process::id()));
        let input: &'static [u8] = b"one\n\ntwo without newline";
        let text = forward_stderr(input, &dir, 1, 3, labels);
        assert_eq!(
            text,
            "[2]<stderr>:one\n[2]<stderr>:\n[2]<stderr>:two without newline\n"
        );
        let copied = std::fs::read_to_string(dir.join("rank.1/stderr")).unwrap();
        assert_eq!(copied, "one\n\ntwo without newline\n");
        assert_eq!(
            std::fs::read_to_string(dir.join("rank.1/stdout")).unwrap(),
            ""
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_line_without_newline_is_forwarded_in_bounded_prefixed_pieces() {
        let dir = tempfile::tempdir().unwrap();
        let mut input = vec![b'a'; 2 * MAX_LINE_BYTES + 10];
        input.extend_from_slice(b"\nb\n");
        let text = forward_stderr(
            std::io::Cursor::new(input.clone()),
            dir.path(),
            0,
            1,
            RankLabels::new(1),
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines.len(),
            4,
            "{:?}",
            lines.iter().map(|l| l.len()).collect::<Vec<_>>()
        );
        let piece = format!("[0]<stderr>:{}", "a".repeat(MAX_LINE_BYTES));
        assert_eq!((lines[0], lines[1]), (piece.as_str(), piece.as_str()));
        assert_eq!(lines[2], format!("[0]<stderr>:{}", "a".repeat(10)));
        assert_eq!(lines[3], "[0]<stderr>:b");
        // The rank file keeps the bytes as written.
        assert_eq!(
            std::fs::read(dir.path().join("rank.0/stderr")).unwrap(),
            input
        );
    }

    #[test]
    fn rank_directories_are_padded_like_horovodrun() {
        assert_eq!(pad_rank(3, 4), "3");
        assert_eq!(pad_rank(3, 11), "03");
        assert_eq!(pad_rank(10, 11), "10");
        assert_eq!(pad_rank(7, 101), "007");
        assert_eq!(pad_rank(0, 1), "0");
    }

    #[test]
    fn timestamps_precede_the_rank_prefix() {
        let buffer = Arc::new(Mutex::new(Vec::<u8>::new()));
        let writer: SharedWriter = buffer.clone();
        let (done, finished) = std::sync::mpsc::channel();
        let input: &'static [u8] = b"hello\n";
        forward(
            input,
            0,
            Stream::Stdout,
            RankLabels::new(1),
            writer,
            None,
            true,
            done,
        )
        .unwrap()
        .join()
        .unwrap();
        finished.recv().unwrap();
        let text = String::from_utf8(buffer.lock().unwrap().clone()).unwrap();
        let (time, rest) = text.split_once('[').unwrap();
        assert_eq!(rest, "0]<stdout>:hello\n");
        // `Wed Nov 25 08:10:00 2026`: weekday, month, day, time, year.
        let words: Vec<&str> = time.split_whitespace().collect();
        assert_eq!(words.len(), 5, "{time:?}");
        assert_eq!(words[3].matches(':').count(), 2, "{time:?}");
        assert!(words[4].parse::<u32>().unwrap() >= 2024, "{time:?}");
    }
}
