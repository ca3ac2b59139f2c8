//! horovodrun 0.28.1's elastic options (`horovod/runner/launch.py`, group "elastic arguments"):
//! the values as given ([`ElasticFlags`]) and, for an elastic launch, the settings they resolve
//! to ([`ElasticArgs`]).
//!
//! A launch is elastic exactly when horovodrun's `_is_elastic` says so: a
//! `--host-discovery-script` or `--min-np` is given. The other elastic options on a fixed-size
//! launch change nothing (as in horovodrun) and get a notice saying so.

use std::time::Duration;

use crate::error::{Error, Result};

/// Horovod's `ELASTIC_TIMEOUT_SECS`: how long an elastic job waits for `--min-np` slots.
pub const DEFAULT_ELASTIC_TIMEOUT: Duration = Duration::from_secs(600);
/// kolo's name for the elastic timeout variable, read first.
pub const ELASTIC_TIMEOUT_ENV: &str = "KOLO_ELASTIC_TIMEOUT";
/// Horovod's name for the elastic timeout variable, read when kolo's is unset.
pub const HOROVOD_ELASTIC_TIMEOUT_ENV: &str = "HOROVOD_ELASTIC_TIMEOUT";
/// Horovod's `DEFAULT_COOLDOWN_LOWER_LIMIT_SECONDS`: the least `--blacklist-cooldown-range` MIN.
pub const COOLDOWN_LOWER_LIMIT_SECONDS: u64 = 1;
/// Horovod's `DEFAULT_COOLDOWN_UPPER_LIMIT_SECONDS`: the most `--blacklist-cooldown-range` MAX.
pub const COOLDOWN_UPPER_LIMIT_SECONDS: u64 = 60 * 60;

/// The elastic options exactly as given on the command line (`None`: not given).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ElasticFlags {
    /// `--min-np`/`--min-num-proc`.
    pub min_num_proc: Option<usize>,
    /// `--max-np`/`--max-num-proc`.
    pub max_num_proc: Option<usize>,
    /// `--slots-per-host` (or `--slots`, the abbreviation Horovod's elastic docs use).
    pub slots_per_host: Option<usize>,
    /// `--elastic-timeout` seconds.
    pub elastic_timeout: Option<u64>,
    /// `--reset-limit`.
    pub reset_limit: Option<u64>,
    /// `--blacklist-cooldown-range MIN MAX` seconds.
    pub cooldown_range: Option<CooldownRange>,
}

/// `--blacklist-cooldown-range MIN MAX`: a failing host stays blacklisted for a cooldown between
/// `lower` and `upper` seconds that grows with each failure (see
/// [`crate::launcher::blacklist`]). Built only through [`CooldownRange::new`], which enforces
/// Horovod's bounds (`1 <= MIN`, `MAX <= 3600`) and `MIN <= MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CooldownRange {
    lower: u64,
    upper: u64,
}

impl CooldownRange {
    /// The range `lower..=upper` seconds; a `Config` error naming the option and the allowed
    /// bounds otherwise. Horovod refuses a MIN below 1 and a MAX above 3600 (`HostState.
    /// _validate_cooldown_range`); kolo also refuses MIN above MAX, which Horovod would silently
    /// treat as a fixed cooldown of MIN.
    pub fn new(lower: u64, upper: u64) -> Result<Self> {
        let option = "kolorun: --blacklist-cooldown-range";
        if lower < COOLDOWN_LOWER_LIMIT_SECONDS {
            return Err(Error::Config(format!(
                "{option} {lower} {upper}: MIN {lower} is below the lower limit of \
                 {COOLDOWN_LOWER_LIMIT_SECONDS} second; give MIN of at least \
                 {COOLDOWN_LOWER_LIMIT_SECONDS}, e.g. --blacklist-cooldown-range 60 300"
            )));
        }
        if upper > COOLDOWN_UPPER_LIMIT_SECONDS {
            return Err(Error::Config(format!(
                "{option} {lower} {upper}: MAX {upper} is above the upper limit of \
                 {COOLDOWN_UPPER_LIMIT_SECONDS} seconds (one hour); give MAX of at most \
                 {COOLDOWN_UPPER_LIMIT_SECONDS}"
            )));
        }
        if lower > upper {
            return Err(Error::Config(format!(
                "{option} {lower} {upper}: MIN {lower} is more than MAX {upper}; give MIN MAX \
                 in that order, e.g. --blacklist-cooldown-range {upper} {lower}"
            )));
        }
        Ok(Self { lower, upper })
    }

    /// MIN, in seconds.
    pub fn lower(&self) -> u64 {
        self.lower
    }

    /// MAX, in seconds.
    pub fn upper(&self) -> u64 {
        self.upper
    }
}

/// The settings of an elastic launch (present on [`super::LaunchArgs::elastic`] exactly when
/// the launch is elastic). Where the hosts come from stays in [`super::LaunchArgs::hosts`]: a
/// discovery script, or `-H`/`--hostfile` as Horovod's `FixedHosts`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElasticArgs {
    /// How many slots must be available before training starts: `-np`, else `--min-np`.
    pub num_proc: usize,
    /// How many processes training needs to continue: `--min-np`, else `-np`. With fewer
    /// available slots the job waits at most [`ElasticArgs::elastic_timeout`] for more.
    pub min_num_proc: usize,
    /// At most this many processes run (`--max-np`); `None`: every available slot, as in
    /// horovodrun.
    pub max_num_proc: Option<usize>,
    /// Slots of a host the discovery script prints without `:slots` (`--slots-per-host`;
    /// default 1, where horovodrun would fail).
    pub slots_per_host: usize,
    /// `--elastic-timeout`, when given; [`ElasticArgs::elastic_timeout`] resolves the default.
    pub elastic_timeout_flag: Option<Duration>,
    /// How many times the job may reset (scale or recover) before it fails (`--reset-limit`);
    /// `None`: no limit.
    pub reset_limit: Option<u64>,
    /// `--blacklist-cooldown-range`; `None`: a blacklisted host stays blacklisted, as in
    /// horovodrun.
    pub cooldown_range: Option<CooldownRange>,
}

impl ElasticArgs {
    /// How long the job waits for `min_num_proc` slots: `--elastic-timeout`, else
    /// `KOLO_ELASTIC_TIMEOUT`, else `HOROVOD_ELASTIC_TIMEOUT` (whole seconds, as Horovod reads
    /// it), else 600 seconds.
    pub fn elastic_timeout(&self) -> Result<Duration> {
        resolve_elastic_timeout(self.elastic_timeout_flag, |name| std::env::var(name).ok())
    }
}

/// [`ElasticArgs::elastic_timeout`] with the environment read through `lookup`.
pub fn resolve_elastic_timeout(
    flag: Option<Duration>,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Duration> {
    if let Some(timeout) = flag {
        return Ok(timeout);
    }
    for name in [ELASTIC_TIMEOUT_ENV, HOROVOD_ELASTIC_TIMEOUT_ENV] {
        if let Some(text) = lookup(name).filter(|v| !v.trim().is_empty()) {
            let seconds = text
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|s| *s > 0)
                .ok_or_else(|| {
                    Error::Config(format!(
                        "{name}={text:?} is not a positive whole number of seconds; e.g. \
                         {name}=600"
                    ))
                })?;
            return Ok(Duration::from_secs(seconds));
        }
    }
    Ok(DEFAULT_ELASTIC_TIMEOUT)
}

/// What the elastic options mean for a launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ElasticMode {
    /// An elastic launch with these settings.
    Elastic(ElasticArgs),
    /// A fixed-size launch; each `(option, text)` is a notice for an elastic option given that
    /// has no effect on it.
    Fixed(Vec<(String, String)>),
}

/// Whether an option was given.
type IsGiven = fn(&ElasticFlags) -> bool;

/// The options that only affect an elastic launch, with their spellings.
const ELASTIC_ONLY: [(&str, IsGiven); 5] = [
    ("--max-np", |f| f.max_num_proc.is_some()),
    ("--slots-per-host", |f| f.slots_per_host.is_some()),
    ("--elastic-timeout", |f| f.elastic_timeout.is_some()),
    ("--reset-limit", |f| f.reset_limit.is_some()),
    ("--blacklist-cooldown-range", |f| f.cooldown_range.is_some()),
];

/// The notice for an elastic option on a fixed-size launch.
pub const FIXED_SIZE_NOTICE: &str = "has no effect without --min-np or \
     --host-discovery-script (which make the launch elastic): the job runs with a fixed size of \
     -np ranks, as in horovodrun";

/// Resolves the elastic options: `discovery` says whether a `--host-discovery-script` was
/// given, `num_proc` is `-np`, `mpi` whether the launch goes through mpirun. Bad combinations
/// are `Config` errors naming the options and the fix.
pub fn resolve(
    flags: &ElasticFlags,
    num_proc: Option<usize>,
    discovery: bool,
    mpi: bool,
) -> Result<ElasticMode> {
    if let (Some(min), Some(max)) = (flags.min_num_proc, flags.max_num_proc) {
        if min > max {
            return Err(Error::Config(format!(
                "kolorun: --min-np {min} is more than --max-np {max}; lower --min-np or raise \
                 --max-np"
            )));
        }
    }
    if !discovery && flags.min_num_proc.is_none() {
        let notices = ELASTIC_ONLY
            .iter()
            .filter(|(_, given)| given(flags))
            .map(|(option, _)| ((*option).to_owned(), FIXED_SIZE_NOTICE.to_owned()))
            .collect();
        return Ok(ElasticMode::Fixed(notices));
    }
    let what = if discovery {
        "--host-discovery-script"
    } else {
        "--min-np"
    };
    if mpi {
        return Err(Error::Config(format!(
            "kolorun: {what} makes the launch elastic, and elastic jobs run on kolo's own \
             controller (horovodrun's need Gloo too), never through mpirun; drop --mpi \
             (and --mpi-args/--binding-args)"
        )));
    }
    let (num_proc, min_num_proc) = match (num_proc, flags.min_num_proc) {
        (Some(np), Some(min)) => (np, min),
        (Some(np), None) => (np, np),
        (None, Some(min)) => (min, min),
        (None, None) => {
            return Err(Error::Config(format!(
                "kolorun: an elastic launch ({what}) needs -np N (how many slots to wait for \
                 before training starts) or --min-np N"
            )))
        }
    };
    if num_proc < min_num_proc {
        return Err(Error::Config(format!(
            "kolorun: -np {num_proc} is less than --min-np {min_num_proc}: training would start \
             with fewer processes than it needs to continue; raise -np to at least \
             {min_num_proc} or lower --min-np"
        )));
    }
    if let Some(max) = flags.max_num_proc.filter(|max| num_proc > *max) {
        return Err(Error::Config(format!(
            "kolorun: -np {num_proc} is more than --max-np {max}: the job would wait for more \
             slots than it may use; lower -np to at most {max} or raise --max-np"
        )));
    }
    Ok(ElasticMode::Elastic(ElasticArgs {
        num_proc,
        min_num_proc,
        max_num_proc: flags.max_num_proc,
        slots_per_host: flags.slots_per_host.unwrap_or(1),
        elastic_timeout_flag: flags.elastic_timeout.map(Duration::from_secs),
        reset_limit: flags.reset_limit,
        cooldown_range: flags.cooldown_range,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(min: Option<usize>, max: Option<usize>) -> ElasticFlags {
        ElasticFlags {
            min_num_proc: min,
            max_num_proc: max,
            ..ElasticFlags::default()
        }
    }

    fn config_error(result: Result<ElasticMode>) -> String {
        match result {
            Err(Error::Config(message)) => message,
            other => panic!("expected a Config error, got {other:?}"),
        }
    }

    #[test]
    fn elastic_exactly_with_a_discovery_script_or_min_np() {
        let ElasticMode::Elastic(args) =
            resolve(&flags(Some(2), None), Some(4), false, false).unwrap()
        else {
            panic!("--min-np makes the launch elastic")
        };
        assert_eq!((args.num_proc, args.min_num_proc), (4, 2));
        assert_eq!(args.max_num_proc, None);
        assert_eq!(args.slots_per_host, 1);
        let ElasticMode::Elastic(args) = resolve(&flags(None, None), Some(3), true, false).unwrap()
        else {
            panic!("a discovery script makes the launch elastic")
        };
        // --min-np defaults to -np, as horovodrun's `args.min_num_proc or args.num_proc`.
        assert_eq!((args.num_proc, args.min_num_proc), (3, 3));
        let ElasticMode::Elastic(args) = resolve(&flags(Some(2), None), None, true, false).unwrap()
        else {
            panic!()
        };
        assert_eq!((args.num_proc, args.min_num_proc), (2, 2));
    }

    #[test]
    fn elastic_only_options_on_a_fixed_size_launch_get_one_notice_each() {
        let given = ElasticFlags {
            max_num_proc: Some(4),
            slots_per_host: Some(2),
            elastic_timeout: Some(60),
            reset_limit: Some(3),
            cooldown_range: Some(CooldownRange::new(10, 20).unwrap()),
            ..ElasticFlags::default()
        };
        let ElasticMode::Fixed(notices) = resolve(&given, Some(2), false, false).unwrap() else {
            panic!("no --min-np and no script: a fixed-size launch")
        };
        let options: Vec<&str> = notices.iter().map(|(o, _)| o.as_str()).collect();
        assert_eq!(
            options,
            [
                "--max-np",
                "--slots-per-host",
                "--elastic-timeout",
                "--reset-limit",
                "--blacklist-cooldown-range"
            ]
        );
        assert!(notices.iter().all(|(_, text)| text == FIXED_SIZE_NOTICE));
        assert_eq!(
            resolve(&ElasticFlags::default(), Some(2), false, false).unwrap(),
            ElasticMode::Fixed(vec![])
        );
    }

    #[test]
    fn bad_combinations_name_the_options_and_the_fix() {
        let message = config_error(resolve(&flags(Some(3), Some(2)), None, true, false));
        assert!(
            message.contains("--min-np 3 is more than --max-np 2") && message.contains("lower"),
            "{message}"
        );
        // Even on a fixed-size launch: --min-np makes it elastic, so this is caught first.
        let message = config_error(resolve(&flags(Some(3), Some(2)), Some(3), false, false));
        assert!(message.contains("--max-np 2"), "{message}");
        let message = config_error(resolve(&flags(Some(3), None), Some(2), false, false));
        assert!(
            message.contains("-np 2 is less than --min-np 3") && message.contains("raise -np"),
            "{message}"
        );
        let message = config_error(resolve(&flags(None, Some(4)), Some(5), true, false));
        assert!(
            message.contains("-np 5 is more than --max-np 4") && message.contains("at most 4"),
            "{message}"
        );
        let message = config_error(resolve(&flags(None, None), None, true, false));
        assert!(
            message.contains("--host-discovery-script") && message.contains("-np N"),
            "{message}"
        );
        let message = config_error(resolve(&flags(Some(2), None), Some(2), false, true));
        assert!(
            message.contains("--min-np") && message.contains("drop --mpi"),
            "{message}"
        );
        // The edges are fine.
        assert!(resolve(&flags(Some(2), Some(2)), Some(2), true, false).is_ok());
    }

    #[test]
    fn cooldown_range_bounds_are_horovods_and_ordered() {
        let range = CooldownRange::new(1, 3600).unwrap();
        assert_eq!((range.lower(), range.upper()), (1, 3600));
        for (lower, upper, said) in [
            (0, 10, "lower limit of 1"),
            (10, 3601, "upper limit of 3600"),
            (30, 20, "MIN 30 is more than MAX 20"),
        ] {
            match CooldownRange::new(lower, upper) {
                Err(Error::Config(message)) => {
                    assert!(
                        message.contains("--blacklist-cooldown-range") && message.contains(said),
                        "{message}"
                    )
                }
                other => panic!("{lower} {upper}: {other:?}"),
            }
        }
    }

    #[test]
    fn elastic_timeout_is_the_flag_then_kolo_then_horovod_then_600() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let flag = Some(Duration::from_secs(5));
        assert_eq!(
            resolve_elastic_timeout(flag, env(&[(ELASTIC_TIMEOUT_ENV, "7")])).unwrap(),
            Duration::from_secs(5)
        );
        assert_eq!(
            resolve_elastic_timeout(
                None,
                env(&[
                    (ELASTIC_TIMEOUT_ENV, "7"),
                    (HOROVOD_ELASTIC_TIMEOUT_ENV, "9")
                ])
            )
            .unwrap(),
            Duration::from_secs(7)
        );
        assert_eq!(
            resolve_elastic_timeout(None, env(&[(HOROVOD_ELASTIC_TIMEOUT_ENV, "9")])).unwrap(),
            Duration::from_secs(9)
        );
        assert_eq!(
            resolve_elastic_timeout(None, env(&[(ELASTIC_TIMEOUT_ENV, " ")])).unwrap(),
            DEFAULT_ELASTIC_TIMEOUT
        );
        assert_eq!(DEFAULT_ELASTIC_TIMEOUT, Duration::from_secs(600));
        for bad in ["soon", "0", "-5", "2.5"] {
            let lookup =
                move |name: &str| (name == HOROVOD_ELASTIC_TIMEOUT_ENV).then(|| bad.into());
            match resolve_elastic_timeout(None, lookup) {
                Err(Error::Config(message)) => assert!(
                    message.contains("HOROVOD_ELASTIC_TIMEOUT") && message.contains("whole"),
                    "{message}"
                ),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
