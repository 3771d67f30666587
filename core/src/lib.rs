//! credwatch without the kernel. One [`event::Event`] stream, from the live sensor, a recorded
//! trace or another tool's trace, is driven by [`pipeline`] through one [`engine::Engine`],
//! which produces [`alert::Alert`]s for the sinks.

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
