//! Integration tests: a real driver service and task runner with `sh` as the rank process.

use std::time::{Duration, Instant};

use kolo_spark_bridge::{run_task, DriverEvent, LaunchDriver, LaunchDriverOptions, TaskOptions};

fn driver(num_tasks: usize) -> LaunchDriver {
    LaunchDriver::start(&LaunchDriverOptions {
        bind: "127.0.0.1:0".parse().unwrap(),
        num_tasks,
        start_timeout: Duration::from_secs(30),
        heartbeat_timeout: Duration::from_secs(30),
    })
    .unwrap()
}

fn options(driver: &LaunchDriver, task: u32, script: &str) -> TaskOptions {
    TaskOptions {
        worker: driver.worker_env(task),
        program: "sh".into(),
        args: vec!["-c".into(), script.into()],
        envs: vec![("KOLO_IT_VALUE".into(), "from-env".into())],
        attempt: 2,
        hostname: "it-host".into(),
        term_grace: Duration::from_secs(1),
    }
}

fn drain(driver: &LaunchDriver) -> Vec<DriverEvent> {
    let mut events = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !driver.all_exited() && Instant::now() < deadline {
        events.extend(driver.poll(Duration::from_millis(100)).unwrap());
    }
    events.extend(driver.poll(Duration::from_millis(10)).unwrap());
    events
}

#[test]
fn output_and_exit_reach_the_driver_in_order() {
    let driver = driver(1);
    let script = "echo one; echo $KOLO_IT_VALUE; echo oops >&2; printf tail";
    let outcome = run_task(&options(&driver, 0, script), &|| false).unwrap();
    assert!(outcome.success, "{outcome:?}");
    let events = drain(&driver);
    let start = driver.task_start(0).unwrap();
    assert_eq!((start.attempt, start.hostname.as_str()), (2, "it-host"));
    let stdout: Vec<String> = events
        .iter()
        .filter_map(|event| match event {
            DriverEvent::Output {
                stderr: false,
                text,
                ..
            } => Some(String::from_utf8_lossy(text).into_owned()),
            _ => None,
        })
        .collect();
    assert_eq!(stdout, ["one", "from-env", "tail"]);
    assert!(events.iter().any(|event| matches!(
        event,
        DriverEvent::Output { stderr: true, text, .. } if text == b"oops"
    )));
    assert!(matches!(
        events.last(),
        Some(DriverEvent::Exited { success: true, .. })
    ));
    assert!(driver.failure().is_none());
    driver.shutdown();
}

#[test]
fn a_failing_process_aborts_the_job_and_a_sibling_is_stopped() {
    let driver = std::sync::Arc::new(driver(2));
    let sibling = {
        let driver = std::sync::Arc::clone(&driver);
        std::thread::spawn(move || run_task(&options(&driver, 1, "sleep 60"), &|| false))
    };
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let outcome = run_task(&options(&driver, 0, "exit 3"), &|| false).unwrap();
    assert!(!outcome.success);
    assert_eq!(outcome.description, "exited with code 3");
    let stopped = sibling.join().unwrap().unwrap();
    assert!(!stopped.success);
    assert!(stopped.description.starts_with("stopped:"), "{stopped:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let cause = driver.failure().unwrap();
    assert!(cause.message.contains("task 0"), "{cause}");
    assert!(cause.message.contains("attempt 2"), "{cause}");
    assert!(cause.message.contains("exited with code 3"), "{cause}");
    driver.shutdown();
}

#[test]
fn an_interrupted_task_stops_its_process() {
    let driver = driver(1);
    let started = Instant::now();
    let outcome = run_task(&options(&driver, 0, "sleep 60"), &|| {
        started.elapsed() > Duration::from_millis(300)
    })
    .unwrap();
    assert!(!outcome.success);
    assert!(outcome.description.contains("interrupted"), "{outcome:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    driver.shutdown();
}

#[test]
fn a_missing_program_is_a_spawn_error() {
    let driver = driver(1);
    let mut options = options(&driver, 0, "true");
    options.program = "/nonexistent/kolo-python".into();
    let err = run_task(&options, &|| false).unwrap_err();
    assert!(
        matches!(err, kolo_spark_bridge::Error::Spawn { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("/nonexistent/kolo-python"));
    driver.shutdown();
}
