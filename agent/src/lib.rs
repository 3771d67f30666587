//! credwatch's kernel side: the eBPF sensor that turns package trees' syscalls into
//! [`credwatch_core::event::Event`]s for the engine in credwatch-core.
//!
//! - `sensor`: loads the kernel programs, fills their maps and reads their ring buffers (its
//!   own module map says how it is divided); `credwatch doctor`'s probes.

pub mod sensor;
