//! Where alerts go beyond the terminal. The sensor and the engine never wait for an output: each
//! alert is rendered once into an [`Outgoing`] and queued per output; each output's
//! [`Transport`] delivers from its queue at its own pace.

pub mod syslog;
mod transport;

pub use transport::{Outgoing, Transport, TransportError};
