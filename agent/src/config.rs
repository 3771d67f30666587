//! The configuration of `watch`, `run` and `record`: one YAML file (`--config FILE`), then
//! `CREDWATCH_<KEY>` environment variables over it, then the command line's flags over both;
//! defaults for what none of them says.
//!
//! Every key is a field of [`Config`]: a new setting (an output, a listen address) is one more
//! field there, and the file, the environment, `config check` and `config show` take it from
//! serde with nothing else to change. The layers are merged as maps of top-level keys, so a key
//! given by a higher layer replaces the lower one's value whole (a list too).
//!
//! Each top-level key of the file is checked on its own, so `config check` names every bad key
//! with its line and column, not only the first. An environment variable's value is read as a
//! YAML value (`true`, `5`, `[a, b]`), else taken as the string it is (a path like `123`).
//! `CREDWATCH_*` variables that are no key are reported, not fatal: the build and the tests use
//! a few of their own, and a security agent that refuses to start over a stray variable
//! watches nothing; the warning names the key meant, when one is close.

use std::{
    collections::BTreeMap,
    fmt,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use credwatch::sensor::{pins::DEFAULT_PIN_DIR, MapSizes};
use credwatch_outputs::OutputConfig;
use serde::{de, Deserialize, Serialize};
use serde_json::{Map, Value};
use serde_saphyr::{Location, Spanned};

/// The prefix of the environment variables that set keys.
pub const ENV_PREFIX: &str = "CREDWATCH_";
/// Deepest nesting in a configuration file: its shapes nest 3 deep; a deeper file is no
/// configuration, and the bound keeps the parser from recursing without end.
const MAX_DEPTH: usize = 16;
/// Events that aliases may replay: none are needed; this stops an alias bomb with an error.
const MAX_REPLAYED_EVENTS: usize = 10_000;

/// Every setting of `watch`, `run` and `record`. Each flag of those commands has its key.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Print alerts as JSON lines instead of the readable form (`--json`).
    pub json: bool,
    /// A folder of rule files over the default rules (`--rules`).
    pub rules: Option<PathBuf>,
    /// Also append every alert as a JSON line to this file (`--alerts`; `watch --output`).
    pub alerts: Option<PathBuf>,
    /// Alert on the project's own scripts and programs too (`--watch-project`).
    pub watch_project: bool,
    /// Block in the kernel (`--enforce`).
    pub enforce: bool,
    /// `run` and `record -- CMD`: seconds to wait for CMD's tree after CMD exits (`--linger`).
    pub linger: Option<f64>,
    /// `run`: CMD's tree in a box where the catalogue's credential files are empty and secret
    /// environment variables are withheld (`--contain`).
    pub contain: bool,
    /// `run --contain`: the box's only network is credwatch's proxy to the registries
    /// (`--contain-net`).
    pub contain_net: Option<ContainNet>,
    /// `run --contain`: where the box's writes to the home go (`--contain-writes`).
    pub contain_writes: ContainWrites,
    /// `run --contain-writes overlay`: copy what the box wrote into the real home, persistence
    /// paths excepted (`--keep`).
    pub contain_keep: bool,
    /// Record every event to this trace file (`record -o`).
    pub trace: Option<PathBuf>,
    /// `watch` and `record` without CMD: where their kernel side is pinned (on bpffs), so that
    /// it outlives the agent (`--pin-dir`; by default [`DEFAULT_PIN_DIR`]).
    pub pin_dir: Option<PathBuf>,
    /// The agent's own log on standard error: `text` or `json` lines.
    pub log_format: LogFormat,
    /// The least severe log records written.
    pub log_level: LogLevel,
    /// The kernel programs' own diagnostics in the log, from this level up (`--kernel-log`).
    pub kernel_log: KernelLog,
    /// Where alerts go besides the terminal and `alerts` (`--to DEST`, each a `to:` here with
    /// its filters and knobs): see credwatch-outputs' `OutputConfig`.
    pub outputs: Vec<OutputConfig>,
    /// Where each output keeps the alerts it has not delivered yet (`--spool-dir`; default
    /// /var/lib/credwatch/spool).
    pub spool_dir: Option<PathBuf>,
    /// Serve Prometheus metrics on this address, at `/metrics` (`--metrics-listen`).
    pub metrics_listen: Option<SocketAddr>,
    /// The kernel programs: `fentry` where they load, else `tracepoint` (`auto`), or one
    /// forced (`--sensor`).
    pub sensor: SensorChoice,
    /// `watch`: the local alert log every alert is appended to, with its seq, for `credwatch
    /// alerts` and `show` (`--alert-log`; default /var/lib/credwatch/alerts.jsonl).
    pub alert_log: Option<PathBuf>,
    /// `watch`: the Unix socket that serves the local alert log and the live alerts to this
    /// machine's users, each their own (`--alerts-socket`; default /run/credwatch/alerts.sock).
    pub alerts_socket: Option<PathBuf>,
    /// Sizes of kernel maps other than the built-in ones, by map name (`--map-size NAME=ENTRIES`):
    /// `MARKS`, `LOST_TREES`, `TAINTED`, `CRED_INODES`, `REPEATS` in entries, the `EVENTS` and
    /// `PRIORITY` rings in bytes. Applied when the programs are loaded: an adopted pinned set keeps
    /// its own.
    pub map_sizes: BTreeMap<String, u64>,
}

/// Where a contained command's writes to the home go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ContainWrites {
    /// Nowhere: the home is read-only but the project and the managers' caches (EROFS).
    #[default]
    ReadOnly,
    /// An overlay over the home, listed after the run and dropped (kept with `--keep`).
    Overlay,
}

/// What network a contained command gets besides none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ContainNet {
    /// The usual registries of the rules (`network:` names) and the user's configured ones,
    /// through credwatch's proxy.
    Registries,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SensorChoice {
    /// fentry/fexit (and BPF LSM deny under `--enforce`) where they load, else tracepoints.
    #[default]
    Auto,
    /// Syscall tracepoints: load everywhere, but slow every process's syscalls a little.
    Tracepoint,
    /// fentry/fexit on the syscall functions; an error where they do not load.
    Fentry,
}

impl SensorChoice {
    pub fn backend(self) -> credwatch::sensor::Backend {
        match self {
            SensorChoice::Auto => credwatch::sensor::Backend::Auto,
            SensorChoice::Tracepoint => credwatch::sensor::Backend::Tracepoint,
            SensorChoice::Fentry => credwatch::sensor::Backend::Fentry,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// `credwatch: message` lines, for a person.
    #[default]
    Text,
    /// One JSON object per record (`timestamp`, `level`, `message` and the record's fields).
    Json,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Error,
    Warn,
    #[default]
    Info,
    Debug,
    Trace,
}

/// Which of the kernel programs' diagnostics reach the log. Set at load: off, the programs
/// carry no log code the verifier keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum KernelLog {
    #[default]
    Off,
    Error,
    Warn,
    Info,
    Debug,
}

impl KernelLog {
    pub fn level(self) -> Option<credwatch::sensor::kernel_log::Level> {
        use credwatch::sensor::kernel_log::Level;
        match self {
            KernelLog::Off => None,
            KernelLog::Error => Some(Level::Error),
            KernelLog::Warn => Some(Level::Warn),
            KernelLog::Info => Some(Level::Info),
            KernelLog::Debug => Some(Level::Debug),
        }
    }
}

impl Config {
    /// The keys whose new value a running agent cannot take (`SIGHUP`): what it would take is a
    /// restart.
    pub fn restart_only_changes(&self, new: &Config) -> Vec<&'static str> {
        let mut changed = Vec::new();
        if self.trace != new.trace {
            // The trace file is open, its header written.
            changed.push("trace");
        }
        if self.log_format != new.log_format {
            changed.push("log_format");
        }
        // The level is a constant of the loaded programs.
        if self.kernel_log != new.kernel_log {
            changed.push("kernel_log");
        }
        // The outputs' tasks, queues and spools are running; a `SIGHUP` reopens their files.
        if self.outputs != new.outputs {
            changed.push("outputs");
        }
        if self.spool_dir != new.spool_dir {
            changed.push("spool_dir");
        }
        // The endpoint is bound at start-up.
        if self.metrics_listen != new.metrics_listen {
            changed.push("metrics_listen");
        }
        if self.pin_dir() != new.pin_dir() {
            // The kernel side is pinned there.
            changed.push("pin_dir");
        }
        // The programs are loaded.
        if self.sensor != new.sensor {
            changed.push("sensor");
        }
        if self.map_sizes != new.map_sizes {
            changed.push("map_sizes");
        }
        // The log is open and the socket bound, with clients on it.
        if self.alert_log != new.alert_log {
            changed.push("alert_log");
        }
        if self.alerts_socket != new.alerts_socket {
            changed.push("alerts_socket");
        }
        changed
    }

    /// [`Config::map_sizes`] for the sensor (checked by [`Layers::load`]).
    pub fn map_sizes(&self) -> MapSizes {
        let mut sizes = MapSizes::default();
        for (name, &entries) in &self.map_sizes {
            // Checked at load: a bad one cannot be here.
            let _ = sizes.set(name, entries);
        }
        sizes
    }

    pub fn pin_dir(&self) -> &Path {
        self.pin_dir.as_deref().unwrap_or(Path::new(DEFAULT_PIN_DIR))
    }

    pub fn alert_log(&self) -> &Path {
        self.alert_log.as_deref().unwrap_or(Path::new(crate::local::client::DEFAULT_LOG))
    }

    pub fn alerts_socket(&self) -> &Path {
        self.alerts_socket.as_deref().unwrap_or(Path::new(crate::local::client::DEFAULT_SOCKET))
    }

    /// Checks of values that their type allows but that mean nothing: by key.
    fn invalid(&self) -> Vec<(&'static str, String)> {
        let mut invalid = Vec::new();
        if let Some(linger) = self.linger {
            if !(linger.is_finite() && linger >= 0.0) {
                invalid.push(("linger", format!("{linger} is not a number of seconds")));
            }
        }
        if let Some(dir) = &self.rules {
            if !dir.is_dir() {
                invalid.push(("rules", format!("{} is not a folder of rule files", dir.display())));
            }
        }
        let mut sizes = MapSizes::default();
        for (name, &entries) in &self.map_sizes {
            if let Err(error) = sizes.set(name, entries) {
                invalid.push(("map_sizes", error.to_string()));
            }
        }
        for (index, output) in self.outputs.iter().enumerate() {
            for (key, message) in output.invalid() {
                invalid.push(("outputs", format!("output {} (to: {}): `{key}`: {message}", index + 1, output.to)));
            }
        }
        invalid
    }

    /// The keys whose value is not the default, in the order of [`Config`].
    pub fn changed_keys(&self) -> Vec<&'static str> {
        let (Ok(Value::Object(set)), Ok(Value::Object(defaults))) =
            (serde_json::to_value(self), serde_json::to_value(Config::default()))
        else {
            return Vec::new();
        };
        keys().iter().copied().filter(|key| set.get(*key) != defaults.get(*key)).collect()
    }

    /// The configuration as a file that loads back to it (`config show`).
    pub fn to_yaml(&self) -> Result<String, ConfigError> {
        serde_saphyr::to_string(self).map_err(|error| ConfigError::Show(error.to_string()))
    }
}

/// Where a key's value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    File {
        file: PathBuf,
        line: Option<u64>,
        column: Option<u64>,
    },
    Env(String),
    /// A flag of the command line (`--rules`).
    Flag(String),
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::File { file, line, column } => {
                write!(f, "{}", file.display())?;
                if let Some(line) = line {
                    write!(f, ":{line}")?;
                }
                if let Some(column) = column {
                    write!(f, ":{column}")?;
                }
                Ok(())
            }
            Place::Env(name) => write!(f, "environment variable {name}"),
            Place::Flag(flag) => write!(f, "{flag}"),
        }
    }
}

/// One thing wrong with a configuration, at its place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub place: Place,
    /// The top-level key it is about, when there is one.
    pub key: Option<String>,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.key {
            Some(key) => write!(f, "{}: key `{key}`: {}", self.place, self.message),
            None => write!(f, "{}: {}", self.place, self.message),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading the configuration file {}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{}", problems_text(.0))]
    Invalid(Vec<Problem>),
    #[error("writing the configuration: {0}")]
    Show(String),
}

fn problems_text(problems: &[Problem]) -> String {
    match problems {
        [one] => one.to_string(),
        many => {
            let lines: Vec<String> = many.iter().map(|p| format!("  {p}")).collect();
            format!("{} errors in the configuration:\n{}", many.len(), lines.join("\n"))
        }
    }
}

/// The layers a configuration is made of, kept so that `SIGHUP` can load it again: the file
/// (read again), the environment and the flags (as they were at start).
#[derive(Clone, Debug, Default)]
pub struct Layers {
    pub file: Option<PathBuf>,
    /// `CREDWATCH_*` variables, by name.
    env: Vec<(String, String)>,
    /// Variables of the prefix whose value is not UTF-8.
    env_not_utf8: Vec<String>,
    /// The flags given on the command line, by key.
    flags: Map<String, Value>,
}

/// A loaded configuration and what was wrong but not fatal.
#[derive(Clone, Debug, PartialEq)]
pub struct Loaded {
    pub config: Config,
    pub warnings: Vec<String>,
    /// Where each key that is not at its default came from.
    pub places: BTreeMap<&'static str, Place>,
}

impl Layers {
    /// `file`, this process's environment, and `flags` (only those given: a key with a value).
    pub fn new(file: Option<PathBuf>, flags: Map<String, Value>) -> Layers {
        let mut layers = Layers { file, flags, ..Layers::default() };
        for (name, value) in std::env::vars_os() {
            let Some(name) = name.to_str().filter(|name| name.starts_with(ENV_PREFIX)) else { continue };
            match value.into_string() {
                Ok(value) => layers.env.push((name.to_owned(), value)),
                Err(_) => layers.env_not_utf8.push(name.to_owned()),
            }
        }
        layers
    }

    #[cfg(test)]
    fn with_env(file: Option<PathBuf>, env: &[(&str, &str)], flags: Map<String, Value>) -> Layers {
        let env = env.iter().map(|(name, value)| (name.to_string(), value.to_string())).collect();
        Layers { file, env, env_not_utf8: Vec::new(), flags }
    }

    /// Defaults, then the file, then the environment, then the flags. Every bad key of every
    /// layer is reported at once.
    pub fn load(&self) -> Result<Loaded, ConfigError> {
        let mut merged = Map::new();
        let mut problems = Vec::new();
        let mut warnings = Vec::new();
        let mut places = BTreeMap::new();
        if let Some(path) = &self.file {
            let text =
                std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.clone(), source })?;
            merged = check_file(path, &text, &mut problems, &mut places);
        }
        for name in &self.env_not_utf8 {
            problems.push(Problem { place: Place::Env(name.clone()), key: None, message: "not UTF-8".into() });
        }
        for (name, text) in &self.env {
            let key = name[ENV_PREFIX.len()..].to_ascii_lowercase();
            if !known_key(&key) {
                warnings.push(unknown_variable(name, &key));
                continue;
            }
            let place = Place::Env(name.clone());
            match env_value(&key, text) {
                Ok(value) => {
                    merged.insert(key, value);
                }
                Err(message) => problems.push(Problem { place, key: Some(key), message }),
            }
        }
        merged.extend(self.flags.clone());
        if !problems.is_empty() {
            return Err(ConfigError::Invalid(problems));
        }
        let config: Config = serde_json::from_value(Value::Object(merged)).map_err(|error| {
            // Each key was checked where it came from; flags are typed by clap.
            ConfigError::Invalid(vec![Problem {
                place: Place::Flag("the command line".into()),
                key: None,
                message: error.to_string(),
            }])
        })?;
        let invalid: Vec<Problem> = config
            .invalid()
            .into_iter()
            .map(|(key, message)| Problem { place: self.place_of(key, &places), key: Some(key.to_owned()), message })
            .collect();
        if !invalid.is_empty() {
            return Err(ConfigError::Invalid(invalid));
        }
        let places = config.changed_keys().into_iter().map(|key| (key, self.place_of(key, &places))).collect();
        Ok(Loaded { config, warnings, places })
    }

    /// Where the effective value of `key` came from (`places`: the file's), for an error about it.
    fn place_of(&self, key: &str, places: &BTreeMap<String, Location>) -> Place {
        if self.flags.contains_key(key) {
            return Place::Flag(format!("--{}", key.replace('_', "-")));
        }
        if let Some((name, _)) =
            self.env.iter().rev().find(|(name, _)| name[ENV_PREFIX.len()..].eq_ignore_ascii_case(key))
        {
            return Place::Env(name.clone());
        }
        let at = places.get(key);
        Place::File {
            file: self.file.clone().unwrap_or_default(),
            line: at.map(Location::line),
            column: at.map(Location::column),
        }
    }
}

/// `config check FILE`: the file alone (no environment, no flags), every problem.
pub fn check(path: &Path) -> Result<Loaded, ConfigError> {
    Layers { file: Some(path.to_owned()), ..Layers::default() }.load()
}

/// The keys of [`Config`]: the fields its derived `Deserialize` names to a deserializer.
fn keys() -> &'static [&'static str] {
    struct Probe<'a>(&'a mut &'static [&'static str]);

    impl<'de> de::Deserializer<'de> for Probe<'_> {
        type Error = de::value::Error;

        fn deserialize_any<V: de::Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }

        fn deserialize_struct<V: de::Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("fields taken"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
            ignored_any
        }
    }

    static KEYS: std::sync::OnceLock<&'static [&'static str]> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| {
        let mut fields: &'static [&'static str] = &[];
        let _ = Config::deserialize(Probe(&mut fields));
        fields
    })
}

fn known_key(key: &str) -> bool {
    keys().contains(&key)
}

/// `key: value` alone over the defaults: its type, then what its type allows but means nothing.
fn check_one(key: &str, value: Value) -> Result<(), String> {
    let config = one_key(key, value).map_err(|error| error.to_string())?;
    match config.invalid().into_iter().next() {
        Some((_, message)) => Err(message),
        None => Ok(()),
    }
}

fn one_key(key: &str, value: Value) -> Result<Config, serde_json::Error> {
    serde_json::from_value(Value::Object(Map::from_iter([(key.to_owned(), value)])))
}

fn unknown_variable(name: &str, key: &str) -> String {
    match keys().iter().find(|known| strsim::levenshtein(key, known) <= 2) {
        Some(known) => format!(
            "environment variable {name} is not a configuration key and is ignored (did you mean {ENV_PREFIX}{}?)",
            known.to_ascii_uppercase()
        ),
        None => format!(
            "environment variable {name} is not a configuration key and is ignored (keys: {})",
            keys().join(", ")
        ),
    }
}

/// An environment variable's value for `key`: as YAML (`true`, `5`, `[a, b]`), else the
/// string itself; empty is no value (the key's default).
fn env_value(key: &str, text: &str) -> Result<Value, String> {
    if text.trim().is_empty() {
        return Ok(Value::Null);
    }
    let as_yaml = serde_saphyr::from_str_with_options::<Value>(text, yaml_options());
    let first = match as_yaml {
        Ok(value) => match check_one(key, value.clone()) {
            Ok(()) => return Ok(value),
            Err(message) => message,
        },
        Err(error) => error.to_string(),
    };
    let string = Value::String(text.to_owned());
    match check_one(key, string.clone()) {
        Ok(()) => Ok(string),
        Err(_) => Err(first),
    }
}

fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        budget: serde_saphyr::budget! { max_depth: MAX_DEPTH },
        alias_limits: serde_saphyr::alias_limits! { max_total_replayed_events: MAX_REPLAYED_EVENTS },
        // YAML 1.2 booleans only (`yes` is a string, and an error for a boolean key), as the
        // rules read.
        strict_booleans: true,
        merge_keys: serde_saphyr::options::MergeKeyPolicy::Error,
        with_snippet: false,
    }
}

/// The file's top-level entries in order, each key and value with its place.
struct Entries(Vec<(Spanned<String>, Spanned<Value>)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Entries, D::Error> {
        struct Visitor;
        impl<'de> de::Visitor<'de> for Visitor {
            type Value = Entries;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a mapping of configuration keys to values")
            }

            fn visit_unit<E: de::Error>(self) -> Result<Entries, E> {
                Ok(Entries(Vec::new()))
            }

            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(Entries(entries))
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

fn parse_entries(text: &str) -> Result<Entries, serde_saphyr::Error> {
    if text.trim().is_empty() {
        return Ok(Entries(Vec::new()));
    }
    serde_saphyr::from_str_with_options(text, yaml_options())
}

/// The file's keys as a map, every bad one reported in `problems` with its place.
/// `places` gets where each key's value is.
fn check_file(
    path: &Path,
    text: &str,
    problems: &mut Vec<Problem>,
    places: &mut BTreeMap<String, Location>,
) -> Map<String, Value> {
    let place = |at: Location| {
        let at = Some(at).filter(|at| *at != Location::UNKNOWN);
        Place::File { file: path.to_owned(), line: at.map(|at| at.line()), column: at.map(|at| at.column()) }
    };
    let entries = match parse_entries(text) {
        Ok(entries) => entries,
        Err(error) => {
            let message = error.render_with_options(serde_saphyr::render_options! {
                formatter: &WithoutLocation,
                snippets: serde_saphyr::SnippetMode::Off,
            });
            let at = error.location().unwrap_or(Location::UNKNOWN);
            problems.push(Problem { place: place(at), key: None, message });
            return Map::new();
        }
    };
    let mut map = Map::new();
    // The parser refuses duplicate keys itself.
    for (key, value) in entries.0 {
        places.insert(key.value.clone(), value.referenced);
        let knobs = if key.value == "outputs" { knob_problems(value.value.clone(), text) } else { Vec::new() };
        if !knobs.is_empty() {
            for (at, message) in knobs {
                let at = at.unwrap_or(value.referenced);
                problems.push(Problem { place: place(at), key: Some(key.value.clone()), message });
            }
            continue;
        }
        let error = if !known_key(&key.value) {
            Some((key.referenced, format!("unknown key (the keys: {})", keys().join(", "))))
        } else {
            check_one(&key.value, value.value.clone())
                .err()
                .map(|message| nested_error(&key.value, text).unwrap_or((value.referenced, message)))
        };
        match error {
            Some((at, message)) => problems.push(Problem { place: place(at), key: Some(key.value), message }),
            None => {
                map.insert(key.value, value.value);
            }
        }
    }
    map
}

/// Every knob of `outputs:` that is wrong for its output (of another kind, a timeout of 0, a CA
/// file that is missing), each at the knob's own line when the YAML parser can tell it.
fn knob_problems(value: Value, text: &str) -> Vec<(Option<Location>, String)> {
    #[derive(Deserialize)]
    struct Spans {
        #[serde(default)]
        outputs: Vec<Entries>,
    }
    let Ok(config) = one_key("outputs", value) else { return Vec::new() };
    let spans = serde_saphyr::from_str_with_options::<Spans>(text, yaml_options()).map(|spans| spans.outputs);
    let mut found = Vec::new();
    for (index, output) in config.outputs.iter().enumerate() {
        for (knob, message) in output.invalid() {
            let at =
                spans.as_ref().ok().and_then(|spans| spans.get(index)).and_then(|entries| {
                    entries.0.iter().find(|(key, _)| key.value == knob).map(|(key, _)| key.referenced)
                });
            found.push((at, format!("output {} (to: {}): `{knob}`: {message}", index + 1, output.to)));
        }
    }
    found
}

/// An error inside the `outputs:` list at its own line (an unknown knob, a bad `to:`): the
/// YAML parser knows it, where the key's value as JSON knows only where the list starts.
fn nested_error(key: &str, text: &str) -> Option<(Location, String)> {
    #[derive(Deserialize)]
    struct Outputs {
        #[serde(default)]
        #[allow(dead_code, reason = "parsed for its errors' places only")]
        outputs: Vec<OutputConfig>,
    }
    if key != "outputs" {
        return None;
    }
    let error = serde_saphyr::from_str_with_options::<Outputs>(text, yaml_options()).err()?;
    let at = error.location().filter(|at| *at != Location::UNKNOWN)?;
    let message = error.render_with_options(serde_saphyr::render_options! {
        formatter: &WithoutLocation,
        snippets: serde_saphyr::SnippetMode::Off,
    });
    Some((at, message))
}

/// The parser's message for a person, without the location: [`Place`] puts it in front.
struct WithoutLocation;

impl serde_saphyr::MessageFormatter for WithoutLocation {
    fn localizer(&self) -> &dyn serde_saphyr::Localizer {
        self
    }

    fn format_message<'a>(&self, error: &'a serde_saphyr::Error) -> std::borrow::Cow<'a, str> {
        serde_saphyr::UserMessageFormatter.format_message(error)
    }
}

impl serde_saphyr::Localizer for WithoutLocation {
    fn attach_location<'a>(&self, base: std::borrow::Cow<'a, str>, _: Location) -> std::borrow::Cow<'a, str> {
        base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("credwatch.yaml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    fn flags(pairs: &[(&str, Value)]) -> Map<String, Value> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
    }

    fn problems(error: ConfigError) -> Vec<Problem> {
        match error {
            ConfigError::Invalid(problems) => problems,
            other => panic!("not a list of problems: {other}"),
        }
    }

    #[test]
    fn file_then_environment_then_flags() {
        let rules = tempfile::tempdir().unwrap();
        let rules_dir = rules.path().to_str().unwrap();
        let (_dir, path) = file(&format!(
            "json: true\nlinger: 2.5\nalerts: /from/file\nwatch_project: true\nrules: {rules_dir}\nlog_level: debug\n"
        ));
        let env = [
            ("CREDWATCH_ALERTS", "/from/env"),
            ("CREDWATCH_LINGER", "4"),
            ("CREDWATCH_ENFORCE", "true"),
            ("CREDWATCH_SENSOR", "fentry"),
        ];
        let layers = Layers::with_env(
            Some(path.clone()),
            &env,
            flags(&[("linger", Value::from(7.0)), ("log_format", "json".into())]),
        );
        let loaded = layers.load().unwrap();
        assert_eq!(
            loaded.config,
            Config {
                json: true,
                rules: Some(rules.path().to_owned()),
                alerts: Some("/from/env".into()),
                watch_project: true,
                enforce: true,
                linger: Some(7.0),
                contain: false,
                contain_net: None,
                contain_writes: ContainWrites::ReadOnly,
                contain_keep: false,
                trace: None,
                pin_dir: None,
                log_format: LogFormat::Json,
                log_level: LogLevel::Debug,
                kernel_log: KernelLog::Off,
                outputs: Vec::new(),
                spool_dir: None,
                metrics_listen: None,
                sensor: SensorChoice::Fentry,
                alert_log: None,
                alerts_socket: None,
                map_sizes: BTreeMap::new(),
            }
        );
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        let places: Vec<(&str, String)> = loaded.places.iter().map(|(k, p)| (*k, p.to_string())).collect();
        let line = |n: u32, column: u32| format!("{}:{n}:{column}", path.display());
        assert_eq!(
            places,
            [
                ("alerts", "environment variable CREDWATCH_ALERTS".to_owned()),
                ("enforce", "environment variable CREDWATCH_ENFORCE".to_owned()),
                ("json", line(1, 7)),
                ("linger", "--linger".to_owned()),
                ("log_format", "--log-format".to_owned()),
                ("log_level", line(6, 12)),
                ("rules", line(5, 8)),
                ("sensor", "environment variable CREDWATCH_SENSOR".to_owned()),
                ("watch_project", line(4, 16)),
            ]
        );
        // The environment over the file, without flags; false overrides the file's true.
        let layers =
            Layers::with_env(Some(path), &[("CREDWATCH_JSON", "false"), ("CREDWATCH_LINGER", "4")], Map::new());
        let config = layers.load().unwrap().config;
        assert!(!config.json);
        assert_eq!(config.linger, Some(4.0));
        assert_eq!(config.alerts, Some("/from/file".into()));
        // Nothing at all: the defaults.
        assert_eq!(Layers::with_env(None, &[], Map::new()).load().unwrap().config, Config::default());
    }

    #[test]
    fn every_bad_key_is_named_with_file_line_and_column() {
        let (_dir, path) =
            file("json: true\njsno: true\nenforce: \"yes\"\nlinger: [1]\nlog_level: loud\nrules: /nonexistent/rules\n");
        let found = problems(check(&path).unwrap_err());
        let shown: Vec<String> = found.iter().map(ToString::to_string).collect();
        let at = |line: u64, column: u64| Place::File { file: path.clone(), line: Some(line), column: Some(column) };
        assert_eq!(found.len(), 5, "{shown:#?}");
        assert_eq!((found[0].place.clone(), found[0].key.as_deref()), (at(2, 1), Some("jsno")), "{shown:#?}");
        assert!(shown[0].contains("key `jsno`: unknown key (the keys: json, rules, alerts,"), "{shown:#?}");
        assert_eq!((found[1].place.clone(), found[1].key.as_deref()), (at(3, 10), Some("enforce")), "{shown:#?}");
        assert!(shown[1].contains("expected a boolean"), "{shown:#?}");
        assert_eq!((found[2].place.clone(), found[2].key.as_deref()), (at(4, 9), Some("linger")), "{shown:#?}");
        assert_eq!((found[3].place.clone(), found[3].key.as_deref()), (at(5, 12), Some("log_level")), "{shown:#?}");
        assert!(shown[3].contains("unknown variant `loud`"), "{shown:#?}");
        assert_eq!((found[4].place.clone(), found[4].key.as_deref()), (at(6, 8), Some("rules")), "{shown:#?}");
        let text = ConfigError::Invalid(found).to_string();
        assert!(text.starts_with("5 errors in the configuration:\n"), "{text}");
        assert!(text.contains(&format!("{}:2:1: key `jsno`: ", path.display())), "{text}");
    }

    #[test]
    fn a_bad_map_size_is_named_with_its_key() {
        for (text, named, why) in [
            ("map_sizes:\n  MARKS: 64\n  MARKZ: 64\n", "`MARKZ=64`", "these can: MARKS, LOST_TREES"),
            ("map_sizes:\n  PRIORITY: 5000\n", "`PRIORITY=5000`", "power of two"),
            ("map_sizes:\n  MARKS: 0\n", "`MARKS=0`", "not between 1"),
        ] {
            let (_dir, path) = file(text);
            let found = problems(check(&path).unwrap_err());
            let shown: Vec<String> = found.iter().map(ToString::to_string).collect();
            assert_eq!(found.len(), 1, "{shown:#?}");
            assert_eq!(found[0].key.as_deref(), Some("map_sizes"), "{shown:#?}");
            assert!(shown[0].contains(named) && shown[0].contains(why), "{shown:#?}");
        }
        let (_dir, path) = file("map_sizes:\n  MARKS: 64\n");
        assert_eq!(check(&path).unwrap().config.map_sizes().to_string(), "MARKS=64");
    }

    #[test]
    fn syntax_errors_missing_files_and_missing_rules_dirs_are_named() {
        let (_dir, path) = file("json: true\n  enforce: [\n");
        let found = problems(check(&path).unwrap_err());
        assert_eq!(found.len(), 1);
        assert!(matches!(&found[0].place, Place::File { line: Some(_), .. }), "{}", found[0]);
        assert!(found[0].to_string().starts_with(&format!("{}:", path.display())), "{}", found[0]);

        let (_dir, path) = file("- json\n");
        let found = problems(check(&path).unwrap_err());
        assert!(found[0].to_string().starts_with(&format!("{}:1:1: expected mapping", path.display())), "{}", found[0]);

        let missing = path.with_file_name("absent.yaml");
        let error = check(&missing).unwrap_err();
        assert!(matches!(error, ConfigError::Read { .. }), "{error}");
        assert!(error.to_string().contains("absent.yaml"), "{error}");

        let (_dir, path) = file("# nothing but a comment\nrules: /nonexistent/rules\n");
        let found = problems(check(&path).unwrap_err());
        assert_eq!(found[0].key.as_deref(), Some("rules"));
        assert_eq!(found[0].place, Place::File { file: path.clone(), line: Some(2), column: Some(8) });
        assert!(found[0].message.contains("/nonexistent/rules is not a folder"), "{}", found[0]);

        let (_dir, path) = file("linger: -1\n");
        let found = problems(check(&path).unwrap_err());
        assert_eq!(
            (found[0].key.as_deref(), found[0].place.clone()),
            (Some("linger"), Place::File { file: path, line: Some(1), column: Some(9) })
        );

        // An empty file is a valid configuration: the defaults.
        let (_dir, path) = file("\n# comments only\n");
        assert_eq!(check(&path).unwrap().config, Config::default());
    }

    #[test]
    fn environment_values_are_typed_and_checked() {
        let layers = Layers::with_env(
            None,
            &[("CREDWATCH_JSON", "yes"), ("CREDWATCH_LINGER", "soon"), ("CREDWATCH_ALERTS", "123")],
            Map::new(),
        );
        let found = problems(layers.load().unwrap_err());
        let names: Vec<String> = found.iter().map(|p| p.place.to_string()).collect();
        assert_eq!(names, ["environment variable CREDWATCH_JSON", "environment variable CREDWATCH_LINGER"]);
        assert_eq!(found[0].key.as_deref(), Some("json"));
        // A path that reads as a number is still the path.
        let layers = Layers::with_env(None, &[("CREDWATCH_ALERTS", "123"), ("CREDWATCH_RULES", "")], Map::new());
        let config = layers.load().unwrap().config;
        assert_eq!(config.alerts, Some("123".into()));
        assert_eq!(config.rules, None);
    }

    #[test]
    fn the_local_alert_log_and_socket_are_keys_of_every_layer() {
        let (_dir, path) = file("alert_log: /from/file/alerts.jsonl\nalerts_socket: /from/file/alerts.sock\n");
        let loaded = Layers::with_env(
            Some(path.clone()),
            &[("CREDWATCH_ALERTS_SOCKET", "/from/env/alerts.sock")],
            flags(&[("alert_log", "/from/flag/alerts.jsonl".into())]),
        )
        .load()
        .unwrap();
        assert_eq!(loaded.config.alert_log, Some("/from/flag/alerts.jsonl".into()));
        assert_eq!(loaded.config.alerts_socket, Some("/from/env/alerts.sock".into()));
        assert_eq!(loaded.places["alert_log"].to_string(), "--alert-log");
        let (_bad, path) = file("alerts_socket: [a, b]\n");
        let found = problems(check(&path).unwrap_err());
        assert_eq!(found[0].key.as_deref(), Some("alerts_socket"), "{}", found[0]);
    }

    #[test]
    fn unknown_variables_are_warned_about_with_the_key_meant() {
        let layers =
            Layers::with_env(None, &[("CREDWATCH_WACH_PROJECT", "true"), ("CREDWATCH_E2E_WORK", "/w")], Map::new());
        let loaded = layers.load().unwrap();
        assert!(!loaded.config.watch_project);
        assert_eq!(loaded.warnings.len(), 2, "{:?}", loaded.warnings);
        assert!(loaded.warnings[0].contains("did you mean CREDWATCH_WATCH_PROJECT?"), "{:?}", loaded.warnings);
        assert!(loaded.warnings[1].contains("keys: json, rules, alerts,"), "{:?}", loaded.warnings);
    }

    #[test]
    fn show_loads_back_to_the_same_configuration() {
        let rules = tempfile::tempdir().unwrap();
        let config = Config {
            json: true,
            rules: Some(rules.path().join("..").join(rules.path().file_name().unwrap())),
            alerts: Some("/var/log/credwatch: alerts.jsonl".into()),
            watch_project: false,
            enforce: true,
            linger: Some(1.5),
            contain: true,
            contain_net: Some(ContainNet::Registries),
            contain_writes: ContainWrites::Overlay,
            contain_keep: true,
            trace: None,
            pin_dir: Some("/sys/fs/bpf/credwatch-site".into()),
            log_format: LogFormat::Json,
            log_level: LogLevel::Warn,
            kernel_log: KernelLog::Warn,
            outputs: vec![
                OutputConfig {
                    min_severity: Some(credwatch_core::alert::Severity::High),
                    categories: vec!["ssh".into()],
                    max_bytes: Some(1 << 20),
                    keep: Some(3),
                    ..OutputConfig::to("file:/var/log/credwatch/alerts.jsonl".parse().unwrap())
                },
                OutputConfig::to("nats:nats://127.0.0.1:4222/credwatch".parse().unwrap()),
            ],
            spool_dir: Some("/var/spool/credwatch".into()),
            metrics_listen: Some("127.0.0.1:9464".parse().unwrap()),
            sensor: SensorChoice::Tracepoint,
            alert_log: Some("/var/lib/credwatch/site alerts.jsonl".into()),
            alerts_socket: Some("/run/credwatch/alerts.sock".into()),
            map_sizes: BTreeMap::from([("MARKS".to_owned(), 64), ("PRIORITY".to_owned(), 65536)]),
        };
        for config in [config, Config::default()] {
            let text = config.to_yaml().unwrap();
            let (_dir, path) = file(&text);
            assert_eq!(check(&path).unwrap().config, config, "{text}");
        }
    }

    #[test]
    fn outputs_errors_are_named_at_their_own_line() {
        let (_dir, path) = file(
            "json: true\noutputs:\n  - to: file:/tmp/a.jsonl\n    keep: 2\n  - to: syslog:tcp:h:514\n    min_severity: high\n    colour: red\n",
        );
        let found = problems(check(&path).unwrap_err());
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].key.as_deref(), Some("outputs"));
        assert!(matches!(found[0].place, Place::File { line: Some(7), .. }), "{}", found[0]);
        assert!(found[0].message.contains("colour"), "{}", found[0]);

        let (_dir, path) = file("outputs:\n  - to: file:/tmp/a.jsonl\n  - to: syslog:tcp:host\n");
        let found = problems(check(&path).unwrap_err());
        assert!(matches!(found[0].place, Place::File { line: Some(3), .. }), "{}", found[0]);
        assert!(found[0].message.contains("\"syslog:tcp:host\": `syslog:tcp:` needs HOST:PORT"), "{}", found[0]);

        // A knob of another kind of output.
        let (_dir, path) = file("outputs:\n  - to: syslog:udp:h:514\n    max_bytes: 100\n");
        let found = problems(check(&path).unwrap_err());
        assert!(matches!(found[0].place, Place::File { line: Some(3), .. }), "{}", found[0]);
        assert!(
            found[0]
                .to_string()
                .contains("output 1 (to: syslog:udp:h:514): `max_bytes`: `max_bytes` is a knob of file outputs"),
            "{}",
            found[0]
        );

        // The spelling of the command line in the environment too.
        let layers =
            Layers::with_env(None, &[("CREDWATCH_OUTPUTS", "[{to: 'file:/tmp/b', min_severity: medium}]")], Map::new());
        let outputs = layers.load().unwrap().config.outputs;
        assert_eq!(outputs[0].to, "file:/tmp/b".parse().unwrap());
        assert_eq!(outputs[0].min_severity, Some(credwatch_core::alert::Severity::Medium));
    }

    #[test]
    fn changed_keys_are_in_the_order_of_the_file_format() {
        assert!(Config::default().changed_keys().is_empty());
        let config = Config { json: true, linger: Some(2.0), alerts: Some("a".into()), ..Config::default() };
        assert_eq!(config.changed_keys(), ["json", "alerts", "linger"]);
    }

    #[test]
    fn every_wrong_knob_of_every_output_is_named_at_its_own_line() {
        let (_dir, path) = file(
            "json: true\noutputs:\n  - to: nats:nats://127.0.0.1:4222/cw\n    bearer_token: x\n  - to: syslog:tcp:h:601\n    min_severity: high\n    ca_file: /nonexistent/ca.pem\n",
        );
        let found = problems(check(&path).unwrap_err());
        let lines: Vec<Option<usize>> = found
            .iter()
            .map(|problem| match problem.place {
                Place::File { line, .. } => line.map(|line| line as usize),
                _ => None,
            })
            .collect();
        assert_eq!(lines, [Some(4), Some(7), Some(7)], "{found:?}");
        assert!(
            found[0].message.contains("output 1 (to: nats:nats://127.0.0.1:4222/cw): `bearer_token`"),
            "{}",
            found[0]
        );
        assert!(found[1].message.contains("`ca_file` is a knob of webhook, falcosidekick and nats"), "{}", found[1]);
        assert!(found[2].message.contains("/nonexistent/ca.pem is not a file"), "{}", found[2]);
    }

    #[test]
    fn only_trace_log_format_and_outputs_need_a_restart() {
        let old = Config::default();
        let new = Config { json: true, enforce: true, log_level: LogLevel::Debug, ..Config::default() };
        assert!(old.restart_only_changes(&new).is_empty());
        let new = Config {
            trace: Some("t.jsonl".into()),
            log_format: LogFormat::Json,
            outputs: vec![OutputConfig::to("file:/a".parse().unwrap())],
            spool_dir: Some("/s".into()),
            metrics_listen: Some("127.0.0.1:9464".parse().unwrap()),
            sensor: SensorChoice::Fentry,
            alert_log: Some("/l/alerts.jsonl".into()),
            alerts_socket: Some("/r/alerts.sock".into()),
            ..Config::default()
        };
        assert_eq!(
            old.restart_only_changes(&new),
            ["trace", "log_format", "outputs", "spool_dir", "metrics_listen", "sensor", "alert_log", "alerts_socket"]
        );
    }
}
