//! Rank output: every line of a rank's stdout/stderr goes to kolorun's stdout/stderr prefixed
//! `[R]<stdout>:` / `[R]<stderr>:`, and optionally unprefixed to `DIR/rank.R/{stdout,stderr}`.

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
}

/// Creates `DIR/rank.T/` and opens its `stdout` and `stderr` files for task `T`.
pub(crate) fn open_rank_files(dir: &Path, task: u32) -> Result<(File, File)> {
    let rank_dir = dir.join(format!("rank.{task}"));
    std::fs::create_dir_all(&rank_dir).map_err(|err| {
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

/// Starts a thread that copies `reader` line by line to `writer` with the rank prefix (and to
/// `file` unprefixed) until EOF, then sends on `done`.
pub(crate) fn forward(
    reader: impl Read + Send + 'static,
    task: u32,
    stream: Stream,
    labels: RankLabels,
    writer: SharedWriter,
    mut file: Option<File>,
    done: std::sync::mpsc::Sender<()>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("kolorun-{}-{task}", stream.name()))
        .spawn(move || {
            let mut reader = BufReader::new(reader);
            let mut line = Vec::new();
            loop {
                line.clear();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(err) => {
                        log::debug!("reading {} of task {task}: {err}", stream.name());
                        break;
                    }
                }
                if line.last() == Some(&b'\n') {
                    line.pop();
                }
                let prefix = format!("[{}]<{}>:", labels.get(task), stream.name());
                write_line(&writer, prefix.as_bytes(), &line);
                if let Some(out) = file.as_mut() {
                    let written = out.write_all(&line).and_then(|()| out.write_all(b"\n"));
                    if let Err(err) = written {
                        log::warn!(
                            "kolorun: cannot write the {} file of task {task}: {err}",
                            stream.name()
                        );
                        file = None;
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

    #[test]
    fn lines_are_prefixed_with_the_current_label_and_copied_to_files() {
        let buffer = Arc::new(Mutex::new(Vec::<u8>::new()));
        let writer: SharedWriter = buffer.clone();
        let labels = RankLabels::new(3);
        labels.set(vec![0, 2, 1]);
        let dir = std::env::temp_dir().join(format!("kolo-output-test-{}", std::process::id()));
        let (_, file) = open_rank_files(&dir, 1).unwrap();
        let (done, finished) = std::sync::mpsc::channel();
        let input: &'static [u8] = b"one\n\ntwo without newline";
        forward(input, 1, Stream::Stderr, labels, writer, Some(file), done)
            .unwrap()
            .join()
            .unwrap();
        finished.recv().unwrap();
        let text = String::from_utf8(buffer.lock().unwrap().clone()).unwrap();
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
}
