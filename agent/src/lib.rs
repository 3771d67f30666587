//! credwatch's kernel side: the eBPF sensor that turns package trees' syscalls into
//! [`credwatch_core::event::Event`]s for the engine in credwatch-core.

pub mod sensor;
