//! credwatch without the kernel. One [`event::Event`] stream, from the live sensor, a recorded
//! trace or another tool's trace, is driven by [`pipeline`] through one [`engine::Engine`],
//! which produces [`alert::Alert`]s for the sinks.
//!
//! The modules, from the events up:
//! - `event`: the one event stream, which every source produces and the engine reads.
//! - `record`: the kernel's ring records turned into events, each checked before it is read.
//! - `trace`: trace files, the event stream as versioned JSON lines.
//! - `import`: other tools' traces (strace, auditd, Tetragon, Tracee) turned into events.
//! - `input`: files or standard input read for the above: compression, bounded numbered lines.
//! - `names`: the kernel's numbers of ptrace requests, bpf commands, signals, io_uring opcodes.
//! - `net`: socket addresses and DNS queries decoded from the monitored system's bytes.
//! - `container`: a process's container and pod, from its cgroup paths.
//! - `rules`: the rule files (YAML, versioned schema): managers, agents, rules, doors.
//! - `engine`: the process table, the rules' matching, and which alerts go out.
//! - `samples`: each rule's samples, replayed through the engine.
//! - `pipeline`: events from a source through the engine to the sinks, for every mode.
//! - `alert`: the alert document (ECS-style JSON), a contract with other tools.
//! - `output`: alerts to a terminal (escaped), as JSON lines, or to a file.
//! - `report`: the responder's report per package, built as the events stream.
//! - `place`: where an alert's process ran (host, container, pod, CI job).
//! - `incident`: the incident page, one self-contained HTML file.
//! - `fleet`: `fleet report`, many hosts' alerts folded per package and version.
//! - `exposure`: `credwatch exposure`, the credential files that exist and who can read them.
//! - `doors`: the sockets and folders that reach a credential without opening a file of it.
//! - `contain`: `run --contain`, what a contained tree must not see.

pub mod alert;
pub mod contain;
pub mod container;
pub mod doors;
pub mod engine;
pub mod event;
pub mod exposure;
pub mod fleet;
pub mod import;
pub mod incident;
pub mod input;
pub mod names;
pub mod net;
pub mod output;
pub mod pipeline;
pub mod place;
pub mod record;
pub mod report;
pub mod rules;
pub mod samples;
pub mod trace;
